/* bench_kernels.c: single-thread decode throughput of the Q4_0 and Q8_0
 * matrix-vector product (cv_matmul_rows with one token), in GB/s of weight
 * bytes read, for the reference and the selected kernels.
 *
 * The weight matrix (random quants, default 16384 x 4096) is larger than
 * the caches, so the best kernel should run near memory bandwidth.
 * Usage: bench_kernels [ROWS [COLS [REPS]]]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;

static uint64_t rng_next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random quant bytes, with every block scale set to a small finite fp16. */
static void fill_blocks(cv_type t, void *p, size_t bytes)
{
    uint8_t *b = p;
    for (size_t i = 0; i < bytes; i++)
        b[i] = (uint8_t)rng_next();
    size_t block = cv_type_get(t)->type_size;
    for (size_t i = 0; i + block <= bytes; i += block) {
        cv_fp16 d = cv_fp32_to_fp16((float)(rng_next() % 1000) * 1e-5f);
        memcpy(b + i, &d, sizeof d);
    }
}

/* Best GB/s of `reps` runs of one matrix-vector product over all rows. */
static double bench(cv_type t, const void *w, const void *x, float *y, long rows, int cols, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cv_matmul_rows(t, w, cols, x, 0, 1, y, 0, 0, rows);
        double dt = now_s() - t0;
        if (dt < best)
            best = dt;
    }
    return (double)rows * (double)cv_row_bytes(t, cols) / best * 1e-9;
}

int main(int argc, char **argv)
{
    long rows = argc > 1 ? atol(argv[1]) : 16384;
    int cols = argc > 2 ? atoi(argv[2]) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (rows <= 0 || cols <= 0 || cols % QK8_0 || reps <= 0) {
        fprintf(stderr, "usage: bench_kernels [ROWS [COLS (multiple of 32) [REPS]]]\n");
        return 2;
    }
    static const cv_type types[] = {CV_TYPE_Q4_0, CV_TYPE_Q8_0};
    float *y = malloc((size_t)rows * sizeof(float));
    void *x = malloc(cv_row_bytes(CV_TYPE_Q8_0, cols));
    if (!y || !x)
        return 1;
    fill_blocks(CV_TYPE_Q8_0, x, cv_row_bytes(CV_TYPE_Q8_0, cols));
    printf("matrix %ld x %d, 1 thread, best of %d\n", rows, cols, reps);
    for (int i = 0; i < 2; i++) {
        cv_type t = types[i];
        size_t bytes = (size_t)rows * cv_row_bytes(t, cols);
        void *w = malloc(bytes);
        if (!w)
            return 1;
        fill_blocks(t, w, bytes);
        cv_kernels_init(1);
        double gb_ref = bench(t, w, x, y, rows, cols, reps);
        cv_kernels_init(0);
        double gb_best = bench(t, w, x, y, rows, cols, reps);
        printf("%-5s %6.1f MB  ref %6.2f GB/s  %-4s %6.2f GB/s  (x%.1f)\n", cv_type_name(t), bytes / 1e6, gb_ref,
               cv_kernels_name(), gb_best, gb_best / gb_ref);
        free(w);
    }
    free(x);
    free(y);
    return 0;
}
