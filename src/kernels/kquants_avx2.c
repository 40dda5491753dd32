/* kquants_avx2.c: K-quant dot products with AVX2, FMA and F16C.
 *
 * Each kernel works one super-block (256 weights) at a time:
 * - unsigned quants (0..15, 0..31, 0..63) times the int8 activations with
 *   _mm256_maddubs_epi16 (never saturates at these ranges), then
 *   _mm256_madd_epi16 with the sub-block scale: int32 lane k sums weights
 *   4k..4k+3 of a 32-weight group, and the groups add up in 8 lanes;
 * - the per-sub-block terms that involve every weight of the sub-block
 *   (Q4_K/Q5_K mins, Q6_K's offset of 32) use the Q8_K bsums: for Q6_K they
 *   are subtracted exactly in the integer lanes, for Q4_K/Q5_K they go to
 *   a separate 4-lane sum with their own scale dmin;
 * - once per super-block the int32 lanes become float and are fused into
 *   the accumulators: acc = fma(d, lanes, acc), accm = fma(dmin, mins, accm).
 * The result is hsum8(acc) (- reduce4(accm)), with reduce4(t) =
 * (t0 + t2) + (t1 + t3) and hsum8(v) = reduce4(lo(v) + hi(v)).
 * vec_dot_*_ref in kquants.c does exactly this in scalar C, so both give
 * the same bits. This is also the float order of llama.cpp's AVX2 kernels
 * (non-repacked), so convoy's K-quant matmuls can agree with llama.cpp's. */
#include <immintrin.h>

#include "kernels/kquants.h"
#include "kernels/kquants_impl.h"

/* (t0 + t2) + (t1 + t3) */
static inline float reduce4(__m128 t)
{
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* reduce4 of t[i] = v[i] + v[i+4] */
static inline float hsum8(__m256 v)
{
    return reduce4(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* 16-bit lane k of v (k < 8) copied to every 16-bit lane of both halves. */
static inline __m256i bcast_i16(__m256i v, int k)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

/* Lane k of the Q4_K/Q5_K mins term: mn[2k] * s[2k] + mn[2k+1] * s[2k+1],
 * s[j] the sum of sub-block j's two bsums. */
static inline __m128i mins_dot(const uint8_t mn[8], const int16_t *bsums)
{
    const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    const __m128i s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                     _mm_loadu_si128((const __m128i *)(bsums + 8)));
    return _mm_madd_epi16(mins, s);
}

float vec_dot_q4_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q4_K *wb = w;
    const block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(wb[i].scales, sc, mn);
        const __m256i scales = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const uint8_t *q = wb[i].qs;
        const int8_t *y = xb[i].qs;
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
            const __m256i lo = _mm256_and_si256(qb, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
            __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y + 64 * j)));
            __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 64 * j + 32)));
            p0 = _mm256_madd_epi16(p0, bcast_i16(scales, 2 * j));
            p1 = _mm256_madd_epi16(p1, bcast_i16(scales, 2 * j + 1));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        const __m128i msum = mins_dot(mn, xb[i].bsums);
        const float d = xb[i].d * _cvtsh_ss(wb[i].d);
        const float dm = xb[i].d * _cvtsh_ss(wb[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(dm), _mm_cvtepi32_ps(msum), accm);
    }
    return hsum8(acc) - reduce4(accm);
}

float vec_dot_q5_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q5_K *wb = w;
    const block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(wb[i].scales, sc, mn);
        const __m256i scales = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const uint8_t *q = wb[i].qs;
        const int8_t *y = xb[i].qs;
        /* bit 2j of qh[l] is the fifth bit of weight 64j + l, bit 2j+1 of
         * weight 64j + 32 + l; hb is shifted down by 2 per chunk */
        __m256i hb = _mm256_loadu_si256((const __m256i *)wb[i].qh);
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
            __m256i lo = _mm256_and_si256(qb, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            hb = _mm256_srli_epi16(hb, 2);
            __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y + 64 * j)));
            __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 64 * j + 32)));
            p0 = _mm256_madd_epi16(p0, bcast_i16(scales, 2 * j));
            p1 = _mm256_madd_epi16(p1, bcast_i16(scales, 2 * j + 1));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        const __m128i msum = mins_dot(mn, xb[i].bsums);
        const float d = xb[i].d * _cvtsh_ss(wb[i].d);
        const float dm = xb[i].d * _cvtsh_ss(wb[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(dm), _mm_cvtepi32_ps(msum), accm);
    }
    return hsum8(acc) - reduce4(accm);
}

float vec_dot_q6_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q6_K *wb = w;
    const block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    /* for group m of a 128-weight half: scale 2m in the low 16 bytes
     * (weights 0..15 of the group), scale 2m+1 in the high 16 */
    __m256i pick[4];
    for (int m = 0; m < 4; m++)
        pick[m] = _mm256_set_m128i(_mm_set1_epi16((short)(((4 * m + 3) << 8) | (4 * m + 2))),
                                   _mm_set1_epi16((short)(((4 * m + 1) << 8) | (4 * m))));
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const int8_t *y = xb[i].qs;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)wb[i].scales);
        /* 32 * sum of scale * bsum, paired as madd pairs them */
        const __m256i offs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)xb[i].bsums));
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(
                h ? _mm_srli_si128(sc8, 8) : sc8));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(wb[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(wb[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(wb[i].qh + 32 * h));
            __m256i qv[4];
            qv[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            qv[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            qv[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            qv[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int m = 0; m < 4; m++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(y + 128 * h + 32 * m));
                const __m256i p = _mm256_maddubs_epi16(qv[m], yv);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(scales, pick[m])));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offs, 5));
        const float d = xb[i].d * _cvtsh_ss(wb[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum8(acc);
}
