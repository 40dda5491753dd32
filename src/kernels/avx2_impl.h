/* avx2_impl.h: what the AVX2 kernels share (private to src/kernels; for
 * files built with -mavx2 -mfma -mf16c): the final reductions, the sums
 * of int32 lanes, the transpose that puts 8 rows in the lanes of a
 * vector, the broadcasts of a token's quants that meet 8 rows in lanes,
 * Q3_K's scales unpacked in one vector, and MXFP4's scales from their
 * exponents.
 *
 * prefetch_t0 is the one software prefetch of the AVX2 kernels, and
 * KEEP_IN_REGISTER their one guard against the compiler's reassociation
 * (and against its folding of a load into two instructions: load_packed).
 *
 * hsum8 is kernels_impl.h's: ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)),
 * that is reduce4 of t[l] = v[l] + v[l+4], reduce4(t) = (t0+t2) + (t1+t3).
 * The _rows8 forms reduce the outputs of a tile's 8 rows at once, with
 * the same additions of the same operands (a + b and b + a are the same
 * float), so each lane holds the bits the scalar form returns: an 8-row
 * tile then finishes a token in about 25 instructions instead of 120. */
#ifndef CONVOY_KERNELS_AVX2_IMPL_H
#define CONVOY_KERNELS_AVX2_IMPL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/types.h"

/* Fetches the cache line of p into L1 (no effect on any result). A
 * volatile asm, because GCC 12 -O2 deleted loops of _mm_prefetch it could
 * prove finite, as code without effects: objdump found no prefetch left
 * in the Q4_K tile or in attention, and the Q4_0 interleaved kernel read
 * 4-6 GB/s instead of 14 at 2-4 tokens. */
static inline void prefetch_t0(const void *p)
{
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}

/* Prefetches the cache lines of bytes [0, bytes) of p. */
static inline void prefetch_lines(const void *p, int bytes)
{
    for (int i = 0; i < bytes; i += 64)
        prefetch_t0((const char *)p + i);
}

/* Keeps v in a register as it stands. Without it GCC reassociates the
 * int16 sums of the 8 tokens of an interleaved kernel into trees whose
 * operands spill (Q4_K, 8 tokens in cache: 150 GFLOP/s, with it 190). */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* CALL(k) with k the constant equal to the count n (of tokens, or of
 * attention rows), 1 <= n <= 4 or 8 (more runs the most): a kernel inlined
 * with its count known keeps its sums in registers. */
#define WITH_CONST_COUNT_4(n, CALL)                                                                                   \
    switch (n) {                                                                                                       \
    case 1: CALL(1); break;                                                                                            \
    case 2: CALL(2); break;                                                                                            \
    case 3: CALL(3); break;                                                                                            \
    default: CALL(4); break;                                                                                           \
    }
#define WITH_CONST_COUNT_8(n, CALL)                                                                                   \
    switch (n) {                                                                                                       \
    case 1: CALL(1); break;                                                                                            \
    case 2: CALL(2); break;                                                                                            \
    case 3: CALL(3); break;                                                                                            \
    case 4: CALL(4); break;                                                                                            \
    case 5: CALL(5); break;                                                                                            \
    case 6: CALL(6); break;                                                                                            \
    case 7: CALL(7); break;                                                                                            \
    default: CALL(8); break;                                                                                           \
    }

static inline float reduce4(__m128 t)
{
    t = _mm_add_ps(t, _mm_movehl_ps(t, t)); /* t0 + t2, t1 + t3 */
    t = _mm_add_ss(t, _mm_movehdup_ps(t));  /* (t0 + t2) + (t1 + t3) */
    return _mm_cvtss_f32(t);
}

static inline float hsum8(__m256 v)
{
    return reduce4(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* The largest of the 8 lanes in a fixed tree (max_ps keeps its second
 * operand where the first is NaN, so the order shows with NaNs). */
static inline float hmax8(__m256 m)
{
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* reduce4 of 8 rows in lanes 0..7, from t_ab holding row a's 4 terms in
 * its low half and row b's in its high half. */
static inline __m256 reduce4_rows8(__m256 t01, __m256 t23, __m256 t45, __m256 t67)
{
    /* t0 + t2, t1 + t3 of rows 0, 2 | 1, 3 (and 4, 6 | 5, 7) */
    const __m256 s0123 = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 s4567 = _mm256_add_ps(_mm256_shuffle_ps(t45, t67, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm256_shuffle_ps(t45, t67, _MM_SHUFFLE(3, 2, 3, 2)));
    /* rows 0, 2, 4, 6 | 1, 3, 5, 7 */
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(s0123, s4567, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(s0123, s4567, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* v[l] + v[l+4] of row a in the low half, of row b in the high half. */
static inline __m256 fold_halves2(__m256 a, __m256 b)
{
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* hsum8 of v[r] in lane r. */
static inline __m256 hsum8_rows8(const __m256 v[8])
{
    return reduce4_rows8(fold_halves2(v[0], v[1]), fold_halves2(v[2], v[3]), fold_halves2(v[4], v[5]),
                         fold_halves2(v[6], v[7]));
}

/* Lane i: the sum of the int32 lanes of v[i]. */
static inline __m256i sums8_i32(const __m256i v[8])
{
    /* g0: the sums of lanes 0..3 of v[0..3] in the low half, of lanes 4..7 in the high; g1 for v[4..7] */
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* out[g] = dword g of v[0..7], in lanes 0..7. */
static inline void transpose8_i32(const __m256i v[8], __m256i out[8])
{
    __m256i a[8], b[8];
    for (int i = 0; i < 4; i++) { /* rows 2i, 2i+1: dwords 0 1 | 4 5 and 2 3 | 6 7 */
        a[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) /* b[4i + k]: dword k | 4 + k of rows 4i..4i+3 */
        for (int h = 0; h < 2; h++) {
            b[4 * i + 2 * h] = _mm256_unpacklo_epi64(a[4 * i + h], a[4 * i + 2 + h]);
            b[4 * i + 2 * h + 1] = _mm256_unpackhi_epi64(a[4 * i + h], a[4 * i + 2 + h]);
        }
    for (int g = 0; g < 4; g++) {
        out[g] = _mm256_permute2x128_si256(b[g], b[4 + g], 0x20);
        out[g + 4] = _mm256_permute2x128_si256(b[g], b[4 + g], 0x31);
    }
}

/* The 32 quants of a Q4_0 block (and the low 4 bits of Q5_0/Q5_1, the
 * indices of IQ4_NL) as unsigned bytes 0..15 in element order: element
 * j < 16 is the low nibble of packed[j], j >= 16 the high nibble of
 * packed[j-16]. */
static inline __m256i unpack_q4_0(const uint8_t *packed)
{
    __m128i bytes = _mm_loadu_si128((const __m128i *)packed);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), _mm256_set1_epi8(15));
}

/* The MXFP4 block scales 2^(e - 128) (mxfp4_scale, quants32.h) of the 8
 * exponents at e, lane k from e[k], made from their bits: (e - 1) << 23
 * from e = 2, the subnormals 2^-128 and 2^-127 below. */
static inline __m256 mxfp4_scales8(const uint8_t e[8])
{
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), v)));
}

/* The 16 bsums of a Q8_K block summed in pairs (int16, as the reference
 * does): 16-bit lane j is the sum of sub-block j's 32 quants. */
static inline __m128i bsum_pairs(const int16_t *bsums)
{
    return _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums), _mm_loadu_si128((const __m128i *)(bsums + 8)));
}

/* Quants 4g..4g+3 at qs, broadcast to every dword by one load: what a
 * group of 4 weights of 8 rows (row r in dword r) meets with one maddubs. */
static inline __m256i quads_bcast(const int8_t *qs, int g)
{
    int32_t y4;
    memcpy(&y4, qs + 4 * g, 4);
    return _mm256_set1_epi32(y4);
}

/* The 32 packed bytes at p, loaded once. Left to itself GCC folds the
 * load into both nibble masks of an interleaved kernel and reads the
 * vector twice, where with few tokens the load ports bound the kernel
 * (in cache, 1 and 2 tokens: Q4_K +7% and +16%, Q4_0 +16% and +12%). */
static inline __m256i load_packed(const void *p)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    KEEP_IN_REGISTER(v);
    return v;
}

/* kq_q3_scales of block b in one vector: the 12 scale bytes a, b, c (4
 * each) are read as the last 16 bytes of the block but 2, so as not to
 * read past it. Scales 0..7 take the low nibbles of a, b, 8..15 the high
 * ones; the top two bits of scales 4k..4k+3 are bits 2k, 2k+1 of c. */
static inline __m128i q3_scales_v(const block_q3_K *b)
{
    enum { AT = offsetof(block_q3_K, scales) - 4 };
    const __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)b + AT));
    const __m128i ab = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i nib = _mm_and_si128(_mm_unpacklo_epi64(ab, _mm_srli_epi16(ab, 4)), _mm_set1_epi8(0x0F));
    const __m128i c = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0xFF), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i top = _mm_and_si128(_mm_slli_epi32(c, 4), _mm_set1_epi8(0x30));
    return _mm_sub_epi8(_mm_or_si128(nib, top), _mm_set1_epi8(32));
}

#endif
