/* rans_impl.h: the decoding loops behind rans.h (private to src/codec and
 * its tests).
 *
 * Contract: a stream's cell table holds, for each of the CV_RANS_SCALE
 * cells c (rans.h), entry = symbol | (freq - 1) << 8 | (c - start) << 20
 * of the symbol covering it. A rounds function decodes whole rounds (`lanes` bytes,
 * one per lane, lane 0 first) from byte 0 of dst on, exactly as rans.h's
 * loop does, for as long as a whole round of output is left in n and at
 * least 2 * lanes bytes of words are left before `end` (so that a round
 * never runs out of words and may load them in blocks); it leaves the
 * states in x and the next word at *w, and returns the bytes decoded, a
 * multiple of lanes (0 for a lane count it does not handle). The caller
 * decodes the rest with the scalar loop, starting at lane 0. Every version
 * gives the same bytes, states and *w for every input, so a stream is
 * accepted or refused alike whichever one ran. */
#ifndef CONVOY_CODEC_RANS_IMPL_H
#define CONVOY_CODEC_RANS_IMPL_H

#include <stdint.h>

#include "codec/rans.h"

typedef uint64_t (*rans_rounds_fn)(const uint32_t *tab, uint32_t *x, int lanes, const uint8_t **w,
                                   const uint8_t *end, uint8_t *dst, uint64_t n);

/* rans_avx2.c (x86-64 only; needs AVX2 at run time): lanes 8, 16, 24 and
 * 32, the states of eight lanes in one vector. */
uint64_t cv_rans_rounds_avx2(const uint32_t *tab, uint32_t *x, int lanes, const uint8_t **w, const uint8_t *end,
                          uint8_t *dst, uint64_t n);

#endif
