/* attention_impl.h: what every version of the attention schedule (see
 * attention.h) shares: max, the exp polynomial, the kernel's state over
 * its scratch, the blocks of positions and the gathering of key rows.
 * Private to src/kernels. */
#ifndef CONVOY_KERNELS_ATTENTION_IMPL_H
#define CONVOY_KERNELS_ATTENTION_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention.h"

/* x86 maxps and the schedule's max: the second operand unless a > b. */
static inline float attn_max(float a, float b) { return a > b ? a : b; }

#define ATTN_EXP_LO (-87.0f)
#define ATTN_LOG2E 1.44269504088896341f
#define ATTN_MAGIC 12582912.0f /* 0x1.8p23 */
#define ATTN_MAGIC_BITS 0x4B400000u
#define ATTN_C1 0.693359375f
#define ATTN_C2 2.12194440e-4f
#define ATTN_P0 1.9875691500e-4f
#define ATTN_P1 1.3981999507e-3f
#define ATTN_P2 8.3334519073e-3f
#define ATTN_P3 4.1665795894e-2f
#define ATTN_P4 1.6666665459e-1f
#define ATTN_P5 5.0000001201e-1f

/* exp(x) for x <= 0 (or NaN), the schedule's polynomial. */
static inline float attn_exp(float x)
{
    x = attn_max(ATTN_EXP_LO, x);
    const float t = x * ATTN_LOG2E + ATTN_MAGIC;
    const float n = t - ATTN_MAGIC;
    float r = fmaf(n, -ATTN_C1, x);
    r = fmaf(n, ATTN_C2, r);
    float p = ATTN_P0;
    p = fmaf(p, r, ATTN_P1);
    p = fmaf(p, r, ATTN_P2);
    p = fmaf(p, r, ATTN_P3);
    p = fmaf(p, r, ATTN_P4);
    p = fmaf(p, r, ATTN_P5);
    p = fmaf(p, r * r, r);
    p = p + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    const uint32_t eb = ((tb - ATTN_MAGIC_BITS) + 127u) << 23;
    float e;
    memcpy(&e, &eb, sizeof e);
    return p * e;
}

/* tanh(x) = copysign((1 - e) / (1 + e), x), e = exp(-2|x|) by the
 * schedule's exp: every step one IEEE operation, so the vector versions
 * give these bits lane for lane. Within 1.2e-7 of tanh (absolute). */
static inline float attn_tanh(float x)
{
    const float e = attn_exp(-2.0f * fabsf(x));
    return copysignf((1.0f - e) / (1.0f + e), x);
}

/* Soft-caps n scores in place: s = cap * tanh(s / cap). */
static inline void attn_softcap_row(float *S, int n, float cap)
{
    for (int i = 0; i < n; i++)
        S[i] = cap * attn_tanh(S[i] / cap);
}

/* The sink s of one query row (attention.h): a block of one score whose
 * value row is zero, after the row's last block. m, l: the row's running
 * max and sum; out its hd values. Scalar in every version: one row's
 * few operations, the bits of the schedule. */
static inline void attn_sink(float s, float *m, float *l, float *out, int hd)
{
    const float mn = attn_max(s, *m);
    const float alpha = attn_exp(*m - mn);
    *l = fmaf(*l, alpha, attn_exp(s - mn));
    if (alpha != 1.0f)
        for (int d = 0; d < hd; d++)
            out[d] = out[d] * alpha;
    *m = mn;
}

/* The kernel's state: the arguments, derived sizes and the scratch
 * pointers (layout of CV_ATTN_SCRATCH). */
typedef struct attn_state {
    const cv_attn_args *a;
    int hd, G, f16, full; /* G: query rows, group * n_tok */
    size_t esz, rstride;
    float *S, *m, *l, *alpha;
    float *kw; /* 8 widened F16 rows; for F32 keys, row 0 is the zero row */
} attn_state;

/* One block of positions [p0, p0 + n), n8 = n rounded up to 8, for the
 * query rows [r0, r1). */
typedef struct attn_block {
    int p0, n, n8, r0, r1;
    const char *kb, *vb; /* the block's first K and V rows */
} attn_block;

/* Query row r's q and out: token r / group's query head r % group. */
static inline const float *attn_q(const attn_state *st, int r)
{
    const cv_attn_args *a = st->a;
    return a->q + (size_t)(r / a->group) * a->tok_stride + (size_t)(r % a->group) * (size_t)st->hd;
}

static inline float *attn_out(const attn_state *st, int r)
{
    const cv_attn_args *a = st->a;
    return a->out + (size_t)(r / a->group) * a->tok_stride + (size_t)(r % a->group) * (size_t)st->hd;
}

/* Start: m = -inf, l = +0, out = +0. */
static inline void attn_init(attn_state *st, const cv_attn_args *a)
{
    st->a = a;
    st->hd = a->head_dim;
    st->G = a->group * a->n_tok;
    st->f16 = a->kv_type == CV_TYPE_F16;
    st->full = st->hd - st->hd % 8;
    st->esz = st->f16 ? sizeof(cv_fp16) : sizeof(float);
    st->rstride = a->kv_stride * st->esz;
    st->S = a->scratch;
    st->m = st->S + (size_t)st->G * CV_ATTN_BLOCK;
    st->l = st->m + st->G;
    st->alpha = st->l + st->G;
    st->kw = st->alpha + st->G;
    for (int g = 0; g < st->G; g++) {
        st->m[g] = -INFINITY;
        st->l[g] = 0.0f;
    }
    for (int t = 0; t < a->n_tok; t++)
        memset(a->out + (size_t)t * a->tok_stride, 0, sizeof(float) * (size_t)a->group * (size_t)st->hd);
}

/* Every query row's sink, when the arguments have them: row r is query
 * head r % group. */
static inline void attn_sinks(const attn_state *st)
{
    const cv_attn_args *a = st->a;
    if (a->sinks)
        for (int r = 0; r < st->G; r++)
            attn_sink(a->sinks[r % a->group], &st->m[r], &st->l[r], attn_out(st, r), st->hd);
}

/* Positions [p0, p0 + n) for the rows [r0, r1). */
static inline attn_block attn_block_rows(const attn_state *st, int p0, int n, int r0, int r1)
{
    attn_block b;
    b.p0 = p0;
    b.n = n;
    b.n8 = (n + 7) & ~7;
    b.r0 = r0;
    b.r1 = r1;
    b.kb = (const char *)st->a->k + (size_t)p0 * st->rstride;
    b.vb = (const char *)st->a->v + (size_t)p0 * st->rstride;
    return b;
}

/* Step 1's soft-capping of the block's scores, rows [r0, r1), by the
 * ISA's row (attn_softcap_row's bits), when the arguments ask for it (a
 * branch per block otherwise). */
typedef void (*attn_softcap_fn)(float *S, int n, float cap);

static inline __attribute__((always_inline)) void attn_softcap_block(const attn_state *st, const attn_block *b,
                                                                      attn_softcap_fn row)
{
    if (st->a->softcap > 0)
        for (int g = b->r0; g < b->r1; g++)
            row(st->S + (size_t)g * CV_ATTN_BLOCK, b->n, st->a->softcap);
}

/* Runs every block of positions of every token with run: the tokens
 * that see all of a block (the later ones) take it together; each earlier
 * token that sees part of it takes its part alone. A token's blocks come
 * in its order, so each token follows the schedule as it would alone. */
typedef void (*attn_block_fn)(const attn_state *st, const attn_block *b);

static inline void attn_blocks(const attn_state *st, attn_block_fn run)
{
    const cv_attn_args *a = st->a;
    const int G = a->group, n_last = a->n_pos + a->n_tok - 1;
    for (int p0 = 0; p0 < n_last; p0 += CV_ATTN_BLOCK) {
        int t_all = p0 + CV_ATTN_BLOCK - a->n_pos; /* the first token that sees the whole block */
        t_all = t_all < 0 ? 0 : t_all > a->n_tok ? a->n_tok : t_all;
        if (t_all < a->n_tok) {
            const attn_block b = attn_block_rows(st, p0, CV_ATTN_BLOCK, t_all * G, a->n_tok * G);
            run(st, &b);
        }
        for (int t = p0 < a->n_pos ? 0 : p0 - a->n_pos + 1; t < t_all; t++) { /* from the first that sees it */
            const attn_block b = attn_block_rows(st, p0, a->n_pos + t - p0, t * G, (t + 1) * G);
            run(st, &b);
        }
    }
}

/* Runs fn on each token alone (n_tok 1, n_pos + t): the versions that
 * take one token at a time. */
static inline void attn_each_token(const cv_attn_args *a, void (*fn)(const cv_attn_args *))
{
    cv_attn_args one = *a;
    one.n_tok = 1;
    for (int t = 0; t < a->n_tok; t++) {
        one.n_pos = a->n_pos + t;
        one.q = a->q + (size_t)t * a->tok_stride;
        one.out = a->out + (size_t)t * a->tok_stride;
        fn(&one);
    }
}

/* Widens hd F16 values to F32. */
typedef void (*attn_widen_fn)(const cv_fp16 *h, float *y, int hd);

/* F32 key rows of positions i0 .. i0 + 8 (c present, the rest zeros); F16
 * rows are widened by the ISA's widen into st->kw. */
static inline __attribute__((always_inline)) void attn_key_rows8(const attn_state *st, const attn_block *b, int i0,
                                                                  int c, attn_widen_fn widen, const float **kr)
{
    const int hd = st->hd;
    if (st->f16) {
        for (int j = 0; j < 8; j++) {
            float *row = st->kw + (size_t)j * hd;
            if (j < c)
                widen((const cv_fp16 *)(b->kb + (size_t)(i0 + j) * st->rstride), row, hd);
            else
                memset(row, 0, sizeof(float) * (size_t)hd);
            kr[j] = row;
        }
    } else {
        float *zero = st->kw;
        if (c < 8)
            memset(zero, 0, sizeof(float) * (size_t)hd);
        for (int j = 0; j < 8; j++)
            kr[j] = j < c ? (const float *)(b->kb + (size_t)(i0 + j) * st->rstride) : zero;
    }
}

#endif
