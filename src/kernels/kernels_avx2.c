/* kernels_avx2.c: AVX2+FMA+F16C kernels (x86-64; built with -mavx2 -mfma
 * -mf16c, called only when cv_kernels_init found those features).
 *
 * Each function computes exactly the schedule in kernels_impl.h, which its
 * _ref twin in ref.c reproduces in scalar C: 8-lane accumulators are
 * __m256 registers, FMA where the schedule says fma, and hsum8 for the
 * final reduction. The integer block products are exact:
 * - Q4_0: maddubs(q, y) - maddubs(8, y) with q the unsigned nibble gives
 *   the int16 pair sums of (q - 8) * y without saturation for every int8 y
 *   (llama.cpp's sign trick is wrong for y = -128); madd with ones then
 *   gives lane l = elements 4l..4l+3.
 * - Q8_0: both rows widened to int16 and madd'ed (exact for every int8,
 *   including -128), halves added: lane l = elements 2l, 2l+1, 16+2l, 17+2l. */
#include <immintrin.h>
#include <math.h>

#include "kernels/kernels_impl.h"

#define ROUND_NEAREST_EVEN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* v[l] + v[l+4] */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         /* s[l] + s[l+2] */
    s = _mm_add_ss(s, _mm_movehdup_ps(s));                                          /* s[0] + s[1] */
    return _mm_cvtss_f32(s);
}

static inline __m256 load8_f16(const cv_fp16 *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load8_bf16(const cv_bf16 *p)
{
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

float vec_dot_f32_avx2(int n, const void *wv, const void *xv)
{
    const float *w = wv;
    const float *x = xv;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
    }
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++)
        sum = fmaf(w[i], x[i], sum);
    return sum;
}

float vec_dot_f16_avx2(int n, const void *wv, const void *xv)
{
    const cv_fp16 *w = wv;
    const cv_fp16 *x = xv;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load8_f16(w + i), load8_f16(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load8_f16(w + i + 8), load8_f16(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load8_f16(w + i + 16), load8_f16(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load8_f16(w + i + 24), load8_f16(x + i + 24), acc3);
    }
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++)
        sum = fmaf(_cvtsh_ss(w[i]), _cvtsh_ss(x[i]), sum);
    return sum;
}

float vec_dot_bf16_avx2(int n, const void *wv, const void *xv)
{
    const cv_bf16 *w = wv;
    const cv_bf16 *x = xv;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load8_bf16(w + i), load8_bf16(x + i), acc0);
        acc1 = _mm256_fmadd_ps(load8_bf16(w + i + 8), load8_bf16(x + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load8_bf16(w + i + 16), load8_bf16(x + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load8_bf16(w + i + 24), load8_bf16(x + i + 24), acc3);
    }
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++)
        sum = fmaf(cv_bf16_to_fp32(w[i]), cv_bf16_to_fp32(x[i]), sum);
    return sum;
}

/* d = fp16(a) * fp16(b), broadcast. */
static inline __m256 block_scale(cv_fp16 a, cv_fp16 b)
{
    return _mm256_set1_ps(_cvtsh_ss(a) * _cvtsh_ss(b));
}

/* Lane l: sum of p[j] * q[j] over j in {2l, 2l+1, 16+2l, 17+2l}. */
static inline __m256i lanes_q8_0_q8_0(const int8_t *p, const int8_t *q)
{
    __m256i p0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i p1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
    __m256i q0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q));
    __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
    return _mm256_add_epi32(_mm256_madd_epi16(p0, q0), _mm256_madd_epi16(p1, q1));
}

float vec_dot_q8_0_q8_0_avx2(int n, const void *wv, const void *xv)
{
    const block_q8_0 *w = wv;
    const block_q8_0 *x = xv;
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256 s0 = _mm256_cvtepi32_ps(lanes_q8_0_q8_0(w[b].qs, x[b].qs));
        __m256 s1 = _mm256_cvtepi32_ps(lanes_q8_0_q8_0(w[b + 1].qs, x[b + 1].qs));
        acc0 = _mm256_fmadd_ps(block_scale(w[b].d, x[b].d), s0, acc0);
        acc1 = _mm256_fmadd_ps(block_scale(w[b + 1].d, x[b + 1].d), s1, acc1);
    }
    if (b < nb) {
        __m256 s0 = _mm256_cvtepi32_ps(lanes_q8_0_q8_0(w[b].qs, x[b].qs));
        acc0 = _mm256_fmadd_ps(block_scale(w[b].d, x[b].d), s0, acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* Lane l: sum of (q4[j] - 8) * q[j] over j in 4l..4l+3, where q4[j] is the
 * low nibble of packed[j] for j < 16 and the high nibble of packed[j-16]. */
static inline __m256i lanes_q4_0_q8_0(const uint8_t *packed, const int8_t *q)
{
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i eight = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    __m128i bytes = _mm_loadu_si128((const __m128i *)packed);
    __m256i q4 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), low4);
    __m256i y = _mm256_loadu_si256((const __m256i *)q);
    __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q4, y), _mm256_maddubs_epi16(eight, y));
    return _mm256_madd_epi16(pairs, ones);
}

float vec_dot_q4_0_q8_0_avx2(int n, const void *wv, const void *xv)
{
    const block_q4_0 *w = wv;
    const block_q8_0 *x = xv;
    const int nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256 s0 = _mm256_cvtepi32_ps(lanes_q4_0_q8_0(w[b].qs, x[b].qs));
        __m256 s1 = _mm256_cvtepi32_ps(lanes_q4_0_q8_0(w[b + 1].qs, x[b + 1].qs));
        acc0 = _mm256_fmadd_ps(block_scale(w[b].d, x[b].d), s0, acc0);
        acc1 = _mm256_fmadd_ps(block_scale(w[b + 1].d, x[b + 1].d), s1, acc1);
    }
    if (b < nb) {
        __m256 s0 = _mm256_cvtepi32_ps(lanes_q4_0_q8_0(w[b].qs, x[b].qs));
        acc0 = _mm256_fmadd_ps(block_scale(w[b].d, x[b].d), s0, acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

void quantize_row_q8_0_avx2(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        y[b].d = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), ROUND_NEAREST_EVEN));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), ROUND_NEAREST_EVEN));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), ROUND_NEAREST_EVEN));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), ROUND_NEAREST_EVEN));
        /* the packs interleave 128-bit halves: dword k holds elements of
         * group order[k]; the permute puts the groups back in order */
        __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)y[b].qs, _mm256_permutevar8x32_epi32(q, order));
    }
}

void convert_row_f32_to_f16_avx2(const float *x, void *vy, int64_t n)
{
    cv_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void axpy_f32_avx2(int n, float a, const float *x, float *y)
{
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}
