/* test_reference.c: convoy's logits against llama.cpp's, per reference model.
 *
 * For each model of ../shared/reference/logits/, runs `convoy eval` (F32 KV
 * cache, all tokens in one batch) on the stored tokens and applies "The
 * check" of ../shared/reference/README.md:
 * - F32 / F16 / BF16 (and stories260K): every |delta| <= tol, and equal
 *   argmax wherever the reference margin exceeds 2 * tol;
 * - quantized types: RMS |delta| <= 0.1, every |delta| <= max(tol, 0.5), equal
 *   argmax wherever the reference margin exceeds 0.6.
 * Types without a stored reference (Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q3_K,
 * and the Q2_K and Q3_K_M mixes) are checked against
 * llama.cpp run here (../shared/tools/llama.cpp/bin/llama-ref) on a model
 * `convoy quantize` makes, with the same rule, and on a greedy
 * continuation; without llama-ref that test skips (fails under CI=true).
 * So do the synthetic Gemma 3's, Gemma 2's, Phi-3's, mixtures of
 * experts' and gpt-oss's (test_logits_gemma3, _gemma2, _phi3, _moe,
 * _gptoss), and their files' tokenizations (test_tokens_arch). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convoy.h"
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

/* The check on logits got against the reference want ([n_tokens][n_vocab]),
 * whose top-1 id and top-1 - top-2 margin per position are argmax and
 * margin. */
static void check_logits(const char *name, const float *got, const float *want, size_t n_tokens, size_t n_vocab,
                         double tol, const double *margin, const int *argmax, int quantized)
{
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
        if (margin[t] > margin_min) {
            n_checked_arg++;
            if ((int)best != argmax[t])
                n_bad_arg++;
        }
    }
    double rms = sqrt(sum_sq / (double)(n_tokens * n_vocab));
    fprintf(stderr, "  %-22s max|d| %.6f (limit %.6f)  rms %.6f  argmax %zu/%zu equal\n", name, max_d, elem_tol, rms,
            n_checked_arg - n_bad_arg, n_checked_arg);
    CHECKF(max_d <= elem_tol, "%s: max |delta| %g exceeds %g", name, max_d, elem_tol);
    if (quantized)
        CHECKF(rms <= 0.1, "%s: RMS %g exceeds 0.1", name, rms);
    CHECKF(n_bad_arg == 0, "%s: argmax differs at %zu of %zu positions", name, n_bad_arg, n_checked_arg);
}

/* Writes {"tokens": ids} to path, for convoy eval. */
static void write_tokens(const char *path, json_t *ids)
{
    json_t *tok = json_object();
    json_object_set(tok, "tokens", ids);
    json_dump_file(tok, path, 0);
    json_decref(tok);
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
    write_tokens(tokens_path, json_object_get(ref, "tokens"));
    snprintf(out_path, sizeof out_path, "%s/ref-logits-%s.f32", CONVOY_BINARY_DIR, name);
    snprintf(cmd, sizeof cmd, "'%s/convoy' eval -m '%s' --tokens '%s' --logits '%s' --kv-type f32",
             CONVOY_BINARY_DIR, model_path,
             tokens_path, out_path);
    int rc = system(cmd);
    CHECKF(rc == 0, "%s: convoy eval failed (%d)", name, rc);
    float *got = rc == 0 ? read_f32(out_path, n_tokens * n_vocab) : NULL;
    float *want = read_f32(ref_path, n_tokens * n_vocab);
    CHECKF(got && want, "%s: cannot read logits", name);
    double *margin = calloc(n_tokens, sizeof(double));
    int *best = calloc(n_tokens, sizeof(int));
    for (size_t t = 0; t < n_tokens; t++) {
        margin[t] = json_real_value(json_array_get(margins, t));
        best[t] = (int)json_integer_value(json_array_get(argmax, t));
    }
    if (got && want)
        check_logits(name, got, want, n_tokens, n_vocab, tol, margin, best, quantized);
    free(margin);
    free(best);
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

/* Top-1 id and top-1 - top-2 margin of each of n rows of n_vocab logits. */
static void top2(const float *x, size_t n, size_t n_vocab, int *argmax, double *margin)
{
    for (size_t t = 0; t < n; t++) {
        const float *r = x + t * n_vocab;
        size_t a = 0, b = 1;
        if (r[1] > r[0])
            a = 1, b = 0;
        for (size_t i = 2; i < n_vocab; i++)
            if (r[i] > r[a])
                b = a, a = i;
            else if (r[i] > r[b])
                b = i;
        argmax[t] = (int)a;
        margin[t] = (double)r[a] - r[b];
    }
}

enum { GREEDY_N = 64 };

/* llama.cpp's greedy continuation (llama-ref greedy, F32 KV cache) of a
 * prompt on model, against convoy's logits of the prompt and that
 * continuation fed as one batch: at each step, convoy's top id must be
 * llama.cpp's wherever llama.cpp's margin exceeds 0.6 (the quantized
 * types' rule), so that convoy's own continuation follows llama.cpp's at
 * least up to its first close call. eval_args go to convoy eval, ref_args
 * to llama-ref (a context size, for Phi-3's RoPE factors). */
static void check_greedy(const char *llama_ref, const char *model, const char *type, const char *eval_args,
                         const char *ref_args)
{
    char out[512], tokens[512], logits[512], cmd[4096];
    snprintf(out, sizeof out, "%s/gen-%s-greedy.json", CONVOY_BINARY_DIR, type);
    snprintf(tokens, sizeof tokens, "%s/gen-%s-greedy-ids.json", CONVOY_BINARY_DIR, type);
    snprintf(logits, sizeof logits, "%s/gen-%s-greedy.f32", CONVOY_BINARY_DIR, type);
    /* the text of the tokens is dropped: random tokens need not make UTF-8, which jansson refuses */
    snprintf(cmd, sizeof cmd,
             "'%s' greedy '%s' 'Once upon a time' %d --json --threads 1 --kv f32 %s 2>/dev/null | "
             "LC_ALL=C sed 's/\"text\":\".*\",\"min_margin\"/\"min_margin\"/' >'%s'",
             llama_ref, model, GREEDY_N, ref_args, out);
    CHECKF(system(cmd) == 0, "%s: llama-ref greedy failed", type);
    json_t *ref = json_load_file(out, 0, NULL);
    json_t *prompt = json_object_get(ref, "prompt_ids"), *gen = json_object_get(ref, "generated_ids");
    json_t *margins = json_object_get(ref, "margins");
    const size_t n_prompt = json_array_size(prompt), n_vocab = 2048;
    CHECKF(n_prompt > 0 && json_array_size(gen) == GREEDY_N, "%s: no greedy continuation in %s", type, out);
    json_t *ids = json_array();
    json_array_extend(ids, prompt);
    for (int i = 0; i + 1 < GREEDY_N; i++)
        json_array_append(ids, json_array_get(gen, i));
    write_tokens(tokens, ids);
    snprintf(cmd, sizeof cmd, "'%s/convoy' eval -m '%s' --tokens '%s' --logits '%s' --kv-type f32 %s",
             CONVOY_BINARY_DIR, model,
             tokens, logits, eval_args);
    CHECKF(n_prompt == 0 || system(cmd) == 0, "%s: convoy eval of the continuation failed", type);
    const size_t n_rows = n_prompt + GREEDY_N - 1;
    float *got = n_prompt ? read_f32(logits, n_rows * n_vocab) : NULL;
    int follows = 0, n_checked = 0, n_bad = 0;
    for (int i = 0; got && i < GREEDY_N; i++) {
        int best;
        double unused;
        top2(got + (n_prompt - 1 + (size_t)i) * n_vocab, 1, n_vocab, &best, &unused);
        const int same = best == json_integer_value(json_array_get(gen, i));
        follows += same && follows == i;
        if (json_real_value(json_array_get(margins, i)) > 0.6) {
            n_checked++;
            n_bad += !same;
        }
    }
    fprintf(stderr, "  %-22s greedy: convoy follows llama.cpp for %d of %d tokens; top id equal at %d/%d steps\n",
            type, follows, GREEDY_N, n_checked - n_bad, n_checked);
    CHECKF(got && n_bad == 0, "%s: greedy top id differs at %d of %d steps", type, n_bad, n_checked);
    free(got);
    json_decref(ids);
    json_decref(ref);
}

/* A type the shared references do not cover: `convoy quantize` makes it
 * from synth-mini-f32, llama-ref (../shared/tools) computes llama.cpp's
 * logits of synth-tokens.json (1 thread, one batch, F32 KV cache, as the
 * shared references were made) and greedy continuation, and convoy must
 * pass the quantized types' check and check_greedy. Nothing is stored:
 * the references are made where the test runs. */
static void check_generated(const char *llama_ref, const char *f32_model, json_t *tokens, const char *type)
{
    char model[512], ref_ids[512], ids[512], want_path[512], got_path[512], name[64], cmd[8192];
    snprintf(name, sizeof name, "synth-mini-%s", type);
    snprintf(model, sizeof model, "%s/gen-%s.gguf", CONVOY_BINARY_DIR, type);
    snprintf(ref_ids, sizeof ref_ids, "%s/gen-ids-array.json", CONVOY_BINARY_DIR);
    snprintf(ids, sizeof ids, "%s/gen-ids.json", CONVOY_BINARY_DIR);
    snprintf(want_path, sizeof want_path, "%s/gen-%s-llama.f32", CONVOY_BINARY_DIR, type);
    snprintf(got_path, sizeof got_path, "%s/gen-%s-convoy.f32", CONVOY_BINARY_DIR, type);
    json_dump_file(tokens, ref_ids, 0);
    write_tokens(ids, tokens);
    snprintf(cmd, sizeof cmd,
             "'%s/convoy' quantize '%s' '%s' %s >/dev/null && '%s' logits '%s' '%s' '%s' --threads 1 --batch 64 --kv f32 "
             ">/dev/null 2>&1 && '%s/convoy' eval -m '%s' --tokens '%s' --logits '%s' --kv-type f32",
             CONVOY_BINARY_DIR, f32_model, model, type, llama_ref, model, ref_ids, want_path, CONVOY_BINARY_DIR, model,
             ids, got_path);
    CHECKF(system(cmd) == 0, "%s: quantize, llama-ref or eval failed", type);
    const size_t n_tokens = json_array_size(tokens), n_vocab = 2048;
    float *got = read_f32(got_path, n_tokens * n_vocab), *want = read_f32(want_path, n_tokens * n_vocab);
    CHECKF(got && want, "%s: cannot read logits", type);
    if (got && want) {
        int *argmax = malloc(n_tokens * sizeof(int));
        double *margin = malloc(n_tokens * sizeof(double)), max_abs = 0;
        top2(want, n_tokens, n_vocab, argmax, margin);
        for (size_t i = 0; i < n_tokens * n_vocab; i++)
            max_abs = fmax(max_abs, fabs((double)want[i]));
        /* the rule's tolerance: its spread term needs llama.cpp's reruns, 1% of max|logit| does not */
        check_logits(name, got, want, n_tokens, n_vocab, 0.01 * max_abs, margin, argmax, 1);
        free(argmax);
        free(margin);
        check_greedy(llama_ref, model, type, "", "");
    }
    free(got);
    free(want);
}

/* Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q3_K and the Q2_K and Q3_K_M mixes
 * (Q2_K, Q3_K, Q4_K and Q5_K matrices), against llama.cpp run here. */
static void test_logits_generated(void)
{
    char llama_ref[512], f32_model[512], tokens_path[512];
    if (!test_shared_path(llama_ref, sizeof llama_ref, "tools/llama.cpp/bin/llama-ref") ||
        !test_shared_path(f32_model, sizeof f32_model, "reference/models/synth-mini-f32.gguf") ||
        !test_shared_path(tokens_path, sizeof tokens_path, "reference/synth-tokens.json"))
        return;
    json_t *tok = json_load_file(tokens_path, 0, NULL);
    json_t *tokens = json_object_get(tok, "tokens");
    CHECKF(json_array_size(tokens) == 64, "%s: no tokens", tokens_path);
    static const char *const types[] = {"q5_0", "q5_1", "iq4_nl", "iq4_xs", "mxfp4", "q3_k", "q2_k", "q3_k_m"};
    for (size_t k = 0; k < sizeof types / sizeof types[0] && json_array_size(tokens); k++)
        check_generated(llama_ref, f32_model, tokens, types[k]);
    json_decref(tok);
}

/* A synthetic model of convoy synth's SHAPE at TYPE, synthesized here:
 * convoy's logits of synth-tokens.json (64 tokens) against llama.cpp's,
 * F32 within 1% of max|logit| with argmax equal, a quantized type by the
 * quantized rule; and check_greedy. The files of a run are named after
 * SHAPE-TYPE and variant; eval_args go to convoy eval, ref_args to
 * llama-ref. */
static void check_synth_run(const char *shape, const char *type, int quantized, const char *variant,
                            const char *eval_args, const char *ref_args)
{
    char llama_ref[512], tokens_path[512], model[512], ids[512], want_path[512], got_path[512], name[128], cmd[8192];
    if (!test_shared_path(llama_ref, sizeof llama_ref, "tools/llama.cpp/bin/llama-ref") ||
        !test_shared_path(tokens_path, sizeof tokens_path, "reference/synth-tokens.json"))
        return;
    snprintf(name, sizeof name, "%s-%s%s", shape, type, variant);
    snprintf(model, sizeof model, "%s/%s-%s.gguf", CONVOY_BINARY_DIR, shape, type);
    snprintf(ids, sizeof ids, "%s/%s-ids.json", CONVOY_BINARY_DIR, name);
    snprintf(want_path, sizeof want_path, "%s/%s-llama.f32", CONVOY_BINARY_DIR, name);
    snprintf(got_path, sizeof got_path, "%s/%s-convoy.f32", CONVOY_BINARY_DIR, name);
    json_t *tok = json_load_file(tokens_path, 0, NULL);
    json_t *tokens = json_object_get(tok, "tokens");
    json_dump_file(tokens, ids, 0);
    snprintf(cmd, sizeof cmd,
             "'%s/convoy' synth --shape %s --type %s -o '%s' >/dev/null && '%s' logits '%s' '%s' '%s' "
             "--threads 1 --batch 64 --kv f32 %s >/dev/null 2>&1 && '%s/convoy' eval -m '%s' --tokens '%s' "
             "--logits '%s' --kv-type f32 %s",
             CONVOY_BINARY_DIR, shape, type, model, llama_ref, model, ids, want_path, ref_args, CONVOY_BINARY_DIR,
             model, tokens_path, got_path, eval_args);
    CHECKF(system(cmd) == 0, "%s: synth, llama-ref or eval failed", name);
    const size_t n_tokens = json_array_size(tokens), n_vocab = 2048;
    float *got = read_f32(got_path, n_tokens * n_vocab), *want = read_f32(want_path, n_tokens * n_vocab);
    CHECKF(n_tokens == 64 && got && want, "%s: cannot read logits", name);
    if (n_tokens == 64 && got && want) {
        int argmax[64];
        double margin[64], max_abs = 0;
        top2(want, n_tokens, n_vocab, argmax, margin);
        for (size_t i = 0; i < n_tokens * n_vocab; i++)
            max_abs = fmax(max_abs, fabs((double)want[i]));
        check_logits(name, got, want, n_tokens, n_vocab, 0.01 * max_abs, margin, argmax, quantized);
        check_greedy(llama_ref, model, name, eval_args, ref_args);
    }
    free(got);
    free(want);
    json_decref(tok);
}

/* check_synth_run of SHAPE at TYPE in the model's own context. */
static void check_synth(const char *shape, const char *type, int quantized)
{
    check_synth_run(shape, type, quantized, "", "", "");
}

/* Gemma 3 (gemma3-mini: sliding window 16 on layers 0-4 and 6, every
 * position on layer 5, so the window slides over the 64 tokens). */
static void test_logits_gemma3(void) { check_synth("gemma3-mini", "F32", 0); }

/* Gemma 2 (gemma2-mini: window 16 on layers 0 and 2, every position on 1
 * and 3, attention scores and final logits soft-capped). */
static void test_logits_gemma2(void) { check_synth("gemma2-mini", "F32", 0); }

/* Mixtures of experts: qwen3moe (top-2 of 8 renormalised), qwen2moe (not
 * renormalised, plus the gated shared expert), Mixtral (a llama with
 * experts), and qwen3moe with Q4_0 experts. */
static void test_logits_moe(void)
{
    check_synth("qwen3moe-mini", "F32", 0);
    check_synth("qwen2moe-mini", "F32", 0);
    check_synth("mixtral-mini", "F32", 0);
    check_synth("qwen3moe-mini", "Q4_0", 1);
}

/* Phi-3 (phi3-mini: fused Q/K/V and gate/up, 24 of 32 dimensions rotated
 * NeoX-style, LongRoPE with original context 256, a sliding window of 32
 * that llama.cpp ignores): in a context of 1024 positions (llama-ref's
 * default, the model's) the long factors apply, in one of 256 the short
 * ones. */
static void test_logits_phi3(void)
{
    check_synth_run("phi3-mini", "F32", 0, "-long", "--ctx 1024", "");
    check_synth_run("phi3-mini", "F32", 0, "-short", "--ctx 256", "--ctx 256");
}

/* The texts of llama.cpp's SPM test vectors (ggml-vocab-llama-spm.gguf.inp)
 * that fit on one line, and a few more, one per line into path; 0 or -1. */
static int write_token_lines(const char *inp_path, const char *path)
{
    static const char *const ours[] = {"Hello World", " leading space", "double  space and trailing ",
                                       "tabs\tinside", "\xc3\xbcmlauts \xc3\xbcnd \xc3\x9f",
                                       "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "emoji \xf0\x9f\xa6\x99 llama",
                                       "<s> looks special </s>", "12345 67.89"};
    FILE *in = fopen(inp_path, "rb"), *out = fopen(path, "w");
    char *all = NULL;
    size_t n = 0;
    if (in && out) {
        all = malloc(1 << 20);
        n = all ? fread(all, 1, (1 << 20) - 1, in) : 0;
    }
    int rc = all && n > 0 ? 0 : -1;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    for (char *at = all; rc == 0 && at < all + n;) {
        all[n] = 0;
        char *end = strstr(at, sep);
        const size_t len = end ? (size_t)(end - at) : strlen(at);
        if (len > 0 && !memchr(at, '\n', len) && !memchr(at, '\r', len))
            fprintf(out, "%.*s\n", (int)len, at);
        at += len + (end ? sizeof sep - 1 : 0);
    }
    for (size_t i = 0; rc == 0 && i < sizeof ours / sizeof ours[0]; i++)
        fprintf(out, "%s\n", ours[i]);
    free(all);
    if (in)
        fclose(in);
    if (out && fclose(out))
        rc = -1;
    return rc;
}

/* Whether convoy's ids of text (add_special as given) are want's. */
static int same_ids(const convoy_model *m, const char *text, bool add_special, const json_t *want)
{
    int32_t ids[512];
    const int32_t n = convoy_tokenize(m, text, strlen(text), add_special, false, ids, 512);
    if (n < 0 || (size_t)n != json_array_size(want))
        return 0;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] != json_integer_value(json_array_get(want, (size_t)i)))
            return 0;
    return 1;
}

/* convoy's tokenizations of each line against llama.cpp's (llama-ref
 * tokenize) of the file of SHAPE, with and without BOS. */
static void check_tokens(const char *llama_ref, const char *shape, const char *lines)
{
    char model[512], out[512], cmd[4096], err[512];
    snprintf(model, sizeof model, "%s/tok-%s.gguf", CONVOY_BINARY_DIR, shape);
    snprintf(out, sizeof out, "%s/tok-%s.jsonl", CONVOY_BINARY_DIR, shape);
    snprintf(cmd, sizeof cmd, "'%s/convoy' synth --shape %s --type F32 -o '%s' >/dev/null && '%s' tokenize '%s' <'%s' >'%s' 2>/dev/null",
             CONVOY_BINARY_DIR, shape, model, llama_ref, model, lines, out);
    CHECKF(system(cmd) == 0, "%s: synth or llama-ref tokenize failed", shape);
    convoy_model *m = convoy_model_load(model, err, sizeof err);
    CHECKF(m, "%s", err);
    FILE *f = fopen(out, "r");
    char line[8192];
    int n_lines = 0, n_same = 0;
    while (m && f && fgets(line, sizeof line, f)) {
        json_t *ref = json_loads(line, 0, NULL);
        const char *text = json_string_value(json_object_get(ref, "text"));
        const int same = text && same_ids(m, text, true, json_object_get(ref, "ids_special")) &&
                         same_ids(m, text, false, json_object_get(ref, "ids_plain"));
        CHECKF(same, "%s: convoy's tokens of '%s' differ from llama.cpp's", shape, text ? text : line);
        n_same += same;
        n_lines++;
        json_decref(ref);
    }
    fprintf(stderr, "  %-14s tokens: %d of %d lines as llama.cpp's, with and without BOS\n", shape, n_same, n_lines);
    CHECKF(n_lines > 20, "%s: %d lines of llama.cpp's tokenizations", shape, n_lines);
    if (f)
        fclose(f);
    convoy_model_free(m);
}

/* The tokenizer each new architecture's synthetic file declares, against
 * llama.cpp's reading of the same file: SentencePiece for all of them,
 * without the space prefix for the Gemmas (as Gemma's files say). */
static void test_tokens_arch(void)
{
    char llama_ref[512], inp[512], lines[512];
    if (!test_shared_path(llama_ref, sizeof llama_ref, "tools/llama.cpp/bin/llama-ref") ||
        !test_shared_path(inp, sizeof inp, "reference/vocab/ggml-vocab-llama-spm.gguf.inp"))
        return;
    snprintf(lines, sizeof lines, "%s/tok-lines.txt", CONVOY_BINARY_DIR);
    CHECKF(write_token_lines(inp, lines) == 0, "cannot write %s", lines);
    static const char *const shapes[] = {"gemma2-mini", "gemma3-mini", "phi3-mini", "qwen3moe-mini", "qwen2moe-mini",
                                         "mixtral-mini"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_tokens(llama_ref, shapes[i], lines);
}
/* gpt-oss (gpt-oss-mini: MXFP4 experts, 4 of 8 chosen by the softmax of
 * their biased router logits, SwiGLU clamped at 7 on gate and up of std
 * 4; attention sinks of std 2; window 16 on layers 0 and 2; YaRN of
 * factor 8 over an original context of 64, so the ramp runs over pairs 0
 * to 7 of 32; biases on Q/K/V/O and the experts). Its vocabulary is the
 * synthetic SPM one of the other shapes, not gpt-oss's o200k: the logits
 * do not depend on it. */
static void test_logits_gptoss(void) { check_synth("gpt-oss-mini", "F32", 0); }

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
    TEST_RUN(test_logits_generated);
    TEST_RUN(test_logits_gemma3);
    TEST_RUN(test_logits_gemma2);
    TEST_RUN(test_logits_moe);
    TEST_RUN(test_logits_phi3);
    TEST_RUN(test_tokens_arch);
    TEST_RUN(test_logits_gptoss);
    TEST_RUN(test_quantize_as_good_as_llamacpp);
    return test_summary();
}
