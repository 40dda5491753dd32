/* args.h: small helpers for subcommand flags. Each returns 0 on success and
 * prints a usage error naming the flag otherwise. */
#ifndef CONVOY_APP_ARGS_H
#define CONVOY_APP_ARGS_H

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
double now_seconds(void);

#endif
