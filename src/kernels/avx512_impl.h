/* avx512_impl.h: what the AVX-512 kernels share (private to src/kernels;
 * for files built with -mavx512f -mavx512bw -mavx512vl -mavx512vnni on
 * top of the AVX2 flags): the vectors of two groups of 8 interleaved rows
 * (group g in the low 256 bits, g + 1 in the high) and the broadcast of a
 * token's quants that meets them. */
#ifndef CONVOY_KERNELS_AVX512_IMPL_H
#define CONVOY_KERNELS_AVX512_IMPL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/avx2_impl.h"
#include "kernels/kernels_impl.h"

/* v[0, nt) zeroed in registers (with nt a constant). The empty asm is
 * KEEP_IN_REGISTER (avx2_impl.h) for any of the 32 vector registers:
 * without it GCC zeroes the sums of the tokens with rep stos and keeps
 * them in memory (Q4_K at 8 tokens: 165 GFLOP/s, with it 350). */
static inline __attribute__((always_inline)) void zero_sums(__m512i *v, int nt)
{
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        v[t] = _mm512_setzero_si512();
        __asm__("" : "+v"(v[t]));
    }
}

/* A pair kernel reads groups g and g + 1 (nb blocks of `bytes` each, one
 * after the other in memory) side by side, a block of each per step, then
 * the pair after them. Where the pair is short this fetches its bytes in
 * address order, INTERLEAVED_PREFETCH_BYTES ahead, into the next pairs.
 * Long groups keep a stream each, which the hardware prefetcher follows,
 * fetched VEC_DOT_PREFETCH_BYTES ahead (Q4_0 2048 x 8192 from DRAM: 29
 * GB/s; in address order 24). */
static inline void prefetch_pair_ahead(const void *w0, size_t bytes, int nb, int i)
{
    const char *at = (const char *)w0 + (size_t)i * bytes; /* block i of group g */
    const size_t group = (size_t)nb * bytes;
    if (group <= INTERLEAVED_PREFETCH_BYTES) {
        prefetch_lines(at + (size_t)i * bytes + INTERLEAVED_PREFETCH_BYTES, 2 * (int)bytes);
        return;
    }
    prefetch_lines(at + VEC_DOT_PREFETCH_BYTES, (int)bytes);
    prefetch_lines(at + group + VEC_DOT_PREFETCH_BYTES, (int)bytes);
}

/* The low 256 bits from a, the high from b. */
static inline __m512i join256(__m256i a, __m256i b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

static inline __m512i load_pair(const void *a, const void *b)
{
    return join256(_mm256_loadu_si256((const __m256i *)a), _mm256_loadu_si256((const __m256i *)b));
}

/* The 8 fp16 scales at a, then the 8 at b, as floats. */
static inline __m512 scales_pair(const void *a, const void *b)
{
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)b), _mm_loadu_si128((const __m128i *)a)));
}

/* Quants 4g..4g+3 at qs in every dword. */
static inline __m512i quads_bcast16(const int8_t *qs, int g)
{
    int32_t y4;
    memcpy(&y4, qs + 4 * g, 4);
    return _mm512_set1_epi32(y4);
}

/* quads_bcast16 of the quants at qs for token t of a kernel meeting
 * several: even tokens take a broadcast load, odd ones a 16-byte load per
 * 4 groups and an in-lane shuffle each. The vector loads bound these
 * kernels (2 a cycle on Zen 5), and the shuffles run beside vpdpbusd. */
static inline __attribute__((always_inline)) __m512i token_quads16(const int8_t *qs, int g, int t)
{
    if (!(t & 1))
        return quads_bcast16(qs, g);
    const __m512i y16 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qs + 16 * (g >> 2))));
    switch (g & 3) {
    case 0: return _mm512_shuffle_epi32(y16, 0x00);
    case 1: return _mm512_shuffle_epi32(y16, 0x55);
    case 2: return _mm512_shuffle_epi32(y16, 0xAA);
    default: return _mm512_shuffle_epi32(y16, 0xFF);
    }
}

#endif
