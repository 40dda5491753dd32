/* plan.c: the layer planner (see plan.h). Counts start proportional to
 * speed (largest remainders get the leftover layers), the output matrix
 * counting as work of the node that holds the head (in layers of the
 * average size, since decoding reads it once per token as it reads a
 * layer); a node over its
 * memory capacity is pinned at capacity and the rest is shared again among
 * the others, until every count fits. The node that ends up last must also
 * hold the output head, so capacities are recomputed when that changes. */
#include "pipe/plan.h"

#include <stdbool.h>
#include <stdio.h>

#include "core/err.h"

#define PLAN_MAX_NODES 64

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

static int check(const cv_plan_model *m, int n, const cv_plan_node *nodes, const int32_t *count, char *err,
                 size_t errlen)
{
    int32_t l0 = 0, last_node = -1;
    for (int i = 0; i < n; i++)
        if (count[i] > 0)
            last_node = i;
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

int cv_plan_layers(const cv_plan_model *m, int n_nodes, const cv_plan_node *nodes, const int32_t *split,
                   int32_t *first, int32_t *last, char *err, size_t errlen)
{
    if (n_nodes < 1 || n_nodes > PLAN_MAX_NODES)
        return cv_errf(err, errlen, "a chain has 1 to %d nodes, not %d", PLAN_MAX_NODES, n_nodes);
    int32_t count[PLAN_MAX_NODES];
    if (split) {
        for (int i = 0; i < n_nodes; i++) {
            if (split[i] < 0)
                return cv_errf(err, errlen, "--split: negative layer count for node %d", i);
            count[i] = split[i];
        }
    } else {
        double w[PLAN_MAX_NODES];
        bool pinned[PLAN_MAX_NODES] = {false};
        for (int i = 0; i < n_nodes; i++)
            w[i] = nodes[i].us_per_layer_token ? 1.0 / nodes[i].us_per_layer_token : 1.0;
        /* the node holding the head: the last one with layers; starts as the last node */
        int head_node = n_nodes - 1;
        uint64_t all_layers = 0;
        for (int32_t l = 0; l < m->n_layer; l++)
            all_layers += m->layer_bytes[l];
        const double head_work =
            all_layers ? (double)m->head_work_bytes * m->n_layer / (double)all_layers : 0;
        for (int round = 0; round < 4 * PLAN_MAX_NODES; round++) {
            int32_t left = m->n_layer;
            double w_free = 0;
            for (int i = 0; i < n_nodes; i++)
                if (pinned[i])
                    left -= count[i];
                else
                    w_free += w[i];
            /* proportional shares of the free nodes' work (their layers and
             * the head's matrix), largest remainders first */
            double share[PLAN_MAX_NODES], rem[PLAN_MAX_NODES];
            const double head = pinned[head_node] ? 0 : head_work;
            double free_sum = 0;
            for (int i = 0; i < n_nodes; i++) {
                if (pinned[i])
                    continue;
                share[i] = w_free > 0 ? (left + head) * w[i] / w_free : 0;
                if (i == head_node)
                    share[i] = share[i] > head ? share[i] - head : 0;
                free_sum += share[i];
            }
            int32_t given = 0;
            for (int i = 0; i < n_nodes; i++) {
                if (pinned[i])
                    continue;
                if (free_sum > 0) /* sums to `left` again where the head's share ran out */
                    share[i] *= left / free_sum;
                count[i] = (int32_t)share[i];
                rem[i] = share[i] - count[i];
                given += count[i];
            }
            while (given < left) {
                int best = -1;
                for (int i = 0; i < n_nodes; i++)
                    if (!pinned[i] && (best < 0 || rem[i] > rem[best]))
                        best = i;
                if (best < 0)
                    break;
                count[best]++;
                rem[best] = -1;
                given++;
            }
            if (given < left) {
                uint64_t need = range_bytes(m, 0, m->n_layer, true) - m->fixed_bytes, offer = 0;
                for (int i = 0; i < n_nodes; i++)
                    offer += nodes[i].mem_budget > m->fixed_bytes ? nodes[i].mem_budget - m->fixed_bytes : 0;
                return cv_errf(err, errlen,
                               "the model needs %.2f GB for weights and KV cache, the %d node(s) offer %.2f GB",
                               need / 1e9, n_nodes, offer / 1e9);
            }
            /* pin the first node over its capacity, then share again */
            bool changed = false;
            int32_t l0 = 0;
            for (int i = 0; i < n_nodes && !changed; i++) {
                uint64_t budget = nodes[i].mem_budget;
                if (i == head_node)
                    budget = budget > m->head_bytes ? budget - m->head_bytes : 0;
                int32_t cap = capacity(m, l0, budget);
                if (count[i] > cap) {
                    count[i] = cap;
                    pinned[i] = true;
                    changed = true;
                }
                l0 += count[i];
            }
            int new_head = -1;
            for (int i = 0; i < n_nodes; i++)
                if (count[i] > 0)
                    new_head = i;
            if (!changed && new_head == head_node)
                break;
            if (new_head != head_node && new_head >= 0) {
                head_node = new_head;
                for (int i = 0; i < n_nodes; i++)
                    pinned[i] = false;
            }
        }
    }
    if (check(m, n_nodes, nodes, count, err, errlen))
        return -1;
    for (int i = 0, l0 = 0; i < n_nodes; i++) {
        first[i] = l0;
        last[i] = l0 + count[i];
        l0 += count[i];
    }
    return 0;
}
