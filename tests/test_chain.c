/* test_chain.c: the head's side of a pipeline, in process, against two
 * `convoy stage` processes on loopback.
 * - micro-batches: four sequences in two groups, with both groups in
 *   flight at once (each stage works on a different group), give every
 *   sequence the tokens it gets alone on one machine, on two remote stages
 *   and on a local first stage ("local") with one remote stage;
 * - an F16 KV cache (--kv-type f16) reaches every stage: step by step, the
 *   chain's logits are one machine's with an F16 cache, bit for bit; each
 *   stage's time of every batch comes back (the trail): both stages are
 *   measured, and a plan made again from the measurements covers the model;
 * - log-probabilities through a local first stage and a remote last one,
 *   greedy and with temperature, with drafts accepted and rejected, and
 *   with none asked for: bit for bit cv_logprobs_row over one machine's
 *   logits, and none for a row that a rejected draft left empty;
 * - "local" anywhere but first is refused;
 * - a stage killed with SIGKILL: the step fails with a message naming the
 *   node, and this process (the head) goes on: a new chain over a fresh
 *   node works. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer/span.h"
#include "kernels/kernels.h"
#include "pipe/chain.h"
#include "test.h"
#include "stage_test.h"

enum { N_SEQ = 4, N_GEN = 24, PROMPT = 4 };

static char model[512];

static int32_t prompt_of(int s, int i) { return i == 0 ? 1 : 3 + (s * 131 + i * 17) % 500; }

/* Options of a 2-node chain with the small context and batch of these tests. */
static cv_chain_opts small_opts(const char **nodes)
{
    cv_chain_opts o = cv_chain_default_opts();
    o.nodes = nodes;
    o.n_nodes = 2;
    o.n_ctx = 64;
    o.n_batch = 8;
    return o;
}

enum { KV_STEPS = 8, KV_VOCAB = 512 };

/* One machine (stage) or a chain, stepped one batch at a time. */
typedef struct target {
    cv_span *stage;
    cv_chain *chain;
} target;

/* Sequence s alone in slot 0: its prompt, then greedy tokens, n steps in
 * all; tokens[g] and, when logits is set, logits[g] are step g's. */
static void run_sequence(target *t, int s, int n, int32_t *tokens, float (*logits)[KV_VOCAB])
{
    char err[512];
    int32_t tok[PROMPT], pos[PROMPT], seq[PROMPT] = {0}, next;
    uint8_t want[PROMPT] = {0, 0, 0, 1};
    for (int i = 0; i < PROMPT; i++) {
        tok[i] = prompt_of(s, i);
        pos[i] = i;
    }
    cv_batch b = {.n_tokens = PROMPT, .token = tok, .pos = pos, .seq = seq, .want = want};
    for (int g = 0; g < n; g++) {
        if (t->stage ? cv_span_step(t->stage, &b, NULL, NULL, &next, err, sizeof err)
                     : cv_chain_step(t->chain, &b, &next, err, sizeof err)) {
            CHECKF(0, "%s", err);
            return;
        }
        if (tokens)
            tokens[g] = next;
        if (logits)
            memcpy(logits[g], t->stage ? cv_span_logits(t->stage, 0) : cv_chain_logits(t->chain, 0),
                   sizeof logits[g]);
        tok[0] = next;
        pos[0] = PROMPT + g;
        want[0] = 1;
        b.n_tokens = 1;
    }
}

/* A one-slot stage of the whole model on this machine. */
static bool open_alone(cv_span *st, bool kv_f16)
{
    char err[512];
    const cv_span_params p = {.l0 = 0, .l1 = -1, .n_threads = 1, .n_ctx = 64, .n_slot = 1, .n_batch = 8,
                               .kv_f16 = kv_f16};
    if (cv_span_open(st, model, &p, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return false;
    }
    return true;
}

/* Each sequence alone on one machine. */
static void run_alone(int32_t out[N_SEQ][N_GEN])
{
    for (int s = 0; s < N_SEQ; s++) {
        cv_span st;
        if (!open_alone(&st, false))
            return;
        run_sequence(&(target){.stage = &st}, s, N_GEN, out[s], NULL);
        cv_span_close(&st);
    }
}

/* Builds group g's next batch: sequences 2g and 2g+1, their prompts first. */
static void group_batch(int g, int step, int32_t got[N_SEQ][N_GEN], int32_t *tok, int32_t *pos, int32_t *seq,
                        uint8_t *want, cv_batch *b)
{
    int n = 0;
    for (int s = 2 * g; s < 2 * g + 2; s++) {
        if (step == 0) {
            for (int i = 0; i < PROMPT; i++, n++) {
                tok[n] = prompt_of(s, i);
                pos[n] = i;
                seq[n] = s;
                want[n] = i == PROMPT - 1;
            }
        } else {
            tok[n] = got[s][step - 1];
            pos[n] = PROMPT + step - 1;
            seq[n] = s;
            want[n] = 1;
            n++;
        }
    }
    *b = (cv_batch){.n_tokens = n, .token = tok, .pos = pos, .seq = seq, .want = want};
}

/* Two stages, layers 2 + 3: the first a `convoy stage` or, with local,
 * this process. */
static void micro_batches_match_alone(bool local)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    int32_t alone[N_SEQ][N_GEN], got[N_SEQ][N_GEN];
    run_alone(alone);
    int p1 = 0, p2;
    pid_t s1 = local ? 0 : test_start_stage(model, &p1), s2 = test_start_stage(model, &p2);
    char a1[64], a2[64], err[512];
    snprintf(a1, sizeof a1, local ? CV_CHAIN_LOCAL : "127.0.0.1:%d", p1);
    snprintf(a2, sizeof a2, "127.0.0.1:%d", p2);
    const char *nodes[2] = {a1, a2};
    const int32_t split[2] = {2, 3};
    cv_chain_opts o = small_opts(nodes);
    o.split = split;
    o.n_slot = N_SEQ;
    cv_chain *c;
    CHECKF(cv_chain_open(&c, model, &o, err, sizeof err) == 0, "%s", err);
    if (c) {
        CHECK(cv_chain_depth(c) == 2);
        int32_t tok[2][8], pos[2][8], seq[2][8], out[8], n_out;
        uint8_t want[2][8];
        cv_batch b[2];
        /* both groups in flight: group 0 on stage 2 while group 1 is on stage 1 */
        for (int g = 0; g < 2; g++) {
            group_batch(g, 0, got, tok[g], pos[g], seq[g], want[g], &b[g]);
            CHECKF(cv_chain_submit(c, &b[g], err, sizeof err) == 0, "%s", err);
        }
        CHECK(cv_chain_in_flight(c) == 2);
        CHECK(cv_chain_submit(c, &b[0], err, sizeof err) == -1 && strstr(err, "in flight"));
        for (int step = 0; step < N_GEN; step++)
            for (int g = 0; g < 2; g++) {
                if (cv_chain_collect(c, out, &n_out, err, sizeof err)) {
                    CHECKF(0, "%s", err);
                    step = N_GEN;
                    break;
                }
                CHECK(n_out == 2);
                got[2 * g][step] = out[0];
                got[2 * g + 1][step] = out[1];
                if (step + 1 < N_GEN) {
                    group_batch(g, step + 1, got, tok[g], pos[g], seq[g], want[g], &b[g]);
                    CHECKF(cv_chain_submit(c, &b[g], err, sizeof err) == 0, "%s", err);
                }
            }
        CHECK(memcmp(alone, got, sizeof alone) == 0);
        cv_chain_stats st;
        cv_chain_get_stats(c, &st);
        CHECK(st.n_local == (local ? 2 : 0) && st.n_nodes == (local ? 1 : 2));
        cv_chain_close(c);
    }
    if (!local)
        test_stop_stage(s1);
    test_stop_stage(s2);
}

static void test_micro_batches_match_alone(void) { micro_batches_match_alone(false); }
static void test_micro_batches_local_first_stage(void) { micro_batches_match_alone(true); }

/* A chain of this process (layers 2) and one `convoy stage` (layers 3),
 * with o's other options; *stage receives the stage's pid. */
static cv_chain *open_local_and_stage(cv_chain_opts o, pid_t *stage)
{
    static char addr[64]; /* the chain keeps o */
    static const char *nodes[2] = {CV_CHAIN_LOCAL, addr};
    static const int32_t split[2] = {2, 3};
    int port;
    *stage = test_start_stage(model, &port);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    o.nodes = nodes;
    o.n_nodes = 2;
    o.split = split;
    char err[512];
    cv_chain *c;
    CHECKF(cv_chain_open(&c, model, &o, err, sizeof err) == 0, "%s", err);
    return c;
}

/* Sequence 0 alone on one machine: the logits of its prompt's last token,
 * then of each greedy token after it. */
static void alone_logits(bool kv_f16, float out[KV_STEPS][KV_VOCAB])
{
    cv_span st;
    if (!open_alone(&st, kv_f16))
        return;
    CHECK(st.model.hp.n_vocab == KV_VOCAB);
    run_sequence(&(target){.stage = &st}, 0, KV_STEPS, NULL, out);
    cv_span_close(&st);
}

/* After some steps of open_local_and_stage's chain: both stages measured,
 * and the plan made again from them is the pinned split, with a time. */
static void check_costs(cv_chain *c)
{
    cv_chain_costs m;
    cv_chain_get_costs(c, &m);
    CHECK(m.n_nodes == 2 && m.batches >= KV_STEPS && !strcmp(m.addr[0], CV_CHAIN_LOCAL));
    CHECKF(m.us_measured[0] > 0 && m.us_measured[1] > 0, "measured %.3f and %.3f us", m.us_measured[0],
           m.us_measured[1]);
    CHECK(m.first[0] == 0 && m.last[0] == 2 && m.first[1] == 2 && m.last[1] == 5);
    cv_plan_result best;
    double us_now = 0;
    char err[512];
    const double known[2] = {0, 0};
    CHECKF(cv_chain_replan(c, known, &best, &us_now, err, sizeof err) == 0, "%s", err);
    CHECK(us_now > 0 && best.us_token == us_now && best.last[0] == 2 && best.last[1] == 5);
}

static void test_kv_f16_on_every_stage(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    static float f16[KV_STEPS][KV_VOCAB], f32[KV_STEPS][KV_VOCAB], chain[KV_STEPS][KV_VOCAB];
    alone_logits(true, f16);
    alone_logits(false, f32);
    CHECK(memcmp(f16, f32, sizeof f16) != 0); /* else this test could not tell them apart */
    cv_chain_opts o = small_opts(NULL);
    o.kv_f16 = true;
    o.want_logits = true;
    pid_t s;
    cv_chain *c = open_local_and_stage(o, &s);
    if (c) {
        run_sequence(&(target){.chain = c}, 0, KV_STEPS, NULL, chain);
        CHECK(memcmp(chain, f16, sizeof chain) == 0);
        check_costs(c);
        cv_chain_close(c);
    }
    test_stop_stage(s);
}

enum { LP_STEPS = 8, LP_GEN = 3 * LP_STEPS, LP_ROWS = 3 };

/* Every wanted row of a run: its token, log-probability count and entries
 * (zero past the count, so that two runs compare with memcmp). */
typedef struct lp_run {
    int32_t token[LP_GEN][LP_ROWS];
    int32_t n[LP_GEN][LP_ROWS];
    cv_logprob lp[LP_GEN][LP_ROWS][1 + CV_MAX_TOP_LOGPROBS];
} lp_run;

/* Takes the wanted rows of a step into step g of out: cv_chain_logprobs on
 * a chain, cv_logprobs_row over the logits (as convoy_logprobs computes
 * them) on one machine. Returns the last emitted token; *emitted counts. */
static int32_t take_logprobs(target *t, int32_t k, int g, int n_rows, const int32_t *got, int32_t *emitted,
                             lp_run *out)
{
    int32_t last = -1;
    for (int i = 0; i < n_rows; i++) {
        out->token[g][i] = got[i];
        if (t->chain) {
            out->n[g][i] = cv_chain_logprobs(t->chain, i, out->lp[g][i]);
        } else if (got[i] >= 0 && k >= 0) {
            cv_logprobs_row(cv_span_logits(t->stage, i), t->stage->model.hp.n_vocab, got[i], k, out->lp[g][i]);
            out->n[g][i] = 1 + k;
        }
        if (got[i] >= 0) {
            last = got[i];
            (*emitted)++;
        }
    }
    return last;
}

/* Sequence 0 in slot 0, sampled with sp and k alternatives (-1: none): its
 * prompt, then `steps` steps of its last token, each followed, when guess
 * (the tokens of a run without drafts) is given, by two drafts from it:
 * both right, the first wrong, the second wrong, in turn. */
static void run_logprobs(target *t, const cv_sampler_params *sp, int32_t k, const int32_t *guess, int steps,
                         lp_run *out)
{
    char err[512];
    memset(out, 0, sizeof *out);
    CHECKF((t->stage ? cv_span_set_sampler(t->stage, 0, sp, err, sizeof err)
                     : cv_chain_set_sampler(t->chain, 0, sp, k, err, sizeof err)) == 0,
           "%s", err);
    int32_t tok[PROMPT], pos[PROMPT], seq[PROMPT] = {0}, got[LP_ROWS], emitted = 0;
    uint8_t want[PROMPT] = {0, 0, 0, 1};
    for (int i = 0; i < PROMPT; i++) {
        tok[i] = prompt_of(0, i);
        pos[i] = i;
    }
    cv_batch b = {.n_tokens = PROMPT, .token = tok, .pos = pos, .seq = seq, .want = want};
    int n_rows = 1;
    for (int g = 0; g < steps; g++) {
        if (t->stage ? cv_span_step(t->stage, &b, NULL, NULL, got, err, sizeof err)
                     : cv_chain_step(t->chain, &b, got, err, sizeof err)) {
            CHECKF(0, "%s", err);
            return;
        }
        tok[0] = take_logprobs(t, k, g, n_rows, got, &emitted, out);
        pos[0] = PROMPT + emitted - 1;
        want[0] = CV_WANT_SAMPLE;
        for (int d = 1; guess && d < LP_ROWS; d++) { /* draft d guesses what row d - 1 samples */
            tok[d] = g % 3 == d ? (guess[emitted + d - 1] + 1) % KV_VOCAB : guess[emitted + d - 1];
            pos[d] = pos[0] + d;
            want[d] = CV_WANT_DRAFT;
        }
        b.n_tokens = n_rows = guess ? LP_ROWS : 1;
    }
}

/* run_logprobs on one machine and on the chain; they must match bit for
 * bit. Returns the one machine's run. */
static void compare_logprobs(cv_chain *c, const cv_sampler_params *sp, int32_t k, const int32_t *guess, int steps,
                             lp_run *alone)
{
    static lp_run chain;
    char err[512];
    cv_span st;
    if (!open_alone(&st, false))
        return;
    run_logprobs(&(target){.stage = &st}, sp, k, guess, steps, alone);
    cv_span_close(&st);
    CHECKF(cv_chain_seq_free(c, 0, err, sizeof err) == 0, "%s", err);
    run_logprobs(&(target){.chain = c}, sp, k, guess, steps, &chain);
    CHECKF(memcmp(alone, &chain, sizeof chain) == 0, "temp %.1f, %d alternatives, %s drafts: the chain's "
           "log-probabilities differ from one machine's", sp->temp, k, guess ? "with" : "without");
}

static void test_logprobs_match_one_machine(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    pid_t s;
    cv_chain *c = open_local_and_stage(small_opts(NULL), &s);
    cv_sampler_params greedy = cv_sampler_default_params(), warm = greedy;
    greedy.temp = 0;
    warm.temp = 0.8f;
    warm.seed = 7;
    const struct {
        const cv_sampler_params *sp;
        int32_t k;
    } cases[] = {{&greedy, 5}, {&warm, CV_MAX_TOP_LOGPROBS}, {&warm, 0}, {&greedy, -1}};
    for (size_t i = 0; c && i < sizeof cases / sizeof cases[0]; i++) {
        static lp_run plain, drafted;
        compare_logprobs(c, cases[i].sp, cases[i].k, NULL, LP_GEN, &plain);
        int32_t guess[LP_GEN];
        for (int g = 0; g < LP_GEN; g++)
            guess[g] = plain.token[g][0];
        compare_logprobs(c, cases[i].sp, cases[i].k, guess, LP_STEPS, &drafted);
        int emitted = 0, rejected = 0, with_logprobs = 0;
        for (int g = 0; g < LP_STEPS; g++)
            for (int r = 0; r < (g ? LP_ROWS : 1); r++) {
                const int32_t t = drafted.token[g][r];
                if (t >= 0)
                    CHECKF(t == guess[emitted++], "drafts change the tokens (step %d row %d)", g, r);
                rejected += t < 0;
                with_logprobs += drafted.n[g][r] > 0;
                CHECK(drafted.n[g][r] == (t >= 0 ? 1 + cases[i].k : 0));
            }
        CHECKF(emitted > LP_STEPS && rejected > 0, "%d tokens, %d rows rejected: drafts both accepted and rejected",
               emitted, rejected);
        CHECK(with_logprobs == (cases[i].k < 0 ? 0 : emitted));
    }
    cv_chain_close(c);
    test_stop_stage(s);
}

static void test_local_only_first(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    int p1;
    pid_t s1 = test_start_stage(model, &p1);
    char a1[64], err[512];
    snprintf(a1, sizeof a1, "127.0.0.1:%d", p1);
    const char *nodes[2] = {a1, CV_CHAIN_LOCAL};
    cv_chain_opts o = small_opts(nodes);
    cv_chain *c;
    CHECK(cv_chain_open(&c, model, &o, err, sizeof err) == -1 && c == NULL);
    CHECKF(strstr(err, "first node") != NULL, "%s", err);
    /* every layer to this machine leaves nothing to sample remotely */
    const int32_t split[2] = {5, 0};
    nodes[0] = CV_CHAIN_LOCAL;
    nodes[1] = a1;
    o.split = split;
    CHECK(cv_chain_open(&c, model, &o, err, sizeof err) == -1 && c == NULL);
    CHECKF(strstr(err, "every layer") != NULL, "%s", err);
    test_stop_stage(s1);
}

static void test_killed_stage_reported_head_survives(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    int p1, p2, p3;
    pid_t s1 = test_start_stage(model, &p1), s2 = test_start_stage(model, &p2);
    char a1[64], a2[64], a3[64], err[512];
    snprintf(a1, sizeof a1, "127.0.0.1:%d", p1);
    snprintf(a2, sizeof a2, "127.0.0.1:%d", p2);
    const char *nodes[2] = {a1, a2};
    const int32_t split[2] = {2, 3}; /* both nodes serve: the planner may leave one out */
    cv_chain_opts o = small_opts(nodes);
    o.split = split;
    o.io_timeout_ms = 3000;
    cv_chain *c;
    CHECKF(cv_chain_open(&c, model, &o, err, sizeof err) == 0, "%s", err);
    if (c) {
        int32_t tok = 1, pos = 0, seq = 0, next;
        uint8_t want = 1;
        cv_batch b = {.n_tokens = 1, .token = &tok, .pos = &pos, .seq = &seq, .want = &want};
        CHECKF(cv_chain_step(c, &b, &next, err, sizeof err) == 0, "%s", err);
        test_stop_stage(s2);
        tok = next;
        pos = 1;
        CHECK(cv_chain_step(c, &b, &next, err, sizeof err) == -1);
        CHECKF(strstr(err, a2) != NULL, "message does not name %s: %s", a2, err);
        fprintf(stderr, "  after SIGKILL: %s\n", err);
        cv_chain_close(c);
    }
    /* the head goes on: a new chain with a fresh second node */
    pid_t s3 = test_start_stage(model, &p3);
    snprintf(a3, sizeof a3, "127.0.0.1:%d", p3);
    nodes[1] = a3;
    CHECKF(cv_chain_open(&c, model, &o, err, sizeof err) == 0, "%s", err);
    if (c) {
        int32_t tok = 1, pos = 0, seq = 0, next;
        uint8_t want = 1;
        cv_batch b = {.n_tokens = 1, .token = &tok, .pos = &pos, .seq = &seq, .want = &want};
        CHECKF(cv_chain_step(c, &b, &next, err, sizeof err) == 0, "%s", err);
        cv_chain_close(c);
    }
    test_stop_stage(s1);
    test_stop_stage(s3);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    cv_kernels_init(0);
    TEST_RUN(test_micro_batches_match_alone);
    TEST_RUN(test_micro_batches_local_first_stage);
    TEST_RUN(test_kv_f16_on_every_stage);
    TEST_RUN(test_logprobs_match_one_machine);
    TEST_RUN(test_local_only_first);
    TEST_RUN(test_killed_stage_reported_head_survives);
    return test_summary();
}
