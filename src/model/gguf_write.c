/* gguf_write.c: the GGUF v3 writer (gguf_write.h).
 *
 * The writer keeps owned copies of keys, values and tensor names (tensor
 * data only referenced). Invalid input to a setter is remembered and
 * reported by cv_gguf_write, which refuses to write a file the reader would
 * reject: it checks what gguf.c checks, with the limits of gguf_format.h.
 * Values are written in the host's byte order, which must be little-endian
 * (as on every platform convoy builds for). */
#include "model/gguf_write.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/heap.h"
#include "model/gguf_format.h"

typedef struct wstr {
    char *ptr;
    uint64_t len;
} wstr;

typedef struct wkv {
    wstr key;
    uint32_t type;
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        bool b;
    } v;
    wstr str;
    uint32_t arr_type;
    uint64_t arr_n;
    uint8_t *arr_data;
    wstr *arr_strs;
} wkv;

typedef struct wtensor {
    wstr name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    const void *data; /* NULL for a made tensor */
    uint64_t size;
    gguf_make_fn make;
    void *make_ctx;
} wtensor;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    bool failed;
    char err[CV_ERRLEN]; /* the first problem, reported by cv_gguf_write */
};

static int wfail(gguf_writer *w, const char *fmt, ...) CV_PRINTF(2, 3);

static int wfail(gguf_writer *w, const char *fmt, ...)
{
    if (w->failed)
        return -1;
    w->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    return -1;
}

static bool wstr_set(gguf_writer *w, wstr *d, const char *ptr, uint64_t len)
{
    d->ptr = cv_malloc((size_t)len + 1);
    d->len = len;
    if (!d->ptr) {
        d->len = 0;
        wfail(w, "out of memory");
        return false;
    }
    if (len)
        memcpy(d->ptr, ptr, (size_t)len);
    d->ptr[len] = '\0';
    return true;
}

/* Frees the value of kv, keeping its key. */
static void wkv_clear_value(wkv *kv)
{
    cv_free(kv->str.ptr);
    cv_free(kv->arr_data);
    if (kv->arr_strs)
        for (uint64_t i = 0; i < kv->arr_n; i++)
            cv_free(kv->arr_strs[i].ptr);
    cv_free(kv->arr_strs);
    wstr key = kv->key;
    memset(kv, 0, sizeof *kv);
    kv->key = key;
}

gguf_writer *cv_gguf_writer_create(void) { return cv_calloc(1, sizeof(gguf_writer)); }

void cv_gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        wkv_clear_value(&w->kv[i]);
        cv_free(w->kv[i].key.ptr);
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        cv_free(w->tensors[i].name.ptr);
    cv_free(w->kv);
    cv_free(w->tensors);
    cv_free(w);
}

/* The entry for key with its value cleared: the existing one (so a key set
 * twice keeps its place and the last value), or a new one at the end. NULL
 * after recording a problem. */
static wkv *wkv_slot(gguf_writer *w, const char *key, uint64_t key_len, uint32_t type)
{
    if (key_len == 0) {
        wfail(w, "empty key");
        return NULL;
    }
    if (memchr(key, 0, (size_t)key_len)) {
        wfail(w, "key containing a NUL byte");
        return NULL;
    }
    wkv *kv = NULL;
    for (size_t i = 0; i < w->n_kv && !kv; i++)
        if (w->kv[i].key.len == key_len && memcmp(w->kv[i].key.ptr, key, (size_t)key_len) == 0)
            kv = &w->kv[i];
    if (kv) {
        wkv_clear_value(kv);
    } else {
        if (!cv_reserve((void **)&w->kv, &w->cap_kv, w->n_kv + 1, sizeof(wkv))) {
            wfail(w, "out of memory");
            return NULL;
        }
        kv = &w->kv[w->n_kv];
        memset(kv, 0, sizeof *kv); /* no value yet: wkv_clear_value and cv_gguf_writer_free rely on it */
        if (!wstr_set(w, &kv->key, key, key_len))
            return NULL;
        w->n_kv++;
    }
    kv->type = type;
    return kv;
}

void cv_gguf_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    wkv *kv = wkv_slot(w, key, strlen(key), GGUF_UINT32);
    if (kv)
        kv->v.u64 = v;
}

void cv_gguf_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    wkv *kv = wkv_slot(w, key, strlen(key), GGUF_INT32);
    if (kv)
        kv->v.i64 = v;
}

void cv_gguf_set_f32(gguf_writer *w, const char *key, float v)
{
    wkv *kv = wkv_slot(w, key, strlen(key), GGUF_FLOAT32);
    if (kv)
        kv->v.f64 = v;
}

void cv_gguf_set_bool(gguf_writer *w, const char *key, bool v)
{
    wkv *kv = wkv_slot(w, key, strlen(key), GGUF_BOOL);
    if (kv)
        kv->v.b = v;
}

void cv_gguf_set_str(gguf_writer *w, const char *key, const char *v)
{
    wkv *kv = wkv_slot(w, key, strlen(key), GGUF_STRING);
    if (kv)
        wstr_set(w, &kv->str, v, strlen(v));
}

static void set_arr_raw(gguf_writer *w, const char *key, uint64_t key_len, uint32_t t, const void *data, uint64_t n)
{
    size_t es = cv_gguf_vtype_size(t);
    if (es == 0) {
        wfail(w, "key '%.*s': arrays of %s need their own setter", (int)(key_len < 64 ? key_len : 64), key,
              cv_gguf_vtype_name(t));
        return;
    }
    if (n > SIZE_MAX / es) {
        wfail(w, "key '%.*s': array of %" PRIu64 " elements is too large", (int)(key_len < 64 ? key_len : 64), key, n);
        return;
    }
    wkv *kv = wkv_slot(w, key, key_len, GGUF_ARRAY);
    if (!kv)
        return;
    kv->arr_type = t;
    kv->arr_data = cv_malloc((size_t)(n * es));
    if (!kv->arr_data) {
        wfail(w, "out of memory");
        return;
    }
    kv->arr_n = n;
    if (n)
        memcpy(kv->arr_data, data, (size_t)(n * es));
}

void cv_gguf_set_arr(gguf_writer *w, const char *key, uint32_t t, const void *data, uint64_t n)
{
    set_arr_raw(w, key, strlen(key), t, data, n);
}

/* String array from n (pointer, length) pairs given by one of two forms. */
static void set_arr_strs(gguf_writer *w, const char *key, uint64_t key_len, const char *const *cstrs,
                         const gguf_str *strs, uint64_t n)
{
    if (n > SIZE_MAX / sizeof(wstr)) {
        wfail(w, "key '%.*s': array of %" PRIu64 " strings is too large", (int)(key_len < 64 ? key_len : 64), key, n);
        return;
    }
    wkv *kv = wkv_slot(w, key, key_len, GGUF_ARRAY);
    if (!kv)
        return;
    kv->arr_type = GGUF_STRING;
    kv->arr_strs = cv_calloc((size_t)n, sizeof(wstr));
    if (!kv->arr_strs) {
        wfail(w, "out of memory");
        return;
    }
    kv->arr_n = n;
    for (uint64_t i = 0; i < n; i++) {
        const char *ptr = cstrs ? cstrs[i] : strs[i].ptr;
        uint64_t len = cstrs ? strlen(cstrs[i]) : strs[i].len;
        if (!wstr_set(w, &kv->arr_strs[i], ptr, len))
            return;
    }
}

void cv_gguf_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    set_arr_strs(w, key, strlen(key), strs, NULL, n);
}

void cv_gguf_copy_kv(gguf_writer *w, const gguf_kv *src)
{
    if (src->type == GGUF_ARRAY) {
        if (src->arr_type == GGUF_STRING)
            set_arr_strs(w, src->key.ptr, src->key.len, NULL, src->arr_strs, src->arr_n);
        else
            set_arr_raw(w, src->key.ptr, src->key.len, src->arr_type, src->arr_data, src->arr_n);
        return;
    }
    if (src->type >= GGUF_VTYPE_COUNT) {
        wfail(w, "key '%.*s': unknown value type %" PRIu32, (int)(src->key.len < 64 ? src->key.len : 64),
              src->key.ptr, src->type);
        return;
    }
    wkv *kv = wkv_slot(w, src->key.ptr, src->key.len, src->type);
    if (!kv)
        return;
    if (src->type == GGUF_STRING)
        wstr_set(w, &kv->str, src->v.str.ptr, src->v.str.len);
    else if (src->type == GGUF_BOOL)
        kv->v.b = src->v.b;
    else
        kv->v.u64 = src->v.u64; /* the widened value, whichever union member */
}

static int add_tensor(gguf_writer *w, const char *name, cv_type type, uint32_t n_dims, const int64_t *ne,
                      const void *data, uint64_t size, gguf_make_fn make, void *make_ctx)
{
    if (w->failed)
        return -1;
    size_t name_len = strlen(name);
    if (name_len == 0)
        return wfail(w, "tensor with an empty name");
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].name.len == name_len && memcmp(w->tensors[i].name.ptr, name, name_len) == 0)
            return wfail(w, "tensor '%s' added twice", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return wfail(w, "tensor '%s' has %" PRIu32 " dimensions (must be 1 to %d)", name, n_dims, GGUF_MAX_DIMS);
    const char *tname;
    int blck;
    size_t tsize;
    if (!cv_ggml_type_info((uint32_t)type, &tname, &blck, &tsize))
        return wfail(w, "tensor '%s' has unknown type %d", name, (int)type);
    uint64_t expect = tsize, n_elem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return wfail(w, "tensor '%s' has dimension %" PRIu32 " of size %" PRId64, name, d, ne[d]);
        uint64_t rows_or_blocks = d == 0 ? (uint64_t)ne[0] / (uint64_t)blck : (uint64_t)ne[d];
        if (!gguf_mul_u64(n_elem, (uint64_t)ne[d], &n_elem) || n_elem > INT64_MAX ||
            !gguf_mul_u64(expect, rows_or_blocks, &expect))
            return wfail(w, "tensor '%s' is too large", name);
    }
    if (ne[0] % blck != 0)
        return wfail(w, "tensor '%s' has row length %" PRId64 ", not a multiple of the %s block size %d", name, ne[0],
                     tname, blck);
    if (size != expect)
        return wfail(w, "tensor '%s' has %" PRIu64 " bytes of data, but its shape and type %s need %" PRIu64, name,
                     size, tname, expect);
    if (!data && !make)
        return wfail(w, "tensor '%s' has no data", name);
    if (!cv_reserve((void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof(wtensor)))
        return wfail(w, "out of memory");
    wtensor *t = &w->tensors[w->n_tensors];
    if (!wstr_set(w, &t->name, name, name_len))
        return -1;
    t->type = (uint32_t)type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? (uint64_t)ne[d] : 1;
    t->data = data;
    t->size = size;
    t->make = make;
    t->make_ctx = make_ctx;
    w->n_tensors++;
    return 0;
}

void cv_gguf_add_tensor(gguf_writer *w, const char *name, cv_type type, uint32_t n_dims, const int64_t *ne,
                     const void *data, uint64_t size)
{
    add_tensor(w, name, type, n_dims, ne, data, size, NULL, NULL);
}

void cv_gguf_add_made_tensor(gguf_writer *w, const char *name, cv_type type, uint32_t n_dims, const int64_t *ne,
                          uint64_t size, gguf_make_fn make, void *ctx)
{
    add_tensor(w, name, type, n_dims, ne, NULL, size, make, ctx);
}

/* Output to a file (remembering the first write error), to a buffer, or,
 * with neither, only counted. */
typedef struct out {
    FILE *fp;
    uint8_t *buf;
    uint64_t pos;
    bool failed;
} out;

static void put(out *o, const void *p, size_t n)
{
    if (n && o->fp && !o->failed && fwrite(p, 1, n, o->fp) != n)
        o->failed = true;
    if (n && o->buf)
        memcpy(o->buf + o->pos, p, n);
    o->pos += n;
}

static void put_le(out *o, uint64_t v, size_t n)
{
    uint8_t b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put(o, b, n);
}

static void put_str(out *o, const wstr *s)
{
    put_le(o, s->len, 8);
    put(o, s->ptr, (size_t)s->len);
}

static void put_pad(out *o, uint64_t alignment)
{
    static const uint8_t zeros[4096];
    uint64_t pad = (alignment - o->pos % alignment) % alignment;
    while (pad) {
        size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        put(o, zeros, n);
        pad -= n;
    }
}

static void put_scalar(out *o, const wkv *kv)
{
    switch (kv->type) {
    case GGUF_FLOAT32: put_le(o, cv_f32_bits((float)kv->v.f64), 4); break;
    case GGUF_FLOAT64: {
        uint64_t u;
        memcpy(&u, &kv->v.f64, 8);
        put_le(o, u, 8);
        break;
    }
    case GGUF_BOOL: put_le(o, kv->v.b ? 1 : 0, 1); break;
    case GGUF_STRING: put_str(o, &kv->str); break;
    default: put_le(o, kv->v.u64, cv_gguf_vtype_size(kv->type)); break; /* integers: two's complement bits */
    }
}

/* general.alignment, or the default; -1 when it is not a power-of-two u32. */
static int alignment_of(const gguf_writer *w, uint64_t *alignment)
{
    *alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key.ptr, "general.alignment") == 0) {
            const wkv *kv = &w->kv[i];
            if (kv->type != GGUF_UINT32 || !gguf_is_pow2(kv->v.u64))
                return -1;
            *alignment = kv->v.u64;
        }
    return 0;
}

/* Everything before the first tensor's data: the header, the key/values,
 * the tensor directory (data offsets into offsets[], when given) and the
 * padding after it. */
static void put_header(out *o, const gguf_writer *w, uint64_t alignment, uint64_t *offsets)
{
    put(o, "GGUF", 4);
    put_le(o, 3, 4);
    put_le(o, w->n_tensors, 8);
    put_le(o, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        put_str(o, &kv->key);
        put_le(o, kv->type, 4);
        if (kv->type != GGUF_ARRAY) {
            put_scalar(o, kv);
            continue;
        }
        put_le(o, kv->arr_type, 4);
        put_le(o, kv->arr_n, 8);
        if (kv->arr_type == GGUF_STRING)
            for (uint64_t j = 0; j < kv->arr_n; j++)
                put_str(o, &kv->arr_strs[j]);
        else
            put(o, kv->arr_data, (size_t)(kv->arr_n * cv_gguf_vtype_size(kv->arr_type)));
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        put_str(o, &t->name);
        put_le(o, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_le(o, t->ne[d], 8);
        put_le(o, t->type, 4);
        put_le(o, offset, 8);
        if (offsets)
            offsets[i] = offset;
        offset += t->size + (alignment - t->size % alignment) % alignment;
    }
    put_pad(o, alignment);
}

/* The tensors' data after the header: each made one made in `made` (as
 * large as the largest) just before it is written. */
static int put_tensors(out *o, const gguf_writer *w, uint64_t alignment, uint8_t *made, const char *path,
                       char *err, size_t errlen)
{
    for (size_t i = 0; i < w->n_tensors && !o->failed; i++) {
        const wtensor *t = &w->tensors[i];
        char why[CV_ERRLEN];
        if (t->make && t->make(t->make_ctx, i, made, why, sizeof why))
            return cv_errf(err, errlen, "%s: not written: %s", path, why);
        put(o, t->make ? made : t->data, (size_t)t->size);
        put_pad(o, alignment);
    }
    return 0;
}

int cv_gguf_write(gguf_writer *w, const char *path, char *err, size_t errlen)
{
    uint64_t alignment, made_size = 0;
    if (w->failed)
        return cv_errf(err, errlen, "%s: not written: %s", path, w->err);
    if (alignment_of(w, &alignment))
        return cv_errf(err, errlen, "%s: not written: general.alignment must be a power-of-two uint32", path);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].make && w->tensors[i].size > made_size)
            made_size = w->tensors[i].size;
    uint8_t *made = made_size ? cv_malloc(made_size) : NULL;
    if (made_size && !made)
        return cv_errf(err, errlen, "%s: not written: out of memory for a tensor of %" PRIu64 " bytes", path,
                       made_size);
    out o = {.fp = fopen(path, "wb")};
    int rc = o.fp ? 0 : cv_errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    if (rc == 0) {
        put_header(&o, w, alignment, NULL);
        rc = put_tensors(&o, w, alignment, made, path, err, errlen);
        const int e = o.failed ? errno : 0;
        if ((fclose(o.fp) != 0 || o.failed) && rc == 0)
            rc = cv_errf(err, errlen, "%s: write failed: %s", path, strerror(e ? e : errno));
        if (rc)
            unlink(path);
    }
    cv_free(made);
    return rc;
}

int cv_gguf_write_layout(gguf_writer *w, gguf_layout *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    uint64_t alignment;
    if (w->failed)
        return cv_errf(err, errlen, "not laid out: %s", w->err);
    if (alignment_of(w, &alignment))
        return cv_errf(err, errlen, "not laid out: general.alignment must be a power-of-two uint32");
    out count = {0};
    put_header(&count, w, alignment, NULL);
    out o = {.buf = cv_malloc(count.pos)};
    l->offsets = cv_malloc(sizeof(uint64_t) * (w->n_tensors ? w->n_tensors : 1));
    if (!o.buf || !l->offsets) {
        cv_free(o.buf);
        cv_free(l->offsets);
        return cv_errf(err, errlen, "out of memory for a header of %" PRIu64 " bytes", count.pos);
    }
    put_header(&o, w, alignment, l->offsets);
    l->header = o.buf;
    l->header_len = o.pos;
    l->alignment = alignment;
    l->size = o.pos;
    for (size_t i = 0; i < w->n_tensors; i++) {
        l->offsets[i] += o.pos;
        l->size = l->offsets[i] + w->tensors[i].size + (alignment - w->tensors[i].size % alignment) % alignment;
    }
    return 0;
}

void cv_gguf_layout_free(gguf_layout *l)
{
    cv_free(l->header);
    cv_free(l->offsets);
    memset(l, 0, sizeof *l);
}
