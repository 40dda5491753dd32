/* test_kquants.c: the K-quant kernels (kquants.h), and IQ4_XS
 * (quants32.h), which pairs with Q8_K as they do.
 *
 * - the 6-bit scale/min packing and the Q6_K bit layout, against the
 *   format written out bit by bit;
 * - quantize -> dequantize error per type, and determinism (same bytes on a
 *   second run, and a block's bytes do not depend on the row around it);
 * - Q8_K: bsums, the sign convention of d, the error bound;
 * - vec_dot against a double-precision dot of the dequantized rows, and the
 *   SIMD kernels (AVX2, NEON) bit-identical to the references when the CPU
 *   has them, for n in {256, 512, 4096, 8192}, and on arbitrary bytes;
 * - the entries in the kernels' type table;
 * - llama.cpp's own Q4_K/Q5_K/Q6_K files: our quantizers reproduce their
 *   bytes from the F32 model, and their bytes dequantize close to it. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "core/alloc.h"
#include "kernels/kernels.h"
#include "kernels/kquants.h"
#include "kernels/kquants_impl.h"
#include "kernels/quants32.h"
#include "model/gguf.h"
#include "test.h"

static const int test_sizes[] = {256, 512, 4096, 8192};
#define N_SIZES (int)(sizeof(test_sizes) / sizeof(test_sizes[0]))

static uint64_t rng_state;

static uint32_t rng_u32(void)
{
    rng_state += 0x9e3779b97f4a7c15ull;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static float rng_uniform(void) { return (rng_u32() + 0.5f) * (1.0f / 4294967296.0f); }

static float rng_normal(void)
{
    float u = rng_uniform(), v = rng_uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* A row with the features quantizers meet: gaussian weights whose scale
 * changes per 256, a few outliers, an all-zero and an all-positive
 * super-block (when the row is long enough), a shifted block. */
static void fill_row(float *x, int n, int kind)
{
    for (int b = 0; b < n / QK_K; b++) {
        float scale = 0.02f * (1 + (rng_u32() % 50));
        float shift = (kind == 1 && b % 3 == 1) ? 3 * scale : 0;
        for (int e = 0; e < QK_K; e++)
            x[b * QK_K + e] = scale * rng_normal() + shift;
        if (rng_u32() % 4 == 0)
            x[b * QK_K + rng_u32() % QK_K] = 12 * scale;
    }
    if (n >= 4096) {
        memset(x + 2 * QK_K, 0, QK_K * sizeof(float));
        for (int e = 0; e < QK_K; e++)
            x[5 * QK_K + e] = 0.5f + 0.25f * rng_uniform();
    }
}

/* The SIMD kernels this machine can build: AVX2 on x86-64 (used when the
 * CPU has AVX2+FMA+F16C), NEON on aarch64. */
#if defined(__x86_64__)
#define SIMD_NAME "avx2"
#define SIMD_DOT(t) cv_vec_dot_##t##_q8_K_avx2
#define AVX512_DOT(t) cv_vec_dot_##t##_q8_K_avx512
#elif defined(__aarch64__)
#define SIMD_NAME "neon"
#define SIMD_DOT(t) cv_vec_dot_##t##_q8_K_neon
#else
#define SIMD_NAME "none"
#define SIMD_DOT(t) NULL
#endif
#ifndef AVX512_DOT
#define AVX512_DOT(t) NULL
#endif

typedef struct {
    const char *name;
    size_t block_bytes;
    void (*quantize)(const float *, void *, int64_t);
    void (*dequantize)(const void *, float *, int64_t);
    float (*dot_ref)(int, const void *, const void *);
    float (*dot_simd)(int, const void *, const void *);
    float (*dot_avx512)(int, const void *, const void *); /* NULL: the AVX2 one serves */
    /* bound on rms(error) / max|x| per super-block: about a quant step over
     * sqrt(12) (range 2 max|x| over 3, 7, 15 or 31 steps; max|x| over 32 for
     * Q6_K) */
    double max_rel_rms;
    size_t half_at; /* offset of the block's fp16 fields (d, then dmin) */
    int n_half;
} kq_type;

static const kq_type kq_types[] = {
    {"Q2_K", sizeof(block_q2_K), cv_quantize_row_q2_K, cv_dequantize_row_q2_K, cv_vec_dot_q2_K_q8_K_ref, SIMD_DOT(q2_K),
     AVX512_DOT(q2_K), 0.25, offsetof(block_q2_K, d), 2},
    {"Q3_K", sizeof(block_q3_K), cv_quantize_row_q3_K, cv_dequantize_row_q3_K, cv_vec_dot_q3_K_q8_K_ref, SIMD_DOT(q3_K),
     AVX512_DOT(q3_K), 0.1, offsetof(block_q3_K, d), 1},
    {"Q4_K", sizeof(block_q4_K), cv_quantize_row_q4_K, cv_dequantize_row_q4_K, cv_vec_dot_q4_K_q8_K_ref, SIMD_DOT(q4_K),
     NULL, 0.04, 0, 2},
    {"Q5_K", sizeof(block_q5_K), cv_quantize_row_q5_K, cv_dequantize_row_q5_K, cv_vec_dot_q5_K_q8_K_ref, SIMD_DOT(q5_K),
     NULL, 0.02, 0, 2},
    {"Q6_K", sizeof(block_q6_K), cv_quantize_row_q6_K, cv_dequantize_row_q6_K, cv_vec_dot_q6_K_q8_K_ref, SIMD_DOT(q6_K),
     NULL, 0.01, offsetof(block_q6_K, d), 1},
    {"IQ4_XS", sizeof(block_iq4_xs), cv_quantize_row_iq4_xs, cv_dequantize_row_iq4_xs, cv_vec_dot_iq4_xs_q8_K_ref,
     SIMD_DOT(iq4_xs), AVX512_DOT(iq4_xs), 0.05, offsetof(block_iq4_xs, d), 1},
};
#define N_TYPES (int)(sizeof(kq_types) / sizeof(kq_types[0]))
static const cv_type kq_ids[N_TYPES] = {CV_TYPE_Q2_K, CV_TYPE_Q3_K, CV_TYPE_Q4_K, CV_TYPE_Q5_K, CV_TYPE_Q6_K,
                                        CV_TYPE_IQ4_XS};

static void test_scale_min_packing(void)
{
    /* the format: j < 4: scale = p[j] & 63, min = p[j+4] & 63; j >= 4:
     * scale = (p[j+4] & 15) | (p[j-4] >> 6) << 4, min = (p[j+4] >> 4) | (p[j] >> 6) << 4 */
    for (int trial = 0; trial < 2000; trial++) {
        uint8_t p[K_SCALE_SIZE], sc[8], mn[8];
        for (int i = 0; i < K_SCALE_SIZE; i++)
            p[i] = (uint8_t)rng_u32();
        kq_unpack_scales_mins(p, sc, mn);
        int bad = 0;
        for (int j = 0; j < 8; j++) {
            int s = j < 4 ? p[j] & 63 : (p[j + 4] & 15) | ((p[j - 4] >> 6) << 4);
            int m = j < 4 ? p[j + 4] & 63 : (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
            bad += sc[j] != s || mn[j] != m;
        }
        CHECKF(bad == 0, "unpack of random bytes, trial %d", trial);
        uint8_t p2[K_SCALE_SIZE];
        kq_pack_scales_mins(sc, mn, p2);
        CHECKF(memcmp(p, p2, sizeof(p)) == 0, "pack(unpack(p)) != p, trial %d", trial);
    }
}

static void test_q6_layout(void)
{
    /* weight 128h + 32m + l: low nibble in ql[64h + 32(m&1) + l] (low half
     * for m < 2), high two bits at bit 2m of qh[32h + l] */
    block_q6_K b;
    for (size_t i = 0; i < sizeof(b.ql); i++)
        b.ql[i] = (uint8_t)rng_u32();
    for (size_t i = 0; i < sizeof(b.qh); i++)
        b.qh[i] = (uint8_t)rng_u32();
    for (int i = 0; i < 16; i++)
        b.scales[i] = (int8_t)(i * 9 - 70);
    b.d = cv_fp32_to_fp16(0.5f);
    float y[QK_K];
    cv_dequantize_row_q6_K(&b, y, QK_K);
    for (int h = 0; h < 2; h++)
        for (int m = 0; m < 4; m++)
            for (int l = 0; l < 32; l++) {
                int e = 128 * h + 32 * m + l;
                int lo = m < 2 ? b.ql[64 * h + 32 * m + l] & 15 : b.ql[64 * h + 32 * (m - 2) + l] >> 4;
                int hi = (b.qh[32 * h + l] >> (2 * m)) & 3;
                float want = 0.5f * b.scales[e / 16] * ((lo | hi << 4) - 32);
                CHECKF(y[e] == want, "Q6_K weight %d: %g, want %g", e, y[e], want);
            }
}

/* Q4_K and Q5_K weights, from the format: sub-block s = e / 32 with scale
 * and min from the packing, quant from the nibble of qs[32 (e / 64) + e % 32]
 * (high nibble in odd sub-blocks) and, for Q5_K, bit s of qh[e % 32]. */
static void test_q45_layout(void)
{
    block_q5_K b;
    for (size_t i = 0; i < sizeof(b); i++)
        ((uint8_t *)&b)[i] = (uint8_t)rng_u32();
    b.d = cv_fp32_to_fp16(0.25f);
    b.dmin = cv_fp32_to_fp16(0.125f);
    block_q4_K b4;
    b4.d = b.d;
    b4.dmin = b.dmin;
    memcpy(b4.scales, b.scales, sizeof(b.scales));
    memcpy(b4.qs, b.qs, sizeof(b.qs));
    uint8_t sc[8], mn[8];
    kq_unpack_scales_mins(b.scales, sc, mn);
    float y4[QK_K], y5[QK_K];
    cv_dequantize_row_q4_K(&b4, y4, QK_K);
    cv_dequantize_row_q5_K(&b, y5, QK_K);
    for (int e = 0; e < QK_K; e++) {
        int s = e / 32;
        int q = (b.qs[32 * (e / 64) + e % 32] >> (4 * (s & 1))) & 15;
        int q5 = q | (((b.qh[e % 32] >> s) & 1) << 4);
        float want4 = 0.25f * sc[s] * q - 0.125f * mn[s];
        float want5 = 0.25f * sc[s] * q5 - 0.125f * mn[s];
        CHECKF(y4[e] == want4, "Q4_K weight %d: %g, want %g", e, y4[e], want4);
        CHECKF(y5[e] == want5, "Q5_K weight %d: %g, want %g", e, y5[e], want5);
    }
}

static void test_q8_K(void)
{
    for (int si = 0; si < N_SIZES; si++) {
        int n = test_sizes[si];
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        block_q8_K *q = malloc(n / QK_K * sizeof(block_q8_K));
        block_q8_K *q2 = malloc(n / QK_K * sizeof(block_q8_K));
        fill_row(x, n, 0);
        cv_quantize_row_q8_K(x, q, n);
        cv_quantize_row_q8_K(x, q2, n);
        CHECKF(memcmp(q, q2, n / QK_K * sizeof(block_q8_K)) == 0, "Q8_K not deterministic, n=%d", n);
        cv_dequantize_row_q8_K(q, y, n);
        for (int b = 0; b < n / QK_K; b++) {
            const float *xb = x + b * QK_K;
            float amax = 0, max = 0;
            for (int e = 0; e < QK_K; e++)
                if (fabsf(xb[e]) > amax) {
                    amax = fabsf(xb[e]);
                    max = xb[e];
                }
            int bad_sum = 0, bad_err = 0, has_min = 0;
            for (int s = 0; s < 16; s++) {
                int sum = 0;
                for (int l = 0; l < 16; l++)
                    sum += q[b].qs[16 * s + l];
                bad_sum += sum != q[b].bsums[s];
            }
            for (int e = 0; e < QK_K; e++) {
                bad_err += fabsf(y[b * QK_K + e] - xb[e]) > 0.5001f * fabsf(q[b].d) + 1e-30f;
                has_min |= q[b].qs[e] == -127;
            }
            CHECKF(bad_sum == 0, "Q8_K bsums wrong, n=%d block %d", n, b);
            CHECKF(bad_err == 0, "Q8_K error above d/2, n=%d block %d", n, b);
            if (amax == 0) {
                CHECKF(q[b].d == 0, "Q8_K zero block has d=%g", q[b].d);
            } else {
                /* the element of largest magnitude maps to -127: d = -max / 127 */
                CHECKF(has_min && fabsf(q[b].d * -127 - max) <= 1e-6f * amax,
                       "Q8_K block %d: d=%g max=%g", b, q[b].d, max);
            }
        }
        free(x);
        free(y);
        free(q);
        free(q2);
    }
}

static void test_quantize_roundtrip(void)
{
    for (int t = 0; t < N_TYPES; t++) {
        const kq_type *ty = &kq_types[t];
        for (int si = 0; si < N_SIZES; si++) {
            int n = test_sizes[si];
            for (int kind = 0; kind < 2; kind++) {
                size_t bytes = n / QK_K * ty->block_bytes;
                float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
                uint8_t *q = malloc(bytes), *q2 = malloc(bytes), *q1 = malloc(ty->block_bytes);
                fill_row(x, n, kind);
                ty->quantize(x, q, n);
                ty->quantize(x, q2, n);
                CHECKF(memcmp(q, q2, bytes) == 0, "%s quantizer not deterministic, n=%d", ty->name, n);
                for (int b = 0; b < n / QK_K; b++) {
                    ty->quantize(x + b * QK_K, q1, QK_K);
                    CHECKF(memcmp(q1, q + b * ty->block_bytes, ty->block_bytes) == 0,
                           "%s block %d differs when quantized alone, n=%d", ty->name, b, n);
                }
                ty->dequantize(q, y, n);
                for (int b = 0; b < n / QK_K; b++) {
                    double se = 0, amax = 0;
                    for (int e = b * QK_K; e < (b + 1) * QK_K; e++) {
                        se += (double)(y[e] - x[e]) * (y[e] - x[e]);
                        amax = fmax(amax, fabs(x[e]));
                    }
                    if (amax == 0) {
                        CHECKF(se == 0, "%s zero block %d dequantizes to non-zero", ty->name, b);
                        continue;
                    }
                    double rel = sqrt(se / QK_K) / amax;
                    CHECKF(rel < ty->max_rel_rms, "%s n=%d kind %d block %d: rel rms error %.4f >= %.4f",
                           ty->name, n, kind, b, rel, ty->max_rel_rms);
                }
                free(x);
                free(y);
                free(q);
                free(q2);
                free(q1);
            }
        }
    }
}

static int have_simd(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C)) /* clang has no "f16c" for the builtin */
        return 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#elif defined(__aarch64__)
    return 1;
#else
    return 0;
#endif
}

/* Whether this CPU can run the AVX-512 VNNI kernels. */
static int have_avx512(void)
{
#if defined(__x86_64__)
    return have_simd() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* The SIMD kernels of ty that this CPU runs (AVX2 or NEON, and AVX-512
 * where the type has one) give ref's bits on row wq and activations xq;
 * what and trial name the case. */
static void check_simd_dots(const kq_type *ty, int n, const void *wq, const void *xq, float ref, const char *what,
                            int trial)
{
    float (*const dots[2])(int, const void *, const void *) = {ty->dot_simd, have_avx512() ? ty->dot_avx512 : NULL};
    static const char *const names[2] = {SIMD_NAME, "avx512"};
    for (int k = 0; k < 2; k++) {
        if (!dots[k])
            continue;
        float got = dots[k](n, wq, xq);
        CHECKF(memcmp(&got, &ref, sizeof(float)) == 0, "%s %s trial %d: %s %.9g != ref %.9g", ty->name, what, trial,
               names[k], got, ref);
    }
}

static void test_vec_dot(void)
{
    int simd = have_simd();
    if (!simd)
        fprintf(stderr, "note: no SIMD kernels for this CPU, checking the references only\n");
    for (int t = 0; t < N_TYPES; t++) {
        const kq_type *ty = &kq_types[t];
        for (int si = 0; si < N_SIZES; si++) {
            int n = test_sizes[si];
            for (int trial = 0; trial < 4; trial++) {
                float *w = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float));
                float *wd = malloc(n * sizeof(float)), *xd = malloc(n * sizeof(float));
                uint8_t *wq = malloc(n / QK_K * ty->block_bytes);
                block_q8_K *xq = malloc(n / QK_K * sizeof(block_q8_K));
                fill_row(w, n, trial & 1);
                fill_row(x, n, 0);
                if (trial == 3) /* all-negative activations: d of Q8_K positive */
                    for (int e = 0; e < n; e++)
                        x[e] = -fabsf(x[e]);
                ty->quantize(w, wq, n);
                cv_quantize_row_q8_K(x, xq, n);
                ty->dequantize(wq, wd, n);
                cv_dequantize_row_q8_K(xq, xd, n);
                double exact = 0, mag = 0;
                for (int e = 0; e < n; e++) {
                    exact += (double)wd[e] * xd[e];
                    mag += fabs((double)wd[e] * xd[e]);
                }
                float ref = ty->dot_ref(n, wq, xq);
                CHECKF(fabs(ref - exact) <= 2e-6 * mag, "%s n=%d trial %d: ref %.9g, dequantized dot %.9g",
                       ty->name, n, trial, ref, exact);
                if (simd) {
                    char what[32];
                    snprintf(what, sizeof what, "n=%d", n);
                    check_simd_dots(ty, n, wq, xq, ref, what, trial);
                }
                free(w);
                free(x);
                free(wd);
                free(xd);
                free(wq);
                free(xq);
            }
        }
    }
}

/* Arbitrary bytes (any scales, any fp16 bits but NaN/Inf, any Q8_K
 * contents including bsums that disagree with qs): the SIMD kernel and the
 * reference must still agree bit for bit. */
static void test_vec_dot_random_bytes(void)
{
    if (!have_simd())
        SKIP("no SIMD kernels for this CPU");
    enum { N = 2048 };
    static uint8_t wq[N / QK_K * sizeof(block_q6_K)]; /* the largest block */
    static block_q8_K xq[N / QK_K];
    for (int trial = 0; trial < 20; trial++) {
        for (int t = 0; t < N_TYPES; t++) {
            const kq_type *ty = &kq_types[t];
            for (size_t i = 0; i < sizeof(wq); i++)
                wq[i] = (uint8_t)rng_u32();
            for (int b = 0; b < N / QK_K; b++) {
                uint8_t *blk = wq + b * ty->block_bytes;
                /* fp16 fields with a finite exponent */
                for (int h = 0; h < ty->n_half; h++)
                    blk[ty->half_at + 2 * h + 1] &= 0x3b;
                for (size_t i = 0; i < sizeof(block_q8_K); i++)
                    ((uint8_t *)&xq[b])[i] = (uint8_t)rng_u32();
                xq[b].d = rng_normal();
            }
            check_simd_dots(ty, N, wq, xq, ty->dot_ref(N, wq, xq), "random bytes", trial);
        }
    }
}

/* The AVX2 Q8_K quantizer gives cv_quantize_row_q8_K's bytes: random rows,
 * ties of +max and -max, NaN and inf anywhere, subnormal maxima (iscale
 * overflows to inf) and random bit patterns. */
static void test_q8_K_simd_matches_ref(void)
{
#if defined(__x86_64__)
    if (!have_simd())
        SKIP("no SIMD kernels for this CPU");
    enum { N = 4096, NB = N / QK_K };
    static float x[N];
    static block_q8_K a[NB], b[NB];
    for (int trial = 0; trial < 40; trial++) {
        fill_row(x, N, trial % 2);
        for (int blk = 0; blk < NB; blk++) {
            float *xb = x + blk * QK_K;
            const int e = (int)(rng_u32() % QK_K);
            switch ((trial + blk) % 8) {
            case 0: /* a tie within 8 lanes, either first */
                xb[e ^ 3] *= 64;
                xb[e] = -xb[e ^ 3];
                break;
            case 7: /* a tie across vectors */
                xb[(e + 77) % QK_K] *= 64;
                xb[e] = -xb[(e + 77) % QK_K];
                break;
            case 1: xb[e] = NAN; break;
            case 2: xb[e] = (rng_u32() & 1) ? INFINITY : -INFINITY; break;
            case 3:
                for (int k = 0; k < QK_K; k++)
                    xb[k] *= 1e-40f; /* subnormal: -127 / max is inf */
                break;
            case 4: memset(xb, 0, QK_K * sizeof(float)); xb[e] = -0.0f; break;
            case 5:
                for (int k = 0; k < QK_K; k++) {
                    const uint32_t u = rng_u32();
                    memcpy(&xb[k], &u, 4);
                }
                break;
            case 6:
                for (int k = 0; k < QK_K; k++)
                    xb[k] = NAN;
                break;
            }
        }
        cv_quantize_row_q8_K_avx2(x, a, N);
        cv_quantize_row_q8_K(x, b, N);
        for (int blk = 0; blk < NB; blk++)
            CHECKF(memcmp(&a[blk], &b[blk], sizeof a[blk]) == 0, "Q8_K avx2 quantizer, trial %d block %d (case %d)",
                   trial, blk, (trial + blk) % 8);
    }
#else
    SKIP("no SIMD Q8_K quantizer on this architecture");
#endif
}

/* The K-quants in the kernels' type table (kernels.c), with the kernels
 * cv_kernels_init selects. */
static void test_type_table(void)
{

    cv_kernels_init(0);
    int simd = strcmp(cv_kernels_name(), "ref") != 0;
    for (int t = 0; t < N_TYPES; t++) {
        const kq_type *ty = &kq_types[t];
        const cv_type_traits *tt = cv_type_get(kq_ids[t]);
        CHECKF(tt != NULL, "%s missing from the type table", ty->name);
        if (!tt)
            continue;
        CHECK(strcmp(tt->name, ty->name) == 0 && cv_type_from_name(ty->name) == (int)kq_ids[t]);
        CHECK(tt->blck_size == QK_K && tt->type_size == ty->block_bytes && tt->is_quantized);
        CHECK(tt->vec_dot_type == CV_TYPE_Q8_K);
        CHECK(tt->to_float == ty->dequantize && tt->quantize == ty->quantize && tt->from_float == ty->quantize);
        CHECK(tt->vec_dot_ref == ty->dot_ref);
        const int avx512 = !strcmp(cv_kernels_name(), "avx512") && ty->dot_avx512;
        CHECK(tt->vec_dot == (avx512 ? ty->dot_avx512 : simd ? ty->dot_simd : ty->dot_ref));
        CHECK(cv_row_bytes(kq_ids[t], 4096) == 16 * ty->block_bytes && cv_row_bytes(kq_ids[t], 100) == 0);
    }
    const cv_type_traits *q8 = cv_type_get(CV_TYPE_Q8_K);
    CHECK(q8 != NULL);
    if (q8) {
        CHECK(strcmp(q8->name, "Q8_K") == 0 && q8->blck_size == QK_K && q8->type_size == sizeof(block_q8_K));
#if defined(__x86_64__)
        CHECK(q8->from_float == (simd ? cv_quantize_row_q8_K_avx2 : cv_quantize_row_q8_K));
#else
        CHECK(q8->from_float == cv_quantize_row_q8_K);
#endif
        CHECK(q8->to_float == cv_dequantize_row_q8_K);
        CHECK(q8->quantize == NULL && q8->vec_dot == NULL); /* activations only */
    }
}

/* llama-quantize (no importance matrix) made the K-quant tensors of these
 * files from synth-*-f32.gguf with llama.cpp's reference quantizers:
 * quantizing the F32 rows here must give the same bytes, and dequantizing
 * llama.cpp's bytes must come close to the F32 weights. */
static void check_quantized_file(const char *qname, const char *fname, int *n_kq)
{
    char qpath[1024], fpath[1024], err[512];
    if (!test_shared_path(qpath, sizeof(qpath), qname) || !test_shared_path(fpath, sizeof(fpath), fname))
        return;
    gguf_file qf, ff;
    if (cv_gguf_open(&qf, qpath, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    if (cv_gguf_open(&ff, fpath, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        cv_gguf_close(&qf);
        return;
    }
    for (uint64_t t = 0; t < qf.n_tensors; t++) {
        const gguf_tensor *qt = &qf.tensors[t];
        int ti = -1;
        for (int k = 0; k < N_TYPES; k++)
            ti = qt->type == kq_ids[k] ? k : ti;
        if (ti < 0)
            continue;
        const kq_type *ty = &kq_types[ti];
        char *name = cv_gguf_str_dup(qt->name);
        const gguf_tensor *ft = cv_gguf_find_tensor(&ff, name);
        CHECKF(ft && ft->type == CV_TYPE_F32 && ft->ne[0] == qt->ne[0], "%s: no F32 twin of %s", fname, name);
        if (!ft || ft->type != CV_TYPE_F32 || ft->ne[0] != qt->ne[0]) {
            cv_free(name);
            continue;
        }
        const int64_t n = qt->ne[0], rows = qt->ne[1] * qt->ne[2] * qt->ne[3];
        const size_t row_bytes = (size_t)(n / QK_K) * ty->block_bytes;
        uint8_t *mine = malloc(row_bytes);
        float *deq = malloc(n * sizeof(float));
        long bad_blocks = 0, n_blocks = 0;
        double worst = 0;
        for (int64_t r = 0; r < rows; r++) {
            const float *src = (const float *)ft->data + r * n;
            const uint8_t *theirs = (const uint8_t *)qt->data + r * row_bytes;
            ty->quantize(src, mine, n);
            for (int64_t b = 0; b < n / QK_K; b++, n_blocks++) {
                size_t off = (size_t)b * ty->block_bytes;
                bad_blocks += memcmp(mine + off, theirs + off, ty->block_bytes) != 0;
            }
            ty->dequantize(theirs, deq, n);
            for (int64_t b = 0; b < n / QK_K; b++) {
                double se = 0, amax = 0;
                for (int64_t e = b * QK_K; e < (b + 1) * QK_K; e++) {
                    se += (double)(deq[e] - src[e]) * (deq[e] - src[e]);
                    amax = fmax(amax, fabs(src[e]));
                }
                if (amax > 0)
                    worst = fmax(worst, sqrt(se / QK_K) / amax);
            }
        }
        CHECKF(bad_blocks == 0, "%s %s (%s): %ld of %ld blocks differ from llama.cpp's", qname, name, ty->name,
               bad_blocks, n_blocks);
        CHECKF(worst < ty->max_rel_rms, "%s %s: llama.cpp's %s dequantizes with rel rms error %.4f", qname, name,
               ty->name, worst);
        (*n_kq)++;
        free(mine);
        free(deq);
        cv_free(name);
    }
    cv_gguf_close(&qf);
    cv_gguf_close(&ff);
}

static void test_llamacpp_quantized_files(void)
{
    static const char *files[][2] = {
        {"reference/models/synth-mini-q6_k.gguf", "reference/models/synth-mini-f32.gguf"},
        {"reference/models/synth-mini-q5_k_m.gguf", "reference/models/synth-mini-f32.gguf"},
        {"reference/models/synth-mini-q4_k_m.gguf", "reference/models/synth-mini-f32.gguf"},
        {"reference/models/synth-hd128-q4_k_m.gguf", "reference/models/synth-hd128-f32.gguf"},
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        int n_kq = 0;
        check_quantized_file(files[i][0], files[i][1], &n_kq);
        if (test_skipped_current)
            return;
        CHECKF(n_kq > 0, "%s has no K-quant tensors", files[i][0]);
    }
}

int main(void)
{
    rng_state = 12345;
    TEST_RUN(test_type_table);
    TEST_RUN(test_scale_min_packing);
    TEST_RUN(test_q6_layout);
    TEST_RUN(test_q45_layout);
    TEST_RUN(test_q8_K);
    TEST_RUN(test_q8_K_simd_matches_ref);
    TEST_RUN(test_quantize_roundtrip);
    TEST_RUN(test_vec_dot);
    TEST_RUN(test_vec_dot_random_bytes);
    TEST_RUN(test_llamacpp_quantized_files);
    return test_summary();
}
