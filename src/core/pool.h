/* pool.h: a persistent pool of worker threads for data-parallel kernels.
 *
 * Contract: cv_pool_create(n) starts n-1 workers; the calling thread is the
 * n-th participant. cv_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once
 * for each ith in [0, nth) concurrently (ith 0 on the caller) and returns
 * when all have returned. Work is split by the callee from (ith, nth) alone,
 * so results never depend on timing. Workers spin briefly between jobs and
 * then sleep, so back-to-back small jobs (one per layer op in decode) cost
 * microseconds, and an idle pool costs no CPU. cv_pool_run allocates
 * nothing. Only one thread may call cv_pool_run on a given pool at a time.
 * A pool of 1 thread runs fn inline. */
#ifndef CONVOY_CORE_POOL_H
#define CONVOY_CORE_POOL_H

typedef struct cv_pool cv_pool;
typedef void (*cv_pool_fn)(void *ctx, int ith, int nth);

cv_pool *cv_pool_create(int n_threads);
int cv_pool_size(const cv_pool *p);
void cv_pool_run(cv_pool *p, cv_pool_fn fn, void *ctx);
void cv_pool_free(cv_pool *p);

/* The physical cores this process may run on (SMT siblings counted once,
 * from sysfs topology and the CPU affinity mask); the number of CPUs it
 * may run on when the topology is unknown; at least 1. The default
 * compute thread count: a second thread on a core's sibling only competes
 * for the same memory bandwidth and execution units. */
int cv_physical_cores(void);

/* Splits [0, n) into nth contiguous ranges; thread ith gets [*lo, *hi). */
static inline void cv_split_range(long n, int ith, int nth, long *lo, long *hi)
{
    long per = (n + nth - 1) / nth;
    *lo = per * ith < n ? per * ith : n;
    *hi = *lo + per < n ? *lo + per : n;
}

#endif
