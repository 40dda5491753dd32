/* fingerprint.c: FNV-1a over a GGUF file's architecture keys and tensor
 * directory (see fingerprint.h). Values are fed in a fixed little-endian
 * encoding, never as in-memory structs, so padding and byte order do not
 * enter the hash. */
#include "model/fingerprint.h"

#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv_bytes(uint64_t h, const void *data, uint64_t n)
{
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    return fnv_bytes(h, le, 8);
}

static uint64_t fnv_str(uint64_t h, gguf_str s)
{
    h = fnv_u64(h, s.len);
    return fnv_bytes(h, s.ptr, s.len);
}

static uint64_t fnv_scalar(uint64_t h, const gguf_kv *kv)
{
    switch (kv->type) {
    case GGUF_STRING:
        return fnv_str(h, kv->v.str);
    case GGUF_BOOL:
        return fnv_u64(h, kv->v.b ? 1 : 0);
    case GGUF_FLOAT32:
    case GGUF_FLOAT64: {
        uint64_t bits;
        memcpy(&bits, &kv->v.f64, 8);
        return fnv_u64(h, bits);
    }
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        return fnv_u64(h, (uint64_t)kv->v.i64);
    default:
        return fnv_u64(h, kv->v.u64);
    }
}

static uint64_t fnv_kv(uint64_t h, const gguf_kv *kv)
{
    h = fnv_str(h, kv->key);
    h = fnv_u64(h, kv->type);
    if (kv->type != GGUF_ARRAY)
        return fnv_scalar(h, kv);
    h = fnv_u64(h, kv->arr_type);
    h = fnv_u64(h, kv->arr_n);
    if (kv->arr_type == GGUF_STRING) {
        for (uint64_t i = 0; i < kv->arr_n; i++)
            h = fnv_str(h, kv->arr_strs[i]);
        return h;
    }
    /* raw elements are little-endian in the file, the same on every host */
    return fnv_bytes(h, kv->arr_data, kv->arr_n * gguf_vtype_size(kv->arr_type));
}

uint64_t cv_model_fingerprint(const gguf_file *f)
{
    uint64_t h = FNV_OFFSET;
    const gguf_kv *arch = gguf_find_kv(f, "general.architecture");
    if (arch && arch->type == GGUF_STRING) {
        h = fnv_str(h, arch->v.str);
        for (uint64_t i = 0; i < f->n_kv; i++) {
            const gguf_kv *kv = &f->kv[i];
            gguf_str prefix = arch->v.str;
            if (kv->key.len > prefix.len && kv->key.ptr[prefix.len] == '.' &&
                !memcmp(kv->key.ptr, prefix.ptr, prefix.len))
                h = fnv_kv(h, kv);
        }
    } else {
        h = fnv_u64(h, 0);
    }
    h = fnv_u64(h, f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        h = fnv_str(h, t->name);
        h = fnv_u64(h, (uint64_t)t->type);
        h = fnv_u64(h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            h = fnv_u64(h, (uint64_t)t->ne[d]);
        h = fnv_u64(h, t->offset);
    }
    return h;
}
