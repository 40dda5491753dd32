/* buf.h: a growable byte buffer for building HTTP bodies and texts.
 *
 * Contract: a zeroed cv_buf is empty and valid. Appends grow it (doubling)
 * and keep it NUL-terminated; they return 0, or -1 when memory runs out
 * (the buffer is then unchanged). cv_buf_free releases it and leaves it
 * empty. Not for the scheduler's step loop (it allocates). */
#ifndef CONVOY_SERVE_BUF_H
#define CONVOY_SERVE_BUF_H

#include <stddef.h>

typedef struct cv_buf {
    char *p;
    size_t n, cap;
} cv_buf;

int cv_buf_reserve(cv_buf *b, size_t extra);
int cv_buf_append(cv_buf *b, const char *s, size_t n);
int cv_buf_puts(cv_buf *b, const char *s);
/* Removes the first n bytes. */
void cv_buf_consume(cv_buf *b, size_t n);
void cv_buf_free(cv_buf *b);

#endif
