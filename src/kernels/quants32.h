/* quants32.h: the 32-element block types beside Q4_0 and Q8_0: Q5_0,
 * Q5_1, IQ4_NL and MXFP4 weights, Q8_1 activations; and IQ4_XS, IQ4_NL's
 * values in super-blocks of 256 with 6-bit sub-block scales.
 *
 * Contract: the same as kernels.h, per type: row dequantization, the
 * reference quantizer of llama.cpp (no importance matrix) for weights, and
 * dot products with the activation row llama.cpp's CPU backend pairs them
 * with (Q5_0, IQ4_NL and MXFP4: Q8_0; Q5_1: Q8_1; IQ4_XS: Q8_K) in a _ref,
 * an _avx2 (x86-64, compiled with -mavx2 -mfma -mf16c) and a _neon version
 * that give the same bits, on the schedule of kernels_impl.h (MXFP4 and
 * IQ4_XS also an _avx512, with VNNI, for the CPUs that have it). The Q8_1
 * activation quantizer has one version: it is the Q8_0 rule plus a sum,
 * off the hot path. n is a multiple of 32 (IQ4_XS: of 256). */
#ifndef CONVOY_KERNELS_QUANTS32_H
#define CONVOY_KERNELS_QUANTS32_H

#include <stdint.h>

#include "kernels/types.h"

/* IQ4_NL's 16 values, GGML's kvalues_iq4nl. */
extern const int8_t cv_kvalues_iq4nl[16];

/* MXFP4's 16 values, GGML's kvalues_mxfp4: the E2M1 floats doubled
 * (0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2, bit 3 the sign). */
extern const int8_t cv_kvalues_mxfp4[16];

/* The scale 2^(e - 128) of an MXFP4 block (GGML's
 * GGML_E8M0_TO_FP32_HALF: half the E8M0 value 2^(e - 127), which the
 * doubled table values meet), exact: a subnormal for e < 2. */
static inline float mxfp4_scale(uint8_t e)
{
    return cv_bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* Sub-block ib's 6-bit scale ls of an IQ4_XS block (types.h). */
static inline int iq4_xs_scale(const block_iq4_xs *b, int ib)
{
    return (b->scales_l[ib / 2] >> 4 * (ib % 2) & 15) | (b->scales_h >> 2 * ib & 3) << 4;
}

void cv_dequantize_row_q5_0(const void *x, float *y, int64_t n);
void cv_dequantize_row_q5_1(const void *x, float *y, int64_t n);
void cv_dequantize_row_iq4_nl(const void *x, float *y, int64_t n);
void cv_dequantize_row_q8_1(const void *x, float *y, int64_t n);
void cv_dequantize_row_iq4_xs(const void *x, float *y, int64_t n);
void cv_dequantize_row_mxfp4(const void *x, float *y, int64_t n);

void cv_quantize_row_q5_0(const float *x, void *y, int64_t n);
void cv_quantize_row_q5_1(const float *x, void *y, int64_t n);
void cv_quantize_row_iq4_nl(const float *x, void *y, int64_t n);
void cv_quantize_row_iq4_xs(const float *x, void *y, int64_t n);
void cv_quantize_row_mxfp4(const float *x, void *y, int64_t n);
/* The Q8_0 activation rule for d and qs, and s = fp16((amax / 127) * sum
 * of qs), as llama.cpp's AVX2 quantize_row_q8_1 (its sum is of the same
 * quants wherever the input is finite). */
void cv_quantize_row_q8_1(const float *x, void *y, int64_t n);

float cv_vec_dot_q5_0_q8_0_ref(int n, const void *w, const void *x);
float cv_vec_dot_q5_1_q8_1_ref(int n, const void *w, const void *x);
float cv_vec_dot_iq4_nl_q8_0_ref(int n, const void *w, const void *x);
float cv_vec_dot_iq4_xs_q8_K_ref(int n, const void *w, const void *x);
float cv_vec_dot_mxfp4_q8_0_ref(int n, const void *w, const void *x);
#if defined(__x86_64__)
float cv_vec_dot_q5_0_q8_0_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q5_1_q8_1_avx2(int n, const void *w, const void *x);
float cv_vec_dot_iq4_nl_q8_0_avx2(int n, const void *w, const void *x);
float cv_vec_dot_iq4_xs_q8_K_avx2(int n, const void *w, const void *x);
float cv_vec_dot_mxfp4_q8_0_avx2(int n, const void *w, const void *x);
/* quants32_avx512.c, for CPUs with AVX-512 VNNI: the same bits again */
float cv_vec_dot_mxfp4_q8_0_avx512(int n, const void *w, const void *x);
float cv_vec_dot_iq4_xs_q8_K_avx512(int n, const void *w, const void *x);
#endif
#if defined(__aarch64__)
float cv_vec_dot_q5_0_q8_0_neon(int n, const void *w, const void *x);
float cv_vec_dot_q5_1_q8_1_neon(int n, const void *w, const void *x);
float cv_vec_dot_iq4_nl_q8_0_neon(int n, const void *w, const void *x);
float cv_vec_dot_iq4_xs_q8_K_neon(int n, const void *w, const void *x);
float cv_vec_dot_mxfp4_q8_0_neon(int n, const void *w, const void *x);
#endif

#endif
