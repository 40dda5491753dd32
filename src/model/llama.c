/* llama.c: reads Llama hyperparameters from GGUF metadata and binds the
 * weight tensors of a layer range, checking each one's type and shape.
 * Architectures differ only in data: which optional tensors a layer has
 * (biases, Q/K norms, RoPE factors), whether matrices come fused (phi3)
 * and the RoPE pair layout.
 * The cv_llama owns the gguf_file (and so the mapping) and the F32 copies
 * of 1-D tensors stored in another type; weights point into the mapping. */
#include "model/llama.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "model/shard.h"

static int get_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out, bool required,
                   char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!required && !cv_gguf_find_kv(f, key))
        return 0;
    return cv_gguf_get_u32(f, key, out, err, errlen);
}

static int get_f32(const gguf_file *f, const char *arch, const char *suffix, float *out, bool required,
                   char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!required && !cv_gguf_find_kv(f, key))
        return 0;
    return cv_gguf_get_f32(f, key, out, err, errlen);
}

static const struct {
    const char *name;
    cv_arch arch;
    bool rope_neox;
} archs[] = {
    {"llama", CV_ARCH_LLAMA, false},
    {"qwen2", CV_ARCH_QWEN2, true},
    {"qwen3", CV_ARCH_QWEN3, true},
    {"gemma2", CV_ARCH_GEMMA2, true},
    {"gemma3", CV_ARCH_GEMMA3, true},
    {"qwen2moe", CV_ARCH_QWEN2MOE, true},
    {"qwen3moe", CV_ARCH_QWEN3MOE, true},
    {"phi3", CV_ARCH_PHI3, true},
    {"gpt-oss", CV_ARCH_GPTOSS, true},
};
#define N_ARCHS (sizeof archs / sizeof archs[0])

const char *cv_llama_arch_name(cv_arch a)
{
    for (size_t i = 0; i < N_ARCHS; i++)
        if (archs[i].arch == a)
            return archs[i].name;
    return "?";
}

/* The index in archs of the architecture named name (n bytes), or -1. */
static int arch_index(const char *name, size_t n)
{
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strlen(archs[i].name) == n && !memcmp(archs[i].name, name, n))
            return (int)i;
    return -1;
}

int cv_llama_arch_of(const char *name, size_t n, cv_arch *a)
{
    const int i = arch_index(name, n);
    if (i >= 0)
        *a = archs[i].arch;
    return i >= 0 ? 0 : -1;
}

/* Gemma 2's and Gemma 3's own hyperparameters, as llama.cpp reads them:
 * embeddings times sqrt(n_embd), GeGLU, optional final_logit_softcapping;
 * queries scaled by 1/sqrt(head_dim), but by 1/sqrt(n_embd / n_head) for
 * the 27B (46 layers for Gemma 2, 62 for Gemma 3). Gemma 2: layers 0, 2,
 * 4... slide over attention.sliding_window positions (4096 when absent)
 * with the model's RoPE base; attention scores soft-capped by
 * attn_logit_softcapping (50 when absent), final logits by 30 when the key
 * is absent. Gemma 3: 5 of every 6 layers slide (none when the sliding window is
 * absent or 0) with RoPE base 10000; linear rope.scaling.factor on the
 * full-attention layers. */
static int read_gemma(const gguf_file *f, cv_llama_hparams *hp, char *err, size_t errlen)
{
    const bool g2 = hp->arch == CV_ARCH_GEMMA2;
    const char *a = cv_llama_arch_name(hp->arch);
    uint32_t n_swa = g2 ? 4096 : 0;
    float softcap = g2 ? 30.0f : 0.0f, attn_softcap = g2 ? 50.0f : 0.0f, factor = 0.0f;
    if (get_u32(f, a, "attention.sliding_window", &n_swa, false, err, errlen) ||
        get_f32(f, a, "final_logit_softcapping", &softcap, false, err, errlen) ||
        (g2 && get_f32(f, a, "attn_logit_softcapping", &attn_softcap, false, err, errlen)) ||
        (!g2 && get_f32(f, a, "rope.scaling.factor", &factor, false, err, errlen)))
        return -1;
    if (n_swa > CV_LLAMA_MAX_CTX || !(softcap >= 0) || !isfinite(softcap) || !(attn_softcap >= 0) ||
        !isfinite(attn_softcap) || !(factor >= 0) || !isfinite(factor))
        return cv_errf(err, errlen,
                       "%s: bad sliding window %u, logit soft-cap %g, attention soft-cap %g or rope scaling %g",
                       f->name, n_swa, softcap, attn_softcap, factor);
    hp->n_swa = (int32_t)n_swa;
    hp->swa_pattern = g2 ? 2 : 6;
    hp->rope_theta_swa = g2 ? hp->rope_theta : 10000.0f;
    hp->logit_softcap = softcap;
    hp->attn_softcap = attn_softcap;
    hp->rope_scale = factor > 0 ? 1.0f / factor : 1.0f;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->glu = CV_GLU_GELU;
    if (hp->n_layer == (g2 ? 46 : 62))
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    return 0;
}

/* A mixture of experts' keys, as llama.cpp reads them: expert_count and
 * expert_used_count (required by qwen2moe, qwen3moe and gpt-oss; a llama
 * without them is dense), the experts' hidden size
 * expert_feed_forward_length (those three; else n_ff / n_expert_used;
 * Mixtral's is n_ff), and qwen2moe's expert_shared_feed_forward_length
 * (else n_ff), which becomes n_ff: the shared expert takes the dense FFN's
 * place. qwen2moe keeps the softmax weights of the chosen experts as they
 * are; gpt-oss takes the softmax of the chosen experts' logits; the others
 * rescale their softmax weights to sum to 1. */
static int read_experts(const gguf_file *f, const char *arch, cv_llama_hparams *hp, char *err, size_t errlen)
{
    const bool moe_arch = hp->arch == CV_ARCH_QWEN2MOE || hp->arch == CV_ARCH_QWEN3MOE || hp->arch == CV_ARCH_GPTOSS;
    uint32_t n_expert = 0, n_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    if (get_u32(f, arch, "expert_count", &n_expert, moe_arch, err, errlen) ||
        get_u32(f, arch, "expert_used_count", &n_used, moe_arch || n_expert > 0, err, errlen) ||
        get_u32(f, arch, "expert_feed_forward_length", &n_ff_exp, false, err, errlen) ||
        get_u32(f, arch, "expert_shared_feed_forward_length", &n_ff_shexp, false, err, errlen))
        return -1;
    if (n_expert == 0 && !moe_arch)
        return 0;
    if (n_expert < 1 || n_expert > CV_LLAMA_MAX_EXPERTS)
        return cv_errf(err, errlen, "%s: %s.expert_count %u is outside [1, %d]", f->name, arch, n_expert,
                       CV_LLAMA_MAX_EXPERTS);
    if (n_used < 1 || n_used > n_expert)
        return cv_errf(err, errlen, "%s: %s.expert_used_count %u is outside [1, expert_count %u]", f->name, arch,
                       n_used, n_expert);
    if (!moe_arch || !n_ff_exp)
        n_ff_exp = hp->arch == CV_ARCH_LLAMA ? (uint32_t)hp->n_ff : (uint32_t)hp->n_ff / n_used;
    if (n_ff_exp < 1 || n_ff_exp > (1u << 22) || n_ff_shexp > (1u << 22))
        return cv_errf(err, errlen, "%s: expert hidden size %u or shared expert's %u is out of range", f->name,
                       n_ff_exp, n_ff_shexp);
    hp->n_expert = (int32_t)n_expert;
    hp->n_expert_used = (int32_t)n_used;
    hp->n_ff_exp = (int32_t)n_ff_exp;
    hp->expert_norm = hp->arch != CV_ARCH_QWEN2MOE && hp->arch != CV_ARCH_GPTOSS;
    hp->expert_softmax_chosen = hp->arch == CV_ARCH_GPTOSS;
    if (hp->arch == CV_ARCH_QWEN2MOE && n_ff_shexp)
        hp->n_ff = (int32_t)n_ff_shexp;
    return 0;
}

/* YaRN's magnitude, as llama.cpp composes it: its context's attention
 * factor (0.1 ln s + 1) / (1 + 0.1 ln s) for a factor s = 1 / freq_scale,
 * times rope.scaling.attn_factor (attn_factor here), then ggml's rope
 * multiplies it by 1 + 0.1 ln(1 / freq_scale): about 1 + 0.1 ln s. */
static float yarn_mscale(float freq_scale, float attn_factor)
{
    const float s = 1.0f / freq_scale;
    float attn = s <= 1.0f ? 1.0f : 0.1f * logf(s) + 1.0f;
    attn *= 1.0f / (1.0f + 0.1f * logf(s));
    attn *= attn_factor;
    return attn * (1.0f + 0.1f * logf(1.0f / freq_scale));
}

/* Whether string s is lit. */
static bool str_is(gguf_str s, const char *lit) { return s.len == strlen(lit) && !memcmp(s.ptr, lit, s.len); }

/* gpt-oss's own hyperparameters, as llama.cpp reads them: layers 0, 2,
 * 4... slide over attention.sliding_window positions (required) with the
 * others' RoPE; each attention head rotates whole (NeoX pairs), queries scaled by
 * 1/sqrt(head_dim); the clamped SwiGLU. rope.scaling.type "yarn" (what
 * the converter writes) turns YaRN on (ext_factor 1) with
 * rope.scaling.factor s: positions times 1/s on every layer, blended
 * with the unscaled angles by the ramp, cos and sin times yarn_mscale;
 * "linear" (llama.cpp's default when the key is absent) only scales the
 * positions, "none" nothing. */
static int read_gptoss(const gguf_file *f, cv_llama_hparams *hp, char *err, size_t errlen)
{
    const char *a = cv_llama_arch_name(hp->arch);
    uint32_t n_swa = 0;
    float factor = 0.0f;
    gguf_str type = {.ptr = "linear", .len = 6};
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (get_u32(f, a, "attention.sliding_window", &n_swa, true, err, errlen) ||
        get_f32(f, a, "rope.scaling.factor", &factor, false, err, errlen) ||
        (cv_gguf_find_kv(f, key) && cv_gguf_get_str(f, key, &type, err, errlen)))
        return -1;
    const bool yarn = str_is(type, "yarn"), none = str_is(type, "none");
    if (!yarn && !none && !str_is(type, "linear"))
        return cv_errf(err, errlen, "%s: %s '%.*s' is not supported (none, linear, yarn)", f->name, key,
                       (int)(type.len > 32 ? 32 : type.len), type.ptr);
    if (!n_swa || n_swa > CV_LLAMA_MAX_CTX || !(factor >= 0) || !isfinite(factor))
        return cv_errf(err, errlen, "%s: bad sliding window %u or rope scaling factor %g", f->name, n_swa, factor);
    if (hp->n_rot != hp->head_dim)
        return cv_errf(err, errlen, "%s: rope.dimension_count %d is not the head size %d, which gpt-oss rotates whole",
                       f->name, hp->n_rot, hp->head_dim);
    const float freq_scale = factor > 0 && !none ? 1.0f / factor : 1.0f;
    hp->n_swa = (int32_t)n_swa;
    hp->swa_pattern = 2;
    hp->rope_theta_swa = hp->rope_theta;
    hp->rope_scale = hp->rope_scale_swa = freq_scale;
    hp->glu = CV_GLU_OAI;
    if (yarn) {
        hp->yarn_ext = 1.0f;
        hp->rope_mscale = yarn_mscale(freq_scale, hp->rope_mscale);
    }
    return 0;
}

/* RoPE's scaling keys any architecture may have, as llama.cpp reads them:
 * rope.scaling.attn_factor multiplies cos and sin (Phi-3's LongRoPE
 * attention factor, sqrt(1 + ln(s) / ln(original context)) for a context
 * s times longer); rope.scaling.original_context_length (else
 * context_length) is the context beyond which the long factors apply.
 * phi3's attention.sliding_window is not read: llama.cpp turns Phi-3's
 * sliding window off (its converters do not write the right one yet). */
static int read_rope_scaling(const gguf_file *f, const char *arch, cv_llama_hparams *hp, char *err, size_t errlen)
{
    uint32_t n_ctx_orig = (uint32_t)hp->n_ctx_train;
    float mscale = 1.0f;
    if (get_u32(f, arch, "rope.scaling.original_context_length", &n_ctx_orig, false, err, errlen) ||
        get_f32(f, arch, "rope.scaling.attn_factor", &mscale, false, err, errlen))
        return -1;
    if (!n_ctx_orig || n_ctx_orig > CV_LLAMA_MAX_CTX || !(mscale > 0) || !isfinite(mscale))
        return cv_errf(err, errlen, "%s: bad rope scaling: original context %u, attention factor %g", f->name,
                       n_ctx_orig, mscale);
    hp->n_ctx_orig = (int32_t)n_ctx_orig;
    hp->rope_mscale = mscale;
    return 0;
}

/* The vocabulary: token_embd's rows, else (a shard without the
 * embeddings) what its shard keys record. */
static int vocab_size(const gguf_file *f, uint32_t n_embd, int32_t *n_vocab, char *err, size_t errlen)
{
    const gguf_tensor *te = cv_gguf_find_tensor(f, "token_embd.weight");
    uint32_t n = 0;
    if (!te && cv_shard_is(f) && cv_gguf_get_u32(f, CV_SHARD_KEY_N_VOCAB, &n, err, errlen))
        return -1;
    if (!te && (n < 1 || n > (1u << 24)))
        return cv_errf(err, errlen, "%s: tensor 'token_embd.weight' is missing", f->name);
    if (te && (te->n_dims != 2 || te->ne[0] != n_embd || te->ne[1] < 1 || te->ne[1] > (1 << 24)))
        return cv_errf(err, errlen, "%s: tensor 'token_embd.weight' has shape [%lld, %lld], expected [%u, n_vocab]",
                       f->name, (long long)te->ne[0], (long long)te->ne[1], n_embd);
    *n_vocab = te ? (int32_t)te->ne[1] : (int32_t)n;
    return 0;
}

static int read_hparams(const gguf_file *f, cv_llama_hparams *hp, char *err, size_t errlen)
{
    gguf_str arch_s;
    if (cv_gguf_get_str(f, "general.architecture", &arch_s, err, errlen))
        return -1;
    const int a = arch_index(arch_s.ptr, arch_s.len);
    if (a < 0)
        return cv_errf(err, errlen,
                       "%s: architecture '%.*s' is not supported (supported: llama, qwen2, qwen3, gemma2, gemma3, "
                       "qwen2moe, qwen3moe, phi3, gpt-oss)",
                       f->name, (int)(arch_s.len > 64 ? 64 : arch_s.len), arch_s.ptr);
    const char *arch = archs[a].name;
    uint32_t n_embd, n_layer, n_head, n_head_kv = 0, n_ff, n_ctx, n_rot = 0, key_length = 0, value_length = 0;
    uint32_t pooling = CV_POOL_MEAN;
    float eps, theta = 10000.0f;
    if (get_u32(f, arch, "embedding_length", &n_embd, true, err, errlen) ||
        get_u32(f, arch, "block_count", &n_layer, true, err, errlen) ||
        get_u32(f, arch, "attention.head_count", &n_head, true, err, errlen) ||
        get_u32(f, arch, "attention.head_count_kv", &n_head_kv, false, err, errlen) ||
        get_u32(f, arch, "attention.key_length", &key_length, false, err, errlen) ||
        get_u32(f, arch, "attention.value_length", &value_length, false, err, errlen) ||
        get_u32(f, arch, "feed_forward_length", &n_ff, true, err, errlen) ||
        get_u32(f, arch, "context_length", &n_ctx, true, err, errlen) ||
        get_u32(f, arch, "rope.dimension_count", &n_rot, false, err, errlen) ||
        get_f32(f, arch, "attention.layer_norm_rms_epsilon", &eps, true, err, errlen) ||
        get_f32(f, arch, "rope.freq_base", &theta, false, err, errlen) ||
        get_u32(f, arch, "pooling_type", &pooling, false, err, errlen))
        return -1;
    if (!n_head_kv)
        n_head_kv = n_head;
    if (n_ctx > CV_LLAMA_MAX_CTX) /* it would wrap negative as an int32_t */
        return cv_errf(err, errlen, "%s: %s.context_length %u is over the limit of %d positions", f->name, arch,
                       n_ctx, CV_LLAMA_MAX_CTX);
    if (!n_embd || n_embd > (1u << 20) || !n_layer || n_layer > 4096 || !n_head || n_head > 4096 ||
        (!key_length && n_embd % n_head) || n_head_kv > n_head || !n_head_kv || n_head % n_head_kv || !n_ff ||
        n_ff > (1u << 22) || !n_ctx)
        return cv_errf(err, errlen,
                       "%s: inconsistent hyperparameters (n_embd %u, n_layer %u, n_head %u, n_head_kv %u, n_ff %u, "
                       "context %u)",
                       f->name, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx);
    uint32_t head_dim = key_length ? key_length : n_embd / n_head;
    if (head_dim > 1024 || (value_length && value_length != head_dim))
        return cv_errf(err, errlen, "%s: key length %u and value length %u are not supported", f->name, head_dim,
                       value_length);
    if (!n_rot)
        n_rot = head_dim;
    if (n_rot > head_dim || n_rot % 2)
        return cv_errf(err, errlen, "%s: rope.dimension_count %u does not fit head size %u", f->name, n_rot,
                       head_dim);
    if (!(eps > 0 && eps < 1) || !(theta > 0) || !isfinite(theta))
        return cv_errf(err, errlen, "%s: bad rms epsilon %g or rope base %g", f->name, eps, theta);
    int32_t n_vocab = 0;
    if (vocab_size(f, n_embd, &n_vocab, err, errlen))
        return -1;
    *hp = (cv_llama_hparams){
        .arch = archs[a].arch,
        .n_vocab = n_vocab,
        .n_embd = (int32_t)n_embd,
        .n_layer = (int32_t)n_layer,
        .n_head = (int32_t)n_head,
        .n_head_kv = (int32_t)n_head_kv,
        .head_dim = (int32_t)head_dim,
        .n_ff = (int32_t)n_ff,
        .n_ctx_train = (int32_t)n_ctx,
        .n_rot = (int32_t)n_rot,
        .rms_eps = eps,
        .rope_theta = theta,
        .rope_neox = archs[a].rope_neox,
        .attn_scale = 1.0f / sqrtf((float)head_dim),
        .embd_scale = 1.0f,
        .rope_scale = 1.0f,
        .rope_scale_swa = 1.0f,
        .pooling = pooling > INT32_MAX ? INT32_MAX : (int32_t)pooling,
    };
    if (read_experts(f, arch, hp, err, errlen) || read_rope_scaling(f, arch, hp, err, errlen))
        return -1;
    if (hp->arch == CV_ARCH_GPTOSS)
        return read_gptoss(f, hp, err, errlen);
    return hp->arch == CV_ARCH_GEMMA2 || hp->arch == CV_ARCH_GEMMA3 ? read_gemma(f, hp, err, errlen) : 0;
}

/* A matrix type convoy computes with, whose rows of n_in fit its blocks
 * and its activations' blocks. */
static int check_matrix_type(const cv_llama *m, const char *name, cv_type type, int32_t n_in, char *err,
                             size_t errlen)
{
    const cv_type_traits *tt = cv_type_get(type);
    if (!tt || !tt->vec_dot || !cv_type_get(tt->vec_dot_type))
        return cv_errf(err, errlen, "%s: tensor '%s' has type %s, which convoy cannot compute with", m->gguf.name,
                       name, cv_type_name(type));
    if (n_in % tt->blck_size || n_in % cv_type_get(tt->vec_dot_type)->blck_size)
        return cv_errf(err, errlen, "%s: tensor '%s' rows of %d do not fit type %s", m->gguf.name, name, n_in,
                       tt->name);
    return 0;
}

static int bind_matrix(cv_llama *m, const char *name, int32_t n_in, int32_t n_out, cv_weight *w, char *err,
                       size_t errlen)
{
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    if (!t)
        return cv_errf(err, errlen, "%s: tensor '%s' is missing", m->gguf.name, name);
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return cv_errf(err, errlen, "%s: tensor '%s' has shape [%lld, %lld], expected [%d, %d]", m->gguf.name, name,
                       (long long)t->ne[0], (long long)t->ne[1], n_in, n_out);
    if (check_matrix_type(m, name, t->type, n_in, err, errlen))
        return -1;
    *w = (cv_weight){.type = t->type, .data = t->data, .n_in = n_in, .n_out = n_out};
    return 0;
}

/* Binds a stacked expert tensor [n_in, n_out, n_expert] as one matrix of
 * n_expert * n_out rows (cv_llama_expert views expert e). */
static int bind_experts(cv_llama *m, const char *name, int32_t n_in, int32_t n_out, cv_weight *w, char *err,
                        size_t errlen)
{
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    const int32_t n_expert = m->hp.n_expert;
    if (!t)
        return cv_errf(err, errlen, "%s: tensor '%s' is missing", m->gguf.name, name);
    if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_expert)
        return cv_errf(err, errlen, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%d, %d, %d]",
                       m->gguf.name, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], n_in, n_out,
                       n_expert);
    if ((int64_t)n_out * n_expert > INT32_MAX)
        return cv_errf(err, errlen, "%s: tensor '%s' has too many rows", m->gguf.name, name);
    if (check_matrix_type(m, name, t->type, n_in, err, errlen))
        return -1;
    *w = (cv_weight){.type = t->type, .data = t->data, .n_in = n_in, .n_out = n_out * n_expert};
    return 0;
}

/* Reads the n bytes of a tensor at data (inside the mapping) into dst, with
 * pread, so that the mapping's pages are never touched. */
static int read_tensor(const cv_llama *m, const void *data, size_t n, void *dst, char *err, size_t errlen)
{
    char why[256];
    if (cv_fmap_read(&m->gguf.map, (size_t)((const uint8_t *)data - m->gguf.map.data), n, dst, why, sizeof why))
        return cv_errf(err, errlen, "%s: %s", m->gguf.name, why);
    return 0;
}

/* Binds a 1-D vector (norm weight, bias, rope factors) of n elements, or
 * with rows > 0 a table [n, rows] (gpt-oss's experts' biases), as an F32
 * copy at *copy, read with pread. Never read through the mapping: the page cache
 * may hold the file in 2 MiB folios, and touching one vector there mapped
 * its whole folio (1B model: 61 MB of mapped file resident for 32 norms). */
static int bind_table(cv_llama *m, const char *name, int32_t n, int32_t rows, float **copy, const float **out,
                      char *err, size_t errlen)
{
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    if (!t)
        return cv_errf(err, errlen, "%s: tensor '%s' is missing", m->gguf.name, name);
    if (!rows && (t->n_dims != 1 || t->ne[0] != n))
        return cv_errf(err, errlen, "%s: tensor '%s' has %lld elements, expected [%d]", m->gguf.name, name,
                       (long long)t->ne[0], n);
    if (rows && (t->n_dims != 2 || t->ne[0] != n || t->ne[1] != rows))
        return cv_errf(err, errlen, "%s: tensor '%s' has shape [%lld, %lld], expected [%d, %d]", m->gguf.name, name,
                       (long long)t->ne[0], (long long)t->ne[1], n, rows);
    n *= rows ? rows : 1;
    const cv_type_traits *tt = cv_type_get(t->type);
    if (!tt)
        return cv_errf(err, errlen, "%s: tensor '%s' has unsupported type %s", m->gguf.name, name,
                       cv_type_name(t->type));
    void *raw = cv_malloc(t->size);
    if (!raw)
        return cv_errf(err, errlen, "%s: out of memory", m->gguf.name);
    const int rc = read_tensor(m, t->data, t->size, raw, err, errlen);
    if (rc == 0) {
        tt->to_float(raw, *copy, n);
        *out = *copy;
        *copy += n;
    }
    cv_free(raw);
    return rc;
}

static int bind_vec(cv_llama *m, const char *name, int32_t n, float **copy, const float **out, char *err,
                    size_t errlen)
{
    return bind_table(m, name, n, 0, copy, out, err, errlen);
}

/* ---- weights in private memory ---- */

/* A layer's matrices that become resident; a mixture of experts' stacked
 * experts stay in the file, read as chosen (model/experts.h). */
enum { LAYER_MATRICES = 8 };

static cv_weight *layer_matrix(cv_llama_layer *L, int i)
{
    cv_weight *const w[LAYER_MATRICES] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->router};
    return w[i];
}

/* Bytes a matrix takes in the resident block: 64-byte aligned starts. */
static size_t resident_size(const cv_weight *w)
{
    const size_t n = w->data ? cv_weight_bytes(w) : 0;
    return (n + 63) / 64 * 64;
}

int cv_llama_read_matrix(const cv_llama *m, const cv_weight *w, void *staging, void *dst, cv_weight *out, char *err,
                         size_t errlen)
{
    const size_t n = cv_weight_bytes(w);
    /* products of 2-8 tokens (batched decode) share each load of 8 rows */
    const bool interleave = cv_interleave_supported(w->type, w->n_in, w->n_out);
    if (read_tensor(m, w->data, n, interleave && staging ? staging : dst, err, errlen))
        return -1;
    if (interleave && (staging ? cv_interleave_into(w->type, w->n_in, w->n_out, staging, dst)
                               : cv_interleave(w->type, w->n_in, w->n_out, dst)))
        return cv_errf(err, errlen, "%s: out of memory interleaving weights", m->gguf.name);
    *out = *w;
    out->data = dst;
    out->interleaved = interleave;
    return 0;
}

/* Reads matrix w from the file into *at (interleaved in place), points w
 * there, moves *at on. */
static int move_resident(cv_llama *m, cv_weight *w, uint8_t **at, char *err, size_t errlen)
{
    if (!w->data)
        return 0;
    if (cv_llama_read_matrix(m, w, NULL, *at, w, err, errlen))
        return -1;
    *at += resident_size(w);
    return 0;
}

/* The bound matrices move from the file mapping into one block of private
 * memory in huge pages, read with pread so the mapping's pages are never
 * touched (resident memory stays one copy). Decode streams every weight
 * once per token; through a mapping's 4 KiB pages one core read 11.4 GB/s,
 * through huge pages 14.9. token_embd stays mapped: a token reads a row. */
static int make_resident(cv_llama *m, char *err, size_t errlen)
{
    size_t total = resident_size(&m->output);
    for (int32_t l = m->l0; l < m->l1; l++)
        for (int i = 0; i < LAYER_MATRICES; i++)
            total += resident_size(layer_matrix(&m->layers[l], i));
    if (total == 0)
        return 0;
    m->resident = cv_huge_alloc(total);
    if (!m->resident)
        return cv_errf(err, errlen, "%s: out of memory for %zu bytes of weights", m->gguf.name, total);
    m->resident_bytes = total;
    uint8_t *at = m->resident;
    for (int32_t l = m->l0; l < m->l1; l++)
        for (int i = 0; i < LAYER_MATRICES; i++)
            if (move_resident(m, layer_matrix(&m->layers[l], i), &at, err, errlen))
                return -1;
    return move_resident(m, &m->output, &at, err, errlen);
}

/* Rows [r0, r0 + n) of matrix `all` as a matrix of its own: a view. */
static cv_weight row_view(const cv_weight *all, int32_t r0, int32_t n)
{
    cv_weight w = *all;
    w.data = (const uint8_t *)all->data + cv_row_bytes(all->type, all->n_in) * (size_t)r0;
    w.n_out = n;
    return w;
}

/* Q, K and V of layer l: attn_qkv's row views when the file fuses them
 * (phi3), else attn_q, attn_k and attn_v. */
static int bind_qkv(cv_llama *m, int32_t l, cv_llama_layer *L, char *err, size_t errlen)
{
    const cv_llama_hparams *hp = &m->hp;
    const int32_t n_embd = hp->n_embd, n_q = hp->n_head * hp->head_dim, n_kv = hp->n_head_kv * hp->head_dim;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
    if (cv_gguf_find_tensor(&m->gguf, name)) {
        cv_weight qkv;
        if (bind_matrix(m, name, n_embd, n_q + 2 * n_kv, &qkv, err, errlen))
            return -1;
        L->wq = row_view(&qkv, 0, n_q);
        L->wk = row_view(&qkv, n_q, n_kv);
        L->wv = row_view(&qkv, n_q + n_kv, n_kv);
        return 0;
    }
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (bind_matrix(m, NAME("attn_q.weight"), n_embd, n_q, &L->wq, err, errlen) ||
        bind_matrix(m, NAME("attn_k.weight"), n_embd, n_kv, &L->wk, err, errlen) ||
        bind_matrix(m, NAME("attn_v.weight"), n_embd, n_kv, &L->wv, err, errlen))
        return -1;
#undef NAME
    return 0;
}

/* Gate and up of layer l (suffix "" or qwen2moe's shared expert's
 * "_shexp"): phi3's ffn_up holds the gate's rows, then up's (llama.cpp's
 * fused SwiGLU takes silu of the first half); the others have ffn_gate and
 * ffn_up. */
static int bind_gate_up(cv_llama *m, int32_t l, const char *suffix, char *err, size_t errlen)
{
    cv_llama_layer *L = &m->layers[l];
    const int32_t n_embd = m->hp.n_embd, n_ff = m->hp.n_ff;
    char gate[96], up[96];
    snprintf(gate, sizeof gate, "blk.%d.ffn_gate%s.weight", l, suffix);
    snprintf(up, sizeof up, "blk.%d.ffn_up%s.weight", l, suffix);
    if (m->hp.arch != CV_ARCH_PHI3) {
        if (bind_matrix(m, gate, n_embd, n_ff, &L->w_gate, err, errlen) ||
            bind_matrix(m, up, n_embd, n_ff, &L->w_up, err, errlen))
            return -1;
        return 0;
    }
    cv_weight both;
    if (bind_matrix(m, up, n_embd, 2 * n_ff, &both, err, errlen))
        return -1;
    L->w_gate = row_view(&both, 0, n_ff);
    L->w_up = row_view(&both, n_ff, n_ff);
    return 0;
}

/* Layer l's feed-forward weights: the dense FFN's three matrices, or a
 * mixture of experts' router and stacked experts (gpt-oss: with their
 * biases), and qwen2moe's shared expert (in the dense FFN's place) with
 * its gate vector. */
static int bind_ffn(cv_llama *m, int32_t l, float **copy, char *err, size_t errlen)
{
    const cv_llama_hparams *hp = &m->hp;
    cv_llama_layer *L = &m->layers[l];
    const int32_t n_embd = hp->n_embd;
    const bool shared = hp->arch == CV_ARCH_QWEN2MOE;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    if (hp->n_expert &&
        (bind_matrix(m, NAME("ffn_gate_inp.weight"), n_embd, hp->n_expert, &L->router, err, errlen) ||
         bind_experts(m, NAME("ffn_gate_exps.weight"), n_embd, hp->n_ff_exp, &L->gate_exps, err, errlen) ||
         bind_experts(m, NAME("ffn_up_exps.weight"), n_embd, hp->n_ff_exp, &L->up_exps, err, errlen) ||
         bind_experts(m, NAME("ffn_down_exps.weight"), hp->n_ff_exp, n_embd, &L->down_exps, err, errlen)))
        return -1;
    if (hp->arch == CV_ARCH_GPTOSS &&
        (bind_vec(m, NAME("ffn_gate_inp.bias"), hp->n_expert, copy, &L->router_b, err, errlen) ||
         bind_table(m, NAME("ffn_gate_exps.bias"), hp->n_ff_exp, hp->n_expert, copy, &L->gate_exps_b, err, errlen) ||
         bind_table(m, NAME("ffn_up_exps.bias"), hp->n_ff_exp, hp->n_expert, copy, &L->up_exps_b, err, errlen) ||
         bind_table(m, NAME("ffn_down_exps.bias"), n_embd, hp->n_expert, copy, &L->down_exps_b, err, errlen)))
        return -1;
    if (hp->n_expert && !shared)
        return 0;
    const float *gate_vec = NULL;
    if (shared && bind_vec(m, NAME("ffn_gate_inp_shexp.weight"), n_embd, copy, &gate_vec, err, errlen))
        return -1;
    L->shexp_gate = (cv_weight){.type = CV_TYPE_F32, .data = gate_vec, .n_in = n_embd, .n_out = 1};
    if (bind_gate_up(m, l, shared ? "_shexp" : "", err, errlen) ||
        bind_matrix(m, shared ? NAME("ffn_down_shexp.weight") : NAME("ffn_down.weight"), hp->n_ff, n_embd, &L->w_down,
                    err, errlen))
        return -1;
#undef NAME
    return 0;
}

/* Layer l's tensors, as its architecture has them. */
static int bind_layer(cv_llama *m, int32_t l, float **copy, char *err, size_t errlen)
{
    const cv_llama_hparams *hp = &m->hp;
    cv_llama_layer *L = &m->layers[l];
    const int32_t n_embd = hp->n_embd, n_q = hp->n_head * hp->head_dim, n_kv = hp->n_head_kv * hp->head_dim;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
    const bool gptoss = hp->arch == CV_ARCH_GPTOSS;
    /* gpt-oss's FFN norm is named post_attention_norm */
    if (bind_vec(m, NAME("attn_norm.weight"), n_embd, copy, &L->attn_norm, err, errlen) ||
        bind_qkv(m, l, L, err, errlen) ||
        bind_matrix(m, NAME("attn_output.weight"), n_q, n_embd, &L->wo, err, errlen) ||
        bind_vec(m, gptoss ? NAME("post_attention_norm.weight") : NAME("ffn_norm.weight"), n_embd, copy, &L->ffn_norm,
                 err, errlen) ||
        bind_ffn(m, l, copy, err, errlen))
        return -1;
    if (gptoss && (bind_vec(m, NAME("attn_output.bias"), n_embd, copy, &L->bo, err, errlen) ||
                   bind_vec(m, NAME("attn_sinks.weight"), hp->n_head, copy, &L->sinks, err, errlen)))
        return -1;
    const bool biases = hp->arch == CV_ARCH_QWEN2 || hp->arch == CV_ARCH_QWEN2MOE || gptoss;
    if (biases && (bind_vec(m, NAME("attn_q.bias"), n_q, copy, &L->bq, err, errlen) ||
                   bind_vec(m, NAME("attn_k.bias"), n_kv, copy, &L->bk, err, errlen) ||
                   bind_vec(m, NAME("attn_v.bias"), n_kv, copy, &L->bv, err, errlen)))
        return -1;
    if ((hp->arch == CV_ARCH_QWEN3 || hp->arch == CV_ARCH_QWEN3MOE || hp->arch == CV_ARCH_GEMMA3) &&
        (bind_vec(m, NAME("attn_q_norm.weight"), hp->head_dim, copy, &L->q_norm, err, errlen) ||
         bind_vec(m, NAME("attn_k_norm.weight"), hp->head_dim, copy, &L->k_norm, err, errlen)))
        return -1;
    if ((hp->arch == CV_ARCH_GEMMA2 || hp->arch == CV_ARCH_GEMMA3) &&
        (bind_vec(m, NAME("post_attention_norm.weight"), n_embd, copy, &L->post_attn_norm, err, errlen) ||
         bind_vec(m, NAME("post_ffw_norm.weight"), n_embd, copy, &L->post_ffn_norm, err, errlen)))
        return -1;
#undef NAME
    return 0;
}

/* The tensors every layer shares: the RoPE factors (Llama 3.1's
 * rope_freqs, Phi-3's LongRoPE rope_factors_long and rope_factors_short). */
static const char *const rope_factor_names[] = {"rope_freqs.weight", "rope_factors_long.weight",
                                                "rope_factors_short.weight"};

/* Binds the RoPE factors the file has. */
static int bind_rope_factors(cv_llama *m, float **copy, char *err, size_t errlen)
{
    const float **const out[3] = {&m->rope_freqs, &m->rope_long, &m->rope_short};
    for (int i = 0; i < 3; i++)
        if (cv_gguf_find_tensor(&m->gguf, rope_factor_names[i]) &&
            bind_vec(m, rope_factor_names[i], m->hp.n_rot / 2, copy, out[i], err, errlen))
            return -1;
    return 0;
}

const float *cv_llama_rope_factors(const cv_llama *m, int32_t n_ctx)
{
    if (m->rope_freqs)
        return m->rope_freqs;
    return n_ctx > m->hp.n_ctx_orig ? m->rope_long : m->rope_short;
}

int cv_llama_load(cv_llama *m, const char *path, int32_t l0, int32_t l1, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (cv_gguf_open(&m->gguf, path, err, errlen))
        return -1;
    cv_llama_hparams *hp = &m->hp;
    if (read_hparams(&m->gguf, hp, err, errlen))
        goto fail;
    if (l1 < 0)
        l1 = hp->n_layer;
    if (l0 < 0 || l1 > hp->n_layer || l0 > l1 || (l0 == l1 && l0 != 0)) {
        cv_errf(err, errlen, "%s: layer range [%d, %d) is not inside [0, %d)", m->gguf.name, l0, l1, hp->n_layer);
        goto fail;
    }
    if (cv_shard_range(&m->gguf, hp->n_layer, &m->held_l0, &m->held_l1, err, errlen))
        goto fail;
    if (l0 < l1 && (l0 < m->held_l0 || l1 > m->held_l1)) {
        cv_errf(err, errlen, "%s: a shard of layers [%d, %d) does not hold layers [%d, %d)", m->gguf.name,
                m->held_l0, m->held_l1, l0, l1);
        goto fail;
    }
    m->l0 = l0;
    m->l1 = l1;
    const int32_t n_embd = hp->n_embd, n_q = hp->n_head * hp->head_dim, n_kv = hp->n_head_kv * hp->head_dim;
    m->layers = cv_calloc((size_t)hp->n_layer, sizeof *m->layers);
    size_t per_layer = 5 * (size_t)n_embd + (size_t)n_q + 2 * (size_t)n_kv + 2 * (size_t)hp->head_dim;
    if (hp->arch == CV_ARCH_GPTOSS) /* the output bias, the sinks, the router's and the experts' biases */
        per_layer += (size_t)n_embd + (size_t)hp->n_head +
                     (size_t)hp->n_expert * (1 + 2 * (size_t)hp->n_ff_exp + (size_t)n_embd);
    m->vec_copies = cv_malloc(sizeof(float) * ((size_t)(l1 - l0) * per_layer + (size_t)n_embd + 2 * (size_t)hp->n_rot));
    if (!m->layers || !m->vec_copies) {
        cv_errf(err, errlen, "%s: out of memory", m->gguf.name);
        goto fail;
    }
    float *copy = m->vec_copies;
    if (l0 == 0 && m->held_l0 == 0 &&
        bind_matrix(m, "token_embd.weight", n_embd, hp->n_vocab, &m->tok_embd, err, errlen))
        goto fail;
    if (bind_rope_factors(m, &copy, err, errlen))
        goto fail;
    for (int32_t l = l0; l < l1; l++)
        if (bind_layer(m, l, &copy, err, errlen))
            goto fail;
    if (l1 == hp->n_layer) {
        if (bind_vec(m, "output_norm.weight", n_embd, &copy, &m->output_norm, err, errlen))
            goto fail;
        const char *out_name = cv_gguf_find_tensor(&m->gguf, "output.weight") ? "output.weight" : "token_embd.weight";
        if (bind_matrix(m, out_name, n_embd, hp->n_vocab, &m->output, err, errlen))
            goto fail;
    }
    if (make_resident(m, err, errlen))
        goto fail;
    return 0;
fail:
    cv_llama_free(m);
    return -1;
}

void cv_llama_free(cv_llama *m)
{
    cv_free(m->layers);
    cv_free(m->vec_copies);
    cv_huge_free(m->resident, m->resident_bytes);
    cv_gguf_close(&m->gguf);
    memset(m, 0, sizeof *m);
}

static uint64_t tensor_bytes(const cv_llama *m, const char *name)
{
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    return t ? t->size : 0;
}

/* Every tensor a layer may have, by architecture: llama's nine, qwen2's
 * biases, qwen3's and gemma3's Q/K norms, gemma2's and gemma3's post
 * norms, a mixture of experts' router and experts, qwen2moe's shared
 * expert, phi3's fused Q/K/V, gpt-oss's output bias, sinks, router and
 * experts' biases. */
static const char *const layer_parts[] = {
    "attn_norm.weight", "attn_q.weight",  "attn_k.weight",   "attn_v.weight",   "attn_output.weight",
    "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight",  "ffn_down.weight", "attn_q.bias",
    "attn_k.bias",      "attn_v.bias",    "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "post_ffw_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
    "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
    "ffn_up_shexp.weight", "ffn_down_shexp.weight", "attn_qkv.weight", "attn_output.bias", "attn_sinks.weight",
    "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"};
static_assert(sizeof layer_parts / sizeof layer_parts[0] == CV_LLAMA_LAYER_TENSORS_MAX, "layer parts");

uint64_t cv_llama_layer_bytes(const cv_llama *m, int32_t l)
{
    uint64_t total = 0;
    char name[96];
    for (size_t i = 0; i < CV_LLAMA_LAYER_TENSORS_MAX; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, layer_parts[i]);
        total += tensor_bytes(m, name);
    }
    return total;
}

/* Appends the index of tensor `name` to idx when the file has it. */
static size_t add_tensor(const cv_llama *m, const char *name, uint64_t *idx, size_t n)
{
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    if (t)
        idx[n++] = (uint64_t)(t - m->gguf.tensors);
    return n;
}

size_t cv_llama_span_tensors(const cv_llama *m, int32_t l0, int32_t l1, uint64_t *idx)
{
    size_t n = 0;
    for (size_t i = 0; i < sizeof rope_factor_names / sizeof rope_factor_names[0]; i++)
        n = add_tensor(m, rope_factor_names[i], idx, n);
    char name[96];
    for (int32_t l = l0; l < l1; l++)
        for (size_t i = 0; i < CV_LLAMA_LAYER_TENSORS_MAX; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, layer_parts[i]);
            n = add_tensor(m, name, idx, n);
        }
    if (l1 == m->hp.n_layer) {
        n = add_tensor(m, "output_norm.weight", idx, n);
        n = add_tensor(m, cv_gguf_find_tensor(&m->gguf, "output.weight") ? "output.weight" : "token_embd.weight", idx,
                       n);
    }
    return n;
}

uint64_t cv_llama_output_bytes(const cv_llama *m)
{
    const char *out_name = cv_gguf_find_tensor(&m->gguf, "output.weight") ? "output.weight" : "token_embd.weight";
    uint64_t total = tensor_bytes(m, "output_norm.weight") + tensor_bytes(m, out_name);
    for (size_t i = 0; i < sizeof rope_factor_names / sizeof rope_factor_names[0]; i++)
        total += tensor_bytes(m, rope_factor_names[i]);
    return total;
}

uint64_t cv_llama_weight_bytes(const cv_llama *m, int32_t l0, int32_t l1, cv_embd_use embd)
{
    uint64_t total = 0;
    for (int32_t l = l0; l < l1; l++)
        total += cv_llama_layer_bytes(m, l);
    if (l0 == 0 && embd != CV_EMBD_NONE) {
        const uint64_t all = tensor_bytes(m, "token_embd.weight");
        total += embd == CV_EMBD_ROW ? all / (uint64_t)m->hp.n_vocab : all;
    }
    if (l1 == m->hp.n_layer)
        total += cv_llama_output_bytes(m);
    return total;
}

/* ---- a mixture of experts' routed experts, from the tensor directory ---- */

static const char *const expert_parts[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
enum { EXPERT_PARTS = sizeof expert_parts / sizeof expert_parts[0] };

static uint64_t aligned64(uint64_t n) { return (n + 63) / 64 * 64; }

/* One expert's bytes of layer l's stacked tensor part (0 when absent). */
static uint64_t expert_part_bytes(const cv_llama *m, int32_t l, int part)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, expert_parts[part]);
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    return t && m->hp.n_expert ? t->size / (uint64_t)m->hp.n_expert : 0;
}

uint64_t cv_llama_layer_expert_bytes(const cv_llama *m, int32_t l)
{
    uint64_t total = 0;
    for (int part = 0; part < EXPERT_PARTS; part++)
        total += expert_part_bytes(m, l, part) * (uint64_t)m->hp.n_expert;
    return total;
}

uint64_t cv_llama_expert_slot_bytes(const cv_llama *m)
{
    uint64_t most = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        uint64_t slot = 0;
        for (int part = 0; part < EXPERT_PARTS; part++)
            slot += aligned64(expert_part_bytes(m, l, part));
        most = slot > most ? slot : most;
    }
    return most;
}

uint64_t cv_llama_expert_matrix_bytes(const cv_llama *m)
{
    uint64_t most = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++)
        for (int part = 0; part < EXPERT_PARTS; part++) {
            const uint64_t b = expert_part_bytes(m, l, part);
            most = b > most ? b : most;
        }
    return most;
}
