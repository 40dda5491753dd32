/* attention_avx2.c: the fused attention with AVX2+FMA+F16C, lane for lane
 * the schedule of attention.h (scores: eight positions' 8-lane
 * accumulators reduced together by a horizontal-add tree; softmax: eight
 * positions per vector; values: eight elements per vector). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_impl.h"

static inline __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(ATTN_EXP_LO), x); /* -87 > x ? -87 : x */
    const __m256 magic = _mm256_set1_ps(ATTN_MAGIC);
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_LOG2E)), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ATTN_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(ATTN_C2), r);
    __m256 p = _mm256_set1_ps(ATTN_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32((int)ATTN_MAGIC_BITS)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Lane j: ((a_j0+a_j1) + (a_j2+a_j3)) + ((a_j4+a_j5) + (a_j6+a_j7)). */
static inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                             __m256 a7)
{
    const __m256 x0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 x4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(x0123, x4567, 0x20), _mm256_permute2f128_ps(x0123, x4567, 0x31));
}

static inline float hmax8(__m256 b)
{
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
}

static inline float hsum8(__m256 t)
{
    const __m256 h = _mm256_hadd_ps(t, t);
    const __m256 h2 = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
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

#define VG 8 /* query heads whose accumulators stay in registers at once */

/* Software prefetch (no effect on the bits): a long context's rows come
 * from DRAM, and one KV head's rows are kv_stride apart, a pattern the
 * hardware prefetcher follows badly. Keys are fetched this many positions
 * ahead of the scores; a block's values while its scores are computed. */
#define PF_POS 32

static inline void prefetch_row(const char *row, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch(row + o, _MM_HINT_T0);
}

void attn_group_avx2(const cv_attn_args *a)
{
    const int hd = a->head_dim, G = a->group, f16 = a->kv_type == CV_TYPE_F16, full = hd - hd % 8;
    const size_t esz = f16 ? sizeof(cv_fp16) : sizeof(float), rstride = a->kv_stride * esz;
    float *S = a->scratch, *m = S + (size_t)G * CV_ATTN_BLOCK, *l = m + G, *alpha = l + G;
    float *kw = alpha + G; /* 8 widened F16 rows; also a zero row for missing positions */
    float *zero = kw;       /* F32 keys: kw row 0 holds zeros */
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(a->out, 0, sizeof(float) * (size_t)G * (size_t)hd);
    for (int p0 = 0; p0 < a->n_pos; p0 += CV_ATTN_BLOCK) {
        const int n = a->n_pos - p0 < CV_ATTN_BLOCK ? a->n_pos - p0 : CV_ATTN_BLOCK;
        const int n8 = (n + 7) & ~7;
        const char *kb = (const char *)a->k + (size_t)p0 * rstride;
        /* 1. scores, eight positions at a time (missing ones read zeros) */
        const char *vb = (const char *)a->v + (size_t)p0 * rstride;
        for (int i0 = 0; i0 < n; i0 += 8) {
            const int c = n - i0 < 8 ? n - i0 : 8;
            const float *kr[8];
            const int pf = p0 + i0 + PF_POS, pf_n = a->n_pos - pf < 8 ? a->n_pos - pf : 8;
            for (int j = 0; j < pf_n; j++)
                prefetch_row((const char *)a->k + (size_t)(pf + j) * rstride, (size_t)hd * esz);
            for (int j = 0; j < c; j++)
                prefetch_row(vb + (size_t)(i0 + j) * rstride, (size_t)hd * esz);
            if (f16) {
                for (int j = 0; j < 8; j++) {
                    float *row = kw + (size_t)j * hd;
                    if (j < c)
                        widen_row((const cv_fp16 *)(kb + (size_t)(i0 + j) * rstride), row, hd);
                    else
                        memset(row, 0, sizeof(float) * (size_t)hd);
                    kr[j] = row;
                }
            } else {
                if (c < 8)
                    memset(zero, 0, sizeof(float) * (size_t)hd);
                for (int j = 0; j < 8; j++)
                    kr[j] = j < c ? (const float *)(kb + (size_t)(i0 + j) * rstride) : zero;
            }
            for (int g = 0; g < G; g++)
                scores8(a->q + (size_t)g * hd, kr, hd, a->scale, S + (size_t)g * CV_ATTN_BLOCK + i0);
        }
        /* 2. online softmax */
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 tail_mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - (n8 - 8)), lane));
        for (int g = 0; g < G; g++) {
            float *Sg = S + (size_t)g * CV_ATTN_BLOCK;
            for (int i = n; i < n8; i++)
                Sg[i] = -INFINITY;
            __m256 b = _mm256_set1_ps(-INFINITY);
            for (int i0 = 0; i0 < n8; i0 += 8)
                b = _mm256_max_ps(_mm256_loadu_ps(Sg + i0), b);
            const float mn = attn_max(hmax8(b), m[g]);
            alpha[g] = attn_exp(m[g] - mn);
            const __m256 mv = _mm256_set1_ps(mn);
            __m256 t = _mm256_setzero_ps();
            for (int i0 = 0; i0 < n8; i0 += 8) {
                __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(Sg + i0), mv));
                if (i0 + 8 > n)
                    p = _mm256_and_ps(p, tail_mask);
                _mm256_storeu_ps(Sg + i0, p);
                t = _mm256_add_ps(t, p);
            }
            l[g] = fmaf(l[g], alpha[g], hsum8(t));
            m[g] = mn;
        }
        /* 3. values: eight elements of up to VG heads at a time */
        for (int g0 = 0; g0 < G; g0 += VG) {
            const int ng = G - g0 < VG ? G - g0 : VG;
            for (int d = 0; d < full; d += 8) {
                __m256 acc[VG];
                for (int g = 0; g < ng; g++) {
                    float *o = a->out + (size_t)(g0 + g) * hd + d;
                    acc[g] = _mm256_loadu_ps(o);
                    if (alpha[g0 + g] != 1.0f)
                        acc[g] = _mm256_mul_ps(acc[g], _mm256_set1_ps(alpha[g0 + g]));
                }
                const float *P = S + (size_t)g0 * CV_ATTN_BLOCK;
                if (ng == 1) {
                    for (int i = 0; i < n; i++)
                        acc[0] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + i), load_v8(vb + (size_t)i * rstride, f16, d),
                                                 acc[0]);
                } else if (ng == 2) {
                    for (int i = 0; i < n; i++) {
                        const __m256 vv = load_v8(vb + (size_t)i * rstride, f16, d);
                        acc[0] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + i), vv, acc[0]);
                        acc[1] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + CV_ATTN_BLOCK + i), vv, acc[1]);
                    }
                } else if (ng == 4) {
                    for (int i = 0; i < n; i++) {
                        const __m256 vv = load_v8(vb + (size_t)i * rstride, f16, d);
                        acc[0] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + i), vv, acc[0]);
                        acc[1] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + CV_ATTN_BLOCK + i), vv, acc[1]);
                        acc[2] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + 2 * CV_ATTN_BLOCK + i), vv, acc[2]);
                        acc[3] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + 3 * CV_ATTN_BLOCK + i), vv, acc[3]);
                    }
                } else {
                    for (int i = 0; i < n; i++) {
                        const __m256 vv = load_v8(vb + (size_t)i * rstride, f16, d);
                        for (int g = 0; g < ng; g++)
                            acc[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + (size_t)g * CV_ATTN_BLOCK + i), vv,
                                                     acc[g]);
                    }
                }
                for (int g = 0; g < ng; g++)
                    _mm256_storeu_ps(a->out + (size_t)(g0 + g) * hd + d, acc[g]);
            }
        }
        for (int d = full; d < hd; d++) /* tail elements, one at a time */
            for (int g = 0; g < G; g++) {
                float o = a->out[(size_t)g * hd + d];
                if (alpha[g] != 1.0f)
                    o = o * alpha[g];
                for (int i = 0; i < n; i++) {
                    const void *v = vb + (size_t)i * rstride;
                    const float vd = f16 ? cv_fp16_to_fp32(((const cv_fp16 *)v)[d]) : ((const float *)v)[d];
                    o = fmaf(S[(size_t)g * CV_ATTN_BLOCK + i], vd, o);
                }
                a->out[(size_t)g * hd + d] = o;
            }
    }
    for (int g = 0; g < G; g++) {
        const __m256 lv = _mm256_set1_ps(l[g]);
        float *o = a->out + (size_t)g * hd;
        int d = 0;
        for (; d < full; d += 8)
            _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), lv));
        for (; d < hd; d++)
            o[d] = o[d] / l[g];
    }
}
