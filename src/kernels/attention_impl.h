/* attention_impl.h: the scalar steps of the attention schedule (see
 * attention.h) that every version shares: max and the exp polynomial.
 * Private to src/kernels. */
#ifndef CONVOY_KERNELS_ATTENTION_IMPL_H
#define CONVOY_KERNELS_ATTENTION_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

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

#endif
