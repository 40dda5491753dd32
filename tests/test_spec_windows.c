/* test_spec_windows.c: speculative windows in flight (convoy_generate with
 * a spec of D windows) on stories260K. Every whole output equals plain
 * decoding's on one machine:
 * - greedy and at temperature 0.8 with seeds 1, 2 and 3, for D = 1 to 8
 *   and chosen,
 *   on chains of 1, 2 and 3 `convoy stage` processes, with the n-gram
 *   drafter and a Q4_0 self-draft model, K fixed at 6 (windows both cut
 *   short and accepted whole: the runs must drop stale windows);
 * - with a grammar holding the output to lowercase words;
 * - through a SIGKILL of the middle stage of three, a standby taking its
 *   place while windows are in flight.
 * The last stage's refusal of a draft that follows no sampled row is
 * test_spec's. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "test.h"
#include "model_test.h"
#include "stage_test.h"

enum { N_GEN = 96, N_CTX = 256, N_SEEDS = 3, SPEC_K = 6 };

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

static convoy_ctx *make_ctx(const char *nodes, const char *standby, int32_t depth)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_ctx = N_CTX;
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
static int32_t plain[1 + N_SEEDS + 1][N_GEN], n_plain[1 + N_SEEDS + 1];

static sampling case_sampling(int i) { return (sampling){.seed = i <= N_SEEDS ? (uint64_t)i : 0, .grammar = i > N_SEEDS}; }

static void make_reference(void)
{
    convoy_ctx *c = make_ctx(NULL, NULL, 0);
    run r = {0};
    for (int i = 0; c && i <= N_SEEDS + 1; i++)
        generate(c, NULL, case_sampling(i), &r, plain[i], &n_plain[i]);
    convoy_ctx_free(c);
}

/* Every sampling case with every D on context c; returns the stale windows
 * dropped in all. */
static long check_chain(convoy_ctx *c, const char *draft, const char *where)
{
    long stale = 0;
    for (int32_t d = 0; d <= 8; d++) { /* 0: chosen */
        convoy_spec *spec = make_spec(c, draft, d);
        for (int i = 0; spec && i <= N_SEEDS + 1; i++) {
            int32_t out[N_GEN], n_out = 0;
            run r = {0};
            const int st = generate(c, spec, case_sampling(i), &r, out, &n_out);
            stale += st > 0 ? st : 0;
            CHECKF(n_out == n_plain[i] && !memcmp(out, plain[i], sizeof(int32_t) * (size_t)n_out),
                   "%s, %s drafter, %d windows, case %d: differs from plain decoding", where,
                   convoy_spec_drafter(spec), d, i);
        }
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
    convoy_ctx *c = make_ctx(nodes, NULL, 8);
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

/* The middle of three stages is killed after 30 tokens with 4 windows in
 * flight; a standby takes its place and the output does not change. */
static void test_failover(void)
{
    pid_t pid[4];
    int port[4];
    char nodes[256], standby[64];
    for (int i = 0; i < 4; i++)
        pid[i] = test_start_stage(model_path, &port[i]);
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", port[0], port[1], port[2]);
    snprintf(standby, sizeof standby, "127.0.0.1:%d", port[3]);
    convoy_ctx *c = make_ctx(nodes, standby, 4);
    convoy_spec *spec = c ? make_spec(c, draft_path, 4) : NULL;
    for (int i = 1; spec && i <= 2; i++) { /* seed 1, then greedy after the failover */
        int32_t out[N_GEN], n_out = 0;
        run r = {.kill_pid = i == 1 ? pid[1] : 0, .kill_after = 30};
        generate(c, spec, case_sampling(i == 1 ? 1 : 0), &r, out, &n_out);
        const int ref = i == 1 ? 1 : 0;
        CHECKF(n_out == n_plain[ref] && !memcmp(out, plain[ref], sizeof(int32_t) * (size_t)n_out),
               "run %d: the output changed across the failover", i);
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

int main(void)
{
    cv_kernels_init(0);
    model = test_load_stories_path(model_path, sizeof model_path);
    if (!model)
        return test_summary();
    test_make_q4_0_draft(model_path, "windows", draft_path, sizeof draft_path);
    TEST_RUN(make_reference);
    TEST_RUN(test_one_stage);
    TEST_RUN(test_two_stages);
    TEST_RUN(test_three_stages);
    TEST_RUN(test_failover);
    unlink(draft_path);
    convoy_model_free(model);
    return test_summary();
}
