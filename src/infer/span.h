/* span.h: the compute of a layer range: the model bound for layers
 * [l0, l1), a KV cache of n_slot slots, a thread pool, the forward pass
 * and, when the span holds the output matrix, one sampler per slot: that
 * is the last span, the one that samples. One machine runs one span of
 * every layer; a pipeline stage (the `convoy stage` process of
 * pipe/node.c, or the head's local first stage) runs one span of its
 * layers. "Stage" is kept for that position in the pipeline.
 *
 * Contract: cv_span_step runs one batch. A span holding the embeddings
 * reads token ids; any other reads hidden states `in` [n][n_embd]. A span
 * without the output matrix writes hidden states `out_hidden` [n][n_embd].
 * The last span first records every token of the batch in its slot's
 * sampler history (in batch order: the ids that enter the model are the
 * history, the same on one machine and on a chain), then samples every
 * wanted row with its slot's sampler and writes the ids to `out_tokens`
 * (one per wanted row, in batch order); the wanted rows' logits stay
 * readable through cv_span_logits until the next step. A slot without
 * sampler parameters samples greedily. Nothing is allocated by a step. One
 * thread owns a span.
 *
 * Rollback: a slot's first token in a batch at a position below the slot's
 * cached length truncates the slot to that position first (KV and, at the
 * last span, the sampler history), so that a pipeline undoes rejected drafts
 * with the next batch instead of a message. A batch that is refused (bad
 * slot, positions, ids or drafts) is refused before anything is cut.
 *
 * Speculation: a token with want == CV_WANT_DRAFT is a draft: a guess of
 * what the previous token of its slot in the batch (wanted, one position
 * before) samples. The last span verifies drafts in batch order: each row that a
 * draft follows is sampled as it would be without one (see sampler.h); the
 * first id that differs from the draft ends the slot's emission, and its
 * later wanted rows emit -1 (and draw nothing from the RNG). The last span
 * then truncates the slot after the last emitted row's token.
 * Every token still enters the history in batch order, row by row, so each
 * row is sampled with exactly the history it would have without drafts.
 *
 * Windows in flight: a slot's first token in a batch may be a draft too: a
 * guess of the id the slot's last sampled row (in an earlier batch) gave,
 * sent before that batch's result came back. At the slot's length it is
 * verified like any draft (a wrong guess emits -1 from its own row on and
 * leaves the slot as it was). Past the slot's length, the slot was cut
 * back meanwhile and the window is stale: every span computes it at its
 * positions (the slot lengthened to them; the gap holds what it held), and
 * the last span cuts it off again: its rows emit -1, enter no history and
 * draw nothing.
 *
 * Embeddings: in the last span, a row with want CV_WANT_POOL or _EMBED adds its
 * final hidden state (the output norm applied; no logits, no sampling) to
 * its slot's pool, in batch order, which is position order: the pool does
 * not depend on how a sequence is cut into batches. Mean pooling sums the
 * rows in float (the mean is the sum divided by the rows), CLS keeps the
 * row at position 0, last keeps the latest. A row at position 0 starts
 * the pool anew; truncating a slot below the rows pooled, or freeing it,
 * empties its pool (a sum cannot give rows back). An _EMBED row is an
 * output row: it emits -1 (no token; its logits row is zeros) and its
 * slot's embedding, the pooled vector L2-normalized as llama.cpp's
 * common_embd_normalize (the norm summed in double), readable through
 * cv_span_embedding until the next step. */
#ifndef CONVOY_INFER_SPAN_H
#define CONVOY_INFER_SPAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "infer/constraint.h"
#include "infer/forward.h"
#include "infer/kv.h"
#include "infer/sampler.h"
#include "model/llama.h"

typedef struct cv_span_params {
    int32_t l0, l1;    /* layer range; l1 < 0 = n_layer */
    int32_t n_threads;
    int32_t n_ctx;     /* 0 = the model's training context */
    int32_t n_slot;
    int32_t n_batch;
    bool kv_f16;
    bool mlock;        /* the layers' weights locked in memory (mlock: never swapped out) */
    bool from_hidden;  /* it reads a previous stage's hidden states, never token ids (a node) */
    int32_t expert_slots; /* a mixture of experts' cache (model/experts.h); 0: a slot per expert */
    int32_t pooling;   /* the last span's pooling: CV_POOL_MEAN, _CLS or _LAST; another value refuses rows that pool */
} cv_span_params;

typedef struct cv_span {
    cv_llama model;
    cv_kv kv;
    cv_pool *pool;
    cv_experts *experts;   /* a mixture of experts' cache, else NULL */
    cv_forward *fwd;
    cv_sampler **samplers; /* [n_slot] in the last span */
    cv_constraint **constraints; /* [n_slot] in the last span: a slot's grammar, or NULL */
    cv_vocab_pieces pieces;      /* loaded with the first grammar */
    float *masked;               /* [n_vocab] a row's logits under its slot's grammar */
    float *logits;         /* [n_batch][n_vocab] in the last span */
    int32_t *slot_row;     /* [n_slot] step scratch: a slot's latest row in the batch so far */
    int32_t *draft_of;     /* [n_batch] step scratch: the draft that follows a row, or -1 */
    uint8_t *guess;        /* [n_batch] step scratch: the row guesses its slot's last sampled id */
    int32_t *last_id;      /* [n_slot][2] a slot's last sampled id and its row's position (-1: none) */
    int32_t *stale_len;    /* [n_slot] step scratch: a stale window's slot length, else -1 */
    int32_t n_batch;
    int32_t pooling;       /* cv_span_params' */
    float *sums;           /* [n_slot][n_embd] in the last span: each slot's pool of final hidden states */
    int32_t *n_pooled;     /* [n_slot] the rows each pool holds */
    float *embd;           /* [n_batch][n_embd] in the last span: the embeddings of the last step's output rows */
    uint8_t *row_embd;     /* [n_batch] in the last span: whether output row i of the last step is an embedding */
} cv_span;

/* Memory a span allocates besides its weights, each allocation counted in
 * whole pages (what it can hold resident): KV cache per layer; `fixed`, the
 * forward pass's buffers (attention scratch per thread included), the pool
 * and bookkeeping; in the last span the logits and a sampler per slot (its
 * history as long as the context: a sampler's penalty_last_n must not be
 * longer for this to hold). */
typedef struct cv_span_costs {
    uint64_t kv_per_layer;
    uint64_t fixed;
    uint64_t last_extra;
} cv_span_costs;

void cv_span_costs_of(const cv_llama *m, const cv_span_params *p, cv_span_costs *c);
/* Bytes a span with these parameters needs: weights of its layers (and of
 * the embeddings or output matrix it holds), KV cache and buffers. Reads only the
 * tensor directory (m may be bound for any range). */
uint64_t cv_span_bytes_needed(const cv_llama *m, const cv_span_params *p);

/* Microseconds one layer takes per token on this machine with n_threads
 * (the mean of matmuls over up to 64 MiB of a layer's weight type, run
 * for 0.2 s: a CPU quota or a busy neighbour counts), for the layer
 * planner; 0 when the type has no kernel to time. */
uint32_t cv_span_speed_probe(const cv_llama *m, int32_t n_threads);

int cv_span_open(cv_span *s, const char *path, const cv_span_params *p, char *err, size_t errlen);
void cv_span_close(cv_span *s);

int cv_span_step(cv_span *s, const cv_batch *b, const float *in, float *out_hidden, int32_t *out_tokens,
                  char *err, size_t errlen);
/* Logits of wanted row i of the last step (the last span only). */
static inline const float *cv_span_logits(const cv_span *s, int32_t i)
{
    return s->logits + (size_t)i * (size_t)s->model.hp.n_vocab;
}

/* The embedding of output row i of the last step (the last span), or NULL
 * when the row is not an _EMBED row. */
const float *cv_span_embedding(const cv_span *s, int32_t i);

/* Sampler parameters of a slot (the last span): allocates, so it belongs to
 * request setup, not to a step. */
int cv_span_set_sampler(cv_span *s, int32_t slot, const cv_sampler_params *p, char *err, size_t errlen);
/* Holds a slot's output to a GBNF grammar from position `from` on (see
 * constraint.h), until its sampler is set again or it is freed: request
 * setup too, after cv_span_set_sampler. */
int cv_span_set_grammar(cv_span *s, int32_t slot, const char *text, size_t len, int32_t from, char *err,
                        size_t errlen);
void cv_span_seq_truncate(cv_span *s, int32_t slot, int32_t len);
/* Empties a slot and resets its sampler to greedy, without a grammar. */
void cv_span_seq_free(cv_span *s, int32_t slot);
/* Empties slot dst, then gives it src's first len positions (a prompt
 * cache's prefix: the KV rows copied, so the same bits). */
void cv_span_seq_copy(cv_span *s, int32_t src, int32_t dst, int32_t len);

#endif
