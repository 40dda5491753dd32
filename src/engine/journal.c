/* journal.c: every slot's tokens and sampler, kept by the head for a
 * failover (see journal.h). */
#include "engine/journal.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

static int batch_alloc(journal_batch *b, int32_t n)
{
    b->n_tokens = 0;
    b->token = cv_malloc(sizeof(int32_t) * (size_t)n);
    b->pos = cv_malloc(sizeof(int32_t) * (size_t)n);
    b->seq = cv_malloc(sizeof(int32_t) * (size_t)n);
    b->want = cv_malloc((size_t)n);
    return b->token && b->pos && b->seq && b->want ? 0 : -1;
}

static void batch_free(journal_batch *b)
{
    cv_free(b->token);
    cv_free(b->pos);
    cv_free(b->seq);
    cv_free(b->want);
}

static cv_batch as_batch(const journal_batch *b)
{
    return (cv_batch){.n_tokens = b->n_tokens, .token = b->token, .pos = b->pos, .seq = b->seq, .want = b->want};
}

int cv_journal_init(journal *j, int32_t n_slot, int32_t n_ctx, int32_t n_batch, char *err, size_t errlen)
{
    memset(j, 0, sizeof *j);
    j->n_slot = n_slot;
    j->n_ctx = n_ctx;
    j->n_batch = n_batch;
    j->tok = cv_malloc(sizeof(int32_t) * (size_t)n_slot * (size_t)n_ctx);
    j->slot = cv_calloc((size_t)n_slot, sizeof *j->slot);
    j->stale = cv_calloc((size_t)n_slot, 1);
    j->ignored = cv_malloc(sizeof(int32_t) * (size_t)n_batch);
    bool ok = j->tok && j->slot && j->stale && j->ignored && batch_alloc(&j->feed, n_batch) == 0;
    for (int k = 0; k < CV_CHAIN_MAX_NODES; k++)
        ok = ok && batch_alloc(&j->flight[k], n_batch) == 0;
    if (!ok) {
        cv_journal_free(j);
        return cv_errf(err, errlen, "out of memory for the journal of %d slots of %d positions", n_slot, n_ctx);
    }
    for (int32_t s = 0; s < n_slot; s++)
        cv_journal_free_seq(j, s);
    return 0;
}

void cv_journal_free(journal *j)
{
    cv_free(j->tok);
    for (int32_t s = 0; j->slot && s < j->n_slot; s++)
        cv_journal_free_seq(j, s);
    cv_free(j->slot);
    cv_free(j->stale);
    cv_free(j->ignored);
    batch_free(&j->feed);
    for (int k = 0; k < CV_CHAIN_MAX_NODES; k++)
        batch_free(&j->flight[k]);
    memset(j, 0, sizeof *j);
}

void cv_journal_submit(journal *j, const cv_batch *b)
{
    journal_batch *f = &j->flight[(j->oldest + j->in_flight) % CV_CHAIN_MAX_NODES];
    const size_t n = (size_t)b->n_tokens;
    f->n_tokens = b->n_tokens;
    memcpy(f->token, b->token, sizeof(int32_t) * n);
    memcpy(f->pos, b->pos, sizeof(int32_t) * n);
    memcpy(f->seq, b->seq, sizeof(int32_t) * n);
    memcpy(f->want, b->want, n);
    j->in_flight++;
}

/* Marks the slots whose rows in f are a stale window: the slot's first
 * row is a draft past its length (span.h). */
static void mark_stale(journal *j, const journal_batch *f)
{
    for (int32_t t = 0; t < f->n_tokens; t++)
        j->stale[f->seq[t]] = 2; /* not seen yet */
    for (int32_t t = 0; t < f->n_tokens; t++) {
        uint8_t *st = &j->stale[f->seq[t]];
        if (*st == 2)
            *st = f->want[t] == CV_WANT_DRAFT && f->pos[t] > j->slot[f->seq[t]].len;
    }
}

/* The oldest batch in flight landed: its tokens enter their slots as the
 * last span takes them (cut back to the batch's first position, then
 * appended), a rejected draft cuts its slot back, a stale window changes
 * nothing, and every emitted id of a slot that samples at a temperature
 * was one draw. */
void cv_journal_collect(journal *j, const int32_t *tokens)
{
    const journal_batch *f = &j->flight[j->oldest];
    mark_stale(j, f);
    for (int32_t t = 0; t < f->n_tokens; t++) {
        journal_slot *s = &j->slot[f->seq[t]];
        if (f->pos[t] < s->len)
            cv_journal_truncate(j, f->seq[t], f->pos[t]);
    }
    for (int32_t t = 0, row = 0; t < f->n_tokens; t++) {
        journal_slot *s = &j->slot[f->seq[t]];
        const int32_t id = cv_want_output(f->want[t]) ? tokens[row++] : -1;
        if (j->stale[f->seq[t]])
            continue;
        j->tok[(size_t)f->seq[t] * (size_t)j->n_ctx + (size_t)f->pos[t]] = f->token[t];
        if (f->pos[t] + 1 > s->len)
            s->len = f->pos[t] + 1;
        if (cv_want_pools(f->want[t]))
            s->pooled = f->pos[t] == 0 ? 1 : s->pooled + 1;
        if (!cv_want_logits(f->want[t]))
            continue;
        if (id < 0) {
            cv_journal_truncate(j, f->seq[t], f->pos[t]);
            continue;
        }
        s->sampled_at = f->pos[t];
        if (s->sampler_at >= 0 && s->sampler.temp > 0.0f)
            s->sampler.n_draws++;
    }
    j->oldest = (j->oldest + 1) % CV_CHAIN_MAX_NODES;
    j->in_flight--;
}

void cv_journal_drop_flights(journal *j) { j->in_flight = 0; }

int cv_journal_set_sampler(journal *j, int32_t seq, const cv_sampler_params *p, int32_t n_logprobs)
{
    journal_slot *s = &j->slot[seq];
    cv_logit_bias *bias = p->n_bias > 0 ? cv_memdup(p->bias, sizeof *bias * (size_t)p->n_bias) : NULL;
    if (p->n_bias > 0 && !bias)
        return -1;
    cv_free(s->bias);
    s->bias = bias;
    s->sampler = *p;
    s->sampler.bias = bias;
    s->sampler.n_draws = 0;
    s->sampler_at = s->len;
    s->n_logprobs = n_logprobs;
    cv_free(s->grammar);
    s->grammar = NULL;
    return 0;
}

int cv_journal_set_grammar(journal *j, int32_t seq, const char *text, size_t len, int32_t from)
{
    journal_slot *s = &j->slot[seq];
    char *copy = cv_memdup(text, len);
    if (!copy)
        return -1;
    cv_free(s->grammar);
    s->grammar = copy;
    s->grammar_len = (uint32_t)len;
    s->grammar_from = from;
    return 0;
}

void cv_journal_truncate(journal *j, int32_t seq, int32_t len)
{
    journal_slot *s = &j->slot[seq];
    if (len < 0)
        len = 0;
    if (len < s->len)
        s->len = len;
    if (len < s->pooled)
        s->pooled = 0;
    if (s->sampler_at > s->len)
        s->sampler_at = s->len;
    if (s->sampled_at >= s->len)
        s->sampled_at = -1;
}

void cv_journal_free_seq(journal *j, int32_t seq)
{
    cv_free(j->slot[seq].grammar);
    cv_free(j->slot[seq].bias);
    j->slot[seq] = (journal_slot){.len = 0, .sampled_at = -1, .sampler_at = -1, .n_logprobs = -1};
}

void cv_journal_copy(journal *j, int32_t src, int32_t dst, int32_t len)
{
    cv_journal_free_seq(j, dst);
    const int32_t n = len < 0 ? 0 : len < j->slot[src].len ? len : j->slot[src].len;
    memcpy(j->tok + (size_t)dst * (size_t)j->n_ctx, j->tok + (size_t)src * (size_t)j->n_ctx,
           sizeof(int32_t) * (size_t)n);
    j->slot[dst].len = n;
}

/* ---- replay ---- */

/* Collects batches until at most `keep` are in flight (their results are
 * the journal's already: the resampled last rows give ids nobody reads,
 * up to a batch of them). */
static int drain(journal *j, cv_chain *c, int keep, char *err, size_t errlen)
{
    int32_t n;
    while (cv_chain_in_flight(c) > keep)
        if (cv_chain_collect(c, j->ignored, &n, err, errlen))
            return -1;
    return 0;
}

/* Sends the prefill batch, keeping the chain's depth busy. */
static int feed_send(journal *j, cv_chain *c, char *err, size_t errlen)
{
    if (j->feed.n_tokens == 0)
        return 0;
    const cv_batch b = as_batch(&j->feed);
    if (drain(j, c, cv_chain_depth(c) - 1, err, errlen) || cv_chain_submit(c, &b, err, errlen))
        return -1;
    j->feed.n_tokens = 0;
    return 0;
}

/* Whether replay samples slot seq's last row again: it emitted an id
 * (with the sampler set then, whose draws count it, or greedily). */
static bool resample_last(const journal_slot *js)
{
    return js->len > 0 && js->sampled_at == js->len - 1 && js->sampled_at >= js->sampler_at;
}

/* Prefills positions [from, to) of slot seq, nothing sampled but its last
 * row where resample_last; rows of several slots share batches (kernels
 * are batch-invariant). */
static int feed_range(journal *j, cv_chain *c, int32_t seq, int32_t from, int32_t to, int64_t *n_fed, char *err,
                      size_t errlen)
{
    const journal_slot *js = &j->slot[seq];
    const int32_t *tok = j->tok + (size_t)seq * (size_t)j->n_ctx;
    for (int32_t p = from; p < to; p++) {
        if (j->feed.n_tokens == j->n_batch && feed_send(j, c, err, errlen))
            return -1;
        const int32_t t = j->feed.n_tokens++;
        j->feed.token[t] = tok[p];
        j->feed.pos[t] = p;
        j->feed.seq[t] = seq;
        j->feed.want[t] = p == js->len - 1 && resample_last(js) ? CV_WANT_SAMPLE
                          : p < js->pooled                        ? CV_WANT_POOL
                                                                  : CV_WANT_NONE;
    }
    *n_fed += to - from;
    return 0;
}

/* The tokens each slot had before its sampler was set, then the samplers
 * (a sampler's penalty history starts where it was set), then the rest. */
static int replay_slots(journal *j, cv_chain *c, int64_t *n_fed, char *err, size_t errlen)
{
    for (int32_t s = 0; s < j->n_slot; s++) {
        const journal_slot *js = &j->slot[s];
        if (feed_range(j, c, s, 0, js->sampler_at >= 0 ? js->sampler_at : js->len, n_fed, err, errlen))
            return -1;
    }
    if (feed_send(j, c, err, errlen))
        return -1;
    for (int32_t s = 0; s < j->n_slot; s++) {
        const journal_slot *js = &j->slot[s];
        cv_sampler_params sp = js->sampler;
        if (resample_last(js) && sp.temp > 0.0f)
            sp.n_draws--; /* the last row takes its draw again */
        if (js->sampler_at >= 0 &&
            (cv_chain_set_sampler(c, s, &sp, js->n_logprobs, err, errlen) ||
             (js->grammar &&
              cv_chain_set_grammar(c, s, js->grammar, js->grammar_len, js->grammar_from, err, errlen)) ||
             feed_range(j, c, s, js->sampler_at, js->len, n_fed, err, errlen)))
            return -1;
    }
    return feed_send(j, c, err, errlen) || drain(j, c, 0, err, errlen) ? -1 : 0;
}

int cv_journal_replay(journal *j, cv_chain *c, int64_t *n_fed, char *err, size_t errlen)
{
    *n_fed = 0;
    j->feed.n_tokens = 0;
    if (replay_slots(j, c, n_fed, err, errlen))
        return -1;
    for (int k = 0; k < j->in_flight; k++) {
        const cv_batch b = as_batch(&j->flight[(j->oldest + k) % CV_CHAIN_MAX_NODES]);
        if (cv_chain_submit(c, &b, err, errlen))
            return -1;
    }
    return 0;
}
