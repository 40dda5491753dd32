/* chain.h: the head's side of a pipeline.
 *
 * Contract: cv_chain_open connects to the nodes, asks each for its memory
 * budget and speed, plans the layers (cv_plan_layers; opts->split
 * overrides), assigns them from the last node to the first (each node
 * connects to its successor, so hidden states go from stage to stage
 * without passing through the head), and binds the embeddings locally.
 * Every HELLO carries the model's metadata hash and every assignment the
 * content hashes of the tensors that node will read: a node whose model
 * or weights differ refuses, naming the first tensor that differs. A node
 * without a model file (ship.h) is planned like one that holds every
 * layer, and answers its assignment by fetching them: the head ships the
 * shard of its layers before it goes on (progress through opts->log).
 * A first node named "local" is this machine: it is planned like the
 * others (with opts->local_mem_budget and its measured speed) and its
 * layers run in the head, before the FORWARD leaves, so that a machine can
 * serve and hold a stage without a hop between the two.
 * cv_chain_step embeds a batch (and runs the local layers), sends it to the
 * first node as one FORWARD,
 * and waits for the last node's RESULT: one sampled id per wanted token
 * (and, with opts->want_logits, the full logits rows). A node that
 * refuses, disconnects, falls silent (no frame, not even a working node's
 * pulse, see proto.h) for opts->io_timeout_ms or sends garbage
 * makes the call fail with a message naming that node; the chain is then
 * unusable (cv_chain_close it). Sequence operations and sampler settings
 * travel the chain in order with the FORWARDs. One thread uses a chain. */
#ifndef CONVOY_PIPE_CHAIN_H
#define CONVOY_PIPE_CHAIN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer/forward.h"
#include "infer/logprobs.h"
#include "infer/sampler.h"
#include "model/fingerprint.h"
#include "pipe/link.h"
#include "pipe/plan.h"

typedef struct cv_chain cv_chain;

#define CV_CHAIN_LOCAL "local"

typedef struct cv_chain_opts {
    const char *const *nodes; /* "host:port" of each node, in chain order; the first may be "local" */
    int n_nodes;
    const int32_t *split;     /* layers per node, or NULL to plan */
    int32_t n_threads;        /* the head's threads (embedding, local layers) */
    uint64_t local_mem_budget; /* bytes the local stage may use; 0 = no limit */
    int32_t n_ctx;            /* 0 = the model's training context */
    int32_t n_slot;
    int32_t n_batch;
    uint32_t act_type;        /* CV_ACT_F32 unless a lossy mode is asked for */
    bool kv_f16;              /* every stage's KV cache in F16 instead of F32 */
    bool mlock;               /* the local layers' weights locked in memory */
    bool want_logits;         /* RESULT carries full logits rows (tests) */
    int32_t pooling;          /* the embeddings' pooling type (CV_POOL_*), which the last node applies */
    /* the model's content hashes (cv_model_hashes_load of model_path), which
     * each node checks its layers' tensors against; NULL: open loads them */
    const cv_model_hashes *hashes;
    int connect_timeout_ms;
    int io_timeout_ms;        /* the longest the nodes may stay silent in a step: a working node pulses */
    const cv_seal_key *key;   /* the cluster key (seal.h): every link is keyed; NULL: plaintext, which a node
                                 not on loopback refuses to open unless insecure */
    bool insecure;
    /* Reopening after a failure: a node that cannot be reached (or is
     * `avoid`, the one that just failed) takes the place of the next spare
     * that can; with none left it is dropped when drop_unreachable (the
     * others then share its layers, if their budgets allow and there is no
     * split), else opening fails naming it. */
    const char *const *spares;
    int n_spares;
    const char *avoid;
    bool drop_unreachable;
    /* Reopening after a failure: speeds measured before will do, this
     * machine's (local_speed_us, from cv_chain_local_speed; 0 probes it)
     * and the nodes' (CV_FEAT_ANY_SPEED): a failover waits for no probe. */
    bool any_speed;
    uint32_t local_speed_us;
    int min_depth;            /* at least this many batches may be in flight (the depth a caller had) */
    int32_t streams;          /* batches the caller means to keep in flight, which the plan is for (plan.h's cost
                                 model): 1 = one sequence decoding */
    /* where lines about the chain go (layers shipped to a node that
     * receives them, ship.h); NULL: stderr, after "convoy: " */
    void (*log)(void *user, const char *line);
    void *log_user;
} cv_chain_opts;

cv_chain_opts cv_chain_default_opts(void);
/* Writes one formatted line to log(user, line), or to stderr after
 * "convoy: " when log is NULL: the chain's lines and the engine's. */
void cv_chain_vlog(void (*log)(void *user, const char *line), void *user, const char *fmt, va_list ap);
int cv_chain_open(cv_chain **out, const char *model_path, const cv_chain_opts *o, char *err, size_t errlen);
void cv_chain_close(cv_chain *c);

int cv_chain_step(cv_chain *c, const cv_batch *b, int32_t *tokens, char *err, size_t errlen);
/* Micro-batches: up to cv_chain_depth (the number of stages, local included,
 * or opts->min_depth when more) batches in flight, so that every stage works on a different one.
 * cv_chain_submit embeds a batch, runs the local layers, sends it and
 * returns without waiting for its result;
 * cv_chain_collect waits for the oldest batch in flight and writes one
 * sampled id per wanted token (*n_tokens of them). A sequence is in two
 * batches in flight only as speculative windows (infer/span.h). Results
 * and a sequence's tokens are the same as with cv_chain_step. */
int cv_chain_depth(const cv_chain *c);
/* The stages a batch passes, the local one included. */
int cv_chain_stages(const cv_chain *c);
/* Whether the last cv_chain_collect's result had not come yet when it was
 * called (it waited for it): its arrival is then the collect's return. */
bool cv_chain_result_waited(const cv_chain *c);
/* Microseconds per token of the slowest stage (its layers times its speed
 * probe, cv_span_speed_probe: decode's cost, an upper bound for a batch's
 * token); 0 when no stage measured its speed. */
uint32_t cv_chain_stage_us(const cv_chain *c);
/* Whether a failure made the chain unusable (a node refused, died, went
 * silent or sent garbage); it must then be closed and opened again. */
bool cv_chain_is_broken(const cv_chain *c);
/* The address of the node a broken chain's failure is blamed on, or NULL. */
const char *cv_chain_suspect(const cv_chain *c);
/* The plan in words: "layers [0, 4) here, [4, 8) on 10.0.0.2:7001, ...", with
 * how a mixture of experts holds each node's experts ("(experts paged: 40
 * slots for 96)": fewer slots than experts, read from the file as chosen). */
void cv_chain_describe(const cv_chain *c, char *buf, size_t len);
/* This machine's speed as the plan used it (us per layer and token), 0
 * without a local node. */
uint32_t cv_chain_local_speed(const cv_chain *c);
/* What each node answered: "here: budget 3.00 GB, 12 us per layer and
 * token; 10.0.0.2:7001: budget 8.00 GB, speed not measured, receives its
 * layers". */
void cv_chain_describe_nodes(const cv_chain *c, char *buf, size_t len);
int cv_chain_in_flight(const cv_chain *c);
int cv_chain_submit(cv_chain *c, const cv_batch *b, char *err, size_t errlen);
int cv_chain_collect(cv_chain *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen);
/* Logits of wanted row i of the last step (only with want_logits). */
const float *cv_chain_logits(const cv_chain *c, int32_t i);
/* The embedding of wanted row i of the last collect (an _EMBED row), else NULL. */
const float *cv_chain_embedding(const cv_chain *c, int32_t i);
/* n_logprobs: -1, or the alternatives the last node returns with each of
 * the slot's sampled ids (see cv_chain_logprobs). */
int cv_chain_set_sampler(cv_chain *c, int32_t seq, const cv_sampler_params *p, int32_t n_logprobs, char *err,
                         size_t errlen);
/* Holds a slot's output to a GBNF grammar from position `from` (SET_GRAMMAR,
 * after the slot's sampler; the last node parses it: check it first). */
int cv_chain_set_grammar(cv_chain *c, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                         size_t errlen);
/* Log-probabilities of wanted row i of the last step or collect, as the
 * last node computed them with cv_logprobs_row (infer/logprobs.h): writes
 * 1 + the slot's n_logprobs entries and returns that count; 0 when the row
 * emitted no token or its slot asked for none. */
int cv_chain_logprobs(const cv_chain *c, int32_t i, cv_logprob *out);
int cv_chain_seq_truncate(cv_chain *c, int32_t seq, int32_t len, char *err, size_t errlen);
int cv_chain_seq_free(cv_chain *c, int32_t seq, char *err, size_t errlen);
/* Empties seq dst, then gives it seq's first len positions on every node (SEQ_OP COPY). */
int cv_chain_seq_copy(cv_chain *c, int32_t seq, int32_t dst, int32_t len, char *err, size_t errlen);
int32_t cv_chain_seq_len(const cv_chain *c, int32_t seq);
int32_t cv_chain_n_ctx(const cv_chain *c);

/* Asks every serving node for a PONG (no batch may be in flight): 0 when
 * all answered within opts->io_timeout_ms, else -1 naming the first that
 * did not, and the chain is broken. An idle chain's health check. */
int cv_chain_ping(cv_chain *c, char *err, size_t errlen);

/* Measured costs (pipe/costs.h): each node's time per layer and token as
 * its stage measured it batch after batch (a mean that halves a sample's
 * weight every CV_COSTS_HALF_LIFE_MS), beside its speed probe; a hop's. */
typedef struct cv_chain_costs {
    int n_nodes;                               /* every node given, the left out and "local" included */
    const char *addr[CV_CHAIN_MAX_NODES];      /* "host:port" or "local", the chain's strings */
    int32_t first[CV_CHAIN_MAX_NODES], last[CV_CHAIN_MAX_NODES]; /* its layers [first, last) */
    double us_measured[CV_CHAIN_MAX_NODES];    /* 0: no batch measured (no layers, or none ran yet) */
    double us_probed[CV_CHAIN_MAX_NODES];      /* its answer to the plan's query, 0: not measured */
    uint64_t mem_budget[CV_CHAIN_MAX_NODES];   /* its answer to the plan's query */
    double us_last[CV_CHAIN_MAX_NODES];        /* the last batch's time on its stage, 0: none */
    double work[CV_CHAIN_MAX_NODES];           /* its stage's work per token in mean layers, 0: none */
    double us_hop;                             /* 0: no batch alone in flight measured */
    double us_last_round_trip;                 /* the last batch's round trip when alone in flight, else 0 */
    uint64_t batches;                          /* measured */
} cv_chain_costs;
void cv_chain_get_costs(const cv_chain *c, cv_chain_costs *out);
/* Plans the nodes again from the measured costs (plan.h; a node without
 * measurements, the left out among them, counts at us_known[i] when not 0,
 * else at its probed speed times what the measured nodes' measurements are
 * to their probes): the plan it would choose into *best, and the present
 * plan's time predicted from the same costs into *us_now. With
 * opts->split the plan stays (best is the present). Allocates. */
int cv_chain_replan(cv_chain *c, const double *us_known, cv_plan_result *best, double *us_now, char *err,
                    size_t errlen);

/* What the chain did: the plan and the traffic, for benchmarks. */
typedef struct cv_chain_stats {
    int32_t n_local;        /* layers [0, n_local) run here */
    int n_nodes;            /* remote nodes that serve layers */
    int32_t first[CV_CHAIN_MAX_NODES], last[CV_CHAIN_MAX_NODES];
    uint64_t bytes_sent;    /* by the head, headers included */
    uint64_t bytes_recv;
} cv_chain_stats;
void cv_chain_get_stats(cv_chain *c, cv_chain_stats *s);
/* The counters of the k-th serving node (compute time, steps, bytes sent),
 * asked over the wire; call between steps. */
int cv_chain_node_stats(cv_chain *c, int k, cv_msg_stats *out, char *err, size_t errlen);

#endif
