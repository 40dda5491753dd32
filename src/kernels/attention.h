/* attention.h: fused attention over one KV head, for all the query heads
 * of that KV group together (grouped-query attention) and for up to
 * CV_ATTN_TOKENS tokens at consecutive positions of one sequence, with an
 * online softmax over blocks of positions.
 *
 * Contract: cv_attn_group computes, for each token t and each of the
 * `group` query heads g,
 *   out[t][g] = sum_i softmax_i(cap(scale * q[t][g] . K[i])) V[i],
 *   i in [0, n_pos + t), cap(s) = softcap * tanh(s / softcap) when softcap
 *   > 0 (Gemma 2's attention logit soft-capping), else s; with sinks
 *   (gpt-oss), query head g's softmax has one more term in its denominator,
 *   exp(sinks[g]), as if a position of score sinks[g] and value 0 were there,
 * reading each K and V row once for the whole group and all the tokens
 * (the reference: once per token). Token t's result is the bits of a call for
 * it alone (n_tok 1, n_pos + t positions), and depends only on its q, the
 * rows and the arguments (never on threads, batch, other tokens or other
 * query heads): the reference (cv_attn_group_ref), AVX2+FMA+F16C
 * (cv_attn_group_avx2), AVX-512F (cv_attn_group_avx512) and NEON
 * (cv_attn_group_neon) versions give the same bits, NaN payloads aside. K and
 * V rows are F32 or F16 (widened exactly). Dispatch follows
 * cv_kernels_name() (CONVOY_KERNELS=ref, cv_kernels_init(1) force the
 * reference). It allocates nothing: scratch is the caller's, of
 * cv_attn_scratch_floats(head_dim, group * n_tok) floats.
 *
 * The schedule every version follows for each token (hd = head_dim,
 * "8-lane vector" = float[8], fma(a, b, c) = a*b+c rounded once,
 * max(a, b) = a > b ? a : b):
 *
 * Positions are taken in blocks of CV_ATTN_BLOCK (the last one may be
 * shorter); each query head g keeps a running max m_g (starts -inf), a
 * running sum l_g (starts +0) and its accumulator out[g][0..hd) (starts +0).
 * For each block [p0, p1), n = p1 - p0:
 * 1. Scores, for each g and position i of the block: an 8-lane accumulator
 *    a (starts +0); for each full chunk c of 8 elements,
 *    a[l] = fma(q[g][8c+l], k_i[8c+l], a[l]); then
 *    s = ((a0+a1) + (a2+a3)) + ((a4+a5) + (a6+a7)), each element d of the
 *    tail (hd % 8 of them, in order) s = fma(q[g][d], k_i[d], s), and
 *    S[g][i] = s * scale; when softcap > 0, then
 *    S[g][i] = softcap * tanh(S[g][i] / softcap), by the schedule's tanh
 *    (below).
 * 2. Online softmax, for each g: an 8-lane max b[l] (starts -inf) over the
 *    block's scores, lane l taking positions i = l (mod 8) in order,
 *    b[l] = max(S[i], b[l]); mb = max(max(max(b0, b4), max(b2, b6)),
 *    max(max(b1, b5), max(b3, b7))) (each max(x, y) here: x the first
 *    named); m' = max(mb, m_g); alpha = exp(m_g - m'); then
 *    P[i] = exp(S[i] - m') for each i; an 8-lane sum t (starts +0),
 *    t[i % 8] = t[i % 8] + P[i] in order of i; bsum =
 *    ((t0+t1) + (t2+t3)) + ((t4+t5) + (t6+t7)); l_g = fma(l_g, alpha, bsum);
 *    m_g = m'.
 * 3. Values, for each g and element d: when alpha != 1,
 *    out[g][d] = out[g][d] * alpha; then for each i of the block in order,
 *    out[g][d] = fma(P[g][i], v_i[d], out[g][d]).
 * With sinks, after the last block, for each g: the sink is a block of one
 *    score s = sinks[g] (not scaled, not capped) whose value row is zero:
 *    m' = max(s, m_g); alpha = exp(m_g - m'); l_g = fma(l_g, alpha,
 *    exp(s - m')); out[g][d] = out[g][d] * alpha when alpha != 1; m_g = m'.
 * At the end out[g][d] = out[g][d] / l_g.
 *
 * exp(x), for x <= 0 or NaN (Cephes' expf polynomial, every step one IEEE
 * operation): x = max(-87, x) (NaN stays NaN); t = x * log2(e) + 0x1.8p23
 * (two roundings: the product, then the sum, which rounds to an integer
 * n = t - 0x1.8p23, ties to even); r = fma(n, -0.693359375, x);
 * r = fma(n, 2.12194440e-4, r); p = 1.9875691500e-4; p = fma(p, r, c) for c
 * = 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
 * 5.0000001201e-1 in turn; p = fma(p, r * r, r); p = p + 1; exp = p * 2^n,
 * 2^n built from the bits of t (((bits(t) - bits(0x1.8p23)) + 127) << 23,
 * in uint32). Within 2 ulp of expf for x in [-87, 0]; exp(0) = 1 exactly.
 *
 * tanh(x): e = exp(-2 * |x|) (the exp above), t = (1 - e) / (1 + e), then
 * x's sign on t (copysign). Within 1.2e-7 of tanh, absolute. */
#ifndef CONVOY_KERNELS_ATTENTION_H
#define CONVOY_KERNELS_ATTENTION_H

#include <stddef.h>

#include "kernels/types.h"

/* Positions per online-softmax block (part of the schedule: every version
 * uses it). */
#define CV_ATTN_BLOCK 64

/* Tokens one call takes at most. */
#define CV_ATTN_TOKENS 8

typedef struct cv_attn_args {
    int head_dim;     /* hd >= 1 */
    int group;        /* query heads sharing this KV head, >= 1 */
    int n_tok;        /* tokens, [1, CV_ATTN_TOKENS] */
    int n_pos;        /* token t attends positions [0, n_pos + t), n_pos >= 1 */
    float scale;      /* multiplies each score (1/sqrt(hd)) */
    float softcap;    /* > 0: each scaled score s becomes softcap * tanh(s / softcap); 0: off */
    const float *sinks; /* [group] each query head's sink logit (gpt-oss), or NULL */
    const float *q;   /* token t's [group][hd] at q + t * tok_stride */
    size_t tok_stride; /* floats from one token's q (and out) heads to the next's */
    cv_type kv_type;  /* CV_TYPE_F32 or CV_TYPE_F16 */
    const void *k;    /* position 0's hd values of this KV head */
    const void *v;
    size_t kv_stride; /* elements from one position's row to the next */
    float *out;       /* token t's [group][hd] at out + t * tok_stride */
    float *scratch;   /* cv_attn_scratch_floats(hd, group * n_tok) floats */
} cv_attn_args;

/* Scratch floats cv_attn_group needs for `rows` query rows (group * n_tok). */
size_t cv_attn_scratch_floats(int head_dim, int rows);

/* Selected implementation (see cv_kernels_name). */
void cv_attn_group(const cv_attn_args *a);

/* The versions (private to src/kernels and its tests). */
void cv_attn_group_ref(const cv_attn_args *a);
#if defined(__x86_64__)
void cv_attn_group_avx2(const cv_attn_args *a);
void cv_attn_group_avx512(const cv_attn_args *a);
#endif
#if defined(__aarch64__)
void cv_attn_group_neon(const cv_attn_args *a);
#endif

/* Scratch layout shared by the versions, for `rows` query rows (row
 * t * group + g is token t's query head g): scores [rows][CV_ATTN_BLOCK], then
 * m [rows], l [rows], alpha [rows], then 8 rows of hd floats (F16 keys
 * widened by the SIMD versions). */
#define CV_ATTN_SCRATCH(hd, rows) \
    ((size_t)(rows) * (CV_ATTN_BLOCK + 3) + 8 * (size_t)(hd) + 16)

#endif
