/* engine.c: include/convoy.h over one machine: a convoy_model binds all
 * layers of a GGUF plus its vocabulary; a convoy_ctx owns a thread pool,
 * the KV cache and a forward pass. */
#include "convoy.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/forward.h"
#include "infer/kv.h"
#include "model/llama.h"
#include "model/vocab.h"

struct convoy_model {
    cv_llama llama;
    cv_vocab vocab;
};

struct convoy_ctx {
    convoy_model *model;
    cv_pool *pool;
    cv_kv kv;
    cv_forward *fwd;
};

struct convoy_detok {
    cv_detok d;
};

convoy_model *convoy_model_load(const char *path, char *err, size_t errlen)
{
    convoy_model *m = cv_calloc(1, sizeof *m);
    if (!m) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    if (cv_llama_load(&m->llama, path, 0, -1, err, errlen)) {
        cv_free(m);
        return NULL;
    }
    if (cv_vocab_load(&m->vocab, &m->llama.gguf, err, errlen)) {
        cv_llama_free(&m->llama);
        cv_free(m);
        return NULL;
    }
    if (m->vocab.n_vocab != m->llama.hp.n_vocab) {
        cv_errf(err, errlen, "%s: vocabulary has %d tokens but token_embd.weight has %d rows", m->llama.gguf.name,
                m->vocab.n_vocab, m->llama.hp.n_vocab);
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
    cv_llama_free(&m->llama);
    cv_free(m);
}

void convoy_model_get_info(const convoy_model *m, convoy_model_info *info)
{
    const cv_llama_hparams *hp = &m->llama.hp;
    memset(info, 0, sizeof *info);
    strcpy(info->arch, "llama");
    info->n_vocab = hp->n_vocab;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_layer = hp->n_layer;
    info->n_embd = hp->n_embd;
    info->bos = m->vocab.bos;
    info->eos = m->vocab.eos;
    info->bytes_per_token = cv_llama_bytes_per_token(&m->llama);
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
    return (convoy_ctx_params){.n_threads = 1, .n_ctx = 0, .n_slot = 1, .n_batch = 512, .kv_f16 = false};
}

convoy_ctx *convoy_ctx_create(convoy_model *m, const convoy_ctx_params *p, char *err, size_t errlen)
{
    const cv_llama_hparams *hp = &m->llama.hp;
    if (p->n_threads < 1 || p->n_threads > 256 || p->n_slot < 1 || p->n_batch < 1 || p->n_ctx < 0) {
        cv_errf(err, errlen, "bad context parameters (threads %d, slots %d, batch %d, context %d)", p->n_threads,
                p->n_slot, p->n_batch, p->n_ctx);
        return NULL;
    }
    convoy_ctx *c = cv_calloc(1, sizeof *c);
    if (!c) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    c->model = m;
    const int32_t n_ctx = p->n_ctx ? p->n_ctx : hp->n_ctx_train;
    if (cv_kv_create(&c->kv, p->kv_f16 ? CV_TYPE_F16 : CV_TYPE_F32, p->n_slot, n_ctx, m->llama.l0, m->llama.l1,
                     hp->n_head_kv * hp->head_dim, err, errlen))
        goto fail;
    c->pool = cv_pool_create(p->n_threads);
    if (!c->pool) {
        cv_errf(err, errlen, "cannot start %d threads", p->n_threads);
        goto fail;
    }
    c->fwd = cv_forward_create(&m->llama, &c->kv, c->pool, p->n_batch, err, errlen);
    if (!c->fwd)
        goto fail;
    return c;
fail:
    convoy_ctx_free(c);
    return NULL;
}

void convoy_ctx_free(convoy_ctx *c)
{
    if (!c)
        return;
    cv_forward_free(c->fwd);
    if (c->pool)
        cv_pool_free(c->pool);
    cv_kv_free(&c->kv);
    cv_free(c);
}

int32_t convoy_ctx_n_ctx(const convoy_ctx *c) { return c->kv.n_ctx; }
int32_t convoy_ctx_n_batch(const convoy_ctx *c) { return cv_forward_batch_max(c->fwd); }

int convoy_decode(convoy_ctx *c, const convoy_batch *b, float *logits, char *err, size_t errlen)
{
    const cv_batch fb = {.n_tokens = b->n_tokens, .token = b->token, .pos = b->pos, .seq = b->seq, .want = b->want};
    return cv_forward_run(c->fwd, &fb, NULL, logits, err, errlen);
}

int32_t convoy_seq_len(const convoy_ctx *c, int32_t seq) { return c->kv.len[seq]; }
void convoy_seq_truncate(convoy_ctx *c, int32_t seq, int32_t len) { kv_seq_truncate(&c->kv, seq, len); }
void convoy_seq_free(convoy_ctx *c, int32_t seq) { kv_seq_free(&c->kv, seq); }
