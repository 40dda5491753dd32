/* gguf_write.h: the GGUF writer (version 3); the reader is gguf.h.
 *
 * Contract: a gguf_writer collects key/values (copied) and tensors (data
 * referenced, not copied: it stays owned by the caller until cv_gguf_write)
 * and writes a version-3 file with general.alignment (default 32 bytes).
 * Setting a key twice keeps its first place and the last value. A setter
 * given invalid input records the first problem and cv_gguf_write reports it
 * ("PATH: not written: ...") without creating the file: it never writes a
 * file the reader would reject. cv_gguf_write returns 0, or -1 with the
 * message in err; a file that fails half-way is removed. */
#ifndef CONVOY_MODEL_GGUF_WRITE_H
#define CONVOY_MODEL_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/types.h"
#include "model/gguf.h"

typedef struct gguf_writer gguf_writer;
gguf_writer *cv_gguf_writer_create(void);
void cv_gguf_writer_free(gguf_writer *w);
void cv_gguf_set_u32(gguf_writer *w, const char *key, uint32_t v);
void cv_gguf_set_i32(gguf_writer *w, const char *key, int32_t v);
void cv_gguf_set_f32(gguf_writer *w, const char *key, float v);
void cv_gguf_set_bool(gguf_writer *w, const char *key, bool v);
void cv_gguf_set_str(gguf_writer *w, const char *key, const char *v);
/* Array of n elements of numeric type t, copied. */
void cv_gguf_set_arr(gguf_writer *w, const char *key, uint32_t t, const void *data, uint64_t n);
void cv_gguf_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copies key/value kv from a reader (used by quantize). */
void cv_gguf_copy_kv(gguf_writer *w, const gguf_kv *kv);
/* Tensor whose data (size = rows * row bytes) stays owned by the caller until cv_gguf_write. */
void cv_gguf_add_tensor(gguf_writer *w, const char *name, cv_type type, uint32_t n_dims, const int64_t *ne,
                     const void *data, uint64_t size);
/* A tensor whose size bytes are made when cv_gguf_write comes to it: make
 * writes them into dst (the writer's buffer, as large as the largest made
 * tensor; index: the tensor's place, in the order added), so that a file
 * is written holding one tensor at a time. make returns 0, or -1 with a
 * message in err; cv_gguf_write then fails and removes the file. */
typedef int (*gguf_make_fn)(void *ctx, uint64_t index, void *dst, char *err, size_t errlen);
void cv_gguf_add_made_tensor(gguf_writer *w, const char *name, cv_type type, uint32_t n_dims, const int64_t *ne,
                          uint64_t size, gguf_make_fn make, void *ctx);
int cv_gguf_write(gguf_writer *w, const char *path, char *err, size_t errlen);

/* The file cv_gguf_write would write, without writing it: its header (every
 * byte before the first tensor's data, padding included), each tensor's
 * data offset in the file (in the order added; zero padding fills the
 * gaps) and the file's size. */
typedef struct gguf_layout {
    uint8_t *header;
    uint64_t header_len;
    uint64_t *offsets;
    uint64_t alignment;
    uint64_t size;
} gguf_layout;
int cv_gguf_write_layout(gguf_writer *w, gguf_layout *l, char *err, size_t errlen);
void cv_gguf_layout_free(gguf_layout *l);

#endif
