/* pool.c: persistent worker threads driven by a generation counter (pool.h).
 *
 * A job is published by storing fn/ctx, setting `pending` to the number of
 * workers and incrementing `gen`. Each worker remembers the last generation
 * it ran; it spins (pause hints, a yield every 64 steps) for up to SPIN_NS
 * waiting for `gen` to move, then sleeps on `wake_cv`. The caller runs ith 0 itself, then
 * waits for `pending` to reach zero the same way: spin, then sleep on
 * `done_cv`. Sleeping is announced through a counter / flag that the other
 * side reads after its own store (both seq_cst), so the mutex and condvar
 * are touched only when someone actually sleeps: back-to-back jobs cost two
 * atomic operations per participant, and an idle pool sleeps.
 *
 * The pool owns its threads; cv_pool_free stops and joins them. The hot
 * counters sit on separate cache lines. cv_pool_run allocates nothing. */
#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/alloc.h"
#include "core/clock.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_NS 200000 /* how long a waiter spins before it sleeps: 0.2 ms */

struct cv_pool;

typedef struct worker {
    struct cv_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct cv_pool {
    _Alignas(64) atomic_uint gen; /* incremented once per job */
    _Alignas(64) atomic_int pending; /* workers that have not finished the current job */
    _Alignas(64) cv_pool_fn fn;
    void *ctx;
    int n_threads;
    worker *workers;
    atomic_bool stop;
    atomic_int n_sleeping;  /* workers asleep (or about to sleep) on wake_cv */
    atomic_bool caller_sleeping; /* the caller asleep (or about to) on done_cv */
    pthread_mutex_t mu;
    pthread_cond_t wake_cv;
    pthread_cond_t done_cv;
};

/* One step of a bounded spin: a pause hint, and every 64 steps a yield (so
 * a descheduled participant can run when threads outnumber cores) and a
 * look at the clock. False once SPIN_NS have passed: time to sleep. */
typedef struct spin_state {
    unsigned steps;
    uint64_t t0;
} spin_state;

static bool spin_again(spin_state *s)
{
    cpu_relax();
    if ((++s->steps & 63) == 0) {
        sched_yield();
        uint64_t t = cv_now_ns();
        if (s->t0 == 0)
            s->t0 = t;
        else if (t - s->t0 > SPIN_NS)
            return false;
    }
    return true;
}

/* Spins until `gen` differs from `seen`; false if it is time to sleep (or stop). */
static bool spin_for_gen(cv_pool *p, unsigned seen)
{
    spin_state s = {0, 0};
    while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen)
        if (atomic_load_explicit(&p->stop, memory_order_relaxed) || !spin_again(&s))
            return false;
    return true;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    cv_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        if (!spin_for_gen(p, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake_cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        p->fn(p->ctx, w->ith, p->n_threads);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void wake_workers(cv_pool *p)
{
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void wait_done(cv_pool *p)
{
    spin_state s = {0, 0};
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        if (!spin_again(&s))
            break;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_sleeping, true);
    while (atomic_load(&p->pending) != 0)
        pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->caller_sleeping, false);
    pthread_mutex_unlock(&p->mu);
}

static void stop_workers(cv_pool *p, int n_started)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
}

cv_pool *cv_pool_create(int n_threads)
{
    if (n_threads < 1)
        return NULL;
    cv_pool *p = cv_aligned_alloc(sizeof(cv_pool));
    if (!p)
        return NULL;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    p->fn = NULL;
    p->ctx = NULL;
    p->n_threads = n_threads;
    atomic_init(&p->stop, false);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->caller_sleeping, false);
    p->workers = cv_calloc((size_t)n_threads, sizeof(worker));
    if (!p->workers) {
        cv_free_aligned(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (int i = 1; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            stop_workers(p, i - 1);
            pthread_cond_destroy(&p->done_cv);
            pthread_cond_destroy(&p->wake_cv);
            pthread_mutex_destroy(&p->mu);
            cv_free(p->workers);
            cv_free_aligned(p);
            return NULL;
        }
    }
    return p;
}

int cv_pool_size(const cv_pool *p) { return p->n_threads; }

void cv_pool_run(cv_pool *p, cv_pool_fn fn, void *ctx)
{
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add(&p->gen, 1);
    wake_workers(p);
    fn(ctx, 0, p->n_threads);
    wait_done(p);
}

void cv_pool_free(cv_pool *p)
{
    if (!p)
        return;
    stop_workers(p, p->n_threads - 1);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->wake_cv);
    pthread_mutex_destroy(&p->mu);
    cv_free(p->workers);
    cv_free_aligned(p);
}

/* Reads one small integer file of a CPU's sysfs topology; -1 when absent. */
static long topology_of(int cpu, const char *what)
{
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f && fscanf(f, "%ld", &v) != 1)
        v = -1;
    if (f)
        fclose(f);
    return v;
}

int cv_physical_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    long seen[CPU_SETSIZE][2];
    int n_cpus = 0, n_cores = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set))
            continue;
        n_cpus++;
        const long pkg = topology_of(cpu, "physical_package_id"), core = topology_of(cpu, "core_id");
        if (pkg < 0 || core < 0)
            return n_cpus > 0 ? CPU_COUNT(&set) : 1; /* no topology: every CPU */
        int k = 0;
        while (k < n_cores && !(seen[k][0] == pkg && seen[k][1] == core))
            k++;
        if (k == n_cores) {
            seen[n_cores][0] = pkg;
            seen[n_cores][1] = core;
            n_cores++;
        }
    }
    return n_cores > 0 ? n_cores : 1;
}
