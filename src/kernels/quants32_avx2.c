/* quants32_avx2.c: the Q5_0, Q5_1, IQ4_NL, IQ4_XS and MXFP4 dot products with AVX2+FMA+F16C
 * (x86-64; built with -mavx2 -mfma -mf16c, called only when
 * cv_kernels_init found those features).
 *
 * They follow cv_vec_dot_q4_0_q8_0_avx2: the exact int32 sums of 8 blocks
 * (one vector of 8 lanes each, summed by sums8_i32), their scales
 * multiplied in one vector, one fma into the 8-lane accumulator, hsum8 at
 * the end; Q5_1 then adds its minimum times the activation sums with a
 * second fma, as kernels_impl.h says. The block sums are exact:
 * - Q5_0: maddubs(q, y) - maddubs(16, y), q the unsigned 5-bit quant: pair
 *   sums of at most 2 * 31 * 128, no saturation for any int8 y.
 * - Q5_1: maddubs(q, y).
 * - IQ4_NL: the table values k (-127..113) by a byte shuffle, then
 *   maddubs(|y|, sign(k, y)): |y| is unsigned (128 for -128), and -k never
 *   overflows, so pairs stay within 2 * 128 * 127.
 * - MXFP4: the same with its table (-12..12); its scales 2^(e - 128) are
 *   made from the exponents' bits (mxfp4_scales8).
 * IQ4_XS takes IQ4_NL's pair sums of each sub-block, times its scale
 * ls - 32 by the madd, adds them in int32 and ends each super-block with
 * one scalar fma, as kernels_impl.h says. */
#include <immintrin.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/kernels_impl.h"
#include "kernels/quants32.h"

enum { KIND_Q5_0, KIND_Q5_1, KIND_IQ4_NL, KIND_MXFP4 };

/* Byte j is 16 where bit j of a Q5 block's qh is set, else 0. */
static inline __m256i fifth_bits(const uint8_t qh[4])
{
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    /* byte j takes byte j / 8 of qh, then tests its bit j % 8 */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                                2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i mask = _mm256_set1_epi64x(0x8040201008040201ll);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(16));
}

/* The int16 pair sums of the 32 values of the nibbles of qs (Q4_0's
 * order; nibble q is values[q], IQ4_NL's or MXFP4's table) times the 32
 * int8 quants y. */
static inline __m256i table_pairs(const int8_t values[16], const uint8_t qs[16], const int8_t y[32])
{
    const __m256i yv = _mm256_loadu_si256((const __m256i *)y);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
    const __m256i k = _mm256_shuffle_epi8(table, unpack_q4_0(qs));
    return _mm256_maddubs_epi16(_mm256_abs_epi8(yv), _mm256_sign_epi8(k, yv));
}

/* Lane l: the sum over elements 4l..4l+3 of block b's products. */
static inline __attribute__((always_inline)) __m256i block_lanes(const void *w, const void *x, int b, int kind)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == KIND_Q5_0) {
        const block_q5_0 *wb = (const block_q5_0 *)w + b;
        const __m256i y = _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)x)[b].qs);
        const __m256i q = _mm256_or_si256(unpack_q4_0(wb->qs), fifth_bits(wb->qh));
        const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y),
                                               _mm256_maddubs_epi16(_mm256_set1_epi8(16), y));
        return _mm256_madd_epi16(pairs, ones);
    }
    if (kind == KIND_Q5_1) {
        const block_q5_1 *wb = (const block_q5_1 *)w + b;
        const __m256i y = _mm256_loadu_si256((const __m256i *)((const block_q8_1 *)x)[b].qs);
        const __m256i q = _mm256_or_si256(unpack_q4_0(wb->qs), fifth_bits(wb->qh));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
    }
    if (kind == KIND_MXFP4)
        return _mm256_madd_epi16(table_pairs(cv_kvalues_mxfp4, ((const block_mxfp4 *)w)[b].qs,
                                             ((const block_q8_0 *)x)[b].qs), ones);
    return _mm256_madd_epi16(table_pairs(cv_kvalues_iq4nl, ((const block_iq4_nl *)w)[b].qs,
                                         ((const block_q8_0 *)x)[b].qs), ones);
}

/* The scales (fp16) of a block pair: weight d and m, activation d and s
 * (m and s: Q5_1 only; MXFP4's weight scale is its exponent, blocks8). */
static inline __attribute__((always_inline)) void block_scales(const void *w, const void *x, int b, int kind,
                                                               cv_fp16 h[4])
{
    if (kind == KIND_Q5_1) {
        const block_q5_1 *wb = (const block_q5_1 *)w + b;
        const block_q8_1 *xb = (const block_q8_1 *)x + b;
        h[0] = wb->d, h[1] = wb->m, h[2] = xb->d, h[3] = xb->s;
        return;
    }
    h[0] = kind == KIND_Q5_0     ? ((const block_q5_0 *)w)[b].d
           : kind == KIND_IQ4_NL ? ((const block_iq4_nl *)w)[b].d
                                 : 0;
    h[1] = 0;
    h[2] = ((const block_q8_0 *)x)[b].d;
    h[3] = 0;
}

/* Blocks [b0, b0 + nbk) (nbk <= 8) into the accumulator, block b0 + k in
 * lane k. Past nbk a lane adds 0 * 0, which leaves it as it is (an
 * accumulator is never -0). */
static inline __attribute__((always_inline)) __m256 blocks8(const void *w, const void *x, int b0, int nbk, int kind,
                                                            __m256 acc)
{
    __m256i lanes[8];
    cv_fp16 wd[8] = {0}, wm[8] = {0}, xd[8] = {0}, xs[8] = {0};
    uint8_t we[8] = {0};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        if (k < nbk) {
            cv_fp16 h[4];
            lanes[k] = block_lanes(w, x, b0 + k, kind);
            block_scales(w, x, b0 + k, kind, h);
            wd[k] = h[0], wm[k] = h[1], xd[k] = h[2], xs[k] = h[3];
            if (kind == KIND_MXFP4)
                we[k] = ((const block_mxfp4 *)w)[b0 + k].e;
        } else {
            lanes[k] = _mm256_setzero_si256();
        }
    }
    const __m256 wscale =
        kind == KIND_MXFP4 ? mxfp4_scales8(we) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wd));
    const __m256 d = _mm256_mul_ps(wscale, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xd)));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums8_i32(lanes)), acc);
    if (kind == KIND_Q5_1)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wm)),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xs)), acc);
    return acc;
}

static inline __attribute__((always_inline)) float vec_dot_32(int n, const void *w, const void *x, int kind)
{
    const size_t block_bytes = kind == KIND_Q5_0     ? sizeof(block_q5_0)
                               : kind == KIND_Q5_1   ? sizeof(block_q5_1)
                               : kind == KIND_IQ4_NL ? sizeof(block_iq4_nl)
                                                     : sizeof(block_mxfp4);
    const int nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        prefetch_lines((const char *)w + (size_t)b0 * block_bytes + VEC_DOT_PREFETCH_BYTES, (int)(8 * block_bytes));
        acc = nb - b0 >= 8 ? blocks8(w, x, b0, 8, kind, acc) : blocks8(w, x, b0, nb - b0, kind, acc);
    }
    return hsum8(acc);
}

float cv_vec_dot_q5_0_q8_0_avx2(int n, const void *w, const void *x)
{
    return vec_dot_32(n, w, x, KIND_Q5_0);
}

float cv_vec_dot_q5_1_q8_1_avx2(int n, const void *w, const void *x)
{
    return vec_dot_32(n, w, x, KIND_Q5_1);
}

float cv_vec_dot_iq4_nl_q8_0_avx2(int n, const void *w, const void *x)
{
    return vec_dot_32(n, w, x, KIND_IQ4_NL);
}

float cv_vec_dot_mxfp4_q8_0_avx2(int n, const void *w, const void *x)
{
    return vec_dot_32(n, w, x, KIND_MXFP4);
}

float cv_vec_dot_iq4_xs_q8_K_avx2(int n, const void *vw, const void *vx)
{
    const block_iq4_xs *w = vw;
    const block_q8_K *x = vx;
    float acc = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_lines((const char *)&w[i] + KQUANT_PREFETCH_BYTES, (int)sizeof w[i]);
        __m256i sum = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const __m256i scale = _mm256_set1_epi16((short)(iq4_xs_scale(&w[i], ib) - 32));
            const __m256i pairs = table_pairs(cv_kvalues_iq4nl, w[i].qs + 16 * ib, x[i].qs + 32 * ib);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        acc = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(x[i].d * _cvtsh_ss(w[i].d)),
                                         _mm_set_ss((float)_mm_cvtsi128_si32(s4)), _mm_set_ss(acc)));
    }
    return acc;
}
