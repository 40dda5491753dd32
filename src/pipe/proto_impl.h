/* proto_impl.h: what proto.c and proto_step.c share (private to
 * src/pipe): little-endian stores, the decoders' failure messages and the
 * RESULT parser that cv_msg_validate calls.
 *
 * Contract: stores write the wire's little-endian bytes at p, whatever
 * the host's alignment; a decode ends with finish (a short payload first,
 * then trailing bytes); every message starts with the message type's
 * name, msg. Functions return 0 or -1 with a message in err. */
#ifndef CONVOY_PIPE_PROTO_IMPL_H
#define CONVOY_PIPE_PROTO_IMPL_H

#include <stdint.h>
#include <string.h>

#include "core/cursor.h"
#include "core/err.h"
#include "pipe/proto.h"

/* ---- little-endian stores ---- */

static inline void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void put_i32(uint8_t *p, int32_t v) { put_u32(p, (uint32_t)v); }

static inline void put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(p, u);
}

static inline int32_t cursor_i32(cv_cursor *c, const char *what) { return (int32_t)cv_cursor_u32(c, what); }

/* ---- shared failure messages ---- */

static inline int fail_short(const cv_cursor *c, const char *msg, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "%s: payload ends inside %s (offset %zu, payload is %zu bytes)", msg,
                   c->fail_what ? c->fail_what : "?", c->fail_off, c->len);
}

static inline int fail_trailing(const cv_cursor *c, const char *msg, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "%s: %zu trailing bytes after the message (payload is %zu bytes)", msg,
                   c->len - c->off, c->len);
}

static inline int fail_cap(const char *msg, size_t need, size_t cap, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "%s: buffer of %zu bytes is too small for the %zu-byte payload", msg, cap, need);
}

/* Ends a decode: short payload, then trailing bytes. */
static inline int finish(const cv_cursor *c, const char *msg, char *err, size_t errlen)
{
    if (c->failed)
        return fail_short(c, msg, err, errlen);
    if (c->off != c->len)
        return fail_trailing(c, msg, err, errlen);
    return 0;
}

/* Index of the first NUL or control byte of s[0..n), or -1. */
static inline long bad_text_byte(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7f)
            return (long)i;
    return -1;
}

static inline int check_aligned(const void *payload, const char *msg, char *err, size_t errlen)
{
    if ((uintptr_t)payload % 4 != 0)
        return cv_errf(err, errlen, "%s: payload buffer is not 4-byte aligned (caller bug)", msg);
    return 0;
}

/* Decodes and validates a RESULT; rows NULL validates only (no row limit,
 * m->rows stays NULL). */
int cv_msg_result_parse(const void *payload, size_t len, cv_msg_result *m, cv_result_row *rows, uint32_t max_rows,
                        char *err, size_t errlen);

#endif
