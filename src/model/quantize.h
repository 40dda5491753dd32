/* quantize.h: converting GGUF weight tensors between types, and the type
 * policy shared by `convoy quantize` and `convoy synth`.
 *
 * Contract:
 * - Which tensors are converted: the weight matrices, that is tensors of
 *   rank >= 2 whose name ends in "weight" and not in "_norm.weight", and
 *   not a router (ffn_gate_inp.weight), the same test as llama.cpp's
 *   quantizer for these models. Everything else (norms, 1-D tensors,
 *   routers) is copied unchanged. Stacked experts (rank 3) are converted
 *   row by row like any matrix.
 * - cv_quant_fit_type: the type a matrix with rows of row_len elements gets
 *   when `want` is requested. If row_len is a multiple of want's block size
 *   that is `want`. Otherwise llama.cpp's fallback, a type of block 32: Q2_K,
 *   Q3_K, IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; and when that does not fit either,
 *   or for the types of block 32, F16, llama.cpp's last-resort fallback for
 *   unusual shapes. (llama-quantize itself stops with "no tensor type
 *   fallback is defined" for the types of block 32.)
 * - cv_quant_file_type: llama.cpp's general.file_type (enum llama_ftype)
 *   for a file whose matrices are all of type t: F32 0, F16 1, Q4_0 2,
 *   Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K 11 (Q3_K_S), Q4_K 14 (Q4_K_S),
 *   Q5_K 16 (Q5_K_S), Q6_K 18,
 *   IQ4_NL 25, IQ4_XS 30, BF16 32, MXFP4 38 (MOSTLY_MXFP4_MOE, the only
 *   file type llama.cpp has for it); -1 for types that are not weight types.
 * - Rows are converted with the types' traits: the source's to_float, then
 *   the target's `quantize` (llama.cpp's reference quantizer, what
 *   llama-quantize writes without an importance matrix). cv_kernels_init()
 *   must have run.
 * - Conversions are row by row and each row is converted alone, so results
 *   do not depend on the thread count.
 * - cv_quantize_file converts each tensor as it writes it, holding one
 *   (the largest output tensor, at most) besides the threads' f32 rows,
 *   and reads the input through its mapping, whose pages it releases
 *   tensor by tensor; note hears of each tensor as it is written. The output has all key/values of the input except
 *   general.file_type and general.quantization_version, which are set anew
 *   at the end (as llama-quantize does); general.alignment is kept, and the
 *   writer aligns to it. Tensors keep their order. Only F32, F16 and BF16
 *   tensors are converted (like llama-quantize without
 *   --allow-requantize); a tensor already of the target type is copied. */
#ifndef CONVOY_MODEL_QUANTIZE_H
#define CONVOY_MODEL_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/types.h"

/* What happened to one tensor (reported by synth and quantize). */
typedef struct cv_tensor_note {
    int index;           /* 0-based position in the output */
    int count;           /* number of tensors in the output */
    const char *name;
    uint32_t n_dims;
    const int64_t *ne;
    cv_type src_type;    /* input type (synth: F32, the generated values) */
    cv_type want_type;   /* requested type */
    cv_type type;        /* type written: differs from want_type on a fallback */
    uint64_t src_bytes;  /* bytes in the input (synth: as F32) */
    uint64_t bytes;      /* bytes written */
} cv_tensor_note;

typedef void (*cv_tensor_note_fn)(void *ctx, const cv_tensor_note *note);

bool cv_quant_is_weight_matrix(const char *name, uint32_t n_dims);
cv_type cv_quant_fit_type(cv_type want, int64_t row_len);
int cv_quant_file_type(cv_type t);
/* True when t is a weight type (cv_quant_file_type >= 0) that this build
 * can write (its traits have `quantize`). */
bool cv_quant_can_write(cv_type t);

/* llama.cpp's mixes (llama-quantize's ftypes): which matrices get a type
 * other than the mix's base type (llama_tensor_get_type, without an
 * importance matrix). In all of them output.weight is Q6_K. Then:
 * - Q2_K (base Q2_K): attn_v Q4_K where the model has 4 or more query
 *   heads per KV head, else Q3_K; ffn_down and attn_output Q3_K;
 * - Q3_K_S (base Q3_K): nothing else;
 * - Q3_K_M: attn_v Q5_K in layers 0 and 1, Q4_K after; ffn_down Q5_K in
 *   the first sixteenth of the layers, Q4_K after; attn_output Q4_K;
 * - Q3_K_L: attn_v, ffn_down and attn_output Q5_K;
 * - Q4_K_M, Q5_K_M: attn_v and ffn_down Q6_K in the layers llama.cpp's
 *   use_more_bits picks (the first and last eighth, every third between).
 * A fused attn_qkv (phi3) is Q4_K in Q3_K_M and Q3_K_L, Q5_K in Q4_K_M,
 * Q6_K in Q5_K_M. "ffn_down" covers a mixture of experts' ffn_down_exps and
 * ffn_down_shexp (by their layer). And as llama.cpp does for a model of
 * exactly 8 experts (Mixtral), in every mix attn_v and attn_k are Q8_0,
 * and attn_output is Q5_K in Q2_K, Q3_K_S, Q3_K_M and Q4_K_M, else the
 * base type. */
typedef enum cv_quant_mix {
    CV_MIX_NONE = 0, /* every matrix of `type` */
    CV_MIX_Q2_K,
    CV_MIX_Q3_K_S,
    CV_MIX_Q3_K_M,
    CV_MIX_Q3_K_L,
    CV_MIX_Q4_K_M,
    CV_MIX_Q5_K_M,
} cv_quant_mix;

typedef struct cv_quantize_params {
    cv_type type;        /* type of the weight matrices (a mix's base type) */
    cv_type output_type; /* type of output.weight; CV_TYPE_COUNT = `type` (Q6_K in a mix) */
    cv_quant_mix mix;
    int n_gqa;           /* query heads per KV head (the Q2_K mix asks); cv_quantize_file reads it */
    int n_expert;        /* experts per layer, 0 if none (the mixes ask); cv_quantize_file reads it */
    int n_threads;       /* conversion threads; the output does not depend on it */
} cv_quantize_params;

/* Parses a type name as `convoy quantize` and `convoy synth` take it: a
 * type ("Q4_0", "q6_k", ...), one of llama.cpp's mixes "Q2_K", "Q3_K_S",
 * "Q3_K_M", "Q3_K_L", "Q4_K_M", "Q5_K_M" (*mix set, *type the base type),
 * or "Q4_K_S" / "Q5_K_S" (plain Q4_K / Q5_K). -1 if unknown. */
int cv_quant_parse_type(const char *name, cv_type *type, cv_quant_mix *mix);
/* Layer index of a "blk.N." tensor name, or -1. */
int cv_quant_layer_of(const char *name);

/* The type the policy of p wants for a weight matrix of layer `layer`
 * (-1 for tensors outside the blocks) of n_layer. */
cv_type cv_quant_policy_type(const cv_quantize_params *p, const char *name, int layer, int n_layer);
/* llama.cpp's general.file_type for a file made with the policy of p:
 * the mix's (MOSTLY_Q2_K 10, Q3_K_S 11, Q3_K_M 12, Q3_K_L 13, Q4_K_M 15,
 * Q5_K_M 17), else cv_quant_file_type(p->type). */
int cv_quant_policy_file_type(const cv_quantize_params *p);
/* The name of llama.cpp's general.file_type ftype ("Q4_K_M", "F16", ...),
 * or NULL for a number llama.cpp does not define. */
const char *cv_quant_file_type_name(int64_t ftype);

int cv_quantize_file(const char *in_path, const char *out_path, const cv_quantize_params *p,
                     cv_tensor_note_fn note, void *note_ctx, char *err, size_t errlen);

#endif
