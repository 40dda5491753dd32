/* test_forward.c: the forward pass through the engine API.
 * - greedy continuations of stories260K equal llama.cpp's (first
 *   n_agree_safe tokens of each prompt of stories260K-greedy.jsonl);
 * - logits are bit-identical between the reference and SIMD kernels,
 *   between 1 and 2 threads, between a prompt in one chunk and token by
 *   token, and between a sequence alone and inside a batch with three
 *   others at different positions (also for a synthetic Gemma 3 and a
 *   synthetic Gemma 2, whose sliding windows move within the tokens, a
 *   synthetic qwen2moe, whose tokens share experts, and a synthetic Phi-3);
 * - a decode step allocates nothing. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convoy.h"
#include "core/alloc.h"
#include "infer/sampler.h"
#include "kernels/kernels.h"
#include "test.h"

#define N_MAX_TOK 512

static convoy_model *load(const char *rel)
{
    char path[512], err[512];
    if (!test_shared_path(path, sizeof path, rel))
        return NULL;
    convoy_model *m = convoy_model_load(path, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    return m;
}

static convoy_ctx *make_ctx(convoy_model *m, int threads, int slots, int batch)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_threads = threads;
    p.n_slot = slots;
    p.n_batch = batch;
    p.n_ctx = 256;
    p.kv_f16 = false; /* the references' cache */
    convoy_ctx *c = convoy_ctx_create(m, &p, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    return c;
}

/* Feeds tokens[0..n) into slot `seq` in chunks of `chunk`, wanting logits
 * for every token; logits [n][n_vocab] out. */
static int feed(convoy_ctx *c, int32_t seq, const int32_t *tokens, int n, int chunk, float *logits, int32_t n_vocab)
{
    int32_t pos[N_MAX_TOK], seqs[N_MAX_TOK];
    uint8_t want[N_MAX_TOK];
    char err[512];
    for (int start = 0; start < n; start += chunk) {
        int k = n - start < chunk ? n - start : chunk;
        for (int i = 0; i < k; i++) {
            pos[i] = convoy_seq_len(c, seq) + i;
            seqs[i] = seq;
            want[i] = 1;
        }
        convoy_batch b = {.n_tokens = k, .token = tokens + start, .pos = pos, .seq = seqs, .want = want};
        if (convoy_decode(c, &b, logits + (size_t)start * n_vocab, err, sizeof err)) {
            CHECKF(0, "decode: %s", err);
            return -1;
        }
    }
    return 0;
}

static void test_greedy_stories260K(void)
{
    char jsonl[512];
    if (!test_shared_path(jsonl, sizeof jsonl, "reference/stories260K-greedy.jsonl"))
        return;
    convoy_model *m = load("models/stories260K.gguf");
    if (!m)
        return;
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    FILE *f = fopen(jsonl, "r");
    char *line = malloc(1 << 20);
    float *logits = malloc(sizeof(float) * N_MAX_TOK * (size_t)info.n_vocab);
    int n_prompts = 0, n_tokens_checked = 0;
    while (fgets(line, 1 << 20, f)) {
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        CHECKF(o != NULL, "%s", jerr.text);
        if (!o)
            continue;
        const char *prompt = json_string_value(json_object_get(o, "prompt"));
        json_t *pids = json_object_get(o, "prompt_ids"), *gen = json_object_get(o, "generated_ids");
        const int n_safe = (int)json_integer_value(json_object_get(o, "n_agree_safe"));
        int32_t ids[N_MAX_TOK];
        int n = convoy_tokenize(m, prompt, strlen(prompt), true, false, ids, N_MAX_TOK);
        CHECKF(n == (int)json_array_size(pids), "prompt '%s': %d ids, llama.cpp %zu", prompt, n, json_array_size(pids));
        for (int i = 0; i < n && i < (int)json_array_size(pids); i++)
            CHECKF(ids[i] == json_integer_value(json_array_get(pids, i)), "prompt '%s' id %d", prompt, i);
        convoy_ctx *c = make_ctx(m, 1, 1, 64);
        int ok = c && feed(c, 0, ids, n, 64, logits, info.n_vocab) == 0;
        const float *last = logits + (size_t)(n - 1) * info.n_vocab;
        for (int step = 0; ok && step < n_safe; step++) {
            int32_t id = cv_argmax(last, info.n_vocab);
            int32_t expect = (int32_t)json_integer_value(json_array_get(gen, step));
            if (id != expect) {
                CHECKF(0, "prompt '%s': step %d: convoy %d, llama.cpp %d", prompt, step, id, expect);
                break;
            }
            n_tokens_checked++;
            ok = feed(c, 0, &id, 1, 1, logits, info.n_vocab) == 0;
            last = logits;
        }
        convoy_ctx_free(c);
        json_decref(o);
        n_prompts++;
    }
    fprintf(stderr, "  %d prompts, %d greedy tokens equal to llama.cpp's\n", n_prompts, n_tokens_checked);
    CHECK(n_prompts == 9);
    free(logits);
    free(line);
    fclose(f);
    convoy_model_free(m);
}

/* Logits of `n` tokens of one sequence under a configuration. */
#define RUN_BATCH 80
typedef struct config {
    int force_ref;
    int threads;
    int chunk;      /* tokens per decode call */
    int batched;    /* share each step with three other sequences */
} config;

static float *run_config(convoy_model *m, const int32_t *tokens, int n, config cfg)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    cv_kernels_init(cfg.force_ref);
    convoy_ctx *c = make_ctx(m, cfg.threads, 4, RUN_BATCH);
    float *logits = calloc((size_t)n * info.n_vocab, sizeof(float));
    if (!c)
        return logits;
    if (!cfg.batched) {
        feed(c, 0, tokens, n, cfg.chunk, logits, info.n_vocab);
    } else {
        /* Slots 1..3 first get prefixes of different lengths, then every step
         * carries one token of each of the four sequences, ours in slot 0
         * placed third, in chunks of cfg.chunk for ours. */
        float *scratch = malloc(sizeof(float) * RUN_BATCH * (size_t)info.n_vocab);
        for (int s = 1; s < 4; s++) {
            int32_t other[16];
            for (int i = 0; i < 5 * s; i++)
                other[i] = (tokens[i % n] + 7 * s + i) % info.n_vocab;
            feed(c, s, other, 5 * s, 5 * s, scratch, info.n_vocab);
        }
        int32_t tok[RUN_BATCH], pos[RUN_BATCH], seq[RUN_BATCH];
        uint8_t want[RUN_BATCH];
        char err[512];
        for (int start = 0; start < n; start += cfg.chunk) {
            int k = n - start < cfg.chunk ? n - start : cfg.chunk, nb = 0;
            for (int s = 1; s < 4; s++) {
                if (s == 3) {
                    for (int i = 0; i < k; i++, nb++) {
                        tok[nb] = tokens[start + i];
                        pos[nb] = start + i;
                        seq[nb] = 0;
                        want[nb] = 1;
                    }
                }
                tok[nb] = (s * 31 + start) % info.n_vocab;
                pos[nb] = convoy_seq_len(c, s);
                seq[nb] = s;
                want[nb] = (uint8_t)(s != 2);
                nb++;
            }
            convoy_batch b = {.n_tokens = nb, .token = tok, .pos = pos, .seq = seq, .want = want};
            if (convoy_decode(c, &b, scratch, err, sizeof err)) {
                CHECKF(0, "batched decode: %s", err);
                break;
            }
            /* wanted rows in batch order: slot 1, then ours (k rows), then slot 3 */
            memcpy(logits + (size_t)start * info.n_vocab, scratch + (size_t)info.n_vocab,
                   sizeof(float) * (size_t)k * info.n_vocab);
        }
        free(scratch);
    }
    convoy_ctx_free(c);
    cv_kernels_init(0);
    return logits;
}

/* Logits of m (named rel) under every variant against one chunk, alone,
 * 1 thread; frees m. */
static void check_determinism_of(convoy_model *m, const char *rel)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    enum { N = 70 }; /* crosses an attention block (64 positions) */
    int32_t tokens[N];
    tokens[0] = info.bos;
    for (int i = 1; i < N; i++)
        tokens[i] = 3 + (i * 7919) % (info.n_vocab - 3);
    const size_t bytes = sizeof(float) * N * (size_t)info.n_vocab;
    float *base = run_config(m, tokens, N, (config){0, 1, N, 0});
    struct {
        const char *what;
        config cfg;
    } variants[] = {
        {"reference kernels", {1, 1, N, 0}},
        {"2 threads", {0, 2, N, 0}},
        {"token by token", {0, 1, 1, 0}},
        {"chunks of 5", {0, 2, 5, 0}},
        {"inside a batch of 4 sequences", {0, 1, 1, 1}},
        {"inside a batch, chunks of 7, 2 threads", {0, 2, 7, 1}},
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        float *got = run_config(m, tokens, N, variants[v].cfg);
        CHECKF(memcmp(base, got, bytes) == 0, "%s: logits differ with %s", rel, variants[v].what);
        free(got);
    }
    free(base);
    convoy_model_free(m);
}

static void check_determinism(const char *rel)
{
    convoy_model *m = load(rel);
    if (m)
        check_determinism_of(m, rel);
}

static void test_bit_identical_stories260K(void) { check_determinism("models/stories260K.gguf"); }
static void test_bit_identical_q4_0(void) { check_determinism("reference/models/synth-mini-q4_0.gguf"); }
static void test_bit_identical_q8_0(void) { check_determinism("reference/models/synth-mini-q8_0.gguf"); }
static void test_bit_identical_q4_k_m(void) { check_determinism("reference/models/synth-mini-q4_k_m.gguf"); }
static void test_bit_identical_f16(void) { check_determinism("reference/models/synth-mini-f16.gguf"); }
static void test_bit_identical_bf16(void) { check_determinism("reference/models/synth-mini-bf16.gguf"); }

/* convoy synth's SHAPE at Q4_0, synthesized here and loaded; path gets its file. */
static convoy_model *load_synth(const char *shape, char *path, size_t path_len)
{
    char cmd[1024], err[512];
    snprintf(path, path_len, "%s/fwd-%s-q4_0.gguf", CONVOY_BINARY_DIR, shape);
    snprintf(cmd, sizeof cmd, "'%s/convoy' synth --shape %s --type Q4_0 -o '%s' >/dev/null", CONVOY_BINARY_DIR, shape,
             path);
    CHECKF(system(cmd) == 0, "synth %s failed", shape);
    convoy_model *m = convoy_model_load(path, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    return m;
}

/* convoy synth's SHAPE at Q4_0 under every variant. */
static void check_synth_determinism(const char *shape)
{
    char path[512];
    convoy_model *m = load_synth(shape, path, sizeof path);
    if (m)
        check_determinism_of(m, path);
}

/* Gemma 3: its sliding layers' window of 16 moves within the 70 tokens. */
static void test_bit_identical_gemma3(void) { check_synth_determinism("gemma3-mini"); }

/* Gemma 2: every other layer slides (window 16); attention scores and
 * logits soft-capped. */
static void test_bit_identical_gemma2(void) { check_synth_determinism("gemma2-mini"); }

/* Mixtures of experts: each expert runs once over the batch's rows routed
 * to it, whatever shares the batch; qwen2moe has the most parts (biases,
 * experts, the gated shared expert). */
static void test_bit_identical_moe(void) { check_synth_determinism("qwen2moe-mini"); }

/* Phi-3 (phi3-mini): fused matrices' row views, partial RoPE with LongRoPE's
 * short factors (the context of 256 is its original one). */
static void test_bit_identical_phi3(void) { check_synth_determinism("phi3-mini"); }

/* gpt-oss (gpt-oss-mini): attention sinks in the fused attention, every
 * other layer sliding (window 16), YaRN, biases on the router and on
 * MXFP4 experts behind the softmax of the chosen logits. */
static void test_bit_identical_gptoss(void) { check_synth_determinism("gpt-oss-mini"); }

/* Eight decode steps of m (named rel) allocate nothing (m is freed). */
static void check_allocates_nothing(convoy_model *m, const char *rel)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    convoy_ctx *c = make_ctx(m, 2, 1, 8);
    float *logits = malloc(sizeof(float) * 8 * (size_t)info.n_vocab);
    int32_t tok = info.bos, pos = 0, seq = 0;
    uint8_t want = 1;
    char err[512];
    for (int step = 0; c && step < 8; step++) {
        convoy_batch b = {.n_tokens = 1, .token = &tok, .pos = &pos, .seq = &seq, .want = &want};
        uint64_t before = cv_alloc_count();
        cv_alloc_forbid(1);
        int rc = convoy_decode(c, &b, logits, err, sizeof err);
        cv_alloc_forbid(0);
        CHECKF(rc == 0, "%s", err);
        CHECKF(cv_alloc_count() == before, "%s: decode step %d allocated %llu times", rel, step,
               (unsigned long long)(cv_alloc_count() - before));
        tok = cv_argmax(logits, info.n_vocab);
        pos++;
    }
    free(logits);
    convoy_ctx_free(c);
    convoy_model_free(m);
}

/* A dense model, and mixtures of experts whose steps read experts into
 * the cache's slots (gpt-oss-mini: its sinks and YaRN too). */
static void test_decode_allocates_nothing(void)
{
    char path[512];
    convoy_model *m = load("reference/models/synth-mini-q4_0.gguf");
    if (m)
        check_allocates_nothing(m, "synth-mini-q4_0");
    if ((m = load_synth("qwen2moe-mini", path, sizeof path)))
        check_allocates_nothing(m, path);
    if ((m = load_synth("gpt-oss-mini", path, sizeof path)))
        check_allocates_nothing(m, path);
}

static void test_bad_batches_refused(void)
{
    convoy_model *m = load("models/stories260K.gguf");
    if (!m)
        return;
    convoy_ctx *c = make_ctx(m, 1, 2, 4);
    float logits[4 * 512];
    char err[512];
    int32_t tok[2] = {1, 5}, pos[2] = {0, 2}, seq[2] = {0, 0};
    uint8_t want[2] = {1, 1};
    convoy_batch gap = {.n_tokens = 2, .token = tok, .pos = pos, .seq = seq, .want = want};
    CHECK(convoy_decode(c, &gap, logits, err, sizeof err) == -1 && strstr(err, "position"));
    int32_t bad_seq[2] = {0, 9}, pos2[2] = {0, 0};
    convoy_batch slot = {.n_tokens = 2, .token = tok, .pos = pos2, .seq = bad_seq, .want = want};
    CHECK(convoy_decode(c, &slot, logits, err, sizeof err) == -1 && strstr(err, "slot"));
    CHECK(convoy_seq_free(c, 9, err, sizeof err) == -1 && strstr(err, "slot 9"));
    CHECK(convoy_seq_truncate(c, -1, 0, err, sizeof err) == -1 && strstr(err, "slot -1"));
    convoy_sampling_params sp = convoy_sampling_default_params();
    sp.penalty_last_n = -2;
    CHECK(convoy_set_sampler(c, 0, &sp, err, sizeof err) == -1 && strstr(err, "penalty_last_n -2"));
    int32_t bad_tok[1] = {512};
    convoy_batch id = {.n_tokens = 1, .token = bad_tok, .pos = pos2, .seq = seq, .want = want};
    CHECK(convoy_decode(c, &id, logits, err, sizeof err) == -1 && strstr(err, "vocabulary"));
    CHECK(convoy_seq_len(c, 0) == 0);
    /* a batch that cuts a slot back but is refused leaves the slot as it was */
    int32_t three[3] = {1, 5, 6}, pos3[3] = {0, 1, 2}, seq3[3] = {0, 0, 0};
    uint8_t want3[3] = {0, 0, 1};
    convoy_batch fill = {.n_tokens = 3, .token = three, .pos = pos3, .seq = seq3, .want = want3};
    CHECKF(convoy_decode(c, &fill, logits, err, sizeof err) == 0, "%s", err);
    int32_t cut_gap[2] = {1, 3};
    convoy_batch cut = {.n_tokens = 2, .token = tok, .pos = cut_gap, .seq = seq, .want = want};
    CHECK(convoy_decode(c, &cut, logits, err, sizeof err) == -1 && strstr(err, "position 3"));
    CHECK(convoy_seq_len(c, 0) == 3);
    int32_t cut_ok[2] = {1, 2};
    cut.pos = cut_ok;
    CHECKF(convoy_decode(c, &cut, logits, err, sizeof err) == 0, "%s", err);
    CHECK(convoy_seq_len(c, 0) == 3);
    convoy_ctx_free(c);
    convoy_model_free(m);
}

int main(void)
{
    cv_kernels_init(0);
    TEST_RUN(test_greedy_stories260K);
    TEST_RUN(test_bit_identical_stories260K);
    TEST_RUN(test_bit_identical_q4_0);
    TEST_RUN(test_bit_identical_q8_0);
    TEST_RUN(test_bit_identical_q4_k_m);
    TEST_RUN(test_bit_identical_f16);
    TEST_RUN(test_bit_identical_bf16);
    TEST_RUN(test_bit_identical_gemma3);
    TEST_RUN(test_bit_identical_gemma2);
    TEST_RUN(test_bit_identical_moe);
    TEST_RUN(test_bit_identical_phi3);
    TEST_RUN(test_bit_identical_gptoss);
    TEST_RUN(test_decode_allocates_nothing);
    TEST_RUN(test_bad_batches_refused);
    return test_summary();
}
