/* pack.c: the packed file of pack.h. */
#include "codec/pack.h"

#include <inttypes.h>
#include <string.h>

#include "codec/planes.h"
#include "core/alloc.h"
#include "core/cursor.h"
#include "core/err.h"

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int put(FILE *out, const void *p, uint64_t n, uint64_t *packed, char *err, size_t errlen)
{
    if (n && fwrite(p, 1, n, out) != n)
        return cv_errf(err, errlen, "pack: write failed after %" PRIu64 " bytes", *packed);
    *packed += n;
    return 0;
}

static int put_raw(FILE *out, const uint8_t *p, uint64_t n, uint64_t *packed, char *err, size_t errlen)
{
    uint8_t head[9] = {CV_PACK_RAW};
    put_le(head + 1, n, 8);
    return put(out, head, sizeof head, packed, err, errlen) || put(out, p, n, packed, err, errlen) ? -1 : 0;
}

/* One tensor segment; buf holds cv_planes_bound of it. */
static int put_tensor(FILE *out, const uint8_t *file, const cv_pack_tensor *t, uint8_t *buf, uint64_t *packed,
                      char *err, size_t errlen)
{
    uint8_t head[13] = {CV_PACK_TENSOR};
    uint64_t len;
    put_le(head + 1, t->type, 4);
    put_le(head + 5, t->size, 8);
    if (cv_planes_encode(t->type, file + t->offset, t->size, buf, cv_planes_bound(t->type, t->size), &len, err,
                         errlen))
        return -1;
    return put(out, head, sizeof head, packed, err, errlen) || put(out, buf, len, packed, err, errlen) ? -1 : 0;
}

/* The segments: a raw one before each tensor that does not start where the
 * last ended, and one after the last. Counts them when out is NULL. */
static int put_segments(const uint8_t *file, uint64_t size, const cv_pack_tensor *t, size_t n, uint8_t *buf,
                        FILE *out, uint64_t *count, uint64_t *packed, char *err, size_t errlen)
{
    uint64_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const uint64_t end = i < n ? t[i].offset : size;
        if (end > at) {
            ++*count;
            if (out && put_raw(out, file + at, end - at, packed, err, errlen))
                return -1;
        }
        if (i == n)
            break;
        ++*count;
        if (out && put_tensor(out, file, &t[i], buf, packed, err, errlen))
            return -1;
        at = t[i].offset + t[i].size;
    }
    return 0;
}

/* Checks that the tensors are sorted, disjoint, non-empty and inside the
 * file, and finds the largest coded bound. */
static int check_tensors(uint64_t size, const cv_pack_tensor *t, size_t n, uint64_t *bound, char *err,
                         size_t errlen)
{
    *bound = 0;
    for (size_t i = 0, at = 0; i < n; at = t[i].offset + t[i].size, i++) {
        if (t[i].offset < at || t[i].size == 0 || t[i].size > size - t[i].offset)
            return cv_errf(err, errlen, "pack: tensor %zu at [%" PRIu64 ", +%" PRIu64 ") is out of order or place",
                           i, t[i].offset, t[i].size);
        if (cv_planes_bound(t[i].type, t[i].size) > *bound)
            *bound = cv_planes_bound(t[i].type, t[i].size);
    }
    return 0;
}

int cv_pack_write(const uint8_t *file, uint64_t size, const cv_pack_tensor *t, size_t n, FILE *out,
                  uint64_t *packed, char *err, size_t errlen)
{
    uint64_t bound, count = 0;
    uint8_t head[CV_PACK_HEAD_BYTES];
    *packed = 0;
    if (check_tensors(size, t, n, &bound, err, errlen))
        return -1;
    put_segments(file, size, t, n, NULL, NULL, &count, packed, err, errlen);
    memcpy(head, CV_PACK_MAGIC, 4);
    put_le(head + 4, CV_PACK_VERSION, 4);
    put_le(head + 8, size, 8);
    put_le(head + 16, count, 8);
    uint8_t *buf = cv_malloc(bound ? bound : 1);
    if (!buf)
        return cv_errf(err, errlen, "pack: out of memory for %" PRIu64 " bytes", bound);
    uint64_t recount = 0;
    const int rc = put(out, head, sizeof head, packed, err, errlen) ||
                   put_segments(file, size, t, n, buf, out, &recount, packed, err, errlen);
    cv_free(buf);
    return rc ? -1 : 0;
}

/* Decodes one tensor segment's len bytes and writes them. */
static int read_tensor(cv_cursor *c, uint32_t type, uint64_t len, FILE *out, uint64_t *size, char *err,
                       size_t errlen)
{
    uint8_t *buf = cv_malloc(len);
    if (!buf)
        return cv_errf(err, errlen, "unpack: out of memory for a tensor of %" PRIu64 " bytes", len);
    const int rc = cv_planes_decode(type, c, buf, len, err, errlen) || put(out, buf, len, size, err, errlen);
    cv_free(buf);
    return rc ? -1 : 0;
}

static int read_segment(cv_cursor *c, uint64_t left, FILE *out, uint64_t *size, uint64_t *n_tensors, char *err,
                        size_t errlen)
{
    const uint8_t kind = cv_cursor_u8(c, "segment kind");
    const uint32_t type = kind == CV_PACK_TENSOR ? cv_cursor_u32(c, "tensor type") : 0;
    const uint64_t len = cv_cursor_u64(c, "segment length");
    if (c->failed)
        return cv_errf(err, errlen, "unpack: truncated in a %s at byte %zu", c->fail_what, c->fail_off);
    if (kind != CV_PACK_RAW && kind != CV_PACK_TENSOR)
        return cv_errf(err, errlen, "unpack: unknown segment kind %u at byte %zu", kind, c->off - 9);
    if (len == 0 || len > left)
        return cv_errf(err, errlen, "unpack: segment of %" PRIu64 " bytes where %" PRIu64 " remain", len, left);
    *n_tensors += kind == CV_PACK_TENSOR;
    if (kind == CV_PACK_TENSOR)
        return read_tensor(c, type, len, out, size, err, errlen);
    const uint8_t *raw = cv_cursor_bytes(c, len, "raw segment");
    if (!raw)
        return cv_errf(err, errlen, "unpack: raw segment of %" PRIu64 " bytes truncated", len);
    return put(out, raw, len, size, err, errlen);
}

int cv_pack_read(const uint8_t *buf, size_t len, FILE *out, uint64_t *size, uint64_t *n_tensors, char *err,
                 size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, buf, len);
    const uint8_t *magic = cv_cursor_bytes(&c, 4, "magic");
    const uint32_t version = cv_cursor_u32(&c, "version");
    const uint64_t total = cv_cursor_u64(&c, "size"), n = cv_cursor_u64(&c, "segment count");
    *size = *n_tensors = 0;
    if (c.failed || memcmp(magic, CV_PACK_MAGIC, 4))
        return cv_errf(err, errlen, "unpack: not a packed file (no \"%s\" header)", CV_PACK_MAGIC);
    if (version != CV_PACK_VERSION)
        return cv_errf(err, errlen, "unpack: version %" PRIu32 ", this convoy reads %u", version, CV_PACK_VERSION);
    for (uint64_t i = 0; i < n; i++)
        if (read_segment(&c, total - *size, out, size, n_tensors, err, errlen))
            return -1;
    if (*size != total || cv_cursor_left(&c))
        return cv_errf(err, errlen, "unpack: segments give %" PRIu64 " of %" PRIu64 " bytes, %zu bytes left over",
                       *size, total, cv_cursor_left(&c));
    return 0;
}
