/* sched_impl.h: the scheduler's own state, shared by its three files and
 * private to them: the step loop (sched.c), admission and the prompt
 * cache (sched_admit.c), and the submitters' side of a request
 * (sched_request.c). The locking rules are sched.c's design comment:
 * s->mu guards the queue, every request's shared state and the stats;
 * a function that ends in _locked is called with it held; the slots and
 * the batch buffers belong to the inference thread alone. */
#ifndef CONVOY_SERVE_SCHED_IMPL_H
#define CONVOY_SERVE_SCHED_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "serve/sched.h"

enum rq_state { RQ_QUEUED, RQ_ACTIVE, RQ_DONE };

struct cv_request {
    cv_sched *sched;
    pthread_cond_t cond;
    /* under sched->mu */
    int refs;
    enum rq_state state;
    bool cancelled;
    bool got_first;
    cv_finish finish;
    int32_t n_out;
    char error[256];
    /* fixed at submit */
    int32_t *prompt; /* [n_prompt + max_tokens]: the prompt, then the output (out) */
    int32_t n_prompt;
    int32_t max_tokens;
    convoy_sampling_params sampler; /* n_logprobs: the request's top_logprobs */
    bool ignore_eos;
    uint64_t client;
    char *grammar;       /* NULL or grammar_len bytes */
    size_t grammar_len;
    convoy_logit_bias *bias; /* sampler.logit_bias's copy, or NULL */
    bool cold;           /* start from an empty slot (cache_prompt: false) */
    bool pin;            /* run in slot_wanted only */
    int32_t slot_wanted;
    int32_t n_cached;    /* prompt tokens taken from the slot's cache (set at admission) */
    int32_t slot;        /* while RQ_ACTIVE */
    double t_submit;
    int32_t *out;        /* prompt + n_prompt: [max_tokens] */
    convoy_logprob *lp;  /* [max_tokens][1 + sampler.n_logprobs], or NULL */
    float *embd;         /* an embedding request's vector [n_embd], written before it ends; else NULL */
    bool has_embd;       /* the engine gave it (inference thread, before the request ends) */
};

enum slot_state { SLOT_FREE, SLOT_STARTING, SLOT_PREFILL, SLOT_DECODE, SLOT_ENDING };

typedef struct cv_slot {
    enum slot_state state;
    cv_request *req;
    int32_t source;    /* SLOT_STARTING: the slot holding the prompt's reused prefix (itself, a cache slot or a
                          free one) */
    int32_t n_fed;     /* prompt tokens in the cache (the positions too, while prefilling) */
    int32_t in_flight; /* batches in flight that carry a run of it (more than one: windows, pipelined prompt chunks) */
    int32_t n_live;    /* of them, windows not made stale */
    int32_t sent_end;  /* while n_live > 0: the history index after the last live window's rows */
    uint32_t epoch;    /* advanced when its windows in flight go stale (a cut, the request's end) */
    /* D's scratch while it builds a batch */
    bool sends;        /* a window goes in this batch */
    bool grouped;      /* it keeps one window in flight: the batch carries its group's rows */
    bool asked;        /* the drafter was asked for it (0 or more drafts came) */
    int32_t n_draft;   /* the drafts it carries */
} cv_slot;

/* What a slot's KV holds while no request runs in it: the token at each
 * of its first n positions. */
typedef struct cv_kept {
    int32_t *tok;  /* [n_ctx] */
    int32_t n;
    uint64_t used; /* s->use_clock when its last request started: the least recently used goes first */
} cv_kept;

/* A slot's run in a batch: its wanted rows are the batch's outputs
 * [row, row + n_want). Of a window's rows, n_want - n_draft come before its
 * drafts: its newest token, or none when it guesses. */
typedef struct cv_run {
    int32_t slot, row, n_want;
    int32_t n_draft;
    uint32_t epoch; /* the slot's when it was sent: another one at collection makes the run stale */
    bool window;    /* a decode run; else a prompt chunk (its last wants the first output) */
    bool asked;     /* the drafter was asked for it */
} cv_run;

/* A submitted batch, until it is collected. */
typedef struct cv_flight {
    int32_t *token, *pos, *seq; /* [n_batch] */
    uint8_t *want;
    cv_run *runs;               /* [n_slot] in batch order, one per slot at most */
    int32_t n, n_want, n_prompt_tokens, n_runs;
    int32_t group;              /* the group whose rows it carries, or -1 (windows of deeper slots only) */
    double t_propose; /* when its drafts were asked for (the start of its rounds) */
    double t0;        /* when it was submitted */
} cv_flight;

enum { RATE_RING = 16, RATE_WINDOW_S = 10 };

struct cv_sched {
    convoy_ctx *ctx;
    const convoy_model *model;
    int32_t n_slot, n_batch, n_ctx, n_vocab, n_embd;

    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t thread;
    bool thread_running;
    bool stopping;

    /* under mu */
    cv_request **queue; /* ring of queue_cap + n_slot */
    int32_t queue_cap, q_ring, q_head, q_len;
    int32_t n_held;     /* slots not SLOT_FREE */
    int32_t n_running;  /* requests in slots, not yet ended */
    cv_request **active; /* [n_slot] the request running in each slot, or NULL (for the clients' shares) */
    int32_t client_slots; /* the most slots one client runs at once */
    cv_sched_stats stats;
    double rate_t[RATE_RING];
    uint64_t rate_n[RATE_RING];
    int rate_head, rate_len;
    double retry_at;    /* while stats.down: the next reconnect */
    double retry_wait;  /* and the wait after it, doubling */
    double check_at;    /* while idle: the next health check of the engine */
    double costs_at;    /* the next debug line of a pipeline's measured costs */
    int32_t n_cache;    /* the context's slots past n_slot: the cache beyond the slots */
    cv_kept *kept;      /* [n_slot + n_cache] written under mu; the inference thread reads without it only
                           what nobody else writes: the slots it holds and the cache slots (an HTTP
                           thread erases a free slot's) */
    uint64_t use_clock;
    bool prompt_cache;  /* slots keep their cache for the next request */

    /* inference thread only */
    cv_slot *slots;
    int32_t prefill_rr;
    int32_t depth;        /* batches in flight at most (the context's depth) */
    int32_t groups;       /* slot groups whose batches take turns (stage_groups) */
    int32_t next_group;   /* group of the next batch to build */
    double stage_s;       /* seconds a token takes at the slowest stage (for the windows' depth) */
    cv_flight *flights;   /* [depth] ring, oldest first */
    int32_t f_oldest, n_flying;
    int32_t *b_sampled;   /* [n_batch] ids of the collected batch */
    convoy_spec *spec;    /* set before the first request (see cv_sched_set_spec); NULL: no speculation */
    convoy_spec_req *spec_reqs; /* [n_slot] one proposal call's requests */
    int32_t *drafts;      /* [n_slot][k_max] each slot's proposal */
    int32_t k_max;        /* the spec's most drafts per round */
};

static inline int32_t min_i32(int32_t a, int32_t b) { return a < b ? a : b; }

/* Output i's logprobs: the sampled id's, then the alternatives. */
static inline convoy_logprob *request_lp(const cv_request *r, int32_t i)
{
    return r->lp + (size_t)i * (size_t)(1 + r->sampler.n_logprobs);
}

/* sched.c: the ends of a request and a slot, and the engine's failure. */
/* Ends a request and drops the scheduler's reference. */
void cv_sched_finish_locked(cv_sched *s, cv_request *r, cv_finish why, const char *msg);
/* Ends a slot's request; the next A cuts the slot back to what it keeps, or empties it. */
void cv_sched_end_slot_locked(cv_sched *s, cv_slot *sl, cv_finish why, const char *msg);
/* A failure took the pipeline down: refuse requests, reconnect later. */
void cv_sched_note_down_locked(cv_sched *s, const char *err);
/* Empties slot i in the engine and the drafter (convoy_seq_free's result). */
int cv_sched_slot_free_engine(cv_sched *s, int32_t i, char *err, size_t errlen);

/* sched_admit.c: B's admission and C's setup of the admitted slots. */
int32_t cv_sched_running_of_locked(const cv_sched *s, uint64_t c);
void cv_sched_admit_locked(cv_sched *s);
void cv_sched_start_admitted(cv_sched *s);

/* sched_request.c: a request's references and the queue. */
void cv_request_unref_locked(cv_request *r);
void cv_sched_queue_remove_locked(cv_sched *s, cv_request *r);

#endif
