/* args.c: see args.h. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int arg_bytes(const char *flag, const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1},         {"K", 1e3},          {"M", 1e6},          {"G", 1e9},          {"T", 1e12},
                 {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    for (size_t i = 0; !errno && end != s && v >= 0 && isfinite(v) && i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix) && v * units[i].scale < 1.8e19) {
            *out = (uint64_t)(v * units[i].scale);
            return 0;
        }
    fprintf(stderr, "convoy: %s expects a size such as 1500000000, 1.5G or 1.4GiB, got '%s'\n", flag, s);
    return -1;
}

int arg_engine(const char *a, const char *v, convoy_ctx_params *cp)
{
    if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
        return arg_int(a, v, 1, 256, &cp->n_threads);
    if (!strcmp(a, "--ctx"))
        return arg_int(a, v, 2, 1 << 24, &cp->n_ctx);
    if (!strcmp(a, "--batch"))
        return arg_int(a, v, 1, 1 << 16, &cp->n_batch);
    if (!strcmp(a, "--mem"))
        return arg_bytes(a, v, &cp->mem_budget);
    if (!strcmp(a, "--timeout"))
        return arg_int(a, v, 1, 1 << 30, &cp->timeout_ms);
    if (!strcmp(a, "--kv-type")) {
        if (strcmp(v, "f32") && strcmp(v, "f16")) {
            fprintf(stderr, "convoy: --kv-type must be f32 or f16, got '%s'\n", v);
            return -1;
        }
        cp->kv_f16 = !strcmp(v, "f16");
        return 0;
    }
    if (!strcmp(a, "--nodes"))
        cp->nodes = v;
    else if (!strcmp(a, "--split"))
        cp->split = v;
    else if (!strcmp(a, "--wire"))
        cp->wire = v;
    else
        return 1;
    return 0;
}

arg_spec arg_spec_init(void)
{
    arg_spec s = {.p = convoy_spec_default_params()};
    s.p.draft = NULL;
    return s;
}

int arg_engine_or_spec(const char *a, const char *v, convoy_ctx_params *cp, arg_spec *s)
{
    const int engine = arg_engine(a, v, cp);
    if (engine != 1)
        return engine;
    if (!strcmp(a, "--draft")) {
        s->p.draft = v;
        return 0;
    }
    if (!strcmp(a, "--spec-k")) {
        s->k_given = true;
        return arg_int(a, v, 1, CONVOY_SPEC_K_LIMIT, &s->p.k);
    }
    if (!strcmp(a, "--spec-k-max")) {
        s->k_max_given = true;
        return arg_int(a, v, 1, CONVOY_SPEC_K_LIMIT, &s->p.k_max);
    }
    return 1;
}

int arg_spec_open(arg_spec *s, const char *cmd, convoy_ctx *ctx, const convoy_model *m, int32_t n_threads,
                  convoy_spec **out)
{
    *out = NULL;
    if (!s->p.draft) {
        if (!s->k_given && !s->k_max_given)
            return 0;
        fprintf(stderr, "convoy %s: --spec-k and --spec-k-max need --draft\n", cmd);
        return -1;
    }
    if (s->p.k > s->p.k_max && !s->k_max_given)
        s->p.k_max = s->p.k;
    s->p.n_threads = n_threads;
    char err[512];
    if (!(*out = convoy_spec_create(ctx, m, &s->p, err, sizeof err))) {
        fprintf(stderr, "convoy %s: %s\n", cmd, err);
        return -1;
    }
    return 0;
}
