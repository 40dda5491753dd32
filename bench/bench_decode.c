/* bench_decode.c: single-machine prefill and decode speed against the
 * memory-bandwidth roofline.
 *
 * For each synthetic model (Llama-3.2-1B shape in Q4_0, Q8_0 and Q4_K_M, Llama-3.1-
 * 8B shape in Q4_0; made once with `convoy synth` into the model directory)
 * and 1 and 2 threads: prefill of pp tokens in one batch and decode of tg
 * tokens one at a time (tokens/s), the read bandwidth measured in the same
 * run (a 2 GiB float array in huge pages, as convoy holds weights, summed
 * by 1 and 2 threads, best of 5), the roofline (bandwidth / weight bytes
 * read per token) and the fraction of it reached. Prints a table and
 * appends one JSON line per measurement to bench/out/decode.jsonl.
 * llama.cpp side by side: bench/vs_llamacpp.sh.
 *
 * With --model PATH, one measurement instead (no bandwidth, no table): a
 * warm-up (time_prefill, time_decode), then prefill of --pp tokens and decode of --tg tokens at
 * --threads, the decode after --depth tokens of context (llama-bench's
 * -d), printed as one line "pp_tok_s tg_tok_s bytes_per_token" for
 * bench/vs_llamacpp.sh.
 *
 * usage: bench_decode [--models DIR] [--only NAME] [--quick] [--bandwidth-only]
 *        bench_decode --model PATH [--threads N] [--pp P] [--tg T] [--depth D] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench_raw.h"
#include "convoy.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "infer/sampler.h"
#include "kernels/kernels.h"

/* ---- read bandwidth ---- */

typedef struct bw_arg {
    const float *p;
    size_t n;
    float sum;
} bw_arg;

#if defined(__x86_64__)
__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n)
{
    __m256 acc[8];
    for (int i = 0; i < 8; i++)
        acc[i] = _mm256_setzero_ps();
    for (size_t i = 0; i + 64 <= n; i += 64)
        for (int j = 0; j < 8; j++)
            acc[j] = _mm256_add_ps(acc[j], _mm256_load_ps(p + i + 8 * j));
    float out[8];
    for (int j = 1; j < 8; j++)
        acc[0] = _mm256_add_ps(acc[0], acc[j]);
    _mm256_storeu_ps(out, acc[0]);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

static void *bw_worker(void *arg)
{
    bw_arg *a = arg;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        a->sum = sum_avx2(a->p, a->n);
        return NULL;
    }
#endif
    float acc[16] = {0};
    for (size_t i = 0; i + 16 <= a->n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += a->p[i + j];
    for (int j = 1; j < 16; j++)
        acc[0] += acc[j];
    a->sum = acc[0];
    return NULL;
}

/* GB/s (1e9 bytes) reading `bytes` with `threads` threads, best of reps. */
static double measure_bandwidth(float *buf, size_t n, int threads, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[8];
        bw_arg args[8];
        size_t per = n / (size_t)threads / 64 * 64;
        double t0 = cv_now_s();
        for (int i = 0; i < threads; i++) {
            args[i] = (bw_arg){.p = buf + (size_t)i * per, .n = per};
            pthread_create(&th[i], NULL, bw_worker, &args[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(th[i], NULL);
        double dt = cv_now_s() - t0;
        double gbs = (double)per * (double)threads * sizeof(float) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    return best;
}

/* ---- speed ---- */

typedef struct speed {
    double pp, tg;
} speed;

/* Batch of the tokens [p0, p0 + n) of one sequence (token i is the same
 * made-up id wherever it is asked for), logits of the last one. */
typedef struct run_batch {
    int32_t *tok, *pos, *seq;
    uint8_t *want;
} run_batch;

static int decode_span(convoy_ctx *c, const convoy_model_info *info, run_batch *rb, int p0, int n, float *logits)
{
    char err[512];
    for (int i = 0; i < n; i++) {
        rb->tok[i] = 3 + ((p0 + i) * 7919) % (info->n_vocab - 3);
        rb->pos[i] = p0 + i;
        rb->want[i] = i == n - 1;
    }
    convoy_batch b = {.n_tokens = n, .token = rb->tok, .pos = rb->pos, .seq = rb->seq, .want = rb->want};
    if (convoy_decode(c, &b, logits, err, sizeof err)) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return -1;
    }
    return 0;
}

/* Tokens/s of a prefill of pp tokens in one batch, timed after the same
 * prefill once untimed, so that the timed one finds the weights cached and
 * the buffers touched, as llama-bench warms up with its prompt. */
static double time_prefill(convoy_ctx *c, const convoy_model_info *info, run_batch *rb, int pp, float *logits)
{
    char err[512];
    decode_span(c, info, rb, 0, pp, logits);
    convoy_seq_free(c, 0, err, sizeof err);
    const double t0 = cv_now_s();
    decode_span(c, info, rb, 0, pp, logits);
    const double tok_s = pp / (cv_now_s() - t0);
    convoy_seq_free(c, 0, err, sizeof err);
    return tok_s;
}

/* Seconds of n greedy steps of sequence 0 from token id at position p0,
 * the first step not timed (it warms the pages and caches); < 0 on error. */
static double greedy_steps(convoy_ctx *c, const convoy_model_info *info, run_batch *rb, int32_t id, int p0, int n,
                           float *logits)
{
    char err[512];
    uint8_t w = 1;
    double t0 = 0;
    for (int i = 0; i <= n; i++) {
        if (i == 1)
            t0 = cv_now_s();
        int32_t ps = p0 + i;
        convoy_batch b = {.n_tokens = 1, .token = &id, .pos = &ps, .seq = rb->seq, .want = &w};
        if (convoy_decode(c, &b, logits, err, sizeof err)) {
            fprintf(stderr, "bench_decode: %s\n", err);
            return -1;
        }
        id = cv_argmax(logits, info->n_vocab);
    }
    return cv_now_s() - t0;
}

/* Tokens/s of decoding tg tokens one at a time after depth tokens of
 * context (filled untimed, n_batch at a time), as llama-bench's tg with -d:
 * a BOS, then each greedy token. First tg tokens from another start,
 * untimed: convoy reads a mixture's expert when a token first chooses it,
 * where llama.cpp's load maps them all, and this puts both in the same
 * state (nearly every expert resident; a dense model loses nothing). */
static double time_decode(convoy_ctx *c, const convoy_model_info *info, run_batch *rb, int n_batch, int depth, int tg,
                          float *logits)
{
    char err[512];
    if (tg > 0) {
        if (greedy_steps(c, info, rb, info->bos + 1, 0, tg, logits) < 0)
            return 0;
        convoy_seq_free(c, 0, err, sizeof err);
    }
    for (int p0 = 0; p0 < depth; p0 += n_batch)
        if (decode_span(c, info, rb, p0, depth - p0 < n_batch ? depth - p0 : n_batch, logits))
            return 0;
    const double s = greedy_steps(c, info, rb, info->bos, depth, tg, logits);
    return tg > 0 && s > 0 ? tg / s : 0;
}

static speed measure(convoy_model *m, int threads, int pp, int tg, int depth)
{
    char err[512];
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_threads = threads;
    p.n_ctx = (pp > depth + tg ? pp : depth + tg) + 1;
    p.n_batch = pp > 0 ? pp : depth > 0 ? (depth < 512 ? depth : 512) : 1;
    convoy_ctx *c = convoy_ctx_create(m, &p, err, sizeof err);
    speed s = {0, 0};
    if (!c) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return s;
    }
    float *logits = malloc(sizeof(float) * (size_t)info.n_vocab);
    run_batch rb = {malloc(sizeof(int32_t) * (size_t)p.n_batch), malloc(sizeof(int32_t) * (size_t)p.n_batch),
                    calloc((size_t)p.n_batch, sizeof(int32_t)), malloc((size_t)p.n_batch)};
    if (pp > 0)
        s.pp = time_prefill(c, &info, &rb, pp, logits);
    s.tg = time_decode(c, &info, &rb, p.n_batch, depth, tg, logits);
    free(logits);
    free(rb.tok);
    free(rb.pos);
    free(rb.seq);
    free(rb.want);
    convoy_ctx_free(c);
    return s;
}

int main(int argc, char **argv)
{
    const char *dir = "bench/out/models", *only = NULL, *one = NULL;
    int quick = 0, bandwidth_only = 0, one_threads = 1, one_pp = 0, one_tg = 0, one_depth = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            one = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            one_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pp") && i + 1 < argc)
            one_pp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tg") && i + 1 < argc)
            one_tg = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
            one_depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--models") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--bandwidth-only"))
            bandwidth_only = 1;
        else {
            fprintf(stderr, "usage: bench_decode [--models DIR] [--only NAME] [--quick] [--bandwidth-only]\n"
                            "       bench_decode --model PATH [--threads N] [--pp P] [--tg T] [--depth D]\n");
            return 2;
        }
    }
    cv_kernels_init(0);
    if (one) {
        char err[512];
        convoy_model *m = convoy_model_load(one, err, sizeof err);
        if (!m) {
            fprintf(stderr, "bench_decode: %s\n", err);
            return 1;
        }
        speed s = measure(m, one_threads, one_pp, one_tg, one_depth);
        convoy_model_info info;
        convoy_model_get_info(m, &info);
        printf("%.3f %.3f %llu\n", s.pp, s.tg, (unsigned long long)info.bytes_per_token);
        convoy_model_free(m);
        return 0;
    }
    const char *convoy_bin = getenv("CONVOY_BIN") ? getenv("CONVOY_BIN") : "build/convoy";
    struct {
        const char *name, *shape, *type;
        int pp, tg;
    } models[] = {
        {"llama-1b-q4_0", "llama-3.2-1b", "Q4_0", 512, 128},
        {"llama-1b-q8_0", "llama-3.2-1b", "Q8_0", 512, 128},
        {"llama-1b-q4_k_m", "llama-3.2-1b", "Q4_K_M", 512, 128},
        {"llama-8b-q4_0", "llama-3.1-8b", "Q4_0", 0, 32},
    };
    mkdir("bench/out", 0755);
    mkdir(dir, 0755);
    FILE *raw = bench_raw_open("bench/out/decode.jsonl");

    const size_t bw_n = (size_t)1 << 29; /* 2 GiB of floats */
    float *bw_buf = cv_huge_alloc(bw_n * sizeof(float));
    for (size_t i = 0; i < bw_n; i++)
        bw_buf[i] = (float)(i & 7);
    double bw[3] = {0};
    bw[1] = measure_bandwidth(bw_buf, bw_n, 1, 5);
    bw[2] = measure_bandwidth(bw_buf, bw_n, 2, 5);
    cv_huge_free(bw_buf, bw_n * sizeof(float));
    printf("read bandwidth: %.2f GB/s (1 thread), %.2f GB/s (2 threads), ratio %.2f; kernels: %s\n\n", bw[1], bw[2],
           bw[2] / bw[1], cv_kernels_name());
    if (bandwidth_only)
        return 0;
    printf("| model | threads | pp%s tok/s | tg tok/s | roofline tok/s | fraction of roof |\n", quick ? "64" : "512");
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        if (only && strcmp(only, models[k].name))
            continue;
        char path[512], cmd[1024], err[512];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, models[k].name);
        if (access(path, R_OK) != 0) {
            snprintf(cmd, sizeof cmd, "'%s' synth --shape %s --type %s -o '%s' >&2", convoy_bin, models[k].shape,
                     models[k].type, path);
            fprintf(stderr, "bench_decode: making %s\n", path);
            if (system(cmd) != 0) {
                fprintf(stderr, "bench_decode: could not synthesize %s\n", path);
                continue;
            }
        }
        convoy_model *m = convoy_model_load(path, err, sizeof err);
        if (!m) {
            fprintf(stderr, "bench_decode: %s\n", err);
            continue;
        }
        convoy_model_info info;
        convoy_model_get_info(m, &info);
        int pp = quick ? (models[k].pp ? 64 : 0) : models[k].pp, tg = quick ? 16 : models[k].tg;
        for (int threads = 1; threads <= 2; threads++) {
            speed s = measure(m, threads, pp, tg, 0);
            double roof = bw[threads] * 1e9 / (double)info.bytes_per_token;
            char pp_s[32] = "n/a";
            if (pp)
                snprintf(pp_s, sizeof pp_s, "%.2f", s.pp);
            printf("| %s | %d | %s | %.2f | %.2f | %.0f%% |\n", models[k].name, threads, pp_s, s.tg, roof,
                   100 * s.tg / roof);
            fflush(stdout);
            bench_raw_append(raw, json_pack("{s:s,s:s,s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:I,s:s,s:i}", "bench",
                                            "decode", "model", models[k].name, "threads", threads, "pp", pp, "tg", tg,
                                            "pp_tok_s", s.pp, "tg_tok_s", s.tg, "bandwidth_gb_s", bw[threads],
                                            "roofline_tok_s", roof, "bytes_per_token",
                                            (json_int_t)info.bytes_per_token, "kernels",
                                            cv_kernels_name(), "time", (int)time(NULL)));
        }
        convoy_model_free(m);
    }
    bench_raw_close(raw);
    return 0;
}
