/* journal.h: what the head keeps of every slot of a pipeline, so that a
 * new chain can be brought to the same state after a node fails.
 *
 * Contract: the journal mirrors the head's own view of each slot: the
 * token fed at every position and the slot's length as the last span
 * keeps it (a batch cuts a slot back to its first position in it, a
 * rejected draft to its own position, truncate and free as asked), the
 * sampler last set with the length the slot had then, and the RNG draws
 * that sampler has made since (one per emitted id, none when greedy).
 * Batches in flight are copied at submit and applied at collect, so a slot
 * in one is replayed as it was before it; a stale window (span.h) leaves
 * its slot as it was. A slot's truncate, free and sampler come while none
 * of its batches is in flight (convoy.h's rule).
 *
 * cv_journal_replay brings a freshly opened chain to that state: every slot's
 * tokens are prefilled (nothing sampled), its sampler set where it was set,
 * starting after the draws already made, and the batches that were in
 * flight are submitted again in order. A slot whose last position is a row
 * that emitted an id has that row sampled again, with the draw it took, so
 * that the new last stage knows the id a window in flight guesses. Because kernels are batch-invariant
 * and the sampler resumes its RNG, the chain then computes the very bits
 * the failed one would have: a request goes on as if nothing had happened.
 * A slot's grammar (copied when set, the only allocation after init) is
 * set again right after its sampler. A slot's rows that its pool holds
 * (an embedding under way) are replayed as pooled rows, in position order,
 * so the new last stage's pool has the same bits. Replay allocates
 * nothing. */
#ifndef CONVOY_ENGINE_JOURNAL_H
#define CONVOY_ENGINE_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer/forward.h"
#include "infer/sampler.h"
#include "pipe/chain.h"

typedef struct journal_slot {
    int32_t len;               /* positions the slot holds */
    int32_t sampled_at;        /* the position of the last row that emitted an id; -1: none */
    int32_t sampler_at;        /* its length when the sampler was set; -1: none set */
    cv_sampler_params sampler; /* n_draws counts the draws made so far; its bias is `bias` */
    cv_logit_bias *bias;       /* the sampler's logit bias (sampler.n_bias pairs), or NULL */
    int32_t n_logprobs;
    char *grammar;             /* GBNF text (grammar_len bytes) the slot's output is held to, or NULL */
    uint32_t grammar_len;
    int32_t grammar_from;
    int32_t pooled;            /* rows in the last stage's pool (span.h): its first positions, as serve pools */
} journal_slot;

typedef struct journal_batch { /* a copy of a batch in flight */
    int32_t n_tokens;
    int32_t *token, *pos, *seq; /* [n_batch] */
    uint8_t *want;              /* [n_batch] */
} journal_batch;

typedef struct journal {
    int32_t n_slot, n_ctx, n_batch;
    int32_t *tok;       /* [n_slot][n_ctx] the token at each position */
    journal_slot *slot; /* [n_slot] */
    journal_batch flight[CV_CHAIN_MAX_NODES];
    int oldest, in_flight;
    journal_batch feed; /* replay's prefill batch */
    uint8_t *stale;     /* [n_slot] collect's scratch: the slot's rows are a stale window */
    int32_t *ignored;   /* [n_batch] replay's results, not read */
} journal;

int cv_journal_init(journal *j, int32_t n_slot, int32_t n_ctx, int32_t n_batch, char *err, size_t errlen);
void cv_journal_free(journal *j);

/* A batch sent; its results, in wanted-row order (-1 after a rejected draft). */
void cv_journal_submit(journal *j, const cv_batch *b);
void cv_journal_collect(journal *j, const int32_t *tokens);
/* Batches in flight are lost with the chain that went down. */
void cv_journal_drop_flights(journal *j);

/* Copies the logit bias: -1 when out of memory. */
int cv_journal_set_sampler(journal *j, int32_t seq, const cv_sampler_params *p, int32_t n_logprobs);
/* Copies the grammar: -1 when out of memory. */
int cv_journal_set_grammar(journal *j, int32_t seq, const char *text, size_t len, int32_t from);
void cv_journal_truncate(journal *j, int32_t seq, int32_t len);
void cv_journal_free_seq(journal *j, int32_t seq);
/* dst is emptied, then holds src's first len tokens (at most src's length). */
void cv_journal_copy(journal *j, int32_t src, int32_t dst, int32_t len);

/* Brings chain c, just opened, to the journal's state (above); *n_fed
 * counts the tokens prefilled. -1 with the chain's error. */
int cv_journal_replay(journal *j, cv_chain *c, int64_t *n_fed, char *err, size_t errlen);

#endif
