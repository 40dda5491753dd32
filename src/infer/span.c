/* span.c: a layer range's inference state and its step (see span.h). The
 * step is the forward pass plus, in the last span (the one holding the
 * output matrix), sampling: the same code runs on one machine (the span
 * holds every layer) and at the last stage of a chain, which is what makes
 * their tokens identical. */
#include "infer/span.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "kernels/attention.h"
#include "kernels/kernels.h"

/* Bytes one allocation of n can hold resident: the allocator's header and
 * alignment, in whole pages (an upper bound for a block of any size). */
static uint64_t alloc_bytes(uint64_t n) { return (n + 64 + 4095) / 4096 * 4096; }

/* The last span's samplers: cv_sampler_create's five arrays and the struct. */
static uint64_t sampler_bytes(uint64_t n_vocab, uint64_t n_ctx)
{
    return 3 * alloc_bytes(8 * n_vocab) + alloc_bytes(4 * n_vocab) + alloc_bytes(4 * n_ctx) + alloc_bytes(256);
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* cv_forward_create's buffers of a mixture of experts (alloc_experts),
 * for batches of n tokens. */
static uint64_t expert_buffer_bytes(const cv_llama_hparams *hp, uint64_t n)
{
    const uint64_t ne = (uint64_t)hp->n_embd, n_expert = (uint64_t)hp->n_expert;
    const uint64_t rows = n * (uint64_t)hp->n_expert_used, ff = (uint64_t)hp->n_ff_exp;
    return alloc_bytes(4 * n * n_expert) + 3 * alloc_bytes(4 * rows) + alloc_bytes(4 * (n_expert + 1)) +
           2 * alloc_bytes(4 * rows * ne) + 2 * alloc_bytes(4 * rows * ff) + alloc_bytes(4 * n * ne) +
           alloc_bytes(4 * n) + alloc_bytes(2 * n_expert * 128) + alloc_bytes(4 * n_expert) +
           alloc_bytes(n_expert * sizeof(cv_expert));
}

/* cv_forward_create's buffers, the pool and the KV cache's bookkeeping:
 * what cv_span_open allocates whatever the layers. */
static uint64_t fixed_bytes(const cv_llama_hparams *hp, const cv_span_params *p)
{
    const uint64_t n = (uint64_t)p->n_batch, ne = (uint64_t)hp->n_embd;
    const uint64_t n_q = (uint64_t)hp->n_head * (uint64_t)hp->head_dim;
    const uint64_t n_kv = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim, n_ff = (uint64_t)hp->n_ff;
    const uint64_t max_in = max_u64(max_u64(ne, n_q), max_u64(n_ff, (uint64_t)hp->n_ff_exp));
    const uint64_t act_rows = n * (uint64_t)(hp->n_expert ? hp->n_expert_used : 1); /* per token: one per expert */
    const uint64_t threads = (uint64_t)(p->n_threads > 0 ? p->n_threads : 1);
    const uint64_t att_rows = (uint64_t)(hp->n_head / hp->n_head_kv) * CV_ATTN_TOKENS;
    return (hp->n_expert ? expert_buffer_bytes(hp, n) : 0) + 2 * alloc_bytes(4 * n * ne) +
           2 * alloc_bytes(4 * n * n_q) + 2 * alloc_bytes(4 * n * n_kv) + 2 * alloc_bytes(4 * n * n_ff) +
           alloc_bytes(act_rows * (4 * max_in + 64)) +
           2 * alloc_bytes(4 * n * (uint64_t)(hp->n_rot / 2 + 1)) +
           alloc_bytes(4 * threads * (uint64_t)cv_attn_scratch_floats(hp->head_dim, (int)att_rows)) +
           alloc_bytes(4 * (n + 1)) + 3 * alloc_bytes(4 * (uint64_t)p->n_slot) +
           alloc_bytes(1024) + alloc_bytes(256 + 64 * threads) + 2 * alloc_bytes(0); /* forward, pool, K and V rounding */
}

void cv_span_costs_of(const cv_llama *m, const cv_span_params *p, cv_span_costs *c)
{
    const cv_llama_hparams *hp = &m->hp;
    const uint64_t n_ctx = (uint64_t)(p->n_ctx ? p->n_ctx : hp->n_ctx_train);
    const uint64_t kv_dim = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim, nv = (uint64_t)hp->n_vocab;
    const uint64_t n_slot = (uint64_t)p->n_slot;
    c->kv_per_layer = 2 * n_slot * n_ctx * kv_dim * (p->kv_f16 ? 2 : 4);
    c->fixed = fixed_bytes(hp, p);
    const uint64_t ne = (uint64_t)hp->n_embd, nb = (uint64_t)p->n_batch;
    c->last_extra = alloc_bytes(4 * nb * nv) + n_slot * sampler_bytes(nv, n_ctx) + alloc_bytes(8 * n_slot) +
                    alloc_bytes(4 * n_slot) + alloc_bytes(4 * nb) + alloc_bytes(nb) + alloc_bytes(8 * n_slot) +
                    alloc_bytes(4 * n_slot * ne) + alloc_bytes(4 * n_slot) + alloc_bytes(4 * nb * ne) +
                    alloc_bytes(nb); /* the pools, their counts, the embeddings and their rows' flags */
}

uint64_t cv_span_bytes_needed(const cv_llama *m, const cv_span_params *p)
{
    const int32_t l1 = p->l1 < 0 ? m->hp.n_layer : p->l1;
    cv_span_costs c;
    cv_span_costs_of(m, p, &c);
    return cv_llama_weight_bytes(m, p->l0, l1, p->from_hidden ? CV_EMBD_NONE : CV_EMBD_ALL) + (uint64_t)(l1 - p->l0) * c.kv_per_layer + c.fixed +
           (l1 == m->hp.n_layer ? c.last_extra : 0);
}

int cv_span_open(cv_span *s, const char *path, const cv_span_params *p, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (p->n_threads < 1 || p->n_threads > 256 || p->n_slot < 1 || p->n_slot > 4096 || p->n_batch < 1 || p->n_ctx < 0)
        return cv_errf(err, errlen, "bad span parameters (threads %d, slots %d, batch %d, context %d)", p->n_threads,
                       p->n_slot, p->n_batch, p->n_ctx);
    if (cv_llama_load(&s->model, path, p->l0, p->l1, err, errlen))
        return -1;
    if (p->mlock && s->model.resident_bytes && mlock(s->model.resident, s->model.resident_bytes)) {
        cv_errf(err, errlen, "cannot lock %zu bytes of weights in memory (--mlock): %s; the limit is `ulimit -l` "
                             "(systemd: LimitMEMLOCK=)", s->model.resident_bytes, strerror(errno));
        goto fail;
    }
    const cv_llama_hparams *hp = &s->model.hp;
    s->n_batch = p->n_batch;
    s->pooling = p->pooling;
    if (cv_kv_create(&s->kv, p->kv_f16 ? CV_TYPE_F16 : CV_TYPE_F32, p->n_slot, p->n_ctx ? p->n_ctx : hp->n_ctx_train,
                     s->model.l0, s->model.l1, hp->n_head_kv * hp->head_dim, err, errlen))
        goto fail;
    s->pool = cv_pool_create(p->n_threads);
    if (!s->pool) {
        cv_errf(err, errlen, "cannot start %d threads", p->n_threads);
        goto fail;
    }
    if (hp->n_expert && s->model.l1 > s->model.l0) {
        const int32_t all = cv_experts_all_slots(&s->model, s->model.l0, s->model.l1);
        if (!(s->experts = cv_experts_create(&s->model, p->expert_slots ? p->expert_slots : all, err, errlen)))
            goto fail;
    }
    s->fwd = cv_forward_create(&s->model, &s->kv, s->pool, s->experts, p->n_batch, err, errlen);
    s->stale_len = cv_malloc(sizeof(int32_t) * (size_t)p->n_slot);
    if (!s->fwd || !s->stale_len) {
        if (s->fwd)
            cv_errf(err, errlen, "out of memory");
        goto fail;
    }
    if (cv_llama_has_output(&s->model)) {
        s->samplers = cv_calloc((size_t)p->n_slot, sizeof *s->samplers);
        s->constraints = cv_calloc((size_t)p->n_slot, sizeof *s->constraints);
        s->logits = cv_aligned_alloc(sizeof(float) * (size_t)p->n_batch * (size_t)hp->n_vocab);
        s->slot_row = cv_malloc(sizeof(int32_t) * (size_t)p->n_slot);
        s->draft_of = cv_malloc(sizeof(int32_t) * (size_t)p->n_batch);
        s->guess = cv_malloc((size_t)p->n_batch);
        s->last_id = cv_malloc(2 * sizeof(int32_t) * (size_t)p->n_slot);
        s->sums = cv_malloc(sizeof(float) * (size_t)p->n_slot * (size_t)hp->n_embd);
        s->n_pooled = cv_calloc((size_t)p->n_slot, sizeof *s->n_pooled);
        s->embd = cv_malloc(sizeof(float) * (size_t)p->n_batch * (size_t)hp->n_embd);
        s->row_embd = cv_calloc((size_t)p->n_batch, 1);
        if (!s->samplers || !s->constraints || !s->logits || !s->slot_row || !s->draft_of || !s->guess ||
            !s->last_id || !s->sums || !s->n_pooled || !s->embd || !s->row_embd) {
            cv_errf(err, errlen, "out of memory for %d rows of logits", p->n_batch);
            goto fail;
        }
        for (int32_t i = 0; i < p->n_slot; i++)
            s->last_id[2 * i + 1] = -1;
    }
    return 0;
fail:
    cv_span_close(s);
    return -1;
}

void cv_span_close(cv_span *s)
{
    for (int32_t i = 0; i < s->kv.n_slot; i++) {
        if (s->samplers)
            cv_sampler_free(s->samplers[i]);
        if (s->constraints)
            cv_constraint_free(s->constraints[i]);
    }
    cv_free(s->samplers);
    cv_free(s->constraints);
    cv_vocab_pieces_free(&s->pieces);
    cv_free(s->masked);
    cv_free_aligned(s->logits);
    cv_free(s->slot_row);
    cv_free(s->draft_of);
    cv_free(s->stale_len);
    cv_free(s->guess);
    cv_free(s->last_id);
    cv_free(s->sums);
    cv_free(s->n_pooled);
    cv_free(s->embd);
    cv_free(s->row_embd);
    cv_forward_free(s->fwd);
    cv_experts_free(s->experts);
    if (s->pool)
        cv_pool_free(s->pool);
    cv_kv_free(&s->kv);
    if (s->model.layers)
        cv_llama_free(&s->model);
    memset(s, 0, sizeof *s);
}

/* Truncates each slot whose first token in the batch starts below its
 * cached length (the rollback rule of span.h); the batch is checked. */
static void roll_back(cv_span *s, const cv_batch *b)
{
    for (int32_t t = 0; t < b->n_tokens; t++)
        cv_span_seq_truncate(s, b->seq[t], b->pos[t]);
}

/* Marks the stale windows (span.h) in stale_len: a slot whose first row
 * in the batch is a draft past the slot's length. Every span marks them: a
 * stage brought up by a failover meets one without the windows before it.
 * The batch's size and slots are checked. */
static int mark_stale(cv_span *s, const cv_batch *b, char *err, size_t errlen)
{
    if (b->n_tokens < 1 || b->n_tokens > s->n_batch)
        return cv_errf(err, errlen, "batch of %d tokens is outside [1, %d]", b->n_tokens, s->n_batch);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        if (b->seq[t] < 0 || b->seq[t] >= s->kv.n_slot)
            return cv_errf(err, errlen, "token %d: sequence slot %d is outside [0, %d)", t, b->seq[t],
                           s->kv.n_slot);
        if (b->want[t] > CV_WANT_MAX)
            return cv_errf(err, errlen, "token %d: want %u is not 0 to %d", t, b->want[t], CV_WANT_MAX);
        if (cv_want_pools(b->want[t]) && s->sums &&
            (s->pooling < CV_POOL_MEAN || s->pooling > CV_POOL_LAST))
            return cv_errf(err, errlen, "token %d is pooled, but pooling type %d gives no embeddings (mean 1, "
                                        "cls 2, last 3)", t, s->pooling);
        s->stale_len[b->seq[t]] = -2; /* no row seen yet */
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t *st = &s->stale_len[b->seq[t]];
        if (*st == -2)
            *st = b->want[t] == CV_WANT_DRAFT && b->pos[t] > s->kv.len[b->seq[t]] ? s->kv.len[b->seq[t]] : -1;
    }
    return 0;
}

/* A live window opens with a draft at its slot's length that guesses the
 * id the slot's last sampled row gave (one position before). */
static int window_start(cv_span *s, const cv_batch *b, int32_t t, char *err, size_t errlen)
{
    const int32_t slot = b->seq[t], len = s->kv.len[slot], last_pos = s->last_id[2 * slot + 1];
    if (b->pos[t] < len || last_pos < 0 || last_pos != b->pos[t] - 1)
        return cv_errf(err, errlen,
                       "token %d is a draft at position %d of slot %d, which holds %d positions and last sampled "
                       "at %d",
                       t, b->pos[t], slot, len, last_pos);
    s->guess[t] = 1;
    return 0;
}

/* Fills draft_of (for each row, the draft token that follows it in its
 * slot, or -1) and guess. A draft follows a wanted row one position
 * before it, or opens its slot's rows: a window (stale, or window_start). */
static int link_drafts(cv_span *s, const cv_batch *b, char *err, size_t errlen)
{
    for (int32_t t = 0; t < b->n_tokens; t++)
        s->slot_row[b->seq[t]] = -1;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const int32_t prev = s->slot_row[b->seq[t]];
        s->draft_of[t] = -1;
        s->guess[t] = 0;
        s->slot_row[b->seq[t]] = t;
        if (b->want[t] != CV_WANT_DRAFT)
            continue;
        if (prev < 0) {
            if (s->stale_len[b->seq[t]] < 0 && window_start(s, b, t, err, errlen))
                return -1;
            continue;
        }
        if (!cv_want_logits(b->want[prev]) || b->pos[prev] != b->pos[t] - 1)
            return cv_errf(err, errlen, "token %d is a draft but does not follow a wanted token of slot %d", t,
                           b->seq[t]);
        s->draft_of[prev] = b->token[t];
    }
    return 0;
}

/* Stale windows run at their positions: their slots are lengthened to
 * them for the pass (to = 1); the last span then cuts them back to their
 * length (to = 0), as their rows are not part of the sequence. */
static void stale_lengths(cv_span *s, const cv_batch *b, int to)
{
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const int32_t slot = b->seq[t];
        if (s->stale_len[slot] < 0)
            continue;
        if (to && s->kv.len[slot] == s->stale_len[slot]) /* the slot's first row */
            s->kv.len[slot] = b->pos[t];
        else if (!to)
            cv_kv_seq_truncate(&s->kv, slot, s->stale_len[slot]);
    }
}

/* The forward pass writes logits rows for the rows that ask for them; an
 * _EMBED row among them is an output row too: the logits rows move to
 * their output rows (from the last, so none is overwritten before it
 * moves), and an _EMBED row's is zeros. */
static void spread_logits(cv_span *s, const cv_batch *b)
{
    int32_t n_out = 0, n_logits = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        n_out += cv_want_output(b->want[t]);
        n_logits += cv_want_logits(b->want[t]);
    }
    if (n_out == n_logits)
        return;
    const size_t row = sizeof(float) * (size_t)s->model.hp.n_vocab;
    for (int32_t t = b->n_tokens - 1; t >= 0; t--) {
        if (!cv_want_output(b->want[t]))
            continue;
        float *to = (float *)((char *)s->logits + (size_t)--n_out * row);
        if (b->want[t] == CV_WANT_EMBED)
            memset(to, 0, row);
        else if (--n_logits != n_out)
            memmove(to, (char *)s->logits + (size_t)n_logits * row, row);
    }
}

/* L2-normalizes x in place, as llama.cpp's common_embd_normalize: the
 * norm summed in double. */
static void normalize(float *x, int32_t n)
{
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += x[i] * x[i];
    sum = sqrt(sum);
    const double norm = sum > 0.0 ? 1.0 / sum : 0.0;
    for (int32_t i = 0; i < n; i++)
        x[i] = (float)(x[i] * norm);
}

/* Adds a row's final hidden state h to its slot's pool (span.h's rules). */
static void pool_row(cv_span *s, int32_t slot, int32_t pos, const float *h)
{
    const int32_t n_embd = s->model.hp.n_embd;
    float *p = s->sums + (size_t)slot * n_embd;
    if (pos == 0)
        s->n_pooled[slot] = 0;
    if (s->n_pooled[slot] == 0 || s->pooling == CV_POOL_LAST)
        memcpy(p, h, sizeof(float) * (size_t)n_embd);
    else if (s->pooling == CV_POOL_MEAN)
        for (int32_t i = 0; i < n_embd; i++)
            p[i] += h[i];
    s->n_pooled[slot]++;
}

/* The slot's embedding into out: its pool (mean: divided by its rows),
 * normalized. */
static void embed_slot(const cv_span *s, int32_t slot, float *out)
{
    const int32_t n_embd = s->model.hp.n_embd, n = s->n_pooled[slot];
    const float *p = s->sums + (size_t)slot * n_embd;
    for (int32_t i = 0; i < n_embd; i++)
        out[i] = s->pooling == CV_POOL_MEAN && n > 0 ? p[i] / (float)n : p[i];
    normalize(out, n_embd);
}

/* Samples the wanted rows into out_tokens (see span.h) and pools the rows
 * that pool. A rejected draft or guess cuts its slot back right away, so
 * a row at or past the slot's length comes after one (or is stale) and is
 * not part of the sequence. */
static void sample_rows(cv_span *s, const cv_batch *b, int32_t *out_tokens)
{
    const int32_t n_vocab = s->model.hp.n_vocab, n_embd = s->model.hp.n_embd;
    const float *pooled = cv_forward_pooled(s->fwd);
    for (int32_t t = 0, row = 0, n_pool = 0; t < b->n_tokens; t++) {
        const int32_t slot = b->seq[t];
        cv_sampler *sm = s->samplers[slot];
        const float *h = cv_want_pools(b->want[t]) ? pooled + (size_t)n_pool++ * n_embd : NULL;
        if (cv_want_output(b->want[t]))
            s->row_embd[row] = 0;
        if (s->guess[t] && b->token[t] != s->last_id[2 * slot])
            cv_kv_seq_truncate(&s->kv, slot, b->pos[t]);
        if (b->pos[t] >= s->kv.len[slot]) {
            if (cv_want_output(b->want[t])) { /* no output: -1 and zero logits, as a pipeline gives */
                memset(s->logits + (size_t)row * n_vocab, 0, sizeof(float) * (size_t)n_vocab);
                out_tokens[row++] = -1;
            }
            continue;
        }
        cv_constraint *ct = s->constraints[slot];
        if (sm)
            cv_sampler_accept(sm, b->token[t]);
        if (ct)
            cv_constraint_enter(ct, &s->pieces, b->pos[t], b->token[t]);
        if (h)
            pool_row(s, slot, b->pos[t], h);
        if (b->want[t] == CV_WANT_EMBED) {
            embed_slot(s, slot, s->embd + (size_t)row * n_embd);
            s->row_embd[row] = 1;
            out_tokens[row++] = -1;
        }
        if (!cv_want_logits(b->want[t]))
            continue;
        const float *logits = cv_span_logits(s, row);
        const float *held = ct ? cv_constraint_mask(ct, &s->pieces, b->pos[t], logits, s->masked) : NULL;
        if (held)
            logits = held;
        /* sampled as without a draft: an unequal draft is rejected and the
         * slot ends after this row's token */
        const int32_t id = sm ? cv_sampler_sample(sm, logits) : cv_argmax(logits, n_vocab);
        out_tokens[row++] = id;
        s->last_id[2 * slot] = id;
        s->last_id[2 * slot + 1] = b->pos[t];
        if (s->draft_of[t] >= 0 && id != s->draft_of[t])
            cv_kv_seq_truncate(&s->kv, slot, b->pos[t] + 1);
    }
}

int cv_span_step(cv_span *s, const cv_batch *b, const float *in, float *out_hidden, int32_t *out_tokens,
                  char *err, size_t errlen)
{
    const bool last = cv_llama_has_output(&s->model);
    if (mark_stale(s, b, err, errlen) || (last && link_drafts(s, b, err, errlen)))
        return -1;
    stale_lengths(s, b, 1);
    if (cv_forward_check(s->fwd, b, true, err, errlen)) {
        stale_lengths(s, b, 0);
        return -1; /* refused before any slot is cut back */
    }
    roll_back(s, b);
    const int rc = cv_forward_run(s->fwd, b, in, last ? s->logits : out_hidden, err, errlen);
    if (!last || rc)
        return rc;
    stale_lengths(s, b, 0);
    spread_logits(s, b);
    sample_rows(s, b, out_tokens);
    return 0;
}

const float *cv_span_embedding(const cv_span *s, int32_t i)
{
    if (!s->row_embd || i < 0 || i >= s->n_batch || !s->row_embd[i])
        return NULL;
    return s->embd + (size_t)i * (size_t)s->model.hp.n_embd;
}

int cv_span_set_sampler(cv_span *s, int32_t slot, const cv_sampler_params *p, char *err, size_t errlen)
{
    if (!s->samplers)
        return cv_errf(err, errlen, "this span does not hold the output matrix and does not sample");
    if (slot < 0 || slot >= s->kv.n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", slot, s->kv.n_slot);
    if (cv_logit_bias_check(p->bias, p->n_bias, s->model.hp.n_vocab, err, errlen))
        return -1;
    cv_sampler *sm = cv_sampler_create(p, s->model.hp.n_vocab, s->kv.n_ctx);
    if (!sm)
        return cv_errf(err, errlen, "out of memory for a sampler");
    cv_sampler_free(s->samplers[slot]);
    s->samplers[slot] = sm;
    cv_constraint_free(s->constraints[slot]);
    s->constraints[slot] = NULL;
    return 0;
}

int cv_span_set_grammar(cv_span *s, int32_t slot, const char *text, size_t len, int32_t from, char *err,
                        size_t errlen)
{
    if (!s->samplers)
        return cv_errf(err, errlen, "this span does not hold the output matrix and does not sample");
    if (slot < 0 || slot >= s->kv.n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", slot, s->kv.n_slot);
    if (!s->pieces.pieces) {
        if (cv_vocab_pieces_load(&s->pieces, &s->model.gguf, err, errlen))
            return -1;
        if (s->pieces.n_vocab != s->model.hp.n_vocab) {
            const int32_t n = s->pieces.n_vocab;
            cv_vocab_pieces_free(&s->pieces);
            return cv_errf(err, errlen, "the vocabulary has %d tokens but the output %d", n, s->model.hp.n_vocab);
        }
        if (!(s->masked = cv_malloc(sizeof(float) * (size_t)s->model.hp.n_vocab))) {
            cv_vocab_pieces_free(&s->pieces);
            return cv_errf(err, errlen, "out of memory for a grammar's logits");
        }
    }
    if (from < s->kv.len[slot]) /* the ids it would match have entered already */
        return cv_errf(err, errlen, "a grammar from position %d, but slot %d holds %d positions", from, slot,
                       s->kv.len[slot]);
    cv_constraint *c = cv_constraint_create(text, len, from, s->kv.n_ctx, err, errlen);
    if (!c)
        return -1;
    cv_constraint_free(s->constraints[slot]);
    s->constraints[slot] = c;
    return 0;
}

void cv_span_seq_truncate(cv_span *s, int32_t slot, int32_t len)
{
    if (slot < 0 || slot >= s->kv.n_slot)
        return;
    if (s->last_id && len <= s->last_id[2 * slot + 1]) /* the sampled row is cut off */
        s->last_id[2 * slot + 1] = -1;
    if (s->samplers && s->samplers[slot] && len < s->kv.len[slot])
        cv_sampler_rewind(s->samplers[slot], s->kv.len[slot] - (len < 0 ? 0 : len));
    if (s->constraints && s->constraints[slot])
        cv_constraint_truncate(s->constraints[slot], &s->pieces, len);
    if (s->n_pooled && len < s->n_pooled[slot])
        s->n_pooled[slot] = 0;
    cv_kv_seq_truncate(&s->kv, slot, len);
}

void cv_span_seq_free(cv_span *s, int32_t slot)
{
    if (slot < 0 || slot >= s->kv.n_slot)
        return;
    cv_kv_seq_free(&s->kv, slot);
    if (s->last_id)
        s->last_id[2 * slot + 1] = -1;
    if (s->n_pooled)
        s->n_pooled[slot] = 0;
    if (s->samplers) {
        cv_sampler_free(s->samplers[slot]);
        s->samplers[slot] = NULL;
        cv_constraint_free(s->constraints[slot]);
        s->constraints[slot] = NULL;
    }
}

void cv_span_seq_copy(cv_span *s, int32_t src, int32_t dst, int32_t len)
{
    if (src < 0 || src >= s->kv.n_slot || dst < 0 || dst >= s->kv.n_slot || src == dst)
        return;
    cv_span_seq_free(s, dst);
    cv_kv_seq_copy(&s->kv, src, dst, len);
}

/* The probe's window: longer than a CFS period (100 ms), so that a CPU
 * quota or a busy neighbour on the core shows in the mean as it will
 * while serving. */
#define SPEED_PROBE_NS 200000000ull

/* One timed matmul of the probe: rows of zeros, the same bytes in either
 * layout. */
static void probe_run(cv_type type, const uint8_t *w, int32_t n_in, const uint8_t *x, float *y, long rows,
                      bool interleaved)
{
    if (interleaved)
        cv_matmul_interleaved(type, w, n_in, x, 0, 1, y, (int)rows, 0, rows);
    else
        cv_matmul_rows(type, w, n_in, x, 0, 1, y, (int)rows, 0, rows);
}

uint32_t cv_span_speed_probe(const cv_llama *m, int32_t n_threads)
{
    char name[64]; /* the first layer the file holds: a shard may not have layer 0 */
    snprintf(name, sizeof name, "blk.%d.attn_q.weight", m->held_l0);
    const gguf_tensor *t = cv_gguf_find_tensor(&m->gguf, name);
    const cv_type_traits *tt = t ? cv_type_get(t->type) : NULL;
    if (!tt || !tt->vec_dot)
        return 0;
    const int32_t n_in = (int32_t)t->ne[0];
    const size_t row = cv_row_bytes(t->type, n_in);
    uint64_t bytes = cv_llama_layer_bytes(m, m->held_l0);
    if (bytes > (64u << 20))
        bytes = 64u << 20;
    /* whole groups of 8 rows, held as a loaded model holds them */
    const long rows = (long)(bytes / row) / INTERLEAVE_ROWS * INTERLEAVE_ROWS;
    const bool interleaved = cv_interleave_supported(t->type, n_in, rows);
    uint8_t *w = cv_aligned_alloc((size_t)rows * row);
    uint8_t *x = cv_aligned_alloc(4 * (size_t)n_in + 64);
    float *y = cv_aligned_alloc(sizeof(float) * (size_t)rows);
    uint32_t us = 0;
    if (w && x && y && rows > 0) {
        memset(w, 0, (size_t)rows * row);
        memset(x, 0, 4 * (size_t)n_in + 64);
        probe_run(t->type, w, n_in, x, y, rows, interleaved); /* warms the caches */
        const uint64_t t0 = cv_now_ns();
        uint64_t runs = 0, dt;
        do {
            probe_run(t->type, w, n_in, x, y, rows, interleaved);
            runs++;
        } while ((dt = cv_now_ns() - t0) < SPEED_PROBE_NS);
        const double mean = 1e-3 * (double)dt / (double)runs;
        double full = mean * (double)cv_llama_layer_bytes(m, m->held_l0) / (double)((size_t)rows * row);
        us = full < 1 ? 1 : (uint32_t)(full / (n_threads > 0 ? n_threads : 1));
    }
    cv_free_aligned(w);
    cv_free_aligned(x);
    cv_free_aligned(y);
    return us;
}
