/* cmd_eval.c: `convoy eval`: teacher-forced logits of every position of a
 * token list, written as raw float32 little-endian [n_tokens][n_vocab]
 * (the layout of ../shared/reference/logits/). The tokens go through the
 * model in chunks of --batch (default: all at once). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy eval -m MODEL --tokens IDS.json --logits OUT.f32 [-t THREADS] [--batch N] "
               "[--ctx N] [--kv-type f32|f16]\n"
               "                   [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0]\n"
               "                    [--peer-timeout MS] [--standby HOST:PORT,...] [--failover-wait MS] [--key FILE] [--insecure]\n"
               "                    [--no-rebalance]]\n"
               "  IDS.json: an object whose \"tokens\" is the list of ids; with --nodes the logits\n"
               "  are those computed at the pipeline's last stage\n"
               "  --ctx N: a context of N positions (default and at least: the tokens'); Phi-3's RoPE factors\n"
               "  depend on it, as in llama.cpp\n"
               "  --key FILE: the cluster key (`convoy keygen FILE`) that the nodes hold too: every link is\n"
               "  authenticated and encrypted; without it, a node not on loopback is refused unless --insecure.\n");
}

/* Reads the "tokens" array of a JSON file into a malloc'ed array. */
static int32_t *read_tokens(const char *path, int32_t n_vocab, int32_t *n_out)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        fprintf(stderr, "convoy: %s:%d: %s\n", path, jerr.line, jerr.text);
        return NULL;
    }
    json_t *arr = json_is_object(root) ? json_object_get(root, "tokens") : NULL;
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        fprintf(stderr, "convoy: %s: expected an object with a non-empty \"tokens\" array\n", path);
        json_decref(root);
        return NULL;
    }
    size_t n = json_array_size(arr);
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (size_t i = 0; ids && i < n; i++) {
        json_t *e = json_array_get(arr, i);
        json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
        if (v < 0 || v >= n_vocab) {
            fprintf(stderr, "convoy: %s: tokens[%zu] is not an id in [0, %d)\n", path, i, n_vocab);
            free(ids);
            ids = NULL;
        } else {
            ids[i] = (int32_t)v;
        }
    }
    json_decref(root);
    *n_out = (int32_t)n;
    return ids;
}

typedef struct eval_opts {
    const char *model_path, *tokens_path, *out_path;
    convoy_ctx_params cp;
} eval_opts;

/* What an evaluation holds from the model load to the end. */
typedef struct eval_state {
    convoy_model *model;
    convoy_model_info info;
    convoy_ctx *ctx;
    int32_t *ids; /* [n] the tokens */
    int32_t n;
    float *logits; /* [n_batch][n_vocab] */
    int32_t *pos, *seq; /* [n_batch] */
    uint8_t *want;      /* [n_batch] */
    FILE *out;
} eval_state;

static int parse_options(eval_opts *o, int argc, char **argv)
{
    *o = (eval_opts){.cp = convoy_ctx_default_params()};
    o->cp.n_batch = 0; /* default: all tokens in one batch */
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &o->model_path, .required = true},
        {"tokens", 0, ARG_STR, .dst = &o->tokens_path, .required = true},
        {"logits", 0, ARG_STR, .dst = &o->out_path, .required = true},
        {0},
    };
    const arg_cmd cmd = {.name = "eval", .usage = usage, .opts = opts, .engine = &o->cp};
    return arg_parse(&cmd, argc, argv);
}

/* Loads the model and the tokens, and creates a context just large enough
 * for them, or of --ctx positions when that is more. */
static int open_engine(eval_opts *o, eval_state *s)
{
    char err[CONVOY_ERR_MAX];
    if (!(s->model = convoy_model_load(o->model_path, err, sizeof err))) {
        fprintf(stderr, "convoy: %s\n", err);
        return -1;
    }
    convoy_model_get_info(s->model, &s->info);
    if (!(s->ids = read_tokens(o->tokens_path, s->info.n_vocab, &s->n)))
        return -1;
    o->cp.n_ctx = o->cp.n_ctx > s->n ? o->cp.n_ctx : s->n;
    o->cp.n_batch = o->cp.n_batch && o->cp.n_batch < s->n ? o->cp.n_batch : s->n;
    o->cp.want_logits = o->cp.nodes != NULL; /* the last stage's logits come back */
    if (!(s->ctx = convoy_ctx_create(s->model, &o->cp, err, sizeof err))) {
        fprintf(stderr, "convoy: %s\n", err);
        return -1;
    }
    return 0;
}

/* The batch buffers (every token of a batch wanted, all in slot 0) and the
 * output file. */
static int open_buffers(const eval_opts *o, eval_state *s)
{
    const size_t n_batch = (size_t)o->cp.n_batch;
    s->logits = malloc(sizeof(float) * n_batch * (size_t)s->info.n_vocab);
    s->pos = malloc(sizeof(int32_t) * n_batch);
    s->seq = calloc(n_batch, sizeof(int32_t));
    s->want = malloc(n_batch);
    s->out = fopen(o->out_path, "wb");
    if (!s->logits || !s->pos || !s->seq || !s->want || !s->out) {
        fprintf(stderr, "convoy: cannot write %s or out of memory\n", o->out_path);
        return -1;
    }
    memset(s->want, 1, n_batch);
    return 0;
}

/* Runs the tokens in batches of n_batch and appends each batch's logits. */
static int decode_all(const eval_opts *o, eval_state *s)
{
    char err[CONVOY_ERR_MAX];
    for (int32_t start = 0; start < s->n; start += o->cp.n_batch) {
        const int32_t m = s->n - start < o->cp.n_batch ? s->n - start : o->cp.n_batch;
        for (int32_t i = 0; i < m; i++)
            s->pos[i] = start + i;
        const convoy_batch b = {.n_tokens = m, .token = s->ids + start, .pos = s->pos, .seq = s->seq,
                                .want = s->want};
        if (convoy_decode(s->ctx, &b, s->logits, err, sizeof err)) {
            fprintf(stderr, "convoy: %s\n", err);
            return -1;
        }
        if (fwrite(s->logits, sizeof(float) * (size_t)s->info.n_vocab, (size_t)m, s->out) != (size_t)m) {
            fprintf(stderr, "convoy: write error on %s\n", o->out_path);
            return -1;
        }
    }
    return 0;
}

/* Frees everything; a failed close of a complete output fails the run. */
static int close_engine(const eval_opts *o, eval_state *s, int rc)
{
    if (s->out && fclose(s->out) && rc == 0) {
        fprintf(stderr, "convoy: write error on %s\n", o->out_path);
        rc = 1;
    }
    free(s->want);
    free(s->seq);
    free(s->pos);
    free(s->logits);
    free(s->ids);
    convoy_ctx_free(s->ctx);
    convoy_model_free(s->model);
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    eval_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    eval_state s = {0};
    const int rc = open_engine(&o, &s) || open_buffers(&o, &s) || decode_all(&o, &s) ? 1 : 0;
    return close_engine(&o, &s, rc);
}
