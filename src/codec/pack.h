/* pack.h: the packed file of `convoy pack` / `convoy unpack`: a file (a
 * GGUF) whose tensors are coded by planes.h and whose other bytes (header,
 * metadata, padding) are kept as they are, so that unpacking gives back
 * the same bytes.
 *
 * This comment is the specification. Integers are little-endian.
 *
 *      off size field
 *        0    4 magic      bytes "CVPK"
 *        4    4 version    CV_PACK_VERSION (1)
 *        8    8 size       the unpacked file's bytes
 *       16    8 n_segments
 *       24      the segments, which cover the unpacked file in order:
 *
 *    RAW = 0:    u8 kind, u64 len, len bytes as they are
 *    TENSOR = 1: u8 kind, u32 type (GGML type id), u64 len, then a coded
 *                tensor of that type and len bytes (planes.h)
 *
 *    The segments' lengths sum to size; a segment with len 0, an unknown
 *    kind, a length past size, or bytes after the last segment are
 *    refused. The reader parses through a cv_cursor and writes nothing it
 *    has not decoded and checked. */
#ifndef CONVOY_CODEC_PACK_H
#define CONVOY_CODEC_PACK_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CV_PACK_MAGIC "CVPK"
#define CV_PACK_VERSION 1u
#define CV_PACK_HEAD_BYTES 24
#define CV_PACK_RAW 0
#define CV_PACK_TENSOR 1
static_assert(CV_PACK_HEAD_BYTES == 4 + 4 + 8 + 8, "head: magic, version, size, n_segments");

/* A tensor's place in the file: [offset, offset + size), GGML type. */
typedef struct cv_pack_tensor {
    uint64_t offset, size;
    uint32_t type;
} cv_pack_tensor;

/* Writes the packed form of file[0..size) to out; t holds n tensors sorted
 * by offset, not overlapping, inside the file. *packed gets the bytes
 * written. */
int cv_pack_write(const uint8_t *file, uint64_t size, const cv_pack_tensor *t, size_t n, FILE *out,
                  uint64_t *packed, char *err, size_t errlen);

/* Unpacks buf[0..len) to out; *size gets the unpacked bytes, *n_tensors
 * the tensor segments. */
int cv_pack_read(const uint8_t *buf, size_t len, FILE *out, uint64_t *size, uint64_t *n_tensors, char *err,
                 size_t errlen);

#endif
