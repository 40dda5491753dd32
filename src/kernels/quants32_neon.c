/* quants32_neon.c: the Q5_0, Q5_1, IQ4_NL, IQ4_XS and MXFP4 dot products with NEON
 * (aarch64, baseline ARMv8-A).
 *
 * The schedule of kernels_impl.h, as cv_vec_dot_q4_0_q8_0_neon computes it:
 * each block's exact int32 sum from widening multiplies and pairwise adds
 * of its signed weights (Q5_0: q - 16, Q5_1: q, IQ4_NL and MXFP4: the
 * table value by a table lookup), then the same scalar fmaf into accumulator b % 8 as the
 * reference, and hsum8 (IQ4_XS: its sub-block sums times ls - 32 in int32,
 * one fmaf per super-block). So the bits are those of vec_dot_*_ref. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/quants32.h"

static inline float hsum8(const float acc[8])
{
    const float32x4_t t = vaddq_f32(vld1q_f32(acc), vld1q_f32(acc + 4)); /* v[l] + v[l+4] */
    const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));   /* t[l] + t[l+2] */
    return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

static inline float fp16_to_f32(cv_fp16 h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* The exact sum of p[j] * q[j] over 16 int8 pairs. */
static inline int32_t dot16(int8x16_t p, int8x16_t q)
{
    const int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(p), vget_low_s8(q)));
    const int32x4_t b = vpaddlq_s16(vmull_high_s8(p, q));
    return vaddvq_s32(vaddq_s32(a, b));
}

/* 16 where bit j (j < 16) of bits is set, else 0, in byte j. */
static inline uint8x16_t fifth_bits16(uint32_t bits)
{
    static const uint8_t mask_bytes[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t spread = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(spread, vld1q_u8(mask_bytes)), vdupq_n_u8(16));
}

/* A Q5 block's 5-bit quants, minus offset: elements 0..15 (*lo), 16..31 (*hi). */
static inline void quants5(const uint8_t *qs, const uint8_t qh[4], int offset, int8x16_t *lo, int8x16_t *hi)
{
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    const uint8x16_t packed = vld1q_u8(qs);
    const uint8x16_t q_lo = vorrq_u8(vandq_u8(packed, vdupq_n_u8(15)), fifth_bits16(bits));
    const uint8x16_t q_hi = vorrq_u8(vshrq_n_u8(packed, 4), fifth_bits16(bits >> 16));
    *lo = vsubq_s8(vreinterpretq_s8_u8(q_lo), vdupq_n_s8((int8_t)offset));
    *hi = vsubq_s8(vreinterpretq_s8_u8(q_hi), vdupq_n_s8((int8_t)offset));
}

float cv_vec_dot_q5_0_q8_0_neon(int n, const void *vw, const void *vx)
{
    const block_q5_0 *w = vw;
    const block_q8_0 *x = vx;
    float acc[8] = {0};
    for (int b = 0; b < n / QK5_0; b++) {
        int8x16_t lo, hi;
        quants5(w[b].qs, w[b].qh, 16, &lo, &hi);
        const int32_t s = dot16(lo, vld1q_s8(x[b].qs)) + dot16(hi, vld1q_s8(x[b].qs + 16));
        const float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        acc[b % 8] = fmaf(d, (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}

float cv_vec_dot_q5_1_q8_1_neon(int n, const void *vw, const void *vx)
{
    const block_q5_1 *w = vw;
    const block_q8_1 *x = vx;
    float acc[8] = {0};
    for (int b = 0; b < n / QK5_1; b++) {
        int8x16_t lo, hi;
        quants5(w[b].qs, w[b].qh, 0, &lo, &hi);
        const int32_t s = dot16(lo, vld1q_s8(x[b].qs)) + dot16(hi, vld1q_s8(x[b].qs + 16));
        const float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        acc[b % 8] = fmaf(fp16_to_f32(w[b].m), fp16_to_f32(x[b].s), fmaf(d, (float)s, acc[b % 8]));
    }
    return hsum8(acc);
}

/* The exact sum of the 32 values of the nibbles of qs (Q4_0's order;
 * nibble q is values[q], IQ4_NL's or MXFP4's table) times the 32 int8
 * quants y. */
static inline int32_t dot_table(const int8_t values[16], const uint8_t qs[16], const int8_t *y)
{
    const int8x16_t table = vld1q_s8(values);
    const uint8x16_t packed = vld1q_u8(qs);
    const int8x16_t k_lo = vqtbl1q_s8(table, vandq_u8(packed, vdupq_n_u8(15)));
    const int8x16_t k_hi = vqtbl1q_s8(table, vshrq_n_u8(packed, 4));
    return dot16(k_lo, vld1q_s8(y)) + dot16(k_hi, vld1q_s8(y + 16));
}

float cv_vec_dot_iq4_nl_q8_0_neon(int n, const void *vw, const void *vx)
{
    const block_iq4_nl *w = vw;
    const block_q8_0 *x = vx;
    float acc[8] = {0};
    for (int b = 0; b < n / QK4_NL; b++) {
        const int32_t s = dot_table(cv_kvalues_iq4nl, w[b].qs, x[b].qs);
        const float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        acc[b % 8] = fmaf(d, (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}

float cv_vec_dot_iq4_xs_q8_K_neon(int n, const void *vw, const void *vx)
{
    const block_iq4_xs *w = vw;
    const block_q8_K *x = vx;
    float acc = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        int32_t isum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++)
            isum += (iq4_xs_scale(&w[i], ib) - 32) * dot_table(cv_kvalues_iq4nl, w[i].qs + 16 * ib, x[i].qs + 32 * ib);
        acc = fmaf(x[i].d * fp16_to_f32(w[i].d), (float)isum, acc);
    }
    return acc;
}

float cv_vec_dot_mxfp4_q8_0_neon(int n, const void *vw, const void *vx)
{
    const block_mxfp4 *w = vw;
    const block_q8_0 *x = vx;
    float acc[8] = {0};
    for (int b = 0; b < n / QK_MXFP4; b++) {
        const int32_t s = dot_table(cv_kvalues_mxfp4, w[b].qs, x[b].qs);
        acc[b % 8] = fmaf(mxfp4_scale(w[b].e) * fp16_to_f32(x[b].d), (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}
