/* buf.h: a growable byte buffer for building HTTP bodies and texts.
 *
 * Contract: a zeroed sv_buf is empty and valid. Appends grow it (doubling)
 * and keep it NUL-terminated; they return 0, or -1 when memory runs out
 * (the buffer is then unchanged). sv_buf_free releases it and leaves it
 * empty. Not for the scheduler's step loop (it allocates). */
#ifndef CONVOY_SERVE_BUF_H
#define CONVOY_SERVE_BUF_H

#include <stddef.h>

typedef struct sv_buf {
    char *p;
    size_t n, cap;
} sv_buf;

int sv_buf_reserve(sv_buf *b, size_t extra);
int sv_buf_append(sv_buf *b, const char *s, size_t n);
int sv_buf_puts(sv_buf *b, const char *s);
/* Removes the first n bytes. */
void sv_buf_consume(sv_buf *b, size_t n);
void sv_buf_free(sv_buf *b);

#endif
