/* kernels.c: the type traits table, CPU dispatch, and the row-parallel
 * matrix product.
 *
 * traits_ref holds every supported type with its scalar reference kernels;
 * it is indexed by cv_type with designated initializers, so a new type is
 * one row here plus, where it has SIMD kernels, one row in kernels_avx2 /
 * kernels_neon. cv_kernels_init builds traits_best from traits_ref with the
 * SIMD entries of the selected ISA laid over it (an empty entry keeps the
 * reference) and points the active table at it. Until cv_kernels_init
 * runs, the active table is traits_ref, so every entry is always callable.
 * The kernels themselves live in ref.c, kernels_avx2.c and kernels_neon.c
 * (see kernels_impl.h for the schedule they share).
 *
 * cv_matmul_rows hands a type's rows to its tile kernel, where the selected
 * ISA has one (TILE_ROWS rows times a block of tokens, sharing the
 * unpacking of each weight block between tokens), in token blocks that
 * stay in L2; the rows a tile cannot cover, and products of too few
 * tokens for a tile to pay (decode), take one vec_dot per output. A tile gives
 * each output the bits of that vec_dot. cv_matmul_interleaved hands the
 * groups of an interleaved matrix to the type's interleaved kernel (the
 * selected ISA's, else the reference) in the same token blocks. */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_impl.h"
#include "kernels/kquants.h"
#include "kernels/quants32.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

static const cv_type_traits traits_ref[CV_TYPE_COUNT] = {
    [CV_TYPE_F32] = {.name = "F32", .blck_size = 1, .type_size = sizeof(float), .is_quantized = false,
                     .vec_dot_type = CV_TYPE_F32, .to_float = cv_convert_row_f32, .from_float = cv_copy_row_f32,
                     .quantize = cv_copy_row_f32, .vec_dot = cv_vec_dot_f32_ref, .vec_dot_ref = cv_vec_dot_f32_ref},
    [CV_TYPE_F16] = {.name = "F16", .blck_size = 1, .type_size = sizeof(cv_fp16), .is_quantized = false,
                     .vec_dot_type = CV_TYPE_F16, .to_float = cv_convert_row_f16,
                     .from_float = cv_convert_row_f32_to_f16_ref, .quantize = cv_convert_row_f32_to_f16_ref,
                     .vec_dot = cv_vec_dot_f16_ref, .vec_dot_ref = cv_vec_dot_f16_ref},
    [CV_TYPE_BF16] = {.name = "BF16", .blck_size = 1, .type_size = sizeof(cv_bf16), .is_quantized = false,
                      .vec_dot_type = CV_TYPE_BF16, .to_float = cv_convert_row_bf16,
                      .from_float = cv_convert_row_f32_to_bf16, .quantize = cv_convert_row_f32_to_bf16,
                      .vec_dot = cv_vec_dot_bf16_ref, .vec_dot_ref = cv_vec_dot_bf16_ref},
    [CV_TYPE_Q8_0] = {.name = "Q8_0", .blck_size = QK8_0, .type_size = sizeof(block_q8_0), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_0, .to_float = cv_dequantize_row_q8_0,
                      .from_float = cv_quantize_row_q8_0_ref, .quantize = cv_quantize_row_q8_0_weight,
                      .vec_dot = cv_vec_dot_q8_0_q8_0_ref, .vec_dot_ref = cv_vec_dot_q8_0_q8_0_ref},
    [CV_TYPE_Q4_0] = {.name = "Q4_0", .blck_size = QK4_0, .type_size = sizeof(block_q4_0), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_0, .to_float = cv_dequantize_row_q4_0,
                      .from_float = cv_quantize_row_q4_0, .quantize = cv_quantize_row_q4_0,
                      .vec_dot = cv_vec_dot_q4_0_q8_0_ref, .vec_dot_ref = cv_vec_dot_q4_0_q8_0_ref},
    [CV_TYPE_Q5_0] = {.name = "Q5_0", .blck_size = QK5_0, .type_size = sizeof(block_q5_0), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_0, .to_float = cv_dequantize_row_q5_0,
                      .from_float = cv_quantize_row_q5_0, .quantize = cv_quantize_row_q5_0,
                      .vec_dot = cv_vec_dot_q5_0_q8_0_ref, .vec_dot_ref = cv_vec_dot_q5_0_q8_0_ref},
    [CV_TYPE_Q5_1] = {.name = "Q5_1", .blck_size = QK5_1, .type_size = sizeof(block_q5_1), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_1, .to_float = cv_dequantize_row_q5_1,
                      .from_float = cv_quantize_row_q5_1, .quantize = cv_quantize_row_q5_1,
                      .vec_dot = cv_vec_dot_q5_1_q8_1_ref, .vec_dot_ref = cv_vec_dot_q5_1_q8_1_ref},
    [CV_TYPE_IQ4_NL] = {.name = "IQ4_NL", .blck_size = QK4_NL, .type_size = sizeof(block_iq4_nl),
                        .is_quantized = true, .vec_dot_type = CV_TYPE_Q8_0, .to_float = cv_dequantize_row_iq4_nl,
                        .from_float = cv_quantize_row_iq4_nl, .quantize = cv_quantize_row_iq4_nl,
                        .vec_dot = cv_vec_dot_iq4_nl_q8_0_ref, .vec_dot_ref = cv_vec_dot_iq4_nl_q8_0_ref},
    [CV_TYPE_MXFP4] = {.name = "MXFP4", .blck_size = QK_MXFP4, .type_size = sizeof(block_mxfp4),
                       .is_quantized = true, .vec_dot_type = CV_TYPE_Q8_0, .to_float = cv_dequantize_row_mxfp4,
                       .from_float = cv_quantize_row_mxfp4, .quantize = cv_quantize_row_mxfp4,
                       .vec_dot = cv_vec_dot_mxfp4_q8_0_ref, .vec_dot_ref = cv_vec_dot_mxfp4_q8_0_ref},
    [CV_TYPE_Q2_K] = {.name = "Q2_K", .blck_size = QK_K, .type_size = sizeof(block_q2_K), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_q2_K,
                      .from_float = cv_quantize_row_q2_K, .quantize = cv_quantize_row_q2_K,
                      .vec_dot = cv_vec_dot_q2_K_q8_K_ref, .vec_dot_ref = cv_vec_dot_q2_K_q8_K_ref},
    [CV_TYPE_Q3_K] = {.name = "Q3_K", .blck_size = QK_K, .type_size = sizeof(block_q3_K), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_q3_K,
                      .from_float = cv_quantize_row_q3_K, .quantize = cv_quantize_row_q3_K,
                      .vec_dot = cv_vec_dot_q3_K_q8_K_ref, .vec_dot_ref = cv_vec_dot_q3_K_q8_K_ref},
    [CV_TYPE_IQ4_XS] = {.name = "IQ4_XS", .blck_size = QK_K, .type_size = sizeof(block_iq4_xs),
                        .is_quantized = true, .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_iq4_xs,
                        .from_float = cv_quantize_row_iq4_xs, .quantize = cv_quantize_row_iq4_xs,
                        .vec_dot = cv_vec_dot_iq4_xs_q8_K_ref, .vec_dot_ref = cv_vec_dot_iq4_xs_q8_K_ref},
    [CV_TYPE_Q4_K] = {.name = "Q4_K", .blck_size = QK_K, .type_size = sizeof(block_q4_K), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_q4_K,
                      .from_float = cv_quantize_row_q4_K, .quantize = cv_quantize_row_q4_K,
                      .vec_dot = cv_vec_dot_q4_K_q8_K_ref, .vec_dot_ref = cv_vec_dot_q4_K_q8_K_ref},
    [CV_TYPE_Q5_K] = {.name = "Q5_K", .blck_size = QK_K, .type_size = sizeof(block_q5_K), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_q5_K,
                      .from_float = cv_quantize_row_q5_K, .quantize = cv_quantize_row_q5_K,
                      .vec_dot = cv_vec_dot_q5_K_q8_K_ref, .vec_dot_ref = cv_vec_dot_q5_K_q8_K_ref},
    [CV_TYPE_Q6_K] = {.name = "Q6_K", .blck_size = QK_K, .type_size = sizeof(block_q6_K), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_q6_K,
                      .from_float = cv_quantize_row_q6_K, .quantize = cv_quantize_row_q6_K,
                      .vec_dot = cv_vec_dot_q6_K_q8_K_ref, .vec_dot_ref = cv_vec_dot_q6_K_q8_K_ref},
    /* activations only: no weight quantizer and no dot product */
    [CV_TYPE_Q8_K] = {.name = "Q8_K", .blck_size = QK_K, .type_size = sizeof(block_q8_K), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_K, .to_float = cv_dequantize_row_q8_K,
                      .from_float = cv_quantize_row_q8_K},
    [CV_TYPE_Q8_1] = {.name = "Q8_1", .blck_size = QK8_1, .type_size = sizeof(block_q8_1), .is_quantized = true,
                      .vec_dot_type = CV_TYPE_Q8_1, .to_float = cv_dequantize_row_q8_1,
                      .from_float = cv_quantize_row_q8_1},
};

/* The SIMD versions of a type's vec_dot and from_float, NULL keeping the
 * reference, and its tile kernel for cv_matmul_rows (NULL: none) with the
 * fewest tokens it is used for and the rows it covers (0: TILE_ROWS). */
typedef struct simd_kernels {
    cv_vec_dot_fn vec_dot;
    cv_from_float_fn from_float;
    matmul_tile_fn matmul_tile;
    int tile_min_tokens;
    int tile_rows;
    matmul_interleaved_fn matmul_interleaved;
} simd_kernels;

/* The interleaved layout of each type that has one: the conversion, and
 * the reference dot product of a row, which serves when the selected ISA
 * has no interleaved kernel. */
typedef struct interleaved_layout {
    interleave_fn interleave;
    vec_dot_interleaved_fn vec_dot_ref;
} interleaved_layout;

static const interleaved_layout interleaved[CV_TYPE_COUNT] = {
    [CV_TYPE_Q8_0] = {.interleave = cv_interleave_q8_0, .vec_dot_ref = cv_vec_dot_interleaved_q8_0_ref},
    [CV_TYPE_Q4_0] = {.interleave = cv_interleave_q4_0, .vec_dot_ref = cv_vec_dot_interleaved_q4_0_ref},
    [CV_TYPE_IQ4_NL] = {.interleave = cv_interleave_q4_0, .vec_dot_ref = cv_vec_dot_interleaved_iq4_nl_ref},
    [CV_TYPE_MXFP4] = {.interleave = cv_interleave_mxfp4, .vec_dot_ref = cv_vec_dot_interleaved_mxfp4_ref},
    [CV_TYPE_Q4_K] = {.interleave = cv_interleave_q4_K, .vec_dot_ref = cv_vec_dot_interleaved_q4_K_ref},
    [CV_TYPE_Q5_K] = {.interleave = cv_interleave_q5_K, .vec_dot_ref = cv_vec_dot_interleaved_q5_K_ref},
    [CV_TYPE_Q6_K] = {.interleave = cv_interleave_q6_K, .vec_dot_ref = cv_vec_dot_interleaved_q6_K_ref},
};

#if defined(__x86_64__)
static const simd_kernels kernels_avx2[CV_TYPE_COUNT] = {
    [CV_TYPE_F32] = {.vec_dot = cv_vec_dot_f32_avx2, .matmul_tile = cv_matmul_tile_f32_avx2,
                     .tile_min_tokens = TILE_MIN_TOKENS_FLOAT},
    [CV_TYPE_F16] = {.vec_dot = cv_vec_dot_f16_avx2, .from_float = cv_convert_row_f32_to_f16_avx2,
                     .matmul_tile = cv_matmul_tile_f16_avx2, .tile_min_tokens = TILE_MIN_TOKENS_FLOAT},
    [CV_TYPE_BF16] = {.vec_dot = cv_vec_dot_bf16_avx2, .matmul_tile = cv_matmul_tile_bf16_avx2,
                      .tile_min_tokens = TILE_MIN_TOKENS_FLOAT},
    [CV_TYPE_Q8_0] = {.vec_dot = cv_vec_dot_q8_0_q8_0_avx2, .from_float = cv_quantize_row_q8_0_avx2,
                      .matmul_tile = cv_matmul_tile_q8_0_q8_0_avx2, .tile_min_tokens = TILE_MIN_TOKENS_Q8_0,
                      .tile_rows = Q8_0_TILE_ROWS, .matmul_interleaved = cv_matmul_interleaved_q8_0_avx2},
    [CV_TYPE_Q4_0] = {.vec_dot = cv_vec_dot_q4_0_q8_0_avx2, .matmul_tile = cv_matmul_tile_q4_0_q8_0_avx2,
                      .tile_min_tokens = TILE_MIN_TOKENS_QUANT,
                      .matmul_interleaved = cv_matmul_interleaved_q4_0_avx2},
    [CV_TYPE_Q4_K] = {.vec_dot = cv_vec_dot_q4_K_q8_K_avx2, .matmul_tile = cv_matmul_tile_q4_K_q8_K_avx2,
                      .tile_min_tokens = TILE_MIN_TOKENS_Q45,
                      .matmul_interleaved = cv_matmul_interleaved_q4_K_avx2},
    [CV_TYPE_Q5_K] = {.vec_dot = cv_vec_dot_q5_K_q8_K_avx2, .matmul_tile = cv_matmul_tile_q5_K_q8_K_avx2,
                      .tile_min_tokens = TILE_MIN_TOKENS_Q45,
                      .matmul_interleaved = cv_matmul_interleaved_q5_K_avx2},
    [CV_TYPE_Q6_K] = {.vec_dot = cv_vec_dot_q6_K_q8_K_avx2, .matmul_tile = cv_matmul_tile_q6_K_q8_K_avx2,
                      .tile_min_tokens = TILE_MIN_TOKENS_QUANT,
                      .matmul_interleaved = cv_matmul_interleaved_q6_K_avx2},
    [CV_TYPE_Q2_K] = {.vec_dot = cv_vec_dot_q2_K_q8_K_avx2},
    [CV_TYPE_Q3_K] = {.vec_dot = cv_vec_dot_q3_K_q8_K_avx2},
    [CV_TYPE_Q5_0] = {.vec_dot = cv_vec_dot_q5_0_q8_0_avx2},
    [CV_TYPE_Q5_1] = {.vec_dot = cv_vec_dot_q5_1_q8_1_avx2},
    [CV_TYPE_IQ4_NL] = {.vec_dot = cv_vec_dot_iq4_nl_q8_0_avx2,
                        .matmul_interleaved = cv_matmul_interleaved_iq4_nl_avx2},
    [CV_TYPE_IQ4_XS] = {.vec_dot = cv_vec_dot_iq4_xs_q8_K_avx2},
    [CV_TYPE_MXFP4] = {.vec_dot = cv_vec_dot_mxfp4_q8_0_avx2, .matmul_interleaved = cv_matmul_interleaved_mxfp4_avx2},
    [CV_TYPE_Q8_K] = {.from_float = cv_quantize_row_q8_K_avx2},
};

static bool cpu_has_avx2_fma_f16c(void)
{
    /* F16C from cpuid: clang's __builtin_cpu_supports does not know it */
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C))
        return false;
    /* these also check that the OS saves the AVX registers */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Where the CPU has AVX-512 VNNI, these replace the AVX2 kernels of their
 * type: the same bits, a quarter of the ALU work with several tokens. */
static const matmul_interleaved_fn interleaved_avx512[CV_TYPE_COUNT] = {
    [CV_TYPE_Q4_0] = cv_matmul_interleaved_q4_0_avx512,
    [CV_TYPE_IQ4_NL] = cv_matmul_interleaved_iq4_nl_avx512,
    [CV_TYPE_MXFP4] = cv_matmul_interleaved_mxfp4_avx512,
    [CV_TYPE_Q4_K] = cv_matmul_interleaved_q4_K_avx512,
    [CV_TYPE_Q5_K] = cv_matmul_interleaved_q5_K_avx512,
    [CV_TYPE_Q6_K] = cv_matmul_interleaved_q6_K_avx512,
};

/* and these replace the AVX2 vec_dot of their type (same bits, half the
 * instructions for one token). */
static const cv_vec_dot_fn vec_dot_avx512[CV_TYPE_COUNT] = {
    [CV_TYPE_Q2_K] = cv_vec_dot_q2_K_q8_K_avx512,
    [CV_TYPE_Q3_K] = cv_vec_dot_q3_K_q8_K_avx512,
    [CV_TYPE_MXFP4] = cv_vec_dot_mxfp4_q8_0_avx512,
    [CV_TYPE_IQ4_XS] = cv_vec_dot_iq4_xs_q8_K_avx512,
};

static bool cpu_has_avx512_vnni(void)
{
    /* these also check that the OS saves the AVX-512 registers */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#endif

#if defined(__aarch64__)
static const simd_kernels kernels_neon[CV_TYPE_COUNT] = {
    [CV_TYPE_F32] = {.vec_dot = cv_vec_dot_f32_neon},
    [CV_TYPE_F16] = {.vec_dot = cv_vec_dot_f16_neon, .from_float = cv_convert_row_f32_to_f16_neon},
    [CV_TYPE_BF16] = {.vec_dot = cv_vec_dot_bf16_neon},
    [CV_TYPE_Q8_0] = {.vec_dot = cv_vec_dot_q8_0_q8_0_neon, .from_float = cv_quantize_row_q8_0_neon},
    [CV_TYPE_Q4_0] = {.vec_dot = cv_vec_dot_q4_0_q8_0_neon},
    [CV_TYPE_Q4_K] = {.vec_dot = cv_vec_dot_q4_K_q8_K_neon},
    [CV_TYPE_Q5_K] = {.vec_dot = cv_vec_dot_q5_K_q8_K_neon},
    [CV_TYPE_Q6_K] = {.vec_dot = cv_vec_dot_q6_K_q8_K_neon},
    [CV_TYPE_Q2_K] = {.vec_dot = cv_vec_dot_q2_K_q8_K_neon},
    [CV_TYPE_Q3_K] = {.vec_dot = cv_vec_dot_q3_K_q8_K_neon},
    [CV_TYPE_Q5_0] = {.vec_dot = cv_vec_dot_q5_0_q8_0_neon},
    [CV_TYPE_Q5_1] = {.vec_dot = cv_vec_dot_q5_1_q8_1_neon},
    [CV_TYPE_IQ4_NL] = {.vec_dot = cv_vec_dot_iq4_nl_q8_0_neon},
    [CV_TYPE_IQ4_XS] = {.vec_dot = cv_vec_dot_iq4_xs_q8_K_neon},
    [CV_TYPE_MXFP4] = {.vec_dot = cv_vec_dot_mxfp4_q8_0_neon},
};
#endif

static cv_type_traits traits_best[CV_TYPE_COUNT];
static const cv_type_traits *traits = traits_ref;
static matmul_tile_fn matmul_tile[CV_TYPE_COUNT];
static matmul_interleaved_fn matmul_interleaved[CV_TYPE_COUNT];
static int tile_min_tokens[CV_TYPE_COUNT];
static int tile_rows[CV_TYPE_COUNT];
static const char *kernels_name = "ref";
static void (*silu_mul)(float *g, const float *u, int64_t n) = cv_silu_mul_ref;

#if defined(__x86_64__)
/* AVX-512 VNNI kernels over the AVX2 ones, unless CONVOY_KERNELS=avx2. */
static void select_avx512(const char *env)
{
    if ((env && strcmp(env, "avx2") == 0) || !cpu_has_avx512_vnni())
        return;
    for (int t = 0; t < CV_TYPE_COUNT; t++) {
        if (interleaved_avx512[t])
            matmul_interleaved[t] = interleaved_avx512[t];
        if (vec_dot_avx512[t])
            traits_best[t].vec_dot = vec_dot_avx512[t];
    }
    kernels_name = "avx512";
}
#endif

void cv_kernels_init(int force_ref)
{
    const char *env = getenv("CONVOY_KERNELS");
    const simd_kernels *simd = NULL;
    kernels_name = "ref";
    silu_mul = cv_silu_mul_ref;
    memset(matmul_tile, 0, sizeof matmul_tile);
    memset(matmul_interleaved, 0, sizeof matmul_interleaved);
    if (!force_ref && !(env && strcmp(env, "ref") == 0)) {
#if defined(__x86_64__)
        if (cpu_has_avx2_fma_f16c()) {
            simd = kernels_avx2;
            kernels_name = "avx2";
            silu_mul = cv_silu_mul_avx2;
        }
#elif defined(__aarch64__)
        simd = kernels_neon;
        kernels_name = "neon";
        silu_mul = cv_silu_mul_neon;
#endif
    }
    if (!simd) {
        traits = traits_ref;
        return;
    }
    for (int t = 0; t < CV_TYPE_COUNT; t++) {
        traits_best[t] = traits_ref[t];
        if (simd[t].vec_dot)
            traits_best[t].vec_dot = simd[t].vec_dot;
        if (simd[t].from_float)
            traits_best[t].from_float = simd[t].from_float;
        matmul_tile[t] = simd[t].matmul_tile;
        matmul_interleaved[t] = simd[t].matmul_interleaved;
        tile_min_tokens[t] = simd[t].tile_min_tokens;
        tile_rows[t] = simd[t].tile_rows ? simd[t].tile_rows : TILE_ROWS;
    }
    traits = traits_best;
#if defined(__x86_64__)
    select_avx512(env);
#endif
}

/* The kernels for this CPU are chosen when the program starts, before any
 * caller can compute: no caller has to remember to (a node's speed probe
 * once timed the reference kernels that way). A test may choose again. */
__attribute__((constructor)) static void kernels_at_start(void) { cv_kernels_init(0); }

void cv_silu_mul(float *g, const float *u, int64_t n)
{
    silu_mul(g, u, n);
}

const char *cv_kernels_name(void)
{
    return kernels_name;
}

bool cv_kernels_avx2(void)
{
    return strcmp(kernels_name, "avx2") == 0 || strcmp(kernels_name, "avx512") == 0;
}

const cv_type_traits *cv_type_get(cv_type t)
{
    if ((unsigned)t >= CV_TYPE_COUNT || !traits[t].name)
        return NULL;
    return &traits[t];
}

const char *cv_type_name(cv_type t)
{
    const cv_type_traits *tt = cv_type_get(t);
    const char *name = "unknown";
    if (tt)
        return tt->name;
    cv_ggml_type_info((uint32_t)t, &name, NULL, NULL);
    return name;
}

static int name_equal_nocase(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char ca = *a >= 'a' && *a <= 'z' ? (char)(*a - 'a' + 'A') : *a;
        char cb = *b >= 'a' && *b <= 'z' ? (char)(*b - 'a' + 'A') : *b;
        if (ca != cb)
            return 0;
    }
    return *a == *b;
}

int cv_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int t = 0; t < CV_TYPE_COUNT; t++)
        if (traits_ref[t].name && name_equal_nocase(name, traits_ref[t].name))
            return t;
    return -1;
}

size_t cv_row_bytes(cv_type t, int64_t n)
{
    const cv_type_traits *tt = cv_type_get(t);
    if (!tt || n < 0 || n % tt->blck_size != 0)
        return 0;
    return (size_t)(n / tt->blck_size) * tt->type_size;
}

/* Outputs of rows [r0, r1) and tokens [t0, t1), one vec_dot each. */
static void matmul_by_vec_dot(cv_vec_dot_fn vec_dot, int n_in, const char *w, size_t row_bytes, const char *x,
                              size_t x_stride, float *y, int ldy, long r0, long r1, int t0, int t1)
{
    for (long r = r0; r < r1; r++)
        for (int t = t0; t < t1; t++)
            y[(size_t)t * (size_t)ldy + (size_t)r] = vec_dot(n_in, w + (size_t)r * row_bytes, x + (size_t)t * x_stride);
}

/* Activation bytes a token block may take: it stays in L2 while the rows
 * of the range meet it, TILE_ROWS at a time. Larger blocks prepare each
 * weight panel for more tokens (64 tokens of 2048-wide rows measured 5-10%
 * faster than 32). */
#define TOKEN_BLOCK_BYTES (384 * 1024)

/* Tokens per block of a product with rows of n_in elements of type wt. */
static int token_block(cv_type wt, int n_in)
{
    const size_t x_bytes = cv_row_bytes(traits[wt].vec_dot_type, n_in);
    const int block = x_bytes ? (int)(TOKEN_BLOCK_BYTES / x_bytes) : TILE_TOKENS;
    return block < 1 ? 1 : block > TILE_TOKENS ? TILE_TOKENS : block;
}

void cv_matmul_rows(cv_type wt, const void *w, int n_in, const void *x, size_t x_stride, int m,
                    float *y, int ldy, long r0, long r1)
{
    const cv_vec_dot_fn vec_dot = traits[wt].vec_dot;
    const matmul_tile_fn tile = matmul_tile[wt];
    const size_t row_bytes = cv_row_bytes(wt, n_in);
    const char *wc = w, *xc = x;
    if (!tile || m < tile_min_tokens[wt] || r1 - r0 < tile_rows[wt]) {
        matmul_by_vec_dot(vec_dot, n_in, wc, row_bytes, xc, x_stride, y, ldy, r0, r1, 0, m);
        return;
    }
    /* Tiles cover rows [r0, r_tiles); vec_dot the rest. */
    const long r_tiles = r1 - (r1 - r0) % tile_rows[wt];
    const int tokens = token_block(wt, n_in);
    for (int t0 = 0; t0 < m; t0 += tokens) {
        const int t1 = m - t0 < tokens ? m : t0 + tokens;
        for (long r = r0; r < r_tiles; r += tile_rows[wt])
            tile(n_in, wc + (size_t)r * row_bytes, row_bytes, xc + (size_t)t0 * x_stride, x_stride, t1 - t0,
                 y + (size_t)t0 * (size_t)ldy + (size_t)r, (size_t)ldy);
        matmul_by_vec_dot(vec_dot, n_in, wc, row_bytes, xc, x_stride, y, ldy, r_tiles, r1, t0, t1);
    }
}

bool cv_interleave_supported(cv_type t, int n_in, long n_rows)
{
    return (unsigned)t < CV_TYPE_COUNT && matmul_interleaved[t] != NULL && n_in <= INTERLEAVE_MAX_IN &&
           n_rows % ROW_GROUP == 0;
}

static bool interleavable(cv_type t, int n_in, long n_rows)
{
    return (unsigned)t < CV_TYPE_COUNT && interleaved[t].interleave && n_in <= INTERLEAVE_MAX_IN &&
           n_rows % ROW_GROUP == 0;
}

int cv_interleave_into(cv_type t, int n_in, long n_rows, const void *src, void *dst)
{
    if (!interleavable(t, n_in, n_rows))
        return -1;
    const size_t group_bytes = ROW_GROUP * cv_row_bytes(t, n_in);
    for (long g = 0; g < n_rows / ROW_GROUP; g++)
        interleaved[t].interleave((const char *)src + (size_t)g * group_bytes, group_bytes / ROW_GROUP, n_in,
                                  (char *)dst + (size_t)g * group_bytes);
    return 0;
}

int cv_interleave(cv_type t, int n_in, long n_rows, void *w)
{
    if (!interleavable(t, n_in, n_rows))
        return -1;
    const size_t group_bytes = ROW_GROUP * cv_row_bytes(t, n_in);
    char *rows = malloc(group_bytes);
    if (!rows)
        return -1;
    for (long g = 0; g < n_rows / ROW_GROUP; g++) { /* one group at a time through a copy */
        char *at = (char *)w + (size_t)g * group_bytes;
        memcpy(rows, at, group_bytes);
        cv_interleave_into(t, n_in, ROW_GROUP, rows, at);
    }
    free(rows);
    return 0;
}

/* Outputs of groups [g0, g1) of an interleaved matrix and m tokens, one
 * reference dot product each. */
static void matmul_interleaved_by_ref(cv_type wt, const char *w, int n_in, const char *x, size_t x_stride, int m,
                                      float *y, int ldy, long g0, long g1)
{
    const size_t group_bytes = ROW_GROUP * cv_row_bytes(wt, n_in);
    for (long g = g0; g < g1; g++)
        for (int r = 0; r < ROW_GROUP; r++)
            for (int t = 0; t < m; t++)
                y[(size_t)t * (size_t)ldy + (size_t)(ROW_GROUP * g + r)] =
                    interleaved[wt].vec_dot_ref(n_in, w + (size_t)g * group_bytes, r, x + (size_t)t * x_stride);
}

void cv_matmul_interleaved(cv_type wt, const void *w, int n_in, const void *x, size_t x_stride, int m, float *y,
                           int ldy, long r0, long r1)
{
    const matmul_interleaved_fn kernel = matmul_interleaved[wt];
    const long g0 = r0 / ROW_GROUP, g1 = r1 / ROW_GROUP;
    if (!kernel) {
        matmul_interleaved_by_ref(wt, w, n_in, x, x_stride, m, y, ldy, g0, g1);
        return;
    }
    const char *group = (const char *)w + (size_t)r0 * cv_row_bytes(wt, n_in);
    const int tokens = token_block(wt, n_in);
    for (int t0 = 0; t0 < m; t0 += tokens) {
        const int t1 = m - t0 < tokens ? m : t0 + tokens;
        kernel(n_in, group, g1 - g0, (const char *)x + (size_t)t0 * x_stride, x_stride, t1 - t0,
               y + (size_t)t0 * (size_t)ldy + (size_t)r0, (size_t)ldy);
    }
}
