/* synth.c: writes deterministic pseudo-random Llama GGUFs (see synth.h).
 *
 * How: the tensor list and the vocabulary are built first; then each
 * matrix is generated row by row on the n_threads threads of a cv_pool
 * (each row from its own counters of a splitmix64 stream keyed by the
 * tensor's name, so rows are independent) into an f32 scratch row and
 * quantized with the target type's `quantize` straight into the writer's
 * buffer (F32 rows are generated in place) when cv_gguf_write comes to the
 * tensor (gguf_write.h's made tensors), so one tensor is held at a time.
 * Owner of this file: the tools helper. */
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/pool.h"
#include "core/splitmix.h"
#include "kernels/kernels.h"
#include "model/gguf_write.h"
#include "model/vocab.h"

#define SYNTH_MAX_DIM (1 << 22)
#define SYNTH_MAX_LAYER 4096
#define PIECE_MAX 24 /* bytes per vocabulary piece, NUL included */

static const struct synth_preset {
    const char *name;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_theta, output_scale;
    int64_t n_swa; /* a Gemma's or gpt-oss's sliding window */
    cv_arch arch;
    int64_t head_dim, n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int64_t n_ctx_orig; /* a Phi-3's or gpt-oss's original context */
} presets[] = {
    {"tiny", 64, 5, 8, 4, 172, 512, 512, 10000.0f, 1.0f, 0, CV_ARCH_LLAMA, 0, 0, 0, 0, 0, 0},
    {"synth-mini", 256, 4, 8, 2, 768, 2048, 512, 10000.0f, 4.0f, 0, CV_ARCH_LLAMA, 0, 0, 0, 0, 0, 0},
    {"synth-hd128", 512, 2, 4, 1, 1536, 2048, 512, 500000.0f, 4.0f, 0, CV_ARCH_LLAMA, 0, 0, 0, 0, 0, 0},
    {"gemma2-mini", 256, 4, 8, 4, 768, 2048, 512, 100000.0f, 1.0f, 16, CV_ARCH_GEMMA2, 0, 0, 0, 0, 0, 0},
    {"gemma3-mini", 256, 7, 8, 2, 768, 2048, 512, 1000000.0f, 1.0f, 16, CV_ARCH_GEMMA3, 0, 0, 0, 0, 0, 0},
    {"phi3-mini", 256, 4, 8, 2, 768, 2048, 1024, 10000.0f, 4.0f, 0, CV_ARCH_PHI3, 0, 0, 0, 0, 0, 256},
    {"llama-3.2-1b", 2048, 16, 32, 8, 8192, 32000, 4096, 500000.0f, 1.0f, 0, CV_ARCH_LLAMA, 0, 0, 0, 0, 0, 0},
    {"llama-3.1-8b", 4096, 32, 32, 8, 14336, 32000, 8192, 500000.0f, 1.0f, 0, CV_ARCH_LLAMA, 0, 0, 0, 0, 0, 0},
    {"llama-3.1-70b", 8192, 80, 64, 8, 28672, 32000, 8192, 500000.0f, 1.0f, 0, CV_ARCH_LLAMA, 0, 0, 0, 0, 0, 0},
    {"qwen3moe-mini", 128, 4, 4, 2, 384, 2048, 512, 1000000.0f, 4.0f, 0, CV_ARCH_QWEN3MOE, 0, 8, 2, 64, 0, 0},
    {"qwen2moe-mini", 128, 4, 4, 2, 384, 2048, 512, 1000000.0f, 4.0f, 0, CV_ARCH_QWEN2MOE, 0, 8, 2, 64, 192, 0},
    {"mixtral-mini", 128, 4, 4, 2, 64, 2048, 512, 1000000.0f, 4.0f, 0, CV_ARCH_LLAMA, 0, 8, 2, 0, 0, 0},
    {"qwen3moe-30b-a3b", 2048, 48, 32, 4, 6144, 32000, 4096, 1000000.0f, 1.0f, 0, CV_ARCH_QWEN3MOE, 128, 128, 8, 768,
     0, 0},
    {"gpt-oss-mini", 256, 4, 8, 2, 256, 2048, 512, 150000.0f, 4.0f, 16, CV_ARCH_GPTOSS, 64, 8, 4, 256, 0, 64},
    {"gpt-oss-20b", 2880, 24, 64, 8, 2880, 32000, 4096, 150000.0f, 1.0f, 128, CV_ARCH_GPTOSS, 64, 32, 4, 2880, 0, 128},
};

void cv_synth_defaults(cv_synth_params *p)
{
    memset(p, 0, sizeof(*p));
    p->n_ctx = 2048;
    p->rope_theta = 10000.0f;
    p->rms_eps = 1e-5f;
    p->output_scale = 1.0f;
    p->seed = 1234;
    p->type = CV_TYPE_F32;
    p->n_threads = 1;
}

int cv_synth_preset(cv_synth_params *p, const char *shape, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        const struct synth_preset *s = &presets[i];
        if (strcmp(shape, s->name))
            continue;
        p->n_embd = s->n_embd;
        p->n_layer = s->n_layer;
        p->n_head = s->n_head;
        p->n_head_kv = s->n_head_kv;
        p->n_ff = s->n_ff;
        p->n_vocab = s->n_vocab;
        p->n_ctx = s->n_ctx;
        p->rope_theta = s->rope_theta;
        p->output_scale = s->output_scale;
        p->n_swa = s->n_swa;
        p->arch = s->arch;
        p->head_dim = s->head_dim;
        p->n_expert = s->n_expert;
        p->n_expert_used = s->n_expert_used;
        p->n_ff_exp = s->n_ff_exp;
        p->n_ff_shexp = s->n_ff_shexp;
        p->n_ctx_orig = s->n_ctx_orig;
        return 0;
    }
    return cv_errf(err, errlen, "unknown shape '%s'", shape);
}

const char *cv_synth_preset_name(int i)
{
    return i >= 0 && (size_t)i < sizeof(presets) / sizeof(presets[0]) ? presets[i].name : NULL;
}

/* ---- the generator ---- */

static uint64_t tensor_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++) {
        h ^= *s;
        h *= 0x100000001b3ull;
    }
    return cv_splitmix64_mix((seed ^ h) + CV_SPLITMIX_GAMMA);
}

/* Factor that turns the centred sum of four 16-bit uniforms into values of
 * the given std. */
static float value_scale(double std)
{
    return (float)(std / sqrt((65536.0 * 65536.0 - 1.0) / 3.0));
}

/* x[j] = element first + j of the tensor with this key, j < n. */
static void fill_values(uint64_t key, uint64_t first, int64_t n, float scale, float *x)
{
    uint64_t counter = key + (first + 1) * CV_SPLITMIX_GAMMA;
    for (int64_t j = 0; j < n; j++, counter += CV_SPLITMIX_GAMMA) {
        uint64_t r = cv_splitmix64_mix(counter);
        int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                      (int32_t)(r >> 48);
        x[j] = (float)(sum - 131070) * scale;
    }
}

typedef struct gen_job {
    uint64_t key;
    float scale;
    int64_t n_rows, row_len;
    cv_type type;
    size_t row_bytes;
    uint8_t *dst;
    float *scratch; /* one f32 row per thread; NULL for F32 (generated in place) */
} gen_job;

static void gen_range(void *ctx, int ith, int nth)
{
    const gen_job *j = ctx;
    cv_from_float_fn quantize = cv_type_get(j->type)->quantize;
    float *row = j->scratch ? j->scratch + (size_t)ith * (size_t)j->row_len : NULL;
    long r0, r1;
    cv_split_range((long)j->n_rows, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        uint8_t *d = j->dst + (size_t)r * j->row_bytes;
        fill_values(j->key, (uint64_t)r * (uint64_t)j->row_len, j->row_len, j->scale, row ? row : (float *)d);
        if (row)
            quantize(row, d, j->row_len);
    }
}

/* ---- the vocabulary ---- */

typedef struct vocab_build {
    char *text;           /* cap slots of PIECE_MAX bytes */
    const char **tokens;
    float *scores;
    int32_t *types;
    int64_t n, cap;
} vocab_build;

static const char *const common_words[] = {
    "the", "and", "to", "of", "was", "he", "she", "it", "that", "is", "in", "for", "on", "with", "his",
    "her", "they", "you", "said", "there", "once", "upon", "time", "day", "little", "girl", "boy", "dog",
    "cat", "big", "happy", "play", "saw", "went", "had", "were", "one", "not", "but", "at", "be", "this",
    "have", "from", "or", "by", "all", "we", "can", "what", "so", "up", "out", "if", "about", "who", "get",
    "go", "me", "when", "make", "like", "no", "just", "him", "know", "take", "people", "into", "year",
    "your", "good", "some", "could", "them", "see", "other", "than", "then", "now", "look", "only", "come",
    "its", "over", "think", "also", "back", "after", "use", "two", "how", "our", "work", "first", "well",
    "way", "even", "new", "want", "because", "any", "these", "give", "most", "friend", "mom", "tree",
    "park", "ball", "sun", "home", "very", "wanted", "named", "loved", "asked", "thank",
};

static const char *const common_suffixes[] = {
    "ing", "ed", "er", "ly", "es", "en", "est", "ion", "ness", "ful", "th", "he", "an", "re", "on", "at",
    "nd", "st", "ou", "ar", "or", "ve",
};

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's word-start mark */

/* Appends a token (if there is room); ids from CV_SYNTH_MIN_VOCAB on get
 * falling scores, the special and byte tokens 0. */
static void vocab_push(vocab_build *v, const char *piece, int32_t type)
{
    if (v->n >= v->cap)
        return;
    char *slot = v->text + v->n * PIECE_MAX;
    snprintf(slot, PIECE_MAX, "%s", piece);
    v->tokens[v->n] = slot;
    v->scores[v->n] = v->n < CV_SYNTH_MIN_VOCAB ? 0.0f : (float)(CV_SYNTH_MIN_VOCAB - v->n);
    v->types[v->n] = type;
    v->n++;
}

/* Appends a normal piece unless it is already there. */
static void vocab_add_piece(vocab_build *v, const char *piece)
{
    for (int64_t i = CV_SYNTH_MIN_VOCAB; i < v->n; i++)
        if (!strcmp(v->tokens[i], piece))
            return;
    vocab_push(v, piece, CV_TOKEN_NORMAL);
}

/* Adds prefix + s[0..k) for k = 1..strlen(s). */
static void vocab_add_prefixes(vocab_build *v, const char *prefix, const char *s)
{
    char piece[PIECE_MAX];
    int n = (int)strlen(s);
    for (int k = 1; k <= n; k++) {
        snprintf(piece, sizeof(piece), "%s%.*s", prefix, k, s);
        vocab_add_piece(v, piece);
    }
}

#define CHATML_START "<|im_start|>"
#define CHATML_END "<|im_end|>"
static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#define FIM_TOKENS 3
static const char *const fim_tokens[FIM_TOKENS] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};

/* The control tokens that end the vocabulary: the FIM ones, Mistral's
 * tool-call marker, then, the last one the EOS, Phi-3's <|endoftext|>
 * (llama.cpp looks it up in any model whose name says phi3), then
 * ChatML's two. Returns their count. */
#define TAIL_MAX (4 + FIM_TOKENS)
static int tail_tokens(const cv_synth_params *p, const char *tail[TAIL_MAX])
{
    int n = 0;
    for (int i = 0; p->fim && i < FIM_TOKENS; i++)
        tail[n++] = fim_tokens[i];
    if (p->tool_marker)
        tail[n++] = "[TOOL_CALLS]";
    if (p->arch == CV_ARCH_PHI3)
        tail[n++] = "<|endoftext|>";
    if (p->chatml) {
        tail[n++] = CHATML_START;
        tail[n++] = CHATML_END;
    }
    return n;
}

static void vocab_fill(vocab_build *v, const char *const *tail, int n_tail)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static const char punct[] = ".,!?;:'\"-()[]{}<>/\\@#$%^&*_+=~`|";
    char piece[PIECE_MAX];
    v->cap -= n_tail;
    vocab_push(v, "<unk>", CV_TOKEN_UNKNOWN);
    vocab_push(v, "<s>", CV_TOKEN_CONTROL);
    vocab_push(v, "</s>", CV_TOKEN_CONTROL);
    for (int b = 0; b < 256; b++) {
        snprintf(piece, sizeof(piece), "<0x%02X>", b);
        vocab_push(v, piece, CV_TOKEN_BYTE);
    }
    vocab_add_piece(v, SPM_SPACE);
    for (const char *c = alnum; *c; c++)
        vocab_add_prefixes(v, "", (char[]){*c, 0});
    for (const char *c = punct; *c; c++)
        vocab_add_prefixes(v, "", (char[]){*c, 0});
    for (const char *c = alnum; *c; c++)
        vocab_add_prefixes(v, SPM_SPACE, (char[]){*c, 0});
    for (size_t i = 0; i < sizeof(common_words) / sizeof(common_words[0]); i++)
        vocab_add_prefixes(v, SPM_SPACE, common_words[i]);
    for (size_t i = 0; i < sizeof(common_suffixes) / sizeof(common_suffixes[0]); i++)
        vocab_add_prefixes(v, "", common_suffixes[i]);
    /* fillers: "tok" + 5 digits equals no piece above, so no search */
    for (int k = 0; v->n < v->cap; k++) {
        snprintf(piece, sizeof(piece), "tok%05d", k);
        vocab_push(v, piece, CV_TOKEN_NORMAL);
    }
    v->cap += n_tail;
    for (int i = 0; i < n_tail; i++)
        vocab_push(v, tail[i], CV_TOKEN_CONTROL);
}

/* ---- the model ---- */

typedef struct synth_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3];
    bool is_norm; /* a vector: element k is 1 + ramp * k^2 */
    float ramp;   /* 0 (norms: all 1.0), or a RoPE factor's */
    double std;
    cv_type type;
    uint64_t size;
} synth_tensor;

static bool is_gemma(const cv_synth_params *p) { return p->arch == CV_ARCH_GEMMA2 || p->arch == CV_ARCH_GEMMA3; }

static bool is_gptoss(const cv_synth_params *p) { return p->arch == CV_ARCH_GPTOSS; }

/* The architectures whose experts synth writes (and requires). */
static bool is_moe_arch(const cv_synth_params *p)
{
    return p->arch == CV_ARCH_QWEN2MOE || p->arch == CV_ARCH_QWEN3MOE || is_gptoss(p);
}

static int64_t head_dim_of(const cv_synth_params *p) { return p->head_dim ? p->head_dim : p->n_embd / p->n_head; }

/* An architecture synth writes, with a sliding window exactly when a Gemma
 * or a gpt-oss. */
static int check_arch(const cv_synth_params *p, char *err, size_t errlen)
{
    if (p->arch != CV_ARCH_LLAMA && p->arch != CV_ARCH_PHI3 && !is_moe_arch(p) && !is_gemma(p))
        return cv_errf(err, errlen,
                       "synth writes llama, gemma2, gemma3, phi3, qwen2moe, qwen3moe and gpt-oss models, not %s",
                       cv_llama_arch_name(p->arch));
    if (is_gemma(p) || is_gptoss(p) ? p->n_swa < 1 || p->n_swa > SYNTH_MAX_DIM : p->n_swa != 0)
        return cv_errf(err, errlen, "sliding window %lld out of range (a Gemma or gpt-oss has 1..%d, others none)",
                       (long long)p->n_swa, SYNTH_MAX_DIM);
    return 0;
}

/* The experts' counts and sizes, where qwen2moe, qwen3moe and gpt-oss
 * need them. */
static int check_experts(const cv_synth_params *p, char *err, size_t errlen)
{
    const bool moe_arch = is_moe_arch(p);
    if (!p->n_expert && !moe_arch)
        return 0;
    if ((p->n_swa && !is_gptoss(p)) || p->n_expert < 1 || p->n_expert > CV_LLAMA_MAX_EXPERTS || p->n_expert_used < 1 ||
        p->n_expert_used > p->n_expert)
        return cv_errf(err, errlen, "%lld experts, %lld used: not a mixture of experts synth writes",
                       (long long)p->n_expert, (long long)p->n_expert_used);
    if ((moe_arch && (p->n_ff_exp < 1 || p->n_ff_exp > SYNTH_MAX_DIM)) || p->n_ff_shexp < 0 ||
        p->n_ff_shexp > SYNTH_MAX_DIM)
        return cv_errf(err, errlen, "expert hidden size %lld or shared expert's %lld out of range",
                       (long long)p->n_ff_exp, (long long)p->n_ff_shexp);
    return 0;
}

/* The original context, which a Phi-3 and a gpt-oss have (1..n_ctx) and
 * no other architecture; a Phi-3 has neither sliding window nor experts,
 * and 3/4 of each attention head rotates in pairs. */
static int check_phi3(const cv_synth_params *p, char *err, size_t errlen)
{
    const bool phi3 = p->arch == CV_ARCH_PHI3;
    if (phi3 || is_gptoss(p) ? p->n_ctx_orig < 1 || p->n_ctx_orig > p->n_ctx : p->n_ctx_orig != 0)
        return cv_errf(err, errlen, "original context %lld out of range (a phi3's or gpt-oss's 1..n_ctx, else none)",
                       (long long)p->n_ctx_orig);
    if (phi3 && (p->n_swa || p->n_expert))
        return cv_errf(err, errlen, "a phi3 has no sliding window and no experts");
    if (phi3 && head_dim_of(p) % 8)
        return cv_errf(err, errlen, "a Phi-3's head dimension %lld is not a multiple of 8 (3/4 of it rotates)",
                       (long long)head_dim_of(p));
    return 0;
}

static int check_params(const cv_synth_params *p, char *err, size_t errlen)
{
    const struct {
        const char *name;
        int64_t v, max;
    } dims[] = {
        {"n_embd", p->n_embd, SYNTH_MAX_DIM}, {"n_layer", p->n_layer, SYNTH_MAX_LAYER},
        {"n_head", p->n_head, SYNTH_MAX_DIM}, {"n_head_kv", p->n_head_kv, SYNTH_MAX_DIM},
        {"n_ff", p->n_ff, SYNTH_MAX_DIM},     {"n_vocab", p->n_vocab, SYNTH_MAX_DIM},
        {"n_ctx", p->n_ctx, SYNTH_MAX_DIM},
    };
    if (check_arch(p, err, errlen))
        return -1;
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v < 1 || dims[i].v > dims[i].max)
            return cv_errf(err, errlen, "%s %lld out of range (1..%lld)", dims[i].name, (long long)dims[i].v,
                           (long long)dims[i].max);
    if (!p->head_dim && p->n_embd % p->n_head)
        return cv_errf(err, errlen, "n_embd %lld is not a multiple of n_head %lld", (long long)p->n_embd,
                       (long long)p->n_head);
    if (p->head_dim < 0 || p->head_dim > 1024 || head_dim_of(p) % 2)
        return cv_errf(err, errlen, "head dimension %lld is odd or out of range (RoPE rotates pairs)",
                       (long long)head_dim_of(p));
    if (check_experts(p, err, errlen) || check_phi3(p, err, errlen))
        return -1;
    if (p->n_head % p->n_head_kv)
        return cv_errf(err, errlen, "n_head %lld is not a multiple of n_head_kv %lld", (long long)p->n_head,
                       (long long)p->n_head_kv);
    const char *tail[TAIL_MAX];
    const int n_tail = tail_tokens(p, tail);
    if (p->n_vocab < CV_SYNTH_MIN_VOCAB + n_tail)
        return cv_errf(err, errlen, "n_vocab %lld is below %d (3 special and 256 byte tokens%s)",
                       (long long)p->n_vocab, CV_SYNTH_MIN_VOCAB + n_tail, n_tail ? ", the last control ones" : "");
    if (!(p->rope_theta > 0 && isfinite(p->rope_theta)))
        return cv_errf(err, errlen, "rope theta %g must be positive", p->rope_theta);
    if (!(p->rms_eps > 0 && isfinite(p->rms_eps)))
        return cv_errf(err, errlen, "rms eps %g must be positive", p->rms_eps);
    if (!(p->output_scale > 0 && isfinite(p->output_scale)))
        return cv_errf(err, errlen, "output scale %g must be positive", p->output_scale);
    if (!cv_quant_can_write(p->type))
        return cv_errf(err, errlen, "type %s cannot be written by this build", cv_type_name(p->type));
    return 0;
}

/* Adds tensor `name` of ne0 x ne1 x ne2 (ne1, ne2 0 for fewer dims) with
 * values of std `std`; std 0: a norm, all 1.0. */
static void add_tensor(synth_tensor *t, int *n, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, double std)
{
    synth_tensor *s = &t[(*n)++];
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->n_dims = ne2 ? 3 : ne1 ? 2 : 1;
    s->ne[0] = ne0;
    s->ne[1] = ne1 ? ne1 : 1;
    s->ne[2] = ne2 ? ne2 : 1;
    s->is_norm = std == 0;
    s->std = std;
}

static void add_layer_tensor(synth_tensor *t, int *n, int64_t layer, const char *suffix, int64_t ne0,
                             int64_t ne1, int64_t ne2, double std)
{
    char name[64];
    snprintf(name, sizeof(name), "blk.%lld.%s", (long long)layer, suffix);
    add_tensor(t, n, name, ne0, ne1, ne2, std);
}

/* An expert's hidden size: Mixtral's (a llama's) is n_ff. */
static int64_t expert_ff(const cv_synth_params *p) { return p->arch == CV_ARCH_LLAMA ? p->n_ff : p->n_ff_exp; }

static int64_t shared_ff(const cv_synth_params *p) { return p->n_ff_shexp ? p->n_ff_shexp : p->n_ff; }

/* Layer l's feed-forward tensors: dense (Phi-3's gate and up fused), or a
 * mixture of experts (and qwen2moe's shared expert). */
static void add_ffn(const cv_synth_params *p, synth_tensor *t, int *n, int64_t l)
{
    const double std_embd = 1.0 / sqrt((double)p->n_embd);
    if (!p->n_expert) { /* Phi-3's ffn_up holds the gate's rows, then up's */
        const bool fused = p->arch == CV_ARCH_PHI3;
        if (!fused)
            add_layer_tensor(t, n, l, "ffn_gate.weight", p->n_embd, p->n_ff, 0, std_embd);
        add_layer_tensor(t, n, l, "ffn_up.weight", p->n_embd, (fused ? 2 : 1) * p->n_ff, 0, std_embd);
        add_layer_tensor(t, n, l, "ffn_down.weight", p->n_ff, p->n_embd, 0, 1.0 / sqrt((double)p->n_ff));
        return;
    }
    const int64_t ff = expert_ff(p), ne = p->n_expert;
    /* gpt-oss's gate and up of std 4: some pass the clamp at 7 */
    const double std_gu = (is_gptoss(p) ? 4.0 : 1.0) * std_embd;
    add_layer_tensor(t, n, l, "ffn_gate_inp.weight", p->n_embd, ne, 0, std_embd);
    add_layer_tensor(t, n, l, "ffn_gate_exps.weight", p->n_embd, ff, ne, std_gu);
    add_layer_tensor(t, n, l, "ffn_up_exps.weight", p->n_embd, ff, ne, std_gu);
    add_layer_tensor(t, n, l, "ffn_down_exps.weight", ff, p->n_embd, ne, 1.0 / sqrt((double)ff));
    if (p->arch == CV_ARCH_QWEN2MOE) {
        const int64_t sff = shared_ff(p);
        add_layer_tensor(t, n, l, "ffn_gate_inp_shexp.weight", p->n_embd, 0, 0, std_embd);
        add_layer_tensor(t, n, l, "ffn_gate_shexp.weight", p->n_embd, sff, 0, std_embd);
        add_layer_tensor(t, n, l, "ffn_up_shexp.weight", p->n_embd, sff, 0, std_embd);
        add_layer_tensor(t, n, l, "ffn_down_shexp.weight", sff, p->n_embd, 0, 1.0 / sqrt((double)sff));
    }
}

/* The number of rotary dimensions: 3/4 of head_dim for a Phi-3 (partial
 * rotation, as Phi-4-mini), else all of it. */
static int64_t rot_dims(const cv_synth_params *p)
{
    return p->arch == CV_ARCH_PHI3 ? head_dim_of(p) / 4 * 3 : head_dim_of(p);
}

/* Layer l's attention matrices: Phi-3's fused attn_qkv (Q, K, V rows),
 * else the separate ones; then attn_output. */
static void add_attention(const cv_synth_params *p, synth_tensor *t, int *n, int64_t l)
{
    const int64_t hd = head_dim_of(p), n_q = hd * p->n_head, n_kv = hd * p->n_head_kv;
    const double std_embd = 1.0 / sqrt((double)p->n_embd);
    if (p->arch == CV_ARCH_PHI3) {
        add_layer_tensor(t, n, l, "attn_qkv.weight", p->n_embd, n_q + 2 * n_kv, 0, std_embd);
    } else {
        add_layer_tensor(t, n, l, "attn_q.weight", p->n_embd, n_q, 0, std_embd);
        add_layer_tensor(t, n, l, "attn_k.weight", p->n_embd, n_kv, 0, std_embd);
        add_layer_tensor(t, n, l, "attn_v.weight", p->n_embd, n_kv, 0, std_embd);
    }
    add_layer_tensor(t, n, l, "attn_output.weight", n_q, p->n_embd, 0, 1.0 / sqrt((double)n_q));
}

/* A gpt-oss layer's own vectors, random: the Q/K/V/O biases, the sinks
 * (std 2, about the attention scores' size, so they matter), the router's
 * and the experts' biases. */
static void add_gptoss(const cv_synth_params *p, synth_tensor *t, int *n, int64_t l)
{
    const int64_t hd = head_dim_of(p), ff = p->n_ff_exp, ne = p->n_expert;
    add_layer_tensor(t, n, l, "attn_q.bias", hd * p->n_head, 0, 0, 0.5);
    add_layer_tensor(t, n, l, "attn_k.bias", hd * p->n_head_kv, 0, 0, 0.5);
    add_layer_tensor(t, n, l, "attn_v.bias", hd * p->n_head_kv, 0, 0, 0.5);
    add_layer_tensor(t, n, l, "attn_output.bias", p->n_embd, 0, 0, 0.5);
    add_layer_tensor(t, n, l, "attn_sinks.weight", p->n_head, 0, 0, 2.0);
    add_layer_tensor(t, n, l, "ffn_gate_inp.bias", ne, 0, 0, 0.5);
    add_layer_tensor(t, n, l, "ffn_gate_exps.bias", ff, ne, 0, 0.5);
    add_layer_tensor(t, n, l, "ffn_up_exps.bias", ff, ne, 0, 0.5);
    add_layer_tensor(t, n, l, "ffn_down_exps.bias", p->n_embd, ne, 0, 0.5);
}

/* The tensor list in file order. */
static int tensor_list(const cv_synth_params *p, synth_tensor *t)
{
    int n = 0;
    const int64_t hd = head_dim_of(p);
    const double std_embd = 1.0 / sqrt((double)p->n_embd);
    add_tensor(t, &n, "token_embd.weight", p->n_embd, p->n_vocab, 0, 1.0);
    add_tensor(t, &n, "output_norm.weight", p->n_embd, 0, 0, 0);
    if (!p->tied && !is_gemma(p)) /* a Gemma's output is always tied */
        add_tensor(t, &n, "output.weight", p->n_embd, p->n_vocab, 0, (double)p->output_scale * std_embd);
    if (p->arch == CV_ARCH_PHI3) { /* LongRoPE's divisors: long ones up to 1 + 0.25 (n_rot/2 - 1)^2, short ones near 1 */
        add_tensor(t, &n, "rope_factors_long.weight", rot_dims(p) / 2, 0, 0, 0);
        t[n - 1].ramp = 0.25f;
        add_tensor(t, &n, "rope_factors_short.weight", rot_dims(p) / 2, 0, 0, 0);
        t[n - 1].ramp = 0.002f;
    }
    for (int64_t l = 0; l < p->n_layer; l++) {
        add_layer_tensor(t, &n, l, "attn_norm.weight", p->n_embd, 0, 0, 0);
        add_attention(p, t, &n, l);
        /* gpt-oss's FFN norm is named post_attention_norm */
        add_layer_tensor(t, &n, l, is_gptoss(p) ? "post_attention_norm.weight" : "ffn_norm.weight", p->n_embd, 0, 0, 0);
        add_ffn(p, t, &n, l);
        if (is_gptoss(p))
            add_gptoss(p, t, &n, l);
        if (p->arch == CV_ARCH_QWEN2MOE) {
            add_layer_tensor(t, &n, l, "attn_q.bias", hd * p->n_head, 0, 0, std_embd);
            add_layer_tensor(t, &n, l, "attn_k.bias", hd * p->n_head_kv, 0, 0, std_embd);
            add_layer_tensor(t, &n, l, "attn_v.bias", hd * p->n_head_kv, 0, 0, std_embd);
        }
        if (p->arch == CV_ARCH_QWEN3MOE || p->arch == CV_ARCH_GEMMA3) {
            add_layer_tensor(t, &n, l, "attn_q_norm.weight", hd, 0, 0, 0);
            add_layer_tensor(t, &n, l, "attn_k_norm.weight", hd, 0, 0, 0);
        }
        if (is_gemma(p)) {
            add_layer_tensor(t, &n, l, "post_attention_norm.weight", p->n_embd, 0, 0, 0);
            add_layer_tensor(t, &n, l, "post_ffw_norm.weight", p->n_embd, 0, 0, 0);
        }
    }
    return n;
}

/* The quantization policy of p: quantize's, for its type or mix. */
static cv_quantize_params policy_of(const cv_synth_params *p)
{
    return (cv_quantize_params){.type = p->type, .output_type = CV_TYPE_COUNT, .mix = p->mix,
                                 .n_gqa = p->n_head_kv > 0 ? (int)(p->n_head / p->n_head_kv) : 1,
                                 .n_expert = (int)p->n_expert};
}

/* The type the quantization policy wants for a matrix (before fitting). */
static cv_type wanted_type(const cv_synth_params *p, const synth_tensor *t)
{
    if (!cv_quant_is_weight_matrix(t->name, t->n_dims))
        return CV_TYPE_F32;
    if (is_gptoss(p) && strstr(t->name, "_exps.weight")) /* as gpt-oss ships its experts */
        return CV_TYPE_MXFP4;
    const cv_quantize_params qp = policy_of(p);
    return cv_quant_policy_type(&qp, t->name, cv_quant_layer_of(t->name), (int)p->n_layer);
}

/* Types and sizes: vectors and the router F32, matrices the policy's type
 * that fits. */
static void type_tensor(const cv_synth_params *p, synth_tensor *t)
{
    t->type = cv_quant_fit_type(wanted_type(p, t), t->ne[0]);
    t->size = (uint64_t)cv_row_bytes(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2]);
}

/* One write's generation: what cv_gguf_write's maker needs. */
typedef struct synth_run {
    const cv_synth_params *p;
    const synth_tensor *tensors;
    int n_tensors;
    cv_pool *pool;
    float *scratch; /* an f32 row per thread */
    cv_tensor_note_fn note;
    void *note_ctx;
} synth_run;

/* cv_gguf_write's maker of tensor i: its rows generated into dst; noted. */
static int make_tensor(void *ctx, uint64_t i, void *dst, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    const synth_run *r = ctx;
    const synth_tensor *t = &r->tensors[i];
    if (t->is_norm) {
        float *x = dst;
        for (int64_t k = 0; k < t->ne[0]; k++)
            x[k] = 1.0f + t->ramp * (float)(k * k);
    } else {
        gen_job job = {
            .key = tensor_key(r->p->seed, t->name), .scale = value_scale(t->std), .n_rows = t->ne[1] * t->ne[2],
            .row_len = t->ne[0], .type = t->type, .row_bytes = cv_row_bytes(t->type, t->ne[0]), .dst = dst,
            .scratch = t->type == CV_TYPE_F32 ? NULL : r->scratch,
        };
        cv_pool_run(r->pool, gen_range, &job);
    }
    if (r->note) {
        cv_tensor_note n = {
            .index = (int)i, .count = r->n_tensors, .name = t->name, .n_dims = t->n_dims, .ne = t->ne,
            .src_type = CV_TYPE_F32, .want_type = wanted_type(r->p, t), .type = t->type,
            .src_bytes = (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2]) * sizeof(float), .bytes = t->size,
        };
        r->note(r->note_ctx, &n);
    }
    return 0;
}

static void set_hparams(gguf_writer *w, const cv_synth_params *p)
{
    char desc[160];
    snprintf(desc, sizeof(desc), "convoy synth: deterministic random weights (seed %llu); output is garbage",
             (unsigned long long)p->seed);
    const char *a = cv_llama_arch_name(p->arch);
    const uint32_t hd = (uint32_t)head_dim_of(p);
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, a), key)
    cv_gguf_set_str(w, "general.architecture", a);
    cv_gguf_set_str(w, "general.name", p->name[0] ? p->name : "convoy-synth");
    cv_gguf_set_str(w, "general.description", desc);
    const cv_quantize_params qp = policy_of(p);
    cv_gguf_set_u32(w, "general.file_type", (uint32_t)cv_quant_policy_file_type(&qp));
    cv_gguf_set_u32(w, "general.quantization_version", 2);
    cv_gguf_set_u32(w, KEY("vocab_size"), (uint32_t)p->n_vocab);
    cv_gguf_set_u32(w, KEY("context_length"), (uint32_t)p->n_ctx);
    cv_gguf_set_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd);
    cv_gguf_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer);
    cv_gguf_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff);
    if (p->arch == CV_ARCH_GEMMA2) {
        cv_gguf_set_f32(w, KEY("attn_logit_softcapping"), CV_SYNTH_GEMMA2_ATTN_SOFTCAP);
        cv_gguf_set_f32(w, KEY("final_logit_softcapping"), CV_SYNTH_GEMMA2_FINAL_SOFTCAP);
    }
    if (p->n_swa || p->head_dim) {
        cv_gguf_set_u32(w, KEY("attention.key_length"), hd);
        cv_gguf_set_u32(w, KEY("attention.value_length"), hd);
    }
    if (p->n_swa)
        cv_gguf_set_u32(w, KEY("attention.sliding_window"), (uint32_t)p->n_swa);
    else
        cv_gguf_set_u32(w, KEY("rope.dimension_count"), (uint32_t)rot_dims(p));
    if (is_gptoss(p)) { /* YaRN, as the converter writes it: the factor the context over the original */
        cv_gguf_set_str(w, KEY("rope.scaling.type"), "yarn");
        cv_gguf_set_f32(w, KEY("rope.scaling.factor"), (float)p->n_ctx / (float)p->n_ctx_orig);
        cv_gguf_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)p->n_ctx_orig);
    }
    if (p->arch == CV_ARCH_PHI3) { /* the attention factor as llama.cpp's converter computes it */
        const double s = (double)p->n_ctx / (double)p->n_ctx_orig;
        cv_gguf_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)p->n_ctx_orig);
        cv_gguf_set_f32(w, KEY("rope.scaling.attn_factor"),
                     s > 1 ? (float)sqrt(1 + log(s) / log((double)p->n_ctx_orig)) : 1.0f);
        cv_gguf_set_u32(w, KEY("attention.sliding_window"), (uint32_t)(p->n_ctx_orig / 8));
    }
    cv_gguf_set_f32(w, KEY("rope.freq_base"), p->rope_theta);
    cv_gguf_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head);
    cv_gguf_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv);
    cv_gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), p->rms_eps);
    if (p->n_expert) {
        cv_gguf_set_u32(w, KEY("expert_count"), (uint32_t)p->n_expert);
        cv_gguf_set_u32(w, KEY("expert_used_count"), (uint32_t)p->n_expert_used);
    }
    if (p->n_expert && p->arch != CV_ARCH_LLAMA)
        cv_gguf_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p->n_ff_exp);
    if (p->n_expert && p->arch == CV_ARCH_QWEN2MOE)
        cv_gguf_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)shared_ff(p));
#undef KEY
}

/* The synthetic SentencePiece vocabulary; a Gemma's without the space in
 * front of the text, as Gemma's files say. */
static void set_vocab(gguf_writer *w, const cv_synth_params *p, const vocab_build *v, int n_tail)
{
    cv_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    cv_gguf_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, (uint64_t)v->n);
    cv_gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, v->scores, (uint64_t)v->n);
    cv_gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, v->types, (uint64_t)v->n);
    cv_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    cv_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    const bool eos_last = p->chatml || p->arch == CV_ARCH_PHI3;
    cv_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", eos_last ? (uint32_t)(v->n - 1) : 2);
    static const char *const fim_keys[FIM_TOKENS] = {"tokenizer.ggml.fim_pre_token_id",
                                                     "tokenizer.ggml.fim_suf_token_id",
                                                     "tokenizer.ggml.fim_mid_token_id"};
    for (int i = 0; p->fim && i < FIM_TOKENS; i++)
        cv_gguf_set_u32(w, fim_keys[i], (uint32_t)(v->n - n_tail + i));
    cv_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    cv_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (is_gemma(p))
        cv_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    if (p->chatml)
        cv_gguf_set_str(w, "tokenizer.chat_template", chatml_template);
}

int cv_synth_write(const cv_synth_params *p, const char *path, cv_tensor_note_fn note, void *note_ctx,
                   char *err, size_t errlen)
{
    if (check_params(p, err, errlen))
        return -1;
    int rc = -1;
    int max_tensors = 5 + CV_LLAMA_LAYER_TENSORS_MAX * (int)p->n_layer;
    synth_tensor *tensors = cv_calloc((size_t)max_tensors, sizeof(*tensors));
    vocab_build v = {.cap = p->n_vocab};
    v.text = cv_malloc((size_t)v.cap * PIECE_MAX);
    v.tokens = cv_malloc((size_t)v.cap * sizeof(*v.tokens));
    v.scores = cv_malloc((size_t)v.cap * sizeof(*v.scores));
    v.types = cv_malloc((size_t)v.cap * sizeof(*v.types));
    gguf_writer *w = cv_gguf_writer_create();
    cv_pool *pool = cv_pool_create(p->n_threads);
    /* scratch rows for every thread, as long as the longest row */
    int64_t max_row = p->n_embd > p->n_ff ? p->n_embd : p->n_ff;
    const int64_t other_rows[] = {head_dim_of(p) * p->n_head, p->n_ff_exp, p->n_ff_shexp};
    for (size_t i = 0; i < sizeof other_rows / sizeof other_rows[0]; i++)
        max_row = other_rows[i] > max_row ? other_rows[i] : max_row;
    float *scratch = pool ? cv_malloc((size_t)cv_pool_size(pool) * (size_t)max_row * sizeof(float)) : NULL;
    int n_tensors = 0;
    if (!tensors || !v.text || !v.tokens || !v.scores || !v.types || !w || !pool || !scratch) {
        cv_errf(err, errlen, pool ? "out of memory" : "cannot start %d threads", p->n_threads);
        goto done;
    }
    const char *tail[TAIL_MAX];
    const int n_tail = tail_tokens(p, tail);
    vocab_fill(&v, tail, n_tail);
    set_hparams(w, p);
    set_vocab(w, p, &v, n_tail);

    n_tensors = tensor_list(p, tensors);
    const synth_run run = {.p = p, .tensors = tensors, .n_tensors = n_tensors, .pool = pool, .scratch = scratch,
                           .note = note, .note_ctx = note_ctx};
    for (int i = 0; i < n_tensors; i++) {
        type_tensor(p, &tensors[i]);
        cv_gguf_add_made_tensor(w, tensors[i].name, tensors[i].type, tensors[i].n_dims, tensors[i].ne, tensors[i].size,
                             make_tensor, (void *)&run);
    }
    rc = cv_gguf_write(w, path, err, errlen);

done:
    cv_free(tensors);
    cv_free(v.text);
    cv_free(v.tokens);
    cv_free(v.scores);
    cv_free(v.types);
    cv_gguf_writer_free(w);
    cv_pool_free(pool);
    cv_free(scratch);
    return rc;
}
