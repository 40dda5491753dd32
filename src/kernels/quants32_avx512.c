/* quants32_avx512.c: the MXFP4 and IQ4_XS dot products with AVX-512 VNNI,
 * for the CPUs that have it (AVX512F, BW, VL and VNNI).
 *
 * It gives cv_vec_dot_mxfp4_q8_0_avx2's bits, and so cv_vec_dot_mxfp4_q8_0_ref's:
 * the same exact int32 sum of each block, then the same scales, fma and
 * hsum8 on the schedule of kernels_impl.h, 8 blocks at a time.
 *
 * What changes is how a block's sum is formed. A vector holds two blocks,
 * and vpdpbusd takes an unsigned byte times a signed one, 4 products into
 * each int32 lane, where AVX2 needs the sign trick (abs, sign), a
 * maddubs and a madd for one block. The unsigned bytes are the table
 * values plus 12 (0..24, one byte shuffle): s = sum((k + 12) * y) -
 * sum(12 * y), two vpdpbusd and a subtraction, exact in int32.
 *
 * IQ4_XS the same way, two sub-blocks per vector with IQ4_NL's values plus
 * 128: each lane's sum times its sub-block's scale ls - 32 (vpmulld), all
 * added in int32 to the super-block's exact sum, then the AVX2 kernel's
 * scalar fma: the bits of cv_vec_dot_iq4_xs_q8_K_ref. */
#include <immintrin.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/avx512_impl.h"
#include "kernels/kernels_impl.h"
#include "kernels/quants32.h"

/* The 64 nibbles of two blocks in Q4_0's order (block a's 16 bytes in
 * the low half of packed, b's in the high) as bytes 0..15 in element
 * order: 128-bit lanes hold a's bytes twice, then b's, the high nibbles
 * (elements 16..31) shifted down in lanes 1 and 3. */
static inline __m512i nibbles_x2(__m256i packed)
{
    const __m512i q = _mm512_shuffle_i64x2(_mm512_castsi256_si512(packed), _mm512_castsi256_si512(packed),
                                           _MM_SHUFFLE(1, 1, 0, 0));
    return _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4), _mm512_set1_epi8(15));
}

/* Lane l: the sum of elements 4l..4l+3 of (u - offset) * y, u unsigned. */
static inline __m512i dot_offset(__m512i u, __m512i y, __m512i offset)
{
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, y));
}

/* Lanes 0..7: block b's products summed 4 at a time; lanes 8..15: block
 * b + 1's. */
static inline __m512i pair_lanes(const block_mxfp4 *w, const block_q8_0 *x, int b, __m512i table, __m512i twelve)
{
    const __m256i packed = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)w[b + 1].qs),
                                            _mm_loadu_si128((const __m128i *)w[b].qs));
    const __m512i u = _mm512_shuffle_epi8(table, nibbles_x2(packed));
    return dot_offset(u, load_pair(x[b].qs, x[b + 1].qs), twelve);
}

/* Blocks [0, 8) of w and x into the accumulator, block k in lane k. */
static inline __m256 blocks8(const block_mxfp4 *w, const block_q8_0 *x, __m512i table, __m512i twelve, __m256 acc)
{
    __m256i lanes[8];
    uint8_t e[8];
    cv_fp16 xd[8];
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
        const __m512i v = pair_lanes(w, x, k, table, twelve);
        lanes[k] = _mm512_castsi512_si256(v);
        lanes[k + 1] = _mm512_extracti64x4_epi64(v, 1);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        e[k] = w[k].e;
        xd[k] = x[k].d;
    }
    const __m256 d = _mm256_mul_ps(mxfp4_scales8(e), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xd)));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums8_i32(lanes)), acc);
}

float cv_vec_dot_mxfp4_q8_0_avx512(int n, const void *vw, const void *vx)
{
    const block_mxfp4 *w = vw;
    const block_q8_0 *x = vx;
    const __m512i twelve = _mm512_set1_epi8(12);
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cv_kvalues_mxfp4));
    const __m512i table = _mm512_add_epi8(values, twelve);
    const int nb = n / QK_MXFP4, whole = nb - nb % 8;
    __m256 acc = _mm256_setzero_ps();
    for (int b0 = 0; b0 < whole; b0 += 8) {
        prefetch_lines((const char *)(w + b0) + VEC_DOT_PREFETCH_BYTES, (int)(8 * sizeof *w));
        acc = blocks8(w + b0, x + b0, table, twelve, acc);
    }
    if (whole < nb) {
        /* the last blocks, padded with zero blocks: a zero block adds
         * 0 * 0 to its lane, which leaves it as it is (an accumulator is
         * never -0) */
        block_mxfp4 wt[8];
        block_q8_0 xt[8];
        memset(wt, 0, sizeof wt);
        memset(xt, 0, sizeof xt);
        memcpy(wt, w + whole, (size_t)(nb - whole) * sizeof *w);
        memcpy(xt, x + whole, (size_t)(nb - whole) * sizeof *x);
        acc = blocks8(wt, xt, table, twelve, acc);
    }
    return hsum8(acc);
}

float cv_vec_dot_iq4_xs_q8_K_avx512(int n, const void *vw, const void *vx)
{
    const block_iq4_xs *w = vw;
    const block_q8_K *x = vx;
    const __m512i offset = _mm512_set1_epi8((char)128);
    /* k + 128 as unsigned bytes: k with its top bit flipped */
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)cv_kvalues_iq4nl));
    const __m512i table = _mm512_xor_si512(values, offset);
    float acc = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_lines((const char *)&w[i] + KQUANT_PREFETCH_BYTES, (int)sizeof w[i]);
        __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int ib = 0; ib < QK_K / 32; ib += 2) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(w[i].qs + 16 * ib));
            const __m512i u = _mm512_shuffle_epi8(table, nibbles_x2(packed));
            const __m512i lanes = dot_offset(u, _mm512_loadu_si512(x[i].qs + 32 * ib), offset);
            const __m512i scale = _mm512_inserti64x4(_mm512_set1_epi32(iq4_xs_scale(&w[i], ib) - 32),
                                                     _mm256_set1_epi32(iq4_xs_scale(&w[i], ib + 1) - 32), 1);
            sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(lanes, scale));
        }
        const int32_t isum = _mm512_reduce_add_epi32(sum);
        acc = _mm_cvtss_f32(
            _mm_fmadd_ss(_mm_set_ss(x[i].d * _cvtsh_ss(w[i].d)), _mm_set_ss((float)isum), _mm_set_ss(acc)));
    }
    return acc;
}
