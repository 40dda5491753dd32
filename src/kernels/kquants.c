/* kquants.c: the K-quant formats in portable C: row dequantization, the
 * weight quantizers, the Q8_K activation quantizer and the reference dot
 * products.
 *
 * Formats (llama.cpp's, block layouts in types.h): a super-block holds 256
 * weights. Q4_K and Q5_K split it into 8 sub-blocks of 32, each with a 6-bit
 * scale and a 6-bit min (packed into 12 bytes, see unpack_scales_mins); a
 * weight is d * scale * q - dmin * min with q in 0..15 (Q4_K) or 0..31
 * (Q5_K, the fifth bit in qh). Q6_K splits it into 16 sub-blocks of 16, each
 * with an int8 scale; a weight is d * scale * (q - 32), q in 0..63 (low four
 * bits in ql, high two in qh). Q8_K holds 256 int8 activations, an f32 scale
 * and the sum of each 16 quants (bsums), which lets the dot products apply
 * mins and offsets per sub-block instead of per weight.
 *
 * Quantizers: the weight quantizers follow llama.cpp's reference algorithm
 * without importance matrix (a weighted least-squares search of scale and
 * min per sub-block, then 6- or 8-bit quantization of those), with the same
 * float operations in the same order, so they produce llama.cpp's bytes.
 * The Q8_K quantizer is the only one convoy has, so every path sees the
 * same activation bytes.
 *
 * Q2_K and Q3_K split a super-block into 16 sub-blocks of 16 with 2-bit
 * quants (Q3_K: a third bit in hmask): Q2_K a 4-bit scale and min each, a
 * weight d * scale * q - dmin * min; Q3_K a signed 6-bit scale each, a
 * weight d * scale * (q - 4), q in 0..7.
 *
 * Dot products: the _ref functions reproduce, operation for operation, the
 * float arithmetic of the SIMD kernels (kquants_avx2.c, kquants_neon.c).
 * The integer sums are exact, so only the float order has to match:
 * - Q2_K: as Q4_K below, isum over 16 sub-blocks and msum = sum of min *
 *   bsum (each an int16 of Q8_K's) into acc and accm; acc - accm.
 * - Q3_K: the whole int32 sum of scale * (q * y) less 4 * scale * bsum,
 *   acc = fma(d, (float)isum, acc) on one scalar; the result is acc.
 * - Q4_K, Q5_K: per super-block the whole int32 sum isum = sum of scale *
 *   q * y and the whole mins sum msum = sum of min * (bsum pair), then
 *   acc = fma(d, (float)isum, acc) and accm = fma(dmin, (float)msum, accm)
 *   on two scalars; the result is acc - accm. One sum per super-block
 *   lets a tile keep 8 rows in the lanes of a vector (kquants_avx2.c).
 * - Q6_K: as Q3_K, the whole int32 sum of scale * q * y less 32 * scale *
 *   bsum per sub-block, acc = fma(d, (float)isum, acc) on one scalar; one
 *   sum per super-block lets a kernel keep 8 rows in the lanes of a
 *   vector, as Q4_K's.
 * kquants_impl.h holds the scale packing and the Q6_K bit access shared by
 * all three files. */
#include "kernels/kquants.h"

#include <math.h>
#include <string.h>

#include "kernels/kernels_impl.h"
#include "kernels/kquants_impl.h"

/* Round to nearest, ties to even, by adding 1.5 * 2^23 (valid for
 * |f| < 2^22, the range the quantizers use; other inputs give some int
 * without undefined behaviour). */
static inline int round_nearest(float f)
{
    float t = f + 12582912.f;
    uint32_t u;
    memcpy(&u, &t, sizeof(u));
    return (int)(u & 0x007fffff) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- dequantization ---------------------------------------------------- */

void cv_dequantize_row_q2_K(const void *x, float *y, int64_t n)
{
    const block_q2_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = cv_fp16_to_fp32(b[i].d);
        const float dmin = cv_fp16_to_fp32(b[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int s = b[i].scales[e / 16];
            y[e] = d * (s & 0xF) * kq_q2_value(b[i].qs, e) - dmin * (s >> 4);
        }
        y += QK_K;
    }
}

void cv_dequantize_row_q3_K(const void *x, float *y, int64_t n)
{
    const block_q3_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = cv_fp16_to_fp32(b[i].d);
        int8_t sc[16];
        kq_q3_scales(b[i].scales, sc);
        for (int e = 0; e < QK_K; e++)
            y[e] = d * sc[e / 16] * (kq_q3_value(&b[i], e) - 4);
        y += QK_K;
    }
}

void cv_dequantize_row_q4_K(const void *x, float *y, int64_t n)
{
    const block_q4_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = cv_fp16_to_fp32(b[i].d);
        const float dmin = cv_fp16_to_fp32(b[i].dmin);
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(b[i].scales, sc, mn);
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = b[i].qs + 32 * j;
            const float d_lo = d * sc[2 * j], m_lo = dmin * mn[2 * j];
            const float d_hi = d * sc[2 * j + 1], m_hi = dmin * mn[2 * j + 1];
            for (int l = 0; l < 32; l++)
                y[l] = d_lo * (q[l] & 0xF) - m_lo;
            for (int l = 0; l < 32; l++)
                y[32 + l] = d_hi * (q[l] >> 4) - m_hi;
            y += 64;
        }
    }
}

void cv_dequantize_row_q5_K(const void *x, float *y, int64_t n)
{
    const block_q5_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = cv_fp16_to_fp32(b[i].d);
        const float dmin = cv_fp16_to_fp32(b[i].dmin);
        uint8_t sc[8], mn[8];
        kq_unpack_scales_mins(b[i].scales, sc, mn);
        for (int j = 0; j < 4; j++) {
            const uint8_t *q = b[i].qs + 32 * j;
            const uint8_t *qh = b[i].qh;
            const float d_lo = d * sc[2 * j], m_lo = dmin * mn[2 * j];
            const float d_hi = d * sc[2 * j + 1], m_hi = dmin * mn[2 * j + 1];
            for (int l = 0; l < 32; l++)
                y[l] = d_lo * ((q[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4)) - m_lo;
            for (int l = 0; l < 32; l++)
                y[32 + l] = d_hi * ((q[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) - m_hi;
            y += 64;
        }
    }
}

void cv_dequantize_row_q6_K(const void *x, float *y, int64_t n)
{
    const block_q6_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = cv_fp16_to_fp32(b[i].d);
        for (int e = 0; e < QK_K; e++)
            y[e] = d * b[i].scales[e / 16] * (kq_q6_value(&b[i], e) - 32);
        y += QK_K;
    }
}

void cv_dequantize_row_q8_K(const void *x, float *y, int64_t n)
{
    const block_q8_K *b = x;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int e = 0; e < QK_K; e++)
            *y++ = b[i].d * b[i].qs[e];
}

/* ---- weight quantizers ------------------------------------------------- */

/* Fits x[0..n) ~ scale * L - min_out with L in 0..nmax, minimizing the
 * error weighted by w (squared, or absolute with mad): starts from the
 * plain range fit, then tries nstep+1 grid scales (nmax + rmin + rdelta *
 * is) / range and keeps the best least-squares solution. Returns the
 * scale, writes min_out >= 0 and L. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *min_out, float rmin, float rdelta, int nstep, bool mad)
{
    uint8_t Lt[32];
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(round_nearest(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        best_err += w[i] * (mad ? fabsf(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_int(round_nearest(iscale * (x[i] - min)), 0, nmax);
            Lt[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            float s = (sum_w * sum_xl - sum_x * sum_l) / det;
            float m = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (m > 0) {
                m = 0;
                s = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = s * Lt[i] + m - x[i];
                err += w[i] * (mad ? fabsf(diff) : diff * diff);
            }
            if (err < best_err) {
                memcpy(L, Lt, (size_t)n);
                best_err = err;
                scale = s;
                min = m;
            }
        }
    }
    *min_out = -min;
    return scale;
}

/* The first element of x[0..n) of the largest magnitude (0 if none is
 * above 0). */
static float signed_max(int n, const float *x)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    return max;
}

/* Symmetric fit x[0..n) ~ scale * (L - nmax), L - nmax in -nmax..nmax-1,
 * weighting each element by x^2: tries 19 scales around nmax / max|x| and
 * keeps the one with the largest sumlx^2 / suml2. Returns the scale. */
static float fit_scale_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    const float max = signed_max(n, x);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric fit x[0..n) ~ scale * (L - nmax), L - nmax in -nmax..nmax-1,
 * weighting each element by x^2 (Q3_K's): starts from nmax / max|x|,
 * then up to 5 passes move single quants to where they raise sumlx^2 /
 * suml2. Returns the scale sumlx / suml2. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L)
{
    const float max = signed_max(n, x);
    if (fabsf(max) < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(round_nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx <= 0)
                continue;
            float sl2 = suml2 - w * L[i] * L[i];
            int l = clamp_int(round_nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (l == L[i])
                continue;
            slx += w * x[i] * l;
            sl2 += w * l * l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

/* Q2_K's and Q3_K's 2-bit quants L (0..3) into qs: weight 128h + 32j + l
 * at bits 2j of qs[32h + l]. */
static void pack_q2(const uint8_t L[QK_K], uint8_t qs[QK_K / 4])
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
        }
}

/* Q2_K: each sub-block of 16 fitted with a scale and a min (absolute error
 * weighted by |x|), both quantized to 4 bits against the largest, then the
 * quants again against the rounded ones. */
void cv_quantize_row_q2_K(const float *x, void *y, int64_t n)
{
    block_q2_K *b = y;
    uint8_t L[QK_K];
    float scales[16], mins[16], w[16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int s = 0; s < 16; s++) {
            for (int l = 0; l < 16; l++)
                w[l] = fabsf(x[16 * s + l]);
            scales[s] = fit_scale_min(16, 3, x + 16 * s, w, L + 16 * s, &mins[s], -0.5f, 0.1f, 15, true);
            max_scale = scales[s] > max_scale ? scales[s] : max_scale;
            max_min = mins[s] > max_min ? mins[s] : max_min;
        }
        /* llama.cpp stores the rounded values' low bytes, unclamped */
        const float is = max_scale > 0 ? 15.f / max_scale : 0.f, im = max_min > 0 ? 15.f / max_min : 0.f;
        for (int s = 0; s < 16; s++)
            b[i].scales[s] = (uint8_t)(max_scale > 0 ? round_nearest(is * scales[s]) : 0);
        for (int s = 0; max_min > 0 && s < 16; s++)
            b[i].scales[s] |= (uint8_t)(round_nearest(im * mins[s]) << 4);
        b[i].d = cv_fp32_to_fp16(max_scale > 0 ? max_scale / 15.f : 0.f);
        b[i].dmin = cv_fp32_to_fp16(max_min > 0 ? max_min / 15.f : 0.f);
        for (int s = 0; s < 16; s++) {
            const float d = cv_fp16_to_fp32(b[i].d) * (b[i].scales[s] & 0xF);
            if (!d)
                continue;
            const float dm = cv_fp16_to_fp32(b[i].dmin) * (b[i].scales[s] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (uint8_t)clamp_int(round_nearest((x[16 * s + l] + dm) / d), 0, 3);
        }
        pack_q2(L, b[i].qs);
    }
}

/* Q3_K: each sub-block of 16 fitted symmetrically (fit_scale_q3), the
 * scales quantized to signed 6 bits against the largest in magnitude, then
 * the quants again against the rounded ones. */
void cv_quantize_row_q3_K(const float *x, void *y, int64_t n)
{
    block_q3_K *b = y;
    int8_t L[QK_K];
    float scales[16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int s = 0; s < 16; s++) {
            scales[s] = fit_scale_q3(16, 4, x + 16 * s, L + 16 * s);
            if (fabsf(scales[s]) > amax) {
                amax = fabsf(scales[s]);
                max_scale = scales[s];
            }
        }
        memset(b[i].scales, 0, sizeof b[i].scales);
        b[i].d = 0;
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int s = 0; s < 16; s++) {
                /* llama.cpp keeps the int8 of the rounded value, then clamps */
                const int l = clamp_int((int8_t)round_nearest(iscale * scales[s]), -32, 31) + 32;
                b[i].scales[s % 8] |= (uint8_t)((l & 0xF) << (4 * (s / 8)));
                b[i].scales[8 + s % 4] |= (uint8_t)((l >> 4) << (2 * (s / 4)));
            }
            b[i].d = cv_fp32_to_fp16(1 / iscale);
        }
        int8_t sc[16];
        kq_q3_scales(b[i].scales, sc);
        for (int s = 0; s < 16; s++) {
            const float d = cv_fp16_to_fp32(b[i].d) * sc[s];
            if (!d)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (int8_t)(clamp_int(round_nearest(x[16 * s + l] / d), -4, 3) + 4);
        }
        uint8_t low[QK_K];
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int e = 0; e < QK_K; e++) {
            b[i].hmask[e % 32] |= (uint8_t)((L[e] >> 2) << (e / 32));
            low[e] = (uint8_t)(L[e] & 3);
        }
        pack_q2(low, b[i].qs);
    }
}

/* The shared part of Q4_K and Q5_K: fits the 8 sub-blocks of x (256
 * values), writes d, dmin and the packed 6-bit scales and mins, and the
 * final quants L (0..nmax) computed against the rounded scales. */
static void quantize_superblock_scale_min(const float *x, int nmax, float rmin, int nstep,
                                          cv_fp16 *d_out, cv_fp16 *dmin_out,
                                          uint8_t packed[K_SCALE_SIZE], uint8_t L[QK_K])
{
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        /* llama.cpp keeps the low byte of the rounded value, then caps it */
        uint8_t ls = (uint8_t)round_nearest(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)round_nearest(inv_min * mins[j]);
        sc[j] = ls < 63 ? ls : 63;
        mn[j] = lm < 63 ? lm : 63;
    }
    kq_pack_scales_mins(sc, mn, packed);
    *d_out = cv_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = cv_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        const float d = cv_fp16_to_fp32(*d_out) * sc[j];
        if (!d)
            continue;
        const float dm = cv_fp16_to_fp32(*dmin_out) * mn[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clamp_int(round_nearest((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

void cv_quantize_row_q4_K(const float *x, void *y, int64_t n)
{
    block_q4_K *b = y;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_superblock_scale_min(x, 15, -1.f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
        x += QK_K;
    }
}

void cv_quantize_row_q5_K(const float *x, void *y, int64_t n)
{
    block_q5_K *b = y;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        quantize_superblock_scale_min(x, 31, -0.5f, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * j + l], hi = L[64 * j + 32 + l];
                b[i].qs[32 * j + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                b[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
            }
        x += QK_K;
    }
}

void cv_quantize_row_q6_K(const float *x, void *y, int64_t n)
{
    block_q6_K *b = y;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        float max_scale = 0, max_abs_scale = 0;
        for (int s = 0; s < QK_K / 16; s++) {
            scales[s] = fit_scale_symmetric(16, 32, x + 16 * s, L + 16 * s);
            if (fabsf(scales[s]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[s]);
                max_scale = scales[s];
            }
        }
        if (max_abs_scale < 1e-15f) {
            memset(&b[i], 0, sizeof(b[i]));
            x += QK_K;
            continue;
        }
        float iscale = -128.f / max_scale;
        b[i].d = cv_fp32_to_fp16(1 / iscale);
        for (int s = 0; s < QK_K / 16; s++) {
            int v = round_nearest(iscale * scales[s]);
            b[i].scales[s] = (int8_t)(v < 127 ? v : 127);
        }
        for (int s = 0; s < QK_K / 16; s++) {
            float d = cv_fp16_to_fp32(b[i].d) * b[i].scales[s];
            if (!d)
                continue;
            for (int l = 0; l < 16; l++)
                L[16 * s + l] = (int8_t)(clamp_int(round_nearest(x[16 * s + l] / d), -32, 31) + 32);
        }
        /* element 128h + 32m + l: low nibble in ql[64h + 32(m&1) + l] (high
         * half for m >= 2), top two bits at bit 2m of qh[32h + l] */
        memset(b[i].ql, 0, sizeof(b[i].ql));
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, m = (e / 32) % 4, l = e % 32;
            b[i].ql[64 * h + 32 * (m & 1) + l] |= (uint8_t)((L[e] & 0xF) << (4 * (m >> 1)));
            b[i].qh[32 * h + l] |= (uint8_t)(((L[e] >> 4) & 3) << (2 * m));
        }
        x += QK_K;
    }
}

void cv_quantize_row_q8_K(const float *x, void *y, int64_t n)
{
    block_q8_K *b = y;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float max = signed_max(QK_K, x);
        if (!max) {
            memset(&b[i], 0, sizeof(b[i]));
            x += QK_K;
            continue;
        }
        const float iscale = -127.f / max;
        for (int e = 0; e < QK_K; e++) {
            int v = round_nearest(iscale * x[e]);
            b[i].qs[e] = (int8_t)(v < 127 ? v : 127);
        }
        for (int s = 0; s < QK_K / 16; s++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += b[i].qs[16 * s + l];
            b[i].bsums[s] = (int16_t)sum;
        }
        b[i].d = 1 / iscale;
        x += QK_K;
    }
}

/* ---- reference dot products -------------------------------------------- */

/* Q2_K: per super-block the whole int32 sums isum = sum of scale * q * y
 * and msum = sum of min * bsum over the 16 sub-blocks, then as Q4_K. */
float cv_vec_dot_q2_K_q8_K_ref(int n, const void *w, const void *x)
{
    const block_q2_K *wb = w;
    const block_q8_K *xb = x;
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int e = 16 * s; e < 16 * s + 16; e++)
                dot += kq_q2_value(wb[i].qs, e) * xb[i].qs[e];
            isum += (wb[i].scales[s] & 0xF) * dot;
            msum += (wb[i].scales[s] >> 4) * xb[i].bsums[s];
        }
        kq_fuse_dmin(&acc, &accm, xb[i].d, wb[i].d, wb[i].dmin, isum, msum);
    }
    return acc - accm;
}

/* Q3_K: per super-block the whole int32 sum of scale * (q - 4) * y, the
 * offset 4 taken out through the bsums (sum of scale * (sum of q * y -
 * 4 * bsum)); acc = fma(d, (float)isum, acc). */
float cv_vec_dot_q3_K_q8_K_ref(int n, const void *w, const void *x)
{
    const block_q3_K *wb = w;
    const block_q8_K *xb = x;
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int8_t sc[16];
        kq_q3_scales(wb[i].scales, sc);
        int32_t isum = 0;
        for (int s = 0; s < 16; s++) {
            int32_t dot = 0;
            for (int e = 16 * s; e < 16 * s + 16; e++)
                dot += kq_q3_value(&wb[i], e) * xb[i].qs[e];
            isum += sc[s] * (dot - 4 * xb[i].bsums[s]);
        }
        acc = fmaf(xb[i].d * cv_fp16_to_fp32(wb[i].d), (float)isum, acc);
    }
    return acc;
}

/* Sub-block s (weights 32s..32s+31) of Q4_K, or of Q5_K with the fifth
 * bits qh (NULL for Q4_K), times y: the int sum of q * y. */
static int32_t q45_subblock(const uint8_t *qs, const uint8_t *qh, int s, const int8_t *y)
{
    const uint8_t *q = qs + 32 * (s / 2);
    int32_t sum = 0;
    for (int e = 0; e < 32; e++) {
        const int nib = s % 2 ? q[e] >> 4 : q[e] & 0xF;
        const int fifth = qh ? ((qh[e] >> s) & 1) << 4 : 0;
        sum += (nib | fifth) * y[32 * s + e];
    }
    return sum;
}

/* Super-block i of a Q4_K or Q5_K row as the reference reads it: the
 * scales and mins unpacked, the quants as a plain block holds them, and
 * for Q5_K (q5) the fifth bits. */
typedef struct q45_view {
    cv_fp16 d, dmin;
    uint8_t sc[8], mn[8];
    uint8_t qs[QK_K / 2], qh[QK_K / 8];
    bool q5;
} q45_view;

typedef void (*q45_view_fn)(const void *w, int r, int i, q45_view *v);

/* A plain block's fields, which Q4_K and Q5_K share. */
static void view_plain(cv_fp16 d, cv_fp16 dmin, const uint8_t scales[K_SCALE_SIZE], const uint8_t *qs, q45_view *v)
{
    v->d = d;
    v->dmin = dmin;
    kq_unpack_scales_mins(scales, v->sc, v->mn);
    memcpy(v->qs, qs, sizeof v->qs);
}

static void view_q4_K(const void *w, int r, int i, q45_view *v)
{
    (void)r;
    const block_q4_K *b = (const block_q4_K *)w + i;
    view_plain(b->d, b->dmin, b->scales, b->qs, v);
    v->q5 = false;
}

static void view_q5_K(const void *w, int r, int i, q45_view *v)
{
    (void)r;
    const block_q5_K *b = (const block_q5_K *)w + i;
    view_plain(b->d, b->dmin, b->scales, b->qs, v);
    memcpy(v->qh, b->qh, sizeof v->qh);
    v->q5 = true;
}

/* Row r of an interleaved block (kernels_impl.h): d, dmin, the scales,
 * mins and quants, which Q4_Kx8 and Q5_Kx8 lay out alike. */
static void view_x8(const cv_fp16 *d, const cv_fp16 *dmin, const uint8_t *scale_lo, const uint8_t *scale_hi,
                    const uint8_t (*qs)[32], int r, q45_view *v)
{
    v->d = d[r];
    v->dmin = dmin[r];
    for (int s = 0; s < 8; s++) {
        v->sc[s] = kq_scale_x8(scale_lo, scale_hi, r, s);
        v->mn[s] = kq_min_x8(scale_lo, scale_hi, r, s);
    }
    for (int j = 0; j < QK_K / 2; j++)
        v->qs[j] = qs[j / 4][4 * r + j % 4];
}

static void view_q4_Kx8(const void *w, int r, int i, q45_view *v)
{
    const block_q4_Kx8 *b = (const block_q4_Kx8 *)w + i;
    view_x8(b->d, b->dmin, b->scale_lo, b->scale_hi, b->qs, r, v);
    v->q5 = false;
}

static void view_q5_Kx8(const void *w, int r, int i, q45_view *v)
{
    const block_q5_Kx8 *b = (const block_q5_Kx8 *)w + i;
    view_x8(b->d, b->dmin, b->scale_lo, b->scale_hi, b->qs, r, v);
    memset(v->qh, 0, sizeof v->qh);
    for (int e = 0; e < QK_K / 8; e++) /* bit s of qh[e]: weight 32s + e, e = 4g + b */
        for (int s = 0; s < 8; s++)
            v->qh[e] |= (uint8_t)(((b->qh[s][4 * r + e % 4] >> (e / 4)) & 1) << s);
    v->q5 = true;
}

/* Q4_K and Q5_K, row r of w as view reads it: the whole sums of each
 * super-block into two scalars, acc with d and accm with dmin. The bsum
 * pair of a sub-block is an int16 sum, as _mm_hadd_epi16 forms it. */
static float dot_q45(int n, q45_view_fn view, const void *w, int r, const block_q8_K *xb)
{
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; i++) {
        q45_view v;
        view(w, r, i, &v);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; s++) {
            isum += v.sc[s] * q45_subblock(v.qs, v.q5 ? v.qh : NULL, s, xb[i].qs);
            msum += v.mn[s] * (int16_t)(xb[i].bsums[2 * s] + xb[i].bsums[2 * s + 1]);
        }
        const float d = xb[i].d * cv_fp16_to_fp32(v.d);
        const float dm = xb[i].d * cv_fp16_to_fp32(v.dmin);
        acc = fmaf(d, (float)isum, acc);
        accm = fmaf(dm, (float)msum, accm);
    }
    return acc - accm;
}

float cv_vec_dot_q4_K_q8_K_ref(int n, const void *w, const void *x)
{
    return dot_q45(n, view_q4_K, w, 0, x);
}

float cv_vec_dot_q5_K_q8_K_ref(int n, const void *w, const void *x)
{
    return dot_q45(n, view_q5_K, w, 0, x);
}

float cv_vec_dot_interleaved_q4_K_ref(int n, const void *group, int r, const void *x)
{
    return dot_q45(n, view_q4_Kx8, group, r, x);
}

float cv_vec_dot_interleaved_q5_K_ref(int n, const void *group, int r, const void *x)
{
    return dot_q45(n, view_q5_Kx8, group, r, x);
}

/* Dword r of every 32 bytes of out from the bytes of row r at in, in
 * order. */
static void interleave_dwords(const uint8_t *in, int bytes, int r, uint8_t (*out)[32])
{
    for (int j = 0; j < bytes / 4; j++)
        memcpy(out[j] + 4 * r, in + 4 * j, 4);
}

/* Row r's d, dmin, scales, mins and quants (a Q4_K or Q5_K block: the
 * same fields) into an interleaved block's, whose scale_hi starts zero. */
static void interleave_x8(cv_fp16 d, cv_fp16 dmin, const uint8_t scales[K_SCALE_SIZE], const uint8_t *qs, int r,
                          cv_fp16 *d8, cv_fp16 *dmin8, uint8_t *scale_lo, uint8_t *scale_hi, uint8_t (*qs8)[32])
{
    d8[r] = d;
    dmin8[r] = dmin;
    uint8_t sc[8], mn[8];
    kq_unpack_scales_mins(scales, sc, mn);
    for (int s = 0; s < 8; s++) {
        const int is = 8 * s + r, im = 16 * (s / 2) + 2 * r + s % 2;
        scale_lo[is] = (uint8_t)((scale_lo[is] & 0xF0) | (sc[s] & 15));
        scale_lo[im] = (uint8_t)((scale_lo[im] & 0x0F) | (mn[s] & 15) << 4);
        scale_hi[is % 32] |= (uint8_t)((sc[s] >> 4) << (4 * (is / 32)));
        scale_hi[im % 32] |= (uint8_t)((mn[s] >> 4) << (2 + 4 * (im / 32)));
    }
    interleave_dwords(qs, QK_K / 2, r, qs8);
}

void cv_interleave_q4_K(const void *rows, size_t row_bytes, int n, void *out)
{
    block_q4_Kx8 *o = out;
    for (int i = 0; i < n / QK_K; i++) {
        memset(o[i].scale_hi, 0, sizeof o[i].scale_hi);
        for (int r = 0; r < ROW_GROUP; r++) {
            const block_q4_K *blk = (const block_q4_K *)((const char *)rows + (size_t)r * row_bytes) + i;
            interleave_x8(blk->d, blk->dmin, blk->scales, blk->qs, r, o[i].d, o[i].dmin, o[i].scale_lo,
                          o[i].scale_hi, o[i].qs);
        }
    }
}

void cv_interleave_q5_K(const void *rows, size_t row_bytes, int n, void *out)
{
    block_q5_Kx8 *o = out;
    for (int i = 0; i < n / QK_K; i++) {
        memset(o[i].scale_hi, 0, sizeof o[i].scale_hi);
        memset(o[i].qh, 0, sizeof o[i].qh);
        for (int r = 0; r < ROW_GROUP; r++) {
            const block_q5_K *blk = (const block_q5_K *)((const char *)rows + (size_t)r * row_bytes) + i;
            interleave_x8(blk->d, blk->dmin, blk->scales, blk->qs, r, o[i].d, o[i].dmin, o[i].scale_lo,
                          o[i].scale_hi, o[i].qs);
            for (int s = 0; s < 8; s++)
                for (int e = 0; e < QK_K / 8; e++) /* e = 4g + b */
                    o[i].qh[s][4 * r + e % 4] |= (uint8_t)(((blk->qh[e] >> s) & 1) << (e / 4));
        }
    }
}

/* Super-block i of row r of a Q6_K matrix as a plain block: the plain
 * row w (r unused) or row r of an interleaved group (kernels_impl.h). */
typedef void (*q6_view_fn)(const void *w, int r, int i, block_q6_K *b);

static void view_q6_K(const void *w, int r, int i, block_q6_K *b)
{
    (void)r;
    *b = ((const block_q6_K *)w)[i];
}

static void view_q6_Kx8(const void *w, int r, int i, block_q6_K *b)
{
    const block_q6_Kx8 *g = (const block_q6_Kx8 *)w + i;
    b->d = g->d[r];
    for (int s = 0; s < QK_K / 16; s++)
        b->scales[s] = g->scales[s][r];
    for (int j = 0; j < QK_K / 2; j++)
        b->ql[j] = g->ql[j / 4][4 * r + j % 4];
    for (int j = 0; j < QK_K / 4; j++)
        b->qh[j] = g->qh[j / 4][4 * r + j % 4];
}

/* Q6_K, row r of w as view reads it: per super-block the whole int32 sum
 * of sc * (q - 32) * y, the offset 32 taken out through the bsums, then
 * one fma into one scalar. With |sc| <= 128, q <= 63, |y| <= 128 the sum
 * of sc * q * y is within 16 * 128 * 16 * 63 * 128 < 2^29 and the offset
 * term within 16 * 128 * 32 * 2048 = 2^27, so any order of int32 adds
 * gives the same total. */
static float dot_q6(int n, q6_view_fn view, const void *w, int r, const block_q8_K *xb)
{
    float acc = 0;
    for (int i = 0; i < n / QK_K; i++) {
        block_q6_K b;
        view(w, r, i, &b);
        int32_t isum = 0;
        for (int s = 0; s < QK_K / 16; s++) {
            int32_t dot = 0;
            for (int e = 16 * s; e < 16 * s + 16; e++)
                dot += kq_q6_value(&b, e) * xb[i].qs[e];
            isum += b.scales[s] * (dot - 32 * xb[i].bsums[s]);
        }
        acc = fmaf(xb[i].d * cv_fp16_to_fp32(b.d), (float)isum, acc);
    }
    return acc;
}

float cv_vec_dot_q6_K_q8_K_ref(int n, const void *w, const void *x)
{
    return dot_q6(n, view_q6_K, w, 0, x);
}

float cv_vec_dot_interleaved_q6_K_ref(int n, const void *group, int r, const void *x)
{
    return dot_q6(n, view_q6_Kx8, group, r, x);
}

void cv_interleave_q6_K(const void *rows, size_t row_bytes, int n, void *out)
{
    block_q6_Kx8 *o = out;
    for (int i = 0; i < n / QK_K; i++)
        for (int r = 0; r < ROW_GROUP; r++) {
            const block_q6_K *blk = (const block_q6_K *)((const char *)rows + (size_t)r * row_bytes) + i;
            o[i].d[r] = blk->d;
            for (int s = 0; s < QK_K / 16; s++)
                o[i].scales[s][r] = blk->scales[s];
            interleave_dwords(blk->ql, QK_K / 2, r, o[i].ql);
            interleave_dwords(blk->qh, QK_K / 4, r, o[i].qh);
        }
}
