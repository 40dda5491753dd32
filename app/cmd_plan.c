/* cmd_plan.c: `convoy plan`: how fast a model will serve on a fleet.
 * Live (--nodes): the chain opens as `convoy serve` would open it, its
 * stages are timed on batches of 1 to 16 rows (convoy_fleet_measure), and
 * each node's figures are printed in the fleet file's units. On paper
 * (--fleet FILE.json): each node's stated memory, GB/s, GFLOP/s and link.
 * Then for each count of users: the plan the planner makes, and the
 * pipeline simulated serving them (convoy_forecast_run): tokens per second
 * per user and in all, time to first token of --prompt tokens, and the
 * bottleneck. The model is a file (-m) or a dense Llama's dims (--dims,
 * --type) for a model not at hand. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: convoy plan (-m MODEL | --dims N_EMBD,N_LAYER,N_HEAD,N_HEAD_KV,N_FF,N_VOCAB [--type T])\n"
            "                   (--nodes HOST:PORT,... [--key FILE] [--insecure] [--cpus A,B,...] [--save FLEET.json]\n"
            "                    | --fleet FLEET.json)\n"
            "                   [--users 1,2,4] [--spec-k K [--accept A] [--drafts X] [--spec-windows D]]\n"
            "                   [--prompt N] [--tokens N] [--ctx N] [--batch N] [--kv-type f32|f16] [--split A,B,...]\n"
            "  Predicts tokens/s per user and in all, for each count of --users (default 1,2,4), by a\n"
            "  simulation of the pipeline: the plan it would choose, time to first token of a --prompt of N\n"
            "  tokens, and the bottleneck. --nodes measures the running `convoy stage` nodes (it loads their\n"
            "  layers as serve does) and prints their figures in FLEET.json's units; --fleet states them:\n"
            "    {\"nodes\": [{\"name\": \"desk\", \"mem_gb\": 64, \"gb_s\": 40, \"gflop_s\": 300,\n"
            "                \"rtt_ms\": 0.3, \"mbit_s\": 1000}, ...], \"back\": {\"rtt_ms\": 0.3, \"mbit_s\": 1000}}\n"
            "  (gb_s: the weights' bytes a node reads per second decoding; gflop_s: its multiply-adds per\n"
            "  second on a batch, or \"cores\": N for 250 each; rtt_ms, mbit_s: the link into it from the\n"
            "  node before, or the head;\n"
            "  \"back\": the last node's link to the head, default the last link; \"cpu\": 1, 2, ...: nodes\n"
            "  with the same number share one CPU). --cpus: the same for --nodes, a number per node.\n"
            "  --save: the measured figures as a fleet file (us_layer, us_row, us_rows at 1, 2, 4, 8, 16\n"
            "  rows, us_pos, hop_us, hop_us_per_row: microseconds), to plan again without measuring.\n"
            "  --spec-k K: speculation with K drafts a window, each accepted with rate --accept (default\n"
            "  0.6), --spec-windows D in flight per user (default 1); --drafts X: the drafts a window\n"
            "  carries on average (default K; prompt lookup finds none where the text does not repeat:\n"
            "  serve's /metrics say it, convoy_spec_drafted_total over convoy_spec_windows_total).\n"
            "  --dims: a model not at hand, its matrices of --type (default Q4_K), as `convoy synth\n"
            "  --dims` takes them.\n");
}

typedef struct plan_opts {
    const char *model_path, *dims, *type, *fleet_path, *users, *cpus, *save_path;
    convoy_forecast_params fp;
    float accept, drafts;
    convoy_ctx_params cp;
} plan_opts;

static int parse_options(plan_opts *o, int argc, char **argv)
{
    *o = (plan_opts){.users = "1,2,4", .type = "Q4_K", .accept = 0.6f, .cp = convoy_ctx_default_params(),
                     .fp = {.windows = 1, .tokens = 128}};
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &o->model_path},
        {"dims", 0, ARG_STR, .dst = &o->dims},
        {"type", 0, ARG_STR, .dst = &o->type},
        {"fleet", 0, ARG_STR, .dst = &o->fleet_path},
        {"cpus", 0, ARG_STR, .dst = &o->cpus},
        {"save", 0, ARG_STR, .dst = &o->save_path},
        {"users", 0, ARG_STR, .dst = &o->users},
        {"spec-k", 0, ARG_INT, .dst = &o->fp.spec_k, .lo = 0, .hi = 64},
        {"spec-windows", 0, ARG_INT, .dst = &o->fp.windows, .lo = 1, .hi = CONVOY_SPEC_WINDOWS_MAX},
        {"accept", 0, ARG_FLOAT, .dst = &o->accept},
        {"drafts", 0, ARG_FLOAT, .dst = &o->drafts},
        {"prompt", 0, ARG_INT, .dst = &o->fp.prompt, .lo = 0, .hi = 1 << 24},
        {"tokens", 0, ARG_INT, .dst = &o->fp.tokens, .lo = 1, .hi = 1 << 24},
        {0},
    };
    const arg_cmd cmd = {.name = "plan", .usage = usage, .opts = opts, .engine = &o->cp};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (!!o->model_path == !!o->dims || !!o->cp.nodes == !!o->fleet_path || (o->dims && o->cp.nodes) ||
        o->accept < 0 || o->accept > 1 || o->drafts < 0 || o->drafts > o->fp.spec_k) {
        fprintf(stderr, "convoy plan: give -m or --dims, and --nodes (live, with -m) or --fleet; --accept in 0..1, "
                        "--drafts in 0..K\n");
        usage(stderr);
        return 2;
    }
    o->fp.accept = o->accept;
    o->fp.drafts = o->drafts;
    o->fp.n_ctx = o->cp.n_ctx = o->cp.n_ctx > 0 ? o->cp.n_ctx : 4096;
    o->fp.n_batch = o->cp.n_batch;
    o->fp.kv_f16 = o->cp.kv_f16;
    o->fp.split = o->cp.split;
    return ARG_GO;
}

/* ---- the fleet ---- */

static double number(const json_t *obj, const char *key) { return json_number_value(json_object_get(obj, key)); }

static int fleet_node(const json_t *j, int i, convoy_fleet_node *n)
{
    if (!json_is_object(j) || number(j, "mem_gb") <= 0 || (number(j, "gb_s") <= 0 && number(j, "us_layer") <= 0)) {
        fprintf(stderr, "convoy plan: fleet node %d: an object with mem_gb and gb_s (or us_layer) > 0\n", i);
        return -1;
    }
    const char *name = json_string_value(json_object_get(j, "name"));
    const json_t *rows = json_object_get(j, "us_rows");
    *n = (convoy_fleet_node){.mem_budget = (uint64_t)(number(j, "mem_gb") * 1e9), .us_layer = number(j, "us_layer"),
                             .us_row = number(j, "us_row"), .us_pos = number(j, "us_pos"),
                             .hop_us = number(j, "hop_us"), .hop_us_per_row = number(j, "hop_us_per_row"),
                             .gb_s = number(j, "gb_s"), .gflop_s = number(j, "gflop_s"),
                             .rtt_ms = number(j, "rtt_ms"), .mbit_s = number(j, "mbit_s"),
                             .cores = (int)number(j, "cores"), .cpu = (int)number(j, "cpu")};
    for (size_t z = 0; z < CONVOY_FLEET_ROWS && json_array_size(rows) == CONVOY_FLEET_ROWS; z++)
        n->us_rows[z] = json_number_value(json_array_get(rows, z));
    if (name)
        snprintf(n->name, sizeof n->name, "%s", name);
    else
        snprintf(n->name, sizeof n->name, "node %d", i);
    return 0;
}

static int read_fleet(const char *path, convoy_fleet *f)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    const json_t *nodes = root ? json_object_get(root, "nodes") : NULL;
    int rc = -1;
    if (!root)
        fprintf(stderr, "convoy plan: %s: %s (line %d)\n", path, je.text, je.line);
    else if (!json_is_array(nodes) || json_array_size(nodes) < 1 || json_array_size(nodes) > CONVOY_MAX_NODES)
        fprintf(stderr, "convoy plan: %s: \"nodes\" must be an array of 1 to %d nodes\n", path, CONVOY_MAX_NODES);
    else {
        *f = (convoy_fleet){.n_nodes = (int)json_array_size(nodes)};
        rc = 0;
        for (int i = 0; rc == 0 && i < f->n_nodes; i++)
            rc = fleet_node(json_array_get(nodes, (size_t)i), i, &f->node[i]);
        const json_t *back = json_object_get(root, "back");
        f->back_rtt_ms = number(back, "rtt_ms");
        f->back_mbit_s = number(back, "mbit_s");
        f->back_us = number(back, "us");
        f->back_us_per_row = number(back, "us_per_row");
    }
    json_decref(root);
    return rc;
}

/* --save: the measured fleet as a fleet file (measured units), for --fleet. */
static int save_fleet(const char *path, const convoy_fleet *f)
{
    json_t *nodes = json_array();
    for (int i = 0; i < f->n_nodes; i++) {
        const convoy_fleet_node *n = &f->node[i];
        json_t *rows = json_array();
        for (int z = 0; z < CONVOY_FLEET_ROWS; z++)
            json_array_append_new(rows, json_real(n->us_rows[z]));
        json_array_append_new(nodes, json_pack("{s:s, s:f, s:f, s:f, s:o, s:f, s:f, s:f, s:i}", "name", n->name,
                                               "mem_gb", n->mem_budget / 1e9, "us_layer", n->us_layer, "us_row",
                                               n->us_row, "us_rows", rows, "us_pos", n->us_pos, "hop_us", n->hop_us,
                                               "hop_us_per_row", n->hop_us_per_row, "cpu", n->cpu));
    }
    json_t *root = json_pack("{s:o, s:{s:f, s:f}}", "nodes", nodes, "back", "us", f->back_us, "us_per_row",
                             f->back_us_per_row);
    const int rc = root ? json_dump_file(root, path, JSON_INDENT(2)) : -1;
    json_decref(root);
    if (rc)
        fprintf(stderr, "convoy plan: cannot write %s\n", path);
    return rc ? -1 : 0;
}

/* --cpus: a CPU number per node (0: its own). */
static int set_cpus(const char *list, convoy_fleet *f)
{
    const char *p = list;
    int i = 0;
    for (; *p && i < f->n_nodes; i++) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1000 || (*end && *end != ','))
            break;
        f->node[i].cpu = (int)v;
        p = *end ? end + 1 : end;
    }
    if (i == f->n_nodes && !*p)
        return 0;
    fprintf(stderr, "convoy plan: --cpus: a number 0..1000 for each of the %d nodes, not '%s'\n", f->n_nodes, list);
    return -1;
}

/* Opens the chain as serve would for the most users, measures it, prints
 * each node's figures. */
static int measure_fleet(plan_opts *o, convoy_model *m, int32_t max_users, convoy_fleet *f)
{
    char err[CONVOY_ERR_MAX];
    o->cp.n_slot = max_users;
    o->cp.rebalance = false;
    convoy_ctx *ctx = convoy_ctx_create(m, &o->cp, err, sizeof err);
    if (!ctx || convoy_fleet_measure(ctx, f, err, sizeof err)) {
        fprintf(stderr, "convoy plan: %s\n", err);
        convoy_ctx_free(ctx);
        return -1;
    }
    convoy_ctx_free(ctx);
    printf("measured (batches of 1-16 rows alone in flight):\n");
    printf("  %-24s %9s %9s %9s %9s %9s %9s %9s\n", "node", "mem_gb", "us_layer", "us_row", "us_pos", "gb_s",
           "gflop_s", "hop_us");
    double gb_s[CONVOY_MAX_NODES], gflop_s[CONVOY_MAX_NODES];
    convoy_fleet_rates(m, NULL, f, gb_s, gflop_s);
    for (int i = 0; i < f->n_nodes; i++) {
        const convoy_fleet_node *n = &f->node[i];
        printf("  %-24s %9.2f %9.1f %9.1f %9.3f %9.2f %9.1f %9.1f\n", n->name, n->mem_budget / 1e9, n->us_layer,
               n->us_row, n->us_pos, gb_s[i], gflop_s[i], n->hop_us);
    }
    if (o->cpus && set_cpus(o->cpus, f))
        return -1;
    return o->save_path ? save_fleet(o->save_path, f) : 0;
}

/* ---- the forecast ---- */

static void print_plan(const convoy_fleet *f, const convoy_forecast *r, char *buf, size_t len)
{
    size_t k = 0;
    for (int i = 0; i < f->n_nodes && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%d", i ? "," : "", r->last[i] - r->first[i]);
}

static void print_bottleneck(const convoy_fleet *f, const convoy_forecast *r)
{
    const int b = r->busiest;
    if (r->busy[b] >= 0.85)
        printf("node %s (busy %.0f%%)", f->node[b].name, 100 * r->busy[b]);
    else
        printf("round trip (busiest: %s at %.0f%%)", f->node[b].name, 100 * r->busy[b]);
}

/* "-", or "K=4,a=0.60,D=1" and ",x=X" when a window carries X drafts on average. */
static void speculation(const convoy_forecast_params *p, char *buf, size_t len)
{
    if (p->spec_k == 0)
        snprintf(buf, len, "-");
    else if (p->drafts > 0)
        snprintf(buf, len, "K=%d,a=%.2f,D=%d,x=%.1f", p->spec_k, p->accept, p->windows, p->drafts);
    else
        snprintf(buf, len, "K=%d,a=%.2f,D=%d", p->spec_k, p->accept, p->windows);
}

static int forecast_all(const plan_opts *o, const convoy_model *m, const convoy_synth_params *shape,
                        const convoy_fleet *f)
{
    printf("%-6s %-20s %-20s %11s %11s %9s  %s\n", "users", "speculation", "plan (layers)", "tok/s/user",
           "tok/s", "ttft_s", "bottleneck");
    for (const char *u = o->users; *u;) {
        char *end, err[CONVOY_ERR_MAX], plan[128], spec[48];
        const long users = strtol(u, &end, 10);
        if (end == u || users < 1 || users > 64 || (*end && *end != ',')) {
            fprintf(stderr, "convoy plan: --users: '%s' is not a list of counts 1..64\n", o->users);
            return -1;
        }
        u = *end ? end + 1 : end;
        convoy_forecast_params p = o->fp;
        p.users = (int32_t)users;
        convoy_forecast r;
        if (convoy_forecast_run(m, shape, f, &p, &r, err, sizeof err)) {
            fprintf(stderr, "convoy plan: %s\n", err);
            return -1;
        }
        print_plan(f, &r, plan, sizeof plan);
        speculation(&p, spec, sizeof spec);
        char ttft[24] = "-"; /* no --prompt: no first token to wait for */
        if (p.prompt > 0)
            snprintf(ttft, sizeof ttft, "%.3f", r.ttft_s);
        printf("%-6ld %-20s %-20s %11.2f %11.2f %9s  ", users, spec, plan, r.tok_s_user, r.tok_s, ttft);
        print_bottleneck(f, &r);
        printf("\n");
    }
    return 0;
}

static int32_t most_users(const char *list)
{
    int32_t most = 1;
    for (const char *u = list; *u;) {
        char *end;
        const long v = strtol(u, &end, 10);
        most = v > most && v <= 64 ? (int32_t)v : most;
        u = *end == ',' ? end + 1 : end == u ? u + strlen(u) : end;
    }
    return most;
}

static int shape_of(const char *dims, const char *type, convoy_synth_params *shape)
{
    *shape = convoy_synth_default_params();
    shape->type = type;
    return arg_dims(dims, shape);
}

int cmd_plan(int argc, char **argv)
{
    plan_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    char err[CONVOY_ERR_MAX];
    convoy_model *m = NULL;
    convoy_synth_params shape;
    convoy_fleet f;
    int rc = 1;
    if (o.model_path && !(m = convoy_model_load(o.model_path, err, sizeof err)))
        fprintf(stderr, "convoy plan: %s\n", err);
    else if (o.dims && shape_of(o.dims, o.type, &shape))
        ;
    else if (o.fleet_path ? read_fleet(o.fleet_path, &f) : measure_fleet(&o, m, most_users(o.users), &f))
        ;
    else
        rc = forecast_all(&o, m, m ? NULL : &shape, &f) ? 1 : 0;
    convoy_model_free(m);
    return rc;
}
