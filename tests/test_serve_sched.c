/* test_serve_sched.c: the scheduler of `convoy serve` on stories260K:
 * every request's tokens (greedy, seeded sampling, penalties, long prompts
 * read in chunks) are the same alone and with up to 7 others in any order,
 * with few or many slots and a small or large batch; cancelling a running
 * or queued request frees its slot or queue place; a full queue refuses;
 * clients: a client runs at most its share of the slots, the next free
 * slot goes to the client running the fewest, the queue's bound counts the
 * slots a client may still take, and sharing changes no request's tokens;
 * embedding requests among completions give the same vectors and leave
 * the completions' tokens as they are; max_tokens ends with "length"; logprobs are a distribution's, with the greedy
 * choice on top, and the engine's (convoy_logprobs) bit for bit; stopping
 * fails what is left. Speculation (prompt lookup, or
 * stories260K drafting for itself; fixed or automatic K; a batch too small
 * for every draft) gives 8 concurrent greedy requests of 128+ tokens the
 * same tokens and logprobs as plain decoding, and never drafts past
 * max_tokens or the context. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "serve/sched.h"
#include "test.h"
#include "model_test.h"

enum { N_REQ = 8, MAX_TOK = 40, OUT_MAX = 256, LP_TOP = 2, EMBD_MAX = 64 };

static convoy_model *model;

static const char *const prompts[N_REQ] = {
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park. They saw a big tree and",
    "One day",
    ("Sam had a red ball. He liked to play with it every day. One day the ball rolled away and Sam was sad. "
     "He looked everywhere for it"),
    "The sun",
    "There was a girl named Sue",
    "Bob",
};

typedef struct job {
    int32_t prompt[256];
    int32_t n_prompt;
    cv_request_params p;
    int32_t out[OUT_MAX];
    convoy_logprob lp[OUT_MAX * (1 + LP_TOP)]; /* when p.top_logprobs == LP_TOP */
    int32_t n_out;
    cv_finish finish;
    float embd[EMBD_MAX]; /* an embedding request's vector */
    bool has_embd;
} job;

static void make_jobs(job *jobs)
{
    for (int i = 0; i < N_REQ; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->n_prompt = convoy_tokenize(model, prompts[i], strlen(prompts[i]), true, false, j->prompt, 256);
        j->p.prompt = j->prompt;
        j->p.n_prompt = j->n_prompt;
        j->p.max_tokens = MAX_TOK - 4 * (i % 3);
        j->p.sampler = convoy_sampling_default_params();
        j->p.sampler.seed = 1000 + (uint64_t)i;
        j->p.sampler.temp = i % 2 ? 0.9f : 0.0f;
        if (i == 5)
            j->p.sampler.freq_penalty = 0.5f, j->p.sampler.presence_penalty = 0.3f;
        j->p.ignore_eos = i % 4 == 3;
        j->p.top_logprobs = -1;
    }
}

static convoy_ctx *make_ctx(int32_t n_slot, int32_t n_batch)
{
    char err[512];
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_ctx = 256;
    cp.n_slot = n_slot;
    cp.n_batch = n_batch;
    convoy_ctx *c = convoy_ctx_create(model, &cp, err, sizeof err);
    CHECKF(c, "%s", err);
    return c;
}

/* Waits for a request to end, collecting its tokens. */
static void collect(cv_request *r, job *j)
{
    cv_finish f = CV_RUNNING;
    int32_t n = 0;
    while (f == CV_RUNNING)
        n = cv_request_wait(r, n, 1000, &f);
    j->n_out = n;
    memcpy(j->out, cv_request_tokens(r), sizeof(int32_t) * (size_t)n);
    if (j->p.top_logprobs == LP_TOP && n > 0)
        memcpy(j->lp, cv_request_logprobs(r, 0), sizeof(convoy_logprob) * (size_t)n * (1 + LP_TOP));
    j->finish = f;
    const float *e = cv_request_embedding(r);
    j->has_embd = e != NULL;
    if (e)
        memcpy(j->embd, e, sizeof j->embd);
    cv_request_release(r);
}

static void run_alone(job *jobs)
{
    char err[512];
    convoy_ctx *c = make_ctx(1, 64);
    cv_sched *s = c ? cv_sched_create(c, model, 1, 4, err, sizeof err) : NULL;
    CHECKF(s, "%s", err);
    for (int i = 0; s && i < N_REQ; i++) {
        cv_request *r;
        CHECK(cv_sched_submit(s, &jobs[i].p, &r, err, sizeof err) == CV_SUBMIT_OK);
        collect(r, &jobs[i]);
    }
    cv_sched_free(s);
    convoy_ctx_free(c);
}

static void test_batched_equals_alone(void)
{
    static job alone[N_REQ], together[N_REQ];
    make_jobs(alone);
    run_alone(alone);
    for (int i = 0; i < N_REQ; i++) {
        CHECKF(alone[i].finish == CV_FINISH_STOP || alone[i].finish == CV_FINISH_LENGTH, "request %d: %d", i,
               alone[i].finish);
        CHECK(alone[i].n_out > 0);
    }
    /* (slots, batch): few slots (requests queue), batch smaller than the
     * long prompts (chunked prefill), and one slot per request. */
    const int32_t configs[][2] = {{3, 8}, {8, 8}, {8, 64}, {5, 17}};
    char err[512];
    uint32_t rng = 12345;
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        make_jobs(together);
        int order[N_REQ];
        for (int i = 0; i < N_REQ; i++)
            order[i] = i;
        for (int i = N_REQ - 1; i > 0; i--) {
            rng = rng * 1103515245u + 12345u;
            int j = (int)((rng >> 8) % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        convoy_ctx *c = make_ctx(configs[k][0], configs[k][1]);
        cv_sched *s = c ? cv_sched_create(c, model, configs[k][0], N_REQ, err, sizeof err) : NULL;
        CHECKF(s, "%s", err);
        if (!s) {
            convoy_ctx_free(c);
            continue;
        }
        if (k % 2) { /* three clients sharing the slots, two at most each */
            for (int i = 0; i < N_REQ; i++)
                together[i].p.client = (uint64_t)(i % 3);
            cv_sched_set_client_slots(s, 2);
        }
        cv_request *reqs[N_REQ];
        for (int i = 0; i < N_REQ; i++)
            CHECK(cv_sched_submit(s, &together[order[i]].p, &reqs[order[i]], err, sizeof err) == CV_SUBMIT_OK);
        for (int i = 0; i < N_REQ; i++)
            collect(reqs[i], &together[i]);
        for (int i = 0; i < N_REQ; i++) {
            CHECKF(together[i].n_out == alone[i].n_out && together[i].finish == alone[i].finish &&
                       !memcmp(together[i].out, alone[i].out, sizeof(int32_t) * (size_t)alone[i].n_out),
                   "slots %d batch %d: request %d differs from its run alone (%d vs %d tokens)", configs[k][0],
                   configs[k][1], i, together[i].n_out, alone[i].n_out);
        }
        cv_sched_stats st;
        cv_sched_get_stats(s, &st);
        CHECK(st.requests_finished[CV_FINISH_STOP] + st.requests_finished[CV_FINISH_LENGTH] == N_REQ);
        CHECK(st.active == 0 && st.queued == 0);
        CHECK(st.steps_shared > 0);
        cv_sched_free(s);
        convoy_ctx_free(c);
    }
}

/* Embedding requests (two of the jobs) among completions: each vector and
 * each completion's tokens are the same alone and together, chunked or
 * not; an embedding generates nothing and ends with STOP. */
static void test_embeddings_mixed(void)
{
    static job alone[N_REQ], together[N_REQ];
    make_jobs(alone);
    alone[2].p.embed = alone[4].p.embed = true;
    run_alone(alone); /* one slot: each embedding follows a completion in it (cold) */
    CHECK(alone[2].has_embd && alone[4].has_embd && alone[2].n_out == 0 && alone[2].finish == CV_FINISH_STOP);
    CHECK(memcmp(alone[2].embd, alone[4].embd, sizeof alone[2].embd) != 0);
    const int32_t configs[][2] = {{3, 8}, {8, 64}};
    char err[512];
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        make_jobs(together);
        together[2].p.embed = together[4].p.embed = true;
        convoy_ctx *c = make_ctx(configs[k][0], configs[k][1]);
        cv_sched *s = c ? cv_sched_create(c, model, configs[k][0], N_REQ, err, sizeof err) : NULL;
        CHECKF(s, "%s", err);
        cv_request *reqs[N_REQ];
        for (int i = N_REQ - 1; s && i >= 0; i--)
            CHECK(cv_sched_submit(s, &together[i].p, &reqs[i], err, sizeof err) == CV_SUBMIT_OK);
        for (int i = 0; s && i < N_REQ; i++)
            collect(reqs[i], &together[i]);
        for (int i = 0; s && i < N_REQ; i++)
            CHECKF(together[i].n_out == alone[i].n_out && together[i].has_embd == alone[i].has_embd &&
                       !memcmp(together[i].out, alone[i].out, sizeof(int32_t) * (size_t)alone[i].n_out) &&
                       !memcmp(together[i].embd, alone[i].embd, sizeof alone[i].embd),
                   "slots %d batch %d: request %d differs from its run alone", configs[k][0], configs[k][1], i);
        cv_sched_free(s);
        convoy_ctx_free(c);
    }
}

static void test_cancel_and_queue(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(1, 16);
    cv_sched *s = c ? cv_sched_create(c, model, 1, 1, err, sizeof err) : NULL;
    CHECKF(s, "%s", err);
    if (!s) {
        convoy_ctx_free(c);
        return;
    }
    job jobs[N_REQ];
    make_jobs(jobs);
    jobs[0].p.max_tokens = 200;
    jobs[0].p.ignore_eos = true;
    cv_request *a, *b, *d;
    CHECK(cv_sched_submit(s, &jobs[0].p, &a, err, sizeof err) == CV_SUBMIT_OK);
    cv_finish f;
    int32_t n = cv_request_wait(a, 0, 5000, &f);
    CHECK(n >= 1 && f == CV_RUNNING);
    /* a holds the only slot: one more may wait, the next is refused */
    CHECK(cv_sched_submit(s, &jobs[1].p, &b, err, sizeof err) == CV_SUBMIT_OK);
    CHECK(cv_sched_submit(s, &jobs[2].p, &d, err, sizeof err) == CV_SUBMIT_FULL);
    CHECK(d == NULL && strstr(err, "busy"));
    /* cancelling the queued one frees its place */
    cv_request_cancel(b);
    cv_request_wait(b, 0, 1000, &f);
    CHECK(f == CV_FINISH_CANCELLED);
    cv_request_release(b);
    CHECK(cv_sched_submit(s, &jobs[2].p, &d, err, sizeof err) == CV_SUBMIT_OK);
    /* cancelling the running one frees the slot: d runs to its end */
    cv_request_cancel(a);
    while (f = CV_RUNNING, cv_request_wait(a, 1 << 30, 1000, &f), f == CV_RUNNING)
        ;
    CHECK(f == CV_FINISH_CANCELLED);
    cv_request_release(a);
    job got;
    collect(d, &got);
    CHECK(got.finish == CV_FINISH_LENGTH || got.finish == CV_FINISH_STOP);
    CHECK(got.n_out > 0);
    /* a request released while running: the scheduler drops it alone */
    CHECK(cv_sched_submit(s, &jobs[0].p, &a, err, sizeof err) == CV_SUBMIT_OK);
    cv_request_wait(a, 0, 5000, &f);
    cv_request_release(a);
    CHECK(cv_sched_submit(s, &jobs[3].p, &d, err, sizeof err) == CV_SUBMIT_OK);
    collect(d, &got);
    CHECK(got.n_out > 0);
    cv_sched_stats st;
    cv_sched_get_stats(s, &st);
    CHECK(st.requests_finished[CV_FINISH_CANCELLED] == 3);
    CHECK(st.generated_tokens > 0 && st.prompt_tokens > 0 && st.steps > 0);
    /* stopping fails the running and the queued requests */
    CHECK(cv_sched_submit(s, &jobs[0].p, &a, err, sizeof err) == CV_SUBMIT_OK);
    CHECK(cv_sched_submit(s, &jobs[0].p, &b, err, sizeof err) == CV_SUBMIT_OK);
    cv_request_wait(a, 0, 5000, &f);
    cv_sched_stop(s);
    cv_request_wait(a, 1 << 30, 1000, &f);
    CHECK(f == CV_FINISH_ERROR && strstr(cv_request_error(a), "shutting down"));
    cv_request_wait(b, 1 << 30, 1000, &f);
    CHECK(f == CV_FINISH_ERROR);
    CHECK(cv_sched_submit(s, &jobs[0].p, &d, err, sizeof err) == CV_SUBMIT_ERROR);
    cv_request_release(a);
    cv_request_release(b);
    cv_sched_free(s);
    convoy_ctx_free(c);
}

/* Client A's long requests (2000 tokens: none ends while this runs) and
 * client B's: returns whether B got a token while A's queued ones, ra[from,
 * to), still wait and every slot runs, then releases them all. */
static bool b_runs_before_queued_a(cv_sched *s, cv_request **ra, int from, int to, cv_request *rb)
{
    cv_finish f;
    bool ok = cv_request_wait(rb, 0, 10000, &f) > 0;
    for (int i = from; i < to; i++)
        ok &= cv_request_wait(ra[i], 0, 0, &f) == 0 && f == CV_RUNNING;
    cv_sched_stats st;
    cv_sched_get_stats(s, &st);
    ok &= st.active == 4;
    cv_request_release(rb);
    for (int i = 0; i < to; i++)
        cv_request_release(ra[i]);
    return ok;
}

/* Two clients on 4 slots and a queue of 3. With a share of 3, A runs 3
 * and queues 3, its next submit is refused, and B still finds a slot at
 * once. With every slot A's share, B waits in line behind A's older queued
 * requests, but takes the next free slot before them. */
static void test_clients(void)
{
    char err[512];
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_ctx = 2048;
    cp.n_slot = 4;
    cp.n_batch = 64;
    convoy_ctx *c = convoy_ctx_create(model, &cp, err, sizeof err);
    cv_sched *s = c ? cv_sched_create(c, model, 4, 3, err, sizeof err) : NULL;
    CHECKF(s, "%s", err);
    if (!s) {
        convoy_ctx_free(c);
        return;
    }
    static job jobs[N_REQ];
    make_jobs(jobs);
    job a = jobs[0], b = jobs[1];
    a.p.prompt = a.prompt;
    b.p.prompt = b.prompt;
    a.p.max_tokens = 2000;
    a.p.ignore_eos = true;
    b.p.client = 1;
    cv_request *ra[6], *rb, *extra;
    cv_finish f;
    cv_sched_set_client_slots(s, 3);
    for (int i = 0; i < 6; i++)
        CHECK(cv_sched_submit(s, &a.p, &ra[i], err, sizeof err) == CV_SUBMIT_OK);
    CHECK(cv_request_wait(ra[2], 0, 10000, &f) > 0); /* A runs its share */
    CHECK(cv_sched_submit(s, &a.p, &extra, err, sizeof err) == CV_SUBMIT_FULL && extra == NULL);
    CHECK(strstr(err, "the most one client may run"));
    CHECK(cv_sched_submit(s, &b.p, &rb, err, sizeof err) == CV_SUBMIT_OK);
    CHECKF(b_runs_before_queued_a(s, ra, 3, 6, rb), "share 3: B did not get the free slot at once");

    cv_sched_stats st = {.active = 1};
    for (int k = 0; k < 10000 && (st.active || st.queued); k++) { /* the released requests end */
        usleep(1000);
        cv_sched_get_stats(s, &st);
    }
    cv_sched_set_client_slots(s, 4);
    for (int i = 0; i < 6; i++)
        CHECK(cv_sched_submit(s, &a.p, &ra[i], err, sizeof err) == CV_SUBMIT_OK);
    CHECK(cv_request_wait(ra[3], 0, 10000, &f) > 0); /* every slot runs A */
    CHECK(cv_sched_submit(s, &b.p, &rb, err, sizeof err) == CV_SUBMIT_OK);
    cv_request_release(ra[0]);
    ra[0] = NULL;
    CHECKF(b_runs_before_queued_a(s, ra, 4, 6, rb), "share 4: B was not next");
    cv_sched_free(s);
    convoy_ctx_free(c);
}

/* Whether stepping p's request alone on a fresh context gives the same n
 * tokens and the same logprobs bit for bit (convoy_logprobs' after each
 * step): the scheduler passes the engine's logprobs on as they are. */
static bool engine_gives(const cv_request_params *p, const int32_t *tokens, const convoy_logprob *lp, int32_t n)
{
    enum { MAX_PROMPT = 64 };
    if (p->n_prompt > MAX_PROMPT)
        return false;
    char err[512];
    convoy_ctx *c = make_ctx(1, MAX_PROMPT);
    convoy_sampling_params sp = p->sampler;
    sp.n_logprobs = p->top_logprobs;
    bool same = c && !convoy_set_sampler(c, 0, &sp, err, sizeof err);
    int32_t pos[MAX_PROMPT], seq[MAX_PROMPT] = {0}, id = -1;
    uint8_t want[MAX_PROMPT] = {0};
    for (int32_t t = 0; t < p->n_prompt; t++)
        pos[t] = t;
    want[p->n_prompt - 1] = CONVOY_WANT_SAMPLE;
    convoy_batch b = {.n_tokens = p->n_prompt, .token = p->prompt, .pos = pos, .seq = seq, .want = want};
    const size_t k = 1 + (size_t)p->top_logprobs;
    convoy_logprob got[1 + CONVOY_MAX_TOP_LOGPROBS];
    for (int32_t i = 0; same && i < n; i++) {
        same = !convoy_step(c, &b, &id, err, sizeof err) && id == tokens[i] &&
               convoy_logprobs(c, 0, got) == (int)k && !memcmp(got, lp + (size_t)i * k, sizeof(convoy_logprob) * k);
        pos[0] = p->n_prompt + i;
        want[0] = CONVOY_WANT_SAMPLE;
        b = (convoy_batch){.n_tokens = 1, .token = &tokens[i], .pos = pos, .seq = seq, .want = want};
    }
    convoy_ctx_free(c);
    return same;
}

static void test_finish_and_logprobs(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(2, 32);
    cv_sched *s = c ? cv_sched_create(c, model, 2, 2, err, sizeof err) : NULL;
    CHECKF(s, "%s", err);
    if (!s) {
        convoy_ctx_free(c);
        return;
    }
    job jobs[N_REQ];
    make_jobs(jobs);
    /* (stories260K does not emit its EOS: the end-of-generation path is
     * covered by test_serve.sh's chat requests) */
    jobs[0].p.max_tokens = 30;
    jobs[0].p.ignore_eos = false;
    jobs[0].p.top_logprobs = 3;
    cv_request *r;
    job got;
    CHECK(cv_sched_submit(s, &jobs[0].p, &r, err, sizeof err) == CV_SUBMIT_OK);
    cv_finish f = CV_RUNNING;
    int32_t n = 0;
    while (f == CV_RUNNING)
        n = cv_request_wait(r, n, 1000, &f);
    CHECKF(f == CV_FINISH_LENGTH && n == 30, "finish %d after %d tokens", f, n);
    for (int32_t i = 0; i < n; i++) {
        const convoy_logprob *lp = cv_request_logprobs(r, i);
        CHECK(lp[0].id == cv_request_tokens(r)[i]);
        CHECK(lp[1].id == lp[0].id && lp[1].logprob == lp[0].logprob);
        CHECK(lp[0].logprob <= 0.0f && lp[1].logprob >= lp[2].logprob && lp[2].logprob >= lp[3].logprob);
        CHECK(expf(lp[1].logprob) + expf(lp[2].logprob) + expf(lp[3].logprob) <= 1.0001f);
    }
    CHECK(engine_gives(&jobs[0].p, cv_request_tokens(r), cv_request_logprobs(r, 0), n));
    /* and so at temperature > 0 with the most alternatives */
    jobs[1].p.top_logprobs = CONVOY_MAX_TOP_LOGPROBS;
    cv_request *r1;
    CHECK(cv_sched_submit(s, &jobs[1].p, &r1, err, sizeof err) == CV_SUBMIT_OK);
    int32_t n1 = 0;
    for (f = CV_RUNNING; f == CV_RUNNING;)
        n1 = cv_request_wait(r1, n1, 1000, &f);
    CHECK(n1 > 0 && engine_gives(&jobs[1].p, cv_request_tokens(r1), cv_request_logprobs(r1, 0), n1));
    cv_request_release(r1);
    /* the same without logprobs gives the same tokens */
    int32_t with_lp[30];
    memcpy(with_lp, cv_request_tokens(r), sizeof with_lp);
    jobs[0].p.top_logprobs = -1;
    cv_request *r2;
    CHECK(cv_sched_submit(s, &jobs[0].p, &r2, err, sizeof err) == CV_SUBMIT_OK);
    collect(r2, &got);
    CHECK(got.finish == CV_FINISH_LENGTH && got.n_out == 30 && !memcmp(got.out, with_lp, sizeof with_lp));
    cv_request_release(r);
    /* parameters the scheduler refuses */
    jobs[1].p.max_tokens = 256;
    CHECK(cv_sched_submit(s, &jobs[1].p, &r, err, sizeof err) == CV_SUBMIT_ERROR && r == NULL);
    jobs[1].p.max_tokens = 1;
    jobs[1].p.n_prompt = 0;
    CHECK(cv_sched_submit(s, &jobs[1].p, &r, err, sizeof err) == CV_SUBMIT_ERROR);
    jobs[1].p.n_prompt = 1;
    jobs[1].prompt[0] = 512;
    CHECK(cv_sched_submit(s, &jobs[1].p, &r, err, sizeof err) == CV_SUBMIT_ERROR);
    cv_sched_free(s);
    convoy_ctx_free(c);
}

/* Runs jobs[0..n) submitted at once on n_slot slots and batches of n_batch,
 * speculating with *spp when it is not NULL; *st gets the statistics. */
static void run_together(job *jobs, int n, int32_t n_slot, int32_t n_batch, const convoy_spec_params *spp,
                         cv_sched_stats *st)
{
    char err[512];
    memset(st, 0, sizeof *st);
    convoy_ctx *c = make_ctx(n_slot, n_batch);
    convoy_spec *spec = NULL;
    cv_sched *s = NULL;
    if (c && spp && !(spec = convoy_spec_create(c, model, spp, err, sizeof err)))
        CHECKF(0, "%s", err);
    else if (c && !(s = cv_sched_create(c, model, n_slot, n, err, sizeof err)))
        CHECKF(0, "%s", err);
    else if (s && cv_sched_set_spec(s, spec, err, sizeof err))
        CHECKF(0, "%s", err);
    else if (s) {
        cv_request *reqs[N_REQ];
        for (int i = 0; i < n; i++)
            CHECK(cv_sched_submit(s, &jobs[i].p, &reqs[i], err, sizeof err) == CV_SUBMIT_OK);
        for (int i = 0; i < n; i++)
            collect(reqs[i], &jobs[i]);
        cv_sched_get_stats(s, st);
    }
    cv_sched_free(s);
    convoy_spec_free(spec);
    convoy_ctx_free(c);
}

/* Greedy requests of 128 tokens and more (one with penalties, one with
 * logprobs), all at once. */
static void make_long_jobs(job *jobs)
{
    make_jobs(jobs);
    for (int i = 0; i < N_REQ; i++) {
        jobs[i].p.max_tokens = 128 + 8 * i;
        jobs[i].p.sampler.temp = 0.0f;
    }
    jobs[6].p.top_logprobs = LP_TOP;
}

static void test_speculation_equals_plain(void)
{
    char draft_path[1024];
    if (!test_shared_path(draft_path, sizeof draft_path, "models/stories260K.gguf"))
        return;
    static job plain[N_REQ], spec[N_REQ];
    cv_sched_stats st;
    make_long_jobs(plain);
    run_together(plain, N_REQ, N_REQ, 64, NULL, &st);
    CHECK(!st.speculating && st.spec_rounds == 0);
    for (int i = 0; i < N_REQ; i++)
        CHECKF(plain[i].finish == CV_FINISH_LENGTH && plain[i].n_out == plain[i].p.max_tokens, "request %d: %d, %d",
               i, plain[i].finish, plain[i].n_out);
    /* (drafter, K, K max, slots, batch): automatic and fixed K with either
     * drafter; a batch of 16 leaves 8 slots one draft each on average; 3
     * slots make requests queue, so slots are reused */
    const struct {
        const char *draft;
        int32_t k, k_max, n_slot, n_batch;
    } configs[] = {
        {"ngram", 0, 16, N_REQ, 64}, {"ngram", 4, 16, N_REQ, 64}, {draft_path, 0, 16, N_REQ, 64},
        {draft_path, 3, 16, N_REQ, 64}, {draft_path, 0, 8, N_REQ, 16}, {"ngram", 8, 8, 3, 12},
    };
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        convoy_spec_params spp = convoy_spec_default_params();
        spp.draft = configs[k].draft;
        spp.k = configs[k].k;
        spp.k_max = configs[k].k_max;
        make_long_jobs(spec);
        run_together(spec, N_REQ, configs[k].n_slot, configs[k].n_batch, &spp, &st);
        const char *drafter = configs[k].draft == draft_path ? "model" : "ngram";
        for (int i = 0; i < N_REQ; i++) {
            CHECKF(spec[i].n_out == plain[i].n_out && spec[i].finish == plain[i].finish &&
                       !memcmp(spec[i].out, plain[i].out, sizeof(int32_t) * (size_t)plain[i].n_out),
                   "%s K %d batch %d: request %d differs from plain decoding (%d vs %d tokens)", drafter,
                   configs[k].k, configs[k].n_batch, i, spec[i].n_out, plain[i].n_out);
        }
        CHECKF(!memcmp(spec[6].lp, plain[6].lp, sizeof(convoy_logprob) * (size_t)plain[6].n_out * (1 + LP_TOP)),
               "%s K %d: the logprobs differ from plain decoding", drafter, configs[k].k);
        /* (an automatic K may settle on 0 where drafting does not pay) */
        CHECKF(st.speculating && st.spec_rounds > 0 && st.spec_accepted <= st.spec_drafted &&
                   (configs[k].k == 0 || st.spec_accepted > 0),
               "%s K %d: %llu rounds, %llu of %llu drafts accepted", drafter, configs[k].k,
               (unsigned long long)st.spec_rounds, (unsigned long long)st.spec_accepted,
               (unsigned long long)st.spec_drafted);
    }
}

/* The model drafting for itself is always right (greedy), so every round
 * would run to K drafts: each request still gets exactly max_tokens tokens,
 * and no row is spent past them. */
static void test_speculation_max_tokens(void)
{
    char draft_path[1024];
    if (!test_shared_path(draft_path, sizeof draft_path, "models/stories260K.gguf"))
        return;
    static job plain[N_REQ], spec[N_REQ];
    static const int32_t max_tokens[N_REQ] = {1, 2, 3, 5, 9, 10, 17, 33};
    cv_sched_stats st;
    make_jobs(plain);
    for (int i = 0; i < N_REQ; i++) {
        plain[i].p.max_tokens = max_tokens[i];
        plain[i].p.sampler = convoy_sampling_default_params();
        plain[i].p.sampler.temp = 0.0f;
        plain[i].p.ignore_eos = true;
    }
    /* the last one fills its slot's context to the last position */
    plain[7].p.max_tokens = 256 - plain[7].n_prompt;
    memcpy(spec, plain, sizeof plain);
    run_together(plain, N_REQ, 4, 64, NULL, &st);
    convoy_spec_params spp = convoy_spec_default_params();
    spp.draft = draft_path;
    spp.k = 8;
    spp.k_max = 8;
    run_together(spec, N_REQ, 4, 64, &spp, &st);
    uint64_t rows = 0;
    for (int i = 0; i < N_REQ; i++) {
        CHECKF(spec[i].finish == CV_FINISH_LENGTH && spec[i].n_out == spec[i].p.max_tokens, "request %d: %d, %d of %d",
               i, spec[i].finish, spec[i].n_out, spec[i].p.max_tokens);
        CHECKF(plain[i].n_out == spec[i].n_out &&
                   !memcmp(spec[i].out, plain[i].out, sizeof(int32_t) * (size_t)plain[i].n_out),
               "request %d differs", i);
        rows += (uint64_t)spec[i].n_prompt + (uint64_t)spec[i].p.max_tokens - 1;
    }
    /* prompt tokens a slot's cache held are not run */
    CHECKF(st.batch_tokens + st.prompt_tokens_cached == rows && st.spec_drafted == st.spec_accepted,
           "%llu rows for %llu needed, %llu of %llu drafts accepted", (unsigned long long)st.batch_tokens,
           (unsigned long long)rows, (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted);
    /* sampling at temperature 0.9: drafts get rejected, the count holds and
     * the tokens are plain decoding's, seed for seed */
    for (int i = 0; i < N_REQ; i++) {
        plain[i].p.sampler.temp = spec[i].p.sampler.temp = 0.9f;
        plain[i].p.sampler.seed = spec[i].p.sampler.seed = 7 + (uint64_t)i;
    }
    run_together(plain, N_REQ, 4, 64, NULL, &st);
    spp.draft = "ngram";
    spp.k = 0;
    run_together(spec, N_REQ, 4, 64, &spp, &st);
    for (int i = 0; i < N_REQ; i++) {
        CHECKF(spec[i].finish == CV_FINISH_LENGTH && spec[i].n_out == spec[i].p.max_tokens, "request %d: %d, %d of %d",
               i, spec[i].finish, spec[i].n_out, spec[i].p.max_tokens);
        CHECKF(plain[i].n_out == spec[i].n_out &&
                   !memcmp(spec[i].out, plain[i].out, sizeof(int32_t) * (size_t)plain[i].n_out),
               "request %d differs at temperature 0.9", i);
    }
    CHECKF(st.spec_rounds > 0 && st.spec_accepted < st.spec_drafted, "%llu rounds, %llu of %llu drafts accepted",
           (unsigned long long)st.spec_rounds, (unsigned long long)st.spec_accepted,
           (unsigned long long)st.spec_drafted);
}

int main(void)
{
    cv_kernels_init(0);
    if (!(model = test_load_stories()))
        return test_summary();
    TEST_RUN(test_batched_equals_alone);
    TEST_RUN(test_embeddings_mixed);
    TEST_RUN(test_cancel_and_queue);
    TEST_RUN(test_clients);
    TEST_RUN(test_finish_and_logprobs);
    TEST_RUN(test_speculation_equals_plain);
    TEST_RUN(test_speculation_max_tokens);
    convoy_model_free(model);
    return test_summary();
}
