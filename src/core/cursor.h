/* cursor.h: a bounds-checked reader over untrusted bytes.
 *
 * Contract: every parser of bytes from outside the process (GGUF files,
 * wire frames, JSON bodies handed over as raw bytes) reads through a
 * cv_cursor. A read past the end never touches memory outside [buf, buf+len):
 * it sets the sticky `failed` flag, records the offset and what was being
 * read, and returns zero / an empty value. Every later read on a failed
 * cursor also returns zero, so a parser may read a whole structure and test
 * `failed` once. Multi-byte integers are little-endian. */
#ifndef CONVOY_CORE_CURSOR_H
#define CONVOY_CORE_CURSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_cursor {
    const uint8_t *buf;
    size_t len;
    size_t off;
    bool failed;
    size_t fail_off;      /* offset at which the first failed read started */
    const char *fail_what; /* what that read was for (static string) */
} cv_cursor;

void cv_cursor_init(cv_cursor *c, const void *buf, size_t len);

uint8_t cv_cursor_u8(cv_cursor *c, const char *what);
uint16_t cv_cursor_u16(cv_cursor *c, const char *what);
uint32_t cv_cursor_u32(cv_cursor *c, const char *what);
uint64_t cv_cursor_u64(cv_cursor *c, const char *what);
float cv_cursor_f32(cv_cursor *c, const char *what);
double cv_cursor_f64(cv_cursor *c, const char *what);

/* Returns a pointer to the next n bytes and advances, or NULL (and fails)
 * if fewer than n remain. */
const uint8_t *cv_cursor_bytes(cv_cursor *c, uint64_t n, const char *what);

/* Advances to the next multiple of `align` (a power of two), failing if that
 * passes the end. */
void cv_cursor_align(cv_cursor *c, uint64_t align, const char *what);

static inline size_t cv_cursor_left(const cv_cursor *c) { return c->failed ? 0 : c->len - c->off; }

#endif
