/* kernels_avx512.c: the interleaved Q4_0, IQ4_NL and MXFP4 products (kernels_impl.h) with
 * AVX-512 VNNI, for the CPUs that have it (AVX512F, BW, VL and VNNI).
 *
 * Every output gets the bits of the type's AVX2 interleaved kernel, and
 * so of its vec_dot_*_ref: each block ends in the same whole int32 sum of
 * each row (exact, so formed in any order), less the offset (8, 128, 12)
 * times the token's block sum, then the same fma into accumulator b % 8,
 * and the same sum of the 8 accumulators at the end, lane by lane.
 *
 * As in kquants_avx512.c, a vector holds two groups of 8 rows and one
 * vpdpbusd adds a group of 4 weights times a token's 4 quants into each
 * row's int32 lane, where AVX2 needs a maddubs and an int16 add for 8
 * rows, and a madd per block. */
#include <immintrin.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/avx512_impl.h"
#include "kernels/interleaved_avx2.h"
#include "kernels/kernels_impl.h"
#include "kernels/quants32.h"

/* Accumulators of one token: [block % 8], row r of the two groups in lane r. */
typedef __m512 acc_blocks16[8];

/* The 16 scales of block b of groups g0 and g1 (of the nibble kind). */
static inline __attribute__((always_inline)) __m512 nib_scales16(const void *g0, const void *g1, int b, int kind)
{
    return _mm512_castsi512_ps(join256(_mm256_castps_si256(nib_scales8(g0, b, kind)),
                                       _mm256_castps_si256(nib_scales8(g1, b, kind))));
}

/* The nb blocks of groups g0 and g1 (of the nibble kind) times nt <= 8
 * tokens (the rows of their quants x[t], their sums times the offset and
 * their scales yoff[t * nb + b], xd[t * nb + b]): adds block b to
 * acc[t][b % 8]. vpdpbusd sums in int32, so the unsigned table values
 * (IQ4_NL: cv_kvalues_iq4nl[q] + 128, MXFP4: cv_kvalues_mxfp4[q] + 12), one
 * byte shuffle, meet the tokens whole, and the offset comes off as Q4_0's
 * 8 does. */
static inline __attribute__((always_inline)) void pair_nibbles_x16(const void *g0, const void *g1, int nb,
                                                                   const block_q8_0 *const x[8],
                                                                   const int32_t *yoff, const float *xd, int nt,
                                                                   int kind, acc_blocks16 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i u = _mm512_broadcast_i32x4(nib_table_u(kind));
    for (int b = 0; b < nb; b++) {
        const uint8_t(*qs0)[32] = nib_qs(g0, b, kind), (*qs1)[32] = nib_qs(g1, b, kind);
        prefetch_pair_ahead(g0, nib_block_bytes(kind), nb, b);
        __m512i h[8];
        zero_sums(h, nt);
#pragma GCC unroll 4
        for (int k = 0; k < QK4_0 / 8; k++) {
            const __m512i v = load_pair(qs0[k], qs1[k]);
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) { /* elements 4k.. in the low nibbles, 16+4k.. in the high */
                __m512i q = _mm512_and_si512(half ? _mm512_srli_epi16(v, 4) : v, m4);
                if (kind != NIB_Q4_0)
                    q = _mm512_shuffle_epi8(u, q);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++)
                    h[t] = _mm512_dpbusd_epi32(h[t], q, token_quads16(x[t][b].qs, 4 * half + k, t));
            }
        }
        const __m512 d = nib_scales16(g0, g1, b, kind);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const __m512i s = _mm512_sub_epi32(h[t], _mm512_set1_epi32(yoff[t * nb + b]));
            const __m512 dt = _mm512_mul_ps(d, _mm512_set1_ps(xd[t * nb + b]));
            acc[t][b % 8] = _mm512_fmadd_ps(dt, _mm512_cvtepi32_ps(s), acc[t][b % 8]);
        }
    }
}

/* pair_nibbles_x16 with nt a constant, so that the sums stay in registers. */
static void pair_nibbles_x16_n(const void *g0, const void *g1, int nb, const block_q8_0 *const x[8],
                               const int32_t *yoff, const float *xd, int nt, int kind, acc_blocks16 *acc)
{
#define PAIR_TOKENS(k) pair_nibbles_x16(g0, g1, nb, x, yoff, xd, k, NIB_Q4_0, acc)
#define PAIR_TOKENS_IQ4(k) pair_nibbles_x16(g0, g1, nb, x, yoff, xd, k, NIB_IQ4_NL, acc)
#define PAIR_TOKENS_MXFP4(k) pair_nibbles_x16(g0, g1, nb, x, yoff, xd, k, NIB_MXFP4, acc)
    if (kind == NIB_IQ4_NL) {
        WITH_CONST_COUNT_8(nt, PAIR_TOKENS_IQ4)
    } else if (kind == NIB_MXFP4) {
        WITH_CONST_COUNT_8(nt, PAIR_TOKENS_MXFP4)
    } else {
        WITH_CONST_COUNT_8(nt, PAIR_TOKENS)
    }
#undef PAIR_TOKENS
#undef PAIR_TOKENS_IQ4
#undef PAIR_TOKENS_MXFP4
}

/* The 8 accumulators of a token summed as store_blocks8 does, per lane. */
static void store_blocks16(const acc_blocks16 acc, float *y)
{
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                                     _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])));
    _mm512_storeu_ps(y, sum);
}

/* The pairs of groups times tokens [0, nt) (nt * nb <= X8_TOKEN_BLOCKS). */
static void pass_nibbles_x16(int nb, const char *group, long n_pairs, const void *x, size_t x_stride, int nt,
                             int kind, float *y, size_t ldy)
{
    const size_t group_bytes = (size_t)nb * nib_block_bytes(kind);
    token_sums_q4_0 ts;
    acc_blocks16 acc[TILE_TOKENS];
    token_sums_q4_0_prepare(x, x_stride, nt, nb, nib_offset(kind), &ts);
    for (long p = 0; p < n_pairs; p++, group += 2 * group_bytes) {
        memset(acc, 0, (size_t)nt * sizeof acc[0]);
        for (int t0 = 0; t0 < nt; t0 += 8) { /* the pair stays in L1 for the next 8 tokens */
            const block_q8_0 *xt[8];
            for (int t = 0; t < 8 && t0 + t < nt; t++)
                xt[t] = token_q8_0(x, x_stride, t0 + t);
            pair_nibbles_x16_n(group, group + group_bytes, nb, xt, ts.yoff + t0 * nb, ts.xd + t0 * nb,
                               nt - t0 < 8 ? nt - t0 : 8, kind, acc + t0);
        }
        for (int t = 0; t < nt; t++)
            store_blocks16(acc[t], y + (size_t)t * ldy + (size_t)(2 * ROW_GROUP * p));
    }
}

/* The AVX2 kernel of a nibble kind, which gives the same bits. */
static const matmul_interleaved_fn nibbles_avx2[] = {
    [NIB_Q4_0] = cv_matmul_interleaved_q4_0_avx2,
    [NIB_IQ4_NL] = cv_matmul_interleaved_iq4_nl_avx2,
    [NIB_MXFP4] = cv_matmul_interleaved_mxfp4_avx2,
};

static void matmul_nibbles_x16(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m, int kind,
                               float *y, size_t ldy)
{
    const int nb = n / QK4_0;
    const int per_pass = X8_TOKEN_BLOCKS / nb;
    const long n_pairs = n_groups / 2;
    for (int t0 = 0; t0 < m; t0 += per_pass) {
        const int nt = m - t0 < per_pass ? m - t0 : per_pass;
        pass_nibbles_x16(nb, w, n_pairs, token_q8_0(x, x_stride, t0), x_stride, nt, kind, y + (size_t)t0 * ldy, ldy);
    }
    if (n_groups % 2) /* an odd group: the AVX2 kernel */
        nibbles_avx2[kind](n, (const char *)w + (size_t)(2 * n_pairs * nb) * nib_block_bytes(kind), 1, x, x_stride,
                           m, y + ROW_GROUP * 2 * n_pairs, ldy);
}

void cv_matmul_interleaved_q4_0_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy)
{
    matmul_nibbles_x16(n, w, n_groups, x, x_stride, m, NIB_Q4_0, y, ldy);
}

void cv_matmul_interleaved_iq4_nl_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                      float *y, size_t ldy)
{
    matmul_nibbles_x16(n, w, n_groups, x, x_stride, m, NIB_IQ4_NL, y, ldy);
}

void cv_matmul_interleaved_mxfp4_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy)
{
    matmul_nibbles_x16(n, w, n_groups, x, x_stride, m, NIB_MXFP4, y, ldy);
}
