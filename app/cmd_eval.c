/* cmd_eval.c: `convoy eval`: teacher-forced logits of every position of a
 * token list, written as raw float32 little-endian [n_tokens][n_vocab]
 * (the layout of ../shared/reference/logits/). The tokens go through the
 * model in chunks of --batch (default: all at once). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "core/alloc.h"

static void usage(void)
{
    fprintf(stderr, "usage: convoy eval -m MODEL --tokens IDS.json --logits OUT.f32 [-t THREADS] [--batch N] "
                    "[--kv-type f32|f16]\n"
                    "                   [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0]]\n"
                    "  IDS.json: an object whose \"tokens\" is the list of ids; with --nodes the logits\n"
                    "  are those computed at the pipeline's last stage\n");
}

/* Reads the "tokens" array of a JSON file into a cv_malloc'ed array. */
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
    int32_t *ids = cv_malloc(sizeof(int32_t) * n);
    for (size_t i = 0; ids && i < n; i++) {
        json_t *e = json_array_get(arr, i);
        json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
        if (v < 0 || v >= n_vocab) {
            fprintf(stderr, "convoy: %s: tokens[%zu] is not an id in [0, %d)\n", path, i, n_vocab);
            cv_free(ids);
            ids = NULL;
        } else {
            ids[i] = (int32_t)v;
        }
    }
    json_decref(root);
    *n_out = (int32_t)n;
    return ids;
}

int cmd_eval(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_path = NULL, *out_path = NULL, *v;
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_batch = 0; /* default: all tokens in one batch */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return 2;
        const int engine = arg_engine(a, v, &cp);
        if (engine < 0)
            return 2;
        if (engine == 0)
            continue;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--tokens"))
            tokens_path = v;
        else if (!strcmp(a, "--logits"))
            out_path = v;
        else {
            fprintf(stderr, "convoy eval: unknown option '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (!model_path || !tokens_path || !out_path) {
        usage();
        return 2;
    }
    char err[512];
    convoy_model *model = convoy_model_load(model_path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    convoy_model_info info;
    convoy_model_get_info(model, &info);
    int rc = 1;
    int32_t n = 0;
    convoy_ctx *ctx = NULL;
    FILE *out = NULL;
    float *logits = NULL;
    int32_t *pos = NULL, *seq = NULL;
    uint8_t *want = NULL;
    int32_t *ids = read_tokens(tokens_path, info.n_vocab, &n);
    if (!ids)
        goto done;
    cp.n_ctx = n;
    cp.n_batch = cp.n_batch && cp.n_batch < n ? cp.n_batch : n;
    cp.want_logits = cp.nodes != NULL; /* the last stage's logits come back */
    ctx = convoy_ctx_create(model, &cp, err, sizeof err);
    if (!ctx) {
        fprintf(stderr, "convoy: %s\n", err);
        goto done;
    }
    logits = cv_malloc(sizeof(float) * (size_t)cp.n_batch * (size_t)info.n_vocab);
    pos = cv_malloc(sizeof(int32_t) * (size_t)cp.n_batch);
    seq = cv_calloc((size_t)cp.n_batch, sizeof(int32_t));
    want = cv_malloc((size_t)cp.n_batch);
    out = fopen(out_path, "wb");
    if (!logits || !pos || !seq || !want || !out) {
        fprintf(stderr, "convoy: cannot write %s or out of memory\n", out_path);
        goto done;
    }
    memset(want, 1, (size_t)cp.n_batch);
    for (int32_t start = 0; start < n; start += cp.n_batch) {
        int32_t m = n - start < cp.n_batch ? n - start : cp.n_batch;
        for (int32_t i = 0; i < m; i++)
            pos[i] = start + i;
        convoy_batch b = {.n_tokens = m, .token = ids + start, .pos = pos, .seq = seq, .want = want};
        if (convoy_decode(ctx, &b, logits, err, sizeof err)) {
            fprintf(stderr, "convoy: %s\n", err);
            goto done;
        }
        if (fwrite(logits, sizeof(float) * (size_t)info.n_vocab, (size_t)m, out) != (size_t)m) {
            fprintf(stderr, "convoy: write error on %s\n", out_path);
            goto done;
        }
    }
    rc = 0;
done:
    if (out && fclose(out) && rc == 0) {
        fprintf(stderr, "convoy: write error on %s\n", out_path);
        rc = 1;
    }
    cv_free(want);
    cv_free(seq);
    cv_free(pos);
    cv_free(logits);
    cv_free(ids);
    convoy_ctx_free(ctx);
    convoy_model_free(model);
    return rc;
}
