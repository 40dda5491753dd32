/* buf.c: see buf.h. */
#include "serve/buf.h"

#include <string.h>

#include "core/alloc.h"

int sv_buf_reserve(sv_buf *b, size_t extra)
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

int sv_buf_append(sv_buf *b, const char *s, size_t n)
{
    if (sv_buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int sv_buf_puts(sv_buf *b, const char *s) { return sv_buf_append(b, s, strlen(s)); }

void sv_buf_consume(sv_buf *b, size_t n)
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

void sv_buf_free(sv_buf *b)
{
    cv_free(b->p);
    *b = (sv_buf){0};
}
