/* draft.h: drafters for speculative decoding, run at the head.
 *
 * Contract: a drafter proposes, for each sequence slot asked, up to k token
 * ids that it guesses follow the slot's history; the target model then
 * verifies them. Two kinds:
 *  - "ngram" (prompt lookup, no model): finds the most recent earlier
 *    occurrence of the history's last 3 ids (else 2, else 1) and proposes
 *    the ids that followed it, up to k; fewer when the history ends first,
 *    none when nothing matches. Keeps no state per slot.
 *  - "model" (spec = path of a GGUF draft model whose vocabulary is the
 *    target's): proposes the draft model's greedy continuation, k ids, or
 *    fewer where the slot's context would overflow (n_ctx positions). It
 *    keeps each slot's history in its own KV cache, reuses the longest
 *    prefix the new history shares with it (a rejection is a truncation)
 *    and runs all requests of one call in shared forward steps.
 *
 * Ownership: the drafter owns its model, KV cache and every buffer, all
 * made by cv_drafter_open; cv_drafter_propose and cv_drafter_seq_free
 * allocate nothing. The caller owns the requests, their histories and
 * their out arrays; the drafter reads hist only during the call. One
 * thread owns a drafter. */
#ifndef CONVOY_INFER_DRAFT_H
#define CONVOY_INFER_DRAFT_H

#include <stddef.h>
#include <stdint.h>

typedef struct cv_drafter cv_drafter;

typedef struct cv_drafter_params {
    int32_t n_slot;    /* sequence slots (same numbering as the target's) */
    int32_t n_ctx;     /* positions per slot (model drafter; 0 = the draft model's training context) */
    int32_t n_threads; /* threads of the draft model (model drafter only) */
    int32_t n_vocab;   /* the target's vocabulary size: a draft model must match it */
    int32_t k_max;     /* most tokens one proposal may ask for */
} cv_drafter_params;

/* spec is "ngram" (prompt lookup, no model) or the path of a GGUF draft
 * model. Returns NULL with a message on failure. */
cv_drafter *cv_drafter_open(const char *spec, const cv_drafter_params *p, char *err, size_t errlen);
void cv_drafter_free(cv_drafter *d);
/* "ngram" or "model". */
const char *cv_drafter_name(const cv_drafter *d);

/* One sequence's proposal request. hist[0..n_hist) is the whole token
 * history of the slot (prompt + generated); its last id is the newest
 * token, which the target has not run yet. The drafter writes up to k
 * (1 <= k <= k_max) proposed continuation ids to out and sets n_out. */
typedef struct cv_draft_req {
    int32_t slot;
    const int32_t *hist;
    int32_t n_hist;
    int32_t k;
    int32_t *out;  /* [k] */
    int32_t n_out; /* written */
} cv_draft_req;

/* Proposes for n requests (distinct slots) at once; the model drafter
 * batches them into shared forward steps. Returns 0, or -1 with a message
 * (a bad request, or an id outside the vocabulary) and every n_out 0; the
 * drafter stays usable after a failure. Allocates nothing. */
int cv_drafter_propose(cv_drafter *d, cv_draft_req *reqs, int32_t n, char *err, size_t errlen);
/* Forgets a slot (its request ended). */
void cv_drafter_seq_free(cv_drafter *d, int32_t slot);

#endif
