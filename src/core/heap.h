/* heap.h: growable arrays and a binary heap of fixed-size items.
 *
 * Contract: cv_reserve grows the array *p of *cap items of elem bytes
 * (cv_realloc, doubling from 16) until it holds need items; it returns
 * false and leaves *p and *cap as they were when memory runs out.
 * A cv_heap keeps items so that cv_heap_pop returns the one that comes
 * `before` all others; `before` must be a strict order that never ties
 * two different items (break ties on a position), so the order of pops
 * does not depend on the order of pushes. cv_heap_push returns false when
 * memory runs out (the heap is unchanged). cv_heap_free releases the
 * items; a zeroed heap with elem and before set is empty and valid. */
#ifndef CONVOY_CORE_HEAP_H
#define CONVOY_CORE_HEAP_H

#include <stdbool.h>
#include <stddef.h>

bool cv_reserve(void **p, size_t *cap, size_t need, size_t elem);

typedef struct cv_heap {
    void *items;
    size_t n, cap, elem;
    bool (*before)(const void *a, const void *b);
} cv_heap;

bool cv_heap_push(cv_heap *h, const void *item);
/* Removes the first item into *out; h->n must be > 0. */
void cv_heap_pop(cv_heap *h, void *out);
void cv_heap_free(cv_heap *h);

#endif
