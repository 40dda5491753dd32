/* attention_neon.h: the schedule's max and exp on 4 lanes (aarch64;
 * private to src/kernels), which the fused attention and SwiGLU's gate
 * (kernels_neon.c) share. NEON's fmax differs from the schedule's max on
 * NaN and signed zeros, so max is a compare and select. */
#ifndef CONVOY_KERNELS_ATTENTION_NEON_H
#define CONVOY_KERNELS_ATTENTION_NEON_H

#include <arm_neon.h>

#include "kernels/attention_impl.h"

static inline float32x4_t max4(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }

static inline float32x4_t exp4(float32x4_t x)
{
    x = max4(vdupq_n_f32(ATTN_EXP_LO), x);
    const float32x4_t magic = vdupq_n_f32(ATTN_MAGIC);
    const float32x4_t t = vaddq_f32(vmulq_f32(x, vdupq_n_f32(ATTN_LOG2E)), magic);
    const float32x4_t n = vsubq_f32(t, magic);
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-ATTN_C1));
    r = vfmaq_f32(r, n, vdupq_n_f32(ATTN_C2));
    float32x4_t p = vdupq_n_f32(ATTN_P0);
    p = vfmaq_f32(vdupq_n_f32(ATTN_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(ATTN_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(ATTN_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(ATTN_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(ATTN_P5), p, r);
    p = vfmaq_f32(r, p, vmulq_f32(r, r));
    p = vaddq_f32(p, vdupq_n_f32(1.0f));
    const uint32x4_t e =
        vshlq_n_u32(vaddq_u32(vsubq_u32(vreinterpretq_u32_f32(t), vdupq_n_u32(ATTN_MAGIC_BITS)), vdupq_n_u32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_u32(e));
}

#endif
