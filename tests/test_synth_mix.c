/* test_synth_mix.c: `convoy synth --type Q4_K_M / Q5_K_M`, llama.cpp's mixes.
 *
 * A synthesized mix has, tensor by tensor, the type quantize's rule gives
 * (cv_quant_policy_type, then cv_quant_fit_type; norms F32), and llama.cpp's
 * general.file_type (15 MOSTLY_Q4_K_M, 17 MOSTLY_Q5_K_M). Spot checks of
 * the rule itself: output.weight Q6_K, attn_v and ffn_down Q6_K exactly in
 * use_more_bits's layers (synth-mini, 4 layers: 2 and 3; 16 layers: 0, 1,
 * 4, 7, 10, 13, 14, 15), the other matrices the base type. The Q4_K_M
 * synth-mini model loads and generates, and its logits stay near those of
 * the F32 synth-mini model (the same f32 values, quantized), nearer than
 * plain Q4_K's. The fallbacks of rows that do not fit a type's blocks are
 * llama.cpp's. */
#include <math.h>

#include "convoy.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "test.h"

static char dir[256];

/* Writes shape (a preset, or NULL for 256,16,8,2,256,512) of `type` to
 * dir/name (path in path); 0 or -1. */
static int synth(const char *name, const char *shape, const char *type, char *path, size_t n)
{
    char err[CV_ERRLEN];
    cv_synth_params p;
    cv_synth_defaults(&p);
    snprintf(path, n, "%s/%s", dir, name);
    if (cv_quant_parse_type(type, &p.type, &p.mix)) {
        fprintf(stderr, "unknown type %s\n", type);
        return -1;
    }
    if (shape && cv_synth_preset(&p, shape, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    if (!shape) {
        p.n_embd = 256, p.n_layer = 16, p.n_head = 8, p.n_head_kv = 2, p.n_ff = 256, p.n_vocab = 512;
        p.n_ctx = 512;
    }
    if (cv_synth_write(&p, path, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "synth %s: %s\n", name, err);
        return -1;
    }
    return 0;
}

/* The type of tensor `name` in f, or -1. */
static int type_of(const gguf_file *f, const char *name)
{
    const gguf_tensor *t = cv_gguf_find_tensor(f, name);
    return t ? (int)t->type : -1;
}

/* Every tensor of the model at path has the rule's type for `type`; the
 * file_type is want_ftype; attn_v / ffn_down are Q6_K exactly in the
 * layers of q6_layers (a bit set), the base type elsewhere. */
static void check_mix(const char *path, const char *type, uint32_t want_ftype, uint32_t q6_layers)
{
    char err[CV_ERRLEN], name[64];
    cv_quantize_params qp = {.output_type = CV_TYPE_COUNT};
    gguf_file f;
    CHECK(cv_quant_parse_type(type, &qp.type, &qp.mix) == 0 && qp.mix != CV_MIX_NONE);
    if (cv_gguf_open(&f, path, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return;
    }
    uint32_t ftype = 0, n_layer = 0;
    CHECK(cv_gguf_get_u32(&f, "general.file_type", &ftype, err, sizeof err) == 0 && ftype == want_ftype);
    CHECK(cv_gguf_get_u32(&f, "llama.block_count", &n_layer, err, sizeof err) == 0);
    CHECK(cv_quant_policy_file_type(&qp) == (int)want_ftype);
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const cv_type rule = cv_quant_is_weight_matrix(name, t->n_dims)
                                 ? cv_quant_fit_type(cv_quant_policy_type(&qp, name, cv_quant_layer_of(name),
                                                                          (int)n_layer),
                                                     t->ne[0])
                                 : CV_TYPE_F32;
        CHECKF(t->type == rule, "%s: %s is %s, the rule says %s", path, name, cv_type_name(t->type),
               cv_type_name(rule));
    }
    CHECK(type_of(&f, "output.weight") == CV_TYPE_Q6_K);
    CHECK(type_of(&f, "token_embd.weight") == (int)qp.type);
    for (uint32_t l = 0; l < n_layer; l++) {
        const int want = (q6_layers >> l) & 1 ? CV_TYPE_Q6_K : (int)qp.type;
        static const char *const mats[] = {"attn_v", "ffn_down", "attn_q", "attn_k", "attn_output", "ffn_gate",
                                           "ffn_up"};
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, mats[k]);
            CHECKF(type_of(&f, name) == (k < 2 ? want : (int)qp.type), "%s: %s is %s", path, name,
                   cv_type_name((cv_type)type_of(&f, name)));
        }
    }
    cv_gguf_close(&f);
}

static void test_q4_k_m_mini_types(void)
{
    char path[512];
    if (synth("mini-q4_k_m.gguf", "synth-mini", "Q4_K_M", path, sizeof path) == 0)
        check_mix(path, "Q4_K_M", 15, 1u << 2 | 1u << 3);
}

static void test_q5_k_m_16_layers_types(void)
{
    char path[512];
    const uint32_t q6 = 1u << 0 | 1u << 1 | 1u << 4 | 1u << 7 | 1u << 10 | 1u << 13 | 1u << 14 | 1u << 15;
    if (synth("l16-q5_k_m.gguf", NULL, "Q5_K_M", path, sizeof path) == 0)
        check_mix(path, "Q5_K_M", 17, q6);
    if (synth("l16-q4_k_m.gguf", NULL, "Q4_K_M", path, sizeof path) == 0)
        check_mix(path, "Q4_K_M", 15, q6);
}

/* phi3's fused attn_qkv one step up, as llama_tensor_get_type does. */
static void test_fused_qkv_types(void)
{
    static const struct {
        const char *mix;
        cv_type want;
    } cases[] = {{"Q2_K", CV_TYPE_Q2_K},   {"Q3_K_S", CV_TYPE_Q3_K}, {"Q3_K_M", CV_TYPE_Q4_K},
                 {"Q3_K_L", CV_TYPE_Q4_K}, {"Q4_K_M", CV_TYPE_Q5_K}, {"Q5_K_M", CV_TYPE_Q6_K}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cv_quantize_params qp = {.output_type = CV_TYPE_COUNT};
        CHECK(cv_quant_parse_type(cases[i].mix, &qp.type, &qp.mix) == 0);
        const cv_type got = cv_quant_policy_type(&qp, "blk.3.attn_qkv.weight", 3, 32);
        CHECKF(got == cases[i].want, "%s: attn_qkv is %s, llama.cpp's %s", cases[i].mix, cv_type_name(got),
               cv_type_name(cases[i].want));
    }
}

static int go_on(void *user, int32_t id)
{
    (void)user;
    (void)id;
    return 0;
}

/* The logits of the last prompt position of model path into out
 * [n_vocab]; the number of tokens generated greedily after it in *n_gen. */
static int logits_and_generate(const char *path, float *out, int32_t *n_gen)
{
    char err[CV_ERRLEN];
    convoy_model *m = convoy_model_load(path, err, sizeof err);
    CHECKF(m, "%s", err);
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_threads = 1;
    cp.n_ctx = 64;
    convoy_ctx *c = m ? convoy_ctx_create(m, &cp, err, sizeof err) : NULL;
    CHECKF(!m || c, "%s", err);
    int32_t hist[64], pos[64], seq[64] = {0};
    uint8_t want[64] = {0};
    const int32_t n = c ? convoy_tokenize(m, "Once upon a time", 16, true, false, hist, 32) : 0;
    for (int32_t i = 0; i < n; i++)
        pos[i] = i;
    want[n > 0 ? n - 1 : 0] = CONVOY_WANT_SAMPLE;
    const convoy_batch b = {.n_tokens = n, .token = hist, .pos = pos, .seq = seq, .want = want};
    int rc = n > 0 && convoy_decode(c, &b, out, err, sizeof err) == 0 ? 0 : -1;
    CHECKF(rc == 0, "%s: decode: %s", path, err);
    convoy_gen_stats st = {0};
    if (rc == 0 && convoy_seq_free(c, 0, err, sizeof err) == 0)
        rc = convoy_generate(c, NULL, 0, hist, n, 4, go_on, NULL, &st, err, sizeof err);
    CHECKF(rc == 0, "%s: generate: %s", path, err);
    *n_gen = st.n_gen;
    convoy_ctx_free(c);
    convoy_model_free(m);
    return rc;
}

/* Relative RMS of b against a, over n; *finite: every b[i] is finite. */
static double rel_rms(const float *a, const float *b, int n, bool *finite)
{
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) {
        *finite = *finite && isfinite(b[i]);
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)a[i] * a[i];
    }
    return sqrt(d / s);
}

static void test_q4_k_m_runs(void)
{
    char f32[512], mix[512], q4k[512];
    if (synth("mini-f32.gguf", "synth-mini", "F32", f32, sizeof f32) ||
        synth("mini-q4_k_m-run.gguf", "synth-mini", "Q4_K_M", mix, sizeof mix) ||
        synth("mini-q4_k.gguf", "synth-mini", "Q4_K", q4k, sizeof q4k))
        return;
    enum { N_VOCAB = 2048 };
    static float a[N_VOCAB], b[N_VOCAB], c[N_VOCAB];
    int32_t n_a = 0, n_b = 0, n_c = 0;
    if (logits_and_generate(f32, a, &n_a) || logits_and_generate(mix, b, &n_b) || logits_and_generate(q4k, c, &n_c))
        return;
    CHECKF(n_b >= 1 && n_b <= 4, "generated %d tokens", n_b);
    bool finite = true;
    const double r_mix = rel_rms(a, b, N_VOCAB, &finite), r_q4k = rel_rms(a, c, N_VOCAB, &finite);
    fprintf(stderr, "  logits vs F32's: relative RMS Q4_K_M %.4f, Q4_K %.4f\n", r_mix, r_q4k);
    CHECK(finite);
    CHECKF(r_mix < 0.3, "Q4_K_M logits too far from F32's: relative RMS %g", r_mix);
    CHECKF(r_mix < r_q4k, "Q4_K_M (%g) not nearer F32 than Q4_K (%g)", r_mix, r_q4k);
}

/* llama.cpp's fallbacks: a K-quant to a type of block 32 (Q4_K -> Q5_0,
 * Q5_K -> Q5_1, Q6_K -> Q8_0), else, as for the types of block 32, F16. */
static void test_fit_type_fallbacks(void)
{
    CHECK(cv_quant_fit_type(CV_TYPE_Q4_K, 2048) == CV_TYPE_Q4_K);
    CHECK(cv_quant_fit_type(CV_TYPE_Q4_K, 96) == CV_TYPE_Q5_0);
    CHECK(cv_quant_fit_type(CV_TYPE_Q5_K, 96) == CV_TYPE_Q5_1);
    CHECK(cv_quant_fit_type(CV_TYPE_Q6_K, 96) == CV_TYPE_Q8_0);
    CHECK(cv_quant_fit_type(CV_TYPE_Q4_K, 172) == CV_TYPE_F16);
    CHECK(cv_quant_fit_type(CV_TYPE_Q5_0, 96) == CV_TYPE_Q5_0);
    CHECK(cv_quant_fit_type(CV_TYPE_IQ4_NL, 100) == CV_TYPE_F16);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/convoy-test-synth-mix-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    TEST_RUN(test_fit_type_fallbacks);
    TEST_RUN(test_q4_k_m_mini_types);
    TEST_RUN(test_q5_k_m_16_layers_types);
    TEST_RUN(test_fused_qkv_types);
    TEST_RUN(test_q4_k_m_runs);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
