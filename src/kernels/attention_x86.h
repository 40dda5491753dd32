/* attention_x86.h: what the x86 versions of the fused attention share
 * (private to src/kernels; for files built with at least -mavx2 -mfma
 * -mf16c): the schedule's exp and tanh on 8 lanes, the software prefetch of the
 * rows, and the online softmax of step 2, which both versions run on
 * 8-lane vectors because the schedule's max and sum are 8-lane. */
#ifndef CONVOY_KERNELS_ATTENTION_X86_H
#define CONVOY_KERNELS_ATTENTION_X86_H

#include <immintrin.h>
#include <math.h>

#include "kernels/attention_impl.h"
#include "kernels/avx2_impl.h"

static inline __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(ATTN_EXP_LO), x); /* -87 > x ? -87 : x */
    const __m256 magic = _mm256_set1_ps(ATTN_MAGIC);
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_LOG2E)), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ATTN_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(ATTN_C2), r);
    __m256 p = _mm256_set1_ps(ATTN_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32((int)ATTN_MAGIC_BITS)),
                         _mm256_set1_epi32(127)),
        23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* attn_tanh on 8 lanes. */
static inline __m256 tanh8(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, x));
}

/* attn_softcap_row, 8 scores at a time. */
static inline void softcap_row8(float *S, int n, float cap)
{
    const __m256 c = _mm256_set1_ps(cap);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(S + i, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(S + i), c))));
    attn_softcap_row(S + i, n - i, cap);
}

static inline float hsum8_hadd(__m256 t)
{
    const __m256 h = _mm256_hadd_ps(t, t);
    const __m256 h2 = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

/* Software prefetch (no effect on the bits): a long context's rows come
 * from DRAM, and one KV head's rows are kv_stride apart, a pattern the
 * hardware prefetcher follows badly. Keys are fetched this many positions
 * ahead of the scores; a block's values while its scores are computed. */
#define PF_POS 32

static inline void prefetch_row(const char *row, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        prefetch_t0(row + o);
}

/* Prefetch the keys PF_POS positions ahead and the values of positions
 * i0 .. i0 + c of the block. */
static inline void prefetch_rows(const attn_state *st, const attn_block *b, int i0, int c)
{
    const size_t bytes = (size_t)st->hd * st->esz;
    const int pf = b->p0 + i0 + PF_POS, pf_n = st->a->n_pos - pf < 8 ? st->a->n_pos - pf : 8;
    for (int j = 0; j < pf_n; j++)
        prefetch_row((const char *)st->a->k + (size_t)(pf + j) * st->rstride, bytes);
    for (int j = 0; j < c; j++)
        prefetch_row(b->vb + (size_t)(i0 + j) * st->rstride, bytes);
}

/* 2. Online softmax of query head g: S[g] becomes P[g]; m, l, alpha. */
static inline void softmax_head(const attn_state *st, const attn_block *b, int g, __m256 tail_mask)
{
    const int n = b->n, n8 = b->n8;
    float *Sg = st->S + (size_t)g * CV_ATTN_BLOCK;
    for (int i = n; i < n8; i++)
        Sg[i] = -INFINITY;
    __m256 bm = _mm256_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < n8; i0 += 8)
        bm = _mm256_max_ps(_mm256_loadu_ps(Sg + i0), bm);
    const float mn = attn_max(hmax8(bm), st->m[g]);
    st->alpha[g] = attn_exp(st->m[g] - mn);
    const __m256 mv = _mm256_set1_ps(mn);
    __m256 t = _mm256_setzero_ps();
    for (int i0 = 0; i0 < n8; i0 += 8) {
        __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(Sg + i0), mv));
        if (i0 + 8 > n)
            p = _mm256_and_ps(p, tail_mask);
        _mm256_storeu_ps(Sg + i0, p);
        t = _mm256_add_ps(t, p);
    }
    st->l[g] = fmaf(st->l[g], st->alpha[g], hsum8_hadd(t));
    st->m[g] = mn;
}

static inline void block_softmax(const attn_state *st, const attn_block *b)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 tail_mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(b->n - (b->n8 - 8)), lane));
    for (int g = b->r0; g < b->r1; g++)
        softmax_head(st, b, g, tail_mask);
}

#endif
