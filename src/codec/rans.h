/* rans.h: convoy's own lossless byte coder: rANS with a static model (one
 * frequency table per stream, in the stream) and interleaved lanes, so that
 * a decoder keeps several independent states in flight.
 *
 * This comment is the specification of a coded stream. Integers are
 * little-endian.
 *
 *      off size field
 *        0    1 method   CV_RANS_STORED (0) or CV_RANS_CODED (1)
 *        1    8 n        the decoded length in bytes
 *
 *    STORED: n bytes, the data as they are. An encoder stores whenever
 *    coding would not be smaller (so a stream never exceeds 9 + n bytes).
 *
 *    CODED, after the 9 bytes above:
 *        9    1 lanes    1..CV_RANS_MAX_LANES; byte i is coded by lane i % lanes
 *       10   32 present  bit (s & 7) of byte s >> 3 set for every symbol s
 *                        (byte value) that has a frequency; at least one
 *       42  2*k freq     u16 frequency of each of the k present symbols, in
 *                        increasing symbol order: each 1..CV_RANS_SCALE, sum
 *                        CV_RANS_SCALE; symbol s covers the cells
 *                        [start_s, start_s + freq_s), start_s = the sum of
 *                        the frequencies of the symbols below s
 *        .    8 n_words  count of the 16-bit words at the end
 *        . 4*lanes state the lanes' initial decoder states, each in
 *                        [CV_RANS_L, 2^32)
 *        . 2*n_words     the words
 *
 *    Decoding: for i = 0 .. n-1, with x the state of lane i % lanes:
 *    c = x mod CV_RANS_SCALE (a cell); byte i is the symbol s whose cells
 *    hold c; x = freq_s * (x >> CV_RANS_SCALE_BITS) + c - start_s; then if
 *    x < CV_RANS_L, x = (x << 16) | the next word. After byte n-1 every
 *    state equals CV_RANS_L and every word has been read. A stream that
 *    breaks any rule here is refused; the decoder reads it through a
 *    cv_cursor and never touches a byte outside it or outside its output.
 *
 * The encoder runs the same steps backwards (bytes n-1 down to 0, states
 * starting at CV_RANS_L), so one 32-bit state with 16-bit renormalization
 * reads at most one word per byte. */
#ifndef CONVOY_CODEC_RANS_H
#define CONVOY_CODEC_RANS_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cursor.h"

#define CV_RANS_STORED 0
#define CV_RANS_CODED 1
#define CV_RANS_SCALE_BITS 12
#define CV_RANS_SCALE (1u << CV_RANS_SCALE_BITS)
#define CV_RANS_L (1u << 16)
#define CV_RANS_MAX_LANES 32
#define CV_RANS_LANES 32 /* what convoy's own streams use: 32 states in flight decode twice as fast as 8 */

#define CV_RANS_HEADER_BYTES 9 /* method, n */
#define CV_RANS_BITMAP_BYTES 32
static_assert(CV_RANS_HEADER_BYTES == 1 + sizeof(uint64_t), "stream header: method u8, n u64");
static_assert(CV_RANS_BITMAP_BYTES * 8 == 256, "one presence bit per byte value");
static_assert(CV_RANS_SCALE_BITS <= 16, "one 16-bit word renormalizes a state");
static_assert(CV_RANS_MAX_LANES <= 255, "lanes fit their u8");

/* The most bytes cv_rans_encode writes for n input bytes. */
static inline uint64_t cv_rans_bound(uint64_t n) { return CV_RANS_HEADER_BYTES + n; }

/* Codes src[0..n) as one stream into dst (cap >= cv_rans_bound(n)) with
 * `lanes` lanes (1..CV_RANS_MAX_LANES); *len gets the stream's size. */
int cv_rans_encode(const uint8_t *src, uint64_t n, int lanes, uint8_t *dst, uint64_t cap, uint64_t *len,
                   char *err, size_t errlen);

/* Decodes the stream at c's position into dst, which holds cap bytes (a
 * longer stream is refused), sets *n to its length and advances c past it.
 * Fails, with a message naming what is wrong, on any malformed stream.
 * Uses SIMD where the CPU has it (AVX2: streams of 8, 16, 24 or 32 lanes)
 * unless CONVOY_KERNELS=ref (kernels.h's choice). */
int cv_rans_decode(cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, char *err, size_t errlen);

/* cv_rans_decode in portable scalar C only: the same bytes, the same
 * refusals and messages for every input. */
int cv_rans_decode_ref(cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, char *err, size_t errlen);

#endif
