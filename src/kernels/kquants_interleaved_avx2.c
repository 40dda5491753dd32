/* kquants_interleaved_avx2.c: the Q4_K, Q5_K and Q6_K products of
 * interleaved matrices (kernels_impl.h: groups of 8 rows, block b of the 8
 * rows side by side) with AVX2, FMA and F16C, for any number of tokens.
 * Each output gets the bits of its type's vec_dot (kquants_avx2.c, and so
 * kquants.c's _ref); kquants_avx512.c runs two groups at a time with the
 * same bits. */
#include <immintrin.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/interleaved_avx2.h"
#include "kernels/kernels_impl.h"
#include "kernels/kquants.h"
#include "kernels/kquants_impl.h"

/* ---- Q4_K and Q5_K interleaved (kernels_impl.h): groups of 8 rows, any tokens ----
 *
 * Every output gets the bits of cv_vec_dot_q4_K_q8_K_avx2 (or _q5_K_), as in
 * its tile (kquants_avx2.c): row r in lane r, a group of 4 weights of the 8 rows
 * against a token's 4 quants broadcast, the groups of a sub-block summed
 * in int16 (Q5_K: 4 at a time), one madd with the 8 scales, the same two
 * fmas per super-block. The quants are read as they are stored, so a
 * super-block of a group is unpacked once (its scales and mins) and met
 * by the tokens, a few at a time with their int16 sums in registers. One
 * token (decode) reads the group at the memory's pace; more share each
 * load of it. */

/* Each token's bsum pairs (bsum_pairs), formed once per pass over the
 * groups for all their mins (in cache: 1 token +7%, 8 tokens +4%); a pass
 * holds KX8_PASS_BLOCKS super-blocks of them (8192-wide rows: 32 tokens). */
enum { KX8_PASS_BLOCKS = 1024 };
_Static_assert(KX8_PASS_BLOCKS >= INTERLEAVE_MAX_IN / QK_K, "a pass holds at least one token");

/* Tokens met at a time over a super-block. Q4_K's sums of 8 spill out of
 * the 16 registers (8 tokens: -4%, 64: -5% against 4); Q5_K would unpack
 * its fifth bits twice (4 tokens a pass: -2 to -4% against 8). */
enum { KX8_MAX_TOKENS = 8 };
static inline int kx8_tokens(int q5)
{
    return q5 ? 8 : 4;
}

/* A super-block of the 8 rows: its scales and mins as scales_mins_rows8
 * forms them, d and dmin. */
typedef struct scales_kx8 {
    __m256i sc[8], mn[4];
    __m256 d, dmin;
} scales_kx8;

static inline void scales_kx8_prepare(const kx8_block *blk, scales_kx8 *p)
{
    __m256i sc[2], mn[2];
    kx8_scales_mins(blk->scale_lo, blk->scale_hi, sc, mn);
    const uint8_t *scb = (const uint8_t *)sc, *mnb = (const uint8_t *)mn;
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) { /* bytes 8s..8s+7: scale s of rows 0..7 */
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(scb + 8 * s)));
        p->sc[s] = _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* bytes 16k..16k+15: mins 2k, 2k + 1 of rows 0..7 */
        p->mn[k] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(mnb + 16 * k)));
    p->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
    p->dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->dmin));
}

/* Bit g of each byte of the fifth bits h of a sub-block (group g's) at
 * bit 4, where a quant takes it. The 16-bit shifts move no other byte's
 * bit there. */
static inline __attribute__((always_inline)) __m256i fifth_bits(__m256i h, int g)
{
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    if (g < 4)
        return _mm256_and_si256(_mm256_slli_epi16(h, 4 - g), bit4);
    return _mm256_and_si256(g > 4 ? _mm256_srli_epi16(h, g - 4) : h, bit4);
}

/* Super-block blk of the 8 rows times the super-blocks xb[0, nt) of nt
 * <= kx8_tokens(q5) tokens, their bsum pairs at pairs[t]: adds to acc[t]
 * and accm[t] (row r in lane r). */
static inline __attribute__((always_inline)) void tokens_kx8(const kx8_block *blk, int q5, const scales_kx8 *p,
                                                             const block_q8_K *const xb[KX8_MAX_TOKENS],
                                                             const int32_t *const pairs[KX8_MAX_TOKENS], int nt,
                                                             __m256 *acc, __m256 *accm)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int groups = q5 ? Q45_GROUPS_Q5 : Q45_GROUPS; /* summed in int16 before a madd */
    __m256i isum[KX8_MAX_TOKENS];
    for (int t = 0; t < nt; t++) {
        isum[t] = _mm256_setzero_si256();
        KEEP_IN_REGISTER(isum[t]); /* not a memset: rep stos cost 6% at 8 tokens */
    }
    /* the 4 chunks not unrolled, their two sub-blocks unrolled */
#pragma GCC unroll 1
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) { /* sub-block 2j + half: the low nibbles, then the high */
            const int s = 2 * j + half;
            __m256i h[KX8_MAX_TOKENS];
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m256i v = load_packed(blk->qs[8 * j + g]);
                __m256i q = _mm256_and_si256(half ? _mm256_srli_epi16(v, 4) : v, m4);
                if (q5)
                    q = _mm256_or_si256(q, fifth_bits(_mm256_loadu_si256((const __m256i *)blk->qh[s]), g));
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const __m256i prod = _mm256_maddubs_epi16(q, quads_bcast(xb[t]->qs + 32 * s, g));
                    h[t] = g % groups ? _mm256_add_epi16(h[t], prod) : prod;
                    KEEP_IN_REGISTER(h[t]);
                }
                if (g % groups == groups - 1)
#pragma GCC unroll 8
                    for (int t = 0; t < nt; t++)
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(h[t], p->sc[s]));
            }
        }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        const __m256 xd = _mm256_set1_ps(xb[t]->d);
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(p->d, xd), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(p->dmin, xd), _mm256_cvtepi32_ps(mins_rows8(p->mn, pairs[t])),
                                  accm[t]);
    }
}

/* tokens_kx8 with nt a constant, so that the sums stay in registers. */
static void tokens_q4_Kx8_n(const kx8_block *blk, const scales_kx8 *p, const block_q8_K *const xb[KX8_MAX_TOKENS],
                            const int32_t *const pairs[KX8_MAX_TOKENS], int nt, __m256 *acc, __m256 *accm)
{
#define X8_TOKENS(k) tokens_kx8(blk, 0, p, xb, pairs, k, acc, accm)
    WITH_CONST_COUNT_4(nt, X8_TOKENS)
#undef X8_TOKENS
}

static void tokens_q5_Kx8_n(const kx8_block *blk, const scales_kx8 *p, const block_q8_K *const xb[KX8_MAX_TOKENS],
                            const int32_t *const pairs[KX8_MAX_TOKENS], int nt, __m256 *acc, __m256 *accm)
{
#define X8_TOKENS(k) tokens_kx8(blk, 1, p, xb, pairs, k, acc, accm)
    WITH_CONST_COUNT_8(nt, X8_TOKENS)
#undef X8_TOKENS
}

/* The groups times tokens [0, nt) (nt * nb <= KX8_PASS_BLOCKS). */
static inline __attribute__((always_inline)) void pass_kx8(int q5, int nb, const void *w, long n_groups,
                                                           const void *x, size_t x_stride, int nt, float *y,
                                                           size_t ldy)
{
    int32_t pairs[KX8_PASS_BLOCKS][4]; /* [t * nb + i]: token t's super-block i */
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < nb; i++)
            _mm_storeu_si128((__m128i *)pairs[t * nb + i], bsum_pairs(token_q8_K(x, x_stride, t)[i].bsums));
    __m256 acc[TILE_TOKENS], accm[TILE_TOKENS];
    for (long g = 0; g < n_groups; g++) {
        memset(acc, 0, (size_t)nt * sizeof acc[0]);
        memset(accm, 0, (size_t)nt * sizeof accm[0]);
        for (int i = 0; i < nb; i++) {
            const kx8_block blk = kx8_block_at(w, q5, g * nb + i);
            prefetch_lines((const char *)blk.d + INTERLEAVED_PREFETCH_BYTES, blk.bytes);
            scales_kx8 p;
            scales_kx8_prepare(&blk, &p);
            for (int t0 = 0; t0 < nt; t0 += kx8_tokens(q5)) {
                const int k = nt - t0 < kx8_tokens(q5) ? nt - t0 : kx8_tokens(q5);
                const block_q8_K *xb[KX8_MAX_TOKENS];
                const int32_t *xp[KX8_MAX_TOKENS];
                for (int t = 0; t < k; t++) {
                    xb[t] = token_q8_K(x, x_stride, t0 + t) + i;
                    xp[t] = pairs[(t0 + t) * nb + i];
                }
                if (q5)
                    tokens_q5_Kx8_n(&blk, &p, xb, xp, k, acc + t0, accm + t0);
                else
                    tokens_q4_Kx8_n(&blk, &p, xb, xp, k, acc + t0, accm + t0);
            }
        }
        for (int t = 0; t < nt; t++)
            _mm256_storeu_ps(y + (size_t)t * ldy + (size_t)(ROW_GROUP * g), _mm256_sub_ps(acc[t], accm[t]));
    }
}

static inline __attribute__((always_inline)) void matmul_kx8(int q5, int n, const void *w, long n_groups,
                                                             const void *x, size_t x_stride, int m, float *y,
                                                             size_t ldy)
{
    const int nb = n / QK_K;
    const int per_pass = KX8_PASS_BLOCKS / nb;
    for (int t0 = 0; t0 < m; t0 += per_pass) {
        const int nt = m - t0 < per_pass ? m - t0 : per_pass;
        pass_kx8(q5, nb, w, n_groups, token_q8_K(x, x_stride, t0), x_stride, nt, y + (size_t)t0 * ldy, ldy);
    }
}

void cv_matmul_interleaved_q4_K_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy)
{
    matmul_kx8(0, n, w, n_groups, x, x_stride, m, y, ldy);
}

void cv_matmul_interleaved_q5_K_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy)
{
    matmul_kx8(1, n, w, n_groups, x, x_stride, m, y, ldy);
}

/* ---- Q6_K interleaved (kernels_impl.h): groups of 8 rows, any tokens ----
 *
 * Every output gets the bits of cv_vec_dot_q6_K_q8_K_avx2: row r in lane r, a
 * quad of 4 weights of the 8 rows (low nibbles from ql, top bits from qh)
 * against a token's 4 quants broadcast, two quads of a sub-block summed in
 * int16 (at most 4 * 63 * 128 = 32256), one madd with its 8 scales, the
 * offset of 32 through the bsums, one fma per super-block. The quants are
 * read as they are stored, so a super-block of a group is met by the
 * tokens a few at a time with their sums in registers. */

enum { Q6X8_TOKENS = 4 };
_Static_assert(4 * 63 * 128 <= INT16_MAX, "two quads of products fit int16");

/* A super-block of the 8 rows: sub-block s's scale of row r in both int16
 * halves of dword r of sc[s], scales 2k and 2k + 1 as the int16 pair of
 * dword r of pair[k], and d. */
typedef struct scales_q6x8 {
    __m256i sc[QK_K / 16], pair[QK_K / 32];
    __m256 d;
} scales_q6x8;

static inline void scales_q6x8_prepare(const block_q6_Kx8 *b, scales_q6x8 *p)
{
#pragma GCC unroll 8
    for (int k = 0; k < QK_K / 32; k++) { /* v: scales 2k, then 2k + 1, of rows 0..7 */
        const __m128i v = _mm_loadu_si128((const __m128i *)b->scales[2 * k]);
        p->sc[2 * k] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v));
        p->sc[2 * k + 1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(v, v));
        p->pair[k] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128(v, 8)));
    }
    p->d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b->d));
}

/* -32 times the sum of scale * bsum over the 16 sub-blocks, of row r in
 * lane r: the offset of the quants, exact. */
static inline __m256i offset_q6x8(const __m256i pair[QK_K / 32], const int16_t *bsums)
{
    int32_t two[QK_K / 32]; /* bsums 2k, 2k + 1 as one int16 pair */
    memcpy(two, bsums, sizeof two);
    __m256i o = _mm256_madd_epi16(pair[0], _mm256_set1_epi32(two[0]));
#pragma GCC unroll 8
    for (int k = 1; k < QK_K / 32; k++)
        o = _mm256_add_epi32(o, _mm256_madd_epi16(pair[k], _mm256_set1_epi32(two[k])));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(o, 5));
}

/* The 6-bit quants 0..63 of a quad of 8 rows, row r in dword r, from its
 * low nibbles lo (the high half of each byte with m >= 2) and top bits hi
 * (bits 2m, 2m + 1 of each byte): weights 128h + 32m + l of kquants.c. */
static inline __attribute__((always_inline)) __m256i q6_quad(__m256i lo, __m256i hi, int m)
{
    const __m256i nib = _mm256_and_si256(m >= 2 ? _mm256_srli_epi16(lo, 4) : lo, _mm256_set1_epi8(0x0F));
    const __m256i top = m < 2 ? _mm256_slli_epi16(hi, 4 - 2 * m) : m == 2 ? hi : _mm256_srli_epi16(hi, 2);
    return _mm256_or_si256(nib, _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
}

/* Quad g of sub-block s = 8h + 2m + half (weights 16s + 4g..) of the 8 rows. */
static inline __attribute__((always_inline)) __m256i q6_quad_x8(const block_q6_Kx8 *b, int h, int half, int m,
                                                                 int g)
{
    return q6_quad(_mm256_loadu_si256((const __m256i *)b->ql[16 * h + 8 * (m & 1) + 4 * half + g]),
                   _mm256_loadu_si256((const __m256i *)b->qh[8 * h + 4 * half + g]), m);
}

/* Super-block b of the 8 rows times the super-blocks xb[0, nt) of nt <=
 * Q6X8_TOKENS tokens: adds to acc[t] (row r in lane r). */
static inline __attribute__((always_inline)) void tokens_q6x8(const block_q6_Kx8 *b, const scales_q6x8 *p,
                                                              const block_q8_K *const xb[Q6X8_TOKENS], int nt,
                                                              __m256 *acc)
{
    __m256i isum[Q6X8_TOKENS];
    for (int t = 0; t < nt; t++) {
        isum[t] = offset_q6x8(p->pair, xb[t]->bsums);
        KEEP_IN_REGISTER(isum[t]);
    }
    /* h and half not unrolled; m unrolled, so that its shifts are constants */
#pragma GCC unroll 1
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 1
        for (int half = 0; half < 2; half++)
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                const int s = 8 * h + 2 * m + half;
#pragma GCC unroll 2
                for (int g = 0; g < 4; g += 2) {
                    const __m256i q0 = q6_quad_x8(b, h, half, m, g), q1 = q6_quad_x8(b, h, half, m, g + 1);
#pragma GCC unroll 4
                    for (int t = 0; t < nt; t++) {
                        const int8_t *y = xb[t]->qs + 16 * s;
                        const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(q0, quads_bcast(y, g)),
                                                             _mm256_maddubs_epi16(q1, quads_bcast(y, g + 1)));
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p16, p->sc[s]));
                    }
                }
            }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(p->d, _mm256_set1_ps(xb[t]->d)), _mm256_cvtepi32_ps(isum[t]), acc[t]);
}

/* tokens_q6x8 with nt a constant, so that the sums stay in registers. */
static void tokens_q6x8_n(const block_q6_Kx8 *b, const scales_q6x8 *p, const block_q8_K *const xb[Q6X8_TOKENS],
                          int nt, __m256 *acc)
{
#define Q6X8_CALL(k) tokens_q6x8(b, p, xb, k, acc)
    WITH_CONST_COUNT_4(nt, Q6X8_CALL)
#undef Q6X8_CALL
}

/* The nb super-blocks of one group at w times m tokens. */
static void group_q6x8(int nb, const block_q6_Kx8 *w, const void *x, size_t x_stride, int m, float *y, size_t ldy)
{
    __m256 acc[TILE_TOKENS];
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    for (int i = 0; i < nb; i++) {
        prefetch_lines((const char *)&w[i] + INTERLEAVED_PREFETCH_BYTES, sizeof w[i]);
        scales_q6x8 p;
        scales_q6x8_prepare(&w[i], &p);
        for (int t0 = 0; t0 < m; t0 += Q6X8_TOKENS) {
            const int k = m - t0 < Q6X8_TOKENS ? m - t0 : Q6X8_TOKENS;
            const block_q8_K *xb[Q6X8_TOKENS];
            for (int t = 0; t < k; t++)
                xb[t] = token_q8_K(x, x_stride, t0 + t) + i;
            tokens_q6x8_n(&w[i], &p, xb, k, acc + t0);
        }
    }
    for (int t = 0; t < m; t++)
        _mm256_storeu_ps(y + (size_t)t * ldy, acc[t]);
}

void cv_matmul_interleaved_q6_K_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy)
{
    const int nb = n / QK_K;
    for (long g = 0; g < n_groups; g++)
        group_q6x8(nb, (const block_q6_Kx8 *)w + g * nb, x, x_stride, m, y + ROW_GROUP * g, ldy);
}
