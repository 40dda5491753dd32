/* kernels.h: per-type row conversions and dot products, with runtime CPU
 * dispatch, and the row-parallel matrix-vector product built on them.
 *
 * Contract:
 * - A weight row of type T is multiplied with an activation row converted
 *   to traits(T)->vec_dot_type (F32 for F32, F16 for F16, BF16 for BF16,
 *   Q8_0 for Q4_0, Q5_0, IQ4_NL and Q8_0, Q8_1 for Q5_1, Q8_K for the
 *   K-quants), as llama.cpp's CPU backend does, so results can match it.
 * - Every kernel has a scalar `_ref` version (portable C, no intrinsics)
 *   and where it pays an AVX2+FMA+F16C version (and a NEON version). The
 *   reference sums in the SIMD kernel's lane order and uses fmaf where the
 *   SIMD kernel fuses, so all versions give the same bits on every machine.
 * - cv_kernels_init() selects the implementation once: AVX2 when the CPU
 *   has AVX2, FMA and F16C, NEON on arm64, else the reference. Where the
 *   CPU also has AVX-512 VNNI (F, BW, VL, VNNI), AVX-512 kernels replace
 *   some AVX2 ones ("avx512"); they give the same bits, so nodes of a
 *   cluster may differ. The environment variable CONVOY_KERNELS=ref (or
 *   cv_kernels_init(1)) forces the reference, CONVOY_KERNELS=avx2 the AVX2
 *   kernels alone. It runs by itself when the program starts (a
 *   constructor); a test may call it again to choose again.
 * - Each output element of cv_matmul_rows has the bits of one vec_dot call
 *   (many-token products share work between outputs, never the order of
 *   an output's sums), which do not depend on how many rows or tokens are
 *   computed around it: this is what makes a row inside a batch
 *   bit-identical to the row alone. */
#ifndef CONVOY_KERNELS_KERNELS_H
#define CONVOY_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/types.h"

typedef void (*cv_from_float_fn)(const float *x, void *y, int64_t n);
typedef void (*cv_to_float_fn)(const void *x, float *y, int64_t n);
/* Dot product of a weight row w (type T) and an activation row x (type
 * vec_dot_type of T), both of n elements. */
typedef float (*cv_vec_dot_fn)(int n, const void *w, const void *x);

typedef struct cv_type_traits {
    const char *name;      /* "F32", "Q4_0", ... as llama.cpp prints them */
    int blck_size;         /* elements per block (1 for F32/F16/BF16) */
    size_t type_size;      /* bytes per block */
    bool is_quantized;
    cv_type vec_dot_type;  /* type the activation row is converted to */
    cv_to_float_fn to_float;     /* dequantize a row */
    cv_from_float_fn from_float; /* convert a row to this type as an
                                    activation (selected implementation) */
    cv_from_float_fn quantize;   /* convert a weight row, as llama-quantize
                                    does (reference rule, no importance
                                    matrix); differs from from_float only
                                    for Q8_0; NULL for activation-only types */
    cv_vec_dot_fn vec_dot;       /* selected implementation */
    cv_vec_dot_fn vec_dot_ref;   /* scalar reference */
} cv_type_traits;

/* g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u for i in [0, n):
 * SwiGLU's gate, exp by fixed steps (kernels_impl.h), so every version
 * and machine gives the same bits. */
void cv_silu_mul(float *g, const float *u, int64_t n);

/* kind: 0 = best for this CPU (or env override), 1 = force reference. */
void cv_kernels_init(int force_ref);
/* "avx512", "avx2", "neon" or "ref": what cv_kernels_init selected. */
const char *cv_kernels_name(void);
/* Whether the AVX2 kernels are selected, alone or under AVX-512 ones. */
bool cv_kernels_avx2(void);

/* NULL for a type convoy does not support. */
const cv_type_traits *cv_type_get(cv_type t);
const char *cv_type_name(cv_type t); /* GGML's name, also for types convoy cannot compute with; "unknown" for ids GGML does not define */
/* Parses "Q4_0", "q4_0", "F16", ...; returns -1 when unknown. */
int cv_type_from_name(const char *name);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size. */
size_t cv_row_bytes(cv_type t, int64_t n);

/* y[t * ldy + r] = vec_dot(W row r, x row t) for r in [r0, r1), t in [0, m).
 * w: weight rows of type wt, n_in elements each, consecutive.
 * x: m activation rows already converted to vec_dot_type(wt), x_stride bytes
 * apart. Called by each thread of a pool on its own row range. */
void cv_matmul_rows(cv_type wt, const void *w, int n_in, const void *x, size_t x_stride, int m,
                    float *y, int ldy, long r0, long r1);

/* Interleaved weights, for the types with interleaved kernels on this CPU
 * (cv_interleave_supported, for n_rows rows of n_in elements: whole groups
 * of INTERLEAVE_ROWS, rows of at most INTERLEAVE_MAX_IN): such a matrix can
 * be held with block b of the 8 rows of a group side by side
 * (kernels_impl.h), in the same bytes. A product then reads 8 rows' block
 * as one piece, as a tile needs it, with no repacking per call: batched
 * decode gets the tile's sharing of weights at 2-8 tokens.
 * cv_interleave converts n_rows rows (a multiple of 8) at w in place; it
 * returns -1 for a type without the layout, or when out of memory.
 * cv_matmul_interleaved is cv_matmul_rows for such a matrix, with r0 and
 * r1 multiples of 8, and gives each output the bits cv_matmul_rows gives
 * from the plain rows (whichever kernels are selected later). */
#define INTERLEAVE_ROWS 8
#define INTERLEAVE_MAX_IN 131072
bool cv_interleave_supported(cv_type t, int n_in, long n_rows);
int cv_interleave(cv_type t, int n_in, long n_rows, void *w);
/* The same from the plain rows at src into dst (another place), allocating nothing. */
int cv_interleave_into(cv_type t, int n_in, long n_rows, const void *src, void *dst);
void cv_matmul_interleaved(cv_type wt, const void *w, int n_in, const void *x, size_t x_stride, int m, float *y,
                           int ldy, long r0, long r1);

#endif
