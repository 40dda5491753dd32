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
 * - The nibble types (Q4_0, IQ4_NL, MXFP4) share their interleaved
 *   quants (block_q4_0x8, block_mxfp4x8): nib_qs is block b's, nib_scales8
 *   its 8 rows' scales (fp16 d, or 2^(e - 128)), nib_offset what makes a
 *   nibble's value unsigned (Q4_0: q - 8 + 8; IQ4_NL, MXFP4: the table
 *   value plus 128 or 12, nib_table_u).
 * - mins_rows8 sums the mins of 8 rows of a Q4_K or Q5_K super-block
 *   with a token's.
 * - token_sums_q4_0_prepare forms, for nt tokens of nb Q8_0 blocks, what
 *   a nibble type's product takes per token and block besides the
 *   quants: the sum of the block's quants times offset (nib_offset) and
 *   its scale. A pass of a kernel holds X8_TOKEN_BLOCKS of them. */
#ifndef CONVOY_KERNELS_INTERLEAVED_AVX2_H
#define CONVOY_KERNELS_INTERLEAVED_AVX2_H

#include <immintrin.h>

#include "kernels/avx2_impl.h"
#include "kernels/kernels_impl.h"
#include "kernels/quants32.h"

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

/* Groups of 4 weights whose maddubs lanes a sub-block sums in int16
 * before a madd applies its scales: a lane is at most 2 * 15 * 128
 * (Q4_K) or 2 * 31 * 128 (Q5_K). */
enum { Q45_GROUPS = 8, Q45_GROUPS_Q5 = 4 };
_Static_assert(Q45_GROUPS * 2 * 15 * 128 <= INT16_MAX && Q45_GROUPS_Q5 * 2 * 31 * 128 <= INT16_MAX,
               "int16 group sums of a sub-block");

/* The mins sums of 8 rows (mn as kquants_avx2.c's scales_mins_rows8
 * forms them, row r in lane r) with a token's super-block, whose bsum
 * pairs (bsum_pairs) are stored at pairs: mins_dot of each row. Dword k holds the int16 bsum sums of
 * sub-blocks 2k and 2k + 1, which meet mn[k]. */
static inline __m256i mins_rows8(const __m256i mn[4], const int32_t pairs[4])
{
    __m256i msum = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(pairs[0]));
    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mn[1], _mm256_set1_epi32(pairs[1])));
    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mn[2], _mm256_set1_epi32(pairs[2])));
    return _mm256_add_epi32(msum, _mm256_madd_epi16(mn[3], _mm256_set1_epi32(pairs[3])));
}

enum nibble_kind { NIB_Q4_0, NIB_IQ4_NL, NIB_MXFP4 };

static inline __attribute__((always_inline)) size_t nib_block_bytes(int kind)
{
    return kind == NIB_MXFP4 ? sizeof(block_mxfp4x8) : sizeof(block_q4_0x8);
}

static inline __attribute__((always_inline)) const uint8_t (*nib_qs(const void *group, long b, int kind))[32]
{
    if (kind == NIB_MXFP4)
        return ((const block_mxfp4x8 *)group)[b].qs;
    return ((const block_q4_0x8 *)group)[b].qs;
}

static inline __attribute__((always_inline)) __m256 nib_scales8(const void *group, long b, int kind)
{
    if (kind == NIB_MXFP4)
        return mxfp4_scales8(((const block_mxfp4x8 *)group)[b].e);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const block_q4_0x8 *)group)[b].d));
}

static inline __attribute__((always_inline)) int nib_offset(int kind)
{
    return kind == NIB_Q4_0 ? 8 : kind == NIB_IQ4_NL ? 128 : 12;
}

/* The 16 nibble values plus nib_offset (Q4_0: q itself; IQ4_NL: 0..241;
 * MXFP4: 0..24), for a byte shuffle. */
static inline __m128i nib_table_u(int kind)
{
    if (kind == NIB_Q4_0)
        return _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m128i k = _mm_loadu_si128((const __m128i *)(kind == NIB_IQ4_NL ? cv_kvalues_iq4nl : cv_kvalues_mxfp4));
    return _mm_add_epi8(k, _mm_set1_epi8((char)nib_offset(kind)));
}

enum { X8_TOKEN_BLOCKS = 4096 };
_Static_assert(X8_TOKEN_BLOCKS >= INTERLEAVE_MAX_IN / QK4_0, "a pass holds at least one token");

typedef struct token_sums_q4_0 {
    int32_t yoff[X8_TOKEN_BLOCKS]; /* [t * nb + b]: the sum of token t's block b times the offset */
    float xd[X8_TOKEN_BLOCKS];      /* [t * nb + b]: its scale */
} token_sums_q4_0;

static inline void token_sums_q4_0_prepare(const void *x, size_t x_stride, int nt, int nb, int offset,
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
            _mm256_storeu_si256((__m256i *)sums, _mm256_mullo_epi32(sums8_i32(v), _mm256_set1_epi32(offset)));
            for (int k = 0; k < 8 && b0 + k < nb; k++) {
                ts->yoff[t * nb + b0 + k] = sums[k];
                ts->xd[t * nb + b0 + k] = _cvtsh_ss(xb[b0 + k].d);
            }
        }
    }
}

#endif
