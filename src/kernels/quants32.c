/* quants32.c: Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4 and Q8_1 (quants32.h): dequantizers,
 * llama.cpp's reference quantizers, the Q8_1 activation quantizer and the
 * reference dot products, which follow the schedule of kernels_impl.h
 * (fmaf where the SIMD kernels fuse). */
#include "kernels/quants32.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels_impl.h"

const int8_t cv_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t cv_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)): the AVX2 horizontal sum. */
static float hsum8(const float v[8])
{
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* The fifth bits of a Q5 block, bit j for element j. */
static uint32_t load_qh(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* Element j's nibble in Q4_0's layout: low nibbles first, then high. */
static int nibble(const uint8_t *qs, int j)
{
    return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
}

/* Element j's 5-bit quant, 0..31. */
static int quant5(const uint8_t *qs, uint32_t qh, int j)
{
    return nibble(qs, j) | (int)((qh >> j) & 1) << 4;
}

/* Packs 32 quants of 5 bits (or 4: qh NULL) into Q4_0's layout. */
static void pack_quants(const uint8_t q[32], uint8_t qs[16], uint8_t qh[4])
{
    uint32_t bits = 0;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
    for (int j = 0; j < 32; j++)
        bits |= (uint32_t)(q[j] >> 4) << j;
    if (qh)
        for (int k = 0; k < 4; k++)
            qh[k] = (uint8_t)(bits >> 8 * k);
}

/* trunc(v) within [0, hi]: llama.cpp casts v to an integer, which is
 * undefined for NaN and out-of-range values, so they clamp here. */
static uint8_t trunc_clamp(float v, int hi)
{
    return !(v >= 0.0f) ? 0 : v >= (float)hi ? (uint8_t)hi : (uint8_t)v;
}

void cv_dequantize_row_q5_0(const void *vx, float *y, int64_t n)
{
    const block_q5_0 *x = vx;
    for (int64_t b = 0; b < n / QK5_0; b++) {
        const float d = cv_fp16_to_fp32(x[b].d);
        const uint32_t qh = load_qh(x[b].qh);
        for (int j = 0; j < QK5_0; j++)
            y[b * QK5_0 + j] = (float)(quant5(x[b].qs, qh, j) - 16) * d;
    }
}

void cv_dequantize_row_q5_1(const void *vx, float *y, int64_t n)
{
    const block_q5_1 *x = vx;
    for (int64_t b = 0; b < n / QK5_1; b++) {
        const float d = cv_fp16_to_fp32(x[b].d), m = cv_fp16_to_fp32(x[b].m);
        const uint32_t qh = load_qh(x[b].qh);
        for (int j = 0; j < QK5_1; j++)
            y[b * QK5_1 + j] = (float)quant5(x[b].qs, qh, j) * d + m;
    }
}

void cv_dequantize_row_iq4_nl(const void *vx, float *y, int64_t n)
{
    const block_iq4_nl *x = vx;
    for (int64_t b = 0; b < n / QK4_NL; b++) {
        const float d = cv_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK4_NL; j++)
            y[b * QK4_NL + j] = (float)cv_kvalues_iq4nl[nibble(x[b].qs, j)] * d;
    }
}

void cv_dequantize_row_iq4_xs(const void *vx, float *y, int64_t n)
{
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = cv_fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float dl = d * (float)(iq4_xs_scale(&x[i], ib) - 32);
            for (int j = 0; j < 32; j++)
                y[i * QK_K + 32 * ib + j] = dl * (float)cv_kvalues_iq4nl[nibble(x[i].qs + 16 * ib, j)];
        }
    }
}

void cv_dequantize_row_mxfp4(const void *vx, float *y, int64_t n)
{
    const block_mxfp4 *x = vx;
    for (int64_t b = 0; b < n / QK_MXFP4; b++) {
        const float d = mxfp4_scale(x[b].e);
        for (int j = 0; j < QK_MXFP4; j++)
            y[b * QK_MXFP4 + j] = (float)cv_kvalues_mxfp4[nibble(x[b].qs, j)] * d;
    }
}

void cv_dequantize_row_q8_1(const void *vx, float *y, int64_t n)
{
    const block_q8_1 *x = vx;
    for (int64_t b = 0; b < n / QK8_1; b++) {
        const float d = cv_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK8_1; j++)
            y[b * QK8_1 + j] = (float)x[b].qs[j] * d;
    }
}

/* llama.cpp's Q5_0 rule, Q4_0's with 32 levels: the element of largest
 * magnitude, with its sign, maps to -16: d = max / -16; q = min(31,
 * trunc(x / d + 16.5)). */
void cv_quantize_row_q5_0(const float *x, void *vy, int64_t n)
{
    block_q5_0 *y = vy;
    for (int64_t b = 0; b < n / QK5_0; b++, x += QK5_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK5_0];
        for (int j = 0; j < QK5_0; j++)
            q[j] = trunc_clamp(x[j] * id + 16.5f, 31);
        y[b].d = cv_fp32_to_fp16(d);
        pack_quants(q, y[b].qs, y[b].qh);
    }
}

/* llama.cpp's Q5_1 rule: min and max of the block, d = (max - min) / 31,
 * q = trunc((x - min) / d + 0.5). */
void cv_quantize_row_q5_1(const float *x, void *vy, int64_t n)
{
    block_q5_1 *y = vy;
    for (int64_t b = 0; b < n / QK5_1; b++, x += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min)
                min = x[j];
            if (x[j] > max)
                max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK5_1];
        for (int j = 0; j < QK5_1; j++)
            q[j] = trunc_clamp((x[j] - min) * id + 0.5f, 31);
        y[b].d = cv_fp32_to_fp16(d);
        y[b].m = cv_fp32_to_fp16(min);
        pack_quants(q, y[b].qs, y[b].qh);
    }
}

/* The index of the table value nearest v, by llama.cpp's bisection (a tie
 * goes to the higher value; NaN to the last). */
static int nearest_iq4nl(float v)
{
    if (v <= cv_kvalues_iq4nl[0])
        return 0;
    if (v >= cv_kvalues_iq4nl[15])
        return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < cv_kvalues_iq4nl[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - cv_kvalues_iq4nl[hi - 1] < cv_kvalues_iq4nl[hi] - v ? hi - 1 : hi;
}

/* Weighted sums of q * x and q * q over a block, q the table values
 * nearest id * x, summed in element order as llama.cpp does. */
static void iq4nl_sums(const float *x, const float *w, float id, float *sumqx, float *sumq2)
{
    float qx = 0.0f, q2 = 0.0f;
    for (int j = 0; j < QK4_NL; j++) {
        const float q = cv_kvalues_iq4nl[nearest_iq4nl(id * x[j])];
        qx += w[j] * q * x[j];
        q2 += w[j] * q * q;
    }
    *sumqx = qx;
    *sumq2 = q2;
}

/* llama.cpp's IQ4_NL block scale without an importance matrix (weights
 * x^2): the least-squares scale of the table fitted to the block with
 * the largest element at -127, then at 15 other inverse scales (the
 * largest element at -134..-120), keeping the best fit. */
static float iq4nl_scale(const float *x)
{
    float w[QK4_NL], amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4_NL; j++) {
        w[j] = x[j] * x[j];
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    if (amax < 1e-15f) /* GGML's GROUP_MAX_EPS */
        return 0.0f;
    float sumqx, sumq2;
    iq4nl_sums(x, w, 1.0f / (-max / (float)cv_kvalues_iq4nl[0]), &sumqx, &sumq2);
    float d = sumqx / sumq2, best = d * sumqx;
    for (int t = -7; t <= 7; t++) {
        iq4nl_sums(x, w, (float)(t + cv_kvalues_iq4nl[0]) / max, &sumqx, &sumq2);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* llama.cpp's IQ4_NL rule (quantize_iq4_nl without an importance matrix):
 * the scale of iq4nl_scale, each element the table value nearest x / d. */
void cv_quantize_row_iq4_nl(const float *x, void *vy, int64_t n)
{
    block_iq4_nl *y = vy;
    for (int64_t b = 0; b < n / QK4_NL; b++, x += QK4_NL) {
        const float d = iq4nl_scale(x);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK4_NL];
        for (int j = 0; j < QK4_NL; j++)
            q[j] = (uint8_t)nearest_iq4nl(id * x[j]);
        y[b].d = cv_fp32_to_fp16(d);
        pack_quants(q, y[b].qs, NULL);
    }
}

/* The 6-bit scale l - 32 of a sub-block whose scale is v times the
 * super-block's: llama.cpp's nearest_int (ties to even), clamped. */
static int iq4xs_level(float v)
{
    return !(v > -32.0f) ? -32 : v >= 31.0f ? 31 : (int)rintf(v);
}

/* llama.cpp's IQ4_XS rule (quantize_iq4_xs without an importance matrix):
 * each sub-block's scale by iq4nl_scale, d = -(the one of largest
 * magnitude) / 32, the 6-bit scale l = rint(scale / d) within [-32, 31],
 * and each element the table value nearest x / (d l). */
void cv_quantize_row_iq4_xs(const float *x, void *vy, int64_t n)
{
    block_iq4_xs *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float scales[QK_K / 32], max_scale = 0.0f, amax_scale = 0.0f;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            scales[ib] = iq4nl_scale(x + 32 * ib);
            if (fabsf(scales[ib]) > amax_scale) {
                amax_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        const float d = -max_scale / 32.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        memset(&y[i], 0, sizeof y[i]);
        y[i].d = cv_fp32_to_fp16(d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const int l = iq4xs_level(id * scales[ib]);
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            uint8_t q[32];
            for (int j = 0; j < 32; j++)
                q[j] = (uint8_t)nearest_iq4nl(idl * x[32 * ib + j]);
            pack_quants(q, y[i].qs + 16 * ib, NULL);
            y[i].scales_l[ib / 2] |= (uint8_t)(((l + 32) & 15) << 4 * (ib % 2));
            y[i].scales_h |= (uint16_t)(((l + 32) >> 4) << 2 * ib);
        }
    }
}

/* The index of the table value nearest x / d: llama.cpp's search of the
 * 16 in order, |value * d - x| each, the first smallest kept (a tie goes
 * to the smaller magnitude, 0 to +0; NaN to index 0). */
static int nearest_mxfp4(float x, float d)
{
    int best = 0;
    float best_err = fabsf((float)cv_kvalues_mxfp4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)cv_kvalues_mxfp4[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

/* The E8M0 exponent llama.cpp gives a block of largest magnitude amax:
 * floor(log2(amax)) - 2 + 127, so that amax / 2^(e - 127) falls in
 * [4, 8), near E2M1's largest value 6; 0 for amax 0. Where llama.cpp's
 * cast to uint8_t is undefined (amax below 2^-125, or infinite) it
 * clamps to [0, 255]. */
static uint8_t mxfp4_exponent(float amax)
{
    if (!(amax > 0.0f))
        return 0;
    const float e = floorf(log2f(amax)) - 2.0f + 127.0f;
    return e < 0.0f ? 0 : e > 255.0f ? 255 : (uint8_t)e;
}

/* llama.cpp's MXFP4 rule (quantize_row_mxfp4_ref, which it uses with or
 * without an importance matrix): the exponent of mxfp4_exponent, then
 * each element the table value nearest x at the scale 2^(e - 128). */
void cv_quantize_row_mxfp4(const float *x, void *vy, int64_t n)
{
    block_mxfp4 *y = vy;
    for (int64_t b = 0; b < n / QK_MXFP4; b++, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j]))
                amax = fabsf(x[j]);
        y[b].e = mxfp4_exponent(amax);
        const float d = mxfp4_scale(y[b].e);
        uint8_t q[QK_MXFP4];
        for (int j = 0; j < QK_MXFP4; j++)
            q[j] = (uint8_t)nearest_mxfp4(x[j], d);
        pack_quants(q, y[b].qs, NULL);
    }
}

void cv_quantize_row_q8_1(const float *x, void *vy, int64_t n)
{
    block_q8_1 *y = vy;
    for (int64_t b = 0; b < n / QK8_1; b++, x += QK8_1) {
        const float amax = cv_quantize_block_q8_0_ref(x, &y[b].d, y[b].qs);
        int32_t sum = 0;
        for (int j = 0; j < QK8_1; j++)
            sum += y[b].qs[j];
        y[b].s = cv_fp32_to_fp16(amax / 127.0f * (float)sum);
    }
}

float cv_vec_dot_q5_0_q8_0_ref(int n, const void *vw, const void *vx)
{
    const block_q5_0 *w = vw;
    const block_q8_0 *x = vx;
    float acc[8] = {0};
    for (int b = 0; b < n / QK5_0; b++) {
        const uint32_t qh = load_qh(w[b].qh);
        int32_t s = 0;
        for (int j = 0; j < QK5_0; j++)
            s += (quant5(w[b].qs, qh, j) - 16) * x[b].qs[j];
        const float d = cv_fp16_to_fp32(w[b].d) * cv_fp16_to_fp32(x[b].d);
        acc[b % 8] = fmaf(d, (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}

float cv_vec_dot_q5_1_q8_1_ref(int n, const void *vw, const void *vx)
{
    const block_q5_1 *w = vw;
    const block_q8_1 *x = vx;
    float acc[8] = {0};
    for (int b = 0; b < n / QK5_1; b++) {
        const uint32_t qh = load_qh(w[b].qh);
        int32_t s = 0;
        for (int j = 0; j < QK5_1; j++)
            s += quant5(w[b].qs, qh, j) * x[b].qs[j];
        const float d = cv_fp16_to_fp32(w[b].d) * cv_fp16_to_fp32(x[b].d);
        acc[b % 8] = fmaf(cv_fp16_to_fp32(w[b].m), cv_fp16_to_fp32(x[b].s), fmaf(d, (float)s, acc[b % 8]));
    }
    return hsum8(acc);
}

/* IQ4_NL blocks have Q4_0's bytes (types.h), and so its interleaved
 * layout (kernels_impl.h). */
static_assert(sizeof(block_iq4_nl) == sizeof(block_q4_0), "IQ4_NL has Q4_0's layout");

float cv_vec_dot_iq4_nl_q8_0_ref(int n, const void *w, const void *x)
{
    return cv_vec_dot_nibbles_ref(n, w, NULL, 0, x, cv_kvalues_iq4nl);
}

float cv_vec_dot_interleaved_iq4_nl_ref(int n, const void *group, int r, const void *x)
{
    return cv_vec_dot_nibbles_ref(n, NULL, group, r, x, cv_kvalues_iq4nl);
}

/* IQ4_XS with Q8_K (kernels_impl.h): per super-block the exact int32 sum
 * of (ls - 32) * k * y, then one fmaf on a scalar. */
float cv_vec_dot_iq4_xs_q8_K_ref(int n, const void *vw, const void *vx)
{
    const block_iq4_xs *w = vw;
    const block_q8_K *x = vx;
    float acc = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        int32_t isum = 0;
        for (int ib = 0; ib < QK_K / 32; ib++)
            isum += (iq4_xs_scale(&w[i], ib) - 32) *
                    cv_dot_nibbles_ref(w[i].qs + 16 * ib, x[i].qs + 32 * ib, cv_kvalues_iq4nl);
        acc = fmaf(x[i].d * cv_fp16_to_fp32(w[i].d), (float)isum, acc);
    }
    return acc;
}

/* Row r of block b: of the plain row w, or (w NULL) of the interleaved
 * group w8. */
static block_mxfp4 block_mxfp4_of(const block_mxfp4 *w, const block_mxfp4x8 *w8, int r, int b)
{
    if (w)
        return w[b];
    block_mxfp4 blk = {.e = w8[b].e[r]};
    for (int j = 0; j < QK_MXFP4 / 2; j++)
        blk.qs[j] = w8[b].qs[j / 4][4 * r + j % 4];
    return blk;
}

/* MXFP4 with Q8_0 (kernels_impl.h), d = 2^(e - 128) * fp16(x.d), of the
 * plain row w, or (w NULL) of row r of the interleaved group w8. */
static float dot_mxfp4(int n, const block_mxfp4 *w, const block_mxfp4x8 *w8, int r, const block_q8_0 *x)
{
    float acc[8] = {0};
    for (int b = 0; b < n / QK_MXFP4; b++) {
        const block_mxfp4 wb = block_mxfp4_of(w, w8, r, b);
        const int32_t s = cv_dot_nibbles_ref(wb.qs, x[b].qs, cv_kvalues_mxfp4);
        acc[b % 8] = fmaf(mxfp4_scale(wb.e) * cv_fp16_to_fp32(x[b].d), (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}

float cv_vec_dot_mxfp4_q8_0_ref(int n, const void *w, const void *x)
{
    return dot_mxfp4(n, w, NULL, 0, x);
}

float cv_vec_dot_interleaved_mxfp4_ref(int n, const void *group, int r, const void *x)
{
    return dot_mxfp4(n, NULL, group, r, x);
}
