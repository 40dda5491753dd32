/* heap.c: see heap.h. Items move with memcpy; a place past the last item
 * serves as the temporary while sifting. */
#include "core/heap.h"

#include <string.h>

#include "core/alloc.h"

bool cv_reserve(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = cv_realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static char *item(const cv_heap *h, size_t i) { return (char *)h->items + i * h->elem; }

bool cv_heap_push(cv_heap *h, const void *x)
{
    if (!cv_reserve(&h->items, &h->cap, h->n + 2, h->elem))
        return false;
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!h->before(x, item(h, parent)))
            break;
        memcpy(item(h, i), item(h, parent), h->elem);
        i = parent;
    }
    memcpy(item(h, i), x, h->elem);
    return true;
}

void cv_heap_pop(cv_heap *h, void *out)
{
    memcpy(out, item(h, 0), h->elem);
    const size_t n = --h->n;
    char *last = item(h, n + 1); /* spare place: the last item while it sinks */
    memcpy(last, item(h, n), h->elem);
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h->before(item(h, c + 1), item(h, c)))
            c++;
        if (!h->before(item(h, c), last))
            break;
        memcpy(item(h, i), item(h, c), h->elem);
        i = c;
    }
    if (n > 0)
        memcpy(item(h, i), last, h->elem);
}

void cv_heap_free(cv_heap *h)
{
    cv_free(h->items);
    h->items = NULL;
    h->n = h->cap = 0;
}
