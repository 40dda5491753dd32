/* alloc.h: the engine's allocator, with a debug check that decode never
 * allocates.
 *
 * Contract: all engine code allocates through cv_malloc / cv_calloc /
 * cv_realloc / cv_free (never malloc directly). cv_malloc aborts with a
 * message on out-of-memory only where documented by the caller; it returns
 * NULL like malloc otherwise. Aligned allocations (cv_aligned_alloc) are
 * 64-byte aligned and released with cv_free_aligned. cv_huge_alloc gives
 * zeroed private memory, 2 MiB-aligned, whose whole 2 MiB pages the kernel
 * is asked to back with huge pages (fewer TLB misses when streaming
 * weights: one core read a 600 MB model at 14.9 GB/s so against 11.4
 * through a file mapping's 4 KiB pages); cv_huge_free takes the same size
 * back.
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
void *cv_memdup_at(const void *p, size_t n, const char *file, int line); /* a malloc'd copy of n bytes */
void *cv_aligned_alloc_at(size_t n, const char *file, int line);
void cv_free(void *p);
void cv_free_aligned(void *p);
void *cv_huge_alloc_at(size_t n, const char *file, int line);
void cv_huge_free(void *p, size_t n);

#define cv_malloc(n) cv_malloc_at((n), __FILE__, __LINE__)
#define cv_calloc(c, s) cv_calloc_at((c), (s), __FILE__, __LINE__)
#define cv_realloc(p, n) cv_realloc_at((p), (n), __FILE__, __LINE__)
#define cv_memdup(p, n) cv_memdup_at((p), (n), __FILE__, __LINE__)
#define cv_aligned_alloc(n) cv_aligned_alloc_at((n), __FILE__, __LINE__)
#define cv_huge_alloc(n) cv_huge_alloc_at((n), __FILE__, __LINE__)

int cv_alloc_forbid(int on); /* returns the previous setting */
uint64_t cv_alloc_count(void);

#endif
