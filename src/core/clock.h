/* clock.h: the monotonic clock, for deadlines and measurements.
 *
 * Contract: cv_now_ns reads CLOCK_MONOTONIC (it never steps back and does
 * not follow changes of the wall clock); cv_now_ms and cv_now_s are the
 * same reading in other units. cv_deadline_ms is the wall-clock time ms
 * from now, the deadline pthread_cond_timedwait takes (its condition
 * variables count on CLOCK_REALTIME). */
#ifndef CONVOY_CORE_CLOCK_H
#define CONVOY_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t cv_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int64_t cv_now_ms(void) { return (int64_t)(cv_now_ns() / 1000000u); }

static inline double cv_now_s(void) { return 1e-9 * (double)cv_now_ns(); }

/* The calling thread's CPU time in seconds: one core's work, whatever else
 * the machine runs (the benchmarks of kernels time so). */
static inline double cv_thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline struct timespec cv_deadline_ms(int64_t ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    const int64_t ns = (int64_t)t.tv_nsec + ms % 1000 * 1000000;
    t.tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
    t.tv_nsec = (long)(ns % 1000000000);
    return t;
}

#endif
