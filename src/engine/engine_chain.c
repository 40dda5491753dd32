/* engine_chain.c: the engine's backend over a chain of pipeline stages
 * (engine_impl.h). The layers run on a cv_chain (pipe/chain.h); the
 * journal (journal.h) keeps every slot's tokens and sampler, so that when a
 * node fails the chain is replaced by one over the nodes that answer and
 * the journal replays into it (a failover, its retry written once in
 * chain_run); the rebalancer (rebalance.h) moves layers between the nodes
 * while serving when their measured costs drift. A pipeline whose failover
 * found no new chain is down: calls fail until convoy_ctx_reconnect. */
#include <assert.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "engine/engine_impl.h"
#include "engine/journal.h"
#include "engine/rebalance.h"
#include "pipe/chain.h"
#include "pipe/seal.h"
#include "model/fingerprint.h"

/* The chain's options, parsed once from convoy_ctx_params and kept for
 * reopening it (the strings point into the buffers). */
typedef struct chain_setup {
    cv_chain_opts o;
    char nodes_buf[4096];
    char *nodes[CV_CHAIN_MAX_NODES];
    int32_t split[CV_CHAIN_MAX_NODES];
    char spares_buf[4096];
    char *spares[CV_CHAIN_MAX_NODES];
    cv_model_hashes hashes; /* the model's content hashes, loaded once for every chain opened */
    cv_seal_key key;        /* o.key points here when keyed */
} chain_setup;

/* The backend: a chain, or none while the pipeline is down, and what
 * opens the next one and replays into it. */
typedef struct engine_chain {
    engine_backend base;
    const char *path; /* the model's file (its convoy_model outlives the context) */
    cv_chain *chain;  /* NULL while the pipeline is down */
    chain_setup setup;
    int32_t n_slot;
    char down_why[2 * CV_ERRLEN + 32]; /* why the pipeline went down */
    journal journal;  /* every slot's tokens and sampler, for a failover */
    bool rebalancing; /* layers move while serving (no --split) */
    rebalance rebalance;
    void (*log)(void *user, const char *line);
    void *log_user;
    int32_t failover_wait_ms;
} engine_chain;

/* Splits a comma list into at most max items (pointers into buf). */
static int split_list(char *buf, char **items, int max)
{
    int n = 0;
    for (char *p = buf; p && *p && n < max; n++) {
        items[n] = p;
        p = strchr(p, ',');
        if (p)
            *p++ = 0;
    }
    return n;
}

/* The chain's options from the context's parameters, into s. */
static int chain_setup_parse(chain_setup *s, const convoy_ctx_params *p, char *err, size_t errlen)
{
    enum { MAX = CV_CHAIN_MAX_NODES };
    snprintf(s->nodes_buf, sizeof s->nodes_buf, "%s", p->nodes);
    const int n_nodes = split_list(s->nodes_buf, s->nodes, MAX);
    cv_chain_opts o = cv_chain_default_opts();
    o.nodes = (const char *const *)s->nodes;
    o.n_nodes = n_nodes;
    o.n_threads = p->n_threads;
    o.n_ctx = p->n_ctx;
    o.n_slot = p->n_slot;
    o.n_batch = p->n_batch;
    o.kv_f16 = p->kv_f16;
    o.mlock = p->mlock;
    o.want_logits = p->want_logits;
    o.local_mem_budget = p->mem_budget;
    o.log = p->log; /* layers shipped to a node that receives them */
    if (p->depth < 0 || p->depth > CV_CHAIN_MAX_NODES)
        return cv_errf(err, errlen, "a pipeline keeps 1 to %d batches in flight, not %d", CV_CHAIN_MAX_NODES,
                       p->depth);
    o.min_depth = p->depth;
    o.streams = p->n_slot > 1 ? p->n_slot : p->depth > 0 ? p->depth : 1; /* users, or one user's windows */
    o.log_user = p->log_user;
    if (p->standby) {
        snprintf(s->spares_buf, sizeof s->spares_buf, "%s", p->standby);
        o.spares = (const char *const *)s->spares;
        o.n_spares = split_list(s->spares_buf, s->spares, MAX);
    }
    if (p->timeout_ms > 0)
        o.io_timeout_ms = p->timeout_ms;
    if (p->split) {
        if (cv_plan_parse_split(p->split, n_nodes, s->split, err, errlen))
            return -1;
        o.split = s->split;
    }
    if (p->wire && strcmp(p->wire, "f32")) {
        if (!strcmp(p->wire, "f16"))
            o.act_type = CV_ACT_F16;
        else if (!strcmp(p->wire, "q8_0"))
            o.act_type = CV_ACT_Q8_0;
        else
            return cv_errf(err, errlen, "wire type '%s' is not f32, f16 or q8_0", p->wire);
    }
    s->o = o;
    return 0;
}

/* The links' cluster key (p->key_file) and plaintext policy, into s->o. */
static int chain_setup_key(chain_setup *s, const convoy_ctx_params *p, char *err, size_t errlen)
{
    s->o.insecure = p->insecure;
    if (!p->key_file)
        return 0;
    if (cv_seal_key_load(p->key_file, &s->key, err, errlen))
        return -1;
    s->o.key = &s->key;
    return 0;
}

static void engine_log(const engine_chain *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cv_chain_vlog(c->log, c->log_user, fmt, ap);
    va_end(ap);
}

/* The model's content hashes, which the nodes check their weights against:
 * from the cache beside the model when it matches, else read once here,
 * and kept for every chain this context opens. */
static int load_hashes(engine_chain *c, const gguf_file *gguf, int32_t n_threads, char *err, size_t errlen)
{
    bool cached;
    char note[2 * CV_ERRLEN];
    if (cv_model_hashes_load(gguf, c->path, n_threads, &c->setup.hashes, &cached, note,
                             sizeof note, err, errlen))
        return -1;
    c->setup.o.hashes = &c->setup.hashes;
    return 0;
}

static int open_chain(engine_chain *c, const cv_llama *meta, const convoy_ctx_params *p, int32_t pooling, char *err,
                      size_t errlen)
{
    if (chain_setup_parse(&c->setup, p, err, errlen) || chain_setup_key(&c->setup, p, err, errlen))
        return -1;
    c->setup.o.pooling = pooling;
    if (load_hashes(c, &meta->gguf, p->n_threads, err, errlen) ||
        cv_chain_open(&c->chain, c->path, &c->setup.o, err, errlen))
        return -1;
    c->base.depth = cv_chain_depth(c->chain);
    c->base.n_ctx = cv_chain_n_ctx(c->chain);
    c->rebalancing = p->rebalance && !p->split;
    cv_rebalance_init(&c->rebalance, cv_now_ms());
    c->setup.o.local_speed_us = cv_chain_local_speed(c->chain); /* a failover's chain takes it as it is */
    if (cv_journal_init(&c->journal, p->n_slot, c->base.n_ctx, p->n_batch, err, errlen)) {
        cv_chain_close(c->chain);
        return -1;
    }
    char plan[1024];
    cv_chain_describe(c->chain, plan, sizeof plan);
    engine_log(c, "plan: %s", plan);
    cv_chain_describe_nodes(c->chain, plan, sizeof plan);
    engine_log(c, "nodes: %s", plan);
    return 0;
}

/* ---- failover (convoy.h): the chain's state is the journal's ---- */

/* A call fails over at most this often; a failover tries for up to
 * failover_wait_ms, waits between tries doubling from the first. */
enum { FAILOVERS_PER_CALL = 3, RETRY_FIRST_MS = 250, RETRY_MAX_MS = 2000 };

/* Opens a chain over the nodes that answer (spares in place of the others,
 * `avoid` not asked, the unreachable left out) and replays the journal
 * into it. On failure *suspect names the node a replay lost, else is "". */
static int open_and_replay(engine_chain *c, const cv_chain_opts *base, const char *avoid, char *suspect,
                           size_t suspect_len, char *err, size_t errlen)
{
    cv_chain_opts o = *base;
    o.avoid = avoid;
    suspect[0] = 0;
    o.drop_unreachable = !o.split;
    o.any_speed = true;
    o.min_depth = c->base.depth;
    const int64_t t0 = cv_now_ms();
    cv_chain *chain;
    if (cv_chain_open(&chain, c->path, &o, err, errlen))
        return -1;
    if (cv_chain_n_ctx(chain) != c->base.n_ctx) {
        cv_errf(err, errlen, "the nodes now give %d positions, the pipeline had %d", cv_chain_n_ctx(chain),
                c->base.n_ctx);
        cv_chain_close(chain);
        return -1;
    }
    const int64_t t1 = cv_now_ms();
    int64_t n_fed;
    if (cv_journal_replay(&c->journal, chain, &n_fed, err, errlen)) {
        if (cv_chain_suspect(chain))
            snprintf(suspect, suspect_len, "%s", cv_chain_suspect(chain));
        cv_chain_close(chain);
        return -1;
    }
    char plan[512];
    cv_chain_describe(chain, plan, sizeof plan);
    engine_log(c, "new chain in %lld ms: %s; replayed %lld tokens in %lld ms", (long long)(t1 - t0), plan,
               (long long)n_fed, (long long)(cv_now_ms() - t1));
    c->base.stats.replayed_tokens += (uint64_t)n_fed;
    c->chain = chain;
    cv_rebalance_new_chain(&c->rebalance, cv_now_ms());
    return 0;
}

/* The pipeline is down: a chain call's failure stands (and why no new
 * chain could take its place, when one was tried). */
static int go_down(engine_chain *c, const char *why, const char *no_new_chain)
{
    if (no_new_chain)
        snprintf(c->down_why, sizeof c->down_why, "%.511s (no new chain: %.511s)", why, no_new_chain);
    else
        snprintf(c->down_why, sizeof c->down_why, "%s", why);
    cv_journal_drop_flights(&c->journal);
    engine_log(c, "the pipeline is down: %s", c->down_why);
    return -1;
}

/* Replaces the broken chain: closes it (releasing its nodes), then opens
 * and replays a new one, avoiding at first the node blamed (later tries
 * ask it again: it may be back). */
static int replace_chain(engine_chain *c, const char *why)
{
    const int64_t t0 = cv_now_ms();
    char avoid[CV_PROTO_ADDR_MAX + 1], lost[CV_PROTO_ADDR_MAX + 1], err[CV_ERRLEN];
    const char *blamed = c->chain ? cv_chain_suspect(c->chain) : NULL; /* none after a move that failed */
    snprintf(avoid, sizeof avoid, "%s", blamed ? blamed : "");
    cv_chain_close(c->chain);
    c->chain = NULL;
    atomic_store(&c->base.failing_over, true);
    engine_log(c, "failing over: %s", why);
    for (int wait_ms = RETRY_FIRST_MS;; wait_ms = wait_ms * 2 < RETRY_MAX_MS ? wait_ms * 2 : RETRY_MAX_MS) {
        if (open_and_replay(c, &c->setup.o, avoid[0] ? avoid : NULL, lost, sizeof lost, err, sizeof err) == 0) {
            c->base.stats.failovers++;
            c->base.stats.failover_seconds += (double)(cv_now_ms() - t0) / 1e3;
            atomic_store(&c->base.failing_over, false);
            return 0;
        }
        if (cv_now_ms() + wait_ms - t0 > c->failover_wait_ms) {
            atomic_store(&c->base.failing_over, false);
            return go_down(c, why, err);
        }
        engine_log(c, "no new chain yet (%s), next try in %d ms", err, wait_ms);
        snprintf(avoid, sizeof avoid, "%s", lost); /* the failed node may be back: only a replay's loss is avoided */
        nanosleep(&(struct timespec){.tv_sec = wait_ms / 1000, .tv_nsec = (wait_ms % 1000) * 1000000L}, NULL);
    }
}

static int fail_over(engine_chain *c, const char *why)
{
    const int forbidden = cv_alloc_forbid(0); /* a new chain is no step: it allocates */
    const int rc = replace_chain(c, why);
    cv_alloc_forbid(forbidden);
    return rc;
}

/* After a chain call failed with err: true when a failover restored the
 * state on a new chain (the call may run again), false when the failure
 * stands: the call's own (the chain is fine) or the pipeline's (down). */
static bool failed_over(engine_chain *c, int *n_failovers, const char *err)
{
    if (!cv_chain_is_broken(c->chain))
        return false;
    if ((*n_failovers)++ == FAILOVERS_PER_CALL) {
        cv_chain_close(c->chain);
        c->chain = NULL;
        return go_down(c, err, NULL), false;
    }
    return fail_over(c, err) == 0;
}

static int pipeline_down(const engine_chain *c, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "the pipeline is down: %s", c->down_why);
}

/* ---- rebalancing (rebalance.h): a move is a failover asked for ---- */

/* Closes the chain and opens one with the move's split over its nodes;
 * when that fails, a failover's chain takes its place. */
static int move_layers(engine_chain *c, const rebalance_move *mv)
{
    const int64_t t0 = cv_now_ms();
    const char *nodes[CV_CHAIN_MAX_NODES];
    for (int i = 0; i < mv->n_nodes; i++)
        nodes[i] = mv->addr[i];
    cv_chain_opts o = c->setup.o;
    o.nodes = nodes;
    o.n_nodes = mv->n_nodes;
    o.split = mv->split;
    o.n_spares = 0;
    cv_chain_close(c->chain); /* a planned pause: /health stays up (no failing_over) */
    c->chain = NULL;
    char suspect[CV_PROTO_ADDR_MAX + 1], err[CV_ERRLEN];
    const int forbidden = cv_alloc_forbid(0); /* a new chain is no step: it allocates */
    int rc = open_and_replay(c, &o, NULL, suspect, sizeof suspect, err, sizeof err);
    if (rc == 0) {
        const double pause_s = (double)(cv_now_ms() - t0) / 1e3;
        c->base.stats.rebalances++;
        c->base.stats.rebalances_undone += mv->undo;
        c->base.stats.rebalance_seconds += pause_s;
        cv_rebalance_moved(&c->rebalance, mv, cv_now_ms(), pause_s);
    } else {
        rc = replace_chain(c, err);
    }
    cv_alloc_forbid(forbidden);
    return rc;
}

/* Before a collect (so that it reads its result, logits and
 * log-probabilities from the chain that serves on): moves the layers when
 * the measured costs call for it. */
static int rebalance_when_due(engine_chain *c, char *err, size_t errlen)
{
    rebalance_move mv;
    const int forbidden = cv_alloc_forbid(0); /* planning again allocates, once a second */
    const int due = cv_rebalance_due(&c->rebalance, c->chain, cv_now_ms(), &mv, err, errlen);
    cv_alloc_forbid(forbidden);
    if (mv.why[0])
        engine_log(c, "rebalancing: %s", mv.why);
    if (due < 0)
        engine_log(c, "rebalancing: no plan from the measurements: %s", err);
    if (due <= 0)
        return 0; /* the chain serves on as it is */
    return move_layers(c, &mv);
}

/* ---- the chain's calls, each run once more after a failover or not ---- */

/* One call of the chain that a break may interrupt: what it is and its
 * arguments. */
typedef struct chain_call {
    enum { CALL_SUBMIT, CALL_COLLECT, CALL_SAMPLER, CALL_GRAMMAR, CALL_TRUNCATE, CALL_COPY, CALL_FREE, CALL_PING } kind;
    const cv_batch *batch;            /* submit */
    int32_t *tokens, *n_tokens;       /* collect */
    int32_t seq;                      /* a slot call's slot, a copy's source */
    int32_t dst;                      /* a copy's destination */
    int32_t len;                      /* a truncate's or a copy's positions */
    const cv_sampler_params *sampler; /* with n_logprobs */
    int32_t n_logprobs;
    const char *text;                 /* a grammar of text_len bytes, from position `from` */
    size_t text_len;
    int32_t from;
} chain_call;

static int chain_do(cv_chain *chain, const chain_call *k, char *err, size_t errlen)
{
    switch (k->kind) {
    case CALL_SUBMIT:
        return cv_chain_submit(chain, k->batch, err, errlen);
    case CALL_COLLECT:
        return cv_chain_collect(chain, k->tokens, k->n_tokens, err, errlen);
    case CALL_SAMPLER:
        return cv_chain_set_sampler(chain, k->seq, k->sampler, k->n_logprobs, err, errlen);
    case CALL_GRAMMAR:
        return cv_chain_set_grammar(chain, k->seq, k->text, k->text_len, k->from, err, errlen);
    case CALL_TRUNCATE:
        return cv_chain_seq_truncate(chain, k->seq, k->len, err, errlen);
    case CALL_COPY:
        return cv_chain_seq_copy(chain, k->seq, k->dst, k->len, err, errlen);
    case CALL_FREE:
        return cv_chain_seq_free(chain, k->seq, err, errlen);
    case CALL_PING:
        break;
    }
    return cv_chain_ping(chain, err, errlen);
}

/* Runs a call on the chain (which is up); when the chain breaks under it,
 * fails over, at most FAILOVERS_PER_CALL times. A batch's submit or
 * collect runs again on the new chain; any other call is done once the
 * new chain is: the journal noted it before it was sent and the replay
 * brought it (a ping: the new chain answers). */
static int chain_run(engine_chain *c, const chain_call *k, char *err, size_t errlen)
{
    const bool again = k->kind == CALL_SUBMIT || k->kind == CALL_COLLECT;
    int n_failovers = 0;
    while (chain_do(c->chain, k, err, errlen)) {
        if (!failed_over(c, &n_failovers, err))
            return -1;
        if (!again)
            return 0;
    }
    return 0;
}

/* ---- the backend's ops (engine_impl.h) ---- */

static int chain_submit(engine_backend *b, const cv_batch *batch, char *err, size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    if (!c->chain)
        return pipeline_down(c, err, errlen);
    if (chain_run(c, &(chain_call){.kind = CALL_SUBMIT, .batch = batch}, err, errlen))
        return -1;
    cv_journal_submit(&c->journal, batch);
    return 0;
}

static int chain_collect(engine_backend *b, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    if (!c->chain || (c->rebalancing && rebalance_when_due(c, err, errlen)))
        return pipeline_down(c, err, errlen);
    if (chain_run(c, &(chain_call){.kind = CALL_COLLECT, .tokens = tokens, .n_tokens = n_tokens}, err, errlen))
        return -1;
    cv_journal_collect(&c->journal, tokens);
    return 0;
}

static int chain_step(engine_backend *b, const cv_batch *batch, int32_t *tokens, char *err, size_t errlen)
{
    const engine_chain *c = (const engine_chain *)b;
    int32_t n;
    if (c->chain && cv_chain_in_flight(c->chain))
        return cv_errf(err, errlen, "a step needs the chain idle, %d batches are in flight",
                       cv_chain_in_flight(c->chain));
    return chain_submit(b, batch, err, errlen) || chain_collect(b, tokens, &n, err, errlen) ? -1 : 0;
}

static const float *chain_logits(const engine_backend *b, int32_t i)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain ? cv_chain_logits(c->chain, i) : NULL;
}

static const float *chain_embedding(const engine_backend *b, int32_t i)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain ? cv_chain_embedding(c->chain, i) : NULL;
}

static int chain_logprobs(const engine_backend *b, int32_t i, cv_logprob *out)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain ? cv_chain_logprobs(c->chain, i, out) : 0;
}

static_assert(CONVOY_MAX_LOGIT_BIAS == CV_PROTO_MAX_BIAS, "convoy.h states the logit bias limit");

static int chain_set_sampler(engine_backend *b, int32_t seq, const cv_sampler_params *sp, int32_t n_logprobs,
                             char *err, size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    if (!c->chain)
        return pipeline_down(c, err, errlen);
    if (seq < 0 || seq >= c->n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", seq, c->n_slot);
    if (cv_journal_set_sampler(&c->journal, seq, sp, n_logprobs))
        return cv_errf(err, errlen, "out of memory for a logit bias of %d ids", sp->n_bias);
    return chain_run(c, &(chain_call){.kind = CALL_SAMPLER, .seq = seq, .sampler = sp, .n_logprobs = n_logprobs},
                     err, errlen);
}

static int chain_set_grammar(engine_backend *b, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                             size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    if (!c->chain)
        return pipeline_down(c, err, errlen);
    if (seq < 0 || seq >= c->n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", seq, c->n_slot);
    if (c->journal.slot[seq].sampler_at < 0)
        return cv_errf(err, errlen, "slot %d has no sampler: a grammar follows convoy_set_sampler", seq);
    if (from < c->journal.slot[seq].len)
        return cv_errf(err, errlen, "a grammar from position %d, but slot %d holds %d positions", from, seq,
                       c->journal.slot[seq].len);
    if (cv_journal_set_grammar(&c->journal, seq, text, len, from))
        return cv_errf(err, errlen, "out of memory for a grammar of %zu bytes", len);
    return chain_run(c, &(chain_call){.kind = CALL_GRAMMAR, .seq = seq, .text = text, .text_len = len, .from = from},
                     err, errlen);
}

static int32_t chain_seq_len(const engine_backend *b, int32_t seq)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain ? cv_chain_seq_len(c->chain, seq) : c->journal.slot[seq].len;
}

/* A slot's truncation (len >= 0) or freeing (len < 0): noted in the
 * journal (a pipeline that is down gets it when it is back), then sent. */
static int chain_seq_cut(engine_chain *c, int32_t seq, int32_t len, char *err, size_t errlen)
{
    if (seq < 0 || seq >= c->n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", seq, c->n_slot);
    if (len >= 0)
        cv_journal_truncate(&c->journal, seq, len);
    else
        cv_journal_free_seq(&c->journal, seq);
    if (!c->chain)
        return 0;
    return chain_run(c, &(chain_call){.kind = len >= 0 ? CALL_TRUNCATE : CALL_FREE, .seq = seq, .len = len}, err,
                     errlen);
}

static int chain_seq_truncate(engine_backend *b, int32_t seq, int32_t len, char *err, size_t errlen)
{
    return chain_seq_cut((engine_chain *)b, seq, len < 0 ? 0 : len, err, errlen);
}

static int chain_seq_free(engine_backend *b, int32_t seq, char *err, size_t errlen)
{
    return chain_seq_cut((engine_chain *)b, seq, -1, err, errlen);
}

static int chain_seq_copy(engine_backend *b, int32_t src, int32_t dst, int32_t len, char *err, size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    cv_journal_copy(&c->journal, src, dst, len);
    if (!c->chain)
        return 0;
    return chain_run(c, &(chain_call){.kind = CALL_COPY, .seq = src, .dst = dst, .len = len}, err, errlen);
}

static int chain_check(engine_backend *b, char *err, size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    if (!c->chain)
        return pipeline_down(c, err, errlen);
    return chain_run(c, &(chain_call){.kind = CALL_PING}, err, errlen);
}

static int chain_reconnect(engine_backend *b, char *err, size_t errlen)
{
    engine_chain *c = (engine_chain *)b;
    if (c->chain)
        return 0;
    char suspect[CV_PROTO_ADDR_MAX + 1];
    return open_and_replay(c, &c->setup.o, NULL, suspect, sizeof suspect, err, errlen);
}

static bool chain_is_down(const engine_backend *b) { return !((const engine_chain *)b)->chain; }

static bool chain_collect_waited(const engine_backend *b)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain && cv_chain_result_waited(c->chain);
}

static int chain_stages(const engine_backend *b)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain ? cv_chain_stages(c->chain) : 1;
}

static double chain_stage_seconds(const engine_backend *b)
{
    const engine_chain *c = (const engine_chain *)b;
    return c->chain ? 1e-6 * cv_chain_stage_us(c->chain) : 0.0;
}

static_assert(CONVOY_MAX_NODES == CV_CHAIN_MAX_NODES, "convoy.h states the most nodes");

static void chain_node_costs(const engine_backend *b, convoy_node_costs *out)
{
    const engine_chain *c = (const engine_chain *)b;
    out->n_nodes = 0;
    if (!c->chain)
        return;
    cv_chain_costs m;
    cv_chain_get_costs(c->chain, &m);
    out->n_nodes = m.n_nodes;
    out->us_hop = m.us_hop;
    out->us_last_round_trip = m.us_last_round_trip;
    for (int i = 0; i < m.n_nodes; i++) {
        snprintf(out->node[i].addr, sizeof out->node[i].addr, "%s", m.addr[i]);
        out->node[i].layers = m.last[i] - m.first[i];
        out->node[i].us_measured = m.us_measured[i];
        out->node[i].us_probed = m.us_probed[i];
        out->node[i].mem_budget = m.mem_budget[i];
        out->node[i].us_last = m.us_last[i];
        out->node[i].work = m.work[i];
    }
}

static void chain_close(engine_backend *b)
{
    engine_chain *c = (engine_chain *)b;
    if (c->chain)
        cv_chain_close(c->chain);
    cv_journal_free(&c->journal);
    cv_model_hashes_free(&c->setup.hashes);
    cv_seal_key_wipe(&c->setup.key);
    cv_free(c);
}

static const engine_ops chain_ops = {
    .step = chain_step, .submit = chain_submit, .collect = chain_collect, .logits = chain_logits,
    .embedding = chain_embedding, .logprobs = chain_logprobs, .set_sampler = chain_set_sampler,
    .set_grammar = chain_set_grammar, .seq_len = chain_seq_len, .seq_truncate = chain_seq_truncate,
    .seq_copy = chain_seq_copy, .seq_free = chain_seq_free, .check = chain_check, .reconnect = chain_reconnect,
    .is_down = chain_is_down, .collect_waited = chain_collect_waited, .stages = chain_stages,
    .stage_seconds = chain_stage_seconds, .node_costs = chain_node_costs, .close = chain_close,
};

engine_backend *cv_engine_chain_open(const char *path, const cv_llama *meta, const convoy_ctx_params *p,
                                     int32_t pooling, char *err, size_t errlen)
{
    engine_chain *c = cv_calloc(1, sizeof *c);
    if (!c) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    c->base.ops = &chain_ops;
    c->path = path;
    c->n_slot = p->n_slot;
    c->log = p->log;
    c->log_user = p->log_user;
    c->failover_wait_ms = p->failover_wait_ms;
    if (open_chain(c, meta, p, pooling, err, errlen)) {
        cv_model_hashes_free(&c->setup.hashes);
        cv_seal_key_wipe(&c->setup.key);
        cv_free(c);
        return NULL;
    }
    return &c->base;
}
