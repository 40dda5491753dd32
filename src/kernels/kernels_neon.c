/* kernels_neon.c: NEON kernels (aarch64, baseline ARMv8-A: no dotprod or
 * fp16 arithmetic extensions needed).
 *
 * They compute the schedule of kernels_impl.h, the one the AVX2 kernels
 * define, so that an ARM node gives the bits an x86 node gives: an 8-lane
 * accumulator is a pair of float32x4 (lanes 0-3, lanes 4-7), FMA where the
 * schedule says fma, hsum8 for the final reduction. Integer block products
 * use widening multiplies (vmull_s8) and pairwise adds, exact for every
 * int8. Where x86 semantics differ from NEON's (maxps, cvtps2dq on NaN and
 * out-of-range values), the x86 behaviour is built from compares and
 * selects. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/attention_neon.h"
#include "kernels/kernels_impl.h"

static inline float hsum8(float32x4_t lo, float32x4_t hi)
{
    float32x4_t t = vaddq_f32(lo, hi);                            /* v[l] + v[l+4] */
    float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t)); /* t[l] + t[l+2] */
    return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

static inline float fp16_to_f32(cv_fp16 h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

static inline float32x4_t load4_f32(const void *p, int i)
{
    return vld1q_f32((const float *)p + i);
}

static inline float32x4_t load4_f16(const void *p, int i)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
}

static inline float32x4_t load4_bf16(const void *p, int i)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
}

/* The F32/F16/BF16 schedule: acc[2a] and acc[2a+1] are the halves of
 * accumulator a; load4 widens 4 elements, load1 one. */
static inline float dot_float_rows(int n, const void *w, const void *x,
                                   float32x4_t (*load4)(const void *, int), float (*load1)(const void *, int))
{
    float32x4_t acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 8; k++)
            acc[k] = vfmaq_f32(acc[k], load4(w, i + 4 * k), load4(x, i + 4 * k));
    float32x4_t lo = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[4], acc[6]));
    float32x4_t hi = vaddq_f32(vaddq_f32(acc[1], acc[3]), vaddq_f32(acc[5], acc[7]));
    float sum = hsum8(lo, hi);
    for (; i < n; i++)
        sum = fmaf(load1(w, i), load1(x, i), sum);
    return sum;
}

static float load1_f32(const void *p, int i) { return ((const float *)p)[i]; }
static float load1_f16(const void *p, int i) { return fp16_to_f32(((const cv_fp16 *)p)[i]); }
static float load1_bf16(const void *p, int i) { return cv_bf16_to_fp32(((const cv_bf16 *)p)[i]); }

float cv_vec_dot_f32_neon(int n, const void *w, const void *x)
{
    return dot_float_rows(n, w, x, load4_f32, load1_f32);
}

float cv_vec_dot_f16_neon(int n, const void *w, const void *x)
{
    return dot_float_rows(n, w, x, load4_f16, load1_f16);
}

float cv_vec_dot_bf16_neon(int n, const void *w, const void *x)
{
    return dot_float_rows(n, w, x, load4_bf16, load1_bf16);
}

/* Lanes 0-3 (*lo) and 4-7 (*hi) of a Q8_0 x Q8_0 block: lane l sums
 * elements 2l, 2l+1, 16+2l, 17+2l. */
static inline void lanes_q8_0_q8_0(const int8_t *p, const int8_t *q, int32x4_t *lo, int32x4_t *hi)
{
    int8x16_t p0 = vld1q_s8(p), p1 = vld1q_s8(p + 16);
    int8x16_t q0 = vld1q_s8(q), q1 = vld1q_s8(q + 16);
    *lo = vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(p0), vget_low_s8(q0))),
                      vmull_s8(vget_low_s8(p1), vget_low_s8(q1)));
    *hi = vpadalq_s16(vpaddlq_s16(vmull_high_s8(p0, q0)), vmull_high_s8(p1, q1));
}

/* Four lanes of 4 consecutive products each: lane l sums p[j] * q[j] over
 * j in 4l..4l+3 of 16 elements. */
static inline int32x4_t lanes_of_four(int8x16_t p, int8x16_t q)
{
    int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(p), vget_low_s8(q)));
    int32x4_t b = vpaddlq_s16(vmull_high_s8(p, q));
    return vpaddq_s32(a, b);
}

float cv_vec_dot_q8_0_q8_0_neon(int n, const void *wv, const void *xv)
{
    const block_q8_0 *w = wv;
    const block_q8_0 *x = xv;
    float acc[8] = {0};
    for (int b = 0; b < n / QK8_0; b++) {
        int32x4_t lo, hi;
        lanes_q8_0_q8_0(w[b].qs, x[b].qs, &lo, &hi);
        float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        acc[b % 8] = fmaf(d, (float)vaddvq_s32(vaddq_s32(lo, hi)), acc[b % 8]);
    }
    return hsum8(vld1q_f32(acc), vld1q_f32(acc + 4));
}

float cv_vec_dot_q4_0_q8_0_neon(int n, const void *wv, const void *xv)
{
    const block_q4_0 *w = wv;
    const block_q8_0 *x = xv;
    const int8x16_t eight = vdupq_n_s8(8);
    float acc[8] = {0};
    for (int b = 0; b < n / QK8_0; b++) {
        uint8x16_t packed = vld1q_u8(w[b].qs);
        int8x16_t q_lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(15))), eight);
        int8x16_t q_hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(packed, 4)), eight);
        int32x4_t lanes = vaddq_s32(lanes_of_four(q_lo, vld1q_s8(x[b].qs)), lanes_of_four(q_hi, vld1q_s8(x[b].qs + 16)));
        float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        acc[b % 8] = fmaf(d, (float)vaddvq_s32(lanes), acc[b % 8]);
    }
    return hsum8(vld1q_f32(acc), vld1q_f32(acc + 4));
}

/* x86 maxps: b unless a > b. */
static inline float32x4_t max_x86(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}

static inline float max_x86_1(float a, float b)
{
    return a > b ? a : b;
}

/* cvtps2dq of integral values: INT32_MIN for NaN and |r| >= 2^31. */
static inline int32x4_t cvt_int32_x86(float32x4_t r)
{
    uint32x4_t in_range = vcaltq_f32(r, vdupq_n_f32(2147483648.0f));
    return vbslq_s32(in_range, vcvtq_s32_f32(r), vdupq_n_s32(INT32_MIN));
}

void cv_quantize_row_q8_0_neon(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0) {
        float32x4_t v[8], a[8];
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(x + 4 * k);
            a[k] = vabsq_f32(v[k]);
        }
        /* element 4k+j is lane j (k even) or 4+j (k odd) of vector k/2 */
        float32x4_t m_lo = max_x86(max_x86(a[0], a[2]), max_x86(a[4], a[6]));
        float32x4_t m_hi = max_x86(max_x86(a[1], a[3]), max_x86(a[5], a[7]));
        float32x4_t m4 = max_x86(m_lo, m_hi);
        float amax = max_x86_1(max_x86_1(vgetq_lane_f32(m4, 0), vgetq_lane_f32(m4, 2)),
                               max_x86_1(vgetq_lane_f32(m4, 1), vgetq_lane_f32(m4, 3)));
        y[b].d = cv_fp32_to_fp16(amax / 127.0f);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int k = 0; k < 8; k += 2) {
            int32x4_t i0 = cvt_int32_x86(vrndnq_f32(vmulq_n_f32(v[k], id)));
            int32x4_t i1 = cvt_int32_x86(vrndnq_f32(vmulq_n_f32(v[k + 1], id)));
            int8x8_t q = vqmovn_s16(vcombine_s16(vqmovn_s32(i0), vqmovn_s32(i1)));
            vst1_s8(y[b].qs + 4 * k, q);
        }
    }
}

void cv_silu_mul_neon(float *g, const float *u, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t e = exp4(vnegq_f32(vabsq_f32(x)));
        const float32x4_t num = vbslq_f32(vcgeq_f32(x, vdupq_n_f32(0.0f)), x, vmulq_f32(x, e));
        vst1q_f32(g + i, vmulq_f32(vdivq_f32(num, vaddq_f32(vdupq_n_f32(1.0f), e)), vld1q_f32(u + i)));
    }
    cv_silu_mul_ref(g + i, u + i, n - i);
}

void cv_convert_row_f32_to_f16_neon(const float *x, void *vy, int64_t n)
{
    cv_fp16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++)
        y[i] = cv_fp32_to_fp16(x[i]);
}
