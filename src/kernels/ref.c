/* ref.c: the scalar reference kernels and the row conversions.
 *
 * Every _ref function here is the portable twin of an _avx2 and a _neon
 * function: it follows the lane schedule written in kernels_impl.h, sums
 * in that order, and calls fmaf() exactly where the SIMD code fuses, so
 * all three give the same bits. It is also what runs on a CPU without
 * SIMD support, and what CONVOY_KERNELS=ref selects.
 *
 * The functions without a suffix (row conversions, dequantizers, weight
 * quantizers) have one version for every machine: they run once per token
 * or once per tensor, off the hot path. The weight quantizers follow
 * llama.cpp's reference rules (quantize_row_q4_0_ref / q8_0_ref), so that
 * `convoy quantize` writes the bytes llama-quantize writes. */
#include <math.h>
#include <string.h>

#include "kernels/attention_impl.h"
#include "kernels/kernels_impl.h"

/* ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)): the AVX2 horizontal sum. */
static float hsum8(const float v[8])
{
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* x86 maxps: the second operand unless the first is greater (so also when
 * either is NaN). */
static float max_x86(float a, float b)
{
    return a > b ? a : b;
}

/* cvtps2dq of an already integral value: INT32_MIN when out of range or NaN. */
static int32_t cvt_int32_x86(float r)
{
    if (!(fabsf(r) < 2147483648.0f))
        return INT32_MIN;
    return (int32_t)r;
}

static float load_f32(const void *p, int i) { return ((const float *)p)[i]; }
static float load_f16(const void *p, int i) { return cv_fp16_to_fp32(((const cv_fp16 *)p)[i]); }
static float load_bf16(const void *p, int i) { return cv_bf16_to_fp32(((const cv_bf16 *)p)[i]); }

/* The F32/F16/BF16 schedule of kernels_impl.h; load widens one element. */
static inline float dot_float_rows(int n, const void *w, const void *x,
                                   float (*load)(const void *, int))
{
    float acc[4][8] = {{0}};
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int a = 0; a < 4; a++)
            for (int l = 0; l < 8; l++) {
                int k = i + 8 * a + l;
                acc[a][l] = fmaf(load(w, k), load(x, k), acc[a][l]);
            }
    float v[8];
    for (int l = 0; l < 8; l++)
        v[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    float sum = hsum8(v);
    for (; i < n; i++)
        sum = fmaf(load(w, i), load(x, i), sum);
    return sum;
}

float cv_vec_dot_f32_ref(int n, const void *w, const void *x)
{
    return dot_float_rows(n, w, x, load_f32);
}

float cv_vec_dot_f16_ref(int n, const void *w, const void *x)
{
    return dot_float_rows(n, w, x, load_f16);
}

float cv_vec_dot_bf16_ref(int n, const void *w, const void *x)
{
    return dot_float_rows(n, w, x, load_bf16);
}

/* Row r of block b: of the plain row w, or (w NULL) of the interleaved
 * group w8. */
static block_q8_0 block_q8_0_of(const block_q8_0 *w, const block_q8_0x8 *w8, int r, int b)
{
    if (w)
        return w[b];
    block_q8_0 blk = {.d = w8[b].d[r]};
    for (int j = 0; j < QK8_0; j++)
        blk.qs[j] = w8[b].qs[j / 2][2 * r + j % 2];
    return blk;
}

static float dot_q8_0(int n, const block_q8_0 *w, const block_q8_0x8 *w8, int r, const block_q8_0 *x)
{
    float acc[8] = {0};
    for (int b = 0; b < n / QK8_0; b++) {
        const block_q8_0 wb = block_q8_0_of(w, w8, r, b);
        int32_t s = 0;
        for (int j = 0; j < QK8_0; j++)
            s += wb.qs[j] * x[b].qs[j];
        const float d = cv_fp16_to_fp32(wb.d) * cv_fp16_to_fp32(x[b].d);
        acc[b % 8] = fmaf(d, (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}

float cv_vec_dot_q8_0_q8_0_ref(int n, const void *w, const void *x)
{
    return dot_q8_0(n, w, NULL, 0, x);
}

float cv_vec_dot_interleaved_q8_0_ref(int n, const void *group, int r, const void *x)
{
    return dot_q8_0(n, NULL, group, r, x);
}

/* Blocks [0, nb) of 8 rows of a type whose block is its scale (d_bytes:
 * fp16 d, or MXFP4's exponent byte), then its quants, as interleaved
 * blocks (kernels_impl.h): the 8 scales, then word k (word bytes) of the
 * quants of row r at word 8k + r. */
static void interleave_words(const void *rows, size_t row_bytes, int nb, size_t block_bytes, size_t d_bytes,
                             size_t word, void *out)
{
    const size_t words = (block_bytes - d_bytes) / word;
    for (int b = 0; b < nb; b++) {
        uint8_t *o = (uint8_t *)out + (size_t)b * ROW_GROUP * block_bytes;
        for (int r = 0; r < ROW_GROUP; r++) {
            const uint8_t *blk = (const uint8_t *)rows + (size_t)r * row_bytes + (size_t)b * block_bytes;
            memcpy(o + d_bytes * r, blk, d_bytes);
            for (size_t k = 0; k < words; k++)
                memcpy(o + d_bytes * ROW_GROUP + (k * ROW_GROUP + r) * word, blk + d_bytes + k * word, word);
        }
    }
}

void cv_interleave_q8_0(const void *rows, size_t row_bytes, int n, void *out)
{
    interleave_words(rows, row_bytes, n / QK8_0, sizeof(block_q8_0), sizeof(cv_fp16), 2, out);
}

/* Row r of block b: of the plain row w, or (w NULL) of the interleaved
 * group w8. */
static block_q4_0 block_q4_0_of(const block_q4_0 *w, const block_q4_0x8 *w8, int r, int b)
{
    if (w)
        return w[b];
    block_q4_0 blk = {.d = w8[b].d[r]};
    for (int j = 0; j < QK4_0 / 2; j++)
        blk.qs[j] = w8[b].qs[j / 4][4 * r + j % 4];
    return blk;
}

/* Q4_0's nibble values: q - 8. */
static const int8_t values_q4_0[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

int32_t cv_dot_nibbles_ref(const uint8_t qs[16], const int8_t y[32], const int8_t values[16])
{
    int32_t s = 0;
    for (int j = 0; j < 16; j++)
        s += values[qs[j] & 15] * y[j] + values[qs[j] >> 4] * y[j + 16];
    return s;
}

float cv_vec_dot_nibbles_ref(int n, const block_q4_0 *w, const block_q4_0x8 *w8, int r, const block_q8_0 *x,
                          const int8_t values[16])
{
    float acc[8] = {0};
    for (int b = 0; b < n / QK8_0; b++) {
        const block_q4_0 wb = block_q4_0_of(w, w8, r, b);
        const int32_t s = cv_dot_nibbles_ref(wb.qs, x[b].qs, values);
        const float d = cv_fp16_to_fp32(wb.d) * cv_fp16_to_fp32(x[b].d);
        acc[b % 8] = fmaf(d, (float)s, acc[b % 8]);
    }
    return hsum8(acc);
}

float cv_vec_dot_q4_0_q8_0_ref(int n, const void *w, const void *x)
{
    return cv_vec_dot_nibbles_ref(n, w, NULL, 0, x, values_q4_0);
}

float cv_vec_dot_interleaved_q4_0_ref(int n, const void *group, int r, const void *x)
{
    return cv_vec_dot_nibbles_ref(n, NULL, group, r, x, values_q4_0);
}

void cv_interleave_q4_0(const void *rows, size_t row_bytes, int n, void *out)
{
    interleave_words(rows, row_bytes, n / QK4_0, sizeof(block_q4_0), sizeof(cv_fp16), 4, out);
}

void cv_interleave_mxfp4(const void *rows, size_t row_bytes, int n, void *out)
{
    interleave_words(rows, row_bytes, n / QK_MXFP4, sizeof(block_mxfp4), 1, 4, out);
}

float cv_quantize_block_q8_0_ref(const float *x, cv_fp16 *d, int8_t *qs)
{
    float m[8];
    for (int l = 0; l < 8; l++)
        m[l] = max_x86(max_x86(fabsf(x[l]), fabsf(x[8 + l])), max_x86(fabsf(x[16 + l]), fabsf(x[24 + l])));
    for (int l = 0; l < 4; l++)
        m[l] = max_x86(m[l], m[l + 4]);
    for (int l = 0; l < 2; l++)
        m[l] = max_x86(m[l], m[l + 2]);
    const float amax = max_x86(m[0], m[1]);
    *d = cv_fp32_to_fp16(amax / 127.0f);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < QK8_0; j++) {
        int32_t v = cvt_int32_x86(rintf(x[j] * id));
        qs[j] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
    }
    return amax;
}

void cv_quantize_row_q8_0_ref(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0)
        cv_quantize_block_q8_0_ref(x, &y[b].d, y[b].qs);
}

void cv_convert_row_f32_to_f16_ref(const float *x, void *vy, int64_t n)
{
    cv_fp16 *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = cv_fp32_to_fp16(x[i]);
}

void cv_silu_mul_ref(float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float e = attn_exp(-fabsf(g[i]));
        g[i] = (g[i] >= 0.0f ? g[i] : g[i] * e) / (1.0f + e) * u[i];
    }
}

void cv_copy_row_f32(const float *x, void *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

void cv_convert_row_f32_to_bf16(const float *x, void *vy, int64_t n)
{
    cv_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = cv_fp32_to_bf16(x[i]);
}

void cv_convert_row_f32(const void *x, float *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

void cv_convert_row_f16(const void *vx, float *y, int64_t n)
{
    const cv_fp16 *x = vx;
    for (int64_t i = 0; i < n; i++)
        y[i] = cv_fp16_to_fp32(x[i]);
}

void cv_convert_row_bf16(const void *vx, float *y, int64_t n)
{
    const cv_bf16 *x = vx;
    for (int64_t i = 0; i < n; i++)
        y[i] = cv_bf16_to_fp32(x[i]);
}

void cv_dequantize_row_q8_0(const void *vx, float *y, int64_t n)
{
    const block_q8_0 *x = vx;
    for (int64_t b = 0; b < n / QK8_0; b++) {
        float d = cv_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK8_0; j++)
            y[b * QK8_0 + j] = (float)x[b].qs[j] * d;
    }
}

void cv_dequantize_row_q4_0(const void *vx, float *y, int64_t n)
{
    const block_q4_0 *x = vx;
    for (int64_t b = 0; b < n / QK4_0; b++) {
        float d = cv_fp16_to_fp32(x[b].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[b * QK4_0 + j] = (float)((x[b].qs[j] & 15) - 8) * d;
            y[b * QK4_0 + j + QK4_0 / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

/* llama.cpp's Q4_0 rule: the element of largest magnitude, with its sign,
 * maps to -8: d = max / -8; q = min(15, trunc(x / d + 8.5)). The float to
 * integer step is guarded (NaN and out-of-range values clamp) where
 * llama.cpp's cast would be undefined. */
void cv_quantize_row_q4_0(const float *x, void *vy, int64_t n)
{
    block_q4_0 *y = vy;
    for (int64_t b = 0; b < n / QK4_0; b++, x += QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = cv_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                float v = x[j + h * QK4_0 / 2] * id + 8.5f;
                q[h] = !(v >= 0.0f) ? 0 : v >= 15.0f ? 15 : (uint8_t)v;
            }
            y[b].qs[j] = (uint8_t)(q[0] | (q[1] << 4));
        }
    }
}

/* llama.cpp's reference Q8_0 rule (not the activation rule): d = amax /
 * 127, id = 1 / d, q = roundf(x * id) (ties away from zero). */
void cv_quantize_row_q8_0_weight(const float *x, void *vy, int64_t n)
{
    block_q8_0 *y = vy;
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = cv_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) {
            float r = roundf(x[j] * id);
            y[b].qs[j] = (int8_t)(!(r == r) ? 0 : r < -128.0f ? -128 : r > 127.0f ? 127 : r);
        }
    }
}
