/* chain_impl.h: the state of a chain (chain.h), shared by chain_open.c,
 * which opens and closes it, and chain.c, which runs it (private to
 * src/pipe).
 *
 * Contract: one thread at a time uses a chain (chain.h). Nodes are indexed
 * as opts gives them (0 may be "local", this machine, with no link);
 * stages are the nodes that serve layers, in chain order, the local one
 * first when it has layers; `active` lists the remote ones. */
#ifndef CONVOY_PIPE_CHAIN_IMPL_H
#define CONVOY_PIPE_CHAIN_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "infer/span.h"
#include "model/fingerprint.h"
#include "pipe/chain.h"
#include "pipe/costs.h"
#include "pipe/inbox.h"
#include "pipe/plan.h"
#include "pipe/proto.h"
#include "pipe/wire.h"

struct cv_chain {
    cv_chain_opts o;
    cv_span local;                 /* token embeddings and the local layers [0, n_local) */
    bool local_open;
    bool local_node;               /* node 0 is this machine (no link) */
    int32_t n_local;               /* layers node 0 runs here (0 without a local node) */
    const cv_model_hashes *hashes; /* the model's content hashes: opts->hashes or own_hashes */
    cv_model_hashes own_hashes;
    uint64_t cluster_id;           /* the same in every HELLO of this chain */
    int n_nodes;                   /* nodes given */
    cv_link *link[CV_CHAIN_MAX_NODES];
    char addr[CV_CHAIN_MAX_NODES][CV_PROTO_ADDR_MAX + 1];
    cv_plan_result plan;           /* each node's layers [first, last), and the plan's predicted times */
    uint64_t *layer_bytes;         /* [n_layer] pm's */
    cv_plan_model pm;              /* the model as the plan counts it, kept to plan again (cv_chain_replan) */
    cv_plan_node plan_node[CV_CHAIN_MAX_NODES]; /* each node as planned: budget, probed speed, own bytes */
    double work[CV_TRAIL_MAX];     /* each stage's work per token (cv_plan_stage_work) */
    cv_costs costs;                /* measured, per stage */
    int32_t expert_slots[CV_CHAIN_MAX_NODES]; /* a mixture of experts' cache slots on each node (plan.h) */
    cv_msg_hello_ok offer[CV_CHAIN_MAX_NODES]; /* each node's answer: memory budget and speed */
    int active[CV_CHAIN_MAX_NODES]; /* indices of the nodes that serve layers, in order */
    int n_active;
    cv_inbox inbox;
    bool broken;
    bool result_waited; /* the last collect's result had not come when it was asked for */
    int suspect;                   /* the node a failure is blamed on, or -1 */
    uint32_t next_id;
    /* batches in flight, oldest first in a ring of `depth` */
    int depth;
    int oldest, in_flight;
    struct flight {
        uint32_t id;
        int64_t sent_ns;
        bool alone;                /* no other batch was in flight when it was sent */
        uint32_t local_us;         /* the local layers' time, the trail's first */
        int32_t n_tokens;
        int32_t n_want;
        cv_fwd_out out;            /* the local layers' output and its FORWARD */
    } flight[CV_CHAIN_MAX_NODES];
    cv_result_row *rows;           /* [n_batch] */
    float *logits;                 /* [n_batch][n_vocab] with want_logits */
    float *embd;                   /* [n_batch][n_embd] the embeddings of the last collect's rows */
    uint8_t *row_embd;             /* [n_batch] whether wanted row i of the last collect is an embedding */
    int32_t n_want;                /* wanted rows of the last collect */
    cv_logprob *logprobs;          /* [n_batch][CV_PROTO_MAX_TOP] its wanted rows' log-probabilities */
    uint16_t *n_logprobs;          /* [n_batch] entries of each, 0 for none */
    uint64_t forward_bytes;        /* FORWARD frames sent by the head */
    uint64_t result_bytes;         /* RESULT frames received */
};

/* The node that runs stage s (the local one first when it has layers). */
static inline int cv_chain_stage_node(const cv_chain *c, int s)
{
    const bool local = c->local_node && c->plan.last[0] > 0;
    return local && s == 0 ? 0 : c->active[s - (local ? 1 : 0)];
}

/* The link FORWARDs leave by: the first remote node's. */
static inline cv_link *cv_chain_first_link(const cv_chain *c) { return c->link[c->active[0]]; }

#endif
