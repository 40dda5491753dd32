/* kquants_neon.c: K-quant dot products with NEON (aarch64).
 *
 * The same arithmetic as kquants_avx2.c, on 128-bit vectors: the int32
 * sums of a super-block are formed in two int32x4 (lanes 0..3: weights
 * 0..15 of each 32-weight group, lanes 4..7: weights 16..31), each lane the
 * exact sum over 4 consecutive weights (vdotq_s32 where the CPU has the dot
 * product extension, else widening multiplies and pairwise adds, which
 * group the same 4 weights). The float part is the one of the reference:
 * Q4_K/Q5_K fuse the whole sums of a super-block into two scalars, acc =
 * fma(d, isum, acc) and accm = fma(dmin, msum, accm), and return acc -
 * accm; Q6_K fuses its whole sum into one, acc = fma(d, isum, acc). So
 * the results are bit-identical to vec_dot_*_ref and the AVX2 kernels.
 * Q2_K and Q3_K form their whole int32 sums in one int32x4 and fuse them
 * as the reference does (Q2_K as Q4_K, Q3_K into one scalar). */
#include <arm_neon.h>
#include <math.h>

#include "kernels/kquants.h"
#include "kernels/kquants_impl.h"

/* Lane k: sum of a[e] * b[e] for e = 4k..4k+3. */
static inline int32x4_t dot4(int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t p1 = vmull_high_s8(a, b);
    return vpaddlq_s16(vpaddq_s16(p0, p1));
#endif
}

/* Lane k: mn[2k] * s[2k] + mn[2k+1] * s[2k+1], s[j] the int16 sum of the
 * two bsums of sub-block j. */
static inline int32x4_t mins_dot(const uint8_t mn[8], const int16_t *bsums)
{
    const int16x8_t s = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vpaddq_s32(vmull_s16(vget_low_s16(m), vget_low_s16(s)), vmull_high_s16(m, s));
}

/* Sum of a[j] * b[j] over 16 int16 lanes: a0 holds a[0..7], a1 a[8..15]. */
static inline int32_t dot16_s16(int16x8_t a0, int16x8_t a1, const int16_t *b)
{
    const int16x8_t b0 = vld1q_s16(b), b1 = vld1q_s16(b + 8);
    int32x4_t t = vaddq_s32(vmull_s16(vget_low_s16(a0), vget_low_s16(b0)), vmull_high_s16(a0, b0));
    t = vaddq_s32(t, vaddq_s32(vmull_s16(vget_low_s16(a1), vget_low_s16(b1)), vmull_high_s16(a1, b1)));
    return vaddvq_s32(t);
}

/* Sum over the 16 sub-blocks of sc[s] * (q * y) for 2-bit quants qs (Q2_K's
 * layout) with, for Q3_K (hm not NULL), the third bits of hmask hm. */
static inline int32_t dot_q23(const uint8_t *qs, const uint8_t *hm, const int8_t sc[16], const int8_t *y)
{
    const uint8x16_t m3 = vdupq_n_u8(3), bit2 = vdupq_n_u8(4);
    int32x4_t isum = vdupq_n_s32(0);
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) { /* weights 16 * half .. of each group of 32 */
            const uint8x16_t qb = vld1q_u8(qs + 32 * h + 16 * half);
            const uint8x16_t hb = hm ? vld1q_u8(hm + 16 * half) : vdupq_n_u8(0);
            for (int j = 0; j < 4; j++) {
                uint8x16_t q = vandq_u8(vshlq_u8(qb, vdupq_n_s8((int8_t)(-2 * j))), m3);
                q = vorrq_u8(q, vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(2 - 4 * h - j))), bit2));
                const int8x16_t yv = vld1q_s8(y + 128 * h + 32 * j + 16 * half);
                isum = vmlaq_n_s32(isum, dot4(vreinterpretq_s8_u8(q), yv), sc[8 * h + 2 * j + half]);
            }
        }
    return vaddvq_s32(isum);
}

float cv_vec_dot_q2_K_q8_K_neon(int n, const void *w, const void *x)
{
    const block_q2_K *wb = w;
    const block_q8_K *xb = x;
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8x16_t sc8 = vld1q_u8(wb[i].scales);
        int8_t sc[16];
        vst1q_s8(sc, vreinterpretq_s8_u8(vandq_u8(sc8, vdupq_n_u8(0x0F))));
        const uint8x16_t mn = vshrq_n_u8(sc8, 4);
        const int32_t msum = dot16_s16(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn))),
                                       vreinterpretq_s16_u16(vmovl_high_u8(mn)), xb[i].bsums);
        const int32_t isum = dot_q23(wb[i].qs, NULL, sc, xb[i].qs);
        kq_fuse_dmin(&acc, &accm, xb[i].d, wb[i].d, wb[i].dmin, isum, msum);
    }
    return acc - accm;
}

float cv_vec_dot_q3_K_q8_K_neon(int n, const void *w, const void *x)
{
    const block_q3_K *wb = w;
    const block_q8_K *xb = x;
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        kq_q3_scales(wb[i].scales, sc);
        const int8x16_t sv = vld1q_s8(sc);
        const int32_t offs = dot16_s16(vmovl_s8(vget_low_s8(sv)), vmovl_high_s8(sv), xb[i].bsums);
        const int32_t isum = dot_q23(wb[i].qs, wb[i].hmask, sc, xb[i].qs) - 4 * offs;
        acc = fmaf(xb[i].d * cv_fp16_to_fp32(wb[i].d), (float)isum, acc);
    }
    return acc;
}

float cv_vec_dot_q4_K_q8_K_neon(int n, const void *w, const void *x)
{
    const block_q4_K *wb = w;
    const block_q8_K *xb = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(wb[i].scales, sc, mn);
        const uint8_t *q = wb[i].qs;
        const int8_t *y = xb[i].qs;
        int32x4_t isum_lo = vdupq_n_s32(0), isum_hi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            const uint8x16_t qa = vld1q_u8(q + 32 * j), qb = vld1q_u8(q + 32 * j + 16);
            const int8x16_t lo_a = vreinterpretq_s8_u8(vandq_u8(qa, m4));
            const int8x16_t lo_b = vreinterpretq_s8_u8(vandq_u8(qb, m4));
            const int8x16_t hi_a = vreinterpretq_s8_u8(vshrq_n_u8(qa, 4));
            const int8x16_t hi_b = vreinterpretq_s8_u8(vshrq_n_u8(qb, 4));
            const int8_t *yj = y + 64 * j;
            isum_lo = vmlaq_n_s32(isum_lo, dot4(lo_a, vld1q_s8(yj)), sc[2 * j]);
            isum_hi = vmlaq_n_s32(isum_hi, dot4(lo_b, vld1q_s8(yj + 16)), sc[2 * j]);
            isum_lo = vmlaq_n_s32(isum_lo, dot4(hi_a, vld1q_s8(yj + 32)), sc[2 * j + 1]);
            isum_hi = vmlaq_n_s32(isum_hi, dot4(hi_b, vld1q_s8(yj + 48)), sc[2 * j + 1]);
        }
        const float d = xb[i].d * cv_fp16_to_fp32(wb[i].d);
        const float dm = xb[i].d * cv_fp16_to_fp32(wb[i].dmin);
        acc = fmaf(d, (float)vaddvq_s32(vaddq_s32(isum_lo, isum_hi)), acc);
        accm = fmaf(dm, (float)vaddvq_s32(mins_dot(mn, xb[i].bsums)), accm);
    }
    return acc - accm;
}

float cv_vec_dot_q5_K_q8_K_neon(int n, const void *w, const void *x)
{
    const block_q5_K *wb = w;
    const block_q8_K *xb = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), bit4 = vdupq_n_u8(0x10);
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(wb[i].scales, sc, mn);
        const uint8_t *q = wb[i].qs;
        const int8_t *y = xb[i].qs;
        /* bit 2j of qh[l]: fifth bit of weight 64j + l; bit 2j+1: of 64j + 32 + l */
        uint8x16_t ha = vld1q_u8(wb[i].qh), hb = vld1q_u8(wb[i].qh + 16);
        int32x4_t isum_lo = vdupq_n_s32(0), isum_hi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            const uint8x16_t qa = vld1q_u8(q + 32 * j), qb = vld1q_u8(q + 32 * j + 16);
            const int8x16_t lo_a = vreinterpretq_s8_u8(
                vorrq_u8(vandq_u8(qa, m4), vandq_u8(vshlq_n_u8(ha, 4), bit4)));
            const int8x16_t lo_b = vreinterpretq_s8_u8(
                vorrq_u8(vandq_u8(qb, m4), vandq_u8(vshlq_n_u8(hb, 4), bit4)));
            const int8x16_t hi_a = vreinterpretq_s8_u8(
                vorrq_u8(vshrq_n_u8(qa, 4), vandq_u8(vshlq_n_u8(ha, 3), bit4)));
            const int8x16_t hi_b = vreinterpretq_s8_u8(
                vorrq_u8(vshrq_n_u8(qb, 4), vandq_u8(vshlq_n_u8(hb, 3), bit4)));
            ha = vshrq_n_u8(ha, 2);
            hb = vshrq_n_u8(hb, 2);
            const int8_t *yj = y + 64 * j;
            isum_lo = vmlaq_n_s32(isum_lo, dot4(lo_a, vld1q_s8(yj)), sc[2 * j]);
            isum_hi = vmlaq_n_s32(isum_hi, dot4(lo_b, vld1q_s8(yj + 16)), sc[2 * j]);
            isum_lo = vmlaq_n_s32(isum_lo, dot4(hi_a, vld1q_s8(yj + 32)), sc[2 * j + 1]);
            isum_hi = vmlaq_n_s32(isum_hi, dot4(hi_b, vld1q_s8(yj + 48)), sc[2 * j + 1]);
        }
        const float d = xb[i].d * cv_fp16_to_fp32(wb[i].d);
        const float dm = xb[i].d * cv_fp16_to_fp32(wb[i].dmin);
        acc = fmaf(d, (float)vaddvq_s32(vaddq_s32(isum_lo, isum_hi)), acc);
        accm = fmaf(dm, (float)vaddvq_s32(mins_dot(mn, xb[i].bsums)), accm);
    }
    return acc - accm;
}

float cv_vec_dot_q6_K_q8_K_neon(int n, const void *w, const void *x)
{
    const block_q6_K *wb = w;
    const block_q8_K *xb = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m30 = vdupq_n_u8(0x30);
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const int8_t *sc = wb[i].scales;
        const int8_t *y = xb[i].qs;
        int32x4_t isum_lo = vdupq_n_s32(0), isum_hi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = wb[i].ql + 64 * h, *qh = wb[i].qh + 32 * h;
            for (int half = 0; half < 2; half++) {
                /* weights 16 * half .. 16 * half + 15 of the four groups */
                const uint8x16_t l0 = vld1q_u8(ql + 16 * half), l1 = vld1q_u8(ql + 32 + 16 * half);
                const uint8x16_t hb = vld1q_u8(qh + 16 * half);
                int8x16_t qv[4];
                qv[0] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m30)));
                qv[1] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(hb, 2), m30)));
                qv[2] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(hb, m30)));
                qv[3] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m30)));
                int32x4_t s = half ? isum_hi : isum_lo;
                for (int m = 0; m < 4; m++) {
                    const int g = 4 * h + m;
                    s = vmlaq_n_s32(s, dot4(qv[m], vld1q_s8(y + 32 * g + 16 * half)), sc[2 * g + half]);
                }
                if (half)
                    isum_hi = s;
                else
                    isum_lo = s;
            }
        }
        /* offset 32: lane k gets sc[2k] * bsums[2k] + sc[2k+1] * bsums[2k+1] */
        const int16x8_t sc_a = vmovl_s8(vld1_s8(sc)), sc_b = vmovl_s8(vld1_s8(sc + 8));
        const int16x8_t bs_a = vld1q_s16(xb[i].bsums), bs_b = vld1q_s16(xb[i].bsums + 8);
        const int32x4_t offs_lo = vpaddq_s32(vmull_s16(vget_low_s16(sc_a), vget_low_s16(bs_a)),
                                             vmull_high_s16(sc_a, bs_a));
        const int32x4_t offs_hi = vpaddq_s32(vmull_s16(vget_low_s16(sc_b), vget_low_s16(bs_b)),
                                             vmull_high_s16(sc_b, bs_b));
        isum_lo = vsubq_s32(isum_lo, vshlq_n_s32(offs_lo, 5));
        isum_hi = vsubq_s32(isum_hi, vshlq_n_s32(offs_hi, 5));
        acc = fmaf(xb[i].d * cv_fp16_to_fp32(wb[i].d), (float)vaddvq_s32(vaddq_s32(isum_lo, isum_hi)), acc);
    }
    return acc;
}
