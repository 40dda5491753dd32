/* attention_avx2.c: the fused attention with AVX2+FMA+F16C, lane for lane
 * the schedule of attention.h (scores: eight positions' 8-lane
 * accumulators reduced together by a horizontal-add tree; softmax: eight
 * positions per vector; values: eight elements per vector). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_x86.h"

/* Lane j: ((a_j0+a_j1) + (a_j2+a_j3)) + ((a_j4+a_j5) + (a_j6+a_j7)). */
static inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                             __m256 a7)
{
    const __m256 x0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 x4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(x0123, x4567, 0x20), _mm256_permute2f128_ps(x0123, x4567, 0x31));
}

static inline void widen_row(const cv_fp16 *h, float *y, int hd)
{
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(y + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + d))));
    for (; d < hd; d++)
        y[d] = cv_fp16_to_fp32(h[d]);
}

static inline __m256 load_v8(const void *row, int f16, int d)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cv_fp16 *)row + d)));
    return _mm256_loadu_ps((const float *)row + d);
}

/* Scores of 8 positions (rows kr[0..8), f32) for query q, into s[0..8). */
static inline void scores8(const float *q, const float *const *kr, int hd, float scale, float *s)
{
    const int full = hd - hd % 8;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int c = 0; c < full; c += 8) {
        const __m256 qv = _mm256_loadu_ps(q + c);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[0] + c), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[1] + c), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[2] + c), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[3] + c), a3);
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[4] + c), a4);
        a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[5] + c), a5);
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[6] + c), a6);
        a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[7] + c), a7);
    }
    __m256 sv = reduce8(a0, a1, a2, a3, a4, a5, a6, a7);
    if (full < hd) {
        _mm256_storeu_ps(s, sv);
        for (int j = 0; j < 8; j++)
            for (int d = full; d < hd; d++)
                s[j] = fmaf(q[d], kr[j][d], s[j]);
        sv = _mm256_loadu_ps(s);
    }
    _mm256_storeu_ps(s, _mm256_mul_ps(sv, _mm256_set1_ps(scale)));
}

#define VG 8 /* query rows whose accumulators stay in registers at once */

/* 1. Scores of the block, eight positions at a time (missing ones read
 * zeros). */
static inline void block_scores(const attn_state *st, const attn_block *b)
{
    for (int i0 = 0; i0 < b->n; i0 += 8) {
        const int c = b->n - i0 < 8 ? b->n - i0 : 8;
        const float *kr[8];
        prefetch_rows(st, b, i0, c);
        attn_key_rows8(st, b, i0, c, widen_row, kr);
        for (int g = b->r0; g < b->r1; g++)
            scores8(attn_q(st, g), kr, st->hd, st->a->scale, st->S + (size_t)g * CV_ATTN_BLOCK + i0);
    }
}

/* acc[g] += P[g][i] * v_i[d..d+8) for each i of the block in order, NG
 * rows (P rows CV_ATTN_BLOCK apart). Inlined with NG a constant, so the
 * sums stay in registers (in memory, each FMA waited on a store). */
static inline __attribute__((always_inline)) void values8_fma(__m256 *acc, int NG, const float *P, const char *vb,
                                                              size_t rstride, int f16, int n, int d)
{
    for (int i = 0; i < n; i++) {
        const __m256 vv = load_v8(vb + (size_t)i * rstride, f16, d);
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + (size_t)g * CV_ATTN_BLOCK + i), vv, acc[g]);
    }
}

/* 3. Values, the full chunks: eight elements of up to VG rows at a time. */
static inline void block_values_full(const attn_state *st, const attn_block *b)
{
    for (int g0 = b->r0; g0 < b->r1; g0 += VG) {
        const int ng = b->r1 - g0 < VG ? b->r1 - g0 : VG;
        float *out[VG];
        for (int g = 0; g < ng; g++)
            out[g] = attn_out(st, g0 + g);
        for (int d = 0; d < st->full; d += 8) {
            __m256 acc[VG];
            for (int g = 0; g < ng; g++) {
                acc[g] = _mm256_loadu_ps(out[g] + d);
                if (st->alpha[g0 + g] != 1.0f)
                    acc[g] = _mm256_mul_ps(acc[g], _mm256_set1_ps(st->alpha[g0 + g]));
            }
            const float *P = st->S + (size_t)g0 * CV_ATTN_BLOCK;
#define VALUES8(NG) values8_fma(acc, NG, P, b->vb, st->rstride, st->f16, b->n, d)
            WITH_CONST_COUNT_8(ng, VALUES8)
#undef VALUES8
            for (int g = 0; g < ng; g++)
                _mm256_storeu_ps(out[g] + d, acc[g]);
        }
    }
}

/* 3. Values, the tail elements (hd % 8), one at a time. */
static inline void block_values_tail(const attn_state *st, const attn_block *b)
{
    for (int d = st->full; d < st->hd; d++)
        for (int g = b->r0; g < b->r1; g++) {
            float *out = attn_out(st, g);
            float o = out[d];
            if (st->alpha[g] != 1.0f)
                o = o * st->alpha[g];
            for (int i = 0; i < b->n; i++) {
                const void *v = b->vb + (size_t)i * st->rstride;
                const float vd = st->f16 ? cv_fp16_to_fp32(((const cv_fp16 *)v)[d]) : ((const float *)v)[d];
                o = fmaf(st->S[(size_t)g * CV_ATTN_BLOCK + i], vd, o);
            }
            out[d] = o;
        }
}

/* The end: out[g] / l_g. */
static inline void attn_finish(const attn_state *st)
{
    for (int g = 0; g < st->G; g++) {
        const __m256 lv = _mm256_set1_ps(st->l[g]);
        float *o = attn_out(st, g);
        int d = 0;
        for (; d < st->full; d += 8)
            _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), lv));
        for (; d < st->hd; d++)
            o[d] = o[d] / st->l[g];
    }
}

/* One block for its rows. */
static void run_block(const attn_state *st, const attn_block *b)
{
    block_scores(st, b);      /* 1. scores */
    attn_softcap_block(st, b, softcap_row8);
    block_softmax(st, b);     /* 2. online softmax */
    block_values_full(st, b); /* 3. values */
    block_values_tail(st, b);
}

void cv_attn_group_avx2(const cv_attn_args *a)
{
    attn_state st;
    attn_init(&st, a);
    attn_blocks(&st, run_block);
    attn_sinks(&st);
    attn_finish(&st);
}
