/* forecast.c: a fleet's predicted speed (include/convoy.h's fleets,
 * `convoy plan`).
 *
 * convoy_forecast_run: the plan's model (the file's tensor directory, or
 * a dense Llama counted from its dims), the plans the planner makes from
 * the fleet's budgets and speeds (pipe/plan.h: for one stream and for as
 * many as users), then the pipeline simulated serving the load with each
 * (pipe/simulate.h; each stage's work from the plan, each node's and
 * link's costs): the faster plan is the forecast.
 *
 * convoy_fleet_measure: a live chain's costs. Blocks of batches of
 * CALIB_ROWS rows, each alone in flight (convoy_step), the sizes in turn
 * for CALIB_MIN_NS and CALIB_ROUNDS rounds at least: every stage's time
 * over its work (in mean layers, the plan's unit) is one sample of its
 * cost at that many rows. One row near position CALIB_FAR against one near
 * 0 gives what each position of context adds; with attention's part taken
 * out, a least-squares line through one row's mean (decode's cost, exact)
 * and the others' gives each further row's. Means over several CPU
 * scheduling periods (100 ms), less the slowest and the fastest tenth of
 * the samples (a stalled batch says nothing of the costs). The round trip
 * less the stages' times is the hops' and the head's, shared by the hops. */
#include "engine/forecast.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "pipe/plan.h"
#include "pipe/simulate.h"

#define CALIB_ROUNDS 8
#define CALIB_MIN_NS 1500000000ll
#define CALIB_FAR 256 /* the position whose rows measure attention's growth */
#define CALIB_BLOCK 6 /* batches of one size in a row */
static const int32_t CALIB_ROWS[] = CV_SIM_ROW_SIZES;
#define CALIB_SIZES CV_SIM_ROWS
static_assert(CONVOY_FLEET_ROWS == CV_SIM_ROWS, "a fleet node's measured sizes are the simulation's");

/* ---- the model ---- */

/* One matrix of `rows` rows of n_in elements in type t, its bytes. */
static uint64_t matrix_bytes(cv_type t, int64_t rows, int64_t n_in) { return (uint64_t)rows * cv_row_bytes(t, n_in); }

/* A dense Llama of shape's dims: each layer's seven matrices and two norms,
 * the output matrix, the KV cache of every slot. */
static int shape_model(const struct convoy_synth_params *shape, const cv_plan_session *s, uint64_t *layer_bytes,
                       cv_plan_model *pm, char *err, size_t errlen)
{
    const int t = cv_type_from_name(shape->type ? shape->type : "Q4_K");
    if (t < 0)
        return cv_errf(err, errlen, "unknown type '%s'", shape->type);
    const int64_t e = shape->n_embd, hd = shape->head_dim ? shape->head_dim : e / shape->n_head;
    const int64_t q = shape->n_head * hd, kv = shape->n_head_kv * hd;
    const uint64_t layer = matrix_bytes(t, q, e) + 2 * matrix_bytes(t, kv, e) + matrix_bytes(t, e, q) +
                           2 * matrix_bytes(t, shape->n_ff, e) + matrix_bytes(t, e, shape->n_ff) + 2 * 4 * (uint64_t)e;
    for (int64_t l = 0; l < shape->n_layer; l++)
        layer_bytes[l] = layer;
    const uint64_t output = matrix_bytes(t, shape->n_vocab, e);
    const uint64_t logits = 4 * (uint64_t)shape->n_vocab * (uint64_t)s->n_batch;
    *pm = (cv_plan_model){.n_layer = (int32_t)shape->n_layer, .layer_bytes = layer_bytes,
                          .kv_bytes_per_layer = (uint64_t)s->n_ctx * (uint64_t)s->n_slot * 2 * (uint64_t)kv *
                                                (s->kv_f16 ? 2 : 4),
                          .output_bytes = output + logits, .output_work_bytes = output};
    return 0;
}

static int plan_model(const convoy_model *m, const struct convoy_synth_params *shape, const cv_plan_session *s,
                      uint64_t **layer_bytes, cv_plan_model *pm, char *err, size_t errlen)
{
    const int64_t n_layer = m ? cv_engine_model_meta(m)->hp.n_layer : shape->n_layer;
    if (n_layer < 1 || n_layer > 65536 || (!m && (shape->n_embd < 1 || shape->n_head < 1 || shape->n_head_kv < 1 ||
                                                   shape->n_ff < 1 || shape->n_vocab < 1)))
        return cv_errf(err, errlen, "the model's dims are not a Llama's (n_embd, n_layer, n_head, n_head_kv, n_ff, "
                                    "n_vocab all > 0)");
    *layer_bytes = cv_malloc(sizeof(uint64_t) * (size_t)n_layer);
    if (!*layer_bytes)
        return cv_errf(err, errlen, "out of memory");
    if (!m)
        return shape_model(shape, s, *layer_bytes, pm, err, errlen);
    cv_plan_model_of(cv_engine_model_meta(m), s, *layer_bytes, pm);
    return 0;
}

/* ---- stated figures ---- */

/* The model's dims, from its file or its shape (a dense Llama). */
typedef struct dims {
    double n_embd, n_head, n_head_kv, head_dim, n_ff;
    double n_expert_used, n_ff_exp, n_ff_shared; /* a mixture of experts; 0 for a dense model */
} dims;

static dims dims_of(const convoy_model *m, const struct convoy_synth_params *shape)
{
    if (!m)
        return (dims){.n_embd = (double)shape->n_embd, .n_head = (double)shape->n_head,
                      .n_head_kv = (double)shape->n_head_kv, .n_ff = (double)shape->n_ff,
                      .head_dim = shape->head_dim ? (double)shape->head_dim
                                                  : (double)shape->n_embd / (double)shape->n_head};
    const cv_llama_hparams *hp = &cv_engine_model_meta(m)->hp;
    return (dims){.n_embd = hp->n_embd, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                  .n_ff = hp->n_ff, .n_expert_used = hp->n_expert_used, .n_ff_exp = hp->n_ff_exp,
                  .n_ff_shared = hp->arch == CV_ARCH_QWEN2MOE ? hp->n_ff : 0};
}

/* A layer's multiply-adds per token: attention's four matrices and the
 * feed-forward's three (a mixture of experts': the routed experts' and
 * the shared one's). */
static double layer_params(const dims *d)
{
    const double ffn = d->n_expert_used > 0 ? 3 * d->n_embd * (d->n_expert_used * d->n_ff_exp + d->n_ff_shared)
                                            : 3 * d->n_embd * d->n_ff;
    return d->n_embd * d->head_dim * (2 * d->n_head + 2 * d->n_head_kv) + ffn;
}

/* A FORWARD row: its activations (lossless F32) and its token header; a
 * RESULT row is about its header alone. */
#define RESULT_ROW_BYTES 16.0
static double forward_row_bytes(double n_embd) { return 4 * n_embd + sizeof(cv_fwd_token); }

/* A layer's KV cache bytes per position, which attention reads for each row. */
static double kv_position_bytes(const dims *d, bool kv_f16)
{
    return 2 * d->n_head_kv * d->head_dim * (kv_f16 ? 2 : 4);
}

/* The nodes given by stated figures, in measured units. */
static void fill_stated(const dims *d, const cv_plan_model *pm, bool kv_f16, convoy_fleet *f)
{
    const double bytes = cv_plan_mean_layer_bytes(pm), flops = 2 * layer_params(d);
    const double kv_bytes = kv_position_bytes(d, kv_f16), row_bits = 8 * forward_row_bytes(d->n_embd);
    for (int i = 0; i < f->n_nodes; i++) {
        convoy_fleet_node *n = &f->node[i];
        if (n->us_layer > 0)
            continue;
        n->us_layer = n->gb_s > 0 ? bytes / (n->gb_s * 1e3) : 0;
        const double gflop_s = n->gflop_s > 0 ? n->gflop_s : n->cores * CONVOY_FLEET_GFLOPS_PER_CORE;
        n->us_row = gflop_s > 0 ? flops / (gflop_s * 1e3) : 0;
        n->us_pos = n->gb_s > 0 ? kv_bytes / (n->gb_s * 1e3) : 0;
        n->hop_us = n->rtt_ms * 1e3 / 2;
        n->hop_us_per_row = n->mbit_s > 0 ? row_bits / n->mbit_s : 0;
    }
    if (f->back_us == 0 && f->back_us_per_row == 0 && f->n_nodes > 0) {
        const convoy_fleet_node *last = &f->node[f->n_nodes - 1];
        const double rtt = f->back_rtt_ms > 0 ? f->back_rtt_ms : last->rtt_ms;
        const double mbit = f->back_mbit_s > 0 ? f->back_mbit_s : last->mbit_s;
        f->back_us = rtt * 1e3 / 2;
        f->back_us_per_row = mbit > 0 ? 8 * RESULT_ROW_BYTES / mbit : 0;
    }
}

void convoy_fleet_rates(const convoy_model *m, const struct convoy_synth_params *shape, const convoy_fleet *f,
                        double *gb_s, double *gflop_s)
{
    const cv_plan_session s = {.n_ctx = 1, .n_slot = 1, .n_batch = 1};
    uint64_t *layer_bytes = NULL;
    cv_plan_model pm;
    char err[CV_ERRLEN];
    const bool known = plan_model(m, shape, &s, &layer_bytes, &pm, err, sizeof err) == 0;
    const double bytes = known ? cv_plan_mean_layer_bytes(&pm) : 0;
    const dims d = dims_of(m, shape);
    for (int i = 0; i < f->n_nodes; i++) {
        const convoy_fleet_node *n = &f->node[i];
        gb_s[i] = known && n->us_layer > 0 ? bytes / (n->us_layer * 1e3) : 0;
        gflop_s[i] = known && n->us_row > 0 ? 2 * layer_params(&d) / (n->us_row * 1e3) : 0;
    }
    cv_free(layer_bytes);
}

/* ---- the plan and the simulated chain ---- */

static int plan_fleet(const cv_plan_model *pm, const convoy_fleet *f, const convoy_forecast_params *p,
                      int32_t streams, cv_plan_result *plan, char *err, size_t errlen)
{
    cv_plan_node nodes[CV_CHAIN_MAX_NODES];
    int32_t split[CV_CHAIN_MAX_NODES];
    if (f->n_nodes < 1 || f->n_nodes > CV_CHAIN_MAX_NODES)
        return cv_errf(err, errlen, "a fleet has 1 to %d nodes, not %d", CV_CHAIN_MAX_NODES, f->n_nodes);
    for (int i = 0; i < f->n_nodes; i++)
        nodes[i] = (cv_plan_node){.name = f->node[i].name, .mem_budget = f->node[i].mem_budget,
                                  .us_per_layer_token = f->node[i].us_layer};
    if (p->split && cv_plan_parse_split(p->split, f->n_nodes, split, err, errlen))
        return -1;
    return cv_plan_layers(pm, f->n_nodes, nodes, p->split ? split : NULL, streams, plan, err, errlen);
}

/* The plan's stages (the nodes with layers) with their costs; node[s] is
 * stage s's node. A left-out node's link is taken to be the next one's. */
static void sim_chain_of(const cv_plan_model *pm, const convoy_fleet *f, const cv_plan_result *plan,
                         cv_sim_chain *c, int *node)
{
    *c = (cv_sim_chain){0};
    for (int i = 0; i < f->n_nodes; i++) {
        if (plan->last[i] <= plan->first[i])
            continue;
        const convoy_fleet_node *n = &f->node[i];
        c->stage[c->n_stages] = (cv_sim_stage){.work = cv_plan_stage_work(pm, plan->first[i], plan->last[i]),
                                               .layers = plan->last[i] - plan->first[i],
                                               .us_layer = n->us_layer, .us_row = n->us_row,
                                               .us_pos = n->us_pos, .cpu = n->cpu};
        memcpy(c->stage[c->n_stages].us_rows, n->us_rows, sizeof n->us_rows);
        c->hop[c->n_stages] = (cv_sim_hop){.us = n->hop_us, .us_per_row = n->hop_us_per_row};
        node[c->n_stages++] = i;
    }
    c->hop[c->n_stages] = (cv_sim_hop){.us = f->back_us, .us_per_row = f->back_us_per_row};
}

/* serve's pipeline: a batch per stage in flight, or a batch per window
 * (at least) when speculating with windows. */
static cv_sim_load sim_load(const convoy_forecast_params *p, int n_stages)
{
    const int32_t windows = p->spec_k > 0 && p->windows > 1 ? p->windows : 1;
    return (cv_sim_load){.users = p->users > 0 ? p->users : 1, .depth = n_stages > windows ? n_stages : windows,
                         .spec_k = p->spec_k, .drafts = p->drafts > 0 ? p->drafts : p->spec_k,
                         .windows = windows, .accept = p->accept,
                         .tokens = p->tokens > 0 ? p->tokens : 128, .prompt = p->prompt,
                         .n_batch = p->n_batch > 0 ? p->n_batch : 512};
}

/* A plan's forecast: the chain simulated serving the load. */
static void simulate_plan(const cv_plan_model *pm, const convoy_fleet *f, const convoy_forecast_params *p,
                          const cv_plan_result *plan, convoy_forecast *out)
{
    cv_sim_chain c;
    int node[CV_CHAIN_MAX_NODES];
    sim_chain_of(pm, f, plan, &c, node);
    const cv_sim_load load = sim_load(p, c.n_stages);
    cv_sim_result r;
    cv_sim_run(&c, &load, &r);
    *out = (convoy_forecast){.tok_s = r.tok_s, .tok_s_user = r.tok_s_user, .ttft_s = r.ttft_s,
                             .busiest = node[r.busiest]};
    memcpy(out->first, plan->first, sizeof out->first);
    memcpy(out->last, plan->last, sizeof out->last);
    for (int k = 0; k < c.n_stages; k++)
        out->busy[node[k]] = r.busy[k];
}

/* Up to this many nodes every subset of them is planned; more, the fleet
 * and the fleet less each node. */
#define FORECAST_SUBSETS_MAX_NODES 6

/* The plan of the nodes in `used` (a bit each) for `streams`, simulated
 * into *out when faster than it (or out->tok_s < 0); -1 when they
 * cannot hold the model. */
static int try_plan(const cv_plan_model *pm, const convoy_fleet *f, const convoy_forecast_params *p, uint32_t used,
                    int32_t streams, convoy_forecast *out, char *err, size_t errlen)
{
    convoy_fleet some = *f;
    cv_plan_result plan;
    convoy_forecast r;
    for (int i = 0; i < f->n_nodes; i++)
        if (!(used >> i & 1))
            some.node[i].mem_budget = 0; /* left out */
    if (plan_fleet(pm, &some, p, streams, &plan, err, errlen))
        return -1;
    simulate_plan(pm, f, p, &plan, &r);
    if (r.tok_s > out->tok_s)
        *out = r;
    return 0;
}

/* The planner's plans (for one stream, and for every user: its two
 * objectives, a token's time through the stages and the slowest stage's)
 * of the fleet and of subsets of it, each simulated: the fastest is the
 * forecast. A split is taken as it is. */
static int forecast_best(const cv_plan_model *pm, const convoy_fleet *f, const convoy_forecast_params *p,
                         convoy_forecast *out, char *err, size_t errlen)
{
    const uint32_t all = (1u << f->n_nodes) - 1;
    out->tok_s = -1;
    if (try_plan(pm, f, p, all, 1, out, err, errlen))
        return -1;
    if (p->split)
        return 0;
    char ignored[CV_ERRLEN];
    const bool every = f->n_nodes <= FORECAST_SUBSETS_MAX_NODES;
    for (uint32_t used = all; used > 0; used--) {
        const bool less_one = (all & ~used) && !((all & ~used) & ((all & ~used) - 1));
        if (used != all && !every && !less_one)
            continue;
        for (int32_t streams = 1; streams <= p->users; streams += p->users > 1 ? p->users - 1 : 1)
            if (used != all || streams != 1) /* tried first */
                try_plan(pm, f, p, used, streams, out, ignored, sizeof ignored);
    }
    return 0;
}

int convoy_forecast_run(const convoy_model *m, const struct convoy_synth_params *shape, const convoy_fleet *f,
                        const convoy_forecast_params *p, convoy_forecast *out, char *err, size_t errlen)
{
    const cv_plan_session s = {.n_ctx = p->n_ctx > 0 ? p->n_ctx : 4096, .n_slot = p->users > 0 ? p->users : 1,
                               .n_batch = p->n_batch > 0 ? p->n_batch : 512, .kv_f16 = p->kv_f16,
                               .act_type = CV_ACT_F32};
    uint64_t *layer_bytes = NULL;
    cv_plan_model pm;
    convoy_fleet fleet = *f;
    memset(out, 0, sizeof *out);
    int rc = plan_model(m, shape, &s, &layer_bytes, &pm, err, errlen);
    if (rc == 0) {
        const dims d = dims_of(m, shape);
        fill_stated(&d, &pm, p->kv_f16, &fleet);
        rc = forecast_best(&pm, &fleet, p, out, err, errlen);
    }
    cv_free(layer_bytes);
    return rc;
}

/* ---- calibration of a live chain ---- */

/* The samples: sizes [0, CALIB_SIZES) near position 0, then one row near
 * position far (at CALIB_FAR_AT); each node's stage time, then (at
 * CALIB_REST) the round trip less the stages', microseconds; and each
 * batch's positions summed. */
#define CALIB_FAR_AT CALIB_SIZES
#define CALIB_REST CONVOY_MAX_NODES
#define CALIB_MAX_SAMPLES 512
typedef struct calib {
    double us[CALIB_SIZES + 1][CONVOY_MAX_NODES + 1][CALIB_MAX_SAMPLES];
    double pos_sum[CALIB_SIZES + 1][CALIB_MAX_SAMPLES];
    int n[CALIB_SIZES + 1];
} calib;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The mean of the middle 80% of v[0, n) (sorts them): a stalled batch (a
 * packet the kernel resent, the process descheduled) does not move it. */
static double trimmed_mean(double *v, int n)
{
    const int cut = n / 10;
    double sum = 0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    for (int i = cut; i < n - cut; i++)
        sum += v[i];
    return n - 2 * cut > 0 ? sum / (n - 2 * cut) : 0;
}

static double mean(const double *v, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    return n > 0 ? sum / n : 0;
}

/* The least-squares line y = a + b (x - 1) through (x[k], y[k]) that
 * passes through the first point (one row: decode's cost, exact). */
static void fit(const double *x, const double *y, int n, double *a, double *b)
{
    double sxx = 0, sxy = 0;
    *a = y[0];
    for (int k = 1; k < n; k++) {
        sxx += (x[k] - 1) * (x[k] - 1);
        sxy += (x[k] - 1) * (y[k] - *a);
    }
    *b = sxx > 0 && sxy > 0 ? sxy / sxx : 0;
}

/* A batch of `rows` prompt tokens of slot 0 from position pos0 (the slot
 * cut back to it), alone in flight; its stages' times and round trip
 * into sample set z (-1: not counted). */
static int calib_batch(convoy_ctx *c, int32_t pos0, int32_t rows, calib *cb, int z, char *err, size_t errlen)
{
    enum { MAX_ROWS = 16 };
    int32_t tok[MAX_ROWS], pos[MAX_ROWS], seq[MAX_ROWS], out[MAX_ROWS];
    uint8_t want[MAX_ROWS];
    for (int32_t i = 0; i < rows; i++) {
        tok[i] = 1 + (pos0 + i) % 64;
        pos[i] = pos0 + i;
        seq[i] = 0;
        want[i] = i == rows - 1 ? CONVOY_WANT_SAMPLE : CONVOY_WANT_NONE;
    }
    const convoy_batch b = {.n_tokens = rows, .token = tok, .pos = pos, .seq = seq, .want = want};
    if (convoy_seq_truncate(c, 0, pos0, err, errlen) || convoy_step(c, &b, out, err, errlen))
        return -1;
    if (z < 0 || cb->n[z] == CALIB_MAX_SAMPLES)
        return 0;
    convoy_node_costs nc;
    convoy_ctx_get_node_costs(c, &nc);
    double stages = 0;
    for (int i = 0; i < nc.n_nodes; i++) {
        stages += nc.node[i].us_last;
        cb->us[z][i][cb->n[z]] = nc.node[i].us_last;
    }
    cb->us[z][CALIB_REST][cb->n[z]] = nc.us_last_round_trip > stages ? nc.us_last_round_trip - stages : 0;
    cb->pos_sum[z][cb->n[z]++] = rows * (double)pos0 + rows * (rows - 1) / 2.0;
    return 0;
}

/* Series k of sample set z less attention's part (us_pos per layer and
 * position, over `layers`), trimmed and averaged. */
static double set_mean(calib *cb, int z, int k, double us_pos, int32_t layers)
{
    double v[CALIB_MAX_SAMPLES];
    for (int s = 0; s < cb->n[z]; s++)
        v[s] = cb->us[z][k][s] - us_pos * layers * cb->pos_sum[z][s];
    return trimmed_mean(v, cb->n[z]);
}

/* Node i's costs: what each position adds (one row far into the context
 * against one near its start), then the line through its times per mean
 * layer at each size, attention's part taken out. */
static void node_line(const convoy_node_costs *nc, calib *cb, int i, convoy_fleet_node *n)
{
    const int32_t layers = nc->node[i].layers;
    const double pos_far = mean(cb->pos_sum[CALIB_FAR_AT], cb->n[CALIB_FAR_AT]);
    const double pos_near = mean(cb->pos_sum[0], cb->n[0]);
    const double more = set_mean(cb, CALIB_FAR_AT, i, 0, layers) - set_mean(cb, 0, i, 0, layers);
    n->us_pos = more > 0 && pos_far > pos_near ? more / layers / (pos_far - pos_near) : 0;
    double x[CALIB_SIZES], y[CALIB_SIZES];
    for (int z = 0; z < CALIB_SIZES; z++) {
        x[z] = CALIB_ROWS[z];
        y[z] = n->us_rows[z] = set_mean(cb, z, i, n->us_pos, layers) / nc->node[i].work;
    }
    fit(x, y, CALIB_SIZES, &n->us_layer, &n->us_row);
}

/* The fleet: each stage's costs; a node left out at its probe times what
 * the measured nodes' times are to their probes, its other figures in
 * proportion to the measured nodes'; the rest shared by the hops. */
static void fleet_of(const convoy_node_costs *nc, calib *cb, convoy_fleet *f)
{
    double to_probe = 0, ratio = 0, pos = 0, rows[CALIB_SIZES] = {0};
    int measured = 0;
    *f = (convoy_fleet){.n_nodes = nc->n_nodes};
    for (int i = 0; i < nc->n_nodes; i++) {
        convoy_fleet_node *n = &f->node[i];
        snprintf(n->name, sizeof n->name, "%s", nc->node[i].addr);
        n->mem_budget = nc->node[i].mem_budget;
        if (!nc->node[i].layers)
            continue;
        node_line(nc, cb, i, n);
        to_probe += nc->node[i].us_probed > 0 ? n->us_layer / nc->node[i].us_probed : 1;
        ratio += n->us_layer > 0 ? n->us_row / n->us_layer : 0;
        pos += n->us_layer > 0 ? n->us_pos / n->us_layer : 0;
        for (int z = 0; z < CALIB_SIZES; z++)
            rows[z] += n->us_layer > 0 ? n->us_rows[z] / n->us_layer : 0;
        measured++;
    }
    for (int i = 0; i < nc->n_nodes; i++)
        if (!nc->node[i].layers && measured) {
            convoy_fleet_node *n = &f->node[i];
            n->us_layer = nc->node[i].us_probed * to_probe / measured;
            n->us_row = n->us_layer * ratio / measured;
            n->us_pos = n->us_layer * pos / measured;
            for (int z = 0; z < CALIB_SIZES; z++)
                n->us_rows[z] = n->us_layer * rows[z] / measured;
        }
    double x[CALIB_SIZES], y[CALIB_SIZES], a, b;
    for (int z = 0; z < CALIB_SIZES; z++) {
        x[z] = CALIB_ROWS[z];
        y[z] = set_mean(cb, z, CALIB_REST, 0, 0);
    }
    fit(x, y, CALIB_SIZES, &a, &b);
    const int hops = measured + 1;
    const double latency = a > b ? (a - b) / hops : 0; /* the line at no rows */
    for (int i = 0; i < nc->n_nodes; i++) {
        f->node[i].hop_us = latency;
        f->node[i].hop_us_per_row = b / hops;
    }
    f->back_us = latency;
    f->back_us_per_row = b / hops;
}

/* A block: CALIB_BLOCK batches of `rows` one after another from position
 * pos0, as decoding or a prefill runs them; the first, which follows
 * batches of another size (whose buffers the caches hold), is not counted. */
static int calib_block(convoy_ctx *c, int32_t pos0, int32_t rows, calib *cb, int z, char *err, size_t errlen)
{
    int rc = 0;
    for (int k = 0; rc == 0 && k < CALIB_BLOCK; k++)
        rc = calib_batch(c, pos0 + k * rows, rows, cb, k == 0 ? -1 : z, err, errlen);
    return rc;
}

/* Blocks of each size near position 0 in turn, for CALIB_MIN_NS and
 * CALIB_ROUNDS rounds at least; then blocks of one row near position far
 * (the context prefilled first), a fifth as long. */
static int calibrate(convoy_ctx *c, calib *cb, int32_t far, char *err, size_t errlen)
{
    int rc = 0;
    int64_t t0 = (int64_t)cv_now_ns();
    for (int k = 0; rc == 0 && (k < CALIB_ROUNDS || (int64_t)cv_now_ns() - t0 < CALIB_MIN_NS); k++)
        for (int z = 0; rc == 0 && z < CALIB_SIZES; z++)
            rc = calib_block(c, 0, CALIB_ROWS[z], cb, z, err, errlen);
    for (int32_t p = 0; rc == 0 && p < far; p += 16)
        rc = calib_batch(c, p, far - p < 16 ? far - p : 16, cb, -1, err, errlen);
    t0 = (int64_t)cv_now_ns();
    for (int k = 0; rc == 0 && (k < CALIB_ROUNDS || (int64_t)cv_now_ns() - t0 < CALIB_MIN_NS / CALIB_SIZES); k++)
        rc = calib_block(c, far, 1, cb, CALIB_FAR_AT, err, errlen);
    return rc;
}

int convoy_fleet_measure(convoy_ctx *c, convoy_fleet *out, char *err, size_t errlen)
{
    convoy_node_costs nc;
    convoy_ctx_get_node_costs(c, &nc);
    if (nc.n_nodes == 0)
        return cv_errf(err, errlen, "no pipeline to measure: give --nodes");
    const int32_t n_ctx = convoy_ctx_n_ctx(c);
    if (n_ctx < 2 * CALIB_BLOCK * 16)
        return cv_errf(err, errlen, "a context of %d positions is too short to measure in (%d at least)", n_ctx,
                       2 * CALIB_BLOCK * 16);
    calib *cb = cv_calloc(1, sizeof *cb);
    if (!cb)
        return cv_errf(err, errlen, "out of memory");
    const int32_t far = n_ctx / 2 < CALIB_FAR ? n_ctx / 2 : CALIB_FAR;
    int rc = convoy_seq_free(c, 0, err, errlen) || calibrate(c, cb, far, err, errlen) ? -1 : 0;
    if (rc == 0) {
        fleet_of(&nc, cb, out);
        rc = convoy_seq_free(c, 0, err, errlen);
    }
    cv_free(cb);
    return rc;
}
