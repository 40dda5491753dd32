/* engine_local.c: the engine's backend on one machine (engine_impl.h): one
 * cv_span (infer/span.h) holds every layer. A batch runs when it is
 * submitted (one in flight: depth 1) and its sampled ids wait for the
 * collect; the log-probabilities of its rows are computed when asked, from
 * the logits the span keeps until the next batch. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "engine/engine_impl.h"
#include "infer/span.h"

typedef struct engine_local {
    engine_backend base;
    cv_span span;
    int32_t n_vocab;
    int32_t *tokens;     /* [n_batch] sampled ids of the last batch */
    int32_t *row_seq;    /* [n_batch] the slot of each wanted row of the last batch */
    int32_t *n_logprobs; /* [n_slot] each slot's convoy_sampling_params.n_logprobs */
    int32_t n_done;      /* ids in tokens not yet collected, -1 when none */
} engine_local;

/* Runs a batch into l->tokens and notes each wanted row's slot for
 * local_logprobs; returns the number of wanted rows. */
static int32_t local_run(engine_local *l, const cv_batch *b, char *err, size_t errlen)
{
    if (cv_span_step(&l->span, b, NULL, NULL, l->tokens, err, errlen))
        return -1;
    int32_t n = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
        if (cv_want_output(b->want[t]))
            l->row_seq[n++] = b->seq[t];
    return n;
}

static int local_step(engine_backend *b, const cv_batch *batch, int32_t *tokens, char *err, size_t errlen)
{
    engine_local *l = (engine_local *)b;
    const int32_t n = local_run(l, batch, err, errlen);
    if (n < 0)
        return -1;
    memcpy(tokens, l->tokens, sizeof(int32_t) * (size_t)n);
    return 0;
}

static int local_submit(engine_backend *b, const cv_batch *batch, char *err, size_t errlen)
{
    engine_local *l = (engine_local *)b;
    if (l->n_done >= 0)
        return cv_errf(err, errlen, "a batch is in flight already (depth 1 on one machine)");
    const int32_t n = local_run(l, batch, err, errlen);
    if (n < 0)
        return -1;
    l->n_done = n;
    return 0;
}

static int local_collect(engine_backend *b, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen)
{
    engine_local *l = (engine_local *)b;
    if (l->n_done < 0)
        return cv_errf(err, errlen, "no batch in flight");
    memcpy(tokens, l->tokens, sizeof(int32_t) * (size_t)l->n_done);
    *n_tokens = l->n_done;
    l->n_done = -1;
    return 0;
}

static const float *local_logits(const engine_backend *b, int32_t i)
{
    return cv_span_logits(&((const engine_local *)b)->span, i);
}

static const float *local_embedding(const engine_backend *b, int32_t i)
{
    return cv_span_embedding(&((const engine_local *)b)->span, i);
}

static int local_logprobs(const engine_backend *b, int32_t i, cv_logprob *out)
{
    const engine_local *l = (const engine_local *)b;
    const int32_t n = l->n_logprobs[l->row_seq[i]];
    if (n < 0 || l->tokens[i] < 0)
        return 0;
    cv_logprobs_row(cv_span_logits(&l->span, i), l->n_vocab, l->tokens[i], n, out);
    return 1 + n;
}

static int local_set_sampler(engine_backend *b, int32_t seq, const cv_sampler_params *sp, int32_t n_logprobs,
                             char *err, size_t errlen)
{
    engine_local *l = (engine_local *)b;
    if (cv_span_set_sampler(&l->span, seq, sp, err, errlen))
        return -1;
    l->n_logprobs[seq] = n_logprobs;
    return 0;
}

static int local_set_grammar(engine_backend *b, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                             size_t errlen)
{
    return cv_span_set_grammar(&((engine_local *)b)->span, seq, text, len, from, err, errlen);
}

static int32_t local_seq_len(const engine_backend *b, int32_t seq)
{
    return ((const engine_local *)b)->span.kv.len[seq];
}

static int local_seq_truncate(engine_backend *b, int32_t seq, int32_t len, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    cv_span_seq_truncate(&((engine_local *)b)->span, seq, len);
    return 0;
}

static int local_seq_copy(engine_backend *b, int32_t src, int32_t dst, int32_t len, char *err, size_t errlen)
{
    engine_local *l = (engine_local *)b;
    (void)err, (void)errlen;
    cv_span_seq_copy(&l->span, src, dst, len);
    l->n_logprobs[dst] = -1;
    return 0;
}

static int local_seq_free(engine_backend *b, int32_t seq, char *err, size_t errlen)
{
    engine_local *l = (engine_local *)b;
    (void)err, (void)errlen;
    cv_span_seq_free(&l->span, seq);
    l->n_logprobs[seq] = -1;
    return 0;
}

/* One machine is its own and only node: always up, one stage, no costs
 * measured across links. */
static int local_up(engine_backend *b, char *err, size_t errlen)
{
    (void)b, (void)err, (void)errlen;
    return 0;
}

static bool local_never(const engine_backend *b)
{
    (void)b;
    return false;
}

static int local_stages(const engine_backend *b)
{
    (void)b;
    return 1;
}

static double local_stage_seconds(const engine_backend *b)
{
    (void)b;
    return 0.0;
}

static void local_node_costs(const engine_backend *b, convoy_node_costs *out)
{
    (void)b;
    out->n_nodes = 0;
}

static void local_close(engine_backend *b)
{
    engine_local *l = (engine_local *)b;
    cv_span_close(&l->span);
    cv_free(l->tokens);
    cv_free(l->row_seq);
    cv_free(l->n_logprobs);
    cv_free(l);
}

static const engine_ops local_ops = {
    .step = local_step, .submit = local_submit, .collect = local_collect, .logits = local_logits,
    .embedding = local_embedding, .logprobs = local_logprobs, .set_sampler = local_set_sampler,
    .set_grammar = local_set_grammar, .seq_len = local_seq_len, .seq_truncate = local_seq_truncate,
    .seq_copy = local_seq_copy, .seq_free = local_seq_free, .check = local_up, .reconnect = local_up,
    .is_down = local_never, .collect_waited = local_never, .stages = local_stages,
    .stage_seconds = local_stage_seconds, .node_costs = local_node_costs, .close = local_close,
};

engine_backend *cv_engine_local_open(const char *path, const cv_llama *meta, const convoy_ctx_params *p,
                                     int32_t pooling, char *err, size_t errlen)
{
    engine_local *l = cv_calloc(1, sizeof *l);
    if (!l) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    const cv_span_params sp = {.l0 = 0, .l1 = -1, .n_threads = p->n_threads, .n_ctx = p->n_ctx,
                                .n_slot = p->n_slot, .n_batch = p->n_batch, .kv_f16 = p->kv_f16,
                                .mlock = p->mlock, .pooling = pooling};
    const uint64_t need = cv_span_bytes_needed(meta, &sp);
    if (p->mem_budget && need > p->mem_budget) {
        cv_errf(err, errlen, "%s needs %.2f GB here (weights, KV cache, buffers), the budget is %.2f GB: "
                             "split it over nodes with --nodes",
                path, need / 1e9, p->mem_budget / 1e9);
        cv_free(l);
        return NULL;
    }
    if (cv_span_open(&l->span, path, &sp, err, errlen)) {
        cv_free(l);
        return NULL;
    }
    l->base.ops = &local_ops;
    l->base.depth = 1;
    l->base.n_ctx = l->span.kv.n_ctx;
    l->n_vocab = meta->hp.n_vocab;
    l->n_done = -1;
    l->tokens = cv_malloc(sizeof(int32_t) * (size_t)p->n_batch);
    l->row_seq = cv_malloc(sizeof(int32_t) * (size_t)p->n_batch);
    l->n_logprobs = cv_malloc(sizeof(int32_t) * (size_t)p->n_slot);
    if (!l->tokens || !l->row_seq || !l->n_logprobs) {
        local_close(&l->base);
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    for (int32_t i = 0; i < p->n_slot; i++)
        l->n_logprobs[i] = -1;
    return &l->base;
}
