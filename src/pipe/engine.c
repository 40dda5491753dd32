/* engine.c: include/convoy.h. A convoy_model is the GGUF's hyperparameters
 * and vocabulary (weights stay mapped and untouched until a stage binds
 * them); a convoy_ctx is either one cv_stage holding every layer on this
 * machine, or a cv_chain of remote stages. */
#include "convoy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/stage.h"
#include "pipe/chain.h"
#include "model/llama.h"
#include "model/vocab.h"

struct convoy_model {
    char *path;
    char *chat_template; /* tokenizer.chat_template, or NULL */
    cv_llama meta; /* bound for no layers: hyperparameters and file only */
    cv_vocab vocab;
};

struct convoy_ctx {
    convoy_model *model;
    cv_chain *chain;  /* a pipeline, or NULL: */
    cv_stage stage;   /* every layer here */
    int32_t n_batch;
    int32_t n_slot;
    int32_t *tokens;  /* [n_batch] sampled ids of the last step */
    int32_t n_done;   /* one machine: ids in tokens not yet collected, -1 when none */
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
    static const char *const arch_names[] = {[CV_ARCH_LLAMA] = "llama", [CV_ARCH_QWEN2] = "qwen2",
                                             [CV_ARCH_QWEN3] = "qwen3"};
    const cv_llama_hparams *hp = &m->meta.hp;
    memset(info, 0, sizeof *info);
    snprintf(info->arch, sizeof info->arch, "%s", arch_names[hp->arch]);
    info->n_vocab = hp->n_vocab;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_layer = hp->n_layer;
    info->n_embd = hp->n_embd;
    info->bos = m->vocab.bos;
    info->eos = m->vocab.eos;
    info->bytes_per_token = cv_llama_weight_bytes(&m->meta, 0, hp->n_layer, true);
}

int convoy_tokenize(const convoy_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                    int32_t *out, int32_t n_max)
{
    return cv_tokenize(&m->vocab, text, len, add_special, parse_special, out, n_max);
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
    return (convoy_ctx_params){.n_threads = 1, .n_ctx = 0, .n_slot = 1, .n_batch = 512, .timeout_ms = 30000};
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

static int open_chain(convoy_ctx *c, const convoy_ctx_params *p, char *err, size_t errlen)
{
    enum { MAX = 16 };
    char nodes_buf[4096], split_buf[256];
    char *nodes[MAX], *split_s[MAX];
    int32_t split[MAX];
    snprintf(nodes_buf, sizeof nodes_buf, "%s", p->nodes);
    const int n_nodes = split_list(nodes_buf, nodes, MAX);
    cv_chain_opts o = cv_chain_default_opts();
    o.nodes = (const char *const *)nodes;
    o.n_nodes = n_nodes;
    o.n_threads = p->n_threads;
    o.n_ctx = p->n_ctx;
    o.n_slot = p->n_slot;
    o.n_batch = p->n_batch;
    o.kv_f16 = p->kv_f16;
    o.want_logits = p->want_logits;
    o.local_mem_budget = p->mem_budget;
    if (p->timeout_ms > 0)
        o.io_timeout_ms = p->timeout_ms;
    if (p->split) {
        snprintf(split_buf, sizeof split_buf, "%s", p->split);
        if (split_list(split_buf, split_s, MAX) != n_nodes)
            return cv_errf(err, errlen, "--split gives layer counts for %s nodes, not one per node (%d)",
                           split_s[0] ? "some" : "no", n_nodes);
        for (int i = 0; i < n_nodes; i++) {
            char *end;
            long v = strtol(split_s[i], &end, 10);
            if (end == split_s[i] || *end || v < 0 || v > 65536)
                return cv_errf(err, errlen, "--split: '%s' is not a layer count", split_s[i]);
            split[i] = (int32_t)v;
        }
        o.split = split;
    }
    if (p->wire && strcmp(p->wire, "f32")) {
        if (!strcmp(p->wire, "f16"))
            o.act_type = CV_ACT_F16;
        else if (!strcmp(p->wire, "q8_0"))
            o.act_type = CV_ACT_Q8_0;
        else
            return cv_errf(err, errlen, "wire type '%s' is not f32, f16 or q8_0", p->wire);
    }
    return cv_chain_open(&c->chain, c->model->path, &o, err, errlen);
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
    c->n_slot = p->n_slot;
    c->n_done = -1;
    const cv_stage_params sp = {.l0 = 0, .l1 = -1, .n_threads = p->n_threads, .n_ctx = p->n_ctx,
                                .n_slot = p->n_slot, .n_batch = p->n_batch, .kv_f16 = p->kv_f16};
    if (p->nodes ? open_chain(c, p, err, errlen) : 0) {
        cv_free(c);
        return NULL;
    }
    if (!p->nodes) {
        const uint64_t need = cv_stage_bytes_needed(&m->meta, &sp);
        if (p->mem_budget && need > p->mem_budget) {
            cv_errf(err, errlen, "%s needs %.2f GB here (weights, KV cache, buffers), the budget is %.2f GB: "
                                 "split it over nodes with --nodes",
                    m->path, need / 1e9, p->mem_budget / 1e9);
            cv_free(c);
            return NULL;
        }
        if (cv_stage_open(&c->stage, m->path, &sp, err, errlen)) {
            cv_free(c);
            return NULL;
        }
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
    if (c->chain)
        cv_chain_close(c->chain);
    else
        cv_stage_close(&c->stage);
    cv_free(c->tokens);
    cv_free(c);
}

int32_t convoy_ctx_n_ctx(const convoy_ctx *c) { return c->chain ? cv_chain_n_ctx(c->chain) : c->stage.kv.n_ctx; }
int32_t convoy_ctx_n_batch(const convoy_ctx *c) { return c->n_batch; }
int32_t convoy_ctx_n_slot(const convoy_ctx *c) { return c->n_slot; }

/* The API's want values are the engine's, passed through as they are. */
_Static_assert((int)CONVOY_WANT_NONE == (int)CV_WANT_NONE && (int)CONVOY_WANT_SAMPLE == (int)CV_WANT_SAMPLE &&
                   (int)CONVOY_WANT_DRAFT == (int)CV_WANT_DRAFT,
               "convoy.h's want values must equal forward.h's");

static cv_batch to_cv_batch(const convoy_batch *b)
{
    return (cv_batch){.n_tokens = b->n_tokens, .token = b->token, .pos = b->pos, .seq = b->seq, .want = b->want};
}

int convoy_step(convoy_ctx *c, const convoy_batch *b, int32_t *tokens, char *err, size_t errlen)
{
    const cv_batch cb = to_cv_batch(b);
    if (c->chain)
        return cv_chain_step(c->chain, &cb, tokens, err, errlen);
    return cv_stage_step(&c->stage, &cb, NULL, NULL, tokens, err, errlen);
}

int convoy_ctx_depth(const convoy_ctx *c) { return c->chain ? cv_chain_depth(c->chain) : 1; }

int convoy_submit(convoy_ctx *c, const convoy_batch *b, char *err, size_t errlen)
{
    const cv_batch cb = to_cv_batch(b);
    if (c->chain)
        return cv_chain_submit(c->chain, &cb, err, errlen);
    if (c->n_done >= 0)
        return cv_errf(err, errlen, "a batch is in flight already (depth 1 on one machine)");
    if (cv_stage_step(&c->stage, &cb, NULL, NULL, c->tokens, err, errlen))
        return -1;
    c->n_done = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
        c->n_done += b->want[t] ? 1 : 0;
    return 0;
}

int convoy_collect(convoy_ctx *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen)
{
    if (c->chain)
        return cv_chain_collect(c->chain, tokens, n_tokens, err, errlen);
    if (c->n_done < 0)
        return cv_errf(err, errlen, "no batch in flight");
    memcpy(tokens, c->tokens, sizeof(int32_t) * (size_t)c->n_done);
    *n_tokens = c->n_done;
    c->n_done = -1;
    return 0;
}

const float *convoy_logits(const convoy_ctx *c, int32_t i)
{
    return c->chain ? cv_chain_logits(c->chain, i) : cv_stage_logits(&c->stage, i);
}

int convoy_decode(convoy_ctx *c, const convoy_batch *b, float *logits, char *err, size_t errlen)
{
    if (convoy_step(c, b, c->tokens, err, errlen))
        return -1;
    if (c->chain && !convoy_logits(c, 0))
        return cv_errf(err, errlen, "this pipeline returns no logits (open it with want_logits)");
    const size_t row = sizeof(float) * (size_t)c->model->meta.hp.n_vocab;
    for (int32_t t = 0, i = 0; t < b->n_tokens; t++)
        if (b->want[t]) {
            memcpy((char *)logits + (size_t)i * row, convoy_logits(c, i), row);
            i++;
        }
    return 0;
}

int convoy_set_sampler(convoy_ctx *c, int32_t seq, const cv_sampler_params *p, char *err, size_t errlen)
{
    if (c->chain)
        return cv_chain_set_sampler(c->chain, seq, p, err, errlen);
    return cv_stage_set_sampler(&c->stage, seq, p, err, errlen);
}

int32_t convoy_seq_len(const convoy_ctx *c, int32_t seq)
{
    return c->chain ? cv_chain_seq_len(c->chain, seq) : c->stage.kv.len[seq];
}

int convoy_seq_truncate(convoy_ctx *c, int32_t seq, int32_t len, char *err, size_t errlen)
{
    if (c->chain)
        return cv_chain_seq_truncate(c->chain, seq, len, err, errlen);
    cv_stage_seq_truncate(&c->stage, seq, len);
    return 0;
}

int convoy_seq_free(convoy_ctx *c, int32_t seq, char *err, size_t errlen)
{
    if (c->chain)
        return cv_chain_seq_free(c->chain, seq, err, errlen);
    cv_stage_seq_free(&c->stage, seq);
    return 0;
}
