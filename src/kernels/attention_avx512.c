/* attention_avx512.c: the fused attention with AVX-512F, lane for lane the
 * schedule of attention.h, for head_dim a multiple of 16 (other widths go
 * to the AVX2 version, which gives the same bits).
 * - Scores: a 16-lane vector holds two positions' 8-lane accumulators
 *   (position j in the low half, j + 4 in the high), the query's chunk
 *   broadcast to both halves. Eight positions' accumulators are reduced by
 *   the AVX2 version's horizontal-add tree, run on both halves at once.
 * - Softmax: attention_x86.h's 8-lane step.
 * - Values: element by element, so 16 elements per vector; up to 4 query heads
 *   by 4 vectors of accumulators stay in registers (16 independent sums:
 *   one query head's 4 left the FMA units waiting on their latency). */
#include <immintrin.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_x86.h"

/* Pairs of the pair layout per 8-element chunk of a row. */
#define PAIRS 4
/* Query rows of a scores pass. */
#define SCORE_ROWS 4
/* Rows and 16-element vectors of a values tile. */
#define TILE_HEADS 4
#define TILE_VECS 4

/* _mm256_hadd_ps on each 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3]. */
static inline __m512 hadd16(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* (64-bit lane moves, so AVX-512F alone suffices) */
static inline __m256 high256(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

static inline __m512 join256(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* [x | x] */
static inline __m512 twice256(const float *x)
{
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
}

/* Lane j of the result: position j's ((a0+a1) + (a2+a3)) + ((a4+a5) +
 * (a6+a7)), from z_j holding position j's accumulator in its low half and
 * position j + 4's in its high half. */
static inline __m256 reduce_pairs(__m512 z0, __m512 z1, __m512 z2, __m512 z3)
{
    /* 128-bit lanes: positions 0-3's (a0+a1)+(a2+a3), their (a4+a5)+(a6+a7),
     * then the same two of positions 4-7 */
    const __m512 h = hadd16(hadd16(z0, z1), hadd16(z2, z3));
    const __m512 s = _mm512_shuffle_f32x4(h, h, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_ps(_mm512_castps512_ps256(s), high256(s));
}

/* 8 elements of chunk ch of a key row as F32 (zeros for no row). */
static inline __m256 key_chunk(const attn_state *st, const char *row, int ch)
{
    if (!row)
        return _mm256_setzero_ps();
    if (st->f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cv_fp16 *)row + 8 * ch)));
    return _mm256_loadu_ps((const float *)row + 8 * ch);
}

/* Keys of positions i0 .. i0 + 8 of the block (c present, the rest zeros)
 * into st->kw in the pair layout: vector (ch, j) holds position j's
 * elements [8ch, 8ch + 8) in its low half and position j + 4's in its
 * high half. */
static inline void key_pairs(const attn_state *st, const attn_block *b, int i0, int c)
{
    const int nch = st->hd / 8;
    #pragma GCC unroll 4
    for (int j = 0; j < PAIRS; j++) {
        const char *lo = j < c ? b->kb + (size_t)(i0 + j) * st->rstride : NULL;
        const char *hi = j + PAIRS < c ? b->kb + (size_t)(i0 + j + PAIRS) * st->rstride : NULL;
        for (int ch = 0; ch < nch; ch++) {
            const __m512 v = join256(key_chunk(st, lo, ch), key_chunk(st, hi, ch));
            _mm512_storeu_ps(st->kw + ((size_t)ch * PAIRS + j) * 16, v);
        }
    }
}

/* Scores of positions i0 .. i0 + 8 for NR (1 to 4) query rows from g,
 * into S[g + r][i0 .. i0 + 8). Four rows meet each key vector loaded:
 * with one or two, loads outnumbered the FMAs. */
static inline __attribute__((always_inline)) void scores_rows(const attn_state *st, int g, int NR, int i0)
{
    const int nch = st->hd / 8;
    const float *q[SCORE_ROWS];
    __m512 z[SCORE_ROWS][PAIRS];
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        q[r] = attn_q(st, g + r);
        #pragma GCC unroll 4
        for (int j = 0; j < PAIRS; j++)
            z[r][j] = _mm512_setzero_ps();
    }
    for (int ch = 0; ch < nch; ch++) {
        const float *kc = st->kw + (size_t)ch * PAIRS * 16;
        #pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 qv = twice256(q[r] + 8 * ch);
            #pragma GCC unroll 4
            for (int j = 0; j < PAIRS; j++)
                z[r][j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kc + 16 * j), z[r][j]);
        }
    }
    const __m256 scale = _mm256_set1_ps(st->a->scale);
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        const __m256 s = reduce_pairs(z[r][0], z[r][1], z[r][2], z[r][3]);
        _mm256_storeu_ps(st->S + (size_t)(g + r) * CV_ATTN_BLOCK + i0, _mm256_mul_ps(s, scale));
    }
}

/* 1. Scores of the block, eight positions at a time (missing ones read
 * zeros). */
static void block_scores(const attn_state *st, const attn_block *b)
{
    for (int i0 = 0; i0 < b->n; i0 += 8) {
        const int c = b->n - i0 < 8 ? b->n - i0 : 8;
        prefetch_rows(st, b, i0, c);
        key_pairs(st, b, i0, c);
        for (int g = b->r0; g < b->r1; g += SCORE_ROWS) {
            switch (b->r1 - g) {
            case 1: scores_rows(st, g, 1, i0); break;
            case 2: scores_rows(st, g, 2, i0); break;
            case 3: scores_rows(st, g, 3, i0); break;
            default: scores_rows(st, g, SCORE_ROWS, i0); break;
            }
        }
    }
}

/* 16 values of position row v from element d, as F32. */
static inline __m512 value16(const attn_state *st, const char *v, int d)
{
    if (st->f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const cv_fp16 *)v + d)));
    return _mm512_loadu_ps((const float *)v + d);
}

/* 3. Values of NR rows from g by NV vectors from element d: out scaled by
 * alpha, then out += P[i] * v_i over the block's positions in order. */
static inline __attribute__((always_inline)) void values_tile(const attn_state *st, const attn_block *b, int g,
                                                               int NR, int d, int NV)
{
    float *out[TILE_HEADS];
    __m512 acc[TILE_HEADS][TILE_VECS];
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        const __m512 alpha = _mm512_set1_ps(st->alpha[g + r]);
        out[r] = attn_out(st, g + r) + d;
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++) {
            acc[r][c] = _mm512_loadu_ps(out[r] + 16 * c);
            if (st->alpha[g + r] != 1.0f)
                acc[r][c] = _mm512_mul_ps(acc[r][c], alpha);
        }
    }
    for (int i = 0; i < b->n; i++) {
        const char *v = b->vb + (size_t)i * st->rstride;
        __m512 vv[TILE_VECS];
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            vv[c] = value16(st, v, d + 16 * c);
        #pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 p = _mm512_set1_ps(st->S[(size_t)(g + r) * CV_ATTN_BLOCK + i]);
            #pragma GCC unroll 4
            for (int c = 0; c < NV; c++)
                acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            _mm512_storeu_ps(out[r] + 16 * c, acc[r][c]);
}

/* The tiles of rows g .. g + NR: whole tiles of 4 vectors, then single
 * vectors. */
static inline __attribute__((always_inline)) void values_heads(const attn_state *st, const attn_block *b, int g,
                                                                int NR)
{
    int d = 0;
    for (; d + 16 * TILE_VECS <= st->hd; d += 16 * TILE_VECS)
        values_tile(st, b, g, NR, d, TILE_VECS);
    for (; d < st->hd; d += 16)
        values_tile(st, b, g, NR, d, 1);
}

static void block_values(const attn_state *st, const attn_block *b)
{
    for (int g = b->r0; g < b->r1; g += TILE_HEADS) {
        switch (b->r1 - g) {
        case 1: values_heads(st, b, g, 1); break;
        case 2: values_heads(st, b, g, 2); break;
        case 3: values_heads(st, b, g, 3); break;
        default: values_heads(st, b, g, TILE_HEADS); break;
        }
    }
}

/* The end: out[g] / l_g. */
static void attn_finish(const attn_state *st)
{
    for (int g = 0; g < st->G; g++) {
        const __m512 l = _mm512_set1_ps(st->l[g]);
        float *o = attn_out(st, g);
        for (int d = 0; d < st->hd; d += 16)
            _mm512_storeu_ps(o + d, _mm512_div_ps(_mm512_loadu_ps(o + d), l));
    }
}

/* One block for its rows. */
static void run_block(const attn_state *st, const attn_block *b)
{
    block_scores(st, b);  /* 1. scores */
    attn_softcap_block(st, b, softcap_row8);
    block_softmax(st, b); /* 2. online softmax */
    block_values(st, b);  /* 3. values */
}

void cv_attn_group_avx512(const cv_attn_args *a)
{
    if (a->head_dim % 16 != 0) {
        cv_attn_group_avx2(a);
        return;
    }
    attn_state st;
    attn_init(&st, a);
    attn_blocks(&st, run_block);
    attn_sinks(&st);
    attn_finish(&st);
}
