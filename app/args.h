/* args.h: the options of the subcommands. A command describes its options
 * in one table of arg_opt and arg_parse reads argv against it with glibc's
 * getopt_long, so every command takes options and arguments in any order,
 * answers -h/--help with its usage and --version with convoy's version on
 * stdout, and reports unknown options, missing and bad values the same way
 * (on stderr, naming the option). Besides --name and -x an option may have
 * a single-dash spelling of several letters, as llama.cpp's -np and -ngl,
 * and the main options an environment variable (for services: a systemd
 * unit's Environment=, a container's env), which the command line
 * overrides. */
#ifndef CONVOY_APP_ARGS_H
#define CONVOY_APP_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "convoy.h"

typedef enum arg_kind {
    ARG_FLAG,    /* bool, set to true; takes no value */
    ARG_NO_FLAG, /* bool, set to false; takes no value */
    ARG_STR,     /* const char *, the value as given */
    ARG_INT,     /* int32_t in [lo, hi] */
    ARG_U64,     /* uint64_t */
    ARG_FLOAT,   /* float, finite */
    ARG_BYTES,   /* uint64_t, a size such as 1500000000, 1.5G or 1.4GiB */
    ARG_KV_TYPE, /* bool, true for "f16", false for "f32" */
} arg_kind;

typedef struct arg_opt {
    const char *name; /* long name without "--", or NULL */
    char letter;      /* short name, or 0 */
    arg_kind kind;
    void *dst;
    long lo, hi;      /* ARG_INT's bounds */
    bool required;
    bool *given;      /* when not NULL, set when the option appears */
    const char *word; /* with name: a single-dash spelling ("np" for -np), or NULL */
    const char *env;  /* an environment variable that gives it when the command line does not
                         ("CONVOY_MODEL"; a flag: 1/true/yes/on or 0/false/no/off), or NULL */
} arg_opt;

/* The speculation options of run and serve (--draft ngram|PATH, --spec-k K,
 * --spec-k-max K, --spec-windows D); start from arg_spec_init. With --draft
 * and --nodes, arg_parse gives the engine a batch in flight per window
 * (convoy_ctx_params.depth). */
typedef struct arg_spec {
    convoy_spec_params p; /* p.draft NULL: no speculation */
    bool k_given, k_max_given;
} arg_spec;

typedef struct arg_cmd {
    const char *name;          /* "run": messages begin "convoy run: " */
    void (*usage)(FILE *f);
    const arg_opt *opts;       /* the command's own options; the last entry has no names */
    convoy_ctx_params *engine; /* not NULL: the engine options too (-t, --ctx, --batch, --kv-type (-ctk, -ctv), --mem,
                                  --nodes, --split, --wire, --peer-timeout, --standby, --key, --insecure) */
    arg_spec *spec;            /* not NULL: the speculation options too */
    const char **args;         /* the positional arguments go here: exactly n_args of them */
    int n_args;
} arg_cmd;

/* arg_parse's answer when the command goes on. */
#define ARG_GO (-1)

/* Reads argv[1..argc) (argv[0] is the command's name) into the table's
 * destinations. Returns ARG_GO, or the status the command exits with at
 * once: 0 after printing the usage for -h/--help, 2 after a usage error. */
int arg_parse(const arg_cmd *cmd, int argc, char **argv);

/* "convoy VERSION": what --version prints. */
const char *arg_version(void);

/* Parses an integer in [lo, hi], or says (naming flag) why not. */
int arg_int(const char *flag, const char *s, long lo, long hi, int32_t *out);

/* A whole file (stdin for "-"), NUL-terminated, its length in *len (free
 * with free); NULL after a message naming cmd and the file. */
char *arg_read_file(const char *cmd, const char *path, size_t *len);

/* Parses --dims N_EMBD,N_LAYER,N_HEAD,N_HEAD_KV,N_FF,N_VOCAB into p's
 * dimensions, or says why not. */
int arg_dims(const char *s, convoy_synth_params *p);

arg_spec arg_spec_init(void);
/* After the options (arg_parse calls it): a --draft that is a number and
 * no file is refused, pointing at --spec-k. Returns 0, or -1 after a
 * message naming cmd. */
int arg_spec_check(const arg_spec *s, const char *cmd);
/* After the options: *out = NULL without --draft, else the convoy_spec for
 * ctx (K max raised to a larger --spec-k when not given). Returns 0, or -1
 * after a message naming cmd. */
int arg_spec_open(arg_spec *s, const char *cmd, convoy_ctx *ctx, const convoy_model *m, int32_t n_threads,
                  convoy_spec **out);

#endif
