/* forward.h: the forward pass of a Llama model over a batch of tokens from
 * several sequences, for the layer range the model was bound with.
 *
 * Contract: a batch holds n tokens; token i belongs to sequence slot
 * seq[i] at position pos[i]. For each slot, its tokens in the batch must
 * have consecutive positions continuing the slot's cached length (the
 * first at kv->len[slot]), all below the cache's context size; a batch
 * that breaks this is refused with a message and changes nothing.
 * Each token attends to the positions [0, pos] of its own slot.
 *
 * Input: token ids when the model holds the embeddings (l0 == 0), else
 * `in` = hidden states [n][n_embd]. Output: when the model holds the output
 * matrix (l1 == n_layer), logits [n_want][n_vocab] of the tokens whose want asks
 * for logits, in batch order (and cv_forward_pooled); otherwise hidden
 * states [n][n_embd] of every token.
 *
 * Determinism: every value a token produces is computed exactly as it
 * would be if that token were alone in its own batch, with any number of
 * threads (kernels reduce each output element in one fixed order), so the
 * logits are bit-identical across batch compositions, chunkings and
 * thread counts. cv_forward_run allocates nothing. */
#ifndef CONVOY_INFER_FORWARD_H
#define CONVOY_INFER_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "infer/kv.h"
#include "model/experts.h"
#include "model/llama.h"

typedef struct cv_batch {
    int32_t n_tokens;
    const int32_t *token; /* [n] ids (used when the model holds the embeddings) */
    const int32_t *pos;   /* [n] */
    const int32_t *seq;   /* [n] slot */
    const uint8_t *want;  /* [n] CV_WANT_*: produce logits for this token (last span only) */
} cv_batch;

/* Values of a token's want (also on the wire): no output; sample it; it is
 * a draft of what the slot's previous token samples (see span.h); its
 * final hidden state is pooled into its slot's embedding (no logits); the
 * same, and the slot's embedding is output. */
enum { CV_WANT_NONE = 0, CV_WANT_SAMPLE = 1, CV_WANT_DRAFT = 2, CV_WANT_POOL = 3, CV_WANT_EMBED = 4 };
#define CV_WANT_MAX CV_WANT_EMBED

/* Whether a row's want asks for logits (sampled rows and drafts), for the
 * pooled final hidden state, and for an output row (a token or an
 * embedding). */
static inline bool cv_want_logits(uint8_t w) { return w == CV_WANT_SAMPLE || w == CV_WANT_DRAFT; }
static inline bool cv_want_pools(uint8_t w) { return w == CV_WANT_POOL || w == CV_WANT_EMBED; }
static inline bool cv_want_output(uint8_t w) { return cv_want_logits(w) || w == CV_WANT_EMBED; }

typedef struct cv_forward cv_forward;

/* experts: a mixture of experts' cache (model/experts.h), with at least
 * cv_experts_min_slots(m, n_batch_max) slots; NULL for a dense model. */
cv_forward *cv_forward_create(const cv_llama *m, cv_kv *kv, cv_pool *pool, cv_experts *experts, int32_t n_batch_max,
                              char *err, size_t errlen);
void cv_forward_free(cv_forward *f);

int cv_forward_run(cv_forward *f, const cv_batch *b, const float *in, float *out, char *err, size_t errlen);
/* After a run of a model with the output matrix: the final hidden states (the output
 * norm applied) of the rows that pool (cv_want_pools), [n_pool][n_embd] in
 * batch order, valid until the next run. */
const float *cv_forward_pooled(const cv_forward *f);
/* The checks cv_forward_run makes of a batch, alone. With rollback, each
 * slot's first token may also start below the slot's cached length (for a
 * caller that cuts the slot there before running the batch). */
int cv_forward_check(cv_forward *f, const cv_batch *b, bool rollback, char *err, size_t errlen);

#endif
