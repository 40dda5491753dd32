/* sched.h: the scheduler of `convoy serve`: the single owner of sequences.
 *
 * Contract: cv_sched_create starts one inference thread that owns the
 * convoy_ctx from then on (nobody else may touch it until cv_sched_free).
 * Any thread may cv_sched_submit a request: its prompt and parameters are
 * copied, and the request waits in a bounded queue until a sequence slot
 * is free. The queue holds at most queue_cap requests beyond the free
 * slots; a submit past that is refused with CV_SUBMIT_FULL (the server's
 * 503). Each step of the inference thread builds one batch: first the next
 * token of every decoding sequence, then prompt chunks of the sequences
 * still reading their prompt, up to the context's batch size (the prefill
 * order rotates, so a long prompt delays nobody by more than its chunks).
 * A slot is set up with convoy_set_sampler (the request's own seed) and
 * its grammar, if it has one, when its request starts, so a request's
 * tokens never depend on what else runs: they are the tokens it would get
 * alone. The step loop allocates nothing.
 *
 * The prompt cache (on unless cv_sched_set_prompt_cache turns it off): a
 * slot whose request ends keeps its KV and the tokens it holds (a failed
 * request's slot is emptied). A queued request goes to the free slot that
 * holds the longest prefix of its prompt (ties, and no match: the least
 * recently used slot), which is cut back to that prefix, and only the
 * rest of the prompt runs: at least its last token, and, for a request
 * with repetition, frequency or presence penalties, its last penalty_last_n
 * tokens. The tokens, logits and logprobs are those of an empty slot, bit
 * for bit (the kernels are batch- and chunk-invariant). cv_request_cached
 * tells how many prompt tokens came from the cache; a request with
 * cv_request_params.cold takes none. The context's slots past the
 * scheduler's n_slot are a cache beyond the slots: none runs a request;
 * the prefixes a slot would lose when it is reused go there first (one
 * holding a prefix of them, else the least recently used), and a request
 * whose prompt one of them holds more of than any free slot gets that
 * prefix copied into its slot (convoy_seq_copy), so that a popular system
 * prompt outlives other users passing through its slot.
 *
 * A pipeline whose node fails (died, went silent or refused) fails over in
 * the engine (convoy.h): requests pause and go on with the same tokens
 * (stats: failovers, failover_seconds). When no new chain can be opened the
 * pipeline is down: every running request ends with the error, submits are
 * refused with CV_SUBMIT_DOWN (the server's 503, naming the failure) and
 * the inference thread reconnects by itself, after waits doubling from
 * 0.5 s to 4 s, until the nodes answer again (stats: down, reconnects). An
 * idle engine is checked every 0.5 s (convoy_ctx_check), so a node that dies
 * or stops while nobody asks is replaced (or the pipeline goes down) too.
 *
 * Clients (cv_request_params.client: the server gives each peer address
 * its own value). A free slot goes to the queued request whose client runs
 * the fewest requests, the oldest among those, so one client's long queue
 * does not keep another waiting behind it; and no client runs more than
 * cv_sched_set_client_slots' share at once (default: every slot), so that
 * with a share below the slots a newcomer finds a slot free at once. The
 * queue's bound counts, for each submit, only the free slots its client may
 * still take. Who runs with whom never changes a request's tokens.
 *
 * Speculation (cv_sched_set_spec): every decoding sequence then
 * speculates. The decode rows of a batch become, per sequence, its newest
 * token followed by the drafts the convoy_spec proposes for it (one
 * proposal call for all decoding sequences of the batch); prompt chunks
 * follow as without drafts. The drafts count against the batch size: the
 * newest tokens come first, the rows they leave free are shared equally
 * among the sequences (then what some leave goes to the others), and a
 * sequence never drafts past what it can still emit (max_tokens, the
 * context). A round emits the accepted drafts' outputs in order through
 * the same end checks as single tokens (what follows an end is dropped),
 * so a request gets the ids it would get without speculation, alone or
 * not, greedy or sampled (each row is sampled as without drafts, and a
 * rejected draft's rows draw nothing).
 *
 * Windows in flight (a pipeline whose context allows more batches in
 * flight than it has stages: convoy_ctx_params.depth): a decoding sequence
 * keeps up to the convoy_spec's windows (convoy_spec_windows) in flight,
 * each in a different batch: while one travels, the next holds drafts
 * that continue the previous window's as if it were accepted whole, its
 * first draft a guess of what that window's last row samples. A window cut
 * short (a draft rejected) makes the ones behind it stale: the engine
 * computes and drops them, the scheduler ignores their rows, and the next
 * window starts from the last emitted token. The ids are still plain
 * decoding's. Windows ride in the same batches as the other sequences'
 * rows and prompt chunks, so a stale window costs another request only
 * the rows it adds to a step.
 *
 * Embeddings (cv_request_params.embed): a request that takes a slot like a
 * completion, always cold (no cached prefix: every row of its prompt must
 * be pooled), and runs its prompt in chunks like one (batched with the
 * other slots' rows) with want CONVOY_WANT_POOL, its last row
 * CONVOY_WANT_EMBED; it generates nothing and ends with CV_FINISH_STOP
 * and its vector (cv_request_embedding) when that row comes back. Its
 * prompt may fill the context. Several inputs of one HTTP request are
 * separate requests, which run in parallel slots. The slot then keeps the
 * prompt's KV for the cache like any other (the pool is no part of it).
 *
 * A request ends with CV_FINISH_STOP (an end-of-generation token, which is
 * not part of the output), CV_FINISH_LENGTH (max_tokens reached or the
 * context is full), CV_FINISH_CANCELLED (cv_request_cancel) or
 * CV_FINISH_ERROR (the engine failed, or gave no logprobs for a token of
 * a request that asked for them; cv_request_error says why). Its output
 * is append-only: cv_request_wait returns how many tokens exist, and
 * tokens [0, n) (with their logprobs, when asked for: convoy_logprobs'
 * on one machine and on a pipeline alike) never change afterwards, so the
 * caller reads them without a lock. The submitter owns
 * one reference and gives it up with cv_request_release (which also
 * cancels); the scheduler drops its own when the request ends. */
#ifndef CONVOY_SERVE_SCHED_H
#define CONVOY_SERVE_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convoy.h"


typedef struct cv_sched cv_sched;
typedef struct cv_request cv_request;

typedef enum cv_finish {
    CV_RUNNING = 0,
    CV_FINISH_STOP,
    CV_FINISH_LENGTH,
    CV_FINISH_CANCELLED,
    CV_FINISH_ERROR,
} cv_finish;

typedef enum cv_submit_result { CV_SUBMIT_OK = 0, CV_SUBMIT_FULL, CV_SUBMIT_DOWN, CV_SUBMIT_ERROR } cv_submit_result;

typedef struct cv_request_params {
    const int32_t *prompt;    /* copied at submit */
    int32_t n_prompt;         /* >= 1 and < the context */
    int32_t max_tokens;       /* >= 1 and <= context - n_prompt */
    convoy_sampling_params sampler; /* its n_logprobs is ignored: top_logprobs sets it */
    bool ignore_eos;          /* end-of-generation tokens are output like any other */
    int32_t top_logprobs;     /* -1: no logprobs; else 0..CONVOY_MAX_TOP_LOGPROBS alternatives per token */
    uint64_t client;          /* who sent it: requests of one client share its slots (see above) */
    const char *grammar;      /* NULL, or GBNF text the output is held to (convoy_set_grammar); copied at submit */
    size_t grammar_len;
    bool cold;                /* reuse no cached prompt tokens (llama-server's cache_prompt: false) */
    bool pin;                 /* run in slot `slot` (llama-server's id_slot), waiting until it is free */
    int32_t slot;
    bool embed;               /* an embedding (see above): max_tokens, logprobs and grammar do not apply */
} cv_request_params;

typedef struct cv_sched_stats {
    uint64_t requests_finished[5]; /* by cv_finish (index 0 unused) */
    uint64_t prompt_tokens;        /* prompt tokens run through the model */
    uint64_t prompt_tokens_cached; /* prompt tokens taken from the slots' cache instead */
    uint64_t generated_tokens;     /* tokens sampled (accepted drafts' outputs included) */
    uint64_t steps;
    uint64_t steps_shared;         /* steps that carried tokens of two or more requests */
    uint64_t batch_tokens;         /* tokens over all steps */
    double step_seconds;           /* time inside convoy_step */
    double ttft_seconds;           /* sum over requests of submit -> first token */
    uint64_t ttft_count;
    double tokens_per_second;      /* sampled tokens per second over the last ~10 s */
    int32_t queued, active, n_slot, queue_cap, n_ctx;
    bool speculating;              /* a convoy_spec is set; then its convoy_spec_get_stats: */
    uint64_t spec_rounds;          /* rounds that drafts were asked for (0 drafts included) */
    uint64_t spec_drafted;         /* drafts sent */
    uint64_t spec_accepted;        /* drafts accepted */
    uint64_t windows_sent;         /* windows collected: a decode run each, speculating */
    uint64_t windows_stale;        /* of them dropped: an earlier window of their sequence was cut */
    uint64_t windows_whole;        /* of them accepted whole: every draft kept */
    bool failing;                  /* the last step failed (a pipeline node died, ...), or a failover is at work */
    bool down;                     /* the pipeline is down: requests are refused, reconnects are tried */
    double retry_in;               /* while down: seconds until the next reconnect */
    char last_error[512];          /* its message */
    uint64_t reconnects;           /* times the pipeline came back */
    uint64_t failovers;            /* the engine's convoy_ctx_stats */
    double failover_seconds;
    uint64_t rebalances, rebalances_undone;
    double rebalance_seconds;
    convoy_node_costs nodes;       /* a pipeline's measured costs */
} cv_sched_stats;

/* ctx must have been created for `model`; the scheduler owns it until
 * cv_sched_free (which does not free it). */
cv_sched *cv_sched_create(convoy_ctx *ctx, const convoy_model *model, int32_t n_slot, int32_t queue_cap,
                          char *err, size_t errlen);
/* Makes every decoding sequence speculate with spec (NULL: none), which
 * must have been created for the scheduler's context. Call before the
 * first cv_sched_submit and never while requests run: it sets fields that
 * the inference thread reads without the lock. The scheduler uses spec from
 * its inference thread until cv_sched_free, which does not free it. Fails
 * when out of memory or when a spec was set already. */
int cv_sched_set_spec(cv_sched *s, convoy_spec *spec, char *err, size_t errlen);
/* Whether slots keep their cache for the next request (default true); call
 * before the first submit. */
void cv_sched_set_prompt_cache(cv_sched *s, bool on);
/* What slot id holds: n_tokens positions (a running request's prompt and
 * output so far, or an idle slot's kept tokens), of n_ctx. */
typedef struct cv_slot_info {
    int32_t id, n_ctx, n_tokens;
    bool processing;
} cv_slot_info;
/* Fills out[0 .. n_slot) (out holds the scheduler's n_slot); returns n_slot. */
int32_t cv_sched_get_slots(cv_sched *s, cv_slot_info *out);
/* An idle slot's kept tokens (out holds the context's n_ctx): their count,
 * or -1 with the reason (no such slot, or it is running a request). */
int32_t cv_sched_slot_tokens(cv_sched *s, int32_t id, int32_t *out, char *err, size_t errlen);
/* Makes an idle slot forget its kept tokens: their count, or -1 as above. */
int32_t cv_sched_slot_erase(cv_sched *s, int32_t id, char *err, size_t errlen);
/* The most slots one client may run at once: 1 to the slots (a larger n
 * means all of them). */
void cv_sched_set_client_slots(cv_sched *s, int32_t n);
/* Fails every queued and running request ("the server is shutting down"),
 * refuses new ones, and stops the inference thread. Idempotent. */
void cv_sched_stop(cv_sched *s);
void cv_sched_free(cv_sched *s);
void cv_sched_get_stats(cv_sched *s, cv_sched_stats *st);

/* n requests queued together, or none (the first refusal's result): the n
 * choices of one request, admitted in one pass when slots are free. */
cv_submit_result cv_sched_submit_all(cv_sched *s, const cv_request_params *p, int n, cv_request **out, char *err,
                                     size_t errlen);
cv_submit_result cv_sched_submit(cv_sched *s, const cv_request_params *p, cv_request **out, char *err,
                                 size_t errlen);

/* Waits until the request has more than n_seen tokens, has ended, or
 * timeout_ms passed; returns the number of tokens and sets *finish. */
int32_t cv_request_wait(cv_request *r, int32_t n_seen, int timeout_ms, cv_finish *finish);
const int32_t *cv_request_tokens(const cv_request *r);
/* The prompt tokens taken from the slot's cache (0 until the request has a slot). */
int32_t cv_request_cached(cv_request *r);
/* The logprobs of token i, as convoy_logprobs gives them: the sampled
 * id's, then top_logprobs alternatives (best first, ties to the lower id),
 * of the model's distribution (softmax of the raw logits, before penalties
 * and sampling). NULL when the request asked for none. */
const convoy_logprob *cv_request_logprobs(const cv_request *r, int32_t i);
/* An embedding request's vector (n_embd floats: convoy_embedding's, pooled
 * and L2-normalized) once it ended with CV_FINISH_STOP; else NULL. */
const float *cv_request_embedding(const cv_request *r);
/* The message of CV_FINISH_ERROR (valid once the request has ended). */
const char *cv_request_error(const cv_request *r);
void cv_request_cancel(cv_request *r);
void cv_request_release(cv_request *r);

#endif
