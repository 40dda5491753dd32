/* plan.h: the layer plan: which node of a chain serves which layers.
 *
 * Contract: cv_plan_layers splits layers [0, n_layer) into consecutive
 * ranges, one per node in chain order, in proportion to each node's
 * measured speed (1 / us_per_layer_token; nodes that did not measure count
 * as equal), the output matrix (head_work_bytes) counting as work of the
 * node that ends up last, never giving a node more layers than fit its memory budget
 * (its layer bytes + KV cache per layer, plus the output matrix for the
 * node that ends up last). A node whose share rounds to zero is left out
 * (range [x, x)). With `split` (layer counts per node, as --split gives
 * them) the counts are taken as they are and only checked. When the nodes
 * together cannot hold the model the message says how much it needs and
 * how much they offer. first[i], last[i] receive node i's range. A chain
 * has 1 to CV_CHAIN_MAX_NODES (proto.h) nodes. */
#ifndef CONVOY_PIPE_PLAN_H
#define CONVOY_PIPE_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct cv_plan_node {
    const char *name;             /* for messages ("node 10.0.0.2:7000"); NULL: "node I" */
    uint64_t mem_budget;          /* bytes the node may use */
    uint32_t us_per_layer_token;  /* 0 = not measured */
} cv_plan_node;

typedef struct cv_plan_model {
    int32_t n_layer;
    const uint64_t *layer_bytes;  /* [n_layer] weights of each layer */
    uint64_t kv_bytes_per_layer;  /* KV cache of all slots for one layer */
    uint64_t fixed_bytes;         /* buffers every node needs */
    uint64_t head_bytes;          /* output norm + matrix + logits, for the last node */
    uint64_t head_work_bytes;     /* the output matrix, read once per token like a layer */
} cv_plan_model;

int cv_plan_layers(const cv_plan_model *m, int n_nodes, const cv_plan_node *nodes, const int32_t *split,
                   int32_t *first, int32_t *last, char *err, size_t errlen);

#endif
