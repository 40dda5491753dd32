/* engine_impl.h: the engine's one front over two backends. engine.c is the
 * front: it implements convoy.h's models, contexts and steps, checks what
 * does not depend on where the layers run, and calls the backend that its
 * context chose once, when it was created: engine_local.c (one machine: a
 * cv_span holding every layer) or engine_chain.c (a cv_chain of pipeline
 * stages, with the journal that a failover replays and the rebalancer that
 * moves layers while serving). Private to src/engine/.
 *
 * Contract: each op does what the convoy_* function it is named for does
 * (convoy.h), for the part that depends on the backend: the same results,
 * the same errors. The front has checked its arguments' ranges first where
 * convoy.h's checks do not depend on the backend (the sampler's limits, a
 * grammar's text, the slots of a copy). A backend starts with an
 * engine_backend (its `base`) that the front reads: the ops, the sizes fixed
 * at open, and what convoy_ctx_get_stats and convoy_ctx_failing_over
 * report (counted by the chain; zero and false on one machine). */
#ifndef CV_ENGINE_IMPL_H
#define CV_ENGINE_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convoy.h"
#include "infer/forward.h"
#include "infer/logprobs.h"
#include "infer/sampler.h"
#include "model/llama.h"

typedef struct engine_backend engine_backend;

typedef struct engine_ops {
    /* batches: one at a time (step), or in flight (submit, then collect) */
    int (*step)(engine_backend *b, const cv_batch *batch, int32_t *tokens, char *err, size_t errlen);
    int (*submit)(engine_backend *b, const cv_batch *batch, char *err, size_t errlen);
    int (*collect)(engine_backend *b, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen);
    /* the last batch's wanted rows */
    const float *(*logits)(const engine_backend *b, int32_t i);
    const float *(*embedding)(const engine_backend *b, int32_t i);
    int (*logprobs)(const engine_backend *b, int32_t i, cv_logprob *out);
    /* slots: their samplers and grammars, lengths, and rolling them back */
    int (*set_sampler)(engine_backend *b, int32_t seq, const cv_sampler_params *sp, int32_t n_logprobs, char *err,
                       size_t errlen);
    int (*set_grammar)(engine_backend *b, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                       size_t errlen);
    int32_t (*seq_len)(const engine_backend *b, int32_t seq);
    int (*seq_truncate)(engine_backend *b, int32_t seq, int32_t len, char *err, size_t errlen);
    int (*seq_copy)(engine_backend *b, int32_t src, int32_t dst, int32_t len, char *err, size_t errlen);
    int (*seq_free)(engine_backend *b, int32_t seq, char *err, size_t errlen);
    /* the machines: their health and their measured costs */
    int (*check)(engine_backend *b, char *err, size_t errlen);
    int (*reconnect)(engine_backend *b, char *err, size_t errlen);
    bool (*is_down)(const engine_backend *b);
    bool (*collect_waited)(const engine_backend *b);
    int (*stages)(const engine_backend *b);
    double (*stage_seconds)(const engine_backend *b);
    void (*node_costs)(const engine_backend *b, convoy_node_costs *out);
    void (*close)(engine_backend *b);
} engine_ops;

struct engine_backend {
    const engine_ops *ops;
    int depth;                /* batches that may be in flight (1 on one machine) */
    int32_t n_ctx;            /* positions per slot */
    convoy_ctx_stats stats;   /* failovers and layer moves */
    atomic_bool failing_over; /* a failover is at work: other threads may read it */
};

/* Opens a backend for model `path` (meta: its hyperparameters) with the
 * context's parameters p and pooling type (convoy_ctx_params' or the
 * model's); NULL with a message in err on failure. */
engine_backend *cv_engine_local_open(const char *path, const cv_llama *meta, const convoy_ctx_params *p,
                                     int32_t pooling, char *err, size_t errlen);
engine_backend *cv_engine_chain_open(const char *path, const cv_llama *meta, const convoy_ctx_params *p,
                                     int32_t pooling, char *err, size_t errlen);

#endif
