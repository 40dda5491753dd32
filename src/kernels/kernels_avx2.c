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
 *   including -128), halves added: lane l = elements 2l, 2l+1, 16+2l, 17+2l.
 *
 * The matmul_tile_* kernels (second half) compute many outputs at once for
 * cv_matmul_rows, each with the bits of its vec_dot here. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attention_x86.h"
#include "kernels/avx2_impl.h"
#include "kernels/interleaved_avx2.h"
#include "kernels/kernels_impl.h"
#include "kernels/quants32.h"

#define ROUND_NEAREST_EVEN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m256 load8_f16(const cv_fp16 *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load8_bf16(const cv_bf16 *p)
{
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

float cv_vec_dot_f32_avx2(int n, const void *wv, const void *xv)
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

float cv_vec_dot_f16_avx2(int n, const void *wv, const void *xv)
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

float cv_vec_dot_bf16_avx2(int n, const void *wv, const void *xv)
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

/* Prefetches the units [b1, b2) of a row (blocks, or elements of a float
 * row), of unit_bytes bytes each. */
static inline void prefetch_blocks(const void *row, size_t unit_bytes, int b1, int b2)
{
    for (size_t i = (size_t)b1 * unit_bytes; i < (size_t)b2 * unit_bytes; i += 64)
        prefetch_t0((const char *)row + i);
}

/* A Q8_0 block's quants widened to int16: elements 0..15 and 16..31. */
typedef struct q8_0_wide {
    __m256i lo, hi;
} q8_0_wide;

static inline q8_0_wide widen_q8_0(const int8_t *q)
{
    q8_0_wide v = {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)),
                   _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)))};
    return v;
}

/* Lane l: sum of p[j] * q[j] over j in {2l, 2l+1, 16+2l, 17+2l}. */
static inline __m256i lanes_q8_0_q8_0(q8_0_wide p, q8_0_wide q)
{
    return _mm256_add_epi32(_mm256_madd_epi16(p.lo, q.lo), _mm256_madd_epi16(p.hi, q.hi));
}

/* maddubs(8, y): the pair sums of 8 * y, what the -8 offset of Q4_0 takes
 * off the pair sums of q4 * y. Depends on the activation block only. */
static inline __m256i offset_q4_0(__m256i y)
{
    return _mm256_maddubs_epi16(_mm256_set1_epi8(8), y);
}

/* Lane l: sum of (q4[j] - 8) * y[j] over j in 4l..4l+3, from the unpacked
 * quants q4, the activation quants y and offset_q4_0(y). */
static inline __m256i lanes_q4_0_q8_0(__m256i q4, __m256i y, __m256i y_offset)
{
    __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q4, y), y_offset);
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* Blocks [b0, b0 + nbk) of a Q4_0 (q8 = 0) or Q8_0 (q8 = 1, a constant
 * after inlining) row w times a Q8_0 row x (nbk <= 8): their exact sums
 * (lane k: block b0 + k) and scales (0 past nbk). */
static inline __attribute__((always_inline)) __m256i blocks_x_q8_0(const void *w, const block_q8_0 *x, int b0,
                                                                     int nbk, int q8, __m256 *d)
{
    const size_t block_bytes = q8 ? sizeof(block_q8_0) : sizeof(block_q4_0);
    __m256i lanes[8];
    cv_fp16 wd[8] = {0}, xd[8] = {0};
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        if (k < nbk) {
            const char *wb = (const char *)w + (size_t)(b0 + k) * block_bytes; /* d, then the quants */
            const __m256i y = _mm256_loadu_si256((const __m256i *)x[b0 + k].qs);
            lanes[k] = q8 ? lanes_q8_0_q8_0(widen_q8_0((const int8_t *)wb + 2), widen_q8_0(x[b0 + k].qs))
                          : lanes_q4_0_q8_0(unpack_q4_0((const uint8_t *)wb + 2), y, offset_q4_0(y));
            memcpy(&wd[k], wb, sizeof wd[k]);
            xd[k] = x[b0 + k].d;
        } else {
            lanes[k] = _mm256_setzero_si256();
        }
    }
    *d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wd)),
                       _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xd)));
    return sums8_i32(lanes);
}

/* Block b into lane b % 8, 8 blocks at a time. Past the last block a lane
 * adds 0 * 0, which leaves it as it is (an accumulator is never -0). */
static inline __attribute__((always_inline)) float vec_dot_x_q8_0(int n, const void *w, const block_q8_0 *x, int q8)
{
    const int block_bytes = q8 ? (int)sizeof(block_q8_0) : (int)sizeof(block_q4_0);
    const int nb = n / QK8_0;
    __m256 acc = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        prefetch_blocks(w, (size_t)block_bytes, b0 + VEC_DOT_PREFETCH_BYTES / block_bytes,
                        b0 + 8 + VEC_DOT_PREFETCH_BYTES / block_bytes);
        __m256 d;
        const __m256i s = nb - b0 >= 8 ? blocks_x_q8_0(w, x, b0, 8, q8, &d) : blocks_x_q8_0(w, x, b0, nb - b0, q8, &d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    return hsum8(acc);
}

float cv_vec_dot_q4_0_q8_0_avx2(int n, const void *w, const void *x)
{
    return vec_dot_x_q8_0(n, w, x, 0);
}

float cv_vec_dot_q8_0_q8_0_avx2(int n, const void *w, const void *x)
{
    return vec_dot_x_q8_0(n, w, x, 1);
}

/* ---- tiles: TILE_ROWS (Q8_0: Q8_0_TILE_ROWS) weight rows times up to TILE_TOKENS activation rows ----
 *
 * Every output of a tile follows the schedule of its vec_dot exactly; the
 * tile only shares work between outputs. The rows are cut into chunks of
 * PANEL_BLOCKS blocks. For each chunk, the weight side is prepared once in
 * a panel in L1 and then met by every token. The block scales fp16(w_r.d)
 * * fp16(x.d) are exact in f32, so any way of forming them gives
 * vec_dot's value. While the tokens meet a chunk, the next chunk of the
 * rows is prefetched.
 *
 * Q4_0 and Q8_0 end each block in one sum per row, so their panels keep
 * row r in lane r, and a block meets the 8 rows' accumulators b % 8 with
 * one fma.
 * - Q4_0: each group of 4 weights of the 8 rows is one vector (row r in
 *   dword r, nibbles unpacked to bytes). A token meets a group with one
 *   maddubs against its 4 quants broadcast; the 8 groups of a block add up
 *   in int16 (at most 8 * 2 * 15 * 128 = 30720), one madd makes them int32
 *   and 8 * (sum of the block's quants) takes the offset of 8 off.
 * - Q8_0: each pair of weights of 8 rows is one vector of int16 (row r in
 *   dword r), which a token's pair, widened and broadcast, meets with one
 *   madd (exact for every int8); the 16 pairs add up in int32. A madd
 *   takes two loads, which bound the tile where it meets one row group and
 *   one token at a time (Zen 5 loads two vectors a cycle). So the tile
 *   covers two groups of 8 rows, and each broadcast serves both, and 4
 *   tokens meet each pair of the panel: 6 loads for 8 madds (4096 x 2048
 *   at 512 tokens: 74 -> 120 GFLOP/s on Zen 5). */

_Static_assert(TILE_ROWS == 8, "a panel block holds one __m256 of scales, one per row");

enum { PANEL_BLOCKS = 32 }; /* a multiple of 8, so b % 8 is the same in a chunk and in the row */
enum { Q8_0_GROUPS = Q8_0_TILE_ROWS / 8, Q8_0_TOKENS = 4 }; /* the Q8_0 tile's groups of 8 rows, tokens per load */
_Static_assert(Q8_0_GROUPS == 2, "the Q8_0 tile names its two groups' vectors");

typedef struct panel_q4_0 {
    __m256i q4[PANEL_BLOCKS][8];      /* [b][g]: dword r = weights 4g..4g+3 of row r, as bytes */
    float d[PANEL_BLOCKS][TILE_ROWS]; /* weight scales */
} panel_q4_0;

typedef struct panel_q8_0 {
    __m256i q[PANEL_BLOCKS][Q8_0_GROUPS][QK8_0 / 2]; /* [b][g][k]: dword r = weights 2k, 2k+1 of row 8g + r, int16 */
    float d[PANEL_BLOCKS][Q8_0_TILE_ROWS];
} panel_q8_0;

/* Accumulators of one token: [block % 8], row r in lane r. */
typedef __m256 acc_blocks8[8];
/* ... and of the Q8_0 tile's row groups: [g][block % 8], row 8g + r in lane r. */
typedef acc_blocks8 acc_q8_0[Q8_0_GROUPS];

/* The scales of blocks [b0, b0 + nbc) of rows [0, rows) (of nb blocks of
 * block_bytes) into d[b * rows + r]. Prefetches the chunk after, or after
 * the last chunk the first chunk of the next rows, which the next tile
 * reads first (prefetches do not fault past the matrix). */
static void panel_scales(float *d, int rows, const char *w, size_t w_stride, size_t block_bytes, int b0, int nbc,
                         int nb)
{
    const int b_next_end = nb - (b0 + nbc) < nbc ? nb : b0 + 2 * nbc;
    for (int r = 0; r < rows; r++) {
        const char *row = w + (size_t)r * w_stride;
        if (b0 + nbc < nb)
            prefetch_blocks(row, block_bytes, b0 + nbc, b_next_end);
        else
            prefetch_blocks(row + (size_t)rows * w_stride, block_bytes, 0, nb < PANEL_BLOCKS ? nb : PANEL_BLOCKS);
        for (int b = 0; b < nbc; b++) {
            cv_fp16 h;
            memcpy(&h, row + (size_t)(b0 + b) * block_bytes, sizeof h); /* d opens both blocks */
            d[b * rows + r] = _cvtsh_ss(h);
        }
    }
}

/* Blocks [b0, b0 + nbc) of the TILE_ROWS rows into a panel. */
static void panel_prepare_q4_0(panel_q4_0 *p, const char *w, size_t w_stride, int b0, int nbc, int nb)
{
    panel_scales(p->d[0], TILE_ROWS, w, w_stride, sizeof(block_q4_0), b0, nbc, nb);
    for (int b = 0; b < nbc; b++) {
        __m256i q4[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++)
            q4[r] = unpack_q4_0(((const block_q4_0 *)(w + (size_t)r * w_stride))[b0 + b].qs);
        transpose8_i32(q4, p->q4[b]);
    }
}

static void panel_prepare_q8_0(panel_q8_0 *p, const char *w, size_t w_stride, int b0, int nbc, int nb)
{
    panel_scales(p->d[0], Q8_0_TILE_ROWS, w, w_stride, sizeof(block_q8_0), b0, nbc, nb);
    for (int b = 0; b < nbc; b++)
        for (int g = 0; g < Q8_0_GROUPS; g++) {
            __m256i lo[8], hi[8];
            for (int r = 0; r < 8; r++) {
                const block_q8_0 *row = (const block_q8_0 *)(w + (size_t)(8 * g + r) * w_stride);
                const q8_0_wide q = widen_q8_0(row[b0 + b].qs);
                lo[r] = q.lo;
                hi[r] = q.hi;
            }
            transpose8_i32(lo, p->q[b][g]);
            transpose8_i32(hi, p->q[b][g] + 8);
        }
}

/* The exact sums of block b of the panel's 8 rows (row r in lane r) and
 * the token's block y. */
static inline __m256i panel_block_q4_0(const panel_q4_0 *p, int b, const int8_t *y)
{
    __m256i h = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++)
        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(p->q4[b][g], quads_bcast(y, g)));
    /* the sum of the block's quants in every lane */
    __m256i ysum = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)y)),
                                     _mm256_set1_epi16(1));
    ysum = _mm256_add_epi32(ysum, _mm256_shuffle_epi32(ysum, 0x4E));
    ysum = _mm256_add_epi32(ysum, _mm256_shuffle_epi32(ysum, 0xB1));
    ysum = _mm256_add_epi32(ysum, _mm256_permute2x128_si256(ysum, ysum, 1));
    return _mm256_sub_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(1)), _mm256_slli_epi32(ysum, 3));
}

/* A token's blocks of a chunk, widened before they meet the panel, so
 * that their broadcasts read stores long done: pairs[b][k] = its weights
 * 2k, 2k+1 of block b as int16, d[b] its scale. */
typedef struct token_q8_0_wide {
    int32_t pairs[PANEL_BLOCKS][QK8_0 / 2];
    float d[PANEL_BLOCKS];
} token_q8_0_wide;

static void widen_token_q8_0(const block_q8_0 *x, int nb, token_q8_0_wide *wide)
{
    for (int b = 0; b < nb; b++) {
        const q8_0_wide y16 = widen_q8_0(x[b].qs);
        _mm256_storeu_si256((__m256i *)wide->pairs[b], y16.lo);
        _mm256_storeu_si256((__m256i *)(wide->pairs[b] + 8), y16.hi);
        wide->d[b] = _cvtsh_ss(x[b].d);
    }
}

/* The weights of two row groups of 8 as the Q8_0 tokens meet them: the
 * tile's panel (widened once per chunk), or two interleaved groups,
 * widened as they are read. */
typedef struct q8_0_pairs {
    const panel_q8_0 *panel;             /* or NULL: */
    const block_q8_0x8 *x8[Q8_0_GROUPS]; /* the chunk's first block of each group */
} q8_0_pairs;

/* Pair k of block b of group g: dword r = weights 2k, 2k+1 of row r. */
static inline __attribute__((always_inline)) __m256i pair_q8_0(const q8_0_pairs *w, int x8, int b, int g, int k)
{
    if (x8)
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->x8[g][b].qs[k]));
    return _mm256_load_si256(&w->panel->q[b][g][k]);
}

/* The scales of block b of group g, row r in lane r. */
static inline __attribute__((always_inline)) __m256 scales_q8_0(const q8_0_pairs *w, int x8, int b, int g)
{
    if (x8)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w->x8[g][b].d));
    return _mm256_loadu_ps(&w->panel->d[b][8 * g]);
}

/* Adds blocks [0, nb) of the two groups (from the panel, or interleaved
 * when x8; both constants after inlining, as nt) times tokens [0, nt) to
 * their accumulators: the exact sums of block b (row 8g + r in lane r of
 * group g), then one fma into acc[t][g][b % 8]. Interleaved groups stream
 * from memory when prefetch is set: their blocks are fetched ahead. */
static inline __attribute__((always_inline)) void tokens_q8_0(const q8_0_pairs *w, int x8, int nb,
                                                              const token_q8_0_wide *wide, int nt, int prefetch,
                                                              acc_q8_0 *acc)
{
    for (int b = 0; b < nb; b++) {
        if (x8 && prefetch)
            for (int g = 0; g < Q8_0_GROUPS; g++)
                prefetch_blocks(&w->x8[g][b], 1, VEC_DOT_PREFETCH_BYTES,
                                VEC_DOT_PREFETCH_BYTES + (int)sizeof(block_q8_0x8));
        __m256i s[Q8_0_TOKENS][Q8_0_GROUPS];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++)
            s[t][0] = s[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int k = 0; k < QK8_0 / 2; k++) {
            const __m256i w0 = pair_q8_0(w, x8, b, 0, k), w1 = pair_q8_0(w, x8, b, 1, k);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m256i xk = _mm256_set1_epi32(wide[t].pairs[b][k]);
                s[t][0] = _mm256_add_epi32(s[t][0], _mm256_madd_epi16(w0, xk));
                s[t][1] = _mm256_add_epi32(s[t][1], _mm256_madd_epi16(w1, xk));
                KEEP_IN_REGISTER(s[t][0]);
                KEEP_IN_REGISTER(s[t][1]);
            }
        }
#pragma GCC unroll 2
        for (int g = 0; g < Q8_0_GROUPS; g++) {
            const __m256 d = scales_q8_0(w, x8, b, g);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m256 db = _mm256_mul_ps(d, _mm256_set1_ps(wide[t].d[b]));
                acc[t][g][b % 8] = _mm256_fmadd_ps(db, _mm256_cvtepi32_ps(s[t][g]), acc[t][g][b % 8]);
            }
        }
    }
}

/* tokens_q8_0 with nt a constant, so that the sums stay in registers: of
 * the panel, or of interleaved groups. */
static void panel_tokens_q8_0_n(const panel_q8_0 *p, int nb, const token_q8_0_wide *wide, int nt, acc_q8_0 *acc)
{
    _Static_assert(Q8_0_TOKENS == 4, "the switch covers 1 to 4 tokens");
    const q8_0_pairs w = {.panel = p};
#define PANEL_TOKENS(k) tokens_q8_0(&w, 0, nb, wide, k, 0, acc)
    WITH_CONST_COUNT_4(nt, PANEL_TOKENS)
#undef PANEL_TOKENS
}

static void x8_tokens_q8_0_n(const q8_0_pairs *w, int nb, const token_q8_0_wide *wide, int nt, int prefetch,
                             acc_q8_0 *acc)
{
#define X8_TOKENS(k) tokens_q8_0(w, 1, nb, wide, k, prefetch, acc)
    WITH_CONST_COUNT_4(nt, X8_TOKENS)
#undef X8_TOKENS
}

/* Adds blocks [0, nb) of the Q4_0 panel times the token's blocks x[0, nb)
 * to its accumulators (nb from a chunk start, so block b goes to
 * acc[b % 8]). */
static void panel_token_q4_0(const panel_q4_0 *p, int nb, const block_q8_0 *x, acc_blocks8 acc)
{
    for (int b = 0; b < nb; b++) {
        const __m256i s = panel_block_q4_0(p, b, x[b].qs);
        const __m256 db = _mm256_mul_ps(_mm256_loadu_ps(p->d[b]), _mm256_set1_ps(_cvtsh_ss(x[b].d)));
        acc[b % 8] = _mm256_fmadd_ps(db, _mm256_cvtepi32_ps(s), acc[b % 8]);
    }
}

/* y[r] = vec_dot's hsum8 over a token's 8 accumulators (row r in lane r). */
static void store_blocks8(const acc_blocks8 acc, float *y)
{
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                                     _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
    _mm256_storeu_ps(y, sum);
}

void cv_matmul_tile_q4_0_q8_0_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy)
{
    const int nb = n / QK4_0;
    panel_q4_0 panel;
    acc_blocks8 acc[TILE_TOKENS];
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    for (int b0 = 0; b0 < nb; b0 += PANEL_BLOCKS) {
        const int nbc = nb - b0 < PANEL_BLOCKS ? nb - b0 : PANEL_BLOCKS;
        panel_prepare_q4_0(&panel, w, w_stride, b0, nbc, nb);
        for (int t = 0; t < m; t++)
            panel_token_q4_0(&panel, nbc, token_q8_0(x, x_stride, t) + b0, acc[t]);
    }
    for (int t = 0; t < m; t++)
        store_blocks8(acc[t], y + (size_t)t * ldy);
}

void cv_matmul_tile_q8_0_q8_0_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy)
{
    const int nb = n / QK8_0;
    panel_q8_0 panel;
    token_q8_0_wide wide[Q8_0_TOKENS];
    acc_q8_0 acc[TILE_TOKENS];
    memset(acc, 0, (size_t)m * sizeof acc[0]);
    for (int b0 = 0; b0 < nb; b0 += PANEL_BLOCKS) {
        const int nbc = nb - b0 < PANEL_BLOCKS ? nb - b0 : PANEL_BLOCKS;
        panel_prepare_q8_0(&panel, w, w_stride, b0, nbc, nb);
        for (int t0 = 0; t0 < m; t0 += Q8_0_TOKENS) {
            const int nt = m - t0 < Q8_0_TOKENS ? m - t0 : Q8_0_TOKENS;
            for (int t = 0; t < nt; t++)
                widen_token_q8_0(token_q8_0(x, x_stride, t0 + t) + b0, nbc, &wide[t]);
            panel_tokens_q8_0_n(&panel, nbc, wide, nt, acc + t0);
        }
    }
    for (int t = 0; t < m; t++)
        for (int g = 0; g < Q8_0_GROUPS; g++)
            store_blocks8(acc[t][g], y + (size_t)t * ldy + 8 * g);
}

/* F32, F16 and BF16 tiles, with the same plan. The rows are cut into chunks of FLOAT_CHUNK
 * elements, converted to f32 once in a panel, and met by the tokens in
 * groups of FLOAT_TOKENS. An output's four accumulators (acc_a for
 * elements 8a..8a+7 of each run of 32) live in memory between chunks;
 * within a chunk, a token takes a = 0..3 in turn with the 8 rows' acc_a
 * in registers. The n % 32 last elements are added in order after the
 * horizontal sum, as vec_dot does. */

enum { FLOAT_CHUNK = 512, FLOAT_TOKENS = 16 };

/* Accumulators of one token: [a][row]. */
typedef __m256 float_tile_acc[4][TILE_ROWS];

typedef __m256 (*load8_fn)(const void *row, int i); /* elements i..i+7 as f32 */
typedef float (*load1_fn)(const void *row, int i);

static inline __m256 load8_f32_at(const void *row, int i) { return _mm256_loadu_ps((const float *)row + i); }
static inline __m256 load8_f16_at(const void *row, int i) { return load8_f16((const cv_fp16 *)row + i); }
static inline __m256 load8_bf16_at(const void *row, int i) { return load8_bf16((const cv_bf16 *)row + i); }
static inline float load1_f32_at(const void *row, int i) { return ((const float *)row)[i]; }
static inline float load1_f16_at(const void *row, int i) { return _cvtsh_ss(((const cv_fp16 *)row)[i]); }
static inline float load1_bf16_at(const void *row, int i) { return cv_bf16_to_fp32(((const cv_bf16 *)row)[i]); }

static inline __attribute__((always_inline)) void float_tile(int n, const char *w, size_t w_stride, const char *x,
                                                             size_t x_stride, int m, float *y, size_t ldy,
                                                             size_t elem_bytes, load8_fn load8, load1_fn load1)
{
    const int n32 = n - n % 32;
    __m256 panel[TILE_ROWS][FLOAT_CHUNK / 8];
    float_tile_acc acc[FLOAT_TOKENS];
    for (int t0 = 0; t0 < m; t0 += FLOAT_TOKENS) {
        const int mt = m - t0 < FLOAT_TOKENS ? m - t0 : FLOAT_TOKENS;
        memset(acc, 0, (size_t)mt * sizeof acc[0]);
        for (int i0 = 0; i0 < n32; i0 += FLOAT_CHUNK) {
            const int len = n32 - i0 < FLOAT_CHUNK ? n32 - i0 : FLOAT_CHUNK;
            const int next_end = n - (i0 + len) < len ? n : i0 + 2 * len;
            for (int r = 0; r < TILE_ROWS; r++) {
                prefetch_blocks(w + (size_t)r * w_stride, elem_bytes, i0 + len, next_end);
                for (int i = 0; i < len; i += 8)
                    panel[r][i / 8] = load8(w + (size_t)r * w_stride, i0 + i);
            }
            for (int t = 0; t < mt; t++) {
                const char *xt = x + (size_t)(t0 + t) * x_stride;
                for (int a = 0; a < 4; a++) {
                    __m256 s[TILE_ROWS];
                    memcpy(s, acc[t][a], sizeof s);
                    for (int i = 8 * a; i < len; i += 32) {
                        const __m256 xv = load8(xt, i0 + i);
#pragma GCC unroll 8
                        for (int r = 0; r < TILE_ROWS; r++)
                            s[r] = _mm256_fmadd_ps(panel[r][i / 8], xv, s[r]);
                    }
                    memcpy(acc[t][a], s, sizeof s);
                }
            }
        }
        for (int t = 0; t < mt; t++) {
            const char *xt = x + (size_t)(t0 + t) * x_stride;
            __m256 lanes[TILE_ROWS];
            float sum[TILE_ROWS];
            for (int r = 0; r < TILE_ROWS; r++)
                lanes[r] = _mm256_add_ps(_mm256_add_ps(acc[t][0][r], acc[t][1][r]),
                                         _mm256_add_ps(acc[t][2][r], acc[t][3][r]));
            _mm256_storeu_ps(sum, hsum8_rows8(lanes));
            for (int r = 0; r < TILE_ROWS; r++) {
                const char *wr = w + (size_t)r * w_stride;
                for (int i = n32; i < n; i++)
                    sum[r] = fmaf(load1(wr, i), load1(xt, i), sum[r]);
                y[(size_t)(t0 + t) * ldy + (size_t)r] = sum[r];
            }
        }
    }
}

void cv_matmul_tile_f32_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m, float *y,
                          size_t ldy)
{
    float_tile(n, w, w_stride, x, x_stride, m, y, ldy, sizeof(float), load8_f32_at, load1_f32_at);
}

void cv_matmul_tile_f16_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m, float *y,
                          size_t ldy)
{
    float_tile(n, w, w_stride, x, x_stride, m, y, ldy, sizeof(cv_fp16), load8_f16_at, load1_f16_at);
}

void cv_matmul_tile_bf16_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m, float *y,
                           size_t ldy)
{
    float_tile(n, w, w_stride, x, x_stride, m, y, ldy, sizeof(cv_bf16), load8_bf16_at, load1_bf16_at);
}

void cv_quantize_row_q8_0_avx2(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        float amax = hmax8(m);
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

void cv_silu_mul_avx2(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_or_ps(x, _mm256_set1_ps(-0.0f))); /* exp(-|x|) */
        const __m256 num = _mm256_blendv_ps(_mm256_mul_ps(x, e), x, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
        const __m256 s = _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    cv_silu_mul_ref(g + i, u + i, n - i);
}

void cv_convert_row_f32_to_f16_avx2(const float *x, void *vy, int64_t n)
{
    cv_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* ---- Q8_0 interleaved (kernels_impl.h): groups of 8 rows, any tokens ----
 *
 * The Q8_0 tile's schedule, its panel read from the groups as stored: a
 * pair of weights of 8 rows is one load widened to int16 (row r in dword
 * r), met by a token's pair broadcast with one madd. Two groups share
 * each broadcast; an odd last group is met as both and stored once. One
 * token (decode) reads the groups at the memory's pace, where vec_dot
 * per row paid a horizontal sum and a gather of 8 scales per 8 blocks. */

void cv_matmul_interleaved_q8_0_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy)
{
    const int nb = n / QK8_0;
    const block_q8_0x8 *groups = w;
    token_q8_0_wide wide[Q8_0_TOKENS];
    acc_q8_0 acc[TILE_TOKENS];
    for (long g = 0; g < n_groups; g += Q8_0_GROUPS) {
        const int stored = n_groups - g < Q8_0_GROUPS ? (int)(n_groups - g) : Q8_0_GROUPS;
        const block_q8_0x8 *first = groups + (size_t)g * nb, *second = first + (size_t)(stored - 1) * nb;
        memset(acc, 0, (size_t)m * sizeof acc[0]);
        for (int b0 = 0; b0 < nb; b0 += PANEL_BLOCKS) {
            const int nbc = nb - b0 < PANEL_BLOCKS ? nb - b0 : PANEL_BLOCKS;
            const q8_0_pairs chunk = {.x8 = {first + b0, second + b0}};
            for (int t0 = 0; t0 < m; t0 += Q8_0_TOKENS) {
                const int nt = m - t0 < Q8_0_TOKENS ? m - t0 : Q8_0_TOKENS;
                for (int t = 0; t < nt; t++)
                    widen_token_q8_0(token_q8_0(x, x_stride, t0 + t) + b0, nbc, &wide[t]);
                x8_tokens_q8_0_n(&chunk, nbc, wide, nt, t0 == 0, acc + t0);
            }
        }
        for (int t = 0; t < m; t++)
            for (int gi = 0; gi < stored; gi++)
                store_blocks8(acc[t][gi], y + (size_t)t * ldy + (size_t)(ROW_GROUP * (g + gi)));
    }
}

/* ---- Q4_0, IQ4_NL and MXFP4 interleaved (kernels_impl.h): groups of 8 rows, any tokens ----
 *
 * Every output gets the bits of its type's vec_dot (Q4_0's as in the tile):
 * row r in lane r, the 8 groups of a block against the token's quants
 * broadcast, summed in int16, one madd, the offset of 8 taken off with the
 * sum of the token's block, one fma into accumulator b % 8. The quants are
 * read as they are stored and met by the tokens 8 at a time, their int16
 * sums in registers. The tokens' block sums (times the offset) and scales
 * are formed once per pass over the groups, X8_TOKEN_BLOCKS of them.
 *
 * IQ4_NL has Q4_0's bytes; a nibble q stands for k = cv_kvalues_iq4nl[q],
 * and u = k + 128 (0..241) = 16 u_hi + u_lo with nibbles u_hi and u_lo
 * looked up by two byte shuffles. Each of them meets the token as Q4_0's
 * nibble does (int16 sums within 30720), then s = 16 S_hi + S_lo - 128
 * (sum of y): the same exact int32 sum as vec_dot's, with twice the
 * maddubs, so 4 tokens at a time keep their 8 sums in registers.
 *
 * MXFP4 (block_mxfp4x8: its exponents, then Q4_0's quants) looks up u =
 * cv_kvalues_mxfp4[q] + 12 (0..24) by one shuffle. The 8 groups of a block
 * would reach 49152 in int16, so the low and the high nibbles (4 groups
 * each, within 24576) keep their own sums, 4 tokens at a time: s = S_lo +
 * S_hi - 12 (sum of y), the scales 2^(e - 128) from the exponents' bits
 * as in vec_dot. */

/* The nibbles of u = cv_kvalues_iq4nl[q] + 128 for q in each 128-bit lane. */
static inline void iq4nl_tables(__m256i *u_hi, __m256i *u_lo)
{
    const __m256i u = _mm256_broadcastsi128_si256(nib_table_u(NIB_IQ4_NL));
    *u_hi = _mm256_and_si256(_mm256_srli_epi16(u, 4), _mm256_set1_epi8(15));
    *u_lo = _mm256_and_si256(u, _mm256_set1_epi8(15));
}

/* The nb blocks of a group of 8 rows (of the nibble kind) times nt <= 8
 * tokens (IQ4_NL, MXFP4: 4) (the rows of their quants x[t], their sums
 * times the offset and their scales yoff[t * nb + b], xd[t * nb + b]):
 * adds block b to acc[t][b % 8]. */
static inline __attribute__((always_inline)) void group_nibbles_x8(const void *group, int nb,
                                                                   const block_q8_0 *const x[8], const int32_t *yoff,
                                                                   const float *xd, int nt, int kind,
                                                                   acc_blocks8 *acc)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    const int split = kind == NIB_MXFP4; /* each half in its own int16 sums */
    __m256i u_hi = m4, u_lo = m4;
    if (kind == NIB_IQ4_NL)
        iq4nl_tables(&u_hi, &u_lo);
    if (kind == NIB_MXFP4)
        u_lo = _mm256_broadcastsi128_si256(nib_table_u(NIB_MXFP4));
    for (int b = 0; b < nb; b++) {
        const uint8_t(*qs)[32] = nib_qs(group, b, kind);
        prefetch_blocks(qs, 1, VEC_DOT_PREFETCH_BYTES, VEC_DOT_PREFETCH_BYTES + (int)nib_block_bytes(kind));
        __m256i h[8], h_hi[8];
#pragma GCC unroll 8
        for (int k = 0; k < QK4_0 / 8; k++) {
            const __m256i v = load_packed(qs[k]);
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) { /* elements 4k.. in the low nibbles, 16+4k.. in the high */
                const __m256i q = _mm256_and_si256(half ? _mm256_srli_epi16(v, 4) : v, m4);
                const __m256i lo = kind != NIB_Q4_0 ? _mm256_shuffle_epi8(u_lo, q) : q;
                __m256i *sums = split && half ? h_hi : h;
                const int first = k == 0 && (split || half == 0);
#pragma GCC unroll 8
                for (int t = 0; t < nt; t++) {
                    const __m256i y = quads_bcast(x[t][b].qs, 4 * half + k);
                    const __m256i prod = _mm256_maddubs_epi16(lo, y);
                    sums[t] = first ? prod : _mm256_add_epi16(sums[t], prod);
                    KEEP_IN_REGISTER(sums[t]);
                    if (kind == NIB_IQ4_NL) {
                        const __m256i prod_hi = _mm256_maddubs_epi16(_mm256_shuffle_epi8(u_hi, q), y);
                        h_hi[t] = k || half ? _mm256_add_epi16(h_hi[t], prod_hi) : prod_hi;
                        KEEP_IN_REGISTER(h_hi[t]);
                    }
                }
            }
        }
        const __m256 d = nib_scales8(group, b, kind);
        const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m256i s = _mm256_madd_epi16(h[t], ones);
            if (kind == NIB_IQ4_NL)
                s = _mm256_add_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(h_hi[t], ones), 4));
            if (split)
                s = _mm256_add_epi32(s, _mm256_madd_epi16(h_hi[t], ones));
            s = _mm256_sub_epi32(s, _mm256_set1_epi32(yoff[t * nb + b]));
            const __m256 dt = _mm256_mul_ps(d, _mm256_set1_ps(xd[t * nb + b]));
            acc[t][b % 8] = _mm256_fmadd_ps(dt, _mm256_cvtepi32_ps(s), acc[t][b % 8]);
        }
    }
}

/* group_nibbles_x8 with nt a constant, so that the sums stay in registers. */
static void group_nibbles_x8_n(const void *group, int nb, const block_q8_0 *const x[8], const int32_t *yoff,
                               const float *xd, int nt, int kind, acc_blocks8 *acc)
{
#define GROUP_TOKENS(k) group_nibbles_x8(group, nb, x, yoff, xd, k, NIB_Q4_0, acc)
#define GROUP_TOKENS_IQ4(k) group_nibbles_x8(group, nb, x, yoff, xd, k, NIB_IQ4_NL, acc)
#define GROUP_TOKENS_MXFP4(k) group_nibbles_x8(group, nb, x, yoff, xd, k, NIB_MXFP4, acc)
    if (kind == NIB_IQ4_NL) {
        WITH_CONST_COUNT_4(nt, GROUP_TOKENS_IQ4)
    } else if (kind == NIB_MXFP4) {
        WITH_CONST_COUNT_4(nt, GROUP_TOKENS_MXFP4)
    } else {
        WITH_CONST_COUNT_8(nt, GROUP_TOKENS)
    }
#undef GROUP_TOKENS
#undef GROUP_TOKENS_IQ4
#undef GROUP_TOKENS_MXFP4
}

/* The groups times tokens [0, nt) (nt * nb <= X8_TOKEN_BLOCKS). */
static void pass_nibbles_x8(int nb, const char *group, long n_groups, const void *x, size_t x_stride, int nt,
                            int kind, float *y, size_t ldy)
{
    const int step = kind == NIB_Q4_0 ? 8 : 4; /* tokens the group meets in registers */
    const size_t group_bytes = (size_t)nb * nib_block_bytes(kind);
    token_sums_q4_0 ts;
    acc_blocks8 acc[TILE_TOKENS];
    token_sums_q4_0_prepare(x, x_stride, nt, nb, nib_offset(kind), &ts);
    for (long g = 0; g < n_groups; g++, group += group_bytes) {
        memset(acc, 0, (size_t)nt * sizeof acc[0]);
        for (int t0 = 0; t0 < nt; t0 += step) { /* the group stays in L1 for the next tokens */
            const block_q8_0 *xt[8];
            for (int t = 0; t < step && t0 + t < nt; t++)
                xt[t] = token_q8_0(x, x_stride, t0 + t);
            group_nibbles_x8_n(group, nb, xt, ts.yoff + t0 * nb, ts.xd + t0 * nb, nt - t0 < step ? nt - t0 : step,
                               kind, acc + t0);
        }
        for (int t = 0; t < nt; t++)
            store_blocks8(acc[t], y + (size_t)t * ldy + (size_t)(ROW_GROUP * g));
    }
}

static void matmul_nibbles_x8(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m, int kind,
                              float *y, size_t ldy)
{
    const int nb = n / QK4_0;
    const int per_pass = X8_TOKEN_BLOCKS / nb;
    for (int t0 = 0; t0 < m; t0 += per_pass) {
        const int nt = m - t0 < per_pass ? m - t0 : per_pass;
        pass_nibbles_x8(nb, w, n_groups, token_q8_0(x, x_stride, t0), x_stride, nt, kind, y + (size_t)t0 * ldy, ldy);
    }
}

void cv_matmul_interleaved_q4_0_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy)
{
    matmul_nibbles_x8(n, w, n_groups, x, x_stride, m, NIB_Q4_0, y, ldy);
}

void cv_matmul_interleaved_iq4_nl_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy)
{
    matmul_nibbles_x8(n, w, n_groups, x, x_stride, m, NIB_IQ4_NL, y, ldy);
}

void cv_matmul_interleaved_mxfp4_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                   float *y, size_t ldy)
{
    matmul_nibbles_x8(n, w, n_groups, x, x_stride, m, NIB_MXFP4, y, ldy);
}
