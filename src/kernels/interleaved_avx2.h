/* interleaved_avx2.h: what the AVX2 and AVX-512 interleaved kernels
 * (kernels_impl.h: groups of 8 rows) share, written with AVX2 (private to
 * src/kernels; for files built with at least -mavx2 -mfma -mf16c).
 *
 * Contract:
 * - kx8_block_at(w, q5, i) views super-block i of an interleaved Q4_K
 *   (q5 = 0) or Q5_K matrix by the fields the two layouts share.
 * - kx8_scales_mins returns the 64 six-bit scales of an interleaved Q4_K
 *   or Q5_K super-block (its scale_lo and scale_hi) in sc (byte i of
 *   sc[0] is index i, of sc[1] index 32 + i) and its 64 mins in mn the
 *   same way, each by its index in the block (scale s of row r: 8s + r;
 *   min s of row r: 16(s/2) + 2r + s%2).
 * - token_sums_q4_0_prepare forms, for nt tokens of nb Q8_0 blocks, what
 *   a Q4_0 (or IQ4_NL) product takes per token and block besides the
 *   quants: the sum of the block's quants shifted left by shift (Q4_0: 3,
 *   the offset of 8 of the weights; IQ4_NL: 7, the 128 of its unsigned
 *   values) and its scale. A pass of a kernel holds X8_TOKEN_BLOCKS of
 *   them. */
#ifndef CONVOY_KERNELS_INTERLEAVED_AVX2_H
#define CONVOY_KERNELS_INTERLEAVED_AVX2_H

#include <immintrin.h>

#include "kernels/avx2_impl.h"
#include "kernels/kernels_impl.h"

/* Super-block i of an interleaved Q4_K (qh NULL) or Q5_K matrix: the
 * fields the two layouts share, and Q5_K's fifth bits. */
typedef struct kx8_block {
    const cv_fp16 *d, *dmin;
    const uint8_t *scale_lo, *scale_hi;
    const uint8_t (*qs)[32], (*qh)[32];
    size_t bytes;
} kx8_block;

static inline __attribute__((always_inline)) kx8_block kx8_block_at(const void *w, int q5, long i)
{
    if (q5) {
        const block_q5_Kx8 *b = (const block_q5_Kx8 *)w + i;
        return (kx8_block){b->d, b->dmin, b->scale_lo, b->scale_hi, b->qs, b->qh, sizeof *b};
    }
    const block_q4_Kx8 *b = (const block_q4_Kx8 *)w + i;
    return (kx8_block){b->d, b->dmin, b->scale_lo, b->scale_hi, b->qs, NULL, sizeof *b};
}

static inline void kx8_scales_mins(const uint8_t scale_lo[64], const uint8_t scale_hi[32], __m256i sc[2],
                                   __m256i mn[2])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)scale_lo);
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(scale_lo + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)scale_hi);
    /* the top bits of index i and i + 32 share a byte of h, each moved to
     * bits 4-5 */
    sc[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    sc[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(h, m30));
    mn[0] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                            _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
}

enum { X8_TOKEN_BLOCKS = 4096 };
_Static_assert(X8_TOKEN_BLOCKS >= INTERLEAVE_MAX_IN / QK4_0, "a pass holds at least one token");

typedef struct token_sums_q4_0 {
    int32_t yoff[X8_TOKEN_BLOCKS]; /* [t * nb + b]: the sum of token t's block b << shift */
    float xd[X8_TOKEN_BLOCKS];      /* [t * nb + b]: its scale */
} token_sums_q4_0;

static inline void token_sums_q4_0_prepare(const void *x, size_t x_stride, int nt, int nb, int shift,
                                           token_sums_q4_0 *ts)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int t = 0; t < nt; t++) {
        const block_q8_0 *xb = token_q8_0(x, x_stride, t);
        for (int b0 = 0; b0 < nb; b0 += 8) {
            __m256i v[8];
            for (int k = 0; k < 8; k++)
                v[k] = b0 + k < nb ? _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_loadu_si256(
                                                                                   (const __m256i *)xb[b0 + k].qs)),
                                                       ones16)
                                   : _mm256_setzero_si256();
            int32_t sums[8];
            _mm256_storeu_si256((__m256i *)sums, _mm256_sll_epi32(sums8_i32(v), _mm_cvtsi32_si128(shift)));
            for (int k = 0; k < 8 && b0 + k < nb; k++) {
                ts->yoff[t * nb + b0 + k] = sums[k];
                ts->xd[t * nb + b0 + k] = _cvtsh_ss(xb[b0 + k].d);
            }
        }
    }
}

#endif
