/* gguf.h: reader of GGUF files (versions 2 and 3); the writer is
 * gguf_write.h.
 *
 * Contract: cv_gguf_open maps the file and validates all of it before
 * returning success: magic, version, counts against the bytes that remain,
 * key and string lengths, value types (array element types too), no nested
 * arrays, duplicate keys and tensor names, tensor rank (1..4) and dims
 * (positive, product without overflow, first dim a multiple of the type's
 * block size), known tensor types, general.alignment (a power of two),
 * offsets aligned and the data of every tensor inside the file, tensors not
 * overlapping. The first problem found is reported as one message that
 * begins with the file's name and names the key or tensor involved, e.g.
 * "m.gguf: tensor 'blk.3.attn_q.weight' extends past end of file (offset
 * 123, size 456, file 789)". All parsing goes through a cv_cursor.
 *
 * Strings (keys, values, tensor names) point into the mapping and are not
 * NUL-terminated: use cv_gguf_str_eq / cv_gguf_str_dup. The file owns its arrays;
 * cv_gguf_close releases everything. cv_gguf_parse does the same on a buffer in
 * memory (the fuzz target uses it); then tensor data pointers point into
 * that buffer, which the caller keeps alive. */
#ifndef CONVOY_MODEL_GGUF_H
#define CONVOY_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/fmap.h"
#include "kernels/types.h"

enum gguf_vtype {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
    GGUF_VTYPE_COUNT
};

typedef struct gguf_str {
    const char *ptr;
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;        /* enum gguf_vtype */
    /* scalars (type != ARRAY): the value, widened */
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        bool b;
        gguf_str str;
    } v;
    /* arrays (type == ARRAY) */
    uint32_t arr_type;     /* element type */
    uint64_t arr_n;        /* element count */
    const uint8_t *arr_data; /* raw little-endian elements (non-string types) */
    gguf_str *arr_strs;    /* the arr_n strings (string arrays only) */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    int64_t ne[4];   /* ne[0] is the row length; unused dims are 1 */
    cv_type type;
    uint64_t offset; /* relative to the data section */
    uint64_t size;   /* bytes */
    const void *data;
} gguf_tensor;

typedef struct gguf_file {
    char name[256];          /* file name used in messages */
    cv_fmap map;             /* mapping (unused by cv_gguf_parse) */
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;    /* start of the tensor data section in the file */
} gguf_file;

int cv_gguf_open(gguf_file *f, const char *path, char *err, size_t errlen);
int cv_gguf_parse(gguf_file *f, const void *buf, size_t len, const char *name, char *err, size_t errlen);
void cv_gguf_close(gguf_file *f);

bool cv_gguf_str_eq(gguf_str s, const char *c);
char *cv_gguf_str_dup(gguf_str s); /* cv_malloc'ed, NUL-terminated */

const gguf_kv *cv_gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *cv_gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: 0 on success; -1 with a message naming the key if it is
 * missing or of a type that cannot be converted without loss (any integer
 * type converts to u32/i64 if the value fits). */
int cv_gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t errlen);
int cv_gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t errlen);
int cv_gguf_get_bool(const gguf_file *f, const char *key, bool *out, char *err, size_t errlen);
int cv_gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, char *err, size_t errlen);
/* Element i of a numeric array as double / int64 (caller checks bounds). */
double cv_gguf_arr_f64(const gguf_kv *kv, uint64_t i);
int64_t cv_gguf_arr_i64(const gguf_kv *kv, uint64_t i);
size_t cv_gguf_vtype_size(uint32_t t); /* 0 for STRING/ARRAY/unknown */
const char *cv_gguf_vtype_name(uint32_t t); /* "uint8", ..., "float64"; "unknown" past the last */

#endif
