/* rans_avx2.c: rans_impl.h's rounds with AVX2 (x86-64; built with -mavx2
 * -mfma -mf16c, called only when the CPU has AVX2).
 *
 * Eight lanes' states live in one __m256i, lane l in element l; a stream
 * of 16, 24 or 32 lanes keeps two to four such vectors, whose steps
 * overlap. A step of eight states is one series of dependent operations,
 * each needing the last, so a stream of 8 lanes decodes at one step per
 * series' length (about 0.6 GB/s on a Sapphire Rapids core, near the
 * scalar loop; 32 lanes about 1.6 GB/s), and each operation is the
 * shortest measured there:
 * - the cells' table entries (`cells` below: the states mod
 *   CV_RANS_SCALE) by eight scalar loads put together (a vpgatherdd alone
 *   takes 33 cycles), each byte out of its entry;
 * - x = freq * (x >> 12) + c - start, as (freq - 1) * q + (q + bias),
 *   exact modulo 2^32 like the scalar loop's u32 arithmetic, the product
 *   from two vpmuludq (5 cycles each, side by side; vpmulld takes 10);
 * - the lanes below 2^16 (the mask m) each take the next word, lane 0
 *   first: the 8 words at the cursor are loaded into both 128-bit halves,
 *   and one byte shuffle from a table indexed by m puts word
 *   popcount(m & ((1 << l) - 1)) into lane l, zero into the other lanes;
 *   x = x << (m has l ? 16 : 0) | that; the cursor moves 2 * popcount(m).
 * The caller's bound (2 * lanes bytes of words before each round) keeps
 * every 16-byte load inside the words: a round's k-th vector starts at
 * most 16 * k bytes in. */
#include <immintrin.h>

#include "codec/rans_impl.h"

/* The shuffle of a renormalization: for mask m, bytes 4l, 4l+1 of lane l
 * are word BELOW(m, l)'s (lane l < 4 in the low half, 4..7 in the high
 * one, each holding all 8 words), 0x80 (zero) elsewhere. Written out by
 * the preprocessor, so that no code of this file runs before dispatch. */
#define POP8(v) (((v) & 1) + ((v) >> 1 & 1) + ((v) >> 2 & 1) + ((v) >> 3 & 1) + ((v) >> 4 & 1) + ((v) >> 5 & 1) + \
                 ((v) >> 6 & 1) + ((v) >> 7 & 1))
#define BELOW(m, l) POP8((m) & ((1u << (l)) - 1))
#define LANE(m, l) ((m) >> (l) & 1 ? 2 * BELOW(m, l) : 0x80), ((m) >> (l) & 1 ? 2 * BELOW(m, l) + 1 : 0x80), 0x80, 0x80
#define PLACE(m) {LANE(m, 0), LANE(m, 1), LANE(m, 2), LANE(m, 3), LANE(m, 4), LANE(m, 5), LANE(m, 6), LANE(m, 7)}
#define PLACE4(m) PLACE(m), PLACE((m) + 1), PLACE((m) + 2), PLACE((m) + 3)
#define PLACE16(m) PLACE4(m), PLACE4((m) + 4), PLACE4((m) + 8), PLACE4((m) + 12)
#define PLACE64(m) PLACE16(m), PLACE16((m) + 16), PLACE16((m) + 32), PLACE16((m) + 48)
static const uint8_t place[256][32] __attribute__((aligned(32))) = {PLACE64(0u), PLACE64(64u), PLACE64(128u),
                                                                      PLACE64(192u)};

/* tab[cells[l]] for the eight lanes. */
static inline __m256i lookup8(const uint32_t *tab, __m256i cells)
{
    const __m128i lo = _mm256_castsi256_si128(cells), hi = _mm256_extracti128_si256(cells, 1);
    const uint64_t s01 = (uint64_t)_mm_cvtsi128_si64(lo), s23 = (uint64_t)_mm_extract_epi64(lo, 1);
    const uint64_t s45 = (uint64_t)_mm_cvtsi128_si64(hi), s67 = (uint64_t)_mm_extract_epi64(hi, 1);
    __m128i a = _mm_cvtsi32_si128((int)tab[(uint32_t)s01]), b = _mm_cvtsi32_si128((int)tab[(uint32_t)s45]);
    a = _mm_insert_epi32(a, (int)tab[s01 >> 32], 1);
    b = _mm_insert_epi32(b, (int)tab[s45 >> 32], 1);
    a = _mm_insert_epi32(a, (int)tab[(uint32_t)s23], 2);
    b = _mm_insert_epi32(b, (int)tab[(uint32_t)s67], 2);
    a = _mm_insert_epi32(a, (int)tab[s23 >> 32], 3);
    b = _mm_insert_epi32(b, (int)tab[s67 >> 32], 3);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

/* a * b modulo 2^32 in each lane: the products of the even and of the odd
 * lanes, 32 x 32 -> 64 bits each. */
static inline __m256i mul32(__m256i a, __m256i b)
{
    const __m256i even = _mm256_mul_epu32(a, b);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
    return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

/* One step of eight lanes: their bytes into out[0..8), the states after
 * renormalization returned, *w past the words taken. */
static inline __m256i step8(const uint32_t *tab, __m256i x, const uint8_t **w, uint8_t *out)
{
    const __m256i low12 = _mm256_set1_epi32(CV_RANS_SCALE - 1);
    /* byte 0 of each entry into the first 4 bytes of its half, then the
     * halves' first 4 bytes together */
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i e = lookup8(tab, _mm256_and_si256(x, low12));
    const __m256i q = _mm256_srli_epi32(x, CV_RANS_SCALE_BITS);
    const __m256i fm1 = _mm256_and_si256(_mm256_srli_epi32(e, 8), low12);
    x = _mm256_add_epi32(mul32(fm1, q), _mm256_add_epi32(q, _mm256_srli_epi32(e, 20)));
    const __m256i halves = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    _mm_storel_epi64((__m128i *)out,
                     _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e, pick), halves)));
    const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
    const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
    const __m256i words = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)*w));
    const __m256i placed = _mm256_shuffle_epi8(words, _mm256_load_si256((const __m256i *)place[m]));
    *w += 2 * __builtin_popcount(m);
    return _mm256_or_si256(_mm256_sllv_epi32(x, _mm256_and_si256(need, _mm256_set1_epi32(16))), placed);
}

/* The rounds of 8 * k lanes; k is a constant where this is inlined, so
 * that the k vectors stay in registers. */
static inline __attribute__((always_inline)) uint64_t rounds(int k, const uint32_t *tab, uint32_t *x,
                                                             const uint8_t **w, const uint8_t *end, uint8_t *dst,
                                                             uint64_t n)
{
    const int lanes = 8 * k;
    const uint8_t *p = *w;
    __m256i v[4];
    uint64_t i = 0;
    for (int j = 0; j < k; j++)
        v[j] = _mm256_loadu_si256((const __m256i *)(x + 8 * j));
    for (; i + (uint64_t)lanes <= n && end - p >= 2 * lanes; i += (uint64_t)lanes)
        for (int j = 0; j < k; j++)
            v[j] = step8(tab, v[j], &p, dst + i + 8 * j);
    for (int j = 0; j < k; j++)
        _mm256_storeu_si256((__m256i *)(x + 8 * j), v[j]);
    *w = p;
    return i;
}

uint64_t cv_rans_rounds_avx2(const uint32_t *tab, uint32_t *x, int lanes, const uint8_t **w, const uint8_t *end,
                          uint8_t *dst, uint64_t n)
{
    switch (lanes) {
    case 8: return rounds(1, tab, x, w, end, dst, n);
    case 16: return rounds(2, tab, x, w, end, dst, n);
    case 24: return rounds(3, tab, x, w, end, dst, n);
    case 32: return rounds(4, tab, x, w, end, dst, n);
    default: return 0;
    }
}
