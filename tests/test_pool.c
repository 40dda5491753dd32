/* test_pool.c: the worker pool runs every ith exactly once per job, on the
 * caller for ith 0 (and inline for a pool of 1), across many back-to-back
 * tiny jobs, after idle sleeps, with slow workers, and without allocating. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/pool.h"
#include "test.h"

#define MAX_THREADS 8

typedef struct {
    atomic_int runs[MAX_THREADS];
    atomic_int bad_nth;
    atomic_int bad_ith;
    int nth_expected;
    pthread_t caller;
    atomic_int ith0_elsewhere;
    int slow_ith;      /* this ith sleeps slow_us before returning (-1: none) */
    long slow_us;
} count_ctx;

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void count_job(void *arg, int ith, int nth)
{
    count_ctx *c = arg;
    if (nth != c->nth_expected)
        atomic_fetch_add(&c->bad_nth, 1);
    if (ith < 0 || ith >= nth || ith >= MAX_THREADS) {
        atomic_fetch_add(&c->bad_ith, 1);
        return;
    }
    if (ith == 0 && !pthread_equal(pthread_self(), c->caller))
        atomic_fetch_add(&c->ith0_elsewhere, 1);
    if (ith == c->slow_ith)
        sleep_us(c->slow_us);
    atomic_fetch_add(&c->runs[ith], 1);
}

static void init_ctx(count_ctx *c, int nth)
{
    for (int i = 0; i < MAX_THREADS; i++)
        atomic_init(&c->runs[i], 0);
    atomic_init(&c->bad_nth, 0);
    atomic_init(&c->bad_ith, 0);
    atomic_init(&c->ith0_elsewhere, 0);
    c->nth_expected = nth;
    c->caller = pthread_self();
    c->slow_ith = -1;
    c->slow_us = 0;
}

/* After `jobs` runs every ith in [0, nth) ran exactly `jobs` times. */
static void check_counts(count_ctx *c, int nth, int jobs)
{
    for (int i = 0; i < nth; i++)
        CHECKF(atomic_load(&c->runs[i]) == jobs, "nth %d: ith %d ran %d times, expected %d", nth, i,
               atomic_load(&c->runs[i]), jobs);
    for (int i = nth; i < MAX_THREADS; i++)
        CHECK(atomic_load(&c->runs[i]) == 0);
    CHECK(atomic_load(&c->bad_nth) == 0);
    CHECK(atomic_load(&c->bad_ith) == 0);
    CHECK(atomic_load(&c->ith0_elsewhere) == 0);
}

static void back_to_back(int nth, int jobs)
{
    cv_pool *p = cv_pool_create(nth);
    CHECK(p != NULL);
    if (!p)
        return;
    CHECK(cv_pool_size(p) == nth);
    count_ctx c;
    init_ctx(&c, nth);
    double t0 = cv_now_s();
    for (int j = 0; j < jobs; j++) {
        cv_pool_run(p, count_job, &c);
        /* the job is complete when run returns: every ith has counted it */
        if (j % 997 == 0)
            for (int i = 0; i < nth; i++)
                CHECK(atomic_load(&c.runs[i]) == j + 1);
    }
    double t = cv_now_s() - t0;
    fprintf(stderr, "pool of %d: %d back-to-back jobs, %.2f us per job\n", nth, jobs, t / jobs * 1e6);
    check_counts(&c, nth, jobs);
    cv_pool_free(p);
}

static void test_pool_of_1_inline(void)
{
    back_to_back(1, 10000);
}

static void test_pool_of_2(void)
{
    back_to_back(2, 20000);
}

static void test_pool_of_3(void)
{
    back_to_back(3, 5000);
}

/* Jobs separated by pauses longer than the spin, so workers sleep and must
 * be woken; and jobs where one worker is slow, so the caller sleeps. */
static void test_sleep_and_wake(void)
{
    for (int nth = 2; nth <= 3; nth++) {
        cv_pool *p = cv_pool_create(nth);
        CHECK(p != NULL);
        if (!p)
            return;
        count_ctx c;
        init_ctx(&c, nth);
        int jobs = 0;
        for (int k = 0; k < 6; k++) {
            sleep_us(k % 2 ? 3000 : 100);
            cv_pool_run(p, count_job, &c);
            jobs++;
        }
        c.slow_ith = nth - 1;
        c.slow_us = 2000;
        for (int k = 0; k < 4; k++) {
            cv_pool_run(p, count_job, &c);
            jobs++;
            CHECK(atomic_load(&c.runs[nth - 1]) == jobs);
        }
        c.slow_ith = 0;
        cv_pool_run(p, count_job, &c);
        jobs++;
        check_counts(&c, nth, jobs);
        cv_pool_free(p);
    }
}

static void test_no_allocation_in_run(void)
{
    cv_pool *p = cv_pool_create(2);
    CHECK(p != NULL);
    if (!p)
        return;
    count_ctx c;
    init_ctx(&c, 2);
    uint64_t before = cv_alloc_count();
    cv_alloc_forbid(1);
    for (int j = 0; j < 100; j++)
        cv_pool_run(p, count_job, &c);
    cv_alloc_forbid(0);
    CHECK(cv_alloc_count() == before);
    check_counts(&c, 2, 100);
    cv_pool_free(p);
}

/* Pools created and freed at once, with workers still starting or spinning. */
static void test_create_free(void)
{
    for (int k = 0; k < 50; k++) {
        cv_pool *p = cv_pool_create(1 + k % 3);
        CHECK(p != NULL);
        if (k % 2 && p) {
            count_ctx c;
            init_ctx(&c, 1 + k % 3);
            cv_pool_run(p, count_job, &c);
            check_counts(&c, 1 + k % 3, 1);
        }
        cv_pool_free(p);
    }
    CHECK(cv_pool_create(0) == NULL);
    CHECK(cv_pool_create(-1) == NULL);
}

static void test_split_range(void)
{
    for (long n = 0; n < 40; n++)
        for (int nth = 1; nth <= 7; nth++) {
            long expect_lo = 0;
            for (int ith = 0; ith < nth; ith++) {
                long lo, hi;
                cv_split_range(n, ith, nth, &lo, &hi);
                CHECKF(lo == expect_lo && hi >= lo && hi <= n, "n %ld ith %d/%d: [%ld, %ld)", n, ith, nth, lo, hi);
                expect_lo = hi;
            }
            CHECKF(expect_lo == n, "n %ld nth %d: ranges end at %ld", n, nth, expect_lo);
        }
}

int main(void)
{
    TEST_RUN(test_pool_of_1_inline);
    TEST_RUN(test_pool_of_2);
    TEST_RUN(test_pool_of_3);
    TEST_RUN(test_sleep_and_wake);
    TEST_RUN(test_no_allocation_in_run);
    TEST_RUN(test_create_free);
    TEST_RUN(test_split_range);
    return test_summary();
}
