/* pack.c: the segments and the packed file of pack.h. */
#include "codec/pack.h"

#include <inttypes.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t piece_of(uint32_t type)
{
    const uint64_t block = cv_planes_block(type);
    return CV_PACK_SEGMENT_MAX / block * block;
}

/* Segments of a stretch of n bytes cut every piece bytes. */
static uint64_t pieces(uint64_t n, uint64_t piece)
{
    return n / piece + (n % piece != 0);
}

int cv_pack_src_check(const cv_pack_src *s, char *err, size_t errlen)
{
    const cv_pack_tensor *t = s->tensors;
    uint64_t at = 0; /* where the last tensor ended */
    for (size_t i = 0; i < s->n_tensors; at = t[i].offset + t[i].size, i++)
        if (t[i].offset < at || t[i].offset > s->size || t[i].size == 0 || t[i].size > s->size - t[i].offset)
            return cv_errf(err, errlen, "pack: tensor %zu at [%" PRIu64 ", +%" PRIu64 ") is out of order or place",
                           i, t[i].offset, t[i].size);
    return 0;
}

static const uint8_t *buffer_bytes(const void *user, uint64_t off, uint64_t n)
{
    (void)n;
    return (const uint8_t *)user + off;
}

void cv_pack_src_of_buffer(cv_pack_src *s, const uint8_t *file, uint64_t size, const cv_pack_tensor *t, size_t n)
{
    *s = (cv_pack_src){.size = size, .tensors = t, .n_tensors = n, .bytes = buffer_bytes, .user = file};
}

/* The stretch of the file a byte lies in: a tensor, or the gap around it. */
typedef struct region {
    uint64_t start, end, piece;
    uint8_t kind;
    uint32_t type;
} region;

static region region_at(const cv_pack_src *s, uint64_t at)
{
    size_t lo = 0, hi = s->n_tensors; /* the tensors [0, lo) start at or before at */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (s->tensors[mid].offset <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    const cv_pack_tensor *t = lo ? &s->tensors[lo - 1] : NULL;
    if (t && at - t->offset < t->size)
        return (region){t->offset, t->offset + t->size, piece_of(t->type), CV_PACK_TENSOR, t->type};
    return (region){t ? t->offset + t->size : 0, lo < s->n_tensors ? s->tensors[lo].offset : s->size,
                    CV_PACK_SEGMENT_MAX, CV_PACK_RAW, 0};
}

void cv_pack_segment_at(const cv_pack_src *s, uint64_t at, cv_pack_segment *seg)
{
    const region r = region_at(s, at);
    seg->offset = at;
    seg->len = min_u64(r.piece - (at - r.start) % r.piece, r.end - at);
    seg->kind = r.kind;
    seg->type = r.type;
}

uint64_t cv_pack_boundary(const cv_pack_src *s, uint64_t at)
{
    if (at >= s->size)
        return s->size;
    const region r = region_at(s, at);
    return at - (at - r.start) % r.piece;
}

uint64_t cv_pack_count(const cv_pack_src *s)
{
    uint64_t count = 0, at = 0;
    for (size_t i = 0; i < s->n_tensors; i++) {
        const cv_pack_tensor *t = &s->tensors[i];
        count += pieces(t->offset - at, CV_PACK_SEGMENT_MAX) + pieces(t->size, piece_of(t->type));
        at = t->offset + t->size;
    }
    return count + pieces(s->size - at, CV_PACK_SEGMENT_MAX);
}

uint64_t cv_pack_segment_bound(void)
{
    return CV_PACK_SEGMENT_BOUND;
}

/* Refuses a seg that is not the one cv_pack_segment_at gives at its
 * offset, or a dst too small for it. */
static int check_segment(const cv_pack_src *s, const cv_pack_segment *seg, uint64_t cap, char *err, size_t errlen)
{
    cv_pack_segment want = {0};
    if (seg->offset < s->size)
        cv_pack_segment_at(s, seg->offset, &want);
    if (seg->offset >= s->size || cv_pack_boundary(s, seg->offset) != seg->offset || seg->len != want.len ||
        seg->kind != want.kind || seg->type != want.type)
        return cv_errf(err, errlen, "pack: [%" PRIu64 ", +%" PRIu64 ") of kind %u, type %" PRIu32
                       " is not a segment of the file", seg->offset, seg->len, seg->kind, seg->type);
    const uint64_t need = seg->kind == CV_PACK_RAW ? CV_PACK_RAW_HEADER_BYTES + seg->len
                                                   : CV_PACK_TENSOR_HEADER_BYTES + cv_planes_bound(seg->type, seg->len);
    if (cap < need)
        return cv_errf(err, errlen, "pack: %" PRIu64 " bytes of room for a segment that may take %" PRIu64, cap,
                       need);
    return 0;
}

int cv_pack_segment_encode(const cv_pack_src *s, const cv_pack_segment *seg, uint8_t *dst, uint64_t cap,
                           uint64_t *len, char *err, size_t errlen)
{
    if (check_segment(s, seg, cap, err, errlen))
        return -1;
    const uint8_t *p = s->bytes(s->user, seg->offset, seg->len);
    if (!p)
        return cv_errf(err, errlen, "pack: the file's bytes [%" PRIu64 ", +%" PRIu64 ") cannot be had", seg->offset,
                       seg->len);
    dst[0] = seg->kind;
    if (seg->kind == CV_PACK_RAW) {
        put_le(dst + 1, seg->len, 8);
        memcpy(dst + CV_PACK_RAW_HEADER_BYTES, p, seg->len);
        *len = CV_PACK_RAW_HEADER_BYTES + seg->len;
        return 0;
    }
    uint64_t coded;
    put_le(dst + 1, seg->type, 4);
    put_le(dst + 5, seg->len, 8);
    if (cv_planes_encode(seg->type, p, seg->len, dst + CV_PACK_TENSOR_HEADER_BYTES, cap - CV_PACK_TENSOR_HEADER_BYTES,
                         &coded, err, errlen))
        return -1;
    *len = CV_PACK_TENSOR_HEADER_BYTES + coded;
    return 0;
}

int cv_pack_segment_decode(cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, uint8_t *kind, uint32_t *type,
                           char *err, size_t errlen)
{
    const size_t at = c->off;
    const uint8_t k = cv_cursor_u8(c, "kind");
    if (!c->failed && k != CV_PACK_RAW && k != CV_PACK_TENSOR)
        return cv_errf(err, errlen, "pack: unknown segment kind %u at byte %zu", k, at);
    const uint32_t t = k == CV_PACK_TENSOR ? cv_cursor_u32(c, "tensor type") : 0;
    const uint64_t len = cv_cursor_u64(c, "length");
    if (c->failed)
        return cv_errf(err, errlen, "pack: segment at byte %zu cut short in its %s", at, c->fail_what);
    if (len == 0)
        return cv_errf(err, errlen, "pack: empty segment at byte %zu", at);
    if (len > CV_PACK_SEGMENT_MAX)
        return cv_errf(err, errlen, "pack: segment at byte %zu of %" PRIu64 " bytes, over the %u a segment may hold",
                       at, len, CV_PACK_SEGMENT_MAX);
    if (len > cap)
        return cv_errf(err, errlen, "pack: segment at byte %zu of %" PRIu64 " bytes, room for %" PRIu64, at, len,
                       cap);
    if (k == CV_PACK_TENSOR && cv_planes_decode(t, c, dst, len, err, errlen))
        return -1;
    if (k == CV_PACK_RAW) {
        const uint8_t *raw = cv_cursor_bytes(c, len, "raw segment");
        if (!raw)
            return cv_errf(err, errlen, "pack: raw segment at byte %zu of %" PRIu64 " bytes cut short", at, len);
        memcpy(dst, raw, len);
    }
    *n = len;
    if (kind)
        *kind = k;
    if (type)
        *type = t;
    return 0;
}

static int put(FILE *out, const void *p, uint64_t n, uint64_t *count, char *err, size_t errlen)
{
    if (n && fwrite(p, 1, n, out) != n)
        return cv_errf(err, errlen, "pack: write failed after %" PRIu64 " bytes", *count);
    *count += n;
    return 0;
}

int cv_pack_write(const cv_pack_src *s, FILE *out, uint64_t *packed, char *err, size_t errlen)
{
    uint8_t header[CV_PACK_HEADER_BYTES];
    *packed = 0;
    if (cv_pack_src_check(s, err, errlen))
        return -1;
    memcpy(header, CV_PACK_MAGIC, 4);
    put_le(header + 4, CV_PACK_VERSION, 4);
    put_le(header + 8, s->size, 8);
    put_le(header + 16, cv_pack_count(s), 8);
    const uint64_t bound = cv_pack_segment_bound();
    uint8_t *buf = cv_malloc(bound);
    if (!buf)
        return cv_errf(err, errlen, "pack: out of memory for %" PRIu64 " bytes", bound);
    int rc = put(out, header, sizeof header, packed, err, errlen);
    cv_pack_segment seg;
    for (uint64_t at = 0; !rc && at < s->size; at += seg.len) {
        uint64_t len;
        cv_pack_segment_at(s, at, &seg);
        rc = cv_pack_segment_encode(s, &seg, buf, bound, &len, err, errlen) || put(out, buf, len, packed, err, errlen);
    }
    cv_free(buf);
    return rc ? -1 : 0;
}

/* The header: magic, version, then *total bytes in *n segments. */
static int read_head(cv_cursor *c, uint64_t *total, uint64_t *n, char *err, size_t errlen)
{
    const uint8_t *magic = cv_cursor_bytes(c, 4, "magic");
    const uint32_t version = cv_cursor_u32(c, "version");
    *total = cv_cursor_u64(c, "size");
    *n = cv_cursor_u64(c, "segment count");
    if (c->failed || memcmp(magic, CV_PACK_MAGIC, 4))
        return cv_errf(err, errlen, "unpack: not a packed file (no \"%s\" header)", CV_PACK_MAGIC);
    if (version == 1)
        return cv_errf(err, errlen, "unpack: a version 1 packed file (segments without a size limit); this convoy "
                       "reads version %u: pack the GGUF again", CV_PACK_VERSION);
    if (version != CV_PACK_VERSION)
        return cv_errf(err, errlen, "unpack: version %" PRIu32 ", this convoy reads %u", version, CV_PACK_VERSION);
    return 0;
}

/* Decodes the n segments into buf (CV_PACK_SEGMENT_MAX bytes, or total
 * when less), one at a time, writing each. */
static int read_segments(cv_cursor *c, uint64_t total, uint64_t n, uint8_t *buf, FILE *out, uint64_t *size,
                         char *err, size_t errlen)
{
    char why[CV_ERRLEN];
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        if (cv_pack_segment_decode(c, buf, min_u64(total - *size, CV_PACK_SEGMENT_MAX), &len, NULL, NULL, why,
                                   sizeof why))
            return cv_errf(err, errlen, "unpack: segment %" PRIu64 " of %" PRIu64 " (unpacked bytes %" PRIu64 " on): %s",
                           i, n, *size, why);
        if (put(out, buf, len, size, err, errlen))
            return -1;
    }
    return 0;
}

int cv_pack_read(const uint8_t *buf, size_t len, FILE *out, uint64_t *size, uint64_t *n_segments, char *err,
                 size_t errlen)
{
    cv_cursor c;
    uint64_t total, n;
    cv_cursor_init(&c, buf, len);
    *size = *n_segments = 0;
    if (read_head(&c, &total, &n, err, errlen))
        return -1;
    *n_segments = n;
    const uint64_t room = min_u64(total, CV_PACK_SEGMENT_MAX);
    uint8_t *seg = cv_malloc(room ? room : 1);
    if (!seg)
        return cv_errf(err, errlen, "unpack: out of memory for %" PRIu64 " bytes", room);
    const int rc = read_segments(&c, total, n, seg, out, size, err, errlen);
    cv_free(seg);
    if (rc)
        return -1;
    if (*size != total || cv_cursor_left(&c))
        return cv_errf(err, errlen, "unpack: segments give %" PRIu64 " of %" PRIu64 " bytes, %zu bytes left over",
                       *size, total, cv_cursor_left(&c));
    return 0;
}
