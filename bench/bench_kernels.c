/* bench_kernels.c: single-thread throughput of the Q4_0, Q8_0, MXFP4, Q2_K,
 * Q3_K, Q4_K, Q5_K and Q6_K matrix products of cv_matmul_rows, and of cv_matmul_interleaved
 * for the types this CPU holds interleaved (what a loaded model uses).
 *
 * Decode (one token): GB/s of weight bytes read, for the reference and the
 * selected kernels. The weight matrix (random quants, default 16384 x 4096)
 * is larger than the caches, so the best kernel should run near memory
 * bandwidth.
 * Batches (2, 4, 8, 16 tokens: decode of several users at once) and prefill
 * (64 and 512 tokens), 4096 x COLS weight: GFLOP/s of one vec_dot
 * per output (what cv_matmul_rows did before it had tile kernels) and of
 * cv_matmul_rows (and interleaved), run alternately and timed in thread
 * CPU time so that a busy machine slows them alike; the outputs must
 * match bit for bit. On x86 the batch table opens with the AVX2 multiply
 * roof: the most GFLOP/s the int8 products can reach on this core.
 * Usage: bench_kernels [ROWS [COLS [REPS [TYPE]]]] (TYPE: only that one). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/clock.h"
#include "kernels/kernels.h"

static uint64_t rng = 88172645463325252ull;

static uint64_t rng_next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#if defined(__x86_64__)
/* The AVX2 multiply roof, GFLOP/s: the int8 product's inner step alone, a
 * token's 4 quants broadcast from L1 and met by a register of weights with
 * vpmaddubsw (32 products), its pair sums added in int16 with vpaddw. The
 * Q4_0, Q4_K and Q5_K kernels do this and more (unpacking, scales, mins)
 * on the same ports, so their batched GFLOP/s stay below it. Written in
 * assembly so that the compiler's register choices (spills, moves) do not
 * lower the roof: 8 int16 sums in ymm8-15, 4 weight registers. */
__attribute__((target("avx2"))) static double avx2_roof_gflops(void)
{
    enum { STEPS = 40000000, PRODUCTS = 8 * 32 }; /* 8 vpmaddubsw a step */
    int32_t quads[8];
    for (int i = 0; i < 8; i++)
        quads[i] = (int32_t)rng_next();
    const double t0 = cv_thread_cpu_s();
#define STEP(k, wreg, sum)                                                                                             \
    "vpbroadcastd " #k "*4(%[q]), %%ymm" #k "\n\t"                                                                     \
    "vpmaddubsw %%ymm" #k ", %%ymm" #wreg ", %%ymm" #k "\n\t"                                                         \
    "vpaddw %%ymm" #k ", %%ymm" #sum ", %%ymm" #sum "\n\t"
    __asm__ volatile("vpxor %%ymm8, %%ymm8, %%ymm8\n\t"
                     "vmovdqa %%ymm8, %%ymm9\n\tvmovdqa %%ymm8, %%ymm10\n\tvmovdqa %%ymm8, %%ymm11\n\t"
                     "vmovdqa %%ymm8, %%ymm12\n\tvmovdqa %%ymm8, %%ymm13\n\tvmovdqa %%ymm8, %%ymm14\n\t"
                     "vmovdqa %%ymm8, %%ymm15\n\t"
                     "vpbroadcastq (%[q]), %%ymm4\n\tvpbroadcastq 8(%[q]), %%ymm5\n\t"
                     "vpbroadcastq 16(%[q]), %%ymm6\n\tvpbroadcastq 24(%[q]), %%ymm7\n\t"
                     "1:\n\t" STEP(0, 4, 8) STEP(1, 5, 9) STEP(2, 6, 10) STEP(3, 7, 11) STEP(4, 4, 12)
                         STEP(5, 5, 13) STEP(6, 6, 14) STEP(7, 7, 15)
                     "dec %[n]\n\tjnz 1b\n\tvzeroupper" /* volatile: runs though its sums are unread */
                     : [n] "+r"((long){STEPS})
                     : [q] "r"(quads)
                     : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                       "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
#undef STEP
    const double dt = cv_thread_cpu_s() - t0;
    return 2.0 * PRODUCTS * STEPS / dt * 1e-9;
}
#endif

/* Random quant bytes, with every block's fp16 scales (d, and dmin where
 * the type has one) set to small finite values (MXFP4: exponents near
 * 2^-8). */
static void fill_blocks(cv_type t, void *p, size_t bytes)
{
    uint8_t *b = p;
    for (size_t i = 0; i < bytes; i++)
        b[i] = (uint8_t)rng_next();
    size_t block = cv_type_get(t)->type_size;
    if (t == CV_TYPE_MXFP4) {
        for (size_t i = 0; i + block <= bytes; i += block)
            b[i] = (uint8_t)(116 + b[i] % 8);
        return;
    }
    size_t d_at = t == CV_TYPE_Q6_K   ? offsetof(block_q6_K, d)
                  : t == CV_TYPE_Q2_K ? offsetof(block_q2_K, d)
                  : t == CV_TYPE_Q3_K ? offsetof(block_q3_K, d)
                                      : 0;
    int n_scales = t == CV_TYPE_Q4_K || t == CV_TYPE_Q5_K || t == CV_TYPE_Q2_K ? 2 : 1;
    for (size_t i = 0; i + block <= bytes; i += block)
        for (int k = 0; k < n_scales; k++) {
            cv_fp16 d = cv_fp32_to_fp16((float)(rng_next() % 1000) * 1e-5f);
            memcpy(b + i + d_at + k * sizeof d, &d, sizeof d);
        }
}

/* m activation rows of n, from random floats in [-1, 1), as the type t
 * multiplies them. */
static void *make_activations(cv_type t, int n, int m)
{
    const cv_type act = cv_type_get(t)->vec_dot_type;
    const cv_type_traits *at = cv_type_get(act);
    const size_t row = cv_row_bytes(act, n);
    float *f = malloc((size_t)n * sizeof(float));
    char *x = malloc((size_t)m * row);
    if (!f || !x)
        exit(1);
    for (int k = 0; k < m; k++) {
        for (int i = 0; i < n; i++)
            f[i] = (float)(rng_next() % 2000) / 1000.0f - 1.0f;
        at->from_float(f, x + (size_t)k * row, n);
    }
    free(f);
    return x;
}

/* The rows of w interleaved, or NULL for a type this CPU does not hold so. */
static void *interleaved_copy(cv_type t, const void *w, long rows, int cols)
{
    if (!cv_interleave_supported(t, cols, rows))
        return NULL;
    const size_t bytes = (size_t)rows * cv_row_bytes(t, cols);
    void *wi = malloc(bytes);
    if (wi && (memcpy(wi, w, bytes), cv_interleave(t, cols, rows, wi))) {
        free(wi);
        wi = NULL;
    }
    return wi;
}

/* One product of m tokens over all rows: of the plain rows w, or of the
 * interleaved ones wi when not NULL. */
static void matmul(cv_type t, const void *w, const void *wi, int cols, const void *x, size_t x_stride, int m,
                   float *y, long rows)
{
    if (wi)
        cv_matmul_interleaved(t, wi, cols, x, x_stride, m, y, (int)rows, 0, rows);
    else
        cv_matmul_rows(t, w, cols, x, x_stride, m, y, (int)rows, 0, rows);
}

/* Best GB/s of `reps` runs of one matrix-vector product over all rows. */
static double bench(cv_type t, const void *w, const void *wi, const void *x, float *y, long rows, int cols, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = cv_now_s();
        matmul(t, w, wi, cols, x, 0, 1, y, rows);
        double dt = cv_now_s() - t0;
        if (dt < best)
            best = dt;
    }
    return (double)rows * (double)cv_row_bytes(t, cols) / best * 1e-9;
}

/* One vec_dot per output, rows outside, tokens inside. */
static void matmul_per_output(cv_type t, const void *w, int cols, const void *x, size_t x_stride, int m, float *y,
                              long rows)
{
    const cv_vec_dot_fn vec_dot = cv_type_get(t)->vec_dot;
    const size_t row_bytes = cv_row_bytes(t, cols);
    for (long r = 0; r < rows; r++)
        for (int k = 0; k < m; k++)
            y[(size_t)k * (size_t)rows + (size_t)r] =
                vec_dot(cols, (const char *)w + (size_t)r * row_bytes, (const char *)x + (size_t)k * x_stride);
}

/* Best seconds of the per-output loop, of cv_matmul_rows and (wi not
 * NULL) of cv_matmul_interleaved, run in turns. */
static void bench_prefill(cv_type t, const void *w, const void *wi, long rows, int cols, const void *x, int m,
                          float *y[3], int reps, double s[3])
{
    const size_t x_stride = cv_row_bytes(cv_type_get(t)->vec_dot_type, cols);
    s[0] = s[1] = s[2] = 1e30;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < (wi ? 3 : 2); k++) {
            double t0 = cv_thread_cpu_s();
            if (k == 0)
                matmul_per_output(t, w, cols, x, x_stride, m, y[0], rows);
            else
                matmul(t, w, k == 2 ? wi : NULL, cols, x, x_stride, m, y[k], rows);
            double dt = cv_thread_cpu_s() - t0;
            if (dt < s[k])
                s[k] = dt;
        }
}

int main(int argc, char **argv)
{
    long rows = argc > 1 ? atol(argv[1]) : 16384;
    int cols = argc > 2 ? atoi(argv[2]) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    const char *only = argc > 4 ? argv[4] : NULL;
    if (rows <= 0 || cols <= 0 || cols % QK_K || reps <= 0) {
        fprintf(stderr, "usage: bench_kernels [ROWS [COLS (multiple of 256) [REPS [TYPE]]]]\n");
        return 2;
    }
    static const cv_type types[] = {CV_TYPE_Q4_0, CV_TYPE_Q8_0, CV_TYPE_MXFP4, CV_TYPE_Q2_K,
                                    CV_TYPE_Q3_K, CV_TYPE_Q4_K, CV_TYPE_Q5_K, CV_TYPE_Q6_K};
    enum { N_TYPES = 8 };
    float *y = malloc((size_t)rows * sizeof(float));
    if (!y)
        return 1;
    printf("matrix %ld x %d, 1 thread, best of %d\n", rows, cols, reps);
    for (int i = 0; i < N_TYPES; i++) {
        cv_type t = types[i];
        if (only && cv_type_from_name(only) != (int)t)
            continue;
        size_t bytes = (size_t)rows * cv_row_bytes(t, cols);
        void *w = malloc(bytes), *x = make_activations(t, cols, 1);
        if (!w)
            return 1;
        fill_blocks(t, w, bytes);
        void *wi = interleaved_copy(t, w, rows, cols);
        cv_kernels_init(1);
        double gb_ref = bench(t, w, NULL, x, y, rows, cols, reps);
        cv_kernels_init(0);
        double gb_best = bench(t, w, NULL, x, y, rows, cols, reps);
        printf("%-5s %6.1f MB  ref %6.2f GB/s  %-4s %6.2f GB/s  (x%.1f)", cv_type_name(t), bytes / 1e6, gb_ref,
               cv_kernels_name(), gb_best, gb_best / gb_ref);
        if (wi)
            printf("  interleaved %6.2f GB/s", bench(t, w, wi, x, y, rows, cols, reps));
        printf("\n");
        free(w);
        free(wi);
        free(x);
    }
    free(y);

    /* prefill */
    static const int tokens[] = {2, 4, 8, 16, 64, 512};
    enum { N_TOKENS = 6 };
    const long p_rows = 4096;
    const int max_m = 512;
    float *ys[3];
    for (int k = 0; k < 3; k++)
        if (!(ys[k] = malloc((size_t)max_m * (size_t)p_rows * sizeof(float))))
            return 1;
    int mismatch = 0;
    printf("prefill: matrix %ld x %d, 1 thread, best of %d, GFLOP/s\n", p_rows, cols, reps);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        double roof = 0;
        for (int r = 0; r < 3; r++) {
            const double g = avx2_roof_gflops();
            roof = g > roof ? g : roof;
        }
        printf("AVX2 multiply roof (vpbroadcastd, vpmaddubsw, vpaddw: 32 products): %.1f GFLOP/s\n", roof);
    }
#endif
    for (int i = 0; i < N_TYPES; i++) {
        cv_type t = types[i];
        if (only && cv_type_from_name(only) != (int)t)
            continue;
        size_t bytes = (size_t)p_rows * cv_row_bytes(t, cols);
        void *w = malloc(bytes), *x = make_activations(t, cols, max_m);
        if (!w)
            return 1;
        fill_blocks(t, w, bytes);
        void *wi = interleaved_copy(t, w, p_rows, cols);
        for (int k = 0; k < N_TOKENS; k++) {
            int m = tokens[k];
            double s[3];
            bench_prefill(t, w, wi, p_rows, cols, x, m, ys, reps, s);
            double flop = 2.0 * (double)p_rows * cols * m;
            const size_t y_bytes = (size_t)m * (size_t)p_rows * sizeof(float);
            int same = memcmp(ys[0], ys[1], y_bytes) == 0 && (!wi || memcmp(ys[0], ys[2], y_bytes) == 0);
            mismatch |= !same;
            printf("%-5s m=%-4d per-output vec_dot %6.1f  cv_matmul_rows %6.1f  (x%.2f)", cv_type_name(t), m,
                   flop / s[0] * 1e-9, flop / s[1] * 1e-9, s[0] / s[1]);
            if (wi)
                printf("  interleaved %6.1f  (x%.2f)", flop / s[2] * 1e-9, s[0] / s[2]);
            printf("%s\n", same ? "" : "  OUTPUTS DIFFER");
        }
        free(w);
        free(wi);
        free(x);
    }
    for (int k = 0; k < 3; k++)
        free(ys[k]);
    return mismatch;
}
