/* sched_request.c: the scheduler as the HTTP threads see it: a request's
 * submit (checked, copied, queued unless the server is full, down or
 * stopping), its wait for tokens, its cancel and release, and the
 * scheduler's stats and the clients' share. These run under s->mu on the
 * submitters' threads, never on the inference thread (sched.c). */
#include "serve/sched_impl.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"

/* A request's memory; request_free also ends its condition variable,
 * which a request that failed to be made never had. */
static void request_free_memory(cv_request *r)
{
    cv_free(r->lp);
    cv_free(r->prompt);
    cv_free(r->grammar);
    cv_free(r->bias);
    cv_free(r->embd);
    cv_free(r);
}

static void request_free(cv_request *r)
{
    pthread_cond_destroy(&r->cond);
    request_free_memory(r);
}

/* Drops one reference; the caller holds mu. */
void cv_request_unref_locked(cv_request *r)
{
    if (--r->refs == 0)
        request_free(r);
}

void cv_sched_queue_remove_locked(cv_sched *s, cv_request *r)
{
    int32_t k = 0;
    for (int32_t i = 0; i < s->q_len; i++) {
        cv_request *q = s->queue[(s->q_head + i) % s->q_ring];
        if (q != r)
            s->queue[(s->q_head + k++) % s->q_ring] = q;
    }
    s->q_len = k;
}

void cv_sched_set_client_slots(cv_sched *s, int32_t n)
{
    pthread_mutex_lock(&s->mu);
    s->client_slots = n < 1 ? 1 : n > s->n_slot ? s->n_slot : n;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void cv_sched_get_stats(cv_sched *s, cv_sched_stats *st)
{
    const double now = cv_now_s();
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->queued = s->q_len;
    st->active = s->n_running;
    st->retry_in = s->stats.down && s->retry_at > now ? s->retry_at - now : 0.0;
    if (!st->failing && convoy_ctx_failing_over(s->ctx)) { /* the scheduler's thread waits in it */
        st->failing = true;
        snprintf(st->last_error, sizeof st->last_error, "a node failed: the pipeline is failing over");
    }
    /* the spec counts its rounds in convoy_spec_observe, under mu */
    st->speculating = s->spec != NULL;
    if (s->spec) {
        convoy_spec_stats ss;
        convoy_spec_get_stats(s->spec, &ss);
        st->spec_rounds = ss.rounds;
        st->spec_drafted = ss.drafted;
        st->spec_accepted = ss.accepted;
    }
    st->tokens_per_second = 0.0;
    for (int k = 0; k < s->rate_len; k++) {
        const int i = (s->rate_head + k) % RATE_RING;
        if (now - s->rate_t[i] <= RATE_WINDOW_S) {
            if (now - s->rate_t[i] > 0.5)
                st->tokens_per_second = (double)(s->stats.generated_tokens - s->rate_n[i]) / (now - s->rate_t[i]);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* The free slots a request of client c may take: those its share leaves. */
static int32_t free_slots_for_locked(const cv_sched *s, uint64_t c)
{
    const int32_t free = s->n_slot - s->n_running, mine = s->client_slots - cv_sched_running_of_locked(s, c);
    return min_i32(free, mine > 0 ? mine : 0);
}

/* Submit: the parameters' refusal (-1, err says why), else 0. */
static int check_params(const cv_sched *s, const cv_request_params *p, char *err, size_t errlen)
{
    if (p->pin && (p->slot < 0 || p->slot >= s->n_slot))
        return cv_errf(err, errlen, "slot %d does not exist: the slots are 0 to %d", p->slot, s->n_slot - 1);
    const bool generates = !p->embed; /* an embedding runs its prompt only, which may fill the context */
    if (p->n_prompt < 1 || p->n_prompt > s->n_ctx - generates ||
        (generates && (p->max_tokens < 1 || p->max_tokens > s->n_ctx - p->n_prompt)) || p->top_logprobs < -1 ||
        p->top_logprobs > CONVOY_MAX_TOP_LOGPROBS || (p->embed && (p->top_logprobs >= 0 || p->grammar)))
        return cv_errf(err, errlen, "bad request parameters (prompt %d tokens, max_tokens %d, context %d, logprobs %d)",
                       p->n_prompt, p->max_tokens, s->n_ctx, p->top_logprobs);
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->n_vocab)
            return cv_errf(err, errlen, "token id %d is outside the vocabulary of %d", p->prompt[i], s->n_vocab);
    return 0;
}

/* Submit: a queued request with copies of p's prompt, grammar and logit
 * bias, two references; NULL when out of memory. */
static cv_request *request_new(cv_sched *s, const cv_request_params *p)
{
    cv_request *r = cv_calloc(1, sizeof *r);
    if (!r)
        return NULL;
    const int32_t max_tokens = p->embed ? 0 : p->max_tokens;
    r->prompt = cv_malloc(sizeof(int32_t) * ((size_t)p->n_prompt + (size_t)max_tokens));
    if (p->embed && !(r->embd = cv_malloc(sizeof(float) * (size_t)s->n_embd))) {
        cv_free(r->prompt);
        r->prompt = NULL;
    }
    if (p->top_logprobs >= 0)
        r->lp = cv_malloc(sizeof(convoy_logprob) * (size_t)p->max_tokens * (size_t)(1 + p->top_logprobs));
    if (p->grammar && (r->grammar = cv_memdup(p->grammar, p->grammar_len)))
        r->grammar_len = p->grammar_len;
    const size_t bias_bytes = sizeof(convoy_logit_bias) * (size_t)p->sampler.n_logit_bias;
    if (bias_bytes)
        r->bias = cv_memdup(p->sampler.logit_bias, bias_bytes);
    if (!r->prompt || (p->top_logprobs >= 0 && !r->lp) || (p->grammar && !r->grammar) || (bias_bytes && !r->bias)) {
        request_free_memory(r);
        return NULL;
    }
    memcpy(r->prompt, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    r->sched = s;
    r->out = r->prompt + p->n_prompt;
    r->n_prompt = p->n_prompt;
    r->max_tokens = max_tokens;
    r->sampler = p->sampler;
    r->sampler.logit_bias = r->bias;
    r->sampler.n_logprobs = p->top_logprobs;
    r->ignore_eos = p->ignore_eos;
    r->cold = p->cold || p->embed; /* every row must be pooled */
    r->pin = p->pin;
    r->slot_wanted = p->slot;
    r->client = p->client;
    r->t_submit = cv_now_s();
    r->refs = 2;
    r->state = RQ_QUEUED;
    pthread_cond_init(&r->cond, NULL);
    return r;
}

/* Submit: queues r unless the server stops, is down or is full (err says
 * which); the caller holds mu. */
static cv_submit_result enqueue_locked(cv_sched *s, cv_request *r, char *err, size_t errlen)
{
    if (s->stopping) {
        cv_errf(err, errlen, "the server is shutting down");
        return CV_SUBMIT_ERROR;
    }
    if (s->stats.down) {
        cv_errf(err, errlen, "%s; reconnecting", s->stats.last_error);
        return CV_SUBMIT_DOWN;
    }
    if (s->q_len >= s->queue_cap + free_slots_for_locked(s, r->client)) {
        if (s->n_running < s->n_slot && cv_sched_running_of_locked(s, r->client) >= s->client_slots)
            cv_errf(err, errlen, "the server is busy: %d requests are waiting (the queue holds %d) and you run %d "
                                 "requests, the most one client may run at once; try again later", s->q_len,
                    s->queue_cap, s->client_slots);
        else
            cv_errf(err, errlen, "the server is busy: %d requests are waiting (the queue holds %d) and all %d "
                                 "slots are in use; try again later", s->q_len, s->queue_cap, s->n_slot);
        return CV_SUBMIT_FULL;
    }
    s->queue[(s->q_head + s->q_len) % s->q_ring] = r;
    s->q_len++;
    pthread_cond_signal(&s->wake);
    return CV_SUBMIT_OK;
}

cv_submit_result cv_sched_submit_all(cv_sched *s, const cv_request_params *p, int n, cv_request **out, char *err,
                                     size_t errlen)
{
    memset(out, 0, sizeof *out * (size_t)n);
    for (int i = 0; i < n; i++)
        if (check_params(s, &p[i], err, errlen))
            return CV_SUBMIT_ERROR;
    cv_submit_result res = CV_SUBMIT_OK;
    for (int i = 0; i < n && res == CV_SUBMIT_OK; i++)
        if (!(out[i] = request_new(s, &p[i]))) {
            cv_errf(err, errlen, "out of memory for a request of %d tokens", p[i].max_tokens);
            res = CV_SUBMIT_ERROR;
        }
    pthread_mutex_lock(&s->mu);
    int queued = 0;
    while (res == CV_SUBMIT_OK && queued < n && (res = enqueue_locked(s, out[queued], err, errlen)) == CV_SUBMIT_OK)
        queued++;
    for (int i = 0; res != CV_SUBMIT_OK && i < queued; i++)
        cv_sched_queue_remove_locked(s, out[i]);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; res != CV_SUBMIT_OK && i < n; i++) {
        if (out[i])
            request_free(out[i]);
        out[i] = NULL;
    }
    return res;
}

cv_submit_result cv_sched_submit(cv_sched *s, const cv_request_params *p, cv_request **out, char *err,
                                 size_t errlen)
{
    return cv_sched_submit_all(s, p, 1, out, err, errlen);
}

int32_t cv_request_wait(cv_request *r, int32_t n_seen, int timeout_ms, cv_finish *finish)
{
    cv_sched *s = r->sched;
    const struct timespec until = cv_deadline_ms(timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (r->state != RQ_DONE && r->n_out <= n_seen)
        if (pthread_cond_timedwait(&r->cond, &s->mu, &until))
            break;
    const int32_t n = r->n_out;
    *finish = r->state == RQ_DONE ? r->finish : CV_RUNNING;
    pthread_mutex_unlock(&s->mu);
    return n;
}

const int32_t *cv_request_tokens(const cv_request *r) { return r->out; }

int32_t cv_request_cached(cv_request *r)
{
    pthread_mutex_lock(&r->sched->mu);
    const int32_t n = r->state == RQ_QUEUED ? 0 : r->n_cached;
    pthread_mutex_unlock(&r->sched->mu);
    return n;
}

const convoy_logprob *cv_request_logprobs(const cv_request *r, int32_t i)
{
    return r->lp ? request_lp(r, i) : NULL;
}

const char *cv_request_error(const cv_request *r) { return r->error; }

const float *cv_request_embedding(const cv_request *r)
{
    pthread_mutex_lock(&r->sched->mu);
    const bool done = r->state == RQ_DONE && r->finish == CV_FINISH_STOP;
    pthread_mutex_unlock(&r->sched->mu);
    return done && r->has_embd ? r->embd : NULL;
}

static void cancel_locked(cv_sched *s, cv_request *r)
{
    if (r->state == RQ_QUEUED) {
        cv_sched_queue_remove_locked(s, r);
        cv_sched_finish_locked(s, r, CV_FINISH_CANCELLED, NULL);
    } else if (r->state == RQ_ACTIVE && !r->cancelled) {
        r->cancelled = true;
        pthread_cond_signal(&s->wake);
    }
}

void cv_request_cancel(cv_request *r)
{
    cv_sched *s = r->sched;
    pthread_mutex_lock(&s->mu);
    cancel_locked(s, r);
    pthread_mutex_unlock(&s->mu);
}

void cv_request_release(cv_request *r)
{
    if (!r)
        return;
    cv_sched *s = r->sched;
    pthread_mutex_lock(&s->mu);
    cancel_locked(s, r);
    cv_request_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}
