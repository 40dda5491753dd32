/* test_reference.c: convoy's logits against llama.cpp's, per reference model.
 *
 * For each model of ../shared/reference/logits/, runs `convoy eval` (F32 KV
 * cache, all tokens in one batch) on the stored tokens and applies "The
 * check" of ../shared/reference/README.md:
 * - F32 / F16 / BF16 (and stories260K): every |delta| <= tol, and equal
 *   argmax wherever the reference margin exceeds 2 * tol;
 * - quantized types: RMS |delta| <= 0.1, every |delta| <= max(tol, 0.5), equal
 *   argmax wherever the reference margin exceeds 0.6. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

static float *read_f32(const char *path, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    float *x = malloc(n * sizeof(float));
    size_t got = x ? fread(x, sizeof(float), n, f) : 0;
    char extra;
    size_t more = fread(&extra, 1, 1, f);
    fclose(f);
    if (got != n || more) {
        free(x);
        return NULL;
    }
    return x;
}

static void check_model(const char *name, int quantized)
{
    char json_path[512], ref_path[512], model_path[512], tokens_path[512], out_path[512], cmd[2048];
    char rel[256];
    snprintf(rel, sizeof rel, "reference/logits/%s.json", name);
    if (!test_shared_path(json_path, sizeof json_path, rel))
        return;
    snprintf(rel, sizeof rel, "reference/logits/%s.f32", name);
    test_shared_path(ref_path, sizeof ref_path, rel);
    if (!strcmp(name, "stories260K"))
        test_shared_path(model_path, sizeof model_path, "models/stories260K.gguf");
    else {
        snprintf(rel, sizeof rel, "reference/models/%s.gguf", name);
        test_shared_path(model_path, sizeof model_path, rel);
    }
    json_error_t jerr;
    json_t *ref = json_load_file(json_path, 0, &jerr);
    CHECKF(ref != NULL, "%s: %s", json_path, jerr.text);
    if (!ref)
        return;
    const size_t n_tokens = (size_t)json_integer_value(json_object_get(ref, "n_tokens"));
    const size_t n_vocab = (size_t)json_integer_value(json_object_get(ref, "n_vocab"));
    const double tol = json_real_value(json_object_get(json_object_get(ref, "tolerance"), "abs"));
    json_t *margins = json_object_get(ref, "margin"), *argmax = json_object_get(ref, "argmax");

    snprintf(tokens_path, sizeof tokens_path, "%s/ref-tokens-%s.json", CONVOY_BINARY_DIR, name);
    json_t *tok = json_object();
    json_object_set(tok, "tokens", json_object_get(ref, "tokens"));
    json_dump_file(tok, tokens_path, 0);
    json_decref(tok);
    snprintf(out_path, sizeof out_path, "%s/ref-logits-%s.f32", CONVOY_BINARY_DIR, name);
    snprintf(cmd, sizeof cmd, "'%s/convoy' eval -m '%s' --tokens '%s' --logits '%s'", CONVOY_BINARY_DIR, model_path,
             tokens_path, out_path);
    int rc = system(cmd);
    CHECKF(rc == 0, "%s: convoy eval failed (%d)", name, rc);
    float *got = rc == 0 ? read_f32(out_path, n_tokens * n_vocab) : NULL;
    float *want = read_f32(ref_path, n_tokens * n_vocab);
    CHECKF(got && want, "%s: cannot read logits", name);
    if (got && want) {
        double max_d = 0, sum_sq = 0;
        size_t n_bad_arg = 0, n_checked_arg = 0;
        const double elem_tol = quantized ? fmax(tol, 0.5) : tol;
        const double margin_min = quantized ? 0.6 : 2 * tol;
        for (size_t t = 0; t < n_tokens; t++) {
            const float *g = got + t * n_vocab, *w = want + t * n_vocab;
            size_t best = 0;
            for (size_t i = 0; i < n_vocab; i++) {
                double d = fabs((double)g[i] - (double)w[i]);
                if (!(d <= max_d))
                    max_d = d;
                sum_sq += d * d;
                if (g[i] > g[best])
                    best = i;
            }
            if (json_real_value(json_array_get(margins, t)) > margin_min) {
                n_checked_arg++;
                if ((json_int_t)best != json_integer_value(json_array_get(argmax, t)))
                    n_bad_arg++;
            }
        }
        double rms = sqrt(sum_sq / (double)(n_tokens * n_vocab));
        fprintf(stderr, "  %-22s max|d| %.6f (limit %.6f)  rms %.6f  argmax %zu/%zu equal\n", name, max_d, elem_tol,
                rms, n_checked_arg - n_bad_arg, n_checked_arg);
        CHECKF(max_d <= elem_tol, "%s: max |delta| %g exceeds %g", name, max_d, elem_tol);
        if (quantized)
            CHECKF(rms <= 0.1, "%s: RMS %g exceeds 0.1", name, rms);
        CHECKF(n_bad_arg == 0, "%s: argmax differs at %zu of %zu positions", name, n_bad_arg, n_checked_arg);
    }
    free(got);
    free(want);
    json_decref(ref);
}

static void test_logits_f32(void)
{
    check_model("stories260K", 0);
    check_model("synth-mini-f32", 0);
    check_model("synth-hd128-f32", 0);
}
static void test_logits_f16_bf16(void)
{
    check_model("synth-mini-f16", 0);
    check_model("synth-mini-bf16", 0);
}
static void test_logits_q8_0_q4_0(void)
{
    check_model("synth-mini-q8_0", 1);
    check_model("synth-mini-q4_0", 1);
    check_model("synth-hd128-q4_0", 1);
}

/* K-quant mixes, with Q8_K activations as llama.cpp's CPU backend. */
static void test_logits_kquants(void)
{
    check_model("synth-mini-q6_k", 1);
    check_model("synth-mini-q5_k_m", 1);
    check_model("synth-mini-q4_k_m", 1);
    check_model("synth-hd128-q4_k_m", 1);
}

/* Architecture variants (ARCH.md): Llama 3.1 RoPE scaling with tied
 * embeddings, qwen2 biases + NeoX RoPE, qwen3 Q/K norms. */
static void test_logits_arch(void)
{
    check_model("synth-llama3-f32", 0);
    check_model("synth-qwen2-f32", 0);
    check_model("synth-qwen3-f32", 0);
    check_model("synth-llama3-q4_k_m", 1);
    check_model("synth-qwen2-q4_k_m", 1);
    check_model("synth-qwen3-q4_k_m", 1);
}

static double rms_delta(const float *a, const float *b, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(sum / (double)n);
}

/* `convoy quantize` makes Q4_K_M, Q5_K_M and Q6_K files from synth-mini-f32
 * at least as good as llama.cpp's: the RMS of their logits against the F32
 * reference is at most 1.05x that of llama.cpp's file of the same type. */
static void test_quantize_as_good_as_llamacpp(void)
{
    char f32_model[512], f32_logits[512], f32_json[512];
    if (!test_shared_path(f32_model, sizeof f32_model, "reference/models/synth-mini-f32.gguf") ||
        !test_shared_path(f32_logits, sizeof f32_logits, "reference/logits/synth-mini-f32.f32") ||
        !test_shared_path(f32_json, sizeof f32_json, "reference/logits/synth-mini-f32.json"))
        return;
    json_error_t jerr;
    json_t *ref = json_load_file(f32_json, 0, &jerr);
    const size_t n = (size_t)json_integer_value(json_object_get(ref, "n_tokens")) *
                     (size_t)json_integer_value(json_object_get(ref, "n_vocab"));
    char tokens_path[512];
    snprintf(tokens_path, sizeof tokens_path, "%s/quant-tokens.json", CONVOY_BINARY_DIR);
    json_t *tok = json_object();
    json_object_set(tok, "tokens", json_object_get(ref, "tokens"));
    json_dump_file(tok, tokens_path, 0);
    json_decref(tok);
    float *base = read_f32(f32_logits, n);
    static const char *const types[][2] = {{"Q4_K_M", "q4_k_m"}, {"Q5_K_M", "q5_k_m"}, {"Q6_K", "q6_k"}};
    for (size_t k = 0; base && k < 3; k++) {
        char model[512], out[512], cmd[4096], rel[256], theirs_path[512];
        snprintf(model, sizeof model, "%s/quant-%s.gguf", CONVOY_BINARY_DIR, types[k][0]);
        snprintf(out, sizeof out, "%s/quant-%s.f32", CONVOY_BINARY_DIR, types[k][0]);
        snprintf(cmd, sizeof cmd, "'%s/convoy' quantize '%s' '%s' %s >/dev/null && '%s/convoy' eval -m '%s' --tokens '%s' "
                                  "--logits '%s'",
                 CONVOY_BINARY_DIR, f32_model, model, types[k][0], CONVOY_BINARY_DIR, model, tokens_path, out);
        CHECKF(system(cmd) == 0, "%s: quantize or eval failed", types[k][0]);
        snprintf(rel, sizeof rel, "reference/logits/synth-mini-%s.f32", types[k][1]);
        test_shared_path(theirs_path, sizeof theirs_path, rel);
        float *ours = read_f32(out, n), *theirs = read_f32(theirs_path, n);
        CHECKF(ours && theirs, "%s: cannot read logits", types[k][0]);
        if (ours && theirs) {
            const double r_ours = rms_delta(ours, base, n), r_theirs = rms_delta(theirs, base, n);
            fprintf(stderr, "  %-7s RMS vs F32: convoy's file %.4f, llama.cpp's %.4f (ratio %.3f)\n", types[k][0],
                    r_ours, r_theirs, r_ours / r_theirs);
            CHECKF(r_ours <= 1.05 * r_theirs, "%s: RMS %g exceeds 1.05 x llama.cpp's %g", types[k][0], r_ours,
                   r_theirs);
        }
        free(ours);
        free(theirs);
    }
    free(base);
    json_decref(ref);
}

int main(void)
{
    TEST_RUN(test_logits_f32);
    TEST_RUN(test_logits_f16_bf16);
    TEST_RUN(test_logits_q8_0_q4_0);
    TEST_RUN(test_logits_kquants);
    TEST_RUN(test_logits_arch);
    TEST_RUN(test_quantize_as_good_as_llamacpp);
    return test_summary();
}
