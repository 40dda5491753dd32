/* kquants_impl.h: bit-level helpers shared by the K-quant files (private to
 * src/kernels/kquants*.c).
 *
 * Contract: the 12 scale bytes of Q4_K/Q5_K hold 8 six-bit scales and 8
 * six-bit mins. For sub-block j < 4 the scale is the low 6 bits of byte j
 * and the min the low 6 bits of byte j + 4. For j >= 4 the low four bits
 * of the scale are the low nibble of byte j + 4 and its top two bits are
 * the top two bits of byte j - 4; the min's low four bits are the high
 * nibble of byte j + 4 and its top two bits the top two bits of byte j.
 * The unpacking reads the bytes as little-endian words (every convoy
 * target is little-endian). kq_scale_x8 and kq_min_x8 read the scales and
 * mins of an interleaved block (kernels_impl.h). kq_q6_value returns the
 * unsigned 6-bit quant (0..63) of weight e of a Q6_K block (see kquants.c
 * for the layout).
 *
 * Q3_K's 12 scale bytes hold 16 six-bit scales: the low four bits of scale
 * s are nibble s / 8 of byte s % 8, its top two bits are bits 2(s / 4),
 * 2(s / 4) + 1 of byte 8 + s % 4; kq_q3_scales gives them less 32 (the
 * signed scales, -32..31). kq_q2_value is the 2-bit quant of weight e of
 * Q2_K's (and Q3_K's) qs, kq_q3_value Q3_K's unsigned 3-bit quant (0..7, the
 * high bit from hmask): the weight is (scale) * (q - 4). */
#ifndef CONVOY_KERNELS_KQUANTS_IMPL_H
#define CONVOY_KERNELS_KQUANTS_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/types.h"

static inline void kq_unpack_scales_mins(const uint8_t p[K_SCALE_SIZE], uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a, b, c, w[4];
    memcpy(&a, p, 4);
    memcpy(&b, p + 4, 4);
    memcpy(&c, p + 8, 4);
    w[0] = a & 0x3f3f3f3fu;                                       /* scales 0..3 */
    w[1] = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);   /* scales 4..7 */
    w[2] = b & 0x3f3f3f3fu;                                       /* mins 0..3 */
    w[3] = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4); /* mins 4..7 */
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

static inline void kq_pack_scales_mins(const uint8_t sc[8], const uint8_t mn[8], uint8_t p[K_SCALE_SIZE])
{
    for (int j = 0; j < 4; j++) {
        p[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        p[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        p[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}

/* Scale s and min s of row r of an interleaved Q4_K block
 * (kernels_impl.h: block_q4_Kx8's scale_lo and scale_hi). */
static inline uint8_t kq_scale_x8(const uint8_t lo[64], const uint8_t hi[32], int r, int s)
{
    const int i = 8 * s + r;
    return (uint8_t)((lo[i] & 15) | ((hi[i % 32] >> (4 * (i / 32))) & 3) << 4);
}

static inline uint8_t kq_min_x8(const uint8_t lo[64], const uint8_t hi[32], int r, int s)
{
    const int i = 16 * (s / 2) + 2 * r + s % 2;
    return (uint8_t)((lo[i] >> 4) | ((hi[i % 32] >> (2 + 4 * (i / 32))) & 3) << 4);
}

static inline int kq_q6_value(const block_q6_K *b, int e)
{
    int h = e / 128, m = (e / 32) % 4, l = e % 32;
    int lo = (b->ql[64 * h + 32 * (m & 1) + l] >> (4 * (m >> 1))) & 0xF;
    int hi = (b->qh[32 * h + l] >> (2 * m)) & 3;
    return lo | (hi << 4);
}

static inline void kq_q3_scales(const uint8_t p[K_SCALE_SIZE], int8_t sc[16])
{
    uint32_t a, b, c, w[4];
    memcpy(&a, p, 4);
    memcpy(&b, p + 4, 4);
    memcpy(&c, p + 8, 4);
    w[0] = (a & 0x0f0f0f0fu) | ((c & 0x03030303u) << 4);
    w[1] = (b & 0x0f0f0f0fu) | (((c >> 2) & 0x03030303u) << 4);
    w[2] = ((a >> 4) & 0x0f0f0f0fu) | (((c >> 4) & 0x03030303u) << 4);
    w[3] = ((b >> 4) & 0x0f0f0f0fu) | (((c >> 6) & 0x03030303u) << 4);
    uint8_t u[16];
    memcpy(u, w, 16);
    for (int s = 0; s < 16; s++)
        sc[s] = (int8_t)(u[s] - 32);
}

/* A super-block's whole sums into the two accumulators of Q2_K (as Q4_K):
 * acc with d, accm with dmin, each times the activations' xd. */
static inline void kq_fuse_dmin(float *acc, float *accm, float xd, cv_fp16 d, cv_fp16 dmin, int32_t isum,
                                int32_t msum)
{
    *acc = fmaf(xd * cv_fp16_to_fp32(d), (float)isum, *acc);
    *accm = fmaf(xd * cv_fp16_to_fp32(dmin), (float)msum, *accm);
}

static inline int kq_q2_value(const uint8_t *qs, int e)
{
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

static inline int kq_q3_value(const block_q3_K *b, int e)
{
    return kq_q2_value(b->qs, e) | ((b->hmask[e % 32] >> (e / 32)) & 1) << 2;
}

#endif
