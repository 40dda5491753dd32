/* alloc.c: thin wrappers over the C allocator that count allocations per
 * thread and, in debug builds, abort inside a region marked no-allocation. */
#include "core/alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static _Thread_local int forbid;
static _Thread_local uint64_t count;

static void note(const char *file, int line)
{
    count++;
#ifndef NDEBUG
    if (forbid) {
        fprintf(stderr, "convoy: allocation inside a no-allocation region at %s:%d\n", file, line);
        abort();
    }
#else
    (void)file;
    (void)line;
#endif
}

void *cv_malloc_at(size_t n, const char *file, int line)
{
    note(file, line);
    return malloc(n ? n : 1);
}

void *cv_calloc_at(size_t c, size_t s, const char *file, int line)
{
    note(file, line);
    return calloc(c ? c : 1, s ? s : 1);
}

void *cv_memdup_at(const void *p, size_t n, const char *file, int line)
{
    void *copy = cv_malloc_at(n, file, line);
    if (copy && n)
        memcpy(copy, p, n);
    return copy;
}

void *cv_realloc_at(void *p, size_t n, const char *file, int line)
{
    note(file, line);
    return realloc(p, n ? n : 1);
}

void *cv_aligned_alloc_at(size_t n, const char *file, int line)
{
    note(file, line);
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0)
        return NULL;
    return p;
}

#define HUGE_PAGE ((size_t)2 << 20)

static size_t huge_round(size_t n) { return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

void *cv_huge_alloc_at(size_t n, const char *file, int line)
{
    note(file, line);
    const size_t len = huge_round(n ? n : 1);
    /* map one huge page more, then trim to an aligned range */
    uint8_t *p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    const size_t head = (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
    if (head)
        munmap(p, head);
    munmap(p + head + len, HUGE_PAGE - head);
#ifdef MADV_HUGEPAGE
    /* only the huge pages n fills: a partial last one would be made
     * resident whole (advice only: 4 KiB pages where refused) */
    if (n >= HUGE_PAGE)
        madvise(p + head, n / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
#endif
    return p + head;
}

void cv_huge_free(void *p, size_t n)
{
    if (p)
        munmap(p, huge_round(n ? n : 1));
}

void cv_free(void *p) { free(p); }
void cv_free_aligned(void *p) { free(p); }
int cv_alloc_forbid(int on)
{
    const int was = forbid;
    forbid = on;
    return was;
}
uint64_t cv_alloc_count(void) { return count; }
