/* pack.h: the packed file of `convoy pack` / `convoy unpack`: a file (a
 * GGUF) whose tensors are coded by planes.h and whose other bytes (header,
 * metadata, padding) are kept as they are, so that unpacking gives back
 * the same bytes; and its segments, each coded and decoded on its own, so
 * that a file can be shipped one segment per network frame and a transfer
 * resumed at a segment boundary.
 *
 * This comment is the specification. Integers are little-endian.
 *
 * Segments. A file of `size` bytes with its tensors (sorted by offset,
 * disjoint, non-empty) is cut into segments of at most CV_PACK_SEGMENT_MAX
 * bytes at boundaries fixed by that layout alone: each gap (the bytes
 * before the first tensor, between two, after the last; empty ones have no
 * segment) every CV_PACK_SEGMENT_MAX bytes from its start, each tensor
 * every `piece` bytes from its start, piece = the largest multiple of its
 * type's block (cv_planes_block) not above CV_PACK_SEGMENT_MAX, so that
 * every piece but a tensor's last is whole blocks and codes by its type's
 * layout. A segment on the wire:
 *
 *    RAW = 0:    u8 kind, u64 len, len bytes as they are
 *    TENSOR = 1: u8 kind, u32 type (GGML type id), u64 len, then a coded
 *                tensor of that type and len bytes (planes.h)
 *
 *    len is 1..CV_PACK_SEGMENT_MAX; a decoder refuses any other, an
 *    unknown kind, a cut segment or a malformed coded tensor, reading
 *    through a cv_cursor, so no input makes it hold more than one segment.
 *
 * The file (version 2):
 *
 *      off size field
 *        0    4 magic      bytes "CVPK"
 *        4    4 version    CV_PACK_VERSION (2)
 *        8    8 size       the unpacked file's bytes
 *       16    8 n_segments
 *       24      the segments, in file order as the cut above makes them
 *
 *    The reader takes any segments whose lengths sum to size (the cut is
 *    the writer's affair); a segment past size, bytes after the last one,
 *    and version 1 files (whose segments had no size limit) are refused. It
 *    decodes and checks each segment before writing it, holding one segment
 *    at a time. */
#ifndef CONVOY_CODEC_PACK_H
#define CONVOY_CODEC_PACK_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "codec/planes.h"
#include "codec/rans.h"
#include "core/cursor.h"

#define CV_PACK_MAGIC "CVPK"
#define CV_PACK_VERSION 2u
#define CV_PACK_HEADER_BYTES 24
#define CV_PACK_RAW 0
#define CV_PACK_TENSOR 1
#define CV_PACK_RAW_HEADER_BYTES 9    /* kind, len */
#define CV_PACK_TENSOR_HEADER_BYTES 13 /* kind, type, len */
#define CV_PACK_SEGMENT_MAX (1u << 20) /* the most bytes of the file one segment covers */
/* The most bytes one encoded segment takes: a tensor's header and planes.h's
 * bound for CV_PACK_SEGMENT_MAX bytes (a rans.h header per stream), a raw
 * segment's being less. A constant, for frame sizes. */
#define CV_PACK_SEGMENT_BOUND \
    (CV_PACK_TENSOR_HEADER_BYTES + CV_PACK_SEGMENT_MAX + CV_PLANES_MAX_STREAMS * CV_RANS_HEADER_BYTES)
static_assert(CV_PACK_HEADER_BYTES == 4 + 4 + 8 + 8, "header: magic, version, size, n_segments");
static_assert(CV_PACK_RAW_HEADER_BYTES == 1 + 8 && CV_PACK_TENSOR_HEADER_BYTES == 1 + 4 + 8, "segment headers");
static_assert(CV_PACK_RAW_HEADER_BYTES + CV_PACK_SEGMENT_MAX <= CV_PACK_SEGMENT_BOUND, "a raw segment fits the bound");

/* A tensor's place in the file: [offset, offset + size), GGML type. */
typedef struct cv_pack_tensor {
    uint64_t offset, size;
    uint32_t type;
} cv_pack_tensor;

/* A file to code: its size, its tensors (sorted by offset, disjoint,
 * non-empty, inside the file), and where its bytes lie. */
typedef struct cv_pack_src {
    uint64_t size;
    const cv_pack_tensor *tensors;
    size_t n_tensors;
    /* the n bytes at file offset off; [off, off+n) lies inside one tensor
     * or inside one gap. NULL when they cannot be had: the encode fails. */
    const uint8_t *(*bytes)(const void *user, uint64_t off, uint64_t n);
    const void *user;
} cv_pack_src;

typedef struct cv_pack_segment {
    uint64_t offset, len; /* the file bytes [offset, offset + len) it covers */
    uint8_t kind;         /* CV_PACK_RAW or CV_PACK_TENSOR */
    uint32_t type;        /* GGML type (tensor segments) */
} cv_pack_segment;

/* Checks s's tensors (sorted, disjoint, non-empty, inside size). The
 * functions below take a src that passes. */
int cv_pack_src_check(const cv_pack_src *s, char *err, size_t errlen);
/* A src over a contiguous buffer (bytes = file + off); `file` is kept in
 * user. */
void cv_pack_src_of_buffer(cv_pack_src *s, const uint8_t *file, uint64_t size, const cv_pack_tensor *t, size_t n);

/* The segment that starts at boundary `at` (< s->size), by the cut above. */
void cv_pack_segment_at(const cv_pack_src *s, uint64_t at, cv_pack_segment *seg);
/* The largest boundary <= at (at <= size; size itself is the end).
 * O(log n_tensors). */
uint64_t cv_pack_boundary(const cv_pack_src *s, uint64_t at);
/* Segments in the whole file. */
uint64_t cv_pack_count(const cv_pack_src *s);

/* The most bytes one encoded segment takes: CV_PACK_SEGMENT_BOUND. */
uint64_t cv_pack_segment_bound(void);
/* Encodes seg, a segment of s as cv_pack_segment_at gives it (anything else
 * is refused), in its wire form into dst, cap >= cv_pack_segment_bound();
 * *len gets the bytes written. */
int cv_pack_segment_encode(const cv_pack_src *s, const cv_pack_segment *seg, uint8_t *dst, uint64_t cap,
                           uint64_t *len, char *err, size_t errlen);
/* Decodes the encoded segment at c's position into dst (cap bytes),
 * advancing c: *n gets the bytes decoded (1..CV_PACK_SEGMENT_MAX, refused
 * when larger than cap or CV_PACK_SEGMENT_MAX), kind and type may be NULL.
 * Treats the input as hostile: every malformed input refused with a
 * message naming what is wrong; then c and dst hold nothing of use. */
int cv_pack_segment_decode(cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, uint8_t *kind, uint32_t *type,
                           char *err, size_t errlen);

/* Writes the packed file of s to out; *packed gets the bytes written. */
int cv_pack_write(const cv_pack_src *s, FILE *out, uint64_t *packed, char *err, size_t errlen);

/* Unpacks buf[0..len) to out; *size gets the unpacked bytes,
 * *n_segments the segments. */
int cv_pack_read(const uint8_t *buf, size_t len, FILE *out, uint64_t *size, uint64_t *n_segments, char *err,
                 size_t errlen);

#endif
