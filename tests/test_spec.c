/* test_spec.c: speculative decoding (issue: speculation across the
 * pipeline), on stories260K.
 * - greedy: 8 prompts x 256 generated tokens; every whole output with
 *   speculation is identical to plain decoding's, on one machine, on 2-
 *   and 3-stage chains of `convoy stage` processes and on a 2-stage chain
 *   whose first stage runs in this process ("local"), with the n-gram drafter
 *   and with a Q4_0 self-draft model (fixed K and automatic K), each prompt
 *   alone and all 8 in shared batches where 6 speculate and 2 decode
 *   plainly;
 * - temperature 1 with a repeat penalty: for 300 seeds, the 24 tokens
 *   sampled with speculation (Q4_0 self-draft, automatic K) are the ones
 *   sampled without, while drafts are both accepted and rejected. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "test.h"
#include "model_test.h"
#include "stage_test.h"

enum { N_PROMPT = 8, N_GEN = 256, N_CTX = 320, K_MAX = 8 };

static char model_path[512], draft_path[512];
static convoy_model *model;

static const char *const prompts[N_PROMPT] = {
    "Once upon a time",
    "Lily and Ben went to the park",
    "The little dog was sad because",
    "One day, a big bird",
    "Tom had a red ball. He",
    "Mom said",
    "There was a girl named Sue who liked to",
    "The sun was hot and the cat",
};

/* One sequence being generated: its whole history and how far it is. */
typedef struct gen {
    int32_t hist[N_CTX];
    int32_t n_prompt, n_hist; /* hist[n_hist - 1] is the newest, not yet run */
    int32_t n_target;         /* n_prompt + N_GEN */
    bool speculate;
} gen;

static void gen_init(gen *g, const char *prompt, bool speculate)
{
    memset(g, 0, sizeof *g);
    g->n_prompt = convoy_tokenize(model, prompt, strlen(prompt), true, false, g->hist, N_CTX);
    g->n_hist = g->n_prompt;
    g->n_target = g->n_prompt + N_GEN;
    g->speculate = speculate;
}

/* One round for the sequences gens[0..n) in slots 0..n-1, in one batch:
 * each feeds what its slot has not run yet (the prompt, then the newest
 * token) and, when speculating, its drafts. Returns 0 or -1. */
static int round_of(convoy_ctx *c, convoy_spec *spec, gen *gens, int n, char *err, size_t errlen)
{
    static int32_t tok[512], pos[512], seq[512], out[512], drafts[N_PROMPT][K_MAX];
    static uint8_t want[512];
    convoy_spec_req reqs[N_PROMPT];
    int n_req = 0;
    for (int s = 0; s < n; s++) /* a round emits at most its drafts + 1 */
        if (gens[s].speculate && gens[s].n_hist < gens[s].n_target)
            reqs[n_req++] = (convoy_spec_req){.seq = s, .hist = gens[s].hist, .n_hist = gens[s].n_hist,
                                              .max_draft = gens[s].n_target - gens[s].n_hist - 1, .drafts = drafts[s]};
    if (n_req && convoy_spec_propose(spec, reqs, n_req, err, errlen))
        return -1;
    int32_t n_draft[N_PROMPT] = {0}, first_row[N_PROMPT];
    for (int r = 0; r < n_req; r++)
        n_draft[reqs[r].seq] = reqs[r].n_draft;
    int nt = 0, nw = 0;
    for (int s = 0; s < n; s++) {
        gen *g = &gens[s];
        first_row[s] = -1;
        if (g->n_hist >= g->n_target)
            continue;
        for (int32_t p = convoy_seq_len(c, s); p < g->n_hist; p++, nt++) {
            tok[nt] = g->hist[p];
            pos[nt] = p;
            seq[nt] = s;
            want[nt] = p == g->n_hist - 1;
        }
        first_row[s] = nw++;
        for (int32_t d = 0; d < n_draft[s]; d++, nt++, nw++) {
            tok[nt] = drafts[s][d];
            pos[nt] = g->n_hist + d;
            seq[nt] = s;
            want[nt] = 2;
        }
    }
    const convoy_batch b = {.n_tokens = nt, .token = tok, .pos = pos, .seq = seq, .want = want};
    if (convoy_step(c, &b, out, err, errlen))
        return -1;
    for (int s = 0; s < n; s++) {
        gen *g = &gens[s];
        if (first_row[s] < 0)
            continue;
        int32_t accepted = 0; /* drafts before the first -1 */
        while (accepted < n_draft[s] && out[first_row[s] + 1 + accepted] >= 0)
            accepted++;
        for (int32_t i = 0; i <= accepted && g->n_hist < g->n_target; i++)
            g->hist[g->n_hist++] = out[first_row[s] + i];
        if (g->speculate)
            convoy_spec_observe(spec, s, n_draft[s], accepted, 0.001);
        if (convoy_seq_len(c, s) != g->n_hist - 1) {
            snprintf(err, errlen, "slot %d holds %d positions after the round, expected %d", s, convoy_seq_len(c, s),
                     g->n_hist - 1);
            return -1;
        }
    }
    return 0;
}

static bool all_done(const gen *gens, int n)
{
    for (int s = 0; s < n; s++)
        if (gens[s].n_hist < gens[s].n_target)
            return false;
    return true;
}

/* Generates gens[0..n) together to the end; slots are emptied after. */
static int generate(convoy_ctx *c, convoy_spec *spec, gen *gens, int n, char *err, size_t errlen)
{
    int rc = 0;
    while (!rc && !all_done(gens, n))
        rc = round_of(c, spec, gens, n, err, errlen);
    for (int s = 0; s < n; s++) {
        convoy_seq_free(c, s, err, errlen);
        if (spec)
            convoy_spec_seq_free(spec, s);
    }
    return rc;
}

/* A context of N_CTX positions per slot, on one machine or (nodes) a chain;
 * NULL (reported) when it cannot be made. */
static convoy_ctx *make_ctx(int32_t n_slot, const char *nodes, const char *split)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_ctx = N_CTX;
    p.n_slot = n_slot;
    p.nodes = nodes;
    p.split = split;
    convoy_ctx *c = convoy_ctx_create(model, &p, err, sizeof err);
    CHECKF(c, "%s", err);
    return c;
}

static gen plain[N_PROMPT];

/* The reference: every prompt alone, plain greedy decoding, one machine. */
static void make_reference(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(1, NULL, NULL);
    for (int i = 0; c && i < N_PROMPT; i++) {
        gen_init(&plain[i], prompts[i], false);
        CHECKF(generate(c, NULL, &plain[i], 1, err, sizeof err) == 0, "%s", err);
    }
    convoy_ctx_free(c);
}

/* Speculative runs on context c: both drafters, K fixed and automatic,
 * alone and batched; every output compared whole with the reference. */
static void check_identical(convoy_ctx *c, const char *where)
{
    const char *drafters[2] = {"ngram", draft_path};
    const int32_t ks[2] = {4, 0};
    char err[512];
    for (int d = 0; d < 2; d++)
        for (int ki = 0; ki < 2; ki++) {
            convoy_spec_params sp = convoy_spec_default_params();
            sp.draft = drafters[d];
            sp.k = ks[ki];
            sp.k_max = K_MAX;
            convoy_spec *spec = convoy_spec_create(c, model, &sp, err, sizeof err);
            CHECKF(spec, "%s", err);
            if (!spec)
                continue;
            gen g[N_PROMPT];
            for (int i = 0; i < N_PROMPT; i++) { /* alone */
                gen_init(&g[0], prompts[i], true);
                CHECKF(generate(c, spec, &g[0], 1, err, sizeof err) == 0, "%s", err);
                CHECKF(g[0].n_hist == plain[i].n_hist && !memcmp(g[0].hist, plain[i].hist, sizeof(int32_t) * g[0].n_hist),
                       "%s, %s drafter, K %d: prompt %d alone differs", where, convoy_spec_drafter(spec), sp.k, i);
            }
            for (int i = 0; i < N_PROMPT; i++) /* batched: the last two decode plainly */
                gen_init(&g[i], prompts[(i + 3) % N_PROMPT], i < N_PROMPT - 2);
            CHECKF(generate(c, spec, g, N_PROMPT, err, sizeof err) == 0, "%s", err);
            for (int i = 0; i < N_PROMPT; i++) {
                const gen *want = &plain[(i + 3) % N_PROMPT];
                CHECKF(g[i].n_hist == want->n_hist && !memcmp(g[i].hist, want->hist, sizeof(int32_t) * want->n_hist),
                       "%s, %s drafter, K %d: prompt %d in a batch differs", where, convoy_spec_drafter(spec), sp.k,
                       (i + 3) % N_PROMPT);
            }
            convoy_spec_stats st;
            convoy_spec_get_stats(spec, &st);
            CHECKF(st.accepted > 0 && st.accepted < st.drafted, "%s: %llu of %llu drafts accepted: both paths run",
                   where, (unsigned long long)st.accepted, (unsigned long long)st.drafted);
            convoy_spec_free(spec);
        }
}

static void test_greedy_identical_unsplit(void)
{
    convoy_ctx *c = make_ctx(N_PROMPT, NULL, NULL);
    if (c)
        check_identical(c, "one machine");
    convoy_ctx_free(c);
}

/* n_nodes stages; with local, the first is this process. */
static void chain_case(int n_nodes, bool local, const char *split)
{
    int port[3];
    pid_t pid[3];
    char nodes[256] = "";
    for (int i = 0; i < n_nodes; i++) {
        if (local && i == 0) {
            snprintf(nodes, sizeof nodes, "local");
            continue;
        }
        pid[i] = test_start_stage(model_path, &port[i]);
        snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), "%s127.0.0.1:%d", i ? "," : "", port[i]);
    }
    convoy_ctx *c = make_ctx(N_PROMPT, nodes, split);
    if (c) {
        char where[64];
        snprintf(where, sizeof where, "%d-stage chain%s", n_nodes, local ? " from a local stage" : "");
        check_identical(c, where);
    }
    convoy_ctx_free(c);
    for (int i = local ? 1 : 0; i < n_nodes; i++)
        test_stop_stage(pid[i]);
}

static void test_greedy_identical_two_stages(void) { chain_case(2, false, "2,3"); }
static void test_greedy_identical_three_stages(void) { chain_case(3, false, "2,2,1"); }
static void test_greedy_identical_local_first_stage(void) { chain_case(2, true, "2,3"); }

/* A draft must follow a wanted token of its slot one position before. */
static void test_misplaced_draft_refused(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(2, NULL, NULL);
    if (!c)
        return;
    int32_t tok[3] = {1, 5, 6}, pos[3] = {0, 1, 0}, seq[3] = {0, 0, 1}, out[3];
    uint8_t want[3] = {0, 2, 2};
    convoy_batch b = {.n_tokens = 3, .token = tok, .pos = pos, .seq = seq, .want = want};
    CHECK(convoy_step(c, &b, out, err, sizeof err) == -1 && strstr(err, "draft"));
    want[0] = 1;
    CHECK(convoy_step(c, &b, out, err, sizeof err) == -1 && strstr(err, "slot 1"));
    want[2] = 1;
    CHECKF(convoy_step(c, &b, out, err, sizeof err) == 0, "%s", err);
    convoy_ctx_free(c);
}

/* ---- temperature > 0 ---- */

enum { N_SEED = 300, N_SAMPLED = 24 };

/* Samples N_SAMPLED tokens after prompt 5 for seeds 1..N_SEED at
 * temperature 1 with a repeat penalty (its history rolls back with the
 * rejected drafts) into out[seed - 1][]. */
static void sample_runs(convoy_ctx *c, convoy_spec *spec, int32_t (*out)[N_SAMPLED])
{
    char err[512];
    for (int i = 0; i < N_SEED; i++) {
        convoy_sampling_params sp = convoy_sampling_default_params();
        sp.temp = 1.0f;
        sp.repeat_penalty = 1.1f;
        sp.seed = (uint64_t)i + 1;
        CHECKF(convoy_set_sampler(c, 0, &sp, err, sizeof err) == 0, "%s", err);
        gen g;
        gen_init(&g, prompts[5], spec != NULL);
        g.n_target = g.n_prompt + N_SAMPLED;
        if (generate(c, spec, &g, 1, err, sizeof err)) {
            CHECKF(0, "%s", err);
            return;
        }
        memcpy(out[i], g.hist + g.n_prompt, sizeof out[i]);
    }
}

static void test_sampled_tokens_identical(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(1, NULL, NULL);
    convoy_spec_params sp = convoy_spec_default_params();
    sp.draft = draft_path;
    sp.k_max = K_MAX; /* round_of's draft buffers */
    convoy_spec *spec = c ? convoy_spec_create(c, model, &sp, err, sizeof err) : NULL;
    CHECKF(spec, "%s", err);
    if (!spec) {
        convoy_ctx_free(c);
        return;
    }
    static int32_t without[N_SEED][N_SAMPLED], with[N_SEED][N_SAMPLED];
    sample_runs(c, NULL, without);
    sample_runs(c, spec, with);
    int differ = 0;
    for (int i = 0; i < N_SEED; i++)
        differ += memcmp(without[i], with[i], sizeof without[i]) != 0;
    CHECKF(differ == 0, "%d of %d seeds sample other tokens with speculation", differ, N_SEED);
    convoy_spec_stats st;
    convoy_spec_get_stats(spec, &st);
    CHECKF(st.accepted > 0 && st.accepted < st.drafted, "%llu of %llu drafts accepted",
           (unsigned long long)st.accepted, (unsigned long long)st.drafted);
    fprintf(stderr, "  temperature 1: %d seeds x %d tokens identical, %llu of %llu drafts accepted\n", N_SEED,
            N_SAMPLED, (unsigned long long)st.accepted, (unsigned long long)st.drafted);
    convoy_spec_free(spec);
    convoy_ctx_free(c);
}

int main(void)
{
    cv_kernels_init(0);
    model = test_load_stories_path(model_path, sizeof model_path);
    if (!model)
        return test_summary();
    test_make_q4_0_draft(model_path, "spec", draft_path, sizeof draft_path);
    TEST_RUN(make_reference);
    TEST_RUN(test_greedy_identical_unsplit);
    TEST_RUN(test_greedy_identical_two_stages);
    TEST_RUN(test_greedy_identical_three_stages);
    TEST_RUN(test_greedy_identical_local_first_stage);
    TEST_RUN(test_misplaced_draft_refused);
    TEST_RUN(test_sampled_tokens_identical);
    unlink(draft_path);
    convoy_model_free(model);
    return test_summary();
}
