/* types.h: weight and activation types, their block layouts, and scalar
 * half-precision conversions.
 *
 * Contract: cv_type values equal GGML's type ids, so a GGUF tensor's type
 * field is a cv_type. Every quant block is a packed struct whose size is
 * pinned by static_assert and equals GGML's, so a tensor's bytes in a GGUF
 * file are an array of these blocks, row after row. A row of n elements of a
 * block type holds n / blck_size blocks (n must be a multiple).
 *
 * The fp16 and bf16 conversions here are exact scalar versions of the
 * hardware ones (F16C vcvtps2ph with round-to-nearest-even, and GGML's
 * fp32->bf16 rounding), so that the reference and SIMD kernels agree. */
#ifndef CONVOY_KERNELS_TYPES_H
#define CONVOY_KERNELS_TYPES_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum cv_type {
    CV_TYPE_F32 = 0,
    CV_TYPE_F16 = 1,
    CV_TYPE_Q4_0 = 2,
    CV_TYPE_Q5_0 = 6,
    CV_TYPE_Q5_1 = 7,
    CV_TYPE_Q8_0 = 8,
    CV_TYPE_Q8_1 = 9,
    CV_TYPE_Q2_K = 10,
    CV_TYPE_Q3_K = 11,
    CV_TYPE_Q4_K = 12,
    CV_TYPE_Q5_K = 13,
    CV_TYPE_Q6_K = 14,
    CV_TYPE_Q8_K = 15,
    CV_TYPE_IQ4_NL = 20,
    CV_TYPE_IQ4_XS = 23,
    CV_TYPE_BF16 = 30,
    CV_TYPE_MXFP4 = 39,
    CV_TYPE_COUNT = 40 /* bound on ids we index tables with, not a type */
} cv_type;

typedef uint16_t cv_fp16; /* IEEE half, bits */
typedef uint16_t cv_bf16; /* bfloat16, bits */

#define QK4_0 32
typedef struct {
    cv_fp16 d;            /* scale */
    uint8_t qs[QK4_0 / 2]; /* element j in low nibble of qs[j], j+16 in high nibble; value = (q - 8) * d */
} block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

#define QK8_0 32
typedef struct {
    cv_fp16 d;        /* scale */
    int8_t qs[QK8_0]; /* value = q * d */
} block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Q5_0, Q5_1: the quants of Q4_0's layout with a fifth bit each, bit j of
 * qh (read as a little-endian uint32) for element j. */
#define QK5_0 32
typedef struct {
    cv_fp16 d;             /* scale */
    uint8_t qh[4];         /* fifth bits */
    uint8_t qs[QK5_0 / 2]; /* low 4 bits, as Q4_0; value = (q - 16) * d */
} block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

#define QK5_1 32
typedef struct {
    cv_fp16 d;             /* scale */
    cv_fp16 m;             /* minimum */
    uint8_t qh[4];         /* fifth bits */
    uint8_t qs[QK5_1 / 2]; /* low 4 bits, as Q4_0; value = q * d + m */
} block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* Q8_1: Q8_0 with the sum of the block's values, which a weight's minimum
 * (Q5_1) meets. Activations only. */
#define QK8_1 32
typedef struct {
    cv_fp16 d;        /* scale */
    cv_fp16 s;        /* d * sum of qs */
    int8_t qs[QK8_1]; /* value = q * d */
} block_q8_1;
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");

/* IQ4_NL: Q4_0's layout, the nibble an index into a fixed non-linear table
 * (cv_kvalues_iq4nl, quants32.h); value = cv_kvalues_iq4nl[q] * d. */
#define QK4_NL 32
typedef struct {
    cv_fp16 d;
    uint8_t qs[QK4_NL / 2];
} block_iq4_nl;
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");

/* MXFP4 (OCP microscaling, gpt-oss's experts): Q4_0's nibble layout, each
 * nibble a 4-bit float E2M1 stored doubled as cv_kvalues_mxfp4[q] (quants32.h),
 * and one E8M0 exponent e per block for the scale: value =
 * cv_kvalues_mxfp4[q] * 2^(e - 128) (the doubled values meet half the E8M0
 * scale 2^(e - 127)). */
#define QK_MXFP4 32
typedef struct {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
} block_mxfp4;
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");

#define QK_K 256
#define K_SCALE_SIZE 12

/* Q2_K: 16 sub-blocks of 16, each a 4-bit scale (low nibble of scales[s])
 * and a 4-bit min (high nibble); weight 128h + 32j + l has the 2-bit quant
 * (qs[32h + l] >> 2j) & 3 and value d * scale * q - dmin * min. */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    cv_fp16 d;    /* super-block scale for the scales */
    cv_fp16 dmin; /* super-block scale for the mins */
} block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

/* Q3_K: Q2_K's 2-bit quants with a third bit, bit j of hmask[l] for weight
 * 32j + l, and 16 signed 6-bit scales (kq_q3_scales); the value is
 * d * (scale - 32) * (q - 4), q the 3-bit quant. */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[K_SCALE_SIZE];
    cv_fp16 d;
} block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
/* IQ4_XS: super-blocks of 256, 8 sub-blocks of 32 with IQ4_NL's nibbles
 * (sub-block ib at qs + 16 ib, Q4_0's order) and a 6-bit scale ls (low 4
 * bits: nibble ib % 2 of scales_l[ib / 2]; top 2: bits 2ib, 2ib+1 of
 * scales_h); value = d * (ls - 32) * cv_kvalues_iq4nl[q]. */
typedef struct {
    cv_fp16 d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");

typedef struct {
    cv_fp16 d;                    /* super-block scale for the 6-bit scales */
    cv_fp16 dmin;                 /* super-block scale for the 6-bit mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 scales and 8 mins, 6 bits each */
    uint8_t qs[QK_K / 2];         /* 4-bit quants */
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

typedef struct {
    cv_fp16 d;
    cv_fp16 dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8]; /* 5th bit of each quant */
    uint8_t qs[QK_K / 2]; /* low 4 bits */
} block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* 8-bit scale per 16 elements */
    cv_fp16 d;                 /* super-block scale */
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

typedef struct {
    float d;                  /* scale (f32, unlike Q8_0) */
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sum of each 16 quants */
} block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* Block size and bytes per block of any GGML type id (also those convoy
 * cannot compute with), so a GGUF reader can size every tensor. Returns 0
 * for an id GGML does not define (or no longer defines). */
int cv_ggml_type_info(uint32_t type, const char **name, int *blck_size, size_t *type_size);

static inline uint32_t cv_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float cv_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float cv_fp16_to_fp32(cv_fp16 h);
cv_fp16 cv_fp32_to_fp16(float f); /* round to nearest even, as F16C */

static inline float cv_bf16_to_fp32(cv_bf16 h) { return cv_bits_f32((uint32_t)h << 16); }
cv_bf16 cv_fp32_to_bf16(float f); /* round to nearest even; NaN stays NaN */

#endif
