/* cursor.c: the bounds-checked little-endian reader of cursor.h.
 *
 * Every read first asks take() for its bytes; take() compares the request
 * with what is left (never computing an end pointer that could wrap) and on
 * a short buffer marks the cursor failed for good, remembering where and
 * what. Integers are assembled byte by byte, so the host's byte order and
 * the buffer's alignment do not matter. The cursor owns nothing. */
#include "core/cursor.h"

#include <string.h>

void cv_cursor_init(cv_cursor *c, const void *buf, size_t len)
{
    c->buf = buf;
    c->len = buf ? len : 0;
    c->off = 0;
    c->failed = false;
    c->fail_off = 0;
    c->fail_what = NULL;
}

static void fail(cv_cursor *c, const char *what)
{
    if (!c->failed) {
        c->failed = true;
        c->fail_off = c->off;
        c->fail_what = what;
    }
}

/* The next n bytes, or NULL after failing the cursor. */
static const uint8_t *take(cv_cursor *c, uint64_t n, const char *what)
{
    if (c->failed)
        return NULL;
    if (n > (uint64_t)(c->len - c->off)) {
        fail(c, what);
        return NULL;
    }
    static const uint8_t empty[1];
    const uint8_t *p = c->buf ? c->buf + c->off : empty;
    c->off += (size_t)n;
    return p;
}

static uint64_t load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint8_t cv_cursor_u8(cv_cursor *c, const char *what)
{
    const uint8_t *p = take(c, 1, what);
    return p ? p[0] : 0;
}

uint16_t cv_cursor_u16(cv_cursor *c, const char *what)
{
    const uint8_t *p = take(c, 2, what);
    return p ? (uint16_t)load_le(p, 2) : 0;
}

uint32_t cv_cursor_u32(cv_cursor *c, const char *what)
{
    const uint8_t *p = take(c, 4, what);
    return p ? (uint32_t)load_le(p, 4) : 0;
}

uint64_t cv_cursor_u64(cv_cursor *c, const char *what)
{
    const uint8_t *p = take(c, 8, what);
    return p ? load_le(p, 8) : 0;
}

float cv_cursor_f32(cv_cursor *c, const char *what)
{
    uint32_t u = cv_cursor_u32(c, what);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

double cv_cursor_f64(cv_cursor *c, const char *what)
{
    uint64_t u = cv_cursor_u64(c, what);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

const uint8_t *cv_cursor_bytes(cv_cursor *c, uint64_t n, const char *what)
{
    return take(c, n, what);
}

void cv_cursor_align(cv_cursor *c, uint64_t align, const char *what)
{
    if (c->failed)
        return;
    if (align == 0 || (align & (align - 1)) != 0) { /* not a power of two: a caller's bug, fail safely */
        fail(c, what);
        return;
    }
    uint64_t pad = (align - (uint64_t)c->off % align) % align;
    take(c, pad, what);
}
