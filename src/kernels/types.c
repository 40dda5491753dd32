/* types.c: the table of GGML type ids and the scalar half-precision
 * conversions. The table is data from GGML's type list (names, elements
 * per block, bytes per block); ids GGML removed are absent. */
#include "kernels/types.h"

#include <math.h>

static const struct {
    const char *name;
    int blck_size;
    size_t type_size;
} ggml_types[] = {
    [0] = {"F32", 1, 4},       [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},    [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},    [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110}, [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210}, [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18}, [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},      [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},      [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56}, [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66}, [39] = {"MXFP4", 32, 17},
};

int cv_ggml_type_info(uint32_t type, const char **name, int *blck_size, size_t *type_size)
{
    if (type >= sizeof(ggml_types) / sizeof(ggml_types[0]) || !ggml_types[type].name)
        return 0;
    if (name)
        *name = ggml_types[type].name;
    if (blck_size)
        *blck_size = ggml_types[type].blck_size;
    if (type_size)
        *type_size = ggml_types[type].type_size;
    return 1;
}

float cv_fp16_to_fp32(cv_fp16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf or NaN (payload kept, quiet bit set as F16C does) */
        return cv_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0));
    if (exp == 0) {
        if (man == 0)
            return cv_bits_f32(sign);
        /* subnormal: man * 2^-24, exact in f32 */
        float f = (float)man * 0x1p-24f;
        return cv_bits_f32(sign | cv_f32_bits(f));
    }
    return cv_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

cv_fp16 cv_fp32_to_fp16(float f)
{
    uint32_t x = cv_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t exp = (x >> 23) & 0xff;
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff) /* inf, or NaN made quiet with its top payload bits */
        return (cv_fp16)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f)
        return (cv_fp16)(sign | 0x7c00);
    if (e <= 0) {
        /* result is subnormal or zero: shift the full significand right */
        if (e < -10)
            return (cv_fp16)sign;
        uint32_t m = man | 0x800000;
        int shift = 14 - e; /* 24-bit significand down to the 10-bit subnormal field */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (cv_fp16)(sign | q);
    }
    uint32_t q = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++; /* may carry into the exponent, up to inf: correct */
    return (cv_fp16)(sign | q);
}

cv_bf16 cv_fp32_to_bf16(float f)
{
    uint32_t u = cv_f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) /* NaN: keep it NaN, make it quiet */
        return (cv_bf16)((u >> 16) | 64);
    return (cv_bf16)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}
