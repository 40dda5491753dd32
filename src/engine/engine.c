/* engine.c: include/convoy.h's models, contexts and steps. src/engine/ is
 * the engine's floor of the house: it implements the API over infer/ (one
 * machine) and pipe/ (a chain), and is all that serve/ and app/ see of
 * them. A convoy_model is the GGUF's hyperparameters and vocabulary
 * (weights stay mapped and untouched until a span binds them); a convoy_ctx
 * is this file's front over one of two backends (engine_impl.h), chosen
 * when it is created: one cv_span holding every layer on this machine
 * (engine_local.c), or a cv_chain of pipeline stages (engine_chain.c). */
#include "convoy.h"

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/pool.h"
#include "engine/engine_impl.h"
#include "engine/forecast.h"
#include "infer/constraint.h"
#include "infer/grammar.h"
#include "infer/logprobs.h"
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

struct convoy_ctx {
    convoy_model *model;
    engine_backend *be; /* engine_local.c's or engine_chain.c's */
    int32_t n_batch;
    int32_t prefill_chunk; /* convoy_ctx_params' */
    int32_t n_slot;
    int32_t *tokens;  /* [n_batch] convoy_decode's sampled ids */
    int32_t pooling;  /* the embeddings' CV_POOL_*: convoy_ctx_params' or the model's */
};

static_assert(CONVOY_ERR_MAX == CV_ERRLEN, "convoy.h's error buffer is the size the layers write for");

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
    const gguf_kv *tmpl = cv_gguf_find_kv(&m->meta.gguf, "tokenizer.chat_template");
    if (tmpl && tmpl->type == GGUF_STRING && !(m->chat_template = cv_gguf_str_dup(tmpl->v.str))) {
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
    const char *ftype_name = cv_gguf_find_kv(f, "general.file_type") &&
                                     cv_gguf_get_u32(f, "general.file_type", &ftype, NULL, 0) == 0
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
    /* The same layout (two size_t); the engine's plain range type stays private. */
    _Static_assert(sizeof(convoy_span) == sizeof(cv_text_range), "plain range layouts differ");
    return cv_tokenize_plain(&m->vocab, text, len, add_special, true, (const cv_text_range *)plain, n_plain, out,
                             n_max);
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

bool convoy_ctx_is_down(const convoy_ctx *c) { return c->be->ops->is_down(c->be); }

bool convoy_ctx_failing_over(convoy_ctx *c) { return atomic_load(&c->be->failing_over); }

void convoy_ctx_get_stats(const convoy_ctx *c, convoy_ctx_stats *out) { *out = c->be->stats; }

void convoy_ctx_get_node_costs(const convoy_ctx *c, convoy_node_costs *out) { c->be->ops->node_costs(c->be, out); }

int convoy_ctx_check(convoy_ctx *c, char *err, size_t errlen) { return c->be->ops->check(c->be, err, errlen); }

int convoy_ctx_reconnect(convoy_ctx *c, char *err, size_t errlen) { return c->be->ops->reconnect(c->be, err, errlen); }

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
    c->pooling = p->pooling ? p->pooling : m->meta.hp.pooling;
    c->be = p->nodes ? cv_engine_chain_open(m->path, &m->meta, p, c->pooling, err, errlen)
                     : cv_engine_local_open(m->path, &m->meta, p, c->pooling, err, errlen);
    if (!c->be) {
        cv_free(c);
        return NULL;
    }
    c->tokens = cv_malloc(sizeof(int32_t) * (size_t)p->n_batch);
    if (!c->tokens) {
        convoy_ctx_free(c);
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    return c;
}

void convoy_ctx_free(convoy_ctx *c)
{
    if (!c)
        return;
    c->be->ops->close(c->be);
    cv_free(c->tokens);
    cv_free(c);
}

int32_t convoy_ctx_n_ctx(const convoy_ctx *c) { return c->be->n_ctx; }
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

int convoy_step(convoy_ctx *c, const convoy_batch *b, int32_t *tokens, char *err, size_t errlen)
{
    const cv_batch cb = to_cv_batch(b);
    return c->be->ops->step(c->be, &cb, tokens, err, errlen);
}

int convoy_ctx_depth(const convoy_ctx *c) { return c->be->depth; }

bool convoy_collect_waited(const convoy_ctx *c) { return c->be->ops->collect_waited(c->be); }

int convoy_ctx_stages(const convoy_ctx *c) { return c->be->ops->stages(c->be); }

double convoy_ctx_stage_seconds(const convoy_ctx *c) { return c->be->ops->stage_seconds(c->be); }

int convoy_submit(convoy_ctx *c, const convoy_batch *b, char *err, size_t errlen)
{
    const cv_batch cb = to_cv_batch(b);
    return c->be->ops->submit(c->be, &cb, err, errlen);
}

int convoy_collect(convoy_ctx *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen)
{
    return c->be->ops->collect(c->be, tokens, n_tokens, err, errlen);
}

const float *convoy_embedding(const convoy_ctx *c, int32_t i) { return c->be->ops->embedding(c->be, i); }

int32_t convoy_ctx_pooling(const convoy_ctx *c) { return c->pooling; }

const float *convoy_logits(const convoy_ctx *c, int32_t i) { return c->be->ops->logits(c->be, i); }

int convoy_decode(convoy_ctx *c, const convoy_batch *b, float *logits, char *err, size_t errlen)
{
    if (convoy_step(c, b, c->tokens, err, errlen))
        return -1;
    if (!convoy_logits(c, 0)) /* one machine always has them */
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

/* A penalty window past the context sees what the context's does (a slot
 * holds no more): counted so, a node's sampler history stays within the
 * context its memory was counted for, as one machine's does. */
static int32_t penalty_window(const convoy_ctx *c, int32_t penalty_last_n)
{
    return penalty_last_n < 0 || penalty_last_n > c->be->n_ctx ? c->be->n_ctx : penalty_last_n;
}

int convoy_set_sampler(convoy_ctx *c, int32_t seq, const convoy_sampling_params *p, char *err, size_t errlen)
{
    if (p->n_logprobs < -1 || p->n_logprobs > CONVOY_MAX_TOP_LOGPROBS)
        return cv_errf(err, errlen, "%d log-probabilities asked, at most %d", p->n_logprobs, CONVOY_MAX_TOP_LOGPROBS);
    if (p->penalty_last_n < -1)
        return cv_errf(err, errlen, "penalty_last_n %d: 0 (none), -1 (the whole context) or a count",
                       p->penalty_last_n);
    const cv_sampler_params sp = {.temp = p->temp, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p,
                                  .repeat_penalty = p->repeat_penalty,
                                  .penalty_last_n = penalty_window(c, p->penalty_last_n),
                                  .freq_penalty = p->freq_penalty, .presence_penalty = p->presence_penalty,
                                  .seed = p->seed, .bias = (const cv_logit_bias *)p->logit_bias,
                                  .n_bias = p->n_logit_bias};
    if (p->n_logit_bias < 0 || p->n_logit_bias > CONVOY_MAX_LOGIT_BIAS)
        return cv_errf(err, errlen, "%d logit biases, at most %d", p->n_logit_bias, CONVOY_MAX_LOGIT_BIAS);
    if (cv_logit_bias_check(sp.bias, sp.n_bias, c->model->meta.hp.n_vocab, err, errlen))
        return -1;
    return c->be->ops->set_sampler(c->be, seq, &sp, p->n_logprobs, err, errlen);
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
    return c->be->ops->set_grammar(c->be, seq, text, len, from, err, errlen);
}

int convoy_logprobs(const convoy_ctx *c, int32_t i, convoy_logprob *out)
{
    return c->be->ops->logprobs(c->be, i, (cv_logprob *)out);
}

int32_t convoy_seq_len(const convoy_ctx *c, int32_t seq) { return c->be->ops->seq_len(c->be, seq); }

/* A slot a call names must be one of the context's: the backends index
 * their per-slot arrays with it. */
static int bad_slot(const convoy_ctx *c, int32_t seq, char *err, size_t errlen)
{
    if (seq >= 0 && seq < c->n_slot)
        return 0;
    return cv_errf(err, errlen, "slot %d: slots are [0, %d)", seq, c->n_slot);
}

int convoy_seq_truncate(convoy_ctx *c, int32_t seq, int32_t len, char *err, size_t errlen)
{
    if (bad_slot(c, seq, err, errlen))
        return -1;
    return c->be->ops->seq_truncate(c->be, seq, len, err, errlen);
}

int convoy_seq_copy(convoy_ctx *c, int32_t src, int32_t dst, int32_t len, char *err, size_t errlen)
{
    if (src < 0 || src >= c->n_slot || dst < 0 || dst >= c->n_slot || src == dst)
        return cv_errf(err, errlen, "copying slot %d into slot %d: slots are [0, %d) and distinct", src, dst,
                       c->n_slot);
    return c->be->ops->seq_copy(c->be, src, dst, len, err, errlen);
}

int convoy_seq_free(convoy_ctx *c, int32_t seq, char *err, size_t errlen)
{
    if (bad_slot(c, seq, err, errlen))
        return -1;
    return c->be->ops->seq_free(c->be, seq, err, errlen);
}
