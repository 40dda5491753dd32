/* draft.c: the drafters of speculative decoding (see draft.h).
 *
 * Design: both kinds share the request checks; "ngram" is a backward scan
 * of the history and holds nothing per slot. The model drafter is a whole
 * draft model in a cv_span (greedy: no sampler is ever set) plus, per
 * slot, a copy of the ids its KV cache holds (kv_ids, valid up to the
 * span's kv.len of the slot). A proposal keeps the longest prefix that the
 * copy shares with the new history (at most all but the newest id, whose
 * logits are needed), truncates the slot to it, then runs two phases over
 * all requests at once: catch-up (the rest of each history, packed into
 * batches of n_batch tokens, only each history's last id wanted: its
 * argmax is the first draft id), then one-token steps, each batch holding
 * every request that still needs ids. The drafter owns the span and every
 * buffer below, all sized at open; a proposal only fills them. */
#include "infer/draft.h"

#include <stdbool.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/span.h"

/* Longest n-gram the prompt lookup tries to match. */
#define NGRAM_MAX 3
/* Most tokens in one draft forward step unless the slots alone need more:
 * the span keeps a row of logits for every batch token, so the batch size
 * costs n_vocab floats a token. */
#define DRAFT_BATCH_MAX 128

struct cv_drafter {
    bool is_model; /* the span is open */
    int32_t n_slot;
    int32_t k_max;
    uint64_t call;       /* number of the current proposal call */
    uint64_t *slot_call; /* [n_slot] the call that last asked for each slot (duplicate check) */
    /* model drafter */
    cv_span span;    /* its kv.n_ctx and n_batch size the buffers below */
    int32_t *kv_ids;  /* [n_slot][n_ctx] ids in the draft's KV cache (up to its kv.len of the slot) */
    int32_t *tok;     /* [n_batch] the batch being built */
    int32_t *pos;     /* [n_batch] */
    int32_t *seq;     /* [n_batch] */
    uint8_t *want;    /* [n_batch] */
    int32_t *row_req; /* [n_batch] request of each wanted row of a step */
    int32_t *row_id;  /* [n_batch] id the step chose for each wanted row */
    int32_t *fed;     /* [n_slot] per request: history ids in the KV cache or in the batch */
    int32_t *limit;   /* [n_slot] per request: most ids it may propose */
};

/* Tokens per draft step: a proposal's worth (k_max + 1, at least 64) for
 * every slot, at most DRAFT_BATCH_MAX, but never less than one token per
 * slot (a one-token step holds every request). */
static int32_t draft_batch_size(const cv_drafter_params *p)
{
    const int64_t per_slot = (int64_t)p->k_max + 1 > 64 ? (int64_t)p->k_max + 1 : 64;
    const int64_t wanted = per_slot * p->n_slot;
    const int64_t cap = p->n_slot > DRAFT_BATCH_MAX ? p->n_slot : DRAFT_BATCH_MAX;
    return (int32_t)(wanted < cap ? wanted : cap);
}

static int model_open(cv_drafter *d, const char *path, const cv_drafter_params *p, char *err, size_t errlen)
{
    const cv_span_params sp = {.l0 = 0,
                                .l1 = -1,
                                .n_threads = p->n_threads,
                                .n_ctx = p->n_ctx,
                                .n_slot = p->n_slot,
                                .n_batch = draft_batch_size(p)};
    char why[CV_ERRLEN];
    if (cv_span_open(&d->span, path, &sp, why, sizeof why))
        return cv_errf(err, errlen, "draft model: %s", why);
    d->is_model = true;
    if (d->span.model.hp.n_vocab != p->n_vocab)
        return cv_errf(err, errlen, "draft model %s: its vocabulary has %d ids, the target's %d", path,
                       d->span.model.hp.n_vocab, p->n_vocab);
    const size_t nb = (size_t)d->span.n_batch, ns = (size_t)p->n_slot;
    d->kv_ids = cv_calloc(ns * (size_t)d->span.kv.n_ctx, sizeof *d->kv_ids);
    d->tok = cv_calloc(nb, sizeof *d->tok);
    d->pos = cv_calloc(nb, sizeof *d->pos);
    d->seq = cv_calloc(nb, sizeof *d->seq);
    d->want = cv_calloc(nb, sizeof *d->want);
    d->row_req = cv_calloc(nb, sizeof *d->row_req);
    d->row_id = cv_calloc(nb, sizeof *d->row_id);
    d->fed = cv_calloc(ns, sizeof *d->fed);
    d->limit = cv_calloc(ns, sizeof *d->limit);
    if (!d->kv_ids || !d->tok || !d->pos || !d->seq || !d->want || !d->row_req || !d->row_id || !d->fed || !d->limit)
        return cv_errf(err, errlen, "out of memory for the draft model's %d slots of %d positions", p->n_slot,
                       d->span.kv.n_ctx);
    return 0;
}

cv_drafter *cv_drafter_open(const char *spec, const cv_drafter_params *p, char *err, size_t errlen)
{
    if (!spec || !*spec) {
        cv_errf(err, errlen, "no drafter given (\"ngram\" or the path of a GGUF draft model)");
        return NULL;
    }
    if (p->n_slot < 1 || p->n_ctx < 0 || p->n_vocab < 1 || p->k_max < 1) {
        cv_errf(err, errlen, "bad drafter parameters (slots %d, context %d, vocabulary %d, k_max %d)", p->n_slot,
                p->n_ctx, p->n_vocab, p->k_max);
        return NULL;
    }
    cv_drafter *d = cv_calloc(1, sizeof *d);
    if (!d) {
        cv_errf(err, errlen, "out of memory for a drafter");
        return NULL;
    }
    d->n_slot = p->n_slot;
    d->k_max = p->k_max;
    d->slot_call = cv_calloc((size_t)p->n_slot, sizeof *d->slot_call);
    if (!d->slot_call) {
        cv_errf(err, errlen, "out of memory for a drafter of %d slots", p->n_slot);
        cv_drafter_free(d);
        return NULL;
    }
    if (strcmp(spec, "ngram") != 0 && model_open(d, spec, p, err, errlen)) {
        cv_drafter_free(d);
        return NULL;
    }
    return d;
}

void cv_drafter_free(cv_drafter *d)
{
    if (!d)
        return;
    if (d->is_model)
        cv_span_close(&d->span);
    cv_free(d->kv_ids);
    cv_free(d->tok);
    cv_free(d->pos);
    cv_free(d->seq);
    cv_free(d->want);
    cv_free(d->row_req);
    cv_free(d->row_id);
    cv_free(d->fed);
    cv_free(d->limit);
    cv_free(d->slot_call);
    cv_free(d);
}

const char *cv_drafter_name(const cv_drafter *d) { return d->is_model ? "model" : "ngram"; }

/* ---- ngram: prompt lookup ---- */

/* Index just past the most recent occurrence of the last g ids of
 * hist[0..n) that ends before the last position, or -1 (n > g). */
static int32_t ngram_match_end(const int32_t *hist, int32_t n, int32_t g)
{
    const int32_t *tail = hist + n - g;
    for (int32_t end = n - 1; end >= g; end--)
        if (memcmp(hist + end - g, tail, sizeof *hist * (size_t)g) == 0)
            return end;
    return -1;
}

static void ngram_propose(cv_draft_req *r)
{
    for (int32_t g = NGRAM_MAX; g >= 1; g--) {
        if (r->n_hist <= g)
            continue;
        const int32_t end = ngram_match_end(r->hist, r->n_hist, g);
        if (end < 0)
            continue;
        while (r->n_out < r->k && end + r->n_out < r->n_hist) {
            r->out[r->n_out] = r->hist[end + r->n_out];
            r->n_out++;
        }
        return;
    }
}

/* ---- model drafter ---- */

/* Puts one token into the batch at index i and records it as the id the
 * slot's KV cache holds at pos once the step has run. */
static void batch_put(cv_drafter *d, int32_t i, int32_t slot, int32_t pos, int32_t id, bool want)
{
    d->tok[i] = id;
    d->pos[i] = pos;
    d->seq[i] = slot;
    d->want[i] = want;
    d->kv_ids[(size_t)slot * (size_t)d->span.kv.n_ctx + (size_t)pos] = id;
}

/* Runs the n tokens of the batch built in d and appends the id of each of
 * its n_row wanted rows to the request d->row_req names. */
static int draft_step(cv_drafter *d, cv_draft_req *reqs, int32_t n, int32_t n_row, char *err, size_t errlen)
{
    const cv_batch b = {.n_tokens = n, .token = d->tok, .pos = d->pos, .seq = d->seq, .want = d->want};
    char why[CV_ERRLEN];
    if (cv_span_step(&d->span, &b, NULL, NULL, d->row_id, why, sizeof why))
        return cv_errf(err, errlen, "draft model: %s", why);
    for (int32_t row = 0; row < n_row; row++) {
        cv_draft_req *r = &reqs[d->row_req[row]];
        r->out[r->n_out++] = d->row_id[row];
    }
    return 0;
}

/* Keeps the part of each slot's KV cache that its new history starts with
 * and sets how many ids each request may propose: the last one needs its
 * predecessor at position n_hist - 1 + (limit - 1) < n_ctx. */
static void model_reuse_prefixes(cv_drafter *d, const cv_draft_req *reqs, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        const cv_draft_req *r = &reqs[i];
        const int32_t *cached = d->kv_ids + (size_t)r->slot * (size_t)d->span.kv.n_ctx;
        const int32_t len = d->span.kv.len[r->slot];
        const int32_t cap = len < r->n_hist - 1 ? len : r->n_hist - 1;
        int32_t keep = 0;
        while (keep < cap && cached[keep] == r->hist[keep])
            keep++;
        cv_span_seq_truncate(&d->span, r->slot, keep);
        d->fed[i] = keep;
        const int32_t room = d->span.kv.n_ctx - r->n_hist + 1;
        d->limit[i] = room < 1 ? 0 : room < r->k ? room : r->k;
    }
}

/* Feeds the rest of every history, in batches of up to n_batch tokens;
 * the last id of each history is wanted and gives its first draft id. */
static int model_catch_up(cv_drafter *d, cv_draft_req *reqs, int32_t n, char *err, size_t errlen)
{
    for (;;) {
        int32_t n_tok = 0, n_row = 0;
        for (int32_t i = 0; i < n && n_tok < d->span.n_batch; i++) {
            const cv_draft_req *r = &reqs[i];
            while (d->limit[i] > 0 && d->fed[i] < r->n_hist && n_tok < d->span.n_batch) {
                const int32_t at = d->fed[i]++;
                const bool last = at == r->n_hist - 1;
                batch_put(d, n_tok++, r->slot, at, r->hist[at], last);
                if (last)
                    d->row_req[n_row++] = i;
            }
        }
        if (n_tok == 0)
            return 0;
        if (draft_step(d, reqs, n_tok, n_row, err, errlen))
            return -1;
    }
}

/* Feeds each request's newest draft id, one per request per step, until
 * every request has its limit. */
static int model_extend(cv_drafter *d, cv_draft_req *reqs, int32_t n, char *err, size_t errlen)
{
    for (;;) {
        int32_t n_tok = 0;
        for (int32_t i = 0; i < n; i++) {
            const cv_draft_req *r = &reqs[i];
            if (r->n_out == 0 || r->n_out >= d->limit[i])
                continue;
            batch_put(d, n_tok, r->slot, r->n_hist - 1 + r->n_out, r->out[r->n_out - 1], true);
            d->row_req[n_tok++] = i;
        }
        if (n_tok == 0)
            return 0;
        if (draft_step(d, reqs, n_tok, n_tok, err, errlen))
            return -1;
    }
}

/* ---- proposals ---- */

static int check_reqs(cv_drafter *d, const cv_draft_req *reqs, int32_t n, char *err, size_t errlen)
{
    if (n < 0 || n > d->n_slot)
        return cv_errf(err, errlen, "%d draft requests for %d slots", n, d->n_slot);
    d->call++;
    for (int32_t i = 0; i < n; i++) {
        const cv_draft_req *r = &reqs[i];
        if (r->slot < 0 || r->slot >= d->n_slot)
            return cv_errf(err, errlen, "draft request %d: slot %d is outside [0, %d)", i, r->slot, d->n_slot);
        if (d->slot_call[r->slot] == d->call)
            return cv_errf(err, errlen, "draft request %d: slot %d is asked for twice", i, r->slot);
        d->slot_call[r->slot] = d->call;
        if (r->k < 1 || r->k > d->k_max)
            return cv_errf(err, errlen, "draft request %d: k = %d is outside [1, %d]", i, r->k, d->k_max);
        if (!r->hist || r->n_hist < 1 || !r->out)
            return cv_errf(err, errlen, "draft request %d: empty history or no output array", i);
    }
    return 0;
}

int cv_drafter_propose(cv_drafter *d, cv_draft_req *reqs, int32_t n, char *err, size_t errlen)
{
    for (int32_t i = 0; i < n; i++)
        reqs[i].n_out = 0;
    if (check_reqs(d, reqs, n, err, errlen))
        return -1;
    if (!d->is_model) {
        for (int32_t i = 0; i < n; i++)
            ngram_propose(&reqs[i]);
        return 0;
    }
    model_reuse_prefixes(d, reqs, n);
    if (model_catch_up(d, reqs, n, err, errlen) || model_extend(d, reqs, n, err, errlen)) {
        for (int32_t i = 0; i < n; i++)
            reqs[i].n_out = 0;
        return -1;
    }
    return 0;
}

void cv_drafter_seq_free(cv_drafter *d, int32_t slot)
{
    if (d->is_model)
        cv_span_seq_free(&d->span, slot);
}
