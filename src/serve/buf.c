/* buf.c: see buf.h. */
#include "serve/buf.h"

#include <string.h>

#include "core/alloc.h"

int cv_buf_reserve(cv_buf *b, size_t extra)
{
    if (extra > ((size_t)-1) / 2 - b->n)
        return -1;
    const size_t need = b->n + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = cv_realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int cv_buf_append(cv_buf *b, const char *s, size_t n)
{
    if (cv_buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int cv_buf_puts(cv_buf *b, const char *s) { return cv_buf_append(b, s, strlen(s)); }

void cv_buf_consume(cv_buf *b, size_t n)
{
    if (n >= b->n) {
        b->n = 0;
    } else {
        memmove(b->p, b->p + n, b->n - n);
        b->n -= n;
    }
    if (b->p)
        b->p[b->n] = 0;
}

void cv_buf_free(cv_buf *b)
{
    cv_free(b->p);
    *b = (cv_buf){0};
}
