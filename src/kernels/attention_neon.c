/* attention_neon.c: the fused attention with NEON (aarch64), lane for lane
 * the schedule of attention.h; an 8-lane vector is two float32x4 (lanes
 * 0-3, 4-7); max and exp are attention_neon.h's. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_impl.h"
#include "kernels/attention_neon.h"

/* attn_tanh on 4 lanes. */
static inline float32x4_t tanh4(float32x4_t x)
{
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    const float32x4_t one = vdupq_n_f32(1.0f);
    const uint32x4_t xb = vreinterpretq_u32_f32(x);
    const float32x4_t e = exp4(vmulq_f32(vdupq_n_f32(-2.0f), vreinterpretq_f32_u32(vbicq_u32(xb, sign))));
    const uint32x4_t t = vreinterpretq_u32_f32(vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e)));
    return vreinterpretq_f32_u32(vorrq_u32(vbicq_u32(t, sign), vandq_u32(xb, sign)));
}

/* attn_softcap_row, 4 scores at a time. */
static inline void softcap_row4(float *S, int n, float cap)
{
    const float32x4_t c = vdupq_n_f32(cap);
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(S + i, vmulq_f32(c, tanh4(vdivq_f32(vld1q_f32(S + i), c))));
    attn_softcap_row(S + i, n - i, cap);
}

static inline float32x4_t load4(const void *row, int f16, int d)
{
    if (f16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)row + d)));
    return vld1q_f32((const float *)row + d);
}

/* Scores of 8 positions (rows kr[0..8), f32) for query q, into s[0..8):
 * per position (v0+v1)+(v2+v3) of lanes 0-3 plus the same of 4-7. */
static inline void scores8(const float *q, const float *const *kr, int hd, float scale, float *s)
{
    const int full = hd - hd % 8;
    float32x4_t lo[8], hi[8];
    for (int j = 0; j < 8; j++)
        lo[j] = hi[j] = vdupq_n_f32(0.0f);
    for (int c = 0; c < full; c += 8) {
        const float32x4_t q0 = vld1q_f32(q + c), q1 = vld1q_f32(q + c + 4);
        for (int j = 0; j < 8; j++) {
            lo[j] = vfmaq_f32(lo[j], q0, vld1q_f32(kr[j] + c));
            hi[j] = vfmaq_f32(hi[j], q1, vld1q_f32(kr[j] + c + 4));
        }
    }
    for (int h = 0; h < 2; h++) { /* positions 4h .. 4h+3 */
        const float32x4_t *L = lo + 4 * h, *H = hi + 4 * h;
        const float32x4_t sl = vpaddq_f32(vpaddq_f32(L[0], L[1]), vpaddq_f32(L[2], L[3]));
        const float32x4_t sh = vpaddq_f32(vpaddq_f32(H[0], H[1]), vpaddq_f32(H[2], H[3]));
        vst1q_f32(s + 4 * h, vaddq_f32(sl, sh));
    }
    for (int j = 0; j < 8; j++) {
        for (int d = full; d < hd; d++)
            s[j] = fmaf(q[d], kr[j][d], s[j]);
        s[j] = s[j] * scale;
    }
}

#define VG 8

static inline void widen_row(const cv_fp16 *h, float *row, int hd)
{
    int d = 0;
    for (; d + 4 <= hd; d += 4)
        vst1q_f32(row + d, load4(h, 1, d));
    for (; d < hd; d++)
        row[d] = cv_fp16_to_fp32(h[d]);
}

/* 1. Scores of the block, eight positions at a time (missing ones read
 * zeros). */
static inline void block_scores(const attn_state *st, const attn_block *b)
{
    for (int i0 = 0; i0 < b->n; i0 += 8) {
        const int c = b->n - i0 < 8 ? b->n - i0 : 8;
        const float *kr[8];
        attn_key_rows8(st, b, i0, c, widen_row, kr);
        for (int g = b->r0; g < b->r1; g++)
            scores8(attn_q(st, g), kr, st->hd, st->a->scale, st->S + (size_t)g * CV_ATTN_BLOCK + i0);
    }
}

/* 2. The block's max of scores Sg[0..n8): lanes l and l+4 in b0, b1. */
static inline float block_max(const float *Sg, int n8)
{
    float32x4_t b0 = vdupq_n_f32(-INFINITY), b1 = b0;
    for (int i0 = 0; i0 < n8; i0 += 8) {
        b0 = max4(vld1q_f32(Sg + i0), b0);
        b1 = max4(vld1q_f32(Sg + i0 + 4), b1);
    }
    const float32x4_t m4 = max4(b0, b1); /* max(b_l, b_l+4) */
    return attn_max(attn_max(vgetq_lane_f32(m4, 0), vgetq_lane_f32(m4, 2)),
                    attn_max(vgetq_lane_f32(m4, 1), vgetq_lane_f32(m4, 3)));
}

/* 2. P = exp(S - mn) in place (positions n.. zero); returns their sum. */
static inline float block_exp_sum(float *Sg, int n, int n8, float mn)
{
    const float32x4_t mv = vdupq_n_f32(mn);
    float32x4_t t0 = vdupq_n_f32(0.0f), t1 = t0;
    for (int i0 = 0; i0 < n8; i0 += 8) {
        float32x4_t p0v = exp4(vsubq_f32(vld1q_f32(Sg + i0), mv));
        float32x4_t p1v = exp4(vsubq_f32(vld1q_f32(Sg + i0 + 4), mv));
        if (i0 + 8 > n) {
            const int k = n - i0;
            const int32x4_t lane = {0, 1, 2, 3};
            p0v = vbslq_f32(vcltq_s32(lane, vdupq_n_s32(k)), p0v, vdupq_n_f32(0.0f));
            p1v = vbslq_f32(vcltq_s32(vaddq_s32(lane, vdupq_n_s32(4)), vdupq_n_s32(k)), p1v, vdupq_n_f32(0.0f));
        }
        vst1q_f32(Sg + i0, p0v);
        vst1q_f32(Sg + i0 + 4, p1v);
        t0 = vaddq_f32(t0, p0v);
        t1 = vaddq_f32(t1, p1v);
    }
    const float32x4_t s0 = vpaddq_f32(t0, t0), s1 = vpaddq_f32(t1, t1);
    return vgetq_lane_f32(vpaddq_f32(s0, s0), 0) + vgetq_lane_f32(vpaddq_f32(s1, s1), 0);
}

/* 2. Online softmax: S becomes P; m, l, alpha of each row. */
static inline void block_softmax(const attn_state *st, const attn_block *b)
{
    for (int g = b->r0; g < b->r1; g++) {
        float *Sg = st->S + (size_t)g * CV_ATTN_BLOCK;
        for (int i = b->n; i < b->n8; i++)
            Sg[i] = -INFINITY;
        const float mn = attn_max(block_max(Sg, b->n8), st->m[g]);
        st->alpha[g] = attn_exp(st->m[g] - mn);
        st->l[g] = fmaf(st->l[g], st->alpha[g], block_exp_sum(Sg, b->n, b->n8, mn));
        st->m[g] = mn;
    }
}

/* 3. Values, the full chunks: four elements of up to VG rows at a time. */
static inline void block_values_full(const attn_state *st, const attn_block *b)
{
    const int hd = st->hd, f16 = st->f16, n = b->n;
    const size_t rstride = st->rstride;
    for (int g0 = b->r0; g0 < b->r1; g0 += VG) {
        const int ng = b->r1 - g0 < VG ? b->r1 - g0 : VG;
        float *out[VG];
        for (int g = 0; g < ng; g++)
            out[g] = attn_out(st, g0 + g);
        for (int d = 0; d + 4 <= hd; d += 4) {
            float32x4_t acc[VG];
            for (int g = 0; g < ng; g++) {
                acc[g] = vld1q_f32(out[g] + d);
                if (st->alpha[g0 + g] != 1.0f)
                    acc[g] = vmulq_n_f32(acc[g], st->alpha[g0 + g]);
            }
            const float *P = st->S + (size_t)g0 * CV_ATTN_BLOCK;
            for (int i = 0; i < n; i++) {
                const float32x4_t vv = load4(b->vb + (size_t)i * rstride, f16, d);
                for (int g = 0; g < ng; g++)
                    acc[g] = vfmaq_n_f32(acc[g], vv, P[(size_t)g * CV_ATTN_BLOCK + i]);
            }
            for (int g = 0; g < ng; g++)
                vst1q_f32(out[g] + d, acc[g]);
        }
    }
}

/* 3. Values, the tail elements (hd % 4), one at a time. */
static inline void block_values_tail(const attn_state *st, const attn_block *b)
{
    const int hd = st->hd;
    for (int d = hd - hd % 4; d < hd; d++)
        for (int g = b->r0; g < b->r1; g++) {
            float *out = attn_out(st, g);
            float o = out[d];
            if (st->alpha[g] != 1.0f)
                o = o * st->alpha[g];
            for (int i = 0; i < b->n; i++) {
                const void *v = b->vb + (size_t)i * st->rstride;
                const float vd = st->f16 ? cv_fp16_to_fp32(((const cv_fp16 *)v)[d]) : ((const float *)v)[d];
                o = fmaf(st->S[(size_t)g * CV_ATTN_BLOCK + i], vd, o);
            }
            out[d] = o;
        }
}

/* The end: out[g] / l_g. */
static inline void attn_finish(const attn_state *st)
{
    for (int g = 0; g < st->G; g++) {
        float *o = attn_out(st, g);
        for (int d = 0; d < st->hd; d++)
            o[d] = o[d] / st->l[g];
    }
}

/* One block for its rows. */
static void run_block(const attn_state *st, const attn_block *b)
{
    block_scores(st, b);      /* 1. scores */
    attn_softcap_block(st, b, softcap_row4);
    block_softmax(st, b);     /* 2. online softmax */
    block_values_full(st, b); /* 3. values */
    block_values_tail(st, b);
}

void cv_attn_group_neon(const cv_attn_args *a)
{
    attn_state st;
    attn_init(&st, a);
    attn_blocks(&st, run_block);
    attn_sinks(&st);
    attn_finish(&st);
}
