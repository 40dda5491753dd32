/* slowcore.c: makes one CPU core slower for everything else on it, for
 * test fleets of machines of different speeds on one box (bench/plan.sh).
 * A SCHED_FIFO process pinned to the core spins for part of every period
 * and sleeps for the rest, so the other tasks there run only in the rest:
 * at a granularity far below a job's length, however idle the core is
 * otherwise. That is a slower CPU; a cgroup quota is not (it lets a short
 * job run at full speed and stops a long one).
 *
 *   slowcore CORE PCT [PERIOD_US]   the speed PCT% (1..99) left on CORE,
 *                                    period default 1000 us; runs until killed
 *
 * Needs root (a real-time policy); the kernel's real-time throttling
 * (sched_rt_runtime_us) leaves the others 5% at least in any case. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long arg(const char *s, long lo, long hi, const char *what)
{
    char *end;
    const long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "slowcore: %s must be %ld..%ld, not '%s'\n", what, lo, hi, s);
        exit(2);
    }
    return v;
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: slowcore CORE PCT [PERIOD_US]\n");
        return 2;
    }
    const long core = arg(argv[1], 0, CPU_SETSIZE - 1, "CORE"), pct = arg(argv[2], 1, 99, "PCT");
    const long period_us = argc == 4 ? arg(argv[3], 100, 1000000, "PERIOD_US") : 1000;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)core, &set);
    const struct sched_param sp = {.sched_priority = 1};
    if (sched_setaffinity(0, sizeof set, &set) || sched_setscheduler(0, SCHED_FIFO, &sp)) {
        fprintf(stderr, "slowcore: core %ld, SCHED_FIFO: %s\n", core, strerror(errno));
        return 1;
    }
    const int64_t period = period_us * 1000, busy = period * (100 - pct) / 100;
    for (int64_t start = now_ns();; start += period) {
        while (now_ns() - start < busy)
            ;
        const int64_t wake = start + period;
        const struct timespec t = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
    }
}
