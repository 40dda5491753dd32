/* cmd_synth.c: `convoy synth`: writes a deterministic random Llama GGUF
 * (src/model/synth.h) and prints what it wrote. */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "model/fingerprint.h"
#include "model/gguf.h"
#include "model/synth.h"

static void synth_usage(FILE *f)
{
    fprintf(f,
            "usage: convoy synth (--shape NAME | --dims N_EMBD,N_LAYER,N_HEAD,N_HEAD_KV,N_FF,N_VOCAB)\n"
            "                    --type T -o OUT [--seed S] [--ctx N] [--rope-theta X]\n"
            "                    [--output-scale X] [--tied] [--name NAME] [-t THREADS]\n"
            "  types: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K (those this build can write)\n"
            "  shapes:");
    for (int i = 0; cv_synth_preset_name(i); i++)
        fprintf(f, " %s", cv_synth_preset_name(i));
    fprintf(f, "\n");
}

static int parse_dims(const char *s, cv_synth_params *p)
{
    int64_t *dims[] = {&p->n_embd, &p->n_layer, &p->n_head, &p->n_head_kv, &p->n_ff, &p->n_vocab};
    size_t n_dims = sizeof(dims) / sizeof(dims[0]), i = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    for (; tok && i < n_dims; tok = strtok_r(NULL, ",", &save), i++) {
        int32_t v;
        if (arg_int("--dims", tok, 1, INT32_MAX, &v))
            return -1;
        *dims[i] = v;
    }
    if (i == n_dims && !tok)
        return 0;
    fprintf(stderr, "convoy synth: --dims wants 6 integers N_EMBD,N_LAYER,N_HEAD,N_HEAD_KV,N_FF,N_VOCAB\n");
    return -1;
}

static void note_fallback(void *ctx, const cv_tensor_note *n)
{
    (void)ctx;
    if (n->type != n->want_type)
        fprintf(stderr, "convoy synth: %s: rows of %" PRId64 " do not fit %s blocks, using %s\n", n->name, n->ne[0],
                cv_type_name(n->want_type), cv_type_name(n->type));
}

int cmd_synth(int argc, char **argv)
{
    cv_synth_params p;
    cv_synth_defaults(&p);
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    p.n_threads = n_cpu > 0 ? (int)n_cpu : 1;
    /* the shape is applied first, then the flags that override it */
    const char *shape = NULL, *dims = NULL, *type = NULL, *out = NULL, *name = NULL;
    const char *ctx = NULL, *theta = NULL, *scale = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--shape")          ? &shape
                           : !strcmp(a, "--dims")         ? &dims
                           : !strcmp(a, "--type")         ? &type
                           : !strcmp(a, "-o")             ? &out
                           : !strcmp(a, "--name")         ? &name
                           : !strcmp(a, "--ctx")          ? &ctx
                           : !strcmp(a, "--rope-theta")   ? &theta
                           : !strcmp(a, "--output-scale") ? &scale
                                                          : NULL;
        int32_t n_threads;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tied")) {
            p.tied = true;
        } else if (dst) {
            if (!(*dst = arg_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            const char *v = arg_value(argc, argv, &i);
            if (!v || arg_u64(a, v, &p.seed))
                return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *v = arg_value(argc, argv, &i);
            if (!v || arg_int(a, v, 1, 1024, &n_threads))
                return 2;
            p.n_threads = n_threads;
        } else {
            fprintf(stderr, "convoy synth: unknown option '%s'\n", a);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!!shape == !!dims || !type || !out) {
        fprintf(stderr, "convoy synth: give one of --shape and --dims, and --type and -o\n");
        synth_usage(stderr);
        return 2;
    }
    char err[CV_ERRLEN];
    if (shape && cv_synth_preset(&p, shape, err, sizeof(err))) {
        fprintf(stderr, "convoy synth: %s\n", err);
        synth_usage(stderr);
        return 2;
    }
    int32_t n_ctx;
    if ((dims && parse_dims(dims, &p)) || (ctx && arg_int("--ctx", ctx, 1, INT32_MAX, &n_ctx)) ||
        (theta && arg_float("--rope-theta", theta, &p.rope_theta)) ||
        (scale && arg_float("--output-scale", scale, &p.output_scale)))
        return 2;
    if (ctx)
        p.n_ctx = n_ctx;

    cv_kernels_init(0);
    if (cv_quant_parse_type(type, &p.type, &p.k_mix)) {
        fprintf(stderr, "convoy synth: unknown type '%s'\n", type);
        return 2;
    }
    if (name) {
        snprintf(p.name, sizeof(p.name), "%s", name);
    } else {
        int k = shape ? snprintf(p.name, sizeof(p.name), "%s%.64s-", strncmp(shape, "synth-", 6) ? "synth-" : "", shape)
                      : snprintf(p.name, sizeof(p.name), "synth-%" PRId64 "x%" PRId64 "-", p.n_embd, p.n_layer);
        for (const char *c = type; *c && k + 1 < (int)sizeof(p.name); c++)
            p.name[k++] = (char)tolower((unsigned char)*c);
        p.name[k] = 0;
    }

    if (cv_synth_write(&p, out, note_fallback, NULL, err, sizeof(err))) {
        fprintf(stderr, "convoy synth: %s\n", err);
        return 1;
    }
    gguf_file f;
    if (gguf_open(&f, out, err, sizeof(err))) {
        fprintf(stderr, "convoy synth: reading back: %s\n", err);
        return 1;
    }
    int64_t n_params = 0;
    for (uint64_t i = 0; i < f.n_tensors; i++)
        n_params += f.tensors[i].ne[0] * f.tensors[i].ne[1] * f.tensors[i].ne[2] * f.tensors[i].ne[3];
    printf("wrote %s: %s, %" PRIu64 " tensors, %.1f M params, %zu bytes, fingerprint %016" PRIx64 "\n", out,
           p.name, f.n_tensors, (double)n_params / 1e6, f.map.size, cv_model_fingerprint(&f));
    gguf_close(&f);
    return 0;
}
