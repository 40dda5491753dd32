/* kquants.h: K-quant types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K weights; Q8_K
 * activations).
 *
 * Contract: the same as kernels.h, per type: row dequantization, the
 * reference quantizer of llama.cpp (no importance matrix) for weights,
 * the Q8_K activation quantizer (bit-identical across implementations),
 * and dot products of each weight type with a Q8_K row in a _ref, an _avx2
 * (x86-64, compiled with -mavx2 -mfma -mf16c) and a _neon version that give
 * the same bits (Q2_K and Q3_K also an _avx512, with VNNI). n is a multiple of QK_K (256). */
#ifndef CONVOY_KERNELS_KQUANTS_H
#define CONVOY_KERNELS_KQUANTS_H

#include <stdint.h>

#include "kernels/types.h"

void cv_dequantize_row_q2_K(const void *x, float *y, int64_t n);
void cv_dequantize_row_q3_K(const void *x, float *y, int64_t n);
void cv_dequantize_row_q4_K(const void *x, float *y, int64_t n);
void cv_dequantize_row_q5_K(const void *x, float *y, int64_t n);
void cv_dequantize_row_q6_K(const void *x, float *y, int64_t n);
void cv_dequantize_row_q8_K(const void *x, float *y, int64_t n);

void cv_quantize_row_q2_K(const float *x, void *y, int64_t n);
void cv_quantize_row_q3_K(const float *x, void *y, int64_t n);
void cv_quantize_row_q4_K(const float *x, void *y, int64_t n);
void cv_quantize_row_q5_K(const float *x, void *y, int64_t n);
void cv_quantize_row_q6_K(const float *x, void *y, int64_t n);
void cv_quantize_row_q8_K(const float *x, void *y, int64_t n);

float cv_vec_dot_q2_K_q8_K_ref(int n, const void *w, const void *x);
float cv_vec_dot_q3_K_q8_K_ref(int n, const void *w, const void *x);
float cv_vec_dot_q4_K_q8_K_ref(int n, const void *w, const void *x);
float cv_vec_dot_q5_K_q8_K_ref(int n, const void *w, const void *x);
float cv_vec_dot_q6_K_q8_K_ref(int n, const void *w, const void *x);
#if defined(__x86_64__)
float cv_vec_dot_q2_K_q8_K_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q3_K_q8_K_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q4_K_q8_K_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q5_K_q8_K_avx2(int n, const void *w, const void *x);
float cv_vec_dot_q6_K_q8_K_avx2(int n, const void *w, const void *x);
void cv_quantize_row_q8_K_avx2(const float *x, void *y, int64_t n);
/* kquants_avx512.c, for CPUs with AVX-512 VNNI: the same bits again */
float cv_vec_dot_q2_K_q8_K_avx512(int n, const void *w, const void *x);
float cv_vec_dot_q3_K_q8_K_avx512(int n, const void *w, const void *x);
#endif
#if defined(__aarch64__)
float cv_vec_dot_q2_K_q8_K_neon(int n, const void *w, const void *x);
float cv_vec_dot_q3_K_q8_K_neon(int n, const void *w, const void *x);
float cv_vec_dot_q4_K_q8_K_neon(int n, const void *w, const void *x);
float cv_vec_dot_q5_K_q8_K_neon(int n, const void *w, const void *x);
float cv_vec_dot_q6_K_q8_K_neon(int n, const void *w, const void *x);
#endif

#endif
