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

int main(void)
{
    TEST_RUN(test_logits_f32);
    TEST_RUN(test_logits_f16_bf16);
    TEST_RUN(test_logits_q8_0_q4_0);
    TEST_RUN(test_logits_kquants);
    TEST_RUN(test_logits_arch);
    return test_summary();
}
