/* kernels_impl.h: the per-ISA kernels behind kernels.h (private to
 * src/kernels and its tests).
 *
 * Contract: a function named X_ref (ref.c, portable C), X_avx2
 * (kernels_avx2.c, x86-64 only, needs AVX2+FMA+F16C at run time) and X_neon
 * (kernels_neon.c, aarch64 only) return the same bits for every input,
 * NaN payloads aside. They all follow one schedule, written down here:
 *
 * An "8-lane vector" is float[8]; hsum8(v) = ((v0+v4) + (v2+v6)) +
 * ((v1+v5) + (v3+v7)).
 *
 * F32, F16, BF16 rows (vec_dot_f32 / _f16 / _bf16; F16 and BF16 elements
 * are widened to f32 exactly first): four 8-lane accumulators acc0..acc3
 * start at +0; for each full chunk of 32 elements at i, acc_a[l] =
 * fma(w[i+8a+l], x[i+8a+l], acc_a[l]). Then
 * sum = hsum8((acc0+acc1) + (acc2+acc3)) (lane-wise), and each remaining
 * element i (n % 32 of them, in order) does sum = fma(w[i], x[i], sum).
 *
 * Q8_0, Q4_0, Q5_0, IQ4_NL and MXFP4 weights with a Q8_0 activation row:
 * per block b, the exact int32 sum s of w * y (Q4_0: (q - 8) * y, Q5_0:
 * (q - 16) * y, IQ4_NL: cv_kvalues_iq4nl[q] * y, MXFP4: cv_kvalues_mxfp4[q] *
 * y) over its 32 elements, then acc[b % 8] = fma(d, (float)s, acc[b % 8])
 * with d = fp16(w.d) * fp16(x.d) (exact in f32; MXFP4: 2^(w.e - 128) *
 * fp16(x.d), rounded where it leaves f32's normal range), one 8-lane
 * accumulator; result hsum8(acc).
 * One sum per block lets vec_dot do 8 blocks per fma and a tile keep 8
 * rows in the lanes of a vector.
 *
 * IQ4_XS weights with a Q8_K activation row: per super-block i, the exact
 * int32 sum isum of (ls - 32) * cv_kvalues_iq4nl[q] * y over its 256
 * elements, then acc = fma(x.d * fp16(w.d), (float)isum, acc) on one
 * scalar (x.d * fp16(w.d) rounded to f32 first). The sum is within
 * 8 * 32 * 32 * 127 * 128 < 2^31.
 *
 * Q5_1 weights with a Q8_1 activation row: the same with s the sum of
 * q * y, and then the minimum: acc[b % 8] = fma(fp16(w.m), fp16(x.s),
 * fma(d, (float)s, acc[b % 8])).
 *
 * Q8_0 activation quantizer (quantize_row_q8_0_*), llama.cpp's AVX2 rule:
 * per block of 32, with max(a, b) = a > b ? a : b (x86 maxps):
 *   m[l] = max(max(|x_l|, |x_8+l|), max(|x_16+l|, |x_24+l|)), l < 8;
 *   m[l] = max(m[l], m[l+4]), l < 4; m[l] = max(m[l], m[l+2]), l < 2;
 *   amax = max(m[0], m[1]); d = fp16(amax / 127); id = amax != 0 ?
 *   127 / amax : 0; q = saturate_int8(cvt(rint(x * id))), where cvt gives
 *   INT32_MIN for NaN and for values outside the int32 range (as
 *   cvtps2dq does). */
#ifndef CONVOY_KERNELS_KERNELS_IMPL_H
#define CONVOY_KERNELS_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/types.h"

/* The AVX2 vec_dot kernels of the quantized types prefetch their weight
 * row this many bytes ahead of what they read. A matrix-vector product
 * streams its weights from DRAM, and the hardware prefetcher alone kept
 * one core at a quarter of its read bandwidth (Q4_0: 3.3 of 13 GB/s, 9
 * with this); 2-3 KiB ahead measured best. Past a row's end it fetches the
 * next row, which the product reads next. */
#define VEC_DOT_PREFETCH_BYTES 2048
/* The K-quant vec_dots (Q4_K, Q5_K, Q6_K: one row's super-blocks in turn)
 * fetch further ahead: on Zen 5, 1B Q6_K decode at 1 thread ran 23-24
 * tok/s at 2048 bytes, 25-26 at 4096 and 27-28 at 6144 to 8192. */
#define KQUANT_PREFETCH_BYTES 6144
/* The x86 interleaved kernels of the K-quants, and the AVX-512 ones of the
 * nibble types (one token: every expert and decode step), fetch their
 * matrix this far ahead in address order (the AVX2 nibble kernels keep
 * VEC_DOT_PREFETCH_BYTES: no difference measured). A group of 8 rows of a
 * short matrix (an expert's 768 or 2048 weights a row) is a stream too
 * short to train the hardware prefetcher, and a block ahead left one core
 * of an EPYC (AVX-512 VNNI) at 23 GB/s on a 768 x 2048 Q4_K expert from
 * DRAM and 15 on a 2048 x 768 Q6_K; 16 KiB ahead: 37 and 29 (AVX2
 * kernels: 24 -> 29 and 25 -> 30). */
#define INTERLEAVED_PREFETCH_BYTES 16384

/* SwiGLU's gate (cv_silu_mul): e = exp(-|g|) by the attention schedule's
 * exp (attention_impl.h's attn_exp, exp8, exp4: every step an IEEE
 * operation or a fused multiply-add), then g = (g >= 0 ? g : g * e) /
 * (1 + e) * u, the sigmoid written so that exp never overflows. */

/* Tile kernels (matmul_tile_*, SIMD only): the outputs of the tile's rows
 * (TILE_ROWS consecutive weight rows, or Q8_0_TILE_ROWS for the AVX2 Q8_0
 * tile; w, w_stride bytes apart) times m activation rows (x, x_stride
 * bytes apart, 1 <= m <= TILE_TOKENS) of n elements: y[t * ldy + r] =
 * vec_dot(n, w row r, x row t) of the same ISA, bit for bit, for r below
 * the tile's rows, t < m. cv_matmul_rows covers the other rows with
 * vec_dot. */
#define TILE_ROWS 8
#define TILE_TOKENS 64
#define Q8_0_TILE_ROWS 16
/* Below these many tokens, preparing a tile's weights costs more than it
 * saves (measured): one vec_dot per output is faster. */
#define TILE_MIN_TOKENS_QUANT 3
#define TILE_MIN_TOKENS_FLOAT 8
/* Q4_K/Q5_K: on 2048-wide rows streamed from memory, the few-token tile
 * ran 4 tokens at 48 GFLOP/s where vec_dots ran 66 (6 tokens: 63 and 68,
 * 8: 72 and 67). */
#define TILE_MIN_TOKENS_Q45 7
/* Q8_0: the 16-row tile widens its panel to int16 and pays it back from 7
 * tokens (4096 x 2048, GFLOP/s of tile and vec_dots: m = 5 44 and 47, 6 49
 * and 49, 7 54 and 50, 8 60 and 48). */
#define TILE_MIN_TOKENS_Q8_0 7
typedef void (*matmul_tile_fn)(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                               float *y, size_t ldy);

/* Interleaved weights (kernels.h): the rows of a matrix in groups of
 * ROW_GROUP, each group a run of blocks of the types below, block b
 * holding block b of each of the group's rows. They take the bytes of the
 * plain rows: d (and dmin) of the 8 rows side by side, then their scales,
 * then the quants with dword r of every 32 bytes from row r (Q8_0: word r
 * of every 16 bytes). A product then meets a group of 4 weights of the 8
 * rows with one maddubs (Q8_0: a pair, widened, with one madd), row r in
 * lane r, as the tiles' panels do, but reads them as they are stored.
 * - Q8_0: qs[k] word r = elements 2k, 2k+1 of row r.
 * - Q4_0: qs[k] dword r = bytes 4k..4k+3 of row r's qs: low nibbles are
 *   elements 4k..4k+3, high nibbles elements 16+4k..16+4k+3. IQ4_NL
 *   blocks have Q4_0's bytes, and block_q4_0x8 holds them the same way.
 * - MXFP4: the 8 exponent bytes, then qs as Q4_0's.
 * - Q4_K: qs[8j+k] dword r = bytes 32j+4k..32j+4k+3 of row r's qs: low
 *   nibbles are weights 64j+4k.. of sub-block 2j, high nibbles the same
 *   places of sub-block 2j+1. The 6-bit scales and mins of the 8 rows are
 *   laid out for vectors to unpack (kq_scale_x8, kq_min_x8): scale s of
 *   row r has index i = 8s + r, min s = 2k + p of row r index i = 16k +
 *   2r + p; scale_lo[i] holds the low 4 bits of scale i and (high nibble)
 *   of min i, scale_hi[i % 32] their top two bits, at bits 0-1 (scale)
 *   and 2-3 (min) for i < 32, at 4-5 and 6-7 for the others.
 * - Q5_K: d, dmin, scales and qs as Q4_K; qh[s] byte 4r+b holds at bit g
 *   the fifth bit of weight 32s+4g+b of row r, so the 8 groups of a
 *   sub-block take their fifth bits from one vector by shifts.
 * - Q6_K: d of the 8 rows, then scales[s] byte r = scale s of row r,
 *   then ql[k] dword r = bytes 4k..4k+3 of row r's ql and qh[k] dword r
 *   = bytes 4k..4k+3 of row r's qh (quads of weights as the plain rows
 *   pack them: kquants.c).
 * matmul_interleaved_* compute n_groups groups (consecutive) times m
 * activation rows (1 <= m <= TILE_TOKENS): y[t * ldy + 8g + r] =
 * vec_dot(n, row r of group g, x row t) of the same ISA, bit for bit.
 * vec_dot_interleaved_*_ref is vec_dot_ref of row r of a group. */
#define ROW_GROUP INTERLEAVE_ROWS
typedef struct {
    cv_fp16 d[ROW_GROUP];
    int8_t qs[QK8_0 / 2][2 * ROW_GROUP];
} block_q8_0x8;
static_assert(sizeof(block_q8_0x8) == ROW_GROUP * sizeof(block_q8_0), "block_q8_0x8 size");
typedef struct {
    cv_fp16 d[ROW_GROUP];
    uint8_t qs[QK4_0 / 8][32];
} block_q4_0x8;
static_assert(sizeof(block_q4_0x8) == ROW_GROUP * sizeof(block_q4_0), "block_q4_0x8 size");
typedef struct {
    uint8_t e[ROW_GROUP];
    uint8_t qs[QK_MXFP4 / 8][32];
} block_mxfp4x8;
static_assert(sizeof(block_mxfp4x8) == ROW_GROUP * sizeof(block_mxfp4), "block_mxfp4x8 size");
typedef struct {
    cv_fp16 d[ROW_GROUP], dmin[ROW_GROUP];
    uint8_t scale_lo[64];
    uint8_t scale_hi[32];
    uint8_t qs[QK_K / 8][32];
} block_q4_Kx8;
static_assert(sizeof(block_q4_Kx8) == ROW_GROUP * sizeof(block_q4_K), "block_q4_Kx8 size");
typedef struct {
    cv_fp16 d[ROW_GROUP], dmin[ROW_GROUP];
    uint8_t scale_lo[64];
    uint8_t scale_hi[32];
    uint8_t qh[QK_K / 32][32];
    uint8_t qs[QK_K / 8][32];
} block_q5_Kx8;
static_assert(sizeof(block_q5_Kx8) == ROW_GROUP * sizeof(block_q5_K), "block_q5_Kx8 size");
typedef struct {
    cv_fp16 d[ROW_GROUP];
    int8_t scales[QK_K / 16][ROW_GROUP];
    uint8_t ql[QK_K / 8][32];
    uint8_t qh[QK_K / 16][32];
} block_q6_Kx8;
static_assert(sizeof(block_q6_Kx8) == ROW_GROUP * sizeof(block_q6_K), "block_q6_Kx8 size");

/* Token t of activation rows x_stride bytes apart, as blocks. */
static inline const block_q8_0 *token_q8_0(const void *x, size_t x_stride, int t)
{
    return (const block_q8_0 *)((const char *)x + (size_t)t * x_stride);
}

static inline const block_q8_K *token_q8_K(const void *x, size_t x_stride, int t)
{
    return (const block_q8_K *)((const char *)x + (size_t)t * x_stride);
}

typedef void (*matmul_interleaved_fn)(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                      float *y, size_t ldy);
typedef float (*vec_dot_interleaved_fn)(int n, const void *group, int r, const void *x);
/* A group of 8 plain rows (row_bytes apart, n elements) as interleaved
 * blocks at out. */
typedef void (*interleave_fn)(const void *rows, size_t row_bytes, int n, void *out);

/* Reference (ref.c). */
float cv_vec_dot_f32_ref(int n, const void *w, const void *x);
float cv_vec_dot_f16_ref(int n, const void *w, const void *x);
float cv_vec_dot_bf16_ref(int n, const void *w, const void *x);
float cv_vec_dot_q8_0_q8_0_ref(int n, const void *w, const void *x);
float cv_vec_dot_q4_0_q8_0_ref(int n, const void *w, const void *x);
void cv_quantize_row_q8_0_ref(const float *x, void *y, int64_t n);  /* activation rule */
/* The activation rule for one block of 32 (d and qs); returns amax. */
float cv_quantize_block_q8_0_ref(const float *x, cv_fp16 *d, int8_t *qs);
void cv_convert_row_f32_to_f16_ref(const float *x, void *y, int64_t n);
void cv_silu_mul_ref(float *g, const float *u, int64_t n);
float cv_vec_dot_interleaved_q8_0_ref(int n, const void *group, int r, const void *x);
void cv_interleave_q8_0(const void *rows, size_t row_bytes, int n, void *out);
float cv_vec_dot_interleaved_q4_0_ref(int n, const void *group, int r, const void *x);
void cv_interleave_q4_0(const void *rows, size_t row_bytes, int n, void *out);
/* The exact sum of 32 int8 quants y times the values of the 32 nibbles of
 * qs in Q4_0's order (element j < 16: low nibble of qs[j], j >= 16: high
 * nibble of qs[j - 16]), nibble q having the value values[q]. */
int32_t cv_dot_nibbles_ref(const uint8_t qs[16], const int8_t y[32], const int8_t values[16]);
/* The Q8_0-activation schedule above for a row in Q4_0's byte layout
 * whose nibble q has the value values[q] (Q4_0: q - 8; IQ4_NL:
 * cv_kvalues_iq4nl[q]): the plain row w, or (w NULL) row r of the
 * interleaved group w8. */
float cv_vec_dot_nibbles_ref(int n, const block_q4_0 *w, const block_q4_0x8 *w8, int r, const block_q8_0 *x,
                          const int8_t values[16]);
/* quants32.c: IQ4_NL has Q4_0's interleaved layout (cv_interleave_q4_0),
 * MXFP4 its own (cv_interleave_mxfp4, ref.c) */
float cv_vec_dot_interleaved_iq4_nl_ref(int n, const void *group, int r, const void *x);
float cv_vec_dot_interleaved_mxfp4_ref(int n, const void *group, int r, const void *x);
void cv_interleave_mxfp4(const void *rows, size_t row_bytes, int n, void *out);
/* kquants.c */
float cv_vec_dot_interleaved_q4_K_ref(int n, const void *group, int r, const void *x);
void cv_interleave_q4_K(const void *rows, size_t row_bytes, int n, void *out);
float cv_vec_dot_interleaved_q5_K_ref(int n, const void *group, int r, const void *x);
void cv_interleave_q5_K(const void *rows, size_t row_bytes, int n, void *out);
float cv_vec_dot_interleaved_q6_K_ref(int n, const void *group, int r, const void *x);
void cv_interleave_q6_K(const void *rows, size_t row_bytes, int n, void *out);

/* One version for every ISA (ref.c): row conversions off the hot path. */
void cv_copy_row_f32(const float *x, void *y, int64_t n); /* from_float of F32 */
void cv_convert_row_f32_to_bf16(const float *x, void *y, int64_t n);
void cv_convert_row_f32(const void *x, float *y, int64_t n); /* to_float of F32 */
void cv_convert_row_f16(const void *x, float *y, int64_t n);
void cv_convert_row_bf16(const void *x, float *y, int64_t n);
void cv_dequantize_row_q8_0(const void *x, float *y, int64_t n);
void cv_dequantize_row_q4_0(const void *x, float *y, int64_t n);
/* Weight quantizers with llama.cpp's reference rules (what llama-quantize
 * writes without an importance matrix). */
void cv_quantize_row_q4_0(const float *x, void *y, int64_t n);
void cv_quantize_row_q8_0_weight(const float *x, void *y, int64_t n);

#if defined(__x86_64__)
float cv_vec_dot_f32_avx2(int n, const void *w, const void *x);
void cv_silu_mul_avx2(float *g, const float *u, int64_t n);
float cv_vec_dot_f16_avx2(int n, const void *w, const void *x);
float cv_vec_dot_bf16_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q8_0_q8_0_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q4_0_q8_0_avx2(int n, const void *w, const void *x);
void cv_matmul_tile_f32_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m, float *y,
                          size_t ldy);
void cv_matmul_tile_f16_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m, float *y,
                          size_t ldy);
void cv_matmul_tile_bf16_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m, float *y,
                           size_t ldy);
void cv_matmul_tile_q8_0_q8_0_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy);
void cv_matmul_tile_q4_0_q8_0_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy);
void cv_matmul_interleaved_q8_0_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy);
void cv_matmul_interleaved_q4_0_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy);
void cv_matmul_interleaved_iq4_nl_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy);
void cv_matmul_interleaved_mxfp4_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                   float *y, size_t ldy);
/* kquants_avx2.c */
void cv_matmul_tile_q4_K_q8_K_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy);
void cv_matmul_tile_q5_K_q8_K_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy);
void cv_matmul_tile_q6_K_q8_K_avx2(int n, const void *w, size_t w_stride, const void *x, size_t x_stride, int m,
                                float *y, size_t ldy);
void cv_matmul_interleaved_q4_K_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy);
void cv_matmul_interleaved_q5_K_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy);
void cv_matmul_interleaved_q6_K_avx2(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy);
void cv_quantize_row_q8_0_avx2(const float *x, void *y, int64_t n);
void cv_convert_row_f32_to_f16_avx2(const float *x, void *y, int64_t n);
/* kernels_avx512.c and kquants_avx512.c (AVX512F/BW/VL and VNNI) */
void cv_matmul_interleaved_q4_0_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy);
void cv_matmul_interleaved_iq4_nl_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                      float *y, size_t ldy);
void cv_matmul_interleaved_mxfp4_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                     float *y, size_t ldy);
void cv_matmul_interleaved_q4_K_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy);
void cv_matmul_interleaved_q5_K_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy);
void cv_matmul_interleaved_q6_K_avx512(int n, const void *w, long n_groups, const void *x, size_t x_stride, int m,
                                    float *y, size_t ldy);
#endif

#if defined(__aarch64__)
float cv_vec_dot_f32_neon(int n, const void *w, const void *x);
void cv_silu_mul_neon(float *g, const float *u, int64_t n);
float cv_vec_dot_f16_neon(int n, const void *w, const void *x);
float cv_vec_dot_bf16_neon(int n, const void *w, const void *x);
float cv_vec_dot_q8_0_q8_0_neon(int n, const void *w, const void *x);
float cv_vec_dot_q4_0_q8_0_neon(int n, const void *w, const void *x);
void cv_quantize_row_q8_0_neon(const float *x, void *y, int64_t n);
void cv_convert_row_f32_to_f16_neon(const float *x, void *y, int64_t n);
#endif

#endif
