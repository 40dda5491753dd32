/* test_spec_windows.c: speculative windows in flight on stories260K.
 * Every whole output equals plain decoding's on one machine:
 * - convoy_generate with a spec of D windows, greedy and at temperature
 *   0.8 with seeds 1, 2 and 3, for D = 1 to 8 and chosen (some of them
 *   in the sanitizer suite), on chains of 1,
 *   2 and 3 `convoy stage` processes, with the n-gram drafter and a Q4_0
 *   self-draft model, K fixed at 6 (windows both cut short and accepted
 *   whole: the runs must drop stale windows), and with a grammar holding
 *   the output to lowercase words;
 * - the same cases as requests of `convoy serve`'s scheduler, all five at
 *   once (each with four other users; two of them join while the others'
 *   windows are in flight, so their prompt chunks share batches with
 *   windows), tokens and logprobs;
 * - through a SIGKILL of the middle stage of three, a standby taking its
 *   place while windows are in flight, alone and in the scheduler.
 * The last stage's refusal of a draft that follows no sampled row is
 * test_spec's. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "serve/sched.h"
#include "test.h"
#include "model_test.h"
#include "stage_test.h"

enum { N_GEN = 96, N_CTX = 256, N_SEEDS = 3, SPEC_K = 6, N_CASES = N_SEEDS + 2, LP_TOP = 2 };

static char model_path[512], draft_path[512];
static convoy_model *model;
static const char *const prompt = "Lily and Ben went to the park";
static const char *const grammar = "root ::= [a-z ]+";

/* How a sequence is sampled: greedy (seed 0), or temperature 0.8 with a
 * seed; optionally under the grammar. */
typedef struct sampling {
    uint64_t seed;
    bool grammar;
} sampling;

/* What the generation callback does: stop nothing, or SIGKILL a stage
 * after some tokens. */
typedef struct run {
    int32_t n;
    pid_t kill_pid;
    int32_t kill_after;
} run;

static int on_token(void *user, int32_t id)
{
    (void)id;
    run *r = user;
    if (++r->n == r->kill_after && r->kill_pid > 0)
        test_stop_stage(r->kill_pid);
    return 0;
}

/* Generates N_GEN tokens after the prompt into out (n_out ids), with spec
 * or plainly. */
static int generate(convoy_ctx *c, convoy_spec *spec, sampling s, run *r, int32_t *out, int32_t *n_out)
{
    char err[512];
    int32_t hist[N_CTX];
    const int32_t n_prompt = convoy_tokenize(model, prompt, strlen(prompt), true, false, hist, N_CTX);
    convoy_sampling_params sp = convoy_sampling_default_params();
    sp.temp = s.seed ? 0.8f : 0.0f;
    sp.seed = s.seed;
    convoy_gen_stats st;
    if (convoy_seq_free(c, 0, err, sizeof err) || convoy_set_sampler(c, 0, &sp, err, sizeof err) ||
        (s.grammar && convoy_set_grammar(c, 0, grammar, strlen(grammar), n_prompt, err, sizeof err)) ||
        (spec && (convoy_spec_seq_free(spec, 0), 0)) ||
        convoy_generate(c, spec, 0, hist, n_prompt, N_GEN, on_token, r, &st, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return -1;
    }
    *n_out = st.n_gen;
    memcpy(out, hist + n_prompt, sizeof(int32_t) * (size_t)st.n_gen);
    return st.stale;
}

static convoy_ctx *make_ctx(const char *nodes, const char *standby, int32_t depth, int32_t n_slot)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_ctx = N_CTX;
    p.n_slot = n_slot;
    p.n_threads = 1;
    p.nodes = nodes;
    p.standby = standby;
    p.depth = depth;
    convoy_ctx *c = convoy_ctx_create(model, &p, err, sizeof err);
    CHECKF(c, "%s", err);
    return c;
}

static convoy_spec *make_spec(convoy_ctx *c, const char *draft, int32_t windows)
{
    char err[512];
    convoy_spec_params sp = convoy_spec_default_params();
    sp.draft = draft;
    sp.k = SPEC_K;
    sp.windows = windows;
    convoy_spec *spec = convoy_spec_create(c, model, &sp, err, sizeof err);
    CHECKF(spec, "%s", err);
    return spec;
}

/* The reference outputs: plain decoding on one machine. */
static int32_t plain[N_CASES][N_GEN], n_plain[N_CASES];

static sampling case_sampling(int i) { return (sampling){.seed = i <= N_SEEDS ? (uint64_t)i : 0, .grammar = i > N_SEEDS}; }

static void make_reference(void)
{
    convoy_ctx *c = make_ctx(NULL, NULL, 0, 1);
    run r = {0};
    for (int i = 0; c && i < N_CASES; i++)
        generate(c, NULL, case_sampling(i), &r, plain[i], &n_plain[i]);
    convoy_ctx_free(c);
}

/* ---- the same cases as requests of convoy serve's scheduler ---- */

/* Request i of a scheduler run: case i's prompt and sampling, N_GEN tokens
 * (end-of-generation ids output like any other, as convoy_generate gives
 * them); case 1 asks for logprobs. */
typedef struct job {
    int32_t prompt[N_CTX];
    cv_request_params p;
    cv_request *r;
} job;

static convoy_logprob plain_lp[N_GEN * (1 + LP_TOP)]; /* case 1's, from a plain scheduler on one machine */
static bool have_plain_lp;

static void make_job(job *j, int i)
{
    memset(j, 0, sizeof *j);
    const sampling sm = case_sampling(i);
    j->p.n_prompt = convoy_tokenize(model, prompt, strlen(prompt), true, false, j->prompt, N_CTX);
    j->p.prompt = j->prompt;
    j->p.max_tokens = N_GEN;
    j->p.ignore_eos = true;
    j->p.sampler = convoy_sampling_default_params();
    j->p.sampler.temp = sm.seed ? 0.8f : 0.0f;
    j->p.sampler.seed = sm.seed;
    j->p.top_logprobs = i == 1 ? LP_TOP : -1;
    if (sm.grammar) {
        j->p.grammar = grammar;
        j->p.grammar_len = strlen(grammar);
    }
}

/* Waits until r has n tokens or ended; returns how many it has. */
static int32_t wait_tokens(cv_request *r, int32_t n, cv_finish *f)
{
    int32_t got = 0;
    *f = CV_RUNNING;
    while (got < n && *f == CV_RUNNING)
        got = cv_request_wait(r, got, 1000, f);
    return got;
}

/* Request i's whole output against plain decoding's (case 1's logprobs
 * against plain_lp, or into it for the first, plain, run). */
static void check_job(job *j, int i, const char *where)
{
    cv_finish f;
    const int32_t n = wait_tokens(j->r, N_GEN + 1, &f);
    CHECKF(f == CV_FINISH_LENGTH && n == n_plain[i] &&
               !memcmp(cv_request_tokens(j->r), plain[i], sizeof(int32_t) * (size_t)n),
           "%s, case %d: %d tokens (finish %d) differ from plain decoding's %d", where, i, n, f, n_plain[i]);
    if (i == 1 && n == N_GEN) {
        const size_t bytes = sizeof(convoy_logprob) * (size_t)N_GEN * (1 + LP_TOP);
        if (!have_plain_lp)
            memcpy(plain_lp, cv_request_logprobs(j->r, 0), bytes);
        CHECKF(!memcmp(plain_lp, cv_request_logprobs(j->r, 0), bytes), "%s: the logprobs differ from plain decoding's",
               where);
        have_plain_lp = true;
    }
    cv_request_release(j->r);
}

/* Every case as a request of one scheduler on c, speculating with spec
 * (NULL: plainly): cases 0-2 at once, 3 and 4 once case 0 has 8 tokens;
 * kill_pid, when not 0, is killed once case 0 has 30. */
static void serve_cases(convoy_ctx *c, convoy_spec *spec, pid_t kill_pid, const char *where)
{
    char err[512];
    cv_sched *s = cv_sched_create(c, model, N_CASES, N_CASES, err, sizeof err);
    if (!s || cv_sched_set_spec(s, spec, err, sizeof err)) {
        CHECKF(0, "%s: %s", where, err);
        cv_sched_free(s);
        return;
    }
    static job jobs[N_CASES];
    cv_finish f;
    for (int i = 0; i < N_CASES; i++) {
        make_job(&jobs[i], i);
        if (i == 3)
            wait_tokens(jobs[0].r, 8, &f);
        CHECKF(cv_sched_submit(s, &jobs[i].p, &jobs[i].r, err, sizeof err) == CV_SUBMIT_OK, "%s", err);
    }
    if (kill_pid > 0) {
        wait_tokens(jobs[0].r, 30, &f);
        test_stop_stage(kill_pid);
    }
    for (int i = 0; i < N_CASES; i++)
        check_job(&jobs[i], i, where);
    cv_sched_stats st;
    cv_sched_get_stats(s, &st);
    CHECKF(!spec || st.windows_sent > 0, "%s: no window was counted", where);
    cv_sched_free(s);
}

/* The scheduler's plain run on one machine: the same tokens as
 * convoy_generate's, and case 1's logprobs for the others. */
static void serve_reference(void)
{
    convoy_ctx *c = make_ctx(NULL, NULL, 0, N_CASES);
    if (c)
        serve_cases(c, NULL, 0, "plain scheduler");
    convoy_ctx_free(c);
}

/* Every sampling case with each D (0: chosen) on context c; returns the
 * stale windows dropped in all. The sanitizer suite, ten times slower,
 * takes chosen, one, three and eight; the release suite every D. */
static long check_chain(convoy_ctx *c, const char *draft, const char *where)
{
    static const int32_t every_d[] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, some_d[] = {0, 1, 3, 8};
    const bool sanitized = getenv("CONVOY_SANITIZED") != NULL;
    const int32_t *ds = sanitized ? some_d : every_d;
    const int n_d = sanitized ? (int)(sizeof some_d / sizeof *some_d) : (int)(sizeof every_d / sizeof *every_d);
    long stale = 0;
    for (int j = 0; j < n_d; j++) {
        const int32_t d = ds[j];
        convoy_spec *spec = make_spec(c, draft, d);
        for (int i = 0; spec && i < N_CASES; i++) {
            int32_t out[N_GEN], n_out = 0;
            run r = {0};
            const int st = generate(c, spec, case_sampling(i), &r, out, &n_out);
            stale += st > 0 ? st : 0;
            CHECKF(n_out == n_plain[i] && !memcmp(out, plain[i], sizeof(int32_t) * (size_t)n_out),
                   "%s, %s drafter, %d windows, case %d: differs from plain decoding", where,
                   convoy_spec_drafter(spec), d, i);
        }
        char in_serve[128];
        snprintf(in_serve, sizeof in_serve, "%s, %s drafter, %d windows, scheduler", where,
                 spec ? convoy_spec_drafter(spec) : "-", d);
        if (spec)
            serve_cases(c, spec, 0, in_serve);
        convoy_spec_free(spec);
    }
    return stale;
}

static void chain_case(int n_nodes)
{
    pid_t pid[3];
    int port[3];
    char nodes[256] = "", where[64];
    for (int i = 0; i < n_nodes; i++) {
        pid[i] = test_start_stage(model_path, &port[i]);
        snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), "%s127.0.0.1:%d", i ? "," : "", port[i]);
    }
    convoy_ctx *c = make_ctx(nodes, NULL, 8, N_CASES);
    snprintf(where, sizeof where, "%d-stage chain", n_nodes);
    const char *drafts[2] = {"ngram", draft_path};
    for (int k = 0; c && k < 2; k++) {
        const long stale = check_chain(c, drafts[k], where);
        CHECKF(stale > 0, "%s, %s: no window was ever dropped: the cut path did not run", where, drafts[k]);
    }
    convoy_ctx_free(c);
    for (int i = 0; i < n_nodes; i++)
        test_stop_stage(pid[i]);
}

static void test_one_stage(void) { chain_case(1); }
static void test_two_stages(void) { chain_case(2); }
static void test_three_stages(void) { chain_case(3); }

/* Seed 1 with the middle stage killed after 30 tokens, then greedy after
 * the failover, by convoy_generate. */
static void generate_through(convoy_ctx *c, convoy_spec *spec, pid_t victim)
{
    for (int i = 1; i <= 2; i++) {
        int32_t out[N_GEN], n_out = 0;
        run r = {.kill_pid = i == 1 ? victim : 0, .kill_after = 30};
        generate(c, spec, case_sampling(i == 1 ? 1 : 0), &r, out, &n_out);
        const int ref = i == 1 ? 1 : 0;
        CHECKF(n_out == n_plain[ref] && !memcmp(out, plain[ref], sizeof(int32_t) * (size_t)n_out),
               "run %d: the output changed across the failover", i);
    }
}

/* The middle of three stages is killed with 4 windows in flight (alone, or
 * while the scheduler runs every case); a standby takes its place and no
 * output changes. */
static void failover_case(bool in_serve)
{
    pid_t pid[4];
    int port[4];
    char nodes[256], standby[64];
    for (int i = 0; i < 4; i++)
        pid[i] = test_start_stage(model_path, &port[i]);
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", port[0], port[1], port[2]);
    snprintf(standby, sizeof standby, "127.0.0.1:%d", port[3]);
    convoy_ctx *c = make_ctx(nodes, standby, 4, N_CASES);
    convoy_spec *spec = c ? make_spec(c, draft_path, 4) : NULL;
    if (spec && in_serve) {
        serve_cases(c, spec, pid[1], "failover, scheduler");
        serve_cases(c, spec, 0, "after the failover, scheduler");
    } else if (spec) {
        generate_through(c, spec, pid[1]);
    }
    convoy_ctx_stats st;
    if (c)
        convoy_ctx_get_stats(c, &st);
    CHECKF(c && st.failovers >= 1, "no failover happened");
    convoy_spec_free(spec);
    convoy_ctx_free(c);
    for (int i = 0; i < 4; i++)
        if (i != 1)
            test_stop_stage(pid[i]);
    waitpid(pid[1], NULL, 0);
}

static void test_failover(void) { failover_case(false); }
static void test_serve_failover(void) { failover_case(true); }

int main(void)
{
    cv_kernels_init(0);
    model = test_load_stories_path(model_path, sizeof model_path);
    if (!model)
        return test_summary();
    test_make_q4_0_draft(model_path, "windows", draft_path, sizeof draft_path);
    TEST_RUN(make_reference);
    TEST_RUN(serve_reference);
    TEST_RUN(test_one_stage);
    TEST_RUN(test_two_stages);
    TEST_RUN(test_three_stages);
    TEST_RUN(test_failover);
    TEST_RUN(test_serve_failover);
    unlink(draft_path);
    convoy_model_free(model);
    return test_summary();
}
