/* engine.c: include/convoy.h's models, contexts and steps. src/engine/ is
 * the engine's floor of the house: it implements the API over infer/ (one
 * machine) and pipe/ (a chain), and is all that serve/ and app/ see of
 * them. A convoy_model is the GGUF's hyperparameters and vocabulary
 * (weights stay mapped and untouched until a span binds them); a convoy_ctx
 * is either one cv_span holding every layer on this machine, or a cv_chain
 * of pipeline stages. */
#include "convoy.h"

#include <assert.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/pool.h"
#include "engine/forecast.h"
#include "engine/journal.h"
#include "engine/rebalance.h"
#include "infer/logprobs.h"
#include "infer/span.h"
#include "pipe/chain.h"
#include "pipe/seal.h"
#include "model/fingerprint.h"
#include "model/llama.h"
#include "model/quantize.h"
#include "model/vocab.h"

struct convoy_model {
    char *path;
    char *chat_template; /* tokenizer.chat_template, or NULL */
    cv_llama meta; /* bound for no layers: hyperparameters and file only */
    cv_vocab vocab;
};

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

struct convoy_ctx {
    convoy_model *model;
    bool pipeline;    /* the layers run on a chain: */
    cv_chain *chain;  /* NULL while the pipeline is down */
    chain_setup setup;
    int depth;        /* a pipeline's depth when first opened */
    int32_t n_ctx;
    char down_why[2 * CV_ERRLEN + 32]; /* why the pipeline went down */
    atomic_bool failing_over; /* replace_chain is at work: other threads may read it */
    journal journal;  /* every slot's tokens and sampler, for a failover */
    bool rebalancing; /* layers move while serving (no --split) */
    rebalance rebalance;
    convoy_ctx_stats stats;
    void (*log)(void *user, const char *line);
    void *log_user;
    int32_t failover_wait_ms;
    cv_span span;     /* or every layer here */
    int32_t n_batch;
    int32_t prefill_chunk; /* convoy_ctx_params' */
    int32_t n_slot;
    int32_t *tokens;  /* [n_batch] sampled ids of the last step */
    int32_t *row_seq; /* [n_batch] one machine: the slot of each wanted row of the last step */
    int32_t *n_logprobs; /* [n_slot] one machine: each slot's convoy_sampling_params.n_logprobs */
    int32_t n_done;   /* one machine: ids in tokens not yet collected, -1 when none */
    int32_t pooling;  /* the embeddings' CV_POOL_*: convoy_ctx_params' or the model's */
};

struct convoy_detok {
    cv_detok d;
};

convoy_model *convoy_model_load(const char *path, char *err, size_t errlen)
{
    convoy_model *m = cv_calloc(1, sizeof *m);
    if (!m || !(m->path = cv_malloc(strlen(path) + 1))) {
        cv_free(m);
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    strcpy(m->path, path);
    if (cv_llama_load(&m->meta, path, 0, 0, err, errlen)) {
        cv_free(m->path);
        cv_free(m);
        return NULL;
    }
    if (cv_vocab_load(&m->vocab, &m->meta.gguf, err, errlen)) {
        cv_llama_free(&m->meta);
        cv_free(m->path);
        cv_free(m);
        return NULL;
    }
    const gguf_kv *tmpl = gguf_find_kv(&m->meta.gguf, "tokenizer.chat_template");
    if (tmpl && tmpl->type == GGUF_STRING && !(m->chat_template = gguf_str_dup(tmpl->v.str))) {
        cv_errf(err, errlen, "out of memory");
        convoy_model_free(m);
        return NULL;
    }
    if (m->vocab.n_vocab != m->meta.hp.n_vocab) {
        cv_errf(err, errlen, "%s: vocabulary has %d tokens but token_embd.weight has %d rows", m->meta.gguf.name,
                m->vocab.n_vocab, m->meta.hp.n_vocab);
        convoy_model_free(m);
        return NULL;
    }
    return m;
}

const cv_llama *cv_engine_model_meta(const convoy_model *m) { return &m->meta; }

const cv_llama *cv_engine_ctx_meta(const convoy_ctx *c) { return &c->model->meta; }

void convoy_model_free(convoy_model *m)
{
    if (!m)
        return;
    cv_vocab_free(&m->vocab);
    cv_llama_free(&m->meta);
    cv_free(m->chat_template);
    cv_free(m->path);
    cv_free(m);
}

const char *convoy_token_text(const convoy_model *m, int32_t id)
{
    return id >= 0 && id < m->vocab.n_vocab ? m->vocab.text[id] : NULL;
}

const char *convoy_model_chat_template(const convoy_model *m) { return m->chat_template; }

void convoy_model_get_info(const convoy_model *m, convoy_model_info *info)
{
    const cv_llama_hparams *hp = &m->meta.hp;
    memset(info, 0, sizeof *info);
    snprintf(info->arch, sizeof info->arch, "%s", cv_llama_arch_name(hp->arch));
    info->n_vocab = hp->n_vocab;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_layer = hp->n_layer;
    info->n_embd = hp->n_embd;
    info->n_embd_kv = hp->n_head_kv * hp->head_dim;
    info->bos = m->vocab.bos;
    info->eos = m->vocab.eos;
    info->add_bos = m->vocab.add_bos;
    info->fim_pre = m->vocab.fim[CV_FIM_PRE];
    info->fim_suf = m->vocab.fim[CV_FIM_SUF];
    info->fim_mid = m->vocab.fim[CV_FIM_MID];
    info->fim_rep = m->vocab.fim[CV_FIM_REP];
    info->fim_sep = m->vocab.fim[CV_FIM_SEP];
    info->bytes_per_token = cv_llama_weight_bytes(&m->meta, 0, hp->n_layer, CV_EMBD_ROW);
    const gguf_file *f = &m->meta.gguf;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        info->n_params += (uint64_t)(f->tensors[i].ne[0] * f->tensors[i].ne[1] * f->tensors[i].ne[2] *
                                     f->tensors[i].ne[3]);
    uint32_t ftype;
    const char *ftype_name = gguf_find_kv(f, "general.file_type") &&
                                     gguf_get_u32(f, "general.file_type", &ftype, NULL, 0) == 0
                                 ? cv_quant_file_type_name(ftype)
                                 : NULL;
    snprintf(info->file_type, sizeof info->file_type, "%s", ftype_name ? ftype_name : "");
    /* a token reads n_expert_used of each layer's n_expert experts */
    for (int32_t l = 0; hp->n_expert > 0 && l < hp->n_layer; l++)
        info->bytes_per_token -= cv_llama_layer_expert_bytes(&m->meta, l) / (uint64_t)hp->n_expert *
                                 (uint64_t)(hp->n_expert - hp->n_expert_used);
}

static_assert(CONVOY_MODEL_ID_BYTES == CV_HASH_BYTES, "convoy.h states the model id's size");

int convoy_model_id(const convoy_model *m, uint8_t out[CONVOY_MODEL_ID_BYTES], char *err, size_t errlen)
{
    return cv_model_meta_hash(&m->meta.gguf, out, err, errlen);
}

int convoy_tokenize(const convoy_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                    int32_t *out, int32_t n_max)
{
    return cv_tokenize(&m->vocab, text, len, add_special, parse_special, out, n_max);
}

int convoy_tokenize_spans(const convoy_model *m, const char *text, size_t len, bool add_special,
                          const convoy_span *plain, int32_t n_plain, int32_t *out, int32_t n_max)
{
    /* The same layout (two size_t); the engine's span type stays private. */
    _Static_assert(sizeof(convoy_span) == sizeof(cv_text_span), "span layouts differ");
    return cv_tokenize_spans(&m->vocab, text, len, add_special, true, (const cv_text_span *)plain, n_plain, out, n_max);
}

int convoy_token_piece(const convoy_model *m, int32_t id, char *buf, int32_t n)
{
    return cv_token_piece(&m->vocab, id, false, buf, n);
}

bool convoy_token_is_eog(const convoy_model *m, int32_t id) { return cv_token_is_eog(&m->vocab, id); }

convoy_detok *convoy_detok_create(const convoy_model *m)
{
    convoy_detok *d = cv_calloc(1, sizeof *d);
    if (d)
        cv_detok_init(&d->d, &m->vocab);
    return d;
}

int convoy_detok_push(convoy_detok *d, int32_t id, char *out, int32_t n) { return cv_detok_push(&d->d, id, out, n); }
int convoy_detok_flush(convoy_detok *d, char *out, int32_t n) { return cv_detok_flush(&d->d, out, n); }
void convoy_detok_free(convoy_detok *d) { cv_free(d); }

convoy_ctx_params convoy_ctx_default_params(void)
{
    return (convoy_ctx_params){.n_threads = cv_physical_cores(), .n_ctx = 0, .n_slot = 1, .n_batch = 512,
                                .kv_f16 = true, .timeout_ms = 5000,
                                .failover_wait_ms = 15000, .rebalance = true};
}

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

static void engine_log(const convoy_ctx *c, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->log)
        c->log(c->log_user, line);
    else
        fprintf(stderr, "convoy: %s\n", line);
}

/* The model's content hashes, which the nodes check their weights against:
 * from the cache beside the model when it matches, else read once here,
 * and kept for every chain this context opens. */
static int load_hashes(convoy_ctx *c, int32_t n_threads, char *err, size_t errlen)
{
    bool cached;
    char note[2 * CV_ERRLEN];
    if (cv_model_hashes_load(&c->model->meta.gguf, c->model->path, n_threads, &c->setup.hashes, &cached, note,
                             sizeof note, err, errlen))
        return -1;
    c->setup.o.hashes = &c->setup.hashes;
    return 0;
}

static int open_chain(convoy_ctx *c, const convoy_ctx_params *p, char *err, size_t errlen)
{
    c->pipeline = true;
    if (chain_setup_parse(&c->setup, p, err, errlen) || chain_setup_key(&c->setup, p, err, errlen))
        return -1;
    c->setup.o.pooling = c->pooling;
    if (load_hashes(c, p->n_threads, err, errlen) ||
        cv_chain_open(&c->chain, c->model->path, &c->setup.o, err, errlen))
        return -1;
    c->depth = cv_chain_depth(c->chain);
    c->n_ctx = cv_chain_n_ctx(c->chain);
    c->rebalancing = p->rebalance && !p->split;
    rebalance_init(&c->rebalance, cv_now_ms());
    c->setup.o.local_speed_us = cv_chain_local_speed(c->chain); /* a failover's chain takes it as it is */
    if (journal_init(&c->journal, p->n_slot, c->n_ctx, p->n_batch, err, errlen)) {
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
static int open_and_replay(convoy_ctx *c, const cv_chain_opts *base, const char *avoid, char *suspect,
                           size_t suspect_len, char *err, size_t errlen)
{
    cv_chain_opts o = *base;
    o.avoid = avoid;
    suspect[0] = 0;
    o.drop_unreachable = !o.split;
    o.any_speed = true;
    o.min_depth = c->depth;
    const int64_t t0 = cv_now_ms();
    cv_chain *chain;
    if (cv_chain_open(&chain, c->model->path, &o, err, errlen))
        return -1;
    if (cv_chain_n_ctx(chain) != c->n_ctx) {
        cv_errf(err, errlen, "the nodes now give %d positions, the pipeline had %d", cv_chain_n_ctx(chain), c->n_ctx);
        cv_chain_close(chain);
        return -1;
    }
    const int64_t t1 = cv_now_ms();
    int64_t n_fed;
    if (journal_replay(&c->journal, chain, &n_fed, err, errlen)) {
        if (cv_chain_suspect(chain))
            snprintf(suspect, suspect_len, "%s", cv_chain_suspect(chain));
        cv_chain_close(chain);
        return -1;
    }
    char plan[512];
    cv_chain_describe(chain, plan, sizeof plan);
    engine_log(c, "new chain in %lld ms: %s; replayed %lld tokens in %lld ms", (long long)(t1 - t0), plan,
               (long long)n_fed, (long long)(cv_now_ms() - t1));
    c->stats.replayed_tokens += (uint64_t)n_fed;
    c->chain = chain;
    rebalance_new_chain(&c->rebalance, cv_now_ms());
    return 0;
}

/* The pipeline is down: a chain call's failure stands (and why no new
 * chain could take its place, when one was tried). */
static int go_down(convoy_ctx *c, const char *why, const char *no_new_chain)
{
    if (no_new_chain)
        snprintf(c->down_why, sizeof c->down_why, "%.511s (no new chain: %.511s)", why, no_new_chain);
    else
        snprintf(c->down_why, sizeof c->down_why, "%s", why);
    journal_drop_flights(&c->journal);
    engine_log(c, "the pipeline is down: %s", c->down_why);
    return -1;
}

/* Replaces the broken chain: closes it (releasing its nodes), then opens
 * and replays a new one, avoiding at first the node blamed (later tries
 * ask it again: it may be back). */
static int replace_chain(convoy_ctx *c, const char *why)
{
    const int64_t t0 = cv_now_ms();
    char avoid[CV_PROTO_ADDR_MAX + 1], lost[CV_PROTO_ADDR_MAX + 1], err[CV_ERRLEN];
    const char *blamed = c->chain ? cv_chain_suspect(c->chain) : NULL; /* none after a move that failed */
    snprintf(avoid, sizeof avoid, "%s", blamed ? blamed : "");
    cv_chain_close(c->chain);
    c->chain = NULL;
    atomic_store(&c->failing_over, true);
    engine_log(c, "failing over: %s", why);
    for (int wait_ms = RETRY_FIRST_MS;; wait_ms = wait_ms * 2 < RETRY_MAX_MS ? wait_ms * 2 : RETRY_MAX_MS) {
        if (open_and_replay(c, &c->setup.o, avoid[0] ? avoid : NULL, lost, sizeof lost, err, sizeof err) == 0) {
            c->stats.failovers++;
            c->stats.failover_seconds += (double)(cv_now_ms() - t0) / 1e3;
            atomic_store(&c->failing_over, false);
            return 0;
        }
        if (cv_now_ms() + wait_ms - t0 > c->failover_wait_ms) {
            atomic_store(&c->failing_over, false);
            return go_down(c, why, err);
        }
        engine_log(c, "no new chain yet (%s), next try in %d ms", err, wait_ms);
        snprintf(avoid, sizeof avoid, "%s", lost); /* the failed node may be back: only a replay's loss is avoided */
        nanosleep(&(struct timespec){.tv_sec = wait_ms / 1000, .tv_nsec = (wait_ms % 1000) * 1000000L}, NULL);
    }
}

static int fail_over(convoy_ctx *c, const char *why)
{
    const int forbidden = cv_alloc_forbid(0); /* a new chain is no step: it allocates */
    const int rc = replace_chain(c, why);
    cv_alloc_forbid(forbidden);
    return rc;
}

/* After a chain call failed with err: true when a failover restored the
 * state on a new chain (the call may run again), false when the failure
 * stands: the call's own (the chain is fine) or the pipeline's (down). */
static bool failed_over(convoy_ctx *c, int *n_failovers, const char *err)
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

static int pipeline_down(const convoy_ctx *c, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "the pipeline is down: %s", c->down_why);
}

/* ---- rebalancing (rebalance.h): a move is a failover asked for ---- */

/* Closes the chain and opens one with the move's split over its nodes;
 * when that fails, a failover's chain takes its place. */
static int move_layers(convoy_ctx *c, const rebalance_move *mv)
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
        c->stats.rebalances++;
        c->stats.rebalances_undone += mv->undo;
        c->stats.rebalance_seconds += pause_s;
        rebalance_moved(&c->rebalance, mv, cv_now_ms(), pause_s);
    } else {
        rc = replace_chain(c, err);
    }
    cv_alloc_forbid(forbidden);
    return rc;
}

/* Before a collect (so that it reads its result, logits and
 * log-probabilities from the chain that serves on): moves the layers when
 * the measured costs call for it. */
static int rebalance_when_due(convoy_ctx *c, char *err, size_t errlen)
{
    rebalance_move mv;
    const int forbidden = cv_alloc_forbid(0); /* planning again allocates, once a second */
    const int due = rebalance_due(&c->rebalance, c->chain, cv_now_ms(), &mv, err, errlen);
    cv_alloc_forbid(forbidden);
    if (mv.why[0])
        engine_log(c, "rebalancing: %s", mv.why);
    if (due < 0)
        engine_log(c, "rebalancing: no plan from the measurements: %s", err);
    if (due <= 0)
        return 0; /* the chain serves on as it is */
    return move_layers(c, &mv);
}

bool convoy_ctx_is_down(const convoy_ctx *c) { return c->pipeline && !c->chain; }

bool convoy_ctx_failing_over(convoy_ctx *c) { return atomic_load(&c->failing_over); }

void convoy_ctx_get_stats(const convoy_ctx *c, convoy_ctx_stats *out) { *out = c->stats; }

static_assert(CONVOY_MAX_NODES == CV_CHAIN_MAX_NODES, "convoy.h states the most nodes");

void convoy_ctx_get_node_costs(const convoy_ctx *c, convoy_node_costs *out)
{
    out->n_nodes = 0;
    if (!c->pipeline || !c->chain)
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

int convoy_ctx_check(convoy_ctx *c, char *err, size_t errlen)
{
    if (!c->pipeline)
        return 0;
    if (!c->chain)
        return pipeline_down(c, err, errlen);
    int n = 0;
    return cv_chain_ping(c->chain, err, errlen) && !failed_over(c, &n, err) ? -1 : 0;
}

int convoy_ctx_reconnect(convoy_ctx *c, char *err, size_t errlen)
{
    if (!convoy_ctx_is_down(c))
        return 0;
    char suspect[CV_PROTO_ADDR_MAX + 1];
    return open_and_replay(c, &c->setup.o, NULL, suspect, sizeof suspect, err, errlen);
}

convoy_ctx *convoy_ctx_create(convoy_model *m, const convoy_ctx_params *p, char *err, size_t errlen)
{
    convoy_ctx *c = cv_calloc(1, sizeof *c);
    if (!c) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    c->model = m;
    c->n_batch = p->n_batch;
    c->prefill_chunk = p->prefill_chunk;
    c->n_slot = p->n_slot;
    c->n_done = -1;
    c->log = p->log;
    c->log_user = p->log_user;
    c->failover_wait_ms = p->failover_wait_ms;
    c->pooling = p->pooling ? p->pooling : m->meta.hp.pooling;
    const cv_span_params sp = {.l0 = 0, .l1 = -1, .n_threads = p->n_threads, .n_ctx = p->n_ctx,
                                .n_slot = p->n_slot, .n_batch = p->n_batch, .kv_f16 = p->kv_f16,
                                .mlock = p->mlock, .pooling = c->pooling};
    if (p->nodes ? open_chain(c, p, err, errlen) : 0) {
        cv_model_hashes_free(&c->setup.hashes);
        cv_free(c);
        return NULL;
    }
    if (!p->nodes) {
        const uint64_t need = cv_span_bytes_needed(&m->meta, &sp);
        if (p->mem_budget && need > p->mem_budget) {
            cv_errf(err, errlen, "%s needs %.2f GB here (weights, KV cache, buffers), the budget is %.2f GB: "
                                 "split it over nodes with --nodes",
                    m->path, need / 1e9, p->mem_budget / 1e9);
            cv_free(c);
            return NULL;
        }
        if (cv_span_open(&c->span, m->path, &sp, err, errlen)) {
            cv_free(c);
            return NULL;
        }
        c->n_ctx = c->span.kv.n_ctx;
    }
    c->tokens = cv_malloc(sizeof(int32_t) * (size_t)p->n_batch);
    c->row_seq = cv_malloc(sizeof(int32_t) * (size_t)p->n_batch);
    c->n_logprobs = cv_malloc(sizeof(int32_t) * (size_t)p->n_slot);
    if (!c->tokens || !c->row_seq || !c->n_logprobs) {
        convoy_ctx_free(c);
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    for (int32_t i = 0; i < p->n_slot; i++)
        c->n_logprobs[i] = -1;
    return c;
}

void convoy_ctx_free(convoy_ctx *c)
{
    if (!c)
        return;
    if (c->chain)
        cv_chain_close(c->chain);
    else if (!c->pipeline)
        cv_span_close(&c->span);
    if (c->pipeline)
        journal_free(&c->journal);
    cv_free(c->tokens);
    cv_free(c->row_seq);
    cv_free(c->n_logprobs);
    cv_model_hashes_free(&c->setup.hashes);
    cv_seal_key_wipe(&c->setup.key);
    cv_free(c);
}

int32_t convoy_ctx_n_ctx(const convoy_ctx *c) { return c->n_ctx; }
int32_t convoy_ctx_n_batch(const convoy_ctx *c) { return c->n_batch; }
int32_t convoy_ctx_n_slot(const convoy_ctx *c) { return c->n_slot; }
int convoy_ctx_prefill_depth(const convoy_ctx *c) { return c->prefill_chunk < 0 ? 1 : convoy_ctx_depth(c); }

/* A chunk is about a quarter of a stage's share of the prompt left: the
 * chain fills and drains in one chunk per stage, so the chunks shrink as
 * the prompt ends and the drain stays short; 64 tokens or more keep the
 * batched kernels at their speed. */
enum { PREFILL_CHUNKS_PER_STAGE = 4, PREFILL_CHUNK_MIN = 64 };

int32_t convoy_ctx_prefill_chunk(const convoy_ctx *c, int32_t n_left)
{
    const int stages = convoy_ctx_stages(c);
    int32_t n = c->n_batch;
    if (c->prefill_chunk > 0)
        n = c->prefill_chunk;
    else if (c->prefill_chunk == 0 && stages > 1) {
        n = (n_left + PREFILL_CHUNKS_PER_STAGE * stages - 1) / (PREFILL_CHUNKS_PER_STAGE * stages);
        n = n < PREFILL_CHUNK_MIN ? PREFILL_CHUNK_MIN : n;
    }
    n = n < c->n_batch ? n : c->n_batch;
    return n < n_left ? n : n_left;
}

/* The API's want values are the engine's, passed through as they are. */
_Static_assert((int)CONVOY_WANT_NONE == (int)CV_WANT_NONE && (int)CONVOY_WANT_SAMPLE == (int)CV_WANT_SAMPLE &&
                   (int)CONVOY_WANT_DRAFT == (int)CV_WANT_DRAFT && (int)CONVOY_WANT_POOL == (int)CV_WANT_POOL &&
                   (int)CONVOY_WANT_EMBED == (int)CV_WANT_EMBED,
               "convoy.h's want values must equal forward.h's");
_Static_assert((int)CONVOY_POOLING_MEAN == (int)CV_POOL_MEAN && (int)CONVOY_POOLING_CLS == (int)CV_POOL_CLS &&
                   (int)CONVOY_POOLING_LAST == (int)CV_POOL_LAST,
               "convoy.h's pooling types are llama.cpp's, as model/llama.h's");

static cv_batch to_cv_batch(const convoy_batch *b)
{
    return (cv_batch){.n_tokens = b->n_tokens, .token = b->token, .pos = b->pos, .seq = b->seq, .want = b->want};
}

/* One machine: runs a batch into c->tokens and notes each wanted row's
 * slot for convoy_logprobs; returns the number of wanted rows. */
static int32_t span_step(convoy_ctx *c, const convoy_batch *b, char *err, size_t errlen)
{
    const cv_batch cb = to_cv_batch(b);
    if (cv_span_step(&c->span, &cb, NULL, NULL, c->tokens, err, errlen))
        return -1;
    int32_t n = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
        if (cv_want_output(b->want[t]))
            c->row_seq[n++] = b->seq[t];
    return n;
}

int convoy_step(convoy_ctx *c, const convoy_batch *b, int32_t *tokens, char *err, size_t errlen)
{
    if (c->pipeline) {
        int32_t n;
        if (c->chain && cv_chain_in_flight(c->chain))
            return cv_errf(err, errlen, "a step needs the chain idle, %d batches are in flight",
                           cv_chain_in_flight(c->chain));
        return convoy_submit(c, b, err, errlen) || convoy_collect(c, tokens, &n, err, errlen) ? -1 : 0;
    }
    const int32_t n = span_step(c, b, err, errlen);
    if (n < 0)
        return -1;
    if (tokens != c->tokens)
        memcpy(tokens, c->tokens, sizeof(int32_t) * (size_t)n);
    return 0;
}

int convoy_ctx_depth(const convoy_ctx *c) { return c->pipeline ? c->depth : 1; }

bool convoy_collect_waited(const convoy_ctx *c) { return c->pipeline && c->chain && cv_chain_result_waited(c->chain); }

int convoy_ctx_stages(const convoy_ctx *c) { return c->pipeline && c->chain ? cv_chain_stages(c->chain) : 1; }

double convoy_ctx_stage_seconds(const convoy_ctx *c)
{
    return c->pipeline && c->chain ? 1e-6 * cv_chain_stage_us(c->chain) : 0.0;
}

int convoy_submit(convoy_ctx *c, const convoy_batch *b, char *err, size_t errlen)
{
    if (c->pipeline) {
        const cv_batch cb = to_cv_batch(b);
        int n_failovers = 0;
        if (!c->chain)
            return pipeline_down(c, err, errlen);
        while (cv_chain_submit(c->chain, &cb, err, errlen))
            if (!failed_over(c, &n_failovers, err))
                return -1;
        journal_submit(&c->journal, &cb);
        return 0;
    }
    if (c->n_done >= 0)
        return cv_errf(err, errlen, "a batch is in flight already (depth 1 on one machine)");
    const int32_t n = span_step(c, b, err, errlen);
    if (n < 0)
        return -1;
    c->n_done = n;
    return 0;
}

int convoy_collect(convoy_ctx *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen)
{
    if (c->pipeline) {
        int n_failovers = 0;
        if (!c->chain || (c->rebalancing && rebalance_when_due(c, err, errlen)))
            return pipeline_down(c, err, errlen);
        while (cv_chain_collect(c->chain, tokens, n_tokens, err, errlen))
            if (!failed_over(c, &n_failovers, err))
                return -1;
        journal_collect(&c->journal, tokens);
        return 0;
    }
    if (c->n_done < 0)
        return cv_errf(err, errlen, "no batch in flight");
    memcpy(tokens, c->tokens, sizeof(int32_t) * (size_t)c->n_done);
    *n_tokens = c->n_done;
    c->n_done = -1;
    return 0;
}

const float *convoy_embedding(const convoy_ctx *c, int32_t i)
{
    if (c->pipeline)
        return c->chain ? cv_chain_embedding(c->chain, i) : NULL;
    return cv_span_embedding(&c->span, i);
}

int32_t convoy_ctx_pooling(const convoy_ctx *c) { return c->pooling; }

const float *convoy_logits(const convoy_ctx *c, int32_t i)
{
    if (c->pipeline)
        return c->chain ? cv_chain_logits(c->chain, i) : NULL;
    return cv_span_logits(&c->span, i);
}

int convoy_decode(convoy_ctx *c, const convoy_batch *b, float *logits, char *err, size_t errlen)
{
    if (convoy_step(c, b, c->tokens, err, errlen))
        return -1;
    if (c->pipeline && !convoy_logits(c, 0))
        return cv_errf(err, errlen, "this pipeline returns no logits (open it with want_logits)");
    const size_t row = sizeof(float) * (size_t)c->model->meta.hp.n_vocab;
    for (int32_t t = 0, i = 0; t < b->n_tokens; t++)
        if (cv_want_output(b->want[t])) {
            memcpy((char *)logits + (size_t)i * row, convoy_logits(c, i), row);
            i++;
        }
    return 0;
}

convoy_sampling_params convoy_sampling_default_params(void)
{
    const cv_sampler_params d = cv_sampler_default_params();
    return (convoy_sampling_params){.temp = d.temp, .top_k = d.top_k, .top_p = d.top_p, .min_p = d.min_p,
                                    .repeat_penalty = d.repeat_penalty, .penalty_last_n = d.penalty_last_n,
                                    .freq_penalty = d.freq_penalty, .presence_penalty = d.presence_penalty,
                                    .seed = d.seed, .n_logprobs = -1};
}

_Static_assert(CONVOY_MAX_TOP_LOGPROBS == CV_MAX_TOP_LOGPROBS, "convoy.h's logprobs bound must be infer's");
_Static_assert(sizeof(convoy_logprob) == sizeof(cv_logprob) &&
                   offsetof(convoy_logprob, logprob) == offsetof(cv_logprob, logprob),
               "convoy_logprob must be laid out as cv_logprob");

static_assert(sizeof(convoy_logit_bias) == sizeof(cv_logit_bias) && offsetof(convoy_logit_bias, bias) ==
                  offsetof(cv_logit_bias, bias), "convoy_logit_bias is the sampler's pair");
static_assert(CONVOY_MAX_LOGIT_BIAS == CV_PROTO_MAX_BIAS, "convoy.h states the logit bias limit");

int convoy_set_sampler(convoy_ctx *c, int32_t seq, const convoy_sampling_params *p, char *err, size_t errlen)
{
    if (p->n_logprobs < -1 || p->n_logprobs > CONVOY_MAX_TOP_LOGPROBS)
        return cv_errf(err, errlen, "%d log-probabilities asked, at most %d", p->n_logprobs, CONVOY_MAX_TOP_LOGPROBS);
    const cv_sampler_params sp = {.temp = p->temp, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p,
                                  .repeat_penalty = p->repeat_penalty, .penalty_last_n = p->penalty_last_n,
                                  .freq_penalty = p->freq_penalty, .presence_penalty = p->presence_penalty,
                                  .seed = p->seed, .bias = (const cv_logit_bias *)p->logit_bias,
                                  .n_bias = p->n_logit_bias};
    if (p->n_logit_bias < 0 || p->n_logit_bias > CONVOY_MAX_LOGIT_BIAS)
        return cv_errf(err, errlen, "%d logit biases, at most %d", p->n_logit_bias, CONVOY_MAX_LOGIT_BIAS);
    if (cv_logit_bias_check(sp.bias, sp.n_bias, c->model->meta.hp.n_vocab, err, errlen))
        return -1;
    if (c->pipeline) {
        int n_failovers = 0;
        if (!c->chain)
            return pipeline_down(c, err, errlen);
        if (seq < 0 || seq >= c->n_slot)
            return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", seq, c->n_slot);
        if (journal_set_sampler(&c->journal, seq, &sp, p->n_logprobs))
            return cv_errf(err, errlen, "out of memory for a logit bias of %d ids", sp.n_bias);
        /* a failover replays the journal, which has the sampler already */
        return cv_chain_set_sampler(c->chain, seq, &sp, p->n_logprobs, err, errlen) &&
                       !failed_over(c, &n_failovers, err)
                   ? -1
                   : 0;
    }
    if (cv_span_set_sampler(&c->span, seq, &sp, err, errlen))
        return -1;
    c->n_logprobs[seq] = p->n_logprobs;
    return 0;
}

static_assert(CONVOY_GRAMMAR_TEXT_MAX == CV_CONSTRAINT_TEXT_MAX, "convoy.h states the slots' grammar limit");

int convoy_grammar_check(const char *text, size_t len, char *err, size_t errlen)
{
    if (len > CV_CONSTRAINT_TEXT_MAX)
        return cv_errf(err, errlen, "the grammar has %zu bytes, at most %u are taken", len, CV_CONSTRAINT_TEXT_MAX);
    if (memchr(text, 0, len))
        return cv_errf(err, errlen, "the grammar holds a NUL byte");
    cv_grammar *g = cv_grammar_parse(text, len, err, errlen);
    cv_grammar_free(g);
    return g ? 0 : -1;
}

int convoy_set_grammar(convoy_ctx *c, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                       size_t errlen)
{
    if (convoy_grammar_check(text, len, err, errlen))
        return -1; /* refused here, so that no node fails on it */
    if (!c->pipeline)
        return cv_span_set_grammar(&c->span, seq, text, len, from, err, errlen);
    if (!c->chain)
        return pipeline_down(c, err, errlen);
    if (seq < 0 || seq >= c->n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", seq, c->n_slot);
    if (c->journal.slot[seq].sampler_at < 0)
        return cv_errf(err, errlen, "slot %d has no sampler: a grammar follows convoy_set_sampler", seq);
    if (from < c->journal.slot[seq].len)
        return cv_errf(err, errlen, "a grammar from position %d, but slot %d holds %d positions", from, seq,
                       c->journal.slot[seq].len);
    if (journal_set_grammar(&c->journal, seq, text, len, from))
        return cv_errf(err, errlen, "out of memory for a grammar of %zu bytes", len);
    int n_failovers = 0;
    return cv_chain_set_grammar(c->chain, seq, text, len, from, err, errlen) && !failed_over(c, &n_failovers, err)
               ? -1
               : 0;
}

int convoy_logprobs(const convoy_ctx *c, int32_t i, convoy_logprob *out)
{
    if (c->pipeline)
        return c->chain ? cv_chain_logprobs(c->chain, i, (cv_logprob *)out) : 0;
    const int32_t n = c->n_logprobs[c->row_seq[i]];
    if (n < 0 || c->tokens[i] < 0)
        return 0;
    cv_logprobs_row(cv_span_logits(&c->span, i), c->model->meta.hp.n_vocab, c->tokens[i], n, (cv_logprob *)out);
    return 1 + n;
}

int32_t convoy_seq_len(const convoy_ctx *c, int32_t seq)
{
    if (c->pipeline)
        return c->chain ? cv_chain_seq_len(c->chain, seq) : c->journal.slot[seq].len;
    return c->span.kv.len[seq];
}

/* A slot operation on a pipeline: noted in the journal (a pipeline that is
 * down gets it when it is back), then sent; a failover replays it. */
static int pipeline_seq_op(convoy_ctx *c, int32_t seq, int32_t len, char *err, size_t errlen)
{
    if (seq < 0 || seq >= c->n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", seq, c->n_slot);
    if (len >= 0)
        journal_truncate(&c->journal, seq, len);
    else
        journal_free_seq(&c->journal, seq);
    if (!c->chain)
        return 0;
    int n_failovers = 0;
    const int rc = len >= 0 ? cv_chain_seq_truncate(c->chain, seq, len, err, errlen)
                            : cv_chain_seq_free(c->chain, seq, err, errlen);
    return rc && !failed_over(c, &n_failovers, err) ? -1 : 0;
}

int convoy_seq_truncate(convoy_ctx *c, int32_t seq, int32_t len, char *err, size_t errlen)
{
    if (c->pipeline)
        return pipeline_seq_op(c, seq, len < 0 ? 0 : len, err, errlen);
    cv_span_seq_truncate(&c->span, seq, len);
    return 0;
}

int convoy_seq_copy(convoy_ctx *c, int32_t src, int32_t dst, int32_t len, char *err, size_t errlen)
{
    if (src < 0 || src >= c->n_slot || dst < 0 || dst >= c->n_slot || src == dst)
        return cv_errf(err, errlen, "copying slot %d into slot %d: slots are [0, %d) and distinct", src, dst,
                       c->n_slot);
    if (!c->pipeline) {
        cv_span_seq_copy(&c->span, src, dst, len);
        c->n_logprobs[dst] = -1;
        return 0;
    }
    journal_copy(&c->journal, src, dst, len);
    if (!c->chain)
        return 0;
    int n_failovers = 0;
    return cv_chain_seq_copy(c->chain, src, dst, len, err, errlen) && !failed_over(c, &n_failovers, err) ? -1 : 0;
}

int convoy_seq_free(convoy_ctx *c, int32_t seq, char *err, size_t errlen)
{
    if (c->pipeline)
        return pipeline_seq_op(c, seq, -1, err, errlen);
    cv_span_seq_free(&c->span, seq);
    c->n_logprobs[seq] = -1;
    return 0;
}
