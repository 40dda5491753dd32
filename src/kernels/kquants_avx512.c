/* kquants_avx512.c: the interleaved Q4_K, Q5_K (and, further down, Q6_K) products
 * (kernels_impl.h) and the Q2_K and Q3_K vec_dot with AVX-512 VNNI, for
 * the CPUs that have it (AVX512F, BW, VL and VNNI).
 *
 * Every output gets the bits of cv_matmul_interleaved_q4_K_avx2 (or _q5_K_),
 * and so of cv_vec_dot_q4_K_q8_K_ref: a super-block ends in the same whole int32 sums
 * of each row (exact, so formed in any order), then the same two fmas per
 * super-block, in super-block order, lane by lane.
 *
 * What changes is the work per instruction. A vector holds two groups of
 * 8 rows (row r of the pair in lane r), and one vpdpbusd adds a group of
 * 4 weights times a token's 4 quants into each row's int32 lane, where
 * AVX2 needs a maddubs and an int16 add for 8 rows. With several tokens
 * the AVX2 kernel is bound by those ALU ops (4 per cycle); this one does
 * a quarter of them, and its int32 sums need no flush where AVX2 sums
 * Q5_K's groups in int16 4 at a time. A sub-block's sums then take its
 * 6-bit scale with one vpmulld (at most 32 * 31 * 128 * 63, far inside
 * int32). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/avx512_impl.h"
#include "kernels/interleaved_avx2.h"
#include "kernels/kernels_impl.h"
#include "kernels/kquants.h"

/* A super-block of 16 rows (two groups of 8): each sub-block's scales as
 * int32, the mins of sub-blocks 2k and 2k + 1 as int16 pairs, d and dmin. */
typedef struct scales_kx16 {
    __m512i sc[8], mn[4];
    __m512 d, dmin;
} scales_kx16;

static inline void scales_kx16_prepare(const kx8_block *b0, const kx8_block *b1, scales_kx16 *p)
{
    __m256i sc[2][2], mn[2][2];
    kx8_scales_mins(b0->scale_lo, b0->scale_hi, sc[0], mn[0]);
    kx8_scales_mins(b1->scale_lo, b1->scale_hi, sc[1], mn[1]);
    const uint8_t *sc0 = (const uint8_t *)sc[0], *sc1 = (const uint8_t *)sc[1];
    const uint8_t *mn0 = (const uint8_t *)mn[0], *mn1 = (const uint8_t *)mn[1];
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) /* bytes 8s..8s+7 of each group: scale s of its rows */
        p->sc[s] = _mm512_cvtepu8_epi32(
            _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(sc0 + 8 * s)),
                               _mm_loadl_epi64((const __m128i *)(sc1 + 8 * s))));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* bytes 16k..16k+15: mins 2k, 2k + 1 of its rows */
        p->mn[k] = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(mn1 + 16 * k)),
                                                         _mm_loadu_si128((const __m128i *)(mn0 + 16 * k))));
    p->d = scales_pair(b0->d, b1->d);
    p->dmin = scales_pair(b0->dmin, b1->dmin);
}

/* The mins sums of 16 rows with a token's super-block (mins_dot of each
 * row): the int16 bsum sums of sub-blocks 2k and 2k + 1 meet mn[k]. */
static inline __m512i mins_rows16(const __m512i mn[4], const int16_t *bsums)
{
    int32_t pairs[4];
    _mm_storeu_si128((__m128i *)pairs, bsum_pairs(bsums));
    __m512i msum = _mm512_madd_epi16(mn[0], _mm512_set1_epi32(pairs[0]));
    msum = _mm512_dpwssd_epi32(msum, mn[1], _mm512_set1_epi32(pairs[1]));
    msum = _mm512_dpwssd_epi32(msum, mn[2], _mm512_set1_epi32(pairs[2]));
    return _mm512_dpwssd_epi32(msum, mn[3], _mm512_set1_epi32(pairs[3]));
}

/* fifth_bits of kquants_avx2.c for two groups: bit g of each byte of h
 * at bit 4. */
static inline __attribute__((always_inline)) __m512i fifth_bits16(__m512i h, int g)
{
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    if (g < 4)
        return _mm512_and_si512(_mm512_slli_epi16(h, 4 - g), bit4);
    return _mm512_and_si512(g > 4 ? _mm512_srli_epi16(h, g - 4) : h, bit4);
}

/* Super-block b0 and b1 (the same super-block of two groups, Q4_K or with
 * q5 Q5_K) times the super-blocks xb[0, nt) of nt <= 8 tokens: adds to
 * acc[t] and accm[t]. */
static inline __attribute__((always_inline)) void tokens_kx16(const kx8_block *b0, const kx8_block *b1, int q5,
                                                              const scales_kx16 *p,
                                                              const block_q8_K *const xb[ROW_GROUP], int nt,
                                                              __m512 *acc, __m512 *accm)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i isum[ROW_GROUP];
    zero_sums(isum, nt);
#pragma GCC unroll 1
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) { /* sub-block 2j + half: the low nibbles, then the high */
            const int s = 2 * j + half;
            __m512i h[ROW_GROUP];
            zero_sums(h, nt);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i v = load_pair(b0->qs[8 * j + g], b1->qs[8 * j + g]);
                __m512i q = _mm512_and_si512(half ? _mm512_srli_epi16(v, 4) : v, m4);
                if (q5)
                    q = _mm512_or_si512(q, fifth_bits16(load_pair(b0->qh[s], b1->qh[s]), g));
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++)
                    h[t] = _mm512_dpbusd_epi32(h[t], q, token_quads16(xb[t]->qs + 32 * s, g, t));
            }
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(h[t], p->sc[s]));
        }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        const __m512 xd = _mm512_set1_ps(xb[t]->d);
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(p->d, xd), _mm512_cvtepi32_ps(isum[t]), acc[t]);
        accm[t] = _mm512_fmadd_ps(_mm512_mul_ps(p->dmin, xd), _mm512_cvtepi32_ps(mins_rows16(p->mn, xb[t]->bsums)),
                                  accm[t]);
    }
}

/* tokens_kx16 with nt a constant, so that the sums stay in registers. */
static void tokens_q4_Kx16_n(const kx8_block *b0, const kx8_block *b1, const scales_kx16 *p,
                             const block_q8_K *const xb[ROW_GROUP], int nt, __m512 *acc, __m512 *accm)
{
#define X16_TOKENS(k) tokens_kx16(b0, b1, 0, p, xb, k, acc, accm)
    WITH_CONST_COUNT_8(nt, X16_TOKENS)
#undef X16_TOKENS
}

static void tokens_q5_Kx16_n(const kx8_block *b0, const kx8_block *b1, const scales_kx16 *p,
                             const block_q8_K *const xb[ROW_GROUP], int nt, __m512 *acc, __m512 *accm)
{
#define X16_TOKENS(k) tokens_kx16(b0, b1, 1, p, xb, k, acc, accm)
    WITH_CONST_COUNT_8(nt, X16_TOKENS)
#undef X16_TOKENS
}

/* Groups g and g + 1 (nb super-blocks each) times m tokens. */
static inline __attribute__((always_inline)) void pair_kx16(int q5, int nb, const void *w, long g, const void *x,
                                                            size_t x_stride, int m, float *y, size_t ldy)
{
    __m512 acc[TILE_TOKENS], accm[TILE_TOKENS];
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    memset(accm, 0, (size_t)m * sizeof accm[0]);
    for (int i = 0; i < nb; i++) {
        const kx8_block b0 = kx8_block_at(w, q5, g * nb + i), b1 = kx8_block_at(w, q5, (g + 1) * nb + i);
        prefetch_pair_ahead((const char *)w + (size_t)g * nb * b0.bytes, b0.bytes, nb, i);
        scales_kx16 p;
        scales_kx16_prepare(&b0, &b1, &p);
        for (int t0 = 0; t0 < m; t0 += ROW_GROUP) {
            const int nt = m - t0 < ROW_GROUP ? m - t0 : ROW_GROUP;
            const block_q8_K *xb[ROW_GROUP];
            for (int t = 0; t < nt; t++)
                xb[t] = token_q8_K(x, x_stride, t0 + t) + i;
            if (q5)
                tokens_q5_Kx16_n(&b0, &b1, &p, xb, nt, acc + t0, accm + t0);
            else
                tokens_q4_Kx16_n(&b0, &b1, &p, xb, nt, acc + t0, accm + t0);
        }
    }
    for (int t = 0; t < m; t++)
        _mm512_storeu_ps(y + (size_t)t * ldy, _mm512_sub_ps(acc[t], accm[t]));
}

static inline __attribute__((always_inline)) void matmul_kx16(int q5, int n, const void *w, long n_groups,
                                                              const void *x, size_t x_stride, int m, float *y,
                                                              size_t ldy)
{
    const int nb = n / QK_K;
    long g = 0;
    for (; g + 2 <= n_groups; g += 2)
        pair_kx16(q5, nb, w, g, x, x_stride, m, y + ROW_GROUP * g, ldy);
    if (g == n_groups)
        return;
    /* an odd group: the AVX2 kernel, which gives the same bits */
    const kx8_block last = kx8_block_at(w, q5, g * nb);
    (q5 ? cv_matmul_interleaved_q5_K_avx2 : cv_matmul_interleaved_q4_K_avx2)(n, last.d, 1, x, x_stride, m,
                                                                       y + ROW_GROUP * g, ldy);
}

void cv_matmul_interleaved_q4_K_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy)
{
    matmul_kx16(0, n, w, n_groups, x, x_stride, m, y, ldy);
}

void cv_matmul_interleaved_q5_K_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy)
{
    matmul_kx16(1, n, w, n_groups, x, x_stride, m, y, ldy);
}

/* ---- Q6_K interleaved: two groups of 8 rows per vector ----
 *
 * The bits of cv_matmul_interleaved_q6_K_avx2 (cv_vec_dot_q6_K_q8_K_ref): the
 * same whole int32 sum of each row per super-block, the same fma. A
 * sub-block's 4 quads of unsigned quants (0..63) meet the token's by
 * vpdpbusd, at most 16 * 63 * 128 in magnitude, then its int8 scale by
 * one vpmulld; the offset (quants are stored plus 32) is taken once per
 * token and super-block from the bsums (q6x16_offset), where subtracting
 * it per sub-block cost three scalar steps and a broadcast each (8
 * tokens: 307 GFLOP/s, with it once 369; 64 tokens: 360 and 458). */

/* Tokens met at a time over a super-block: up to Q6X16_FEW by
 * tokens_q6x16_few, else up to ROW_GROUP by tokens_q6x16_many. */
enum { Q6X16_FEW = 4 };

/* A super-block of 16 rows: each sub-block's scales as int32, those of
 * sub-blocks 2k and 2k + 1 as the int16 pairs sc2[k] (which meet a
 * token's bsum pairs for the offset), and d. */
typedef struct scales_q6x16 {
    __m512i sc[QK_K / 16], sc2[QK_K / 32];
    __m512 d;
} scales_q6x16;

static inline void scales_q6x16_prepare(const block_q6_Kx8 *b0, const block_q6_Kx8 *b1, scales_q6x16 *p)
{
#pragma GCC unroll 16
    for (int s = 0; s < QK_K / 16; s++)
        p->sc[s] = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)b0->scales[s]),
                                                           _mm_loadl_epi64((const __m128i *)b1->scales[s])));
    const __m512i low16 = _mm512_set1_epi32(0xFFFF);
#pragma GCC unroll 8
    for (int k = 0; k < QK_K / 32; k++)
        p->sc2[k] = _mm512_or_si512(_mm512_and_si512(p->sc[2 * k], low16), _mm512_slli_epi32(p->sc[2 * k + 1], 16));
    p->d = scales_pair(b0->d, b1->d);
}

/* A token's offset of 16 rows: 32 times the sum over sub-blocks of
 * scale times bsum (exact in int32: at most 16 * 128 * 2048 * 32). */
static inline __m512i q6x16_offset(const scales_q6x16 *p, const int16_t *bsums)
{
    int32_t pairs[QK_K / 32];
    memcpy(pairs, bsums, sizeof pairs);
    __m512i off = _mm512_madd_epi16(p->sc2[0], _mm512_set1_epi32(pairs[0]));
#pragma GCC unroll 8
    for (int k = 1; k < QK_K / 32; k++)
        off = _mm512_dpwssd_epi32(off, p->sc2[k], _mm512_set1_epi32(pairs[k]));
    return _mm512_slli_epi32(off, 5);
}

/* A token's super-block of 16 rows into acc: the scaled quad sums isum
 * less the offset, times d. */
static inline __m512 q6x16_finish(const scales_q6x16 *p, const block_q8_K *xb, __m512i isum, __m512 acc)
{
    const __m512i sum = _mm512_sub_epi32(isum, q6x16_offset(p, xb->bsums));
    return _mm512_fmadd_ps(_mm512_mul_ps(p->d, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(sum), acc);
}

/* Quad g of the four sub-blocks 8h + 2m + half (m = 0..3) of the 16 rows
 * in q[m]: their low nibbles lie in two vectors of ql, their top bits in
 * one of qh (q6_quad of kquants_avx2.c for two groups). */
static inline __attribute__((always_inline)) void q6_quads_x16(const block_q6_Kx8 *b0, const block_q6_Kx8 *b1, int h,
                                                               int half, int g, __m512i q[4])
{
    const int kl = 16 * h + 4 * half + g, kh = 8 * h + 4 * half + g;
    const __m512i lo[2] = {load_pair(b0->ql[kl], b1->ql[kl]), load_pair(b0->ql[kl + 8], b1->ql[kl + 8])};
    const __m512i hi = load_pair(b0->qh[kh], b1->qh[kh]);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    q[0] = _mm512_or_si512(_mm512_and_si512(lo[0], m4), _mm512_and_si512(_mm512_slli_epi16(hi, 4), m30));
    q[1] = _mm512_or_si512(_mm512_and_si512(lo[1], m4), _mm512_and_si512(_mm512_slli_epi16(hi, 2), m30));
    q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo[0], 4), m4), _mm512_and_si512(hi, m30));
    q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo[1], 4), m4),
                           _mm512_and_si512(_mm512_srli_epi16(hi, 2), m30));
}

/* Super-block b0 and b1 (the same super-block of two groups) times the
 * super-blocks xb[0, nt) of nt <= Q6X16_FEW tokens: adds to acc[t]. The
 * four sub-blocks that share a quad's loads are summed together (their
 * sums stay in the 32 registers up to 4 tokens): with few tokens the
 * unpacking bounds the kernel (2 tokens: 150 GFLOP/s, a sub-block at a
 * time 111). Every token takes broadcast loads: token_quads16's 16-byte
 * vectors of the four sub-blocks spilled. */
static inline __attribute__((always_inline)) void tokens_q6x16_few(const block_q6_Kx8 *b0, const block_q6_Kx8 *b1,
                                                               const scales_q6x16 *p,
                                                               const block_q8_K *const xb[ROW_GROUP], int nt,
                                                               __m512 *acc)
{
    __m512i isum[ROW_GROUP];
    zero_sums(isum, nt);
#pragma GCC unroll 1
    for (int hh = 0; hh < 4; hh++) {
        const int h = hh >> 1, half = hh & 1;
        __m512i sub[4][ROW_GROUP];
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++)
            zero_sums(sub[m], nt);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i q[4];
            q6_quads_x16(b0, b1, h, half, g, q);
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++)
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++)
                    sub[m][t] = _mm512_dpbusd_epi32(sub[m][t], q[m],
                                                    quads_bcast16(xb[t]->qs + 16 * (8 * h + 2 * m + half), g));
        }
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++)
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sub[m][t], p->sc[8 * h + 2 * m + half]));
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
        acc[t] = q6x16_finish(p, xb[t], isum[t], acc[t]);
}

/* A super-block of 16 rows unpacked for tokens_q6x16_many: q[s][g] is
 * quad g of sub-block s (q6_quads_x16), formed once for all the tile's
 * tokens (4 KiB, in L1), where unpacking a sub-block's quads per 8
 * tokens bound the kernel. */
typedef struct q6x16_unpacked {
    __m512i q[QK_K / 16][4];
} q6x16_unpacked;

static void q6x16_unpack(const block_q6_Kx8 *b0, const block_q6_Kx8 *b1, q6x16_unpacked *u)
{
#pragma GCC unroll 1
    for (int hh = 0; hh < 4; hh++) {
        const int h = hh >> 1, half = hh & 1;
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i q[4];
            q6_quads_x16(b0, b1, h, half, g, q);
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++)
                u->q[8 * h + 2 * m + half][g] = q[m];
        }
    }
}

/* The unpacked super-block u times nt of 5 to 8 tokens: a sub-block at a
 * time, its quads loaded from u, the sums of the tokens in registers. */
static inline __attribute__((always_inline)) void tokens_q6x16_many(const q6x16_unpacked *u, const scales_q6x16 *p,
                                                                    const block_q8_K *const xb[ROW_GROUP], int nt,
                                                                    __m512 *acc)
{
    __m512i isum[ROW_GROUP];
    zero_sums(isum, nt);
#pragma GCC unroll 1
    for (int s = 0; s < QK_K / 16; s++) {
        __m512i sub[ROW_GROUP];
        zero_sums(sub, nt);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m512i q = u->q[s][g];
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                sub[t] = _mm512_dpbusd_epi32(sub[t], q, quads_bcast16(xb[t]->qs + 16 * s, g));
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sub[t], p->sc[s]));
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++)
        acc[t] = q6x16_finish(p, xb[t], isum[t], acc[t]);
}

/* tokens_q6x16_few and _many with nt a constant, so that the sums stay in
 * registers. */
static void tokens_q6x16_few_n(const block_q6_Kx8 *b0, const block_q6_Kx8 *b1, const scales_q6x16 *p,
                               const block_q8_K *const xb[ROW_GROUP], int nt, __m512 *acc)
{
#define Q6X16_CALL(k) tokens_q6x16_few(b0, b1, p, xb, k, acc)
    WITH_CONST_COUNT_4(nt, Q6X16_CALL)
#undef Q6X16_CALL
}

static void tokens_q6x16_many_n(const q6x16_unpacked *u, const scales_q6x16 *p,
                                const block_q8_K *const xb[ROW_GROUP], int nt, __m512 *acc)
{
    switch (nt) {
    case 5: tokens_q6x16_many(u, p, xb, 5, acc); break;
    case 6: tokens_q6x16_many(u, p, xb, 6, acc); break;
    case 7: tokens_q6x16_many(u, p, xb, 7, acc); break;
    default: tokens_q6x16_many(u, p, xb, 8, acc); break;
    }
}

/* The two groups at w0 and w1 (nb super-blocks each) times m tokens. */
static void pair_q6x16(int nb, const block_q6_Kx8 *w0, const block_q6_Kx8 *w1, const void *x, size_t x_stride, int m,
                       float *y, size_t ldy)
{
    __m512 acc[TILE_TOKENS];
    q6x16_unpacked u;
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    for (int i = 0; i < nb; i++) {
        prefetch_pair_ahead(w0, sizeof *w0, nb, i);
        scales_q6x16 p;
        scales_q6x16_prepare(&w0[i], &w1[i], &p);
        if (m > Q6X16_FEW)
            q6x16_unpack(&w0[i], &w1[i], &u);
        for (int t0 = 0; t0 < m; t0 += ROW_GROUP) {
            const int nt = m - t0 < ROW_GROUP ? m - t0 : ROW_GROUP;
            const block_q8_K *xb[ROW_GROUP];
            for (int t = 0; t < nt; t++)
                xb[t] = token_q8_K(x, x_stride, t0 + t) + i;
            if (nt <= Q6X16_FEW)
                tokens_q6x16_few_n(&w0[i], &w1[i], &p, xb, nt, acc + t0);
            else
                tokens_q6x16_many_n(&u, &p, xb, nt, acc + t0);
        }
    }
    for (int t = 0; t < m; t++)
        _mm512_storeu_ps(y + (size_t)t * ldy, acc[t]);
}

void cv_matmul_interleaved_q6_K_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy)
{
    const int nb = n / QK_K;
    const block_q6_Kx8 *wb = w;
    long g = 0;
    for (; g + 2 <= n_groups; g += 2)
        pair_q6x16(nb, wb + g * nb, wb + (g + 1) * nb, x, x_stride, m, y + ROW_GROUP * g, ldy);
    if (g < n_groups) /* an odd group: the AVX2 kernel, which gives the same bits */
        cv_matmul_interleaved_q6_K_avx2(n, wb + g * nb, 1, x, x_stride, m, y + ROW_GROUP * g, ldy);
}

/* ---- Q2_K and Q3_K vec_dot: one row, 64 weights per instruction ----
 *
 * The bits of cv_vec_dot_q2_K_q8_K_ref and _q3_K_: the same whole int32 sums
 * per super-block (exact, so formed in any order) and the same fmas. A
 * vector holds weights 64k..64k+63, sub-blocks 4k..4k+3 in its four
 * 128-bit lanes, against the activations as they lie: vpmaddubsw pairs
 * the quants (at most 2 * 7 * 128 in int16) and vpdpwssd applies each
 * lane's scale and adds, where AVX2 needs four vectors and twice the
 * instructions. */

/* The 16 signed scale bytes sc as int16 pairs, scale s in dword s. */
static inline __m512i scale_pairs16(__m128i sc)
{
    return _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(sc, sc), _mm_unpacklo_epi8(sc, sc)));
}

/* The 2-bit quants of qs (Q2_K's layout) for half h (weights 128h..): low
 * 256 bits qs[32h..32h+31], high 256 bits the same shifted down by 2, so
 * that chunk k = 2h + m of 64 weights is (this >> 4m) & 3. */
static inline __m512i q2_half(const uint8_t *qs, int h)
{
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
    return _mm512_srlv_epi16(v, _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1));
}

/* The int32 lanes of sum over the 16 sub-blocks of scale * (q * y) for
 * Q2_K's quants qs with, for Q3_K (hmask not NULL), the third bits. */
static inline __attribute__((always_inline)) __m512i dot_q23_avx512(const uint8_t *qs, const uint8_t *hmask,
                                                                    __m128i sc, const int8_t *y)
{
    const __m512i s2 = scale_pairs16(sc);
    __m512i hm = _mm512_setzero_si512();
    if (hmask) /* low half: bit 2k of byte l is weight 64k + l's, high half: of 64k + 32 + l */
        hm = _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)hmask)),
                               _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1));
    __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i qq = q2_half(qs, h);
#pragma GCC unroll 2
        for (int m = 0; m < 2; m++) {
            const int k = 2 * h + m;
            __m512i q = _mm512_and_si512(_mm512_srli_epi16(qq, 4 * m), _mm512_set1_epi8(3));
            if (hmask) { /* bit 2k to bit 2 */
                const __m512i t = k ? _mm512_srli_epi16(hm, 2 * k - 2) : _mm512_slli_epi16(hm, 2);
                q = _mm512_or_si512(q, _mm512_and_si512(t, _mm512_set1_epi8(4)));
            }
            const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(y + 64 * k));
            const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(4 * k),
                                                 _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                                     10, 11, 12, 13, 14, 15), 2));
            isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi32(idx, s2));
        }
    }
    return isum;
}

/* The sums of the 16 lanes of a and of the 8 of b (exact, so in any
 * order). */
static inline void sum_pair_i32(__m512i a, __m256i b, int32_t *sa, int32_t *sb)
{
    const __m256i a8 = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    const __m256i h = _mm256_hadd_epi32(a8, b); /* a and b pairs, per 128-bit half */
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    t = _mm_hadd_epi32(t, t);
    *sa = _mm_cvtsi128_si32(t);
    *sb = _mm_extract_epi32(t, 1);
}

float cv_vec_dot_q2_K_q8_K_avx512(int n, const void *w, const void *x)
{
    const block_q2_K *wb = w;
    const block_q8_K *xb = x;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_lines((const char *)&wb[i] + KQUANT_PREFETCH_BYTES, sizeof wb[i]);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)wb[i].scales);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m256i msum8 = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)xb[i].bsums));
        int32_t isum, msum;
        sum_pair_i32(dot_q23_avx512(wb[i].qs, NULL, _mm_and_si128(sc8, m4), xb[i].qs), msum8, &isum, &msum);
        acc = fmaf(xb[i].d * _cvtsh_ss(wb[i].d), (float)isum, acc);
        accm = fmaf(xb[i].d * _cvtsh_ss(wb[i].dmin), (float)msum, accm);
    }
    return acc - accm;
}

float cv_vec_dot_q3_K_q8_K_avx512(int n, const void *w, const void *x)
{
    const block_q3_K *wb = w;
    const block_q8_K *xb = x;
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        prefetch_lines((const char *)&wb[i] + KQUANT_PREFETCH_BYTES, sizeof wb[i]);
        const __m128i sc8 = q3_scales_v(&wb[i]);
        /* the offset 4: 4 * scale * bsum */
        const __m256i offs = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)xb[i].bsums));
        int32_t isum, osum;
        sum_pair_i32(dot_q23_avx512(wb[i].qs, wb[i].hmask, sc8, xb[i].qs), offs, &isum, &osum);
        acc = fmaf(xb[i].d * _cvtsh_ss(wb[i].d), (float)(isum - 4 * osum), acc);
    }
    return acc;
}
