/* cmd_synth.c: `convoy synth`: writes a deterministic random Llama GGUF
 * (convoy_synth_file) and prints what it wrote. */
#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: convoy synth (--shape NAME | --dims N_EMBD,N_LAYER,N_HEAD,N_HEAD_KV,N_FF,N_VOCAB)\n"
            "                    --type T -o OUT [--seed S] [--ctx N] [--rope-theta X]\n"
            "                    [--output-scale X] [--tied] [--chatml] [--fim] [--name NAME]\n"
            "                    [--layers N] [--experts N] [-t THREADS]\n"
            "  types: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 IQ4_NL IQ4_XS MXFP4 Q3_K Q4_K Q5_K Q6_K\n"
            "         (those this build can write), and llama.cpp's mixes Q2_K Q3_K_S Q3_K_M\n"
            "         Q3_K_L Q4_K_M Q5_K_M (as `convoy quantize` makes them)\n"
            "  shapes:");
    for (int i = 0; convoy_synth_shape_name(i); i++)
        fprintf(f, " %s", convoy_synth_shape_name(i));
    fprintf(f, "\n");
}

/* The flags. The shape is applied first, then the flags that override it,
 * so those wait here until the shape is known. */
typedef struct synth_opts {
    convoy_synth_params p; /* --tied, --chatml, --seed and -t go straight in */
    const char *shape, *dims, *type, *out, *name;
    int32_t n_ctx, n_layer, n_expert;
    float rope_theta, output_scale;
    bool ctx_given, theta_given, scale_given, layers_given, experts_given;
    char default_name[128];
} synth_opts;

static int parse_options(synth_opts *o, int argc, char **argv)
{
    *o = (synth_opts){.p = convoy_synth_default_params()};
    const arg_opt opts[] = {
        {"shape", 0, ARG_STR, .dst = &o->shape},
        {"dims", 0, ARG_STR, .dst = &o->dims},
        {"type", 0, ARG_STR, .dst = &o->type},
        {NULL, 'o', ARG_STR, .dst = &o->out},
        {"name", 0, ARG_STR, .dst = &o->name},
        {"ctx", 0, ARG_INT, .dst = &o->n_ctx, .lo = 1, .hi = INT32_MAX, .given = &o->ctx_given},
        {"layers", 0, ARG_INT, .dst = &o->n_layer, .lo = 1, .hi = 4096, .given = &o->layers_given},
        {"experts", 0, ARG_INT, .dst = &o->n_expert, .lo = 1, .hi = 4096, .given = &o->experts_given},
        {"rope-theta", 0, ARG_FLOAT, .dst = &o->rope_theta, .given = &o->theta_given},
        {"output-scale", 0, ARG_FLOAT, .dst = &o->output_scale, .given = &o->scale_given},
        {"tied", 0, ARG_FLAG, .dst = &o->p.tied},
        {"chatml", 0, ARG_FLAG, .dst = &o->p.chatml},
        {"fim", 0, ARG_FLAG, .dst = &o->p.fim},
        {"seed", 0, ARG_U64, .dst = &o->p.seed},
        {"threads", 't', ARG_INT, .dst = &o->p.n_threads, .lo = 1, .hi = 1024},
        {0},
    };
    const arg_cmd cmd = {.name = "synth", .usage = usage, .opts = opts};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (!!o->shape == !!o->dims || !o->type || !o->out) {
        fprintf(stderr, "convoy synth: give one of --shape and --dims, and --type and -o\n");
        usage(stderr);
        return 2;
    }
    return ARG_GO;
}

/* The shape or the dims, then the flags over them, and the type. Returns
 * 0, or -1 after a message: a usage error. */
static int set_shape(synth_opts *o)
{
    char err[CONVOY_ERR_MAX];
    if (o->shape && convoy_synth_set_shape(&o->p, o->shape, err, sizeof err)) {
        fprintf(stderr, "convoy synth: %s\n", err);
        usage(stderr);
        return -1;
    }
    if (o->dims && arg_dims(o->dims, &o->p))
        return -1;
    if (o->ctx_given)
        o->p.n_ctx = o->n_ctx;
    if (o->layers_given) /* a shape's first layers (a bench of a model too big to hold) */
        o->p.n_layer = o->n_layer;
    if (o->experts_given) /* a mixture of experts' shape with another number of experts */
        o->p.n_expert = o->n_expert;
    if (o->theta_given)
        o->p.rope_theta = o->rope_theta;
    if (o->scale_given)
        o->p.output_scale = o->output_scale;
    if (!convoy_quant_type_known(o->type)) {
        fprintf(stderr, "convoy synth: unknown type '%s'\n", o->type);
        return -1;
    }
    o->p.type = o->type;
    return 0;
}

/* --name, else "synth-SHAPE-type" or "synth-EMBDxLAYER-type". */
static void set_name(synth_opts *o)
{
    char *name = o->default_name;
    const size_t n = sizeof o->default_name;
    if (o->name) {
        o->p.name = o->name;
        return;
    }
    int k = o->shape ? snprintf(name, n, "%s%.64s-", strncmp(o->shape, "synth-", 6) ? "synth-" : "", o->shape)
                     : snprintf(name, n, "synth-%" PRId64 "x%" PRId64 "-", o->p.n_embd, o->p.n_layer);
    for (const char *c = o->type; *c && k + 1 < (int)n; c++)
        name[k++] = (char)tolower((unsigned char)*c);
    name[k] = 0;
    o->p.name = name;
}

/* Each tensor as it is written: a fallback is said; at a terminal, a
 * progress line is rewritten in place (a 1B model takes half a minute). */
static void note_tensor(void *user, const convoy_tensor_note *n)
{
    const bool *at_terminal = user;
    if (*at_terminal)
        fprintf(stderr, "\rconvoy synth: [%d/%d] %-40.40s", n->index + 1, n->count, n->name);
    if (*at_terminal && n->index + 1 == n->count)
        fputc('\n', stderr);
    if (strcmp(n->type, n->want_type))
        fprintf(stderr, "%sconvoy synth: %s: rows of %" PRId64 " do not fit %s blocks, using %s\n",
                *at_terminal ? "\n" : "", n->name, n->ne[0], n->want_type, n->type);
}

/* Writes the model, then reads it back for the line that says what it is. */
static int write_and_report(const synth_opts *o)
{
    char err[CONVOY_ERR_MAX];
    bool at_terminal = isatty(STDERR_FILENO);
    if (convoy_synth_file(&o->p, o->out, note_tensor, &at_terminal, err, sizeof err)) {
        fprintf(stderr, "convoy synth: %s\n", err);
        return 1;
    }
    convoy_file_stats st;
    if (convoy_file_get_stats(o->out, &st, err, sizeof err)) {
        fprintf(stderr, "convoy synth: reading back: %s\n", err);
        return 1;
    }
    printf("wrote %s: %s, %" PRIu64 " tensors, %.1f M params, %" PRIu64 " bytes, fingerprint %016" PRIx64 "\n",
           o->out, o->p.name, st.n_tensors, (double)st.n_params / 1e6, st.bytes, st.fingerprint);
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    synth_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    if (set_shape(&o))
        return 2;
    set_name(&o);
    return write_and_report(&o);
}
