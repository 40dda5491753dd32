/* plan.h: the layer plan: which node of a chain serves which layers, and
 * what a stage's memory is.
 *
 * Memory: a node's --mem bounds its resident memory, what RSS (VmRSS, and
 * VmHWM at the peak) shows: anonymous memory and every file page it maps,
 * the weight pages it touches among them (weights stay in the file
 * mapping, and a touched page is resident). cv_plan_range_bytes is the one
 * count of it: the node's own bytes (cv_plan_own_bytes: its process as it
 * measured it at start, session buffers, link receive buffers, thread
 * stacks, the pages of its own mapping's header; a local first stage: its
 * buffers and the token embeddings), plus per layer its weights (whole
 * pages, and the pages the kernel maps around a fault) and KV cache, plus
 * at the last stage the output weights, logits, samplers and RESULT
 * buffers. Every allocation counts whole pages. A node answers a query
 * with its own bytes (HELLO_OK layer_bytes), the planner plans with them,
 * and the node checks an assignment with the same count, so a node never
 * refuses a plan made from its own answer; the rest depends only on the
 * tensor directory (which the fingerprint covers) and the session.
 *
 * Contract: cv_plan_layers splits layers [0, n_layer) into consecutive
 * ranges, one per node in chain order, for the least predicted time of a
 * token (the cost model below), never giving a node more layers than fit
 * its memory budget (cv_plan_range_bytes). The shared plan gives each node
 * layers in proportion to its speed (1 / us_per_layer_token; a node that
 * did not measure counts as the mean of those that did), the output
 * matrix (output_work_bytes) counting as work of the node that ends up
 * last; a search over every split that fits finds the fastest, which
 * replaces the shared plan only when predicted faster by more than 10%
 * (plan.c's PLAN_MARGIN). A node without layers is left out (range
 * [x, x)). With `split` (layer counts per node, as --split gives them)
 * the counts are taken as they are and only checked.
 *
 * Cost model: node i's stage takes us_per_layer_token times its layers'
 * work per token (a layer's bytes over the mean layer's; the output
 * matrix on the last node with layers). One stream (streams 1: one
 * sequence decoding) waits for every stage in turn: its token takes the
 * stages' times summed, least with the fastest nodes full. Several
 * streams keep the stages busy with different batches at once: the
 * slowest stage sets the pace, least with layers in proportion to speed.
 * Hops between nodes are not counted.
 *
 * When the nodes together cannot hold the model the message says how much
 * it needs and how much they offer. A node is given layers only inside
 * the range its file holds (held_l0, held_l1: a shard, model/shard.h);
 * when some node holds less than every layer, the plan follows the
 * ranges in chain order instead of speed (plan.c's plan_by_ranges), and
 * when they cannot cover the model in chain order the message names the
 * node where the chain stops. `split` outside a node's range is refused
 * naming the node. out->first[i], out->last[i] receive node i's range,
 * out->us_token the plan's predicted time and out->us_shared the shared
 * plan's (0 when the plan was not by speed). A chain has 1 to
 * CV_CHAIN_MAX_NODES (proto.h) nodes. */
#ifndef CONVOY_PIPE_PLAN_H
#define CONVOY_PIPE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/llama.h"
#include "pipe/proto.h"

/* The stack of every thread a node starts (cmd_stage.c makes it the
 * process's default), counted whole for each. */
#define CV_PLAN_THREAD_STACK (256u << 10)
/* The most file pages the kernel maps around one page fault (Linux's
 * fault_around_bytes), counted on both sides of each layer's weights. */
#define CV_PLAN_FAULT_AROUND (64u << 10)

typedef struct cv_plan_node {
    const char *name;             /* for messages ("node 10.0.0.2:7000"); NULL: "node I" */
    uint64_t mem_budget;          /* bytes the node may use */
    double us_per_layer_token;    /* probed or measured; 0 = not measured */
    uint64_t own_bytes;           /* what it holds besides its layers (cv_plan_own_bytes), as it answered */
    int32_t held_l0, held_l1;     /* the layers its model file holds (a shard's); held_l1 0: every layer */
    bool local;                   /* the head's own first stage, which never ends a chain of several nodes */
} cv_plan_node;

typedef struct cv_plan_model {
    int32_t n_layer;
    const uint64_t *layer_bytes;  /* [n_layer] weights of each layer, in the pages they touch */
    uint64_t kv_bytes_per_layer;  /* KV cache of all slots for one layer */
    uint64_t fixed_bytes;         /* what every node needs besides its own bytes */
    uint64_t output_bytes;        /* output weights, logits, samplers, RESULT buffers: the last node's */
    uint64_t output_work_bytes;   /* the output matrix, read once per token like a layer */
    /* a mixture of experts' routed experts live in a cache of expert slots
     * (model/experts.h), not in layer_bytes; all 0 for a dense model */
    uint64_t expert_slot_bytes;   /* one slot: the largest expert, and its bookkeeping */
    uint64_t expert_fixed_bytes;  /* the cache's bytes besides its slots (cv_experts_cost) */
    uint64_t layer_experts;       /* slots for every expert of one layer */
    uint64_t min_expert_slots;    /* the fewest slots a batch needs */
} cv_plan_model;

/* The session a plan is for, as the head's HELLO gives it. */
typedef struct cv_plan_session {
    int32_t n_ctx;      /* positions per slot */
    int32_t n_slot;
    int32_t n_batch;    /* rows of a FORWARD at most */
    bool kv_f16;
    uint32_t act_type;  /* activations on the wire (CV_ACT_*) */
} cv_plan_session;

typedef enum cv_plan_role {
    CV_PLAN_NODE,  /* a `convoy stage` process: reads hidden states from a link */
    CV_PLAN_LOCAL, /* the head's own first stage: embeds token ids */
} cv_plan_role;

/* The plan's model for a session, from m's tensor directory (any binding);
 * layer_bytes is the caller's [n_layer], which pm->layer_bytes then points to. */
void cv_plan_model_of(const cv_llama *m, const cv_plan_session *s, uint64_t *layer_bytes, cv_plan_model *pm);
/* A stage's own bytes for the session: process_bytes (a node's process as
 * measured at start, see core/procmem.h) and everything it allocates for
 * a session whatever its layers, with n_threads compute threads. */
uint64_t cv_plan_own_bytes(const cv_llama *m, const cv_plan_session *s, cv_plan_role role, int32_t n_threads,
                           uint64_t process_bytes);
/* A node that receives its layers (proto.h's CV_HOK_RECEIVES) starts
 * without a model: once a shard has come it loads the shard's metadata,
 * which cv_plan_meta_bytes counts (its header's pages, its parsed key/
 * values, tensor directory (the model's and the span's) and hashes, the
 * layer table). cv_plan_received_bytes is such a node's own bytes: the head
 * counts them from the whole model (whole: true), with the shard's keys
 * (CV_PLAN_SHARD_KEYS_BYTES, whole pages of them in the header and the
 * parsed key/values, twice) on top, and the node from the shard it got,
 * which holds no more than the whole model besides those keys: so the
 * node never finds more than the head planned with. */
#define CV_PLAN_SHARD_KEYS_BYTES (16u << 10)
uint64_t cv_plan_meta_bytes(const cv_llama *m);
uint64_t cv_plan_received_bytes(const cv_llama *m, const cv_plan_session *s, int32_t n_threads,
                                uint64_t process_bytes, bool whole);
/* Bytes `node` needs to serve layers [l0, l1) (the output matrix too when
 * l1 == n_layer): the count a node checks and the planner plans with. A
 * mixture of experts' cache counts a slot for every expert of the range,
 * or as many as the node's budget leaves (the experts are then paged in
 * and out), at least the fewest a batch needs: cv_plan_expert_slots. */
uint64_t cv_plan_range_bytes(const cv_plan_model *pm, const cv_plan_node *node, int32_t l0, int32_t l1);
int32_t cv_plan_expert_slots(const cv_plan_model *pm, const cv_plan_node *node, int32_t l0, int32_t l1);
/* A node's receive cap during a handshake: a HELLO, whose tensor hashes
 * take less than 1 KiB per layer. */
uint32_t cv_plan_hello_cap(int32_t n_layer);
/* The largest FORWARD payload of the session (n_batch rows of its
 * activation type, width n_embd, the longest trail), at least CV_PROTO_MIN_MAX_PAYLOAD: a
 * node's receive cap on the link its FORWARDs arrive by. */
uint64_t cv_plan_forward_cap(const cv_plan_session *s, int32_t n_embd);

/* Work is counted in layers of the mean size (by bytes): the mean layer's
 * bytes, 0 when the model states none (every layer then counts 1 and the
 * output matrix nothing). */
double cv_plan_mean_layer_bytes(const cv_plan_model *m);

/* Layers [l0, l1)'s work per token in mean layers (by bytes), the output
 * matrix counted too when l1 == n_layer: what the cost model multiplies a
 * node's us_per_layer_token by. */
double cv_plan_stage_work(const cv_plan_model *m, int32_t l0, int32_t l1);

typedef struct cv_plan_result {
    int32_t first[CV_CHAIN_MAX_NODES], last[CV_CHAIN_MAX_NODES];
    double us_token;  /* predicted microseconds of a token through the stages */
    double us_shared; /* the same for the shared plan; 0 when not planned by speed */
} cv_plan_result;

/* --split's text, "a,b,c": one layer count per node (n_nodes of them)
 * into split. */
int cv_plan_parse_split(const char *text, int n_nodes, int32_t *split, char *err, size_t errlen);

int cv_plan_layers(const cv_plan_model *m, int n_nodes, const cv_plan_node *nodes, const int32_t *split,
                   int32_t streams, cv_plan_result *out, char *err, size_t errlen);

#endif
