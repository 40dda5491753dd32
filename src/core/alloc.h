/* alloc.h: the engine's allocator, with a debug check that decode never
 * allocates.
 *
 * Contract: all engine code allocates through cv_malloc / cv_calloc /
 * cv_realloc / cv_free (never malloc directly). cv_malloc aborts with a
 * message on out-of-memory only where documented by the caller; it returns
 * NULL like malloc otherwise. Aligned allocations (cv_aligned_alloc) are
 * 64-byte aligned and released with cv_free_aligned.
 *
 * cv_alloc_forbid(1) marks the calling thread as inside a region that must
 * not allocate (a decode step); in debug builds (NDEBUG not defined) any
 * cv_* allocation on that thread then aborts with a message naming the
 * call site; an exception (a failover) lifts it for a while and puts the
 * setting back. cv_alloc_count() returns the number of allocations made by
 * the calling thread so far, so a test can check a step made none in any
 * build. */
#ifndef CONVOY_CORE_ALLOC_H
#define CONVOY_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *cv_malloc_at(size_t n, const char *file, int line);
void *cv_calloc_at(size_t count, size_t size, const char *file, int line);
void *cv_realloc_at(void *p, size_t n, const char *file, int line);
void *cv_aligned_alloc_at(size_t n, const char *file, int line);
void cv_free(void *p);
void cv_free_aligned(void *p);

#define cv_malloc(n) cv_malloc_at((n), __FILE__, __LINE__)
#define cv_calloc(c, s) cv_calloc_at((c), (s), __FILE__, __LINE__)
#define cv_realloc(p, n) cv_realloc_at((p), (n), __FILE__, __LINE__)
#define cv_aligned_alloc(n) cv_aligned_alloc_at((n), __FILE__, __LINE__)

int cv_alloc_forbid(int on); /* returns the previous setting */
uint64_t cv_alloc_count(void);

#endif
