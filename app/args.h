/* args.h: small helpers for subcommand flags. Each returns 0 on success and
 * prints a usage error naming the flag otherwise. */
#ifndef CONVOY_APP_ARGS_H
#define CONVOY_APP_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "convoy.h"

/* Returns argv[++*i] or NULL (with a message) when the flag has no value. */
const char *arg_value(int argc, char **argv, int *i);
int arg_int(const char *flag, const char *s, long lo, long hi, int32_t *out);
int arg_u64(const char *flag, const char *s, uint64_t *out);
int arg_float(const char *flag, const char *s, float *out);
/* Parses a byte count with an optional K, M, G or T suffix (powers of
 * 1000 with a decimal point allowed, as "1.5G"; KiB, MiB, GiB, TiB powers of 1024). */
int arg_bytes(const char *flag, const char *s, uint64_t *out);
/* The engine flags every command that runs a model takes: -t/--threads,
 * --ctx, --batch, --kv-type f32|f16, --mem, --nodes, --split, --wire,
 * --timeout. Returns 0 when `flag` (with value v) was one of them and is
 * now in cp, 1 when it is not an engine flag, -1 (after a message) when
 * its value is bad. */
int arg_engine(const char *flag, const char *v, convoy_ctx_params *cp);
/* The speculation flags of run and serve: --draft ngram|PATH, --spec-k K,
 * --spec-k-max K, gathered in an arg_spec (start from arg_spec_init); same
 * return convention as arg_engine. */
typedef struct arg_spec {
    convoy_spec_params p; /* p.draft NULL: no speculation */
    bool k_given, k_max_given;
} arg_spec;

arg_spec arg_spec_init(void);
/* An engine flag (arg_engine) or a speculation flag, same convention. */
int arg_engine_or_spec(const char *flag, const char *v, convoy_ctx_params *cp, arg_spec *s);
/* After the flags: *out = NULL without --draft, else the convoy_spec for
 * ctx (K max raised to a larger --spec-k when not given). Returns 0, or -1
 * after a message naming cmd. */
int arg_spec_open(arg_spec *s, const char *cmd, convoy_ctx *ctx, const convoy_model *m, int32_t n_threads,
                  convoy_spec **out);

#endif
