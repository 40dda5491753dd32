/* kquants_avx2.c: K-quant dot products with AVX2, FMA and F16C.
 *
 * Each kernel works one super-block (256 weights) at a time:
 * - unsigned quants (0..3, 0..7, 0..15, 0..31, 0..63) times the int8 activations with
 *   _mm256_maddubs_epi16 (never saturates at these ranges), then
 *   _mm256_madd_epi16 with the sub-block scale;
 * - the per-sub-block terms that involve every weight of the sub-block
 *   (Q2_K/Q4_K/Q5_K mins, Q3_K's offset of 4, Q6_K's of 32) use the Q8_K
 *   bsums: for Q3_K and Q6_K they are subtracted exactly in the integer
 *   lanes, for Q2_K/Q4_K/Q5_K they form a separate sum with its own scale
 *   dmin;
 * - the float part is kquants.c's: Q2_K/Q4_K/Q5_K fuse the whole int32
 *   sums of a super-block into two scalars (acc - accm at the end), Q3_K
 *   and Q6_K into one.
 * vec_dot_*_ref in kquants.c does exactly this in scalar C, so both give
 * the same bits. Each vec_dot prefetches its row KQUANT_PREFETCH_BYTES
 * ahead.
 *
 * The matmul_tile_* kernels (second half) compute many outputs at once for
 * cv_matmul_rows, each with the bits of its vec_dot here; the interleaved
 * kernels, which give those bits too, are kquants_interleaved_avx2.c. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/interleaved_avx2.h"
#include "kernels/kernels_impl.h"
#include "kernels/kquants.h"
#include "kernels/kquants_impl.h"

/* Prefetches the super-block KQUANT_PREFETCH_BYTES ahead of b (bytes
 * long). */
static inline void prefetch_ahead(const void *b, int bytes)
{
    prefetch_lines((const char *)b + KQUANT_PREFETCH_BYTES, bytes);
}

/* 16-bit lane k of v (k < 8) copied to every 16-bit lane of both halves. */
static inline __m256i bcast_i16(__m256i v, int k)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

/* Sums of the int32 lanes (exact, so in any order). */
static inline int32_t sum4_i32(__m128i t)
{
    t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    return _mm_cvtsi128_si32(t) + _mm_extract_epi32(t, 1);
}

static inline int32_t sum8_i32(__m256i v)
{
    return sum4_i32(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* Lane k of the Q4_K/Q5_K mins term: mn[2k] * s[2k] + mn[2k+1] * s[2k+1],
 * s[j] the sum of sub-block j's two bsums. */
static inline __m128i mins_dot(const uint8_t mn[8], const int16_t *bsums)
{
    const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    return _mm_madd_epi16(mins, bsum_pairs(bsums));
}

/* Chunk j's 64 weights of a Q4_K (q5 = 0) or Q5_K block as bytes: lo holds
 * weights 64j..64j+31, hi the next 32. For Q5_K, *hb is the block's qh
 * shifted down by 2 per chunk already taken: bit 0 of each byte is the
 * fifth bit of lo's weight, bit 1 of hi's. */
static inline __attribute__((always_inline)) void unpack_q45(const uint8_t *qs, int j, __m256i *hb, int q5,
                                                             __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
    *lo = _mm256_and_si256(qb, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
    if (q5) {
        const __m256i bit4 = _mm256_set1_epi8(0x10);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(*hb, 4), bit4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_slli_epi16(*hb, 3), bit4));
        *hb = _mm256_srli_epi16(*hb, 2);
    }
}

/* Shuffles for group m (32 weights) of a 128-weight half whose 8 scales are
 * 16-bit lanes in both 128-bit halves: scale 2m in the low 16 bytes
 * (weights 0..15 of the group), scale 2m+1 in the high 16. */
static inline void scale_pair_masks(__m256i pick[4])
{
    for (int m = 0; m < 4; m++)
        pick[m] = _mm256_set_m128i(_mm_set1_epi16((short)(((4 * m + 3) << 8) | (4 * m + 2))),
                                   _mm_set1_epi16((short)(((4 * m + 1) << 8) | (4 * m))));
}

/* Scales 8h..8h+7 of 16 (bytes of sc, signed with is_signed) as 16-bit
 * lanes, in both 128-bit halves. */
static inline __m256i scales_half(__m128i sc, int h, int is_signed)
{
    const __m128i s = h ? _mm_srli_si128(sc, 8) : sc;
    return _mm256_broadcastsi128_si256(is_signed ? _mm_cvtepi8_epi16(s) : _mm_cvtepu8_epi16(s));
}

/* The int32 lanes of sum over the 16 sub-blocks of scale * (q * y) for 2-bit
 * quants qs (Q2_K's layout) with, for Q3_K (hm not NULL), the third bits
 * of hmask hm at bit 2: the sub-block scales sc as bytes (signed for
 * Q3_K). */
static inline __attribute__((always_inline)) __m256i dot_q23(const uint8_t *qs, const __m256i *hm, __m128i sc,
                                                             const int8_t *y, const __m256i pick[4])
{
    const __m256i m3 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
    __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i scales = scales_half(sc, h, hm != NULL);
        const __m256i qb = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * j), m3);
            if (hm) { /* bit 4h + j of each byte to bit 2 */
                const int k = 4 * h + j;
                const __m256i t = k >= 2 ? _mm256_srli_epi16(*hm, k - 2) : _mm256_slli_epi16(*hm, 2 - k);
                q = _mm256_or_si256(q, _mm256_and_si256(t, bit2));
            }
            const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(y + 128 * h + 32 * j)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(scales, pick[j])));
        }
    }
    return isum;
}

float cv_vec_dot_q2_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q2_K *wb = w;
    const block_q8_K *xb = x;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256i pick[4];
    scale_pair_masks(pick);
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&wb[i], sizeof wb[i]);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)wb[i].scales);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const int32_t msum = sum8_i32(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb[i].bsums)));
        const __m256i isum = dot_q23(wb[i].qs, NULL, _mm_and_si128(sc8, m4), xb[i].qs, pick);
        acc = fmaf(xb[i].d * _cvtsh_ss(wb[i].d), (float)sum8_i32(isum), acc);
        accm = fmaf(xb[i].d * _cvtsh_ss(wb[i].dmin), (float)msum, accm);
    }
    return acc - accm;
}

float cv_vec_dot_q3_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q3_K *wb = w;
    const block_q8_K *xb = x;
    __m256i pick[4];
    scale_pair_masks(pick);
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&wb[i], sizeof wb[i]);
        const __m128i sc8 = q3_scales_v(&wb[i]);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)wb[i].hmask);
        /* the offset 4: 4 * scale * bsum, paired as madd pairs them */
        const __m256i offs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)xb[i].bsums));
        const __m256i isum = _mm256_sub_epi32(dot_q23(wb[i].qs, &hm, sc8, xb[i].qs, pick), _mm256_slli_epi32(offs, 2));
        acc = fmaf(xb[i].d * _cvtsh_ss(wb[i].d), (float)sum8_i32(isum), acc);
    }
    return acc;
}

float cv_vec_dot_q4_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q4_K *wb = w;
    const block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&wb[i], sizeof wb[i]);
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(wb[i].scales, sc, mn);
        const __m256i scales = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const uint8_t *q = wb[i].qs;
        const int8_t *y = xb[i].qs;
        __m256i isum = _mm256_setzero_si256();
        /* unrolled, so that bcast_i16's masks are constants (a third
         * faster when compute-bound) */
#pragma GCC unroll 4
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
        const int32_t msum = sum4_i32(mins_dot(mn, xb[i].bsums));
        const float d = xb[i].d * _cvtsh_ss(wb[i].d);
        const float dm = xb[i].d * _cvtsh_ss(wb[i].dmin);
        acc = fmaf(d, (float)sum8_i32(isum), acc);
        accm = fmaf(dm, (float)msum, accm);
    }
    return acc - accm;
}

float cv_vec_dot_q5_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q5_K *wb = w;
    const block_q8_K *xb = x;
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&wb[i], sizeof wb[i]);
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
        /* unrolled as in Q4_K */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i lo, hi;
            unpack_q45(q, j, &hb, 1, &lo, &hi);
            __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y + 64 * j)));
            __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 64 * j + 32)));
            p0 = _mm256_madd_epi16(p0, bcast_i16(scales, 2 * j));
            p1 = _mm256_madd_epi16(p1, bcast_i16(scales, 2 * j + 1));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        const int32_t msum = sum4_i32(mins_dot(mn, xb[i].bsums));
        const float d = xb[i].d * _cvtsh_ss(wb[i].d);
        const float dm = xb[i].d * _cvtsh_ss(wb[i].dmin);
        acc = fmaf(d, (float)sum8_i32(isum), acc);
        accm = fmaf(dm, (float)msum, accm);
    }
    return acc - accm;
}

float cv_vec_dot_q6_K_q8_K_avx2(int n, const void *w, const void *x)
{
    const block_q6_K *wb = w;
    const block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    __m256i pick[4];
    scale_pair_masks(pick);
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&wb[i], sizeof wb[i]);
        const int8_t *y = xb[i].qs;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)wb[i].scales);
        /* 32 * sum of scale * bsum, paired as madd pairs them */
        const __m256i offs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)xb[i].bsums));
        __m256i isum = _mm256_setzero_si256();
        /* unrolled: a loop kept qv in memory and waited on it */
#pragma GCC unroll 2
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
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(y + 128 * h + 32 * m));
                const __m256i p = _mm256_maddubs_epi16(qv[m], yv);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(scales, pick[m])));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offs, 5));
        acc = fmaf(xb[i].d * _cvtsh_ss(wb[i].d), (float)sum8_i32(isum), acc);
    }
    return acc;
}

/* ---- Q8_K activations: cv_quantize_row_q8_K's bits ----
 *
 * The maximum is the first element of the largest magnitude, as the scalar
 * loop keeps it (NaNs never win: max_ps returns its second operand when the
 * first is NaN). Each quant is rounded by the same magic-number addition
 * as round_nearest, so NaN and inf give the scalar's bytes too. */

/* The quants of 8 elements as the low bytes of int32 lanes:
 * round_nearest(iscale * x), at most 127, cast to int8 (which truncates
 * the values an overflowed iscale gives). */
static inline __m256i quants8_q8_K(const float *x, __m256 iscale)
{
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(iscale, _mm256_loadu_ps(x)), _mm256_set1_ps(12582912.f));
    const __m256i v = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), _mm256_set1_epi32(0x007fffff)),
                                       _mm256_set1_epi32(0x00400000));
    return _mm256_and_si256(_mm256_min_epi32(v, _mm256_set1_epi32(127)), _mm256_set1_epi32(0xFF));
}

/* The element of x[0, QK_K) that cv_quantize_row_q8_K scales by, 0 if all
 * are zero (or NaN). */
static float block_max_q8_K(const float *x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int e = 0; e < QK_K; e += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + e)), m);
    const float amax = hmax8(m);
    if (amax == 0.0f)
        return 0.0f;
    const __m256 amax8 = _mm256_set1_ps(amax);
    for (int e = 0; e < QK_K; e += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + e)), amax8,
                                                         _CMP_EQ_OQ));
        if (hit)
            return x[e + __builtin_ctz((unsigned)hit)];
    }
    return 0.0f; /* not reached: amax is one of the elements */
}

void cv_quantize_row_q8_K_avx2(const float *x, void *vy, int64_t n)
{
    block_q8_K *y = vy;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float max = block_max_q8_K(x);
        if (max == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K / 32; k++) { /* elements 32k..32k+31: bsums 2k, 2k + 1 */
            const float *xk = x + 32 * k;
            /* bytes in 0..255 pass the unsigned packs unchanged; the packs
             * interleave 128-bit halves, the permute puts the groups of 4
             * back in order */
            const __m256i q = _mm256_permutevar8x32_epi32(
                _mm256_packus_epi16(_mm256_packus_epi32(quants8_q8_K(xk, is), quants8_q8_K(xk + 8, is)),
                                    _mm256_packus_epi32(quants8_q8_K(xk + 16, is), quants8_q8_K(xk + 24, is))),
                order);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * k), q);
            const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16); /* sums of 4 */
            __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            s = _mm_hadd_epi32(s, s);
            y[i].bsums[2 * k] = (int16_t)_mm_cvtsi128_si32(s);
            y[i].bsums[2 * k + 1] = (int16_t)_mm_extract_epi32(s, 1);
        }
        y[i].d = 1 / iscale;
    }
}

/* The 8 scales and 8 mins of a Q4_K (or Q5_K) block as bytes [sc0..sc7,
 * mn0..mn7] (kq_unpack_scales_mins in one vector), from the 12 scale
 * bytes at p, which 4 more readable bytes follow. */
static inline __m128i unpack_scales_mins_v(const uint8_t *p)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    /* low bits: a, c, b, c; top two bits of scales/mins 4..7: a, b */
    const __m128i s1 = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i s2 = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i lo = _mm_and_si128(s1, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(s1, 4), _mm_setr_epi32(0, 0, 0, 0x0F0F0F0F));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(s2, 2), _mm_set1_epi8(0x30));
    return _mm_or_si128(_mm_or_si128(lo, hi), top);
}

/* The scale bytes of a plain block, as a pointer into the whole block (16
 * bytes from its 12-byte scales[] were taken for an overread by GCC, which
 * dropped the caller). */
static inline const uint8_t *scales_of(const block_q4_K *blk)
{
    return (const uint8_t *)blk + offsetof(block_q4_K, scales);
}

/* The scales and mins of 8 rows (the 12 scale bytes of row r at
 * scales[r]) with row r in lane r: sc[s] holds scale s in both int16
 * halves, mn[k] mins 2k and 2k + 1 as int16. */
static inline void scales_mins_rows8(const uint8_t *const scales[ROW_GROUP], __m256i sc[8], __m256i mn[4])
{
    __m256i s32[ROW_GROUP], m16[ROW_GROUP], mn_t[ROW_GROUP];
    for (int r = 0; r < ROW_GROUP; r++) {
        const __m128i sm = unpack_scales_mins_v(scales[r]);
        const __m256i v = _mm256_cvtepu8_epi32(sm);
        s32[r] = _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
        m16[r] = _mm256_set_m128i(_mm_setzero_si128(), _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
    }
    transpose8_i32(s32, sc);
    transpose8_i32(m16, mn_t); /* mn_t[4..7]: the zero upper halves */
    memcpy(mn, mn_t, 4 * sizeof mn[0]);
}

/* ---- Q4_K and Q5_K tiles: TILE_ROWS rows times up to TILE_TOKENS tokens ----
 *
 * Every output gets the bits of cv_vec_dot_q4_K_q8_K_avx2 (or of _q5_K_): the
 * same whole int32 sums per super-block (exact, so formed in any order),
 * then the same two fmas per super-block in super-block order. Since a
 * super-block ends in one sum per row, the tile keeps row r in lane r:
 * for a chunk of Q45_PANEL_SB super-blocks of the 8 rows, a panel (in L1)
 * holds each group of 4 weights of the 8 rows as one vector (row r in
 * dword r, nibbles unpacked to bytes), each sub-block's 8 scales and the
 * mins in the same lanes, d and dmin. A token then meets a group with one
 * maddubs against its 4 quants broadcast, and the groups of a sub-block
 * add up in int16 before one madd applies the 8 scales: 9 multiplies per
 * 256 products where the vec_dot layout needs 16, and one fma for 8 rows.
 * The int16 sums cannot overflow: a maddubs lane is at most 2 * 31 * 128 =
 * 7936 (Q5_K; Q4_K 3840), and Q45_GROUPS_Q5 (Q4_K: all 8) of them add up
 * (interleaved_avx2.h).
 * While the tokens meet a chunk, what the tile reads next is prefetched. */

enum { Q45_PANEL_SB = 4 };
_Static_assert(TILE_ROWS == 8, "a panel vector holds a dword of each of the 8 rows");

typedef struct panel_q45_K {
    __m256i q[Q45_PANEL_SB][8][Q45_GROUPS]; /* [b][s][g]: dword r = weights 32s+4g..+3 of row r */
    __m256i sc[Q45_PANEL_SB][8];            /* [b][s]: both int16 halves of dword r = scale s of row r */
    __m256i mn[Q45_PANEL_SB][4];            /* [b][k]: dword r = mins 2k, 2k+1 of row r as int16 */
    float d[Q45_PANEL_SB][TILE_ROWS], dmin[Q45_PANEL_SB][TILE_ROWS];
} panel_q45_K;

/* Accumulators of one token, row r in lane r: vec_dot's acc and accm. */
typedef struct tile_acc_q45_K {
    __m256 acc, accm;
} tile_acc_q45_K;

/* Prefetches what the tile of the TILE_ROWS rows at w (w_stride bytes
 * apart, nb super-blocks of block_bytes) reads after the chunk [b0, b0 +
 * nbc): the next chunk of these rows, or after the last one the first chunk
 * of the next TILE_ROWS rows, which the next tile reads first (prefetches do
 * not fault past the matrix). */
static void prefetch_next_chunk(const char *w, size_t w_stride, size_t block_bytes, int b0, int nbc, int nb, int chunk)
{
    const int last = b0 + nbc == nb, left = last ? nb : nb - (b0 + nbc);
    const char *next = last ? w + TILE_ROWS * w_stride : w + (size_t)(b0 + nbc) * block_bytes;
    for (int r = 0; r < TILE_ROWS; r++)
        prefetch_lines(next + (size_t)r * w_stride, (int)block_bytes * (left < chunk ? left : chunk));
}

/* Super-blocks [b0, b0 + nbc) of the TILE_ROWS rows (of nb super-blocks)
 * into a panel; prefetches what comes next. Q4_K (q5 = 0) and Q5_K (q5 =
 * 1, the fifth bits from qh as cv_vec_dot_q5_K_q8_K_avx2 adds them; a
 * constant after inlining) share the panel and the rest of the tile. */
static inline __attribute__((always_inline)) void panel_prepare_q45(panel_q45_K *p, const char *w, size_t w_stride,
                                                                    int b0, int nbc, int nb, int q5)
{
    const size_t block_bytes = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    prefetch_next_chunk(w, w_stride, block_bytes, b0, nbc, nb, Q45_PANEL_SB);
    for (int b = 0; b < nbc; b++) {
        const block_q4_K *blk[TILE_ROWS]; /* Q4_K and Q5_K agree on d, dmin and scales */
        const uint8_t *scales[TILE_ROWS];
        __m256i lo[TILE_ROWS], hi[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) {
            blk[r] = (const block_q4_K *)(w + (size_t)r * w_stride + (size_t)(b0 + b) * block_bytes);
            scales[r] = scales_of(blk[r]);
            p->d[b][r] = _cvtsh_ss(blk[r]->d);
            p->dmin[b][r] = _cvtsh_ss(blk[r]->dmin);
        }
        scales_mins_rows8(scales, p->sc[b], p->mn[b]);
        for (int j = 0; j < 4; j++) {
            for (int r = 0; r < TILE_ROWS; r++) {
                const block_q5_K *b5 = (const block_q5_K *)blk[r];
                __m256i hb = q5 ? _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)b5->qh), 2 * j)
                                : _mm256_setzero_si256();
                unpack_q45(q5 ? b5->qs : blk[r]->qs, j, &hb, q5, &lo[r], &hi[r]);
            }
            transpose8_i32(lo, p->q[b][2 * j]);
            transpose8_i32(hi, p->q[b][2 * j + 1]);
        }
    }
}

/* Sub-block s of super-block b of the panel times the token's quants y:
 * the int32 sum of each row, row r in lane r. */
static inline __attribute__((always_inline)) __m256i panel_subblock_q45(const panel_q45_K *p, int b, int s,
                                                                        const int8_t *y, int q5)
{
    const int per_madd = q5 ? Q45_GROUPS_Q5 : Q45_GROUPS;
    __m256i sum = _mm256_setzero_si256();
    for (int g0 = 0; g0 < Q45_GROUPS; g0 += per_madd) {
        __m256i h = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = g0; g < g0 + per_madd; g++)
            h = _mm256_add_epi16(h, _mm256_maddubs_epi16(p->q[b][s][g], quads_bcast(y + 32 * s, g)));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(h, p->sc[b][s]));
    }
    return sum;
}

/* Adds super-blocks [0, nbc) of the panel times the token's super-blocks
 * x[0, nbc) to its accumulators. */
static inline __attribute__((always_inline)) void panel_token_q45(const panel_q45_K *p, int nbc,
                                                                  const block_q8_K *x, int q5, tile_acc_q45_K *a)
{
    for (int b = 0; b < nbc; b++) {
        __m256i isum = panel_subblock_q45(p, b, 0, x[b].qs, q5);
#pragma GCC unroll 1
        for (int s = 1; s < 8; s++)
            isum = _mm256_add_epi32(isum, panel_subblock_q45(p, b, s, x[b].qs, q5));
        int32_t pairs[4];
        _mm_storeu_si128((__m128i *)pairs, bsum_pairs(x[b].bsums));
        const __m256i msum = mins_rows8(p->mn[b], pairs);
        const __m256 xd = _mm256_set1_ps(x[b].d);
        a->acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(p->d[b]), xd), _mm256_cvtepi32_ps(isum), a->acc);
        a->accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(p->dmin[b]), xd), _mm256_cvtepi32_ps(msum), a->accm);
    }
}

static inline __attribute__((always_inline)) void tile_q45(int n, const void *w, size_t w_stride, const void *x,
                                                           size_t x_stride, int m, float *y, size_t ldy, int q5)
{
    const int nb = n / QK_K;
    panel_q45_K panel;
    tile_acc_q45_K acc[TILE_TOKENS];
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    for (int b0 = 0; b0 < nb; b0 += Q45_PANEL_SB) {
        const int nbc = nb - b0 < Q45_PANEL_SB ? nb - b0 : Q45_PANEL_SB;
        panel_prepare_q45(&panel, w, w_stride, b0, nbc, nb, q5);
        for (int t = 0; t < m; t++)
            panel_token_q45(&panel, nbc, token_q8_K(x, x_stride, t) + b0, q5, &acc[t]);
    }
    for (int t = 0; t < m; t++)
        _mm256_storeu_ps(y + (size_t)t * ldy, _mm256_sub_ps(acc[t].acc, acc[t].accm));
}

/* ---- Q4_K and Q5_K tiles for few tokens (batched decode) ----
 *
 * The panel costs as much to prepare as a few tokens take to meet it, so
 * for up to SMALL_TOKENS tokens (in cache 4 and 8 were faster, 16 even;
 * streamed from memory only 7 and 8 beat vec_dots: TILE_MIN_TOKENS_Q45) the
 * weights stay in registers instead: for one row and one 32-byte chunk of
 * a super-block the nibbles are unpacked once and the tokens meet them,
 * their int32 sums in registers.
 * The tile goes through the rows SMALL_SB super-blocks at a time, so that
 * those blocks of the tokens stay in L1 while the 8 rows meet them. Scales
 * and mins are unpacked per chunk for the 8 rows (to int32 words that
 * broadcast by a load alone), the tokens' d and bsum pairs per chunk for
 * the group (token t in lane t). A super-block's int32 lanes of the tokens
 * are summed into one vector, token t in lane t, which meets vec_dot's two
 * fmas: acc and accm of a row hold token t in lane t. */

enum { SMALL_SB = 4, SMALL_GROUP = 8, SMALL_TOKENS = 8 };
_Static_assert(SMALL_TOKENS == SMALL_GROUP, "the tile finishes one group");

/* Scales of a chunk of the tile's rows. */
typedef struct small_w_q45 {
    int32_t sc[SMALL_SB][TILE_ROWS][8]; /* scale of sub-block s in both 16-bit halves */
    int32_t mn[SMALL_SB][TILE_ROWS][4]; /* mins 2l and 2l + 1 as 16-bit pair l */
    float d[SMALL_SB][TILE_ROWS], dmin[SMALL_SB][TILE_ROWS];
} small_w_q45;

/* A chunk of a group of tokens: token t in lane t (0 past the group). */
typedef struct small_x_q45 {
    const int8_t *q[SMALL_SB][SMALL_GROUP]; /* quants of each token's super-block */
    __m256 xd[SMALL_SB];
    __m256i bs[SMALL_SB][4]; /* mins_dot's pair l of bsum sums */
} small_x_q45;

/* Scales, mins, d and dmin of super-blocks [b0, b0 + nbc) of the rows;
 * prefetches what comes next. Inlined early: as a separate function GCC 12
 * -O2 dropped its call (IPA mod/ref; clang and -fno-ipa-modref kept it). */
static inline __attribute__((always_inline)) void small_prepare_w_q45(small_w_q45 *p, const char *w, size_t w_stride,
                                                                      int b0, int nbc, int nb, int q5)
{
    const size_t block_bytes = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    prefetch_next_chunk(w, w_stride, block_bytes, b0, nbc, nb, SMALL_SB);
    for (int r = 0; r < TILE_ROWS; r++)
        for (int b = 0; b < nbc; b++) {
            /* Q4_K and Q5_K agree on d, dmin and scales */
            const block_q4_K *blk = (const block_q4_K *)(w + (size_t)r * w_stride + (size_t)(b0 + b) * block_bytes);
            const __m128i sm = unpack_scales_mins_v(scales_of(blk));
            const __m256i sc = _mm256_cvtepu8_epi32(sm);
            _mm256_storeu_si256((__m256i *)p->sc[b][r], _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)));
            _mm_storeu_si128((__m128i *)p->mn[b][r], _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
            p->d[b][r] = _cvtsh_ss(blk->d);
            p->dmin[b][r] = _cvtsh_ss(blk->dmin);
        }
}

/* Super-blocks [b0, b0 + nbc) of tokens [0, nt) of x into p. */
static void small_prepare_x(small_x_q45 *p, const void *x, size_t x_stride, int nt, int b0, int nbc)
{
    for (int b = 0; b < nbc; b++) {
        float xd[SMALL_GROUP] = {0};
        __m128i v[SMALL_GROUP];
        for (int t = 0; t < SMALL_GROUP; t++) {
            const block_q8_K *xb = (const block_q8_K *)((const char *)x + (size_t)(t < nt ? t : 0) * x_stride) + b0 + b;
            p->q[b][t] = xb->qs;
            xd[t] = t < nt ? xb->d : 0.0f;
            v[t] = t < nt ? bsum_pairs(xb->bsums) : _mm_setzero_si128();
        }
        p->xd[b] = _mm256_loadu_ps(xd);
        /* 8 x 4 int32 transposed: pair l of token t to lane t of bs[l] */
        __m256i a[4], u[4];
        for (int k = 0; k < 4; k++)
            a[k] = _mm256_set_m128i(v[k + 4], v[k]);
        u[0] = _mm256_unpacklo_epi32(a[0], a[1]);
        u[1] = _mm256_unpacklo_epi32(a[2], a[3]);
        u[2] = _mm256_unpackhi_epi32(a[0], a[1]);
        u[3] = _mm256_unpackhi_epi32(a[2], a[3]);
        p->bs[b][0] = _mm256_unpacklo_epi64(u[0], u[1]);
        p->bs[b][1] = _mm256_unpackhi_epi64(u[0], u[1]);
        p->bs[b][2] = _mm256_unpacklo_epi64(u[2], u[3]);
        p->bs[b][3] = _mm256_unpackhi_epi64(u[2], u[3]);
    }
}

/* One super-block of row r (blk) times the nt tokens of the group: adds
 * to acc and accm of the row, token t in lane t. */
static inline __attribute__((always_inline)) void small_block_q45(const char *blk, const small_w_q45 *pw,
                                                                  const small_x_q45 *px, int b, int r, int nt,
                                                                  int q5, __m256 *acc, __m256 *accm)
{
    const uint8_t *qs = q5 ? ((const block_q5_K *)blk)->qs : ((const block_q4_K *)blk)->qs;
    __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)((const block_q5_K *)blk)->qh) : _mm256_setzero_si256();
    __m256i isum[SMALL_GROUP];
    for (int t = 0; t < nt; t++)
        isum[t] = _mm256_setzero_si256();
    /* not unrolled: GCC then spilled the products of all four chunks */
#pragma GCC unroll 1
    for (int j = 0; j < 4; j++) {
        __m256i lo, hi;
        unpack_q45(qs, j, &hb, q5, &lo, &hi);
        const __m256i s0 = _mm256_set1_epi32(pw->sc[b][r][2 * j]), s1 = _mm256_set1_epi32(pw->sc[b][r][2 * j + 1]);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const int8_t *y = px->q[b][t] + 64 * j;
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)y)), s0);
            const __m256i p1 =
                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 32))), s1);
            isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(p0, p1));
        }
    }
    for (int t = nt; t < SMALL_GROUP; t++)
        isum[t] = _mm256_setzero_si256();
    __m256i msum = _mm256_madd_epi16(_mm256_set1_epi32(pw->mn[b][r][0]), px->bs[b][0]);
#pragma GCC unroll 3
    for (int l = 1; l < 4; l++)
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_set1_epi32(pw->mn[b][r][l]), px->bs[b][l]));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(pw->d[b][r]), px->xd[b]), _mm256_cvtepi32_ps(sums8_i32(isum)),
                           *acc);
    *accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(pw->dmin[b][r]), px->xd[b]), _mm256_cvtepi32_ps(msum), *accm);
}

/* Accumulators of a tile of few tokens: vec_dot's acc and accm of row r
 * and token 8g + t in lane t of acc[r][g], accm[r][g]. */
typedef struct small_acc_q45 {
    __m256 acc[TILE_ROWS][SMALL_TOKENS / SMALL_GROUP];
    __m256 accm[TILE_ROWS][SMALL_TOKENS / SMALL_GROUP];
} small_acc_q45;

/* The chunk's super-blocks of the 8 rows times group g of nt tokens. */
static inline __attribute__((always_inline)) void small_chunk_q45(const char *w, size_t w_stride,
                                                                  const small_w_q45 *pw, const small_x_q45 *px,
                                                                  int b0, int nbc, int g, int nt, int q5,
                                                                  small_acc_q45 *a)
{
    const size_t block_bytes = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    for (int r = 0; r < TILE_ROWS; r++)
        for (int b = 0; b < nbc; b++)
            small_block_q45(w + (size_t)r * w_stride + (size_t)(b0 + b) * block_bytes, pw, px, b, r, nt, q5,
                            &a->acc[r][g], &a->accm[r][g]);
}

/* small_chunk_q45 with nt a constant (one copy per token count), so that
 * the sums of a group stay in registers. */
static inline __attribute__((always_inline)) void small_chunk_n(const char *w, size_t w_stride, const small_w_q45 *pw,
                                                                const small_x_q45 *px, int b0, int nbc, int g,
                                                                int nt, int q5, small_acc_q45 *a)
{
#define CHUNK_TOKENS(k) small_chunk_q45(w, w_stride, pw, px, b0, nbc, g, k, q5, a)
    WITH_CONST_COUNT_8(nt, CHUNK_TOKENS)
#undef CHUNK_TOKENS
}

static void small_chunk_q4_K(const char *w, size_t w_stride, const small_w_q45 *pw, const small_x_q45 *px, int b0,
                             int nbc, int g, int nt, small_acc_q45 *a)
{
    small_chunk_n(w, w_stride, pw, px, b0, nbc, g, nt, 0, a);
}

static void small_chunk_q5_K(const char *w, size_t w_stride, const small_w_q45 *pw, const small_x_q45 *px, int b0,
                             int nbc, int g, int nt, small_acc_q45 *a)
{
    small_chunk_n(w, w_stride, pw, px, b0, nbc, g, nt, 1, a);
}

static inline __attribute__((always_inline)) void tile_small_q45(int n, const void *w, size_t w_stride,
                                                                 const void *x, size_t x_stride, int m, float *y,
                                                                 size_t ldy, int q5)
{
    const int nb = n / QK_K;
    small_w_q45 pw;
    small_x_q45 px;
    small_acc_q45 a;
    memset(&a, 0, sizeof a);
    for (int b0 = 0; b0 < nb; b0 += SMALL_SB) {
        const int nbc = nb - b0 < SMALL_SB ? nb - b0 : SMALL_SB;
        small_prepare_w_q45(&pw, w, w_stride, b0, nbc, nb, q5);
        for (int g = 0; g * SMALL_GROUP < m; g++) {
            const int nt = m - g * SMALL_GROUP < SMALL_GROUP ? m - g * SMALL_GROUP : SMALL_GROUP;
            small_prepare_x(&px, (const char *)x + (size_t)g * SMALL_GROUP * x_stride, x_stride, nt, b0, nbc);
            if (q5)
                small_chunk_q5_K(w, w_stride, &pw, &px, b0, nbc, g, nt, &a);
            else
                small_chunk_q4_K(w, w_stride, &pw, &px, b0, nbc, g, nt, &a);
        }
    }
    for (int r = 0; r < TILE_ROWS; r++) {
        float out[SMALL_TOKENS];
        _mm256_storeu_ps(out, _mm256_sub_ps(a.acc[r][0], a.accm[r][0]));
        for (int t = 0; t < m; t++)
            y[(size_t)t * ldy + (size_t)r] = out[t];
    }
}

void cv_matmul_tile_q4_K_q8_K_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy)
{
    if (m <= SMALL_TOKENS)
        tile_small_q45(n, w, w_stride, x, x_stride, m, y, ldy, 0);
    else
        tile_q45(n, w, w_stride, x, x_stride, m, y, ldy, 0);
}

void cv_matmul_tile_q5_K_q8_K_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy)
{
    if (m <= SMALL_TOKENS)
        tile_small_q45(n, w, w_stride, x, x_stride, m, y, ldy, 1);
    else
        tile_q45(n, w, w_stride, x, x_stride, m, y, ldy, 1);
}

/* ---- Q6_K tile: TILE_ROWS rows times up to TILE_TOKENS tokens ----
 *
 * Every output gets the bits of cv_vec_dot_q6_K_q8_K_avx2: the same whole
 * int32 sum per super-block (the offset of 32 taken out exactly through
 * the bsums), one fma per super-block. The panel holds each 32-weight
 * group's 6-bit quants as bytes and its two scales (one per 16 weights)
 * as 16-bit lanes, the 16 scales widened for the offset term, and d; each
 * token meets it with its quants loaded once for the 8 rows, and the 8
 * rows' sums end in the lanes of one vector. */

enum { Q6K_PANEL_SB = 4 };

typedef struct panel_q6_K {
    __m256i q[Q6K_PANEL_SB][TILE_ROWS][8];  /* quants of group g (weights 32g..32g+31) as bytes */
    __m256i sc[Q6K_PANEL_SB][TILE_ROWS][8]; /* scale 2g in the low 8 16-bit lanes, 2g + 1 in the high 8 */
    __m256i sc16[Q6K_PANEL_SB][TILE_ROWS];  /* the 16 scales as int16 */
    float d[Q6K_PANEL_SB][TILE_ROWS];       /* d of each row */
} panel_q6_K;

/* As panel_prepare_q45, for Q6_K. */
static void panel_prepare_q6_K(panel_q6_K *p, const char *w, size_t w_stride, int b0, int nbc, int nb)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    prefetch_next_chunk(w, w_stride, sizeof(block_q6_K), b0, nbc, nb, Q6K_PANEL_SB);
    for (int r = 0; r < TILE_ROWS; r++) {
        const block_q6_K *row = (const block_q6_K *)(w + (size_t)r * w_stride);
        for (int b = 0; b < nbc; b++) {
            const block_q6_K *blk = &row[b0 + b];
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
                __m256i *q = p->q[b][r] + 4 * h;
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            }
            for (int g = 0; g < 8; g++)
                p->sc[b][r][g] =
                    _mm256_set_m128i(_mm_set1_epi16(blk->scales[2 * g + 1]), _mm_set1_epi16(blk->scales[2 * g]));
            p->sc16[b][r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
            p->d[b][r] = _cvtsh_ss(blk->d);
        }
    }
}

/* As panel_token_q45_K, for Q6_K; a holds row r's acc in lane r. */
static void panel_token_q6_K(const panel_q6_K *p, int nbc, const block_q8_K *x, __m256 *a)
{
    for (int b = 0; b < nbc; b++) {
        /* the offset of 32, taken out exactly first, as vec_dot does */
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        __m256i isum[TILE_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < TILE_ROWS; r++)
            isum[r] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(p->sc16[b][r], bsums), 5));
        for (int g = 0; g < 8; g++) {
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * g));
#pragma GCC unroll 8
            for (int r = 0; r < TILE_ROWS; r++)
                isum[r] = _mm256_add_epi32(isum[r],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(p->q[b][r][g], yv), p->sc[b][r][g]));
        }
        const __m256 dx = _mm256_mul_ps(_mm256_set1_ps(x[b].d), _mm256_loadu_ps(p->d[b]));
        *a = _mm256_fmadd_ps(dx, _mm256_cvtepi32_ps(sums8_i32(isum)), *a);
    }
}

void cv_matmul_tile_q6_K_q8_K_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy)
{
    const int nb = n / QK_K;
    panel_q6_K panel;
    __m256 acc[TILE_TOKENS];
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    for (int b0 = 0; b0 < nb; b0 += Q6K_PANEL_SB) {
        const int nbc = nb - b0 < Q6K_PANEL_SB ? nb - b0 : Q6K_PANEL_SB;
        panel_prepare_q6_K(&panel, w, w_stride, b0, nbc, nb);
        for (int t = 0; t < m; t++)
            panel_token_q6_K(&panel, nbc, token_q8_K(x, x_stride, t) + b0, &acc[t]);
    }
    for (int t = 0; t < m; t++)
        _mm256_storeu_ps(y + (size_t)t * ldy, acc[t]);
}
