/* plan.c: the layer planner (see plan.h). Counts start proportional to
 * speed (largest remainders get the leftover layers), the output matrix
 * counting as work of the node that holds it (in layers of the
 * average size, since decoding reads it once per token as it reads a
 * layer); a node over its memory capacity is pinned at capacity and the
 * rest is shared again among the others, until every count fits. The node
 * that ends up last must also hold the output matrix, so capacities are
 * recomputed when that changes. */
#include "pipe/plan.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/span.h"
#include "model/experts.h"
#include "model/fingerprint.h"
#include "pipe/proto.h"

/* Each round of sharing pins a node or moves the output matrix, and a
 * plan settles in a few; this bounds a plan that would not. */
#define PLAN_MAX_ROUNDS (16 * CV_CHAIN_MAX_NODES)

/* The expert cache of layers [l0, l1) on a node of `budget` bytes (0: no
 * limit) whose other bytes are `rest`: a slot for every expert, or as
 * many as the budget leaves, at least the fewest a batch needs
 * (model/experts.h); 0 for a dense model. */
static uint64_t cache_bytes(const cv_plan_model *m, uint64_t budget, int32_t l0, int32_t l1, uint64_t rest)
{
    if (!m->expert_slot_bytes || l1 <= l0)
        return 0;
    const uint64_t all = (uint64_t)(l1 - l0) * m->layer_experts, fixed = rest + m->expert_fixed_bytes;
    uint64_t slots = budget == 0 ? all : budget > fixed ? (budget - fixed) / m->expert_slot_bytes : 0;
    slots = slots < all ? slots : all;
    slots = slots > m->min_expert_slots ? slots : m->min_expert_slots;
    return m->expert_fixed_bytes + slots * m->expert_slot_bytes;
}

/* What layers [l0, l1) take besides the expert cache (and the output
 * matrix's bytes). */
static uint64_t layers_bytes(const cv_plan_model *m, const cv_plan_node *node, int32_t l0, int32_t l1)
{
    uint64_t b = m->fixed_bytes + node->own_bytes;
    for (int32_t l = l0; l < l1; l++)
        b += m->layer_bytes[l] + m->kv_bytes_per_layer;
    return b;
}

/* Layers [l0, l0 + n) fit in budget? (first-fit from l0, in order) */
static int32_t capacity(const cv_plan_model *m, const cv_plan_node *node, int32_t l0, uint64_t budget)
{
    int32_t n = 0;
    for (; l0 + n < m->n_layer; n++) {
        const uint64_t rest = layers_bytes(m, node, l0, l0 + n + 1);
        if (rest + cache_bytes(m, budget, l0, l0 + n + 1, rest) > budget)
            break;
    }
    return layers_bytes(m, node, l0, l0) > budget ? 0 : n;
}

uint64_t cv_plan_range_bytes(const cv_plan_model *m, const cv_plan_node *node, int32_t l0, int32_t l1)
{
    const uint64_t rest = layers_bytes(m, node, l0, l1) + (l1 == m->n_layer ? m->output_bytes : 0);
    return rest + cache_bytes(m, node->mem_budget, l0, l1, rest);
}

int32_t cv_plan_expert_slots(const cv_plan_model *m, const cv_plan_node *node, int32_t l0, int32_t l1)
{
    const uint64_t rest = layers_bytes(m, node, l0, l1) + (l1 == m->n_layer ? m->output_bytes : 0);
    const uint64_t cache = cache_bytes(m, node->mem_budget, l0, l1, rest);
    return cache ? (int32_t)((cache - m->expert_fixed_bytes) / m->expert_slot_bytes) : 0;
}

/* The last node with layers, the one that holds the output matrix; -1 when
 * none has any. */
static int last_with_layers(const int32_t *count, int n)
{
    int last = -1;
    for (int i = 0; i < n; i++)
        if (count[i] > 0)
            last = i;
    return last;
}

/* "node I", or the node's name, into buf. */
static const char *node_name(const cv_plan_node *nodes, int i, char *buf, size_t len)
{
    snprintf(buf, len, "node %d", i);
    return nodes[i].name ? nodes[i].name : buf;
}

/* The layers node holds: [0, n_layer) unless its file is a shard. */
static void held(const cv_plan_model *m, const cv_plan_node *node, int32_t *lo, int32_t *hi)
{
    *lo = node->held_l1 ? node->held_l0 : 0;
    *hi = node->held_l1 ? node->held_l1 : m->n_layer;
}

static int check(const cv_plan_model *m, int n, const cv_plan_node *nodes, const int32_t *count, char *err,
                 size_t errlen)
{
    int32_t l0 = 0, lo, hi;
    char name[32];
    for (int i = 0; i < n; i++) {
        const uint64_t need = cv_plan_range_bytes(m, &nodes[i], l0, l0 + count[i]);
        held(m, &nodes[i], &lo, &hi);
        if (count[i] > 0 && (l0 < lo || l0 + count[i] > hi))
            return cv_errf(err, errlen, "%s holds layers [%d, %d) only (its model file is a shard), the plan gives it "
                                        "layers [%d, %d)",
                           node_name(nodes, i, name, sizeof name), lo, hi, l0, l0 + count[i]);
        if (count[i] > 0 && need > nodes[i].mem_budget)
            return cv_errf(err, errlen, "%s: layers [%d, %d) need %.2f GB, its budget is %.2f GB",
                           node_name(nodes, i, name, sizeof name), l0, l0 + count[i], need / 1e9,
                           nodes[i].mem_budget / 1e9);
        l0 += count[i];
    }
    if (l0 != m->n_layer)
        return cv_errf(err, errlen, "the split covers %d layers, the model has %d", l0, m->n_layer);
    return 0;
}

/* Whether every node holds every layer (no shards). */
static bool all_whole(const cv_plan_model *m, int n, const cv_plan_node *nodes)
{
    int32_t lo, hi;
    for (int i = 0; i < n; i++) {
        held(m, &nodes[i], &lo, &hi);
        if (lo > 0 || hi < m->n_layer)
            return false;
    }
    return true;
}

/* Nodes whose files hold parts of the model (shards): the plan follows the
 * files in chain order. Each node takes the layers from where the chain
 * stands up to where the next node's file starts, or to the end of its own
 * when it is the last or the next starts further on than it ends; none
 * when the next node's file starts where the chain stands or before (the
 * next can take them). A layer no node reaches in chain order is an
 * error naming where the chain stops. */
static int plan_by_ranges(const cv_plan_model *m, int n, const cv_plan_node *nodes, int32_t *count, char *err,
                          size_t errlen)
{
    int32_t l0 = 0, lo, hi, next_lo, next_hi;
    char name[32];
    for (int i = 0; i < n; i++) {
        count[i] = 0;
        held(m, &nodes[i], &lo, &hi);
        if (l0 >= hi)
            continue;
        int32_t end = hi;
        if (i + 1 < n) {
            held(m, &nodes[i + 1], &next_lo, &next_hi);
            end = next_lo <= l0 ? l0 : next_lo < hi ? next_lo : hi;
        }
        if (end > l0 && lo > l0)
            return cv_errf(err, errlen, "%s holds layers [%d, %d), but the nodes before it in the chain reach layer %d "
                                        "only: no node holds layers [%d, %d) in chain order",
                           node_name(nodes, i, name, sizeof name), lo, hi, l0, l0, lo);
        count[i] = end - l0;
        l0 = end;
    }
    if (l0 < m->n_layer)
        return cv_errf(err, errlen, "the nodes hold layers [0, %d) in chain order, the model has %d: no node after "
                                    "them holds layers [%d, %d)",
                       l0, m->n_layer, l0, m->n_layer);
    return 0;
}

int cv_plan_parse_split(const char *text, int n_nodes, int32_t *split, char *err, size_t errlen)
{
    const char *p = text;
    int n = 0;
    for (; *p && n < CV_CHAIN_MAX_NODES; n++) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < 0 || v > 65536)
            return cv_errf(err, errlen, "--split: '%.*s' is not a layer count", (int)strcspn(p, ","), p);
        if (n < n_nodes)
            split[n] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n != n_nodes || *p)
        return cv_errf(err, errlen, "--split gives %d layer counts, the chain has %d nodes", n, n_nodes);
    return 0;
}

/* --split: the counts as given. */
static int take_split(const int32_t *split, int n, int32_t *count, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        if (split[i] < 0)
            return cv_errf(err, errlen, "--split: negative layer count for node %d", i);
        count[i] = split[i];
    }
    return 0;
}

/* The planner's state while it shares the layers by speed. */
typedef struct shares {
    const cv_plan_model *m;
    const cv_plan_node *nodes;
    int n;
    double w[CV_CHAIN_MAX_NODES];    /* speed: 1 / us_per_layer_token */
    bool pinned[CV_CHAIN_MAX_NODES]; /* held at its memory capacity */
    int32_t count[CV_CHAIN_MAX_NODES];
    int last_node;                   /* holds the output matrix: the last node with layers */
    double output_work;              /* the output matrix, in layers of the average size */
} shares;

/* Gives `over` layers that rounding down left, one each to the largest
 * remainders; false when no free node is left to take them. */
static bool give_remainders(shares *s, double *rem, int32_t over)
{
    for (; over > 0; over--) {
        int best = -1;
        for (int i = 0; i < s->n; i++)
            if (!s->pinned[i] && (best < 0 || rem[i] > rem[best]))
                best = i;
        if (best < 0)
            return false;
        s->count[best]++;
        rem[best] = -1;
    }
    return true;
}

/* Shares the layers the pinned nodes leave among the free nodes in
 * proportion to their speed, the output matrix counting as work of the
 * last node; false when they cannot take them all. */
static bool share_by_speed(shares *s)
{
    int32_t left = s->m->n_layer;
    double w_free = 0;
    for (int i = 0; i < s->n; i++)
        if (s->pinned[i])
            left -= s->count[i];
        else
            w_free += s->w[i];
    double share[CV_CHAIN_MAX_NODES], rem[CV_CHAIN_MAX_NODES];
    const double output = s->pinned[s->last_node] ? 0 : s->output_work;
    double free_sum = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->pinned[i])
            continue;
        share[i] = w_free > 0 ? (left + output) * s->w[i] / w_free : 0;
        if (i == s->last_node)
            share[i] = share[i] > output ? share[i] - output : 0;
        free_sum += share[i];
    }
    int32_t given = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->pinned[i])
            continue;
        if (free_sum > 0) /* sums to `left` again where the last node's share ran out */
            share[i] *= left / free_sum;
        s->count[i] = (int32_t)share[i];
        rem[i] = share[i] - s->count[i];
        given += s->count[i];
    }
    return give_remainders(s, rem, left - given);
}

/* Pins the first node over its memory capacity (less the output matrix's
 * bytes on the last node) at that capacity; false when every count fits. */
static bool pin_over_capacity(shares *s)
{
    int32_t l0 = 0;
    for (int i = 0; i < s->n; i++) {
        uint64_t budget = s->nodes[i].mem_budget;
        if (i == s->last_node)
            budget = budget > s->m->output_bytes ? budget - s->m->output_bytes : 0;
        const int32_t cap = capacity(s->m, &s->nodes[i], l0, budget);
        if (s->count[i] > cap) {
            s->count[i] = cap;
            s->pinned[i] = true;
            return true;
        }
        l0 += s->count[i];
    }
    return false;
}

static int too_small(const cv_plan_model *m, int n, const cv_plan_node *nodes, char *err, size_t errlen)
{
    const cv_plan_node bare = {.mem_budget = 1}; /* no room: the experts' fewest slots (paged) */
    uint64_t need = cv_plan_range_bytes(m, &bare, 0, m->n_layer) - m->fixed_bytes, offer = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t own = m->fixed_bytes + nodes[i].own_bytes;
        offer += nodes[i].mem_budget > own ? nodes[i].mem_budget - own : 0;
    }
    return cv_errf(err, errlen, "the model needs %.2f GB for weights and KV cache, the %d node(s) offer %.2f GB",
                   need / 1e9, n, offer / 1e9);
}

/* Each node's speed, 1 / us_per_layer_token; a node that did not measure
 * counts as the mean of those that did (as 1 when none did). */
static void speeds(const cv_plan_node *nodes, int n, double *w)
{
    double sum = 0;
    int measured = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i].us_per_layer_token) {
            sum += 1.0 / nodes[i].us_per_layer_token;
            measured++;
        }
    for (int i = 0; i < n; i++)
        w[i] = nodes[i].us_per_layer_token ? 1.0 / nodes[i].us_per_layer_token : measured ? sum / measured : 1.0;
}

double cv_plan_mean_layer_bytes(const cv_plan_model *m)
{
    uint64_t all = 0;
    for (int32_t l = 0; l < m->n_layer; l++)
        all += m->layer_bytes[l];
    return all ? (double)all / m->n_layer : 0;
}

static double layer_work(const cv_plan_model *m, double mean, int32_t l)
{
    return mean > 0 ? m->layer_bytes[l] / mean : 1;
}

static double output_work(const cv_plan_model *m, double mean) { return mean > 0 ? m->output_work_bytes / mean : 0; }

/* Shares by speed, pins the nodes over capacity and shares the rest
 * again, until every count fits and the output matrix stays on the last
 * node with layers (when it moves, capacities change: every pin is lifted,
 * and the nodes after it are held at none, so the output matrix only moves
 * toward the first node and the sharing settles). */
static int plan_by_speed(const cv_plan_model *m, int n, const cv_plan_node *nodes, int32_t *count, char *err,
                         size_t errlen)
{
    shares s = {.m = m, .nodes = nodes, .n = n, .last_node = n - 1}; /* the output matrix starts on the last node */
    speeds(nodes, n, s.w);
    s.output_work = output_work(m, cv_plan_mean_layer_bytes(m));
    for (int round = 0; round < PLAN_MAX_ROUNDS; round++) {
        if (!share_by_speed(&s))
            return too_small(m, n, nodes, err, errlen);
        const bool changed = pin_over_capacity(&s);
        const int new_last = last_with_layers(s.count, n);
        if (!changed && new_last == s.last_node)
            break;
        if (new_last != s.last_node && new_last >= 0) {
            /* the nodes after the last keep no layers: one that took some
             * would hold the output matrix again, and the plan would swing back */
            s.last_node = new_last;
            memset(s.pinned, 0, sizeof s.pinned);
            for (int i = new_last + 1; i < n; i++) {
                s.pinned[i] = true;
                s.count[i] = 0;
            }
        }
    }
    memcpy(count, s.count, sizeof(int32_t) * (size_t)n);
    return 0;
}

/* The cost model (plan.h): each node's microseconds per layer of the mean
 * size and token, and the work of layers [0, l) in mean layers. */
typedef struct costs {
    const cv_plan_model *m;
    int n;
    int32_t streams;
    double us[CV_CHAIN_MAX_NODES];
    double *work;     /* [n_layer + 1] */
    double output_work; /* the output matrix, in mean layers */
} costs;

static int costs_init(costs *c, const cv_plan_model *m, int n, const cv_plan_node *nodes, int32_t streams)
{
    double w[CV_CHAIN_MAX_NODES];
    speeds(nodes, n, w);
    *c = (costs){.m = m, .n = n, .streams = streams > 1 ? streams : 1};
    for (int i = 0; i < n; i++)
        c->us[i] = 1.0 / w[i];
    c->work = cv_malloc(sizeof(double) * (size_t)(m->n_layer + 1));
    if (!c->work)
        return -1;
    const double mean = cv_plan_mean_layer_bytes(m);
    c->work[0] = 0;
    for (int32_t l = 0; l < m->n_layer; l++)
        c->work[l + 1] = c->work[l] + layer_work(m, mean, l);
    c->output_work = output_work(m, mean);
    return 0;
}

double cv_plan_stage_work(const cv_plan_model *m, int32_t l0, int32_t l1)
{
    const double mean = cv_plan_mean_layer_bytes(m);
    double work = l1 > l0 && l1 == m->n_layer ? output_work(m, mean) : 0;
    for (int32_t l = l0; l < l1; l++)
        work += layer_work(m, mean, l);
    return work;
}

/* Node i's time per token for layers [l0, l1): the output matrix too when
 * l1 ends the model. */
static double stage_us(const costs *c, int i, int32_t l0, int32_t l1)
{
    if (l1 <= l0)
        return 0;
    return c->us[i] * (c->work[l1] - c->work[l0] + (l1 == c->m->n_layer ? c->output_work : 0));
}

/* A token's predicted time through the stages of `count` (plan.h): the
 * stages' times summed for one stream, the slowest stage's for several. */
static double token_us(const costs *c, const int32_t *count)
{
    double sum = 0, most = 0;
    int32_t l0 = 0;
    for (int i = 0; i < c->n; l0 += count[i], i++) {
        const double t = stage_us(c, i, l0, l0 + count[i]);
        sum += t;
        most = t > most ? t : most;
    }
    return c->streams > 1 ? most : sum;
}

/* The search's tables: the most layers node i takes from layer l, without
 * and with the output matrix, [n][n_layer + 1]. */
typedef struct search {
    const costs *c;
    int32_t *cap, *cap_last;
} search;

static int search_init(search *s, const costs *c, const cv_plan_node *nodes)
{
    const cv_plan_model *m = c->m;
    const size_t cells = (size_t)c->n * (size_t)(m->n_layer + 1);
    *s = (search){.c = c, .cap = cv_malloc(sizeof(int32_t) * cells),
                  .cap_last = cv_malloc(sizeof(int32_t) * cells)};
    if (!s->cap || !s->cap_last)
        return -1;
    for (int i = 0; i < c->n; i++) {
        const uint64_t budget = nodes[i].mem_budget;
        const uint64_t last_budget = budget > m->output_bytes ? budget - m->output_bytes : 0;
        for (int32_t l = 0; l <= m->n_layer; l++) {
            s->cap[i * (m->n_layer + 1) + l] = capacity(m, &nodes[i], l, budget);
            /* this machine's stage ends no chain of several nodes (chain.c) */
            s->cap_last[i * (m->n_layer + 1) + l] =
                nodes[i].local && c->n > 1 ? 0 : capacity(m, &nodes[i], l, last_budget);
        }
    }
    return 0;
}

static void search_free(search *s)
{
    cv_free(s->cap);
    cv_free(s->cap_last);
}

/* Whether node i can take layers [l0, l1). */
static bool fits(const search *s, int i, int32_t l0, int32_t l1)
{
    const int32_t n_layer = s->c->m->n_layer, k = l1 - l0;
    const int32_t *cap = l1 == n_layer ? s->cap_last : s->cap;
    return k == 0 || k <= cap[i * (n_layer + 1) + l0];
}

#define PLAN_INF 1e300

/* The counts of the least predicted time (token_us: the summed stages'
 * for one stream, the slowest stage's for several), by dynamic
 * programming over (node, first layer); false when no counts fit. */
static bool fastest_counts(const search *s, int32_t *count)
{
    const int n = s->c->n;
    const bool slowest = s->c->streams > 1;
    const int32_t L = s->c->m->n_layer, W = L + 1;
    double *f = cv_malloc(sizeof(double) * (size_t)(n + 1) * (size_t)W);
    int32_t *pick = cv_malloc(sizeof(int32_t) * (size_t)n * (size_t)W);
    bool found = false;
    if (f && pick) {
        /* f[i][l]: the least time of nodes i.. for layers [l, L) */
        for (int32_t l = 0; l <= L; l++)
            f[n * W + l] = l == L ? 0 : PLAN_INF;
        for (int i = n - 1; i >= 0; i--)
            for (int32_t l = 0; l <= L; l++) {
                double best = PLAN_INF;
                for (int32_t l1 = l; l1 <= L && fits(s, i, l, l1); l1++) {
                    const double rest = f[(i + 1) * W + l1], t = stage_us(s->c, i, l, l1);
                    const double total = slowest ? (t > rest ? t : rest) : t + rest;
                    if (rest < PLAN_INF && total < best) {
                        best = total;
                        pick[i * W + l] = l1 - l;
                    }
                }
                f[i * W + l] = best;
            }
        found = f[0] < PLAN_INF;
        for (int i = 0, l = 0; found && i < n; l += count[i], i++)
            count[i] = pick[i * W + l];
    }
    cv_free(f);
    cv_free(pick);
    return found;
}

/* A plan other than the shared one must be predicted faster by this
 * fraction: measured speeds wander by several percent between probes,
 * and the shared plan keeps every node's stage (prompt chunks pipelined
 * over more stages, room for more KV), which the cost model does not
 * count. */
#define PLAN_MARGIN 0.10

/* The shared plan (plan_by_speed), unless the search finds counts
 * predicted faster by more than PLAN_MARGIN. */
static int plan_fastest(const costs *c, const cv_plan_node *nodes, int32_t *count, double *us_shared, char *err,
                        size_t errlen)
{
    if (plan_by_speed(c->m, c->n, nodes, count, err, errlen))
        return -1;
    *us_shared = token_us(c, count);
    search s;
    int32_t fastest[CV_CHAIN_MAX_NODES];
    const int rc = search_init(&s, c, nodes);
    const bool found = rc == 0 && fastest_counts(&s, fastest);
    search_free(&s);
    if (rc)
        return cv_errf(err, errlen, "out of memory");
    if (found && token_us(c, fastest) < *us_shared * (1 - PLAN_MARGIN))
        memcpy(count, fastest, sizeof(int32_t) * (size_t)c->n);
    return 0;
}

/* The most tensors a layer has (cv_llama_layer_bytes's list). */
#define LAYER_TENSORS_MAX CV_LLAMA_LAYER_TENSORS_MAX

/* As span.c counts an allocation: its header and alignment, whole pages. */
static uint64_t alloc_bytes(uint64_t n) { return (n + 64 + 4095) / 4096 * 4096; }

/* Weights in the file pages they touch: each tensor may straddle one page
 * more than its size, and a fault maps up to CV_PLAN_FAULT_AROUND of file
 * around it, on either side of a run of tensors. */
static uint64_t touched(uint64_t bytes, uint64_t n_tensors)
{
    return bytes + 4096 * n_tensors + 2 * (uint64_t)CV_PLAN_FAULT_AROUND;
}

static cv_span_params span_params(const cv_plan_session *s, int32_t n_threads)
{
    return (cv_span_params){.n_threads = n_threads, .n_ctx = s->n_ctx, .n_slot = s->n_slot, .n_batch = s->n_batch,
                            .kv_f16 = s->kv_f16};
}

/* The last node's RESULT buffers (handshake.c's assign() and node.c's send_result: the
 * result buffer grows to full logits rows once a FORWARD asks for them). */
static uint64_t result_bytes(const cv_plan_session *s, int32_t n_vocab)
{
    const uint64_t nb = (uint64_t)s->n_batch;
    return alloc_bytes(4 * nb) + alloc_bytes(nb * sizeof(cv_result_row)) +
           alloc_bytes(nb * sizeof(cv_top_entry) * CV_PROTO_MAX_TOP) + alloc_bytes(4 * (uint64_t)s->n_slot) +
           alloc_bytes(12 + nb * (16 + sizeof(cv_top_entry) * CV_PROTO_MAX_TOP + 4 * (uint64_t)n_vocab));
}

void cv_plan_model_of(const cv_llama *m, const cv_plan_session *s, uint64_t *layer_bytes, cv_plan_model *pm)
{
    for (int32_t l = 0; l < m->hp.n_layer; l++) /* the experts, read with pread, touch no file page */
        layer_bytes[l] = touched(cv_llama_layer_bytes(m, l) - cv_llama_layer_expert_bytes(m, l), LAYER_TENSORS_MAX);
    const cv_span_params sp = span_params(s, 1);
    cv_span_costs c;
    cv_span_costs_of(m, &sp, &c);
    *pm = (cv_plan_model){.n_layer = m->hp.n_layer, .layer_bytes = layer_bytes, .kv_bytes_per_layer = c.kv_per_layer,
                          .output_bytes = touched(cv_llama_output_bytes(m), 3) + c.last_extra +
                                        result_bytes(s, m->hp.n_vocab),
                          .output_work_bytes = cv_llama_output_bytes(m)};
    if (m->hp.n_expert) {
        cv_experts_cost(m, &pm->expert_fixed_bytes, &pm->expert_slot_bytes);
        pm->layer_experts = (uint64_t)m->hp.n_expert;
        pm->min_expert_slots = (uint64_t)cv_experts_min_slots(m, s->n_batch);
    }
}

uint32_t cv_plan_hello_cap(int32_t n_layer) { return CV_PROTO_MIN_MAX_PAYLOAD + 1024u * (uint32_t)n_layer; }

uint64_t cv_plan_forward_cap(const cv_plan_session *s, int32_t n_embd)
{
    const uint64_t n = (uint64_t)s->n_batch;
    const uint64_t size = CV_FWD_FIXED_SIZE + sizeof(cv_fwd_token) * n +
                          cv_act_bytes(s->act_type, n, (uint64_t)n_embd) + sizeof(uint32_t) * (CV_TRAIL_MAX - 1);
    return size > CV_PROTO_MIN_MAX_PAYLOAD ? size : CV_PROTO_MIN_MAX_PAYLOAD;
}

/* A node's session buffers (handshake.c's assign()), its links' receive
 * buffers (a frame held and one arriving on the data link, the handshake's
 * HELLO, small frames on the others, each link's own state) and its threads' stacks (the
 * compute pool's, the pulse, a writer per link, the main thread's growth). */
static uint64_t node_bytes(const cv_plan_session *s, int32_t n_embd, int32_t n_layer, int32_t n_threads)
{
    const uint64_t nb = (uint64_t)s->n_batch, ne = (uint64_t)n_embd;
    const uint64_t fwd_out = alloc_bytes(4 * nb * ne) + alloc_bytes(CV_FWD_FIXED_SIZE + sizeof(cv_fwd_token) * nb) +
                             alloc_bytes(cv_act_bytes(CV_ACT_F16, nb, ne));
    const uint64_t buffers = 3 * alloc_bytes(4 * nb) + alloc_bytes(nb) + alloc_bytes(4 * nb * ne) + 2 * fwd_out;
    const uint64_t links = 2 * alloc_bytes(cv_plan_forward_cap(s, n_embd)) + alloc_bytes(cv_plan_hello_cap(n_layer)) +
                           3 * 2 * alloc_bytes(CV_PROTO_MIN_MAX_PAYLOAD);
    const uint64_t threads = (uint64_t)(n_threads - 1 + 1 + 3 + 1) * CV_PLAN_THREAD_STACK;
    return buffers + links + threads;
}

uint64_t cv_plan_meta_bytes(const cv_llama *m)
{
    const gguf_file *f = &m->gguf;
    uint64_t strings = 0;
    for (uint64_t i = 0; i < f->n_kv; i++)
        strings += f->kv[i].arr_strs ? alloc_bytes(f->kv[i].arr_n * sizeof(gguf_str)) : 0;
    return touched(f->data_offset, 0) + alloc_bytes(f->n_kv * sizeof(gguf_kv)) + strings +
           2 * alloc_bytes(f->n_tensors * sizeof(gguf_tensor)) + alloc_bytes(f->n_tensors * CV_HASH_BYTES) +
           alloc_bytes((uint64_t)m->hp.n_layer * sizeof(cv_llama_layer));
}

uint64_t cv_plan_received_bytes(const cv_llama *m, const cv_plan_session *s, int32_t n_threads,
                                uint64_t process_bytes, bool whole)
{
    const uint64_t meta = cv_plan_meta_bytes(m) + (whole ? CV_PLAN_SHARD_KEYS_BYTES : 0);
    return cv_plan_own_bytes(m, s, CV_PLAN_NODE, n_threads, process_bytes + meta);
}

uint64_t cv_plan_own_bytes(const cv_llama *m, const cv_plan_session *s, cv_plan_role role, int32_t n_threads,
                           uint64_t process_bytes)
{
    const cv_span_params sp = span_params(s, n_threads);
    cv_span_costs c;
    cv_span_costs_of(m, &sp, &c);
    /* the span maps the file again and reads its header */
    const uint64_t header = touched(m->gguf.data_offset, 0);
    const uint64_t own = process_bytes + c.fixed + header;
    if (role == CV_PLAN_LOCAL)
        return own + touched(cv_llama_weight_bytes(m, 0, 0, CV_EMBD_ALL), 1);
    return own + node_bytes(s, m->hp.n_embd, m->hp.n_layer, n_threads);
}

int cv_plan_layers(const cv_plan_model *m, int n_nodes, const cv_plan_node *nodes, const int32_t *split,
                   int32_t streams, cv_plan_result *out, char *err, size_t errlen)
{
    if (n_nodes < 1 || n_nodes > CV_CHAIN_MAX_NODES)
        return cv_errf(err, errlen, "a chain has 1 to %d nodes, not %d", CV_CHAIN_MAX_NODES, n_nodes);
    costs c;
    if (costs_init(&c, m, n_nodes, nodes, streams)) {
        cv_free(c.work);
        return cv_errf(err, errlen, "out of memory");
    }
    int32_t count[CV_CHAIN_MAX_NODES];
    out->us_shared = 0;
    const int rc = (split                          ? take_split(split, n_nodes, count, err, errlen)
                    : all_whole(m, n_nodes, nodes) ? plan_fastest(&c, nodes, count, &out->us_shared, err, errlen)
                                                   : plan_by_ranges(m, n_nodes, nodes, count, err, errlen)) ||
                   check(m, n_nodes, nodes, count, err, errlen);
    out->us_token = rc ? 0 : token_us(&c, count);
    cv_free(c.work);
    if (rc)
        return -1;
    for (int i = 0, l0 = 0; i < n_nodes; i++) {
        out->first[i] = l0;
        out->last[i] = l0 + count[i];
        l0 += count[i];
    }
    return 0;
}
