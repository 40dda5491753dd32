/* args.c: see args.h. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "convoy: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int arg_int(const char *flag, const char *s, long lo, long hi, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "convoy: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

int arg_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') {
        fprintf(stderr, "convoy: %s expects a non-negative integer, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

int arg_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "convoy: %s expects a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
