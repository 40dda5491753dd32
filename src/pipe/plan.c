/* plan.c: the layer planner (see plan.h). Counts start proportional to
 * speed (largest remainders get the leftover layers), the output matrix
 * counting as work of the node that holds the head (in layers of the
 * average size, since decoding reads it once per token as it reads a
 * layer); a node over its memory capacity is pinned at capacity and the
 * rest is shared again among the others, until every count fits. The node
 * that ends up last must also hold the output head, so capacities are
 * recomputed when that changes. */
#include "pipe/plan.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/err.h"
#include "pipe/proto.h"

/* Each round of sharing pins a node or moves the head, and a plan settles
 * in a few; this bounds a plan that would not. */
#define PLAN_MAX_ROUNDS (16 * CV_CHAIN_MAX_NODES)

/* Layers [l0, l0 + n) fit in budget? (first-fit from l0, in order) */
static int32_t capacity(const cv_plan_model *m, int32_t l0, uint64_t budget)
{
    uint64_t used = m->fixed_bytes;
    int32_t n = 0;
    while (l0 + n < m->n_layer && used + m->layer_bytes[l0 + n] + m->kv_bytes_per_layer <= budget) {
        used += m->layer_bytes[l0 + n] + m->kv_bytes_per_layer;
        n++;
    }
    return used > budget ? 0 : n;
}

static uint64_t range_bytes(const cv_plan_model *m, int32_t l0, int32_t l1, bool last)
{
    uint64_t b = m->fixed_bytes + (last ? m->head_bytes : 0);
    for (int32_t l = l0; l < l1; l++)
        b += m->layer_bytes[l] + m->kv_bytes_per_layer;
    return b;
}

/* The last node with layers, the one that holds the output head; -1 when
 * none has any. */
static int last_with_layers(const int32_t *count, int n)
{
    int last = -1;
    for (int i = 0; i < n; i++)
        if (count[i] > 0)
            last = i;
    return last;
}

static int check(const cv_plan_model *m, int n, const cv_plan_node *nodes, const int32_t *count, char *err,
                 size_t errlen)
{
    const int last_node = last_with_layers(count, n);
    int32_t l0 = 0;
    for (int i = 0; i < n; i++) {
        uint64_t need = range_bytes(m, l0, l0 + count[i], i == last_node);
        if (count[i] > 0 && need > nodes[i].mem_budget) {
            char name[32];
            snprintf(name, sizeof name, "node %d", i);
            return cv_errf(err, errlen, "%s: layers [%d, %d) need %.2f GB, its budget is %.2f GB",
                           nodes[i].name ? nodes[i].name : name, l0, l0 + count[i], need / 1e9,
                           nodes[i].mem_budget / 1e9);
        }
        l0 += count[i];
    }
    if (l0 != m->n_layer)
        return cv_errf(err, errlen, "the split covers %d layers, the model has %d", l0, m->n_layer);
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
    int head_node;                   /* holds the output head: the last node with layers */
    double head_work;                /* the output matrix, in layers of the average size */
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
 * head node; false when they cannot take them all. */
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
    const double head = s->pinned[s->head_node] ? 0 : s->head_work;
    double free_sum = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->pinned[i])
            continue;
        share[i] = w_free > 0 ? (left + head) * s->w[i] / w_free : 0;
        if (i == s->head_node)
            share[i] = share[i] > head ? share[i] - head : 0;
        free_sum += share[i];
    }
    int32_t given = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->pinned[i])
            continue;
        if (free_sum > 0) /* sums to `left` again where the head's share ran out */
            share[i] *= left / free_sum;
        s->count[i] = (int32_t)share[i];
        rem[i] = share[i] - s->count[i];
        given += s->count[i];
    }
    return give_remainders(s, rem, left - given);
}

/* Pins the first node over its memory capacity (less the output head's
 * bytes on the head node) at that capacity; false when every count fits. */
static bool pin_over_capacity(shares *s)
{
    int32_t l0 = 0;
    for (int i = 0; i < s->n; i++) {
        uint64_t budget = s->nodes[i].mem_budget;
        if (i == s->head_node)
            budget = budget > s->m->head_bytes ? budget - s->m->head_bytes : 0;
        const int32_t cap = capacity(s->m, l0, budget);
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
    uint64_t need = range_bytes(m, 0, m->n_layer, true) - m->fixed_bytes, offer = 0;
    for (int i = 0; i < n; i++)
        offer += nodes[i].mem_budget > m->fixed_bytes ? nodes[i].mem_budget - m->fixed_bytes : 0;
    return cv_errf(err, errlen, "the model needs %.2f GB for weights and KV cache, the %d node(s) offer %.2f GB",
                   need / 1e9, n, offer / 1e9);
}

/* Shares by speed, pins the nodes over capacity and shares the rest
 * again, until every count fits and the head stays on the last node with
 * layers (when it moves, capacities change: every pin is lifted). */
static int plan_by_speed(const cv_plan_model *m, int n, const cv_plan_node *nodes, int32_t *count, char *err,
                         size_t errlen)
{
    shares s = {.m = m, .nodes = nodes, .n = n, .head_node = n - 1}; /* the head starts on the last node */
    for (int i = 0; i < n; i++)
        s.w[i] = nodes[i].us_per_layer_token ? 1.0 / nodes[i].us_per_layer_token : 1.0;
    uint64_t all_layers = 0;
    for (int32_t l = 0; l < m->n_layer; l++)
        all_layers += m->layer_bytes[l];
    s.head_work = all_layers ? (double)m->head_work_bytes * m->n_layer / (double)all_layers : 0;
    for (int round = 0; round < PLAN_MAX_ROUNDS; round++) {
        if (!share_by_speed(&s))
            return too_small(m, n, nodes, err, errlen);
        const bool changed = pin_over_capacity(&s);
        const int new_head = last_with_layers(s.count, n);
        if (!changed && new_head == s.head_node)
            break;
        if (new_head != s.head_node && new_head >= 0) {
            s.head_node = new_head;
            memset(s.pinned, 0, sizeof s.pinned);
        }
    }
    memcpy(count, s.count, sizeof(int32_t) * (size_t)n);
    return 0;
}

int cv_plan_layers(const cv_plan_model *m, int n_nodes, const cv_plan_node *nodes, const int32_t *split,
                   int32_t *first, int32_t *last, char *err, size_t errlen)
{
    if (n_nodes < 1 || n_nodes > CV_CHAIN_MAX_NODES)
        return cv_errf(err, errlen, "a chain has 1 to %d nodes, not %d", CV_CHAIN_MAX_NODES, n_nodes);
    int32_t count[CV_CHAIN_MAX_NODES];
    if ((split ? take_split(split, n_nodes, count, err, errlen)
               : plan_by_speed(m, n_nodes, nodes, count, err, errlen)) ||
        check(m, n_nodes, nodes, count, err, errlen))
        return -1;
    for (int i = 0, l0 = 0; i < n_nodes; i++) {
        first[i] = l0;
        last[i] = l0 + count[i];
        l0 += count[i];
    }
    return 0;
}
