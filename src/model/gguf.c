/* gguf.c: the GGUF v2/v3 reader (gguf.h); the writer is gguf_write.c.
 *
 * Parsing: one pass over the bytes through a cv_cursor: header, key/values,
 * tensor infos, then the data section checks. Nothing is allocated from a
 * count the file claims: counts are first compared with the bytes left
 * (each entry needs a known minimum), and the kv / tensor / string arrays
 * grow as entries are actually parsed. Duplicate keys and tensor names are
 * found with an open-addressing hash set of name slices that lives only
 * during the parse. Every failure goes through fail(), which prefixes the
 * file's name and the entry being read ("key 'x'", "tensor 'y'", or its
 * index while the name is not yet known). Strings point into the caller's
 * buffer or the mapping; the gguf_file owns only its kv, tensor and string
 * arrays (and the mapping, for cv_gguf_open).
 *
 * Typed getters convert by value: an integer goes to uint32 if it fits, a
 * float64 or integer goes to float32 if it is exactly representable. */
#include "model/gguf.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/cursor.h"
#include "core/err.h"
#include "model/gguf_format.h"

#define KV_MIN_BYTES 13     /* key length (8) + value type (4) + smallest value (1) */
#define TENSOR_MIN_BYTES 32 /* name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8) */

static const char *const vtype_names[GGUF_VTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *cv_gguf_vtype_name(uint32_t t) { return t < GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown"; }

size_t cv_gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

bool cv_gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

char *cv_gguf_str_dup(gguf_str s)
{
    if (s.len >= SIZE_MAX)
        return NULL;
    char *d = cv_malloc((size_t)s.len + 1);
    if (!d)
        return NULL;
    if (s.len)
        memcpy(d, s.ptr, (size_t)s.len);
    d[s.len] = '\0';
    return d;
}

/* A name from the file made safe to print: at most 64 bytes, anything but
 * printable ASCII shown as '?', "..." when cut. */
static const char *printable(gguf_str s, char buf[72])
{
    size_t n = s.len < 64 ? (size_t)s.len : 64;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    strcpy(buf + n, s.len > 64 ? "..." : "");
    return buf;
}

/* ---- the set of names seen so far (duplicate detection) ---- */

typedef struct name_set {
    gguf_str *places; /* ptr NULL: empty; names are never empty */
    uint64_t cap;    /* power of two */
    uint64_t n;
} name_set;

static uint64_t hash_str(gguf_str s)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (uint64_t i = 0; i < s.len; i++)
        h = (h ^ (uint8_t)s.ptr[i]) * 1099511628211u;
    return h;
}

static bool str_eq(gguf_str a, gguf_str b) { return a.len == b.len && memcmp(a.ptr, b.ptr, (size_t)a.len) == 0; }

static void set_place(gguf_str *places, uint64_t cap, gguf_str s)
{
    uint64_t i = hash_str(s) & (cap - 1);
    while (places[i].ptr)
        i = (i + 1) & (cap - 1);
    places[i] = s;
}

/* Adds s; 1 if it was already there, -1 on out of memory, else 0. */
static int set_add(name_set *set, gguf_str s)
{
    if (set->n + 1 > set->cap / 2) {
        uint64_t cap = set->cap ? set->cap * 2 : 64;
        gguf_str *places = cv_calloc((size_t)cap, sizeof(gguf_str));
        if (!places)
            return -1;
        for (uint64_t i = 0; i < set->cap; i++)
            if (set->places[i].ptr)
                set_place(places, cap, set->places[i]);
        cv_free(set->places);
        set->places = places;
        set->cap = cap;
    }
    for (uint64_t i = hash_str(s) & (set->cap - 1); set->places[i].ptr; i = (i + 1) & (set->cap - 1))
        if (str_eq(set->places[i], s))
            return 1;
    set_place(set->places, set->cap, s);
    set->n++;
    return 0;
}

/* Grows *arr (of elem-byte entries, capacity *cap) to hold `need`, never
 * past `max` entries. */
static int grow(void **arr, uint64_t *cap, uint64_t need, uint64_t max, size_t elem)
{
    if (need <= *cap)
        return 0;
    uint64_t c = *cap ? *cap * 2 : 16;
    if (c > max)
        c = max;
    if (c < need)
        c = need;
    void *p = cv_realloc(*arr, (size_t)c * elem);
    if (!p)
        return -1;
    memset((char *)p + *cap * elem, 0, (size_t)(c - *cap) * elem);
    *arr = p;
    *cap = c;
    return 0;
}

/* ---- reader ---- */

enum section { SEC_HEADER, SEC_KV, SEC_TENSOR, SEC_DATA };

typedef struct parser {
    gguf_file *f;
    cv_cursor c;
    char *err;
    size_t errlen;
    enum section sec;
    uint64_t idx;      /* entry being read in SEC_KV / SEC_TENSOR */
    gguf_str cur_name; /* its key or name once read (len 0 before) */
    name_set names;
} parser;

static int fail(parser *p, const char *fmt, ...) CV_PRINTF(2, 3);

static int fail(parser *p, const char *fmt, ...)
{
    char msg[CV_ERRLEN], shown[72], where[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    where[0] = '\0';
    if ((p->sec == SEC_KV || p->sec == SEC_TENSOR) && p->cur_name.len)
        snprintf(where, sizeof where, "%s '%s' ", p->sec == SEC_KV ? "key" : "tensor", printable(p->cur_name, shown));
    else if (p->sec == SEC_KV)
        snprintf(where, sizeof where, "key/value %" PRIu64 " of %" PRIu64 " ", p->idx, p->f->n_kv);
    else if (p->sec == SEC_TENSOR)
        snprintf(where, sizeof where, "tensor info %" PRIu64 " of %" PRIu64 " ", p->idx, p->f->n_tensors);
    return cv_errf(p->err, p->errlen, "%s: %s%s", p->f->name, where, msg);
}

/* The message for a failed cursor. */
static int truncated(parser *p)
{
    return fail(p, "runs past end of file (%s at offset %zu, file size %zu)", p->c.fail_what, p->c.fail_off,
                p->c.len);
}

static int read_str(parser *p, gguf_str *s, const char *what)
{
    uint64_t n = cv_cursor_u64(&p->c, "string length");
    if (p->c.failed)
        return truncated(p);
    if (n > cv_cursor_left(&p->c))
        return fail(p, "has a %s of length %" PRIu64 " but only %zu bytes are left (at offset %zu, file size %zu)",
                    what, n, cv_cursor_left(&p->c), p->c.off, p->c.len);
    s->ptr = (const char *)cv_cursor_bytes(&p->c, n, what);
    s->len = n;
    return 0;
}

static int parse_array(parser *p, gguf_kv *kv)
{
    kv->arr_type = cv_cursor_u32(&p->c, "array element type");
    kv->arr_n = cv_cursor_u64(&p->c, "array length");
    if (p->c.failed)
        return truncated(p);
    if (kv->arr_type == GGUF_ARRAY)
        return fail(p, "is an array of arrays (nested arrays are not supported)");
    if (kv->arr_type >= GGUF_VTYPE_COUNT)
        return fail(p, "is an array of unknown element type %" PRIu32, kv->arr_type);
    size_t left = cv_cursor_left(&p->c);
    if (kv->arr_type == GGUF_STRING) {
        if (kv->arr_n > left / 8)
            return fail(p, "claims %" PRIu64 " strings but only %zu bytes are left (8 or more per string)",
                        kv->arr_n, left);
        uint64_t cap = 0;
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            if (grow((void **)&kv->arr_strs, &cap, i + 1, kv->arr_n, sizeof(gguf_str)) != 0)
                return fail(p, "out of memory for %" PRIu64 " strings", kv->arr_n);
            if (read_str(p, &kv->arr_strs[i], "string element") != 0)
                return -1;
        }
        return 0;
    }
    size_t es = cv_gguf_vtype_size(kv->arr_type);
    if (kv->arr_n > left / es)
        return fail(p, "claims %" PRIu64 " %s elements (%zu bytes each) but only %zu bytes are left", kv->arr_n,
                    cv_gguf_vtype_name(kv->arr_type), es, left);
    kv->arr_data = cv_cursor_bytes(&p->c, kv->arr_n * es, "array elements");
    if (kv->arr_type == GGUF_BOOL)
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if (kv->arr_data[i] > 1)
                return fail(p, "has bool element %" PRIu64 " of value %u (must be 0 or 1)", i, kv->arr_data[i]);
    return 0;
}

static int parse_kv(parser *p, gguf_kv *kv)
{
    if (read_str(p, &kv->key, "key") != 0)
        return -1;
    if (kv->key.len == 0)
        return fail(p, "has an empty key");
    p->cur_name = kv->key;
    if (memchr(kv->key.ptr, 0, (size_t)kv->key.len))
        return fail(p, "contains a NUL byte");
    int dup = set_add(&p->names, kv->key);
    if (dup < 0)
        return fail(p, "out of memory");
    if (dup)
        return fail(p, "appears more than once");
    kv->type = cv_cursor_u32(&p->c, "value type");
    if (p->c.failed)
        return truncated(p);
    cv_cursor *c = &p->c;
    switch (kv->type) {
    case GGUF_UINT8: kv->v.u64 = cv_cursor_u8(c, "uint8 value"); break;
    case GGUF_INT8: kv->v.i64 = (int8_t)cv_cursor_u8(c, "int8 value"); break;
    case GGUF_UINT16: kv->v.u64 = cv_cursor_u16(c, "uint16 value"); break;
    case GGUF_INT16: kv->v.i64 = (int16_t)cv_cursor_u16(c, "int16 value"); break;
    case GGUF_UINT32: kv->v.u64 = cv_cursor_u32(c, "uint32 value"); break;
    case GGUF_INT32: kv->v.i64 = (int32_t)cv_cursor_u32(c, "int32 value"); break;
    case GGUF_UINT64: kv->v.u64 = cv_cursor_u64(c, "uint64 value"); break;
    case GGUF_INT64: kv->v.i64 = (int64_t)cv_cursor_u64(c, "int64 value"); break;
    case GGUF_FLOAT32: kv->v.f64 = cv_cursor_f32(c, "float32 value"); break;
    case GGUF_FLOAT64: kv->v.f64 = cv_cursor_f64(c, "float64 value"); break;
    case GGUF_BOOL: {
        uint8_t b = cv_cursor_u8(c, "bool value");
        if (!c->failed && b > 1)
            return fail(p, "has bool value %u (must be 0 or 1)", b);
        kv->v.b = b;
        break;
    }
    case GGUF_STRING: return read_str(p, &kv->v.str, "string value");
    case GGUF_ARRAY: return parse_array(p, kv);
    default: return fail(p, "has unknown value type %" PRIu32, kv->type);
    }
    return c->failed ? truncated(p) : 0;
}

static int parse_tensor_info(parser *p, gguf_tensor *t)
{
    gguf_file *f = p->f;
    if (read_str(p, &t->name, "tensor name") != 0)
        return -1;
    if (t->name.len == 0)
        return fail(p, "has an empty name");
    p->cur_name = t->name;
    if (memchr(t->name.ptr, 0, (size_t)t->name.len))
        return fail(p, "has a name containing a NUL byte");
    int dup = set_add(&p->names, t->name);
    if (dup < 0)
        return fail(p, "out of memory");
    if (dup)
        return fail(p, "appears more than once");
    t->n_dims = cv_cursor_u32(&p->c, "tensor n_dims");
    if (p->c.failed)
        return truncated(p);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail(p, "has %" PRIu32 " dimensions (must be 1 to %d)", t->n_dims, GGUF_MAX_DIMS);
    uint64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < t->n_dims; d++)
        ne[d] = cv_cursor_u64(&p->c, "tensor dimension");
    uint32_t type = cv_cursor_u32(&p->c, "tensor type");
    t->offset = cv_cursor_u64(&p->c, "tensor data offset");
    if (p->c.failed)
        return truncated(p);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (ne[d] == 0 || ne[d] > INT64_MAX)
            return fail(p, "has dimension %" PRIu32 " of size %" PRIu64 " (must be 1 to 2^63-1)", d, ne[d]);
        if (!gguf_mul_u64(n_elem, ne[d], &n_elem) || n_elem > INT64_MAX)
            return fail(p, "has too many elements (dims %" PRIu64 " x %" PRIu64 " x %" PRIu64 " x %" PRIu64
                           " overflow 2^63-1)", ne[0], ne[1], ne[2], ne[3]);
    }
    const char *tname;
    int blck;
    size_t tsize;
    if (!cv_ggml_type_info(type, &tname, &blck, &tsize))
        return fail(p, "has unknown type %" PRIu32, type);
    if (ne[0] % (uint64_t)blck != 0)
        return fail(p, "has row length %" PRIu64 ", not a multiple of the %s block size %d", ne[0], tname, blck);
    uint64_t size = ne[0] / (uint64_t)blck;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS && size; d++)
        if (!gguf_mul_u64(size, d == 0 ? tsize : ne[d], &size))
            return fail(p, "has a data size that overflows (%s, dims %" PRIu64 " x %" PRIu64 " x %" PRIu64
                           " x %" PRIu64 ")", tname, ne[0], ne[1], ne[2], ne[3]);
    if (t->offset % f->alignment != 0)
        return fail(p, "has data offset %" PRIu64 ", not a multiple of the alignment %" PRIu64, t->offset,
                    f->alignment);
    t->type = (cv_type)type;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = (int64_t)ne[d];
    t->size = size;
    return 0;
}

static int check_alignment_key(parser *p)
{
    gguf_file *f = p->f;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = cv_gguf_find_kv(f, "general.alignment");
    if (!kv)
        return 0;
    p->cur_name = kv->key;
    if (kv->type != GGUF_UINT32)
        return fail(p, "has type %s (must be uint32)", cv_gguf_vtype_name(kv->type));
    if (!gguf_is_pow2(kv->v.u64))
        return fail(p, "is %" PRIu64 " (must be a power of two)", kv->v.u64);
    f->alignment = kv->v.u64;
    return 0;
}

typedef struct extent {
    uint64_t offset, end, idx;
} extent;

static int cmp_extent(const void *a, const void *b)
{
    const extent *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Data section: start after padding, every tensor inside the file, no two
 * overlapping. */
static int check_data(parser *p)
{
    gguf_file *f = p->f;
    size_t len = p->c.len;
    uint64_t off = p->c.off;
    f->data_offset = off + (f->alignment - off % f->alignment) % f->alignment;
    if (f->n_tensors == 0)
        return 0; /* vocab-only files may end without the padding */
    p->sec = SEC_DATA;
    if (f->data_offset > len)
        return fail(p, "data section would start at offset %" PRIu64 ", past end of file (size %zu)",
                    f->data_offset, len);
    uint64_t avail = len - f->data_offset;
    p->sec = SEC_TENSOR;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        p->idx = i;
        p->cur_name = t->name;
        if (t->offset > avail || t->size > avail - t->offset)
            return fail(p, "extends past end of file (offset %" PRIu64 " in the data section at %" PRIu64
                           ", size %" PRIu64 ", file %zu)", t->offset, f->data_offset, t->size, len);
        t->data = p->c.buf + f->data_offset + t->offset;
    }
    extent *extents = cv_malloc((size_t)f->n_tensors * sizeof(extent));
    if (!extents)
        return fail(p, "out of memory");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        extents[i] = (extent){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].size, i};
    qsort(extents, (size_t)f->n_tensors, sizeof(extent), cmp_extent);
    for (uint64_t i = 1; i < f->n_tensors; i++)
        if (extents[i].offset < extents[i - 1].end) {
            const gguf_tensor *a = &f->tensors[extents[i - 1].idx], *b = &f->tensors[extents[i].idx];
            char shown[72];
            p->idx = extents[i].idx;
            p->cur_name = b->name;
            cv_free(extents);
            return fail(p, "overlaps tensor '%s' (offset %" PRIu64 " is inside [%" PRIu64 ", %" PRIu64 "))",
                        printable(a->name, shown), b->offset, a->offset, a->offset + a->size);
        }
    cv_free(extents);
    return 0;
}

static int parse_all(parser *p)
{
    gguf_file *f = p->f;
    cv_cursor *c = &p->c;
    const uint8_t *magic = cv_cursor_bytes(c, 4, "magic");
    if (!magic)
        return fail(p, "is too short to be a GGUF file (%zu bytes)", c->len);
    if (memcmp(magic, "GGUF", 4) != 0)
        return fail(p, "is not a GGUF file (magic bytes %02x %02x %02x %02x, expected 'GGUF')", magic[0], magic[1],
                    magic[2], magic[3]);
    f->version = cv_cursor_u32(c, "version");
    f->n_tensors = cv_cursor_u64(c, "tensor count");
    f->n_kv = cv_cursor_u64(c, "key/value count");
    if (c->failed)
        return fail(p, "has a truncated header (%s at offset %zu, file size %zu)", c->fail_what, c->fail_off, c->len);
    if (f->version == 1)
        return fail(p, "is GGUF version 1, which is not supported (only versions 2 and 3)");
    if (f->version == 0x02000000 || f->version == 0x03000000)
        return fail(p, "is a big-endian GGUF, which is not supported");
    if (f->version != 2 && f->version != 3)
        return fail(p, "has unsupported GGUF version %" PRIu32 " (supported: 2 and 3)", f->version);
    size_t left = cv_cursor_left(c);
    if (f->n_kv > left / KV_MIN_BYTES || f->n_tensors > (left - f->n_kv * KV_MIN_BYTES) / TENSOR_MIN_BYTES)
        return fail(p, "claims %" PRIu64 " key/values and %" PRIu64 " tensors, more than the %zu bytes after the "
                       "header can hold", f->n_kv, f->n_tensors, left);

    p->sec = SEC_KV;
    uint64_t cap = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        p->idx = i;
        p->cur_name = (gguf_str){NULL, 0};
        if (grow((void **)&f->kv, &cap, i + 1, f->n_kv, sizeof(gguf_kv)) != 0) {
            fail(p, "out of memory");
            f->n_kv = i; /* what cv_gguf_close must release */
            return -1;
        }
        if (parse_kv(p, &f->kv[i]) != 0) {
            f->n_kv = i + 1; /* what cv_gguf_close must release */
            return -1;
        }
    }
    if (check_alignment_key(p) != 0)
        return -1;

    p->sec = SEC_TENSOR;
    p->names.n = 0;
    if (p->names.places)
        memset(p->names.places, 0, (size_t)p->names.cap * sizeof(gguf_str));
    cap = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        p->idx = i;
        p->cur_name = (gguf_str){NULL, 0};
        if (grow((void **)&f->tensors, &cap, i + 1, f->n_tensors, sizeof(gguf_tensor)) != 0)
            return fail(p, "out of memory");
        if (parse_tensor_info(p, &f->tensors[i]) != 0)
            return -1;
    }
    return check_data(p);
}

static void init_file(gguf_file *f, const char *name)
{
    memset(f, 0, sizeof *f);
    f->map.fd = -1;
    snprintf(f->name, sizeof f->name, "%s", name ? name : "(buffer)");
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
}

static int parse_buffer(gguf_file *f, const void *buf, size_t len, char *err, size_t errlen)
{
    parser p = {.f = f, .err = err, .errlen = errlen, .sec = SEC_HEADER};
    cv_cursor_init(&p.c, buf, len);
    int rc = parse_all(&p);
    cv_free(p.names.places);
    if (rc != 0)
        cv_gguf_close(f);
    return rc;
}

int cv_gguf_parse(gguf_file *f, const void *buf, size_t len, const char *name, char *err, size_t errlen)
{
    init_file(f, name);
    return parse_buffer(f, buf, len, err, errlen);
}

int cv_gguf_open(gguf_file *f, const char *path, char *err, size_t errlen)
{
    init_file(f, path);
    if (cv_fmap_open(&f->map, path, err, errlen) != 0)
        return -1;
    return parse_buffer(f, f->map.data, f->map.size, err, errlen);
}

void cv_gguf_close(gguf_file *f)
{
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++)
            cv_free(f->kv[i].arr_strs);
    cv_free(f->kv);
    cv_free(f->tensors);
    cv_fmap_close(&f->map);
    f->kv = NULL;
    f->tensors = NULL;
    f->n_kv = 0;
    f->n_tensors = 0;
}

const gguf_kv *cv_gguf_find_kv(const gguf_file *f, const char *key)
{
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (cv_gguf_str_eq(f->kv[i].key, key))
            return &f->kv[i];
    return NULL;
}

const gguf_tensor *cv_gguf_find_tensor(const gguf_file *f, const char *name)
{
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (cv_gguf_str_eq(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

static const gguf_kv *find_typed(const gguf_file *f, const char *key, char *err, size_t errlen)
{
    const gguf_kv *kv = cv_gguf_find_kv(f, key);
    if (!kv)
        cv_errf(err, errlen, "%s: key '%s' not found", f->name, key);
    return kv;
}

static bool is_unsigned(uint32_t t)
{
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static bool is_signed(uint32_t t) { return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64; }

static int wrong_type(const gguf_file *f, const char *key, const gguf_kv *kv, const char *expected, char *err,
                      size_t errlen)
{
    return cv_errf(err, errlen, "%s: key '%s' has type %s, expected %s", f->name, key, cv_gguf_vtype_name(kv->type),
                   expected);
}

int cv_gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, char *err, size_t errlen)
{
    const gguf_kv *kv = find_typed(f, key, err, errlen);
    if (!kv)
        return -1;
    if (is_unsigned(kv->type) && kv->v.u64 <= UINT32_MAX) {
        *out = (uint32_t)kv->v.u64;
        return 0;
    }
    if (is_signed(kv->type) && kv->v.i64 >= 0 && kv->v.i64 <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)kv->v.i64;
        return 0;
    }
    if (is_unsigned(kv->type))
        return cv_errf(err, errlen, "%s: key '%s' is %" PRIu64 ", too large for uint32", f->name, key, kv->v.u64);
    if (is_signed(kv->type))
        return cv_errf(err, errlen, "%s: key '%s' is %" PRId64 ", outside the uint32 range", f->name, key, kv->v.i64);
    return wrong_type(f, key, kv, "an integer", err, errlen);
}

int cv_gguf_get_f32(const gguf_file *f, const char *key, float *out, char *err, size_t errlen)
{
    const gguf_kv *kv = find_typed(f, key, err, errlen);
    if (!kv)
        return -1;
    double d;
    if (kv->type == GGUF_FLOAT32 || kv->type == GGUF_FLOAT64)
        d = kv->v.f64;
    else if (is_unsigned(kv->type))
        d = (double)kv->v.u64;
    else if (is_signed(kv->type))
        d = (double)kv->v.i64;
    else
        return wrong_type(f, key, kv, "a number", err, errlen);
    bool exact = isnan(d) || (fabs(d) <= 3.4028234663852886e38 && (double)(float)d == d);
    if (exact && is_unsigned(kv->type))
        exact = d < 18446744073709551616.0 && (uint64_t)d == kv->v.u64;
    if (exact && is_signed(kv->type))
        exact = d < 9223372036854775808.0 && (int64_t)d == kv->v.i64;
    if (!exact && !isinf(d))
        return cv_errf(err, errlen, "%s: key '%s' (%s %.17g) is not exactly representable as float32", f->name, key,
                       cv_gguf_vtype_name(kv->type), d);
    *out = (float)d;
    return 0;
}

int cv_gguf_get_bool(const gguf_file *f, const char *key, bool *out, char *err, size_t errlen)
{
    const gguf_kv *kv = find_typed(f, key, err, errlen);
    if (!kv)
        return -1;
    if (kv->type != GGUF_BOOL)
        return wrong_type(f, key, kv, "bool", err, errlen);
    *out = kv->v.b;
    return 0;
}

int cv_gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, char *err, size_t errlen)
{
    const gguf_kv *kv = find_typed(f, key, err, errlen);
    if (!kv)
        return -1;
    if (kv->type != GGUF_STRING)
        return wrong_type(f, key, kv, "string", err, errlen);
    *out = kv->v.str;
    return 0;
}

static uint64_t load_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

double cv_gguf_arr_f64(const gguf_kv *kv, uint64_t i)
{
    size_t es = cv_gguf_vtype_size(kv->arr_type);
    if (kv->type != GGUF_ARRAY || es == 0)
        return 0.0;
    uint64_t u = load_le(kv->arr_data + i * es, es);
    switch (kv->arr_type) {
    case GGUF_UINT8: case GGUF_UINT16: case GGUF_UINT32: case GGUF_UINT64: case GGUF_BOOL: return (double)u;
    case GGUF_INT8: return (int8_t)u;
    case GGUF_INT16: return (int16_t)u;
    case GGUF_INT32: return (int32_t)u;
    case GGUF_INT64: return (double)(int64_t)u;
    case GGUF_FLOAT32: return cv_bits_f32((uint32_t)u);
    case GGUF_FLOAT64: {
        double d;
        memcpy(&d, &u, sizeof d);
        return d;
    }
    default: return 0.0;
    }
}

int64_t cv_gguf_arr_i64(const gguf_kv *kv, uint64_t i)
{
    size_t es = cv_gguf_vtype_size(kv->arr_type);
    if (kv->type != GGUF_ARRAY || es == 0)
        return 0;
    uint64_t u = load_le(kv->arr_data + i * es, es);
    switch (kv->arr_type) {
    case GGUF_UINT8: case GGUF_UINT16: case GGUF_UINT32: case GGUF_BOOL: return (int64_t)u;
    case GGUF_UINT64: return u > INT64_MAX ? INT64_MAX : (int64_t)u;
    case GGUF_INT8: return (int8_t)u;
    case GGUF_INT16: return (int16_t)u;
    case GGUF_INT32: return (int32_t)u;
    case GGUF_INT64: return (int64_t)u;
    case GGUF_FLOAT32: case GGUF_FLOAT64: {
        double d = cv_gguf_arr_f64(kv, i); /* truncated toward zero, saturated, NaN as 0 */
        if (isnan(d))
            return 0;
        if (d >= 9223372036854775808.0)
            return INT64_MAX;
        if (d < -9223372036854775808.0)
            return INT64_MIN;
        return (int64_t)d;
    }
    default: return 0;
    }
}
