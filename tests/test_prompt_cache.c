/* test_prompt_cache.c: the scheduler's prompt cache (serve/sched.h) on
 * stories260K. Random chats: each turn's prompt is a random-length prefix
 * of the conversation so far (the last prompt and its answer) followed by
 * new random tokens, as a client resends a history it may also edit. One
 * slot, so the test knows what the slot holds: the reused prefix must be
 * exactly the common prefix it computes (less the last prompt token, and
 * the penalty window of a request with penalties), and every answer's
 * tokens and logprobs must equal, bit for bit, those of the same prompts
 * on a scheduler whose cache is off. Greedy and seeded sampling, with and
 * without penalties, on one machine and on a 2-stage chain (this process
 * the first stage); also with a grammar, with prompt-lookup drafts, and on
 * a chain whose stage is SIGKILLed between turns, a standby taking over
 * (the journal rebuilds the kept prefix there). The cache beyond the
 * slots (context slots past the scheduler's): prompts A, B, A, C, B on one
 * slot and two cache slots take exactly the prefixes the policy gives (A's
 * stashed when B takes the slot, copied back for A, ...), on one machine
 * and on a chain, with a cold scheduler's tokens; the random chats with
 * cache slots reuse at least what one slot gives, with the same tokens;
 * and waves of requests admitted together on 4 slots (test_waves) give
 * each request's cold tokens. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "serve/sched.h"
#include "test.h"
#include "model_test.h"
#include "stage_test.h"

enum { N_CHAT = 20, N_TURN = 3, N_CTX = 256, MAX_TOK = 12, LP_TOP = 2, HIST_MAX = N_CTX, WAVE_MAX = 4 };

static convoy_model *model;
static char model_path[1024];

typedef struct turn {
    int32_t prompt[N_CTX];
    cv_request_params p;
    int32_t out[MAX_TOK];
    convoy_logprob lp[MAX_TOK * (1 + LP_TOP)];
    int32_t n_out, n_cached;
    cv_finish finish;
} turn;

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33) % n;
}

/* A token that is neither BOS nor EOS (ids 1, 2) nor `not`. */
static int32_t fresh_token(int32_t not)
{
    int32_t t;
    do
        t = 3 + (int32_t)rnd(509);
    while (t == not);
    return t;
}

static void set_params(turn *t, int32_t n_prompt, int chat, int k, const char *grammar)
{
    t->p = (cv_request_params){.prompt = t->prompt, .n_prompt = n_prompt, .max_tokens = MAX_TOK,
                               .sampler = convoy_sampling_default_params(), .top_logprobs = LP_TOP};
    t->p.sampler.seed = 7000 + (uint64_t)(chat * N_TURN + k);
    t->p.sampler.temp = chat % 2 ? 0.8f : 0.0f;
    if (chat % 5 == 4)
        t->p.sampler.repeat_penalty = 1.3f, t->p.sampler.penalty_last_n = 16;
    if (grammar) {
        t->p.grammar = grammar;
        t->p.grammar_len = strlen(grammar);
    }
}

/* Runs the n requests of t, admitted together (cv_sched_submit_all). */
static void run_turns(cv_sched *s, turn *t, int n)
{
    char err[512];
    cv_request_params p[WAVE_MAX] = {0};
    cv_request *r[WAVE_MAX];
    for (int k = 0; k < n; k++)
        p[k] = t[k].p;
    CHECKF(cv_sched_submit_all(s, p, n, r, err, sizeof err) == CV_SUBMIT_OK, "submit: %s", err);
    for (int k = 0; k < n && r[k]; k++) {
        cv_finish f = CV_RUNNING;
        int32_t got = 0;
        while (f == CV_RUNNING)
            got = cv_request_wait(r[k], got, 1000, &f);
        CHECKF(f == CV_FINISH_STOP || f == CV_FINISH_LENGTH, "finish %d: %s", f, cv_request_error(r[k]));
        t[k].n_out = got;
        t[k].finish = f;
        t[k].n_cached = cv_request_cached(r[k]);
        memcpy(t[k].out, cv_request_tokens(r[k]), sizeof(int32_t) * (size_t)got);
        if (got > 0)
            memcpy(t[k].lp, cv_request_logprobs(r[k], 0), sizeof(convoy_logprob) * (size_t)got * (1 + LP_TOP));
        cv_request_release(r[k]);
    }
}

static void run_turn(cv_sched *s, turn *t) { run_turns(s, t, 1); }

/* The tokens the reused prefix may take: the common prefix, less the last
 * prompt token and, with penalties, the penalty window. */
static int32_t expected_reuse(const cv_request_params *p, int32_t common)
{
    int32_t n = common < p->n_prompt - 1 ? common : p->n_prompt - 1;
    if (p->sampler.repeat_penalty != 1.0f && n > p->n_prompt - p->sampler.penalty_last_n)
        n = p->n_prompt - p->sampler.penalty_last_n;
    return n > 0 ? n : 0;
}

/* The chats on s (cache on), turn by turn, each prompt made from the
 * conversation so far; between chats `between` runs (a failure, ...). */
static void run_warm(cv_sched *s, turn (*chats)[N_TURN], const char *grammar, void (*between)(int chat),
                     bool cache_slots)
{
    int32_t hist[HIST_MAX + MAX_TOK], n_hist = 0; /* what the slot holds, as far as the test knows */
    for (int c = 0; c < N_CHAT; c++) {
        if (between)
            between(c);
        for (int k = 0; k < N_TURN; k++) {
            turn *t = &chats[c][k];
            /* every prompt starts with BOS; a chat's first turn shares only that, a later one keeps up to the
             * whole history less its last token (maybe an unfed output), then differs */
            int32_t keep = 0, n = 0;
            if (n_hist == 0)
                t->prompt[n++] = 1;
            else
                keep = n = k == 0 && c % 3 == 0 ? 1 : 1 + (int32_t)rnd((uint32_t)n_hist - 1);
            memcpy(t->prompt, hist, sizeof(int32_t) * (size_t)keep);
            const int32_t n_new = 1 + (int32_t)rnd(24);
            for (int32_t i = 0; i < n_new; i++, n++)
                t->prompt[n] = fresh_token(i == 0 && keep < n_hist ? hist[keep] : -1);
            set_params(t, n, c, k, grammar);
            const int32_t want = expected_reuse(&t->p, keep);
            run_turn(s, t);
            CHECKF(t->n_cached == want || (cache_slots && t->n_cached > want),
                   "chat %d turn %d: %d cached, the common prefix gives %d", c, k, t->n_cached, want);
            /* the slot keeps the prompt and the output, the last output only if it was fed (an EOS was sampled
             * after it): with drafts it may have been fed anyway, so the test never relies on it */
            n_hist = t->p.n_prompt + t->n_out - (t->finish == CV_FINISH_LENGTH);
            memcpy(hist, t->prompt, sizeof(int32_t) * (size_t)t->p.n_prompt);
            memcpy(hist + t->p.n_prompt, t->out, sizeof(int32_t) * (size_t)t->n_out);
            if (n_hist + MAX_TOK + 24 >= N_CTX)
                n_hist = N_CTX / 2; /* the next prompt must fit */
        }
    }
}

/* The same prompts on a scheduler without the cache: the same tokens and logprobs. */
static void check_cold(cv_sched *s, turn (*chats)[N_TURN])
{
    static turn cold;
    for (int c = 0; c < N_CHAT; c++)
        for (int k = 0; k < N_TURN; k++) {
            const turn *w = &chats[c][k];
            memcpy(cold.prompt, w->prompt, sizeof(int32_t) * (size_t)w->p.n_prompt);
            cold.p = w->p;
            cold.p.prompt = cold.prompt;
            run_turn(s, &cold);
            CHECKF(cold.n_cached == 0, "a cold slot reused %d tokens", cold.n_cached);
            CHECKF(cold.n_out == w->n_out && cold.finish == w->finish &&
                       !memcmp(cold.out, w->out, sizeof(int32_t) * (size_t)w->n_out),
                   "chat %d turn %d: tokens differ from a cold slot's (%d and %d tokens)", c, k, w->n_out,
                   cold.n_out);
            CHECKF(!memcmp(cold.lp, w->lp, sizeof(convoy_logprob) * (size_t)w->n_out * (1 + LP_TOP)),
                   "chat %d turn %d: logprobs differ from a cold slot's", c, k);
        }
}

typedef struct setup {
    const char *nodes, *standby, *draft, *grammar;
    int32_t n_cache; /* cache slots beyond the one slot: the reuse may then be larger than the test's model */
    bool cold_here; /* the cold run on one machine (the chain's bits by the engine's contract) */
    void (*between)(int chat);
} setup;

static cv_sched *open_sched(convoy_ctx *c, const setup *su, bool cache, convoy_spec **spec)
{
    char err[512];
    cv_sched *s = cv_sched_create(c, model, 1, 4, err, sizeof err);
    CHECKF(s, "%s", err);
    if (!s)
        return NULL;
    cv_sched_set_prompt_cache(s, cache);
    *spec = NULL;
    if (su->draft) {
        convoy_spec_params sp = convoy_spec_default_params();
        sp.draft = su->draft;
        *spec = convoy_spec_create(c, model, &sp, err, sizeof err);
        CHECKF(*spec && !cv_sched_set_spec(s, *spec, err, sizeof err), "%s", err);
    }
    return s;
}

/* Warm chats, then the cold run of the same prompts, each on its own context. */
static void run_setup(const setup *su)
{
    static turn chats[N_CHAT][N_TURN];
    char err[512];
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_ctx = N_CTX;
    cp.n_slot = 1 + su->n_cache;
    cp.n_batch = 64;
    cp.nodes = su->nodes;
    cp.standby = su->standby;
    cp.timeout_ms = 1000;
    for (int cache = 1; cache >= 0; cache--) {
        if (!cache && su->cold_here)
            cp.nodes = cp.standby = NULL;
        convoy_ctx *c = convoy_ctx_create(model, &cp, err, sizeof err);
        CHECKF(c, "%s", err);
        if (!c)
            return;
        convoy_spec *spec = NULL;
        cv_sched *s = open_sched(c, su, cache, &spec);
        if (s && cache) {
            rng_state = 12345;
            run_warm(s, chats, su->grammar, su->between, su->n_cache > 0);
            cv_sched_stats st;
            cv_sched_get_stats(s, &st);
            CHECKF(st.prompt_tokens_cached > 0, "no prompt token came from the cache");
        } else if (s) {
            check_cold(s, chats);
        }
        cv_sched_free(s);
        convoy_spec_free(spec);
        convoy_ctx_free(c);
    }
}

static void test_one_machine(void)
{
    run_setup(&(setup){0});
    run_setup(&(setup){.n_cache = 2});
}

/* A prompt of n tokens: BOS, then tokens from seed. */
static int32_t make_prompt(int32_t *p, int32_t n, uint64_t seed)
{
    rng_state = seed;
    p[0] = 1;
    for (int32_t i = 1; i < n; i++)
        p[i] = fresh_token(-1);
    return n;
}

/* A scheduler of n_slot slots (queue 8) on a context (*c) with n_cache
 * more slots, its prompt cache on or off; NULL after a failed check. */
static cv_sched *open_cache(const char *nodes, int32_t n_slot, int32_t n_cache, bool cache, convoy_ctx **c)
{
    char err[512];
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_ctx = N_CTX;
    cp.n_slot = n_slot + n_cache;
    cp.n_batch = 64;
    cp.nodes = nodes;
    *c = convoy_ctx_create(model, &cp, err, sizeof err);
    cv_sched *s = *c ? cv_sched_create(*c, model, n_slot, 8, err, sizeof err) : NULL;
    CHECKF(s, "%s", err);
    if (s)
        cv_sched_set_prompt_cache(s, cache);
    return s;
}

/* Prompts A, B, A, C, B, A (A and C share their first 20 tokens) on one
 * slot with two cache slots, greedy, 4 tokens each: the slot ends each
 * request holding prompt + 3 outputs. */
static void run_cache_slots(const char *nodes, bool cache, turn *t)
{
    enum { N = 6 };
    static const char order[N] = {'A', 'B', 'A', 'C', 'B', 'A'};
    convoy_ctx *c;
    cv_sched *s = open_cache(nodes, 1, 2, cache, &c);
    for (int k = 0; s && k < N; k++) {
        const int32_t n = order[k] == 'A' ? 60 : order[k] == 'B' ? 50 : 70;
        make_prompt(t[k].prompt, n, order[k] == 'B' ? 2 : 1); /* C starts as A does */
        if (order[k] == 'C')
            for (int32_t i = 20; i < n; i++)
                t[k].prompt[i] = fresh_token(t[k].prompt[i]);
        set_params(&t[k], n, 0, k, NULL);
        t[k].p.max_tokens = 4;
        t[k].p.ignore_eos = true;
        run_turn(s, &t[k]);
    }
    cv_sched_free(s);
    convoy_ctx_free(c);
}

static void check_cache_slots(const char *nodes)
{
    static turn warm[6], cold[6];
    /* A: cold. B: a miss (BOS only; A stashed). A: 59 of 60 from the cache (B stashed in the other cache
     * slot). C: 20, A's start, in the slot (A is in the cache already: no stash). B: 49 from the cache, C
     * stashed over A (the one cache slot it may take). A: 20, C's start, from the cache. */
    static const int32_t want[6] = {0, 1, 59, 20, 49, 20};
    run_cache_slots(nodes, true, warm);
    run_cache_slots(nodes, false, cold);
    for (int k = 0; k < 6; k++) {
        CHECKF(warm[k].n_cached == want[k], "request %d: %d cached, want %d", k, warm[k].n_cached, want[k]);
        CHECKF(cold[k].n_cached == 0 && warm[k].n_out == cold[k].n_out &&
                   !memcmp(warm[k].out, cold[k].out, sizeof(int32_t) * (size_t)cold[k].n_out) &&
                   !memcmp(warm[k].lp, cold[k].lp, sizeof(convoy_logprob) * (size_t)cold[k].n_out * (1 + LP_TOP)),
               "request %d: tokens or logprobs differ from a cold scheduler's", k);
    }
}

static void test_cache_slots(void)
{
    check_cache_slots(NULL);
    int port;
    const pid_t pid = test_start_stage(model_path, &port);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "local,127.0.0.1:%d", port);
    check_cache_slots(nodes);
    test_stop_stage(pid);
}

/* Waves of requests admitted together (cv_sched_submit_all) on 4 slots
 * and 4 cache slots: prompts from 5 stems, cut at random lengths and
 * continued with fresh tokens, so that one admission copies prefixes out
 * of cache slots and free slots while others stash theirs. Every answer
 * equals, bit for bit, the same prompt's on a scheduler whose cache is
 * off. */
enum { WAVES = 40, N_STEM = 5, STEM_LEN = 90 };

static void make_wave_prompt(turn *t, const int32_t (*stems)[STEM_LEN], int k)
{
    const int32_t *stem = stems[rnd(N_STEM)];
    const int32_t keep = 1 + (int32_t)rnd(STEM_LEN - 1), n_new = (int32_t)rnd(4);
    memcpy(t->prompt, stem, sizeof(int32_t) * (size_t)keep);
    for (int32_t i = 0; i < n_new; i++)
        t->prompt[keep + i] = fresh_token(i == 0 && keep < STEM_LEN ? stem[keep] : -1);
    set_params(t, keep + n_new, k, k, NULL);
}

static void run_waves(bool cache, turn (*waves)[WAVE_MAX], const int *sizes)
{
    convoy_ctx *c;
    cv_sched *s = open_cache(NULL, 4, 4, cache, &c);
    for (int w = 0; s && w < WAVES; w++) {
        if (cache) {
            run_turns(s, waves[w], sizes[w]);
            continue;
        }
        for (int k = 0; k < sizes[w]; k++) /* alone */
            run_turn(s, &waves[w][k]);
    }
    cv_sched_free(s);
    convoy_ctx_free(c);
}

static void test_waves(void)
{
    static int32_t stems[N_STEM][STEM_LEN];
    static turn warm[WAVES][WAVE_MAX], cold[WAVES][WAVE_MAX];
    int sizes[WAVES];
    for (int i = 0; i < N_STEM; i++)
        make_prompt(stems[i], STEM_LEN, 100 + (uint64_t)i);
    rng_state = 777;
    for (int w = 0; w < WAVES; w++) {
        sizes[w] = 2 + (int)rnd(WAVE_MAX - 1);
        for (int k = 0; k < sizes[w]; k++) {
            make_wave_prompt(&warm[w][k], stems, w * WAVE_MAX + k);
            cold[w][k] = warm[w][k];
            cold[w][k].p.prompt = cold[w][k].prompt;
            warm[w][k].p.prompt = warm[w][k].prompt;
        }
    }
    run_waves(true, warm, sizes);
    run_waves(false, cold, sizes);
    int64_t n_cached = 0;
    for (int w = 0; w < WAVES; w++)
        for (int k = 0; k < sizes[w]; k++) {
            const turn *a = &warm[w][k], *b = &cold[w][k];
            n_cached += a->n_cached;
            CHECKF(b->n_cached == 0 && a->n_out == b->n_out &&
                       !memcmp(a->out, b->out, sizeof(int32_t) * (size_t)b->n_out) &&
                       !memcmp(a->lp, b->lp, sizeof(convoy_logprob) * (size_t)b->n_out * (1 + LP_TOP)),
                   "wave %d request %d (%d cached): tokens or logprobs differ from a cold scheduler's", w, k,
                   a->n_cached);
        }
    CHECKF(n_cached > 0, "no prompt token came from the cache");
}

static void test_grammar(void)
{
    run_setup(&(setup){.grammar = "root ::= [ a-z]+ \".\"?"});
}

static void test_ngram_drafts(void) { run_setup(&(setup){.draft = "ngram"}); }

static void test_chain(void)
{
    int port;
    const pid_t pid = test_start_stage(model_path, &port);
    char nodes[64];
    snprintf(nodes, sizeof nodes, "local,127.0.0.1:%d", port);
    run_setup(&(setup){.nodes = nodes});
    test_stop_stage(pid);
}

/* SIGKILL of the chain's stage after chat 7 (its kept prefix and the two
 * cache slots' are then only in the head's journal); the standby takes
 * over at the next turn. */
static pid_t victim;

static void kill_after_7(int chat)
{
    if (chat == 8 && victim > 0) {
        test_stop_stage(victim);
        victim = 0;
    }
}

static void test_chain_failover(void)
{
    int port, standby_port;
    victim = test_start_stage(model_path, &port);
    const pid_t standby = test_start_stage(model_path, &standby_port);
    char nodes[64], spare[64];
    snprintf(nodes, sizeof nodes, "local,127.0.0.1:%d", port);
    snprintf(spare, sizeof spare, "127.0.0.1:%d", standby_port);
    run_setup(&(setup){.nodes = nodes, .standby = spare, .between = kill_after_7, .cold_here = true, .n_cache = 2});
    if (victim > 0)
        test_stop_stage(victim);
    test_stop_stage(standby);
}

int main(void)
{
    cv_kernels_init(0);
    if (!(model = test_load_stories_path(model_path, sizeof model_path)))
        return test_summary();
    TEST_RUN(test_one_machine);
    TEST_RUN(test_cache_slots);
    TEST_RUN(test_waves);
    TEST_RUN(test_grammar);
    TEST_RUN(test_ngram_drafts);
    TEST_RUN(test_chain);
    TEST_RUN(test_chain_failover);
    convoy_model_free(model);
    return test_summary();
}
