/* planes.h: the tensor codec: a tensor's bytes split by its type into
 * streams of like bytes, each coded by rans.h (or stored, whichever is
 * smaller), and the exact inverse.
 *
 * This comment is the specification. A coded tensor of GGML type T and n
 * bytes is its streams, one after another in stream order, each a rans.h
 * stream; T and n are known to the reader (the container states them). T's
 * layout cuts each block of `block` bytes into runs, each run going to one
 * stream; stream s is the bytes of stream s's runs of every block, block
 * after block. When n is not a whole number of blocks, or T has no layout
 * below, the tensor is one stream of its bytes. Layouts (GGML's block
 * formats, taken from kernels/types.h):
 *
 *   F32   4 bytes: byte 0, 1, 2, 3 -> streams 0, 1, 2, 3 (byte 3: sign and
 *         exponent, byte 2: exponent's low bit and mantissa's top)
 *   F16, BF16   2 bytes: low byte -> 0, high byte (sign, exponent) -> 1
 *   Q4_0  18: d (fp16) low -> 0, high -> 1; 16 quant bytes -> 2
 *   Q8_0  34: d low -> 0, high -> 1; 32 quant bytes -> 2
 *   Q4_K  144: d, dmin: low bytes -> 0, high bytes -> 1; 12 scale bytes
 *         -> 2; 128 quant bytes -> 3
 *   Q5_K  176: as Q4_K, then 32 qh bytes -> 3, 128 qs bytes -> 4
 *   Q6_K  210: 128 ql bytes -> 0, 64 qh bytes -> 1, 16 scales -> 2, d low
 *         -> 3, d high -> 4
 *
 * The high bytes of the fp16 scales and of the floats carry the exponent,
 * the skewed part; low bytes are near uniform and usually end up stored. */
#ifndef CONVOY_CODEC_PLANES_H
#define CONVOY_CODEC_PLANES_H

#include <stddef.h>
#include <stdint.h>

#include "core/cursor.h"

#define CV_PLANES_MAX_STREAMS 5

/* Bytes of a block of type's layout; 1 for a type without one. */
uint64_t cv_planes_block(uint32_t type);
/* Streams a tensor of type and n bytes is cut into. */
int cv_planes_streams(uint32_t type, uint64_t n);
/* The most bytes cv_planes_encode writes: n and a rans.h stream header per
 * stream, so never above n + CV_PLANES_MAX_STREAMS * cv_rans_bound(0). */
uint64_t cv_planes_bound(uint32_t type, uint64_t n);

/* Codes the n bytes of a tensor of GGML type `type` into dst (cap >=
 * cv_planes_bound); *len gets the size written. */
int cv_planes_encode(uint32_t type, const uint8_t *src, uint64_t n, uint8_t *dst, uint64_t cap, uint64_t *len,
                     char *err, size_t errlen);

/* Decodes a coded tensor of type and exactly n bytes at c's position into
 * dst, advancing c past it; refuses malformed input. */
int cv_planes_decode(uint32_t type, cv_cursor *c, uint8_t *dst, uint64_t n, char *err, size_t errlen);

#endif
