/* test_simulate.c: the pipeline simulation of `convoy plan` against what
 * can be worked out by hand: one user waits for every stage and hop; as
 * many users as stages keep the slowest stage busy; a window emits its
 * accepted drafts plus one; windows in flight fill the stages; a cut window
 * makes the ones behind it stale; a stage's measured times at 1, 2, 4, 8
 * and 16 rows are joined by lines; attention grows with the context; stages
 * on one CPU share it when they compute at once; a prompt's chunks
 * pipeline; and the
 * forecast (convoy.h) from stated figures: the plan, and a lone node's
 * speed as its bandwidth over the model's bytes. */
#include <math.h>
#include <string.h>

#include "convoy.h"
#include "pipe/simulate.h"
#include "test.h"

#define NEAR(x, want, rel) (fabs((double)(x) - (want)) <= (rel) * fabs((double)(want)))

/* n equal stages of `work` mean layers at us per layer (no further-row
 * cost unless given), hops of hop_us. */
static cv_sim_chain chain(int n, double work, double us, double us_row, double hop_us)
{
    cv_sim_chain c = {.n_stages = n};
    for (int i = 0; i < n; i++)
        c.stage[i] = (cv_sim_stage){.work = work, .us_layer = us, .us_row = us_row};
    for (int i = 0; i <= n; i++)
        c.hop[i] = (cv_sim_hop){.us = hop_us};
    return c;
}

static cv_sim_load load(int32_t users, int32_t depth)
{
    return (cv_sim_load){.users = users, .depth = depth, .windows = 1, .tokens = 400, .n_batch = 512};
}

static void test_one_user_waits_for_every_stage(void)
{
    const cv_sim_chain c = chain(3, 4, 250, 0, 100); /* 1000 us a stage, 4 hops of 100 */
    cv_sim_result r;
    cv_sim_run(&c, &(cv_sim_load){.users = 1, .depth = 3, .windows = 1, .tokens = 100}, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / 3400, 1e-9), "%f", r.tok_s);
    CHECK(NEAR(r.busy[0], 1000.0 / 3400, 1e-9));
}

static void test_users_fill_the_stages(void)
{
    /* 3 users in 3 groups: each stage busy all the time once full, a token
     * per stage time; the slowest stage sets it when they differ */
    cv_sim_chain c = chain(3, 4, 250, 0, 100);
    cv_sim_result r;
    cv_sim_load l = load(3, 3);
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 3e6 / 3400, 0.01), "3 users, round trip 3400: %f", r.tok_s);
    c.stage[1].us_layer = 1000; /* 4000 us: the round trip 6400 us holds 1.6 of its batches */
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / 4000, 0.02), "slow stage: %f", r.tok_s);
    CHECK(r.busiest == 1 && r.busy[1] > 0.97);
    /* 6 users in 3 groups of 2 rows: a further row costs 100 us per layer */
    c = chain(3, 4, 250, 100, 100);
    l.users = 6;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 6e6 / (3 * 1400 + 400), 0.01), "2 rows a batch: %f", r.tok_s);
}

static void test_windows(void)
{
    /* K = 3 every draft accepted: a window emits 4 tokens; alone, the round
     * trip of 4 rows (stages 1000 + 3 * 400 each) */
    cv_sim_chain c = chain(2, 4, 250, 100, 100);
    cv_sim_load l = {.users = 1, .depth = 2, .spec_k = 3, .drafts = 3, .windows = 1, .accept = 1, .tokens = 400};
    cv_sim_result r;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 4e6 / (2 * 2200 + 300), 1e-6), "K=3 accepted: %f", r.tok_s);
    /* none accepted: one token a window */
    l.accept = 0;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / (2 * 2200 + 300), 1e-6), "none accepted: %f", r.tok_s);
    /* two windows in flight, every draft accepted: two a round trip (the
     * stages' 2200 us each do not bind) */
    l = (cv_sim_load){.users = 1, .depth = 2, .spec_k = 3, .drafts = 3, .windows = 2, .accept = 1, .tokens = 800};
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 8e6 / 4700, 0.02), "2 windows: %f", r.tok_s);
    /* none accepted: the window behind each is stale, one token a round trip */
    l.accept = 0;
    l.tokens = 200;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / (2 * 2200 + 300), 0.02), "2 windows, none accepted: %f", r.tok_s);
    /* half accepted: between the two */
    l.accept = 0.5;
    cv_sim_run(&c, &l, &r);
    CHECK(r.tok_s > 1e6 / (2 * 2200 + 300) && r.tok_s < 4e6 / 2200);
    /* two windows in flight, the drafter finding nothing: none behind the
     * first, plain decoding's speed */
    l = (cv_sim_load){.users = 1, .depth = 2, .spec_k = 3, .drafts = 0, .windows = 2, .accept = 1, .tokens = 400};
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / (2 * 1000 + 300), 1e-6), "2 windows, no drafts: %f", r.tok_s);
    /* the drafter finds nothing: windows of one row, plain decoding's speed */
    l = (cv_sim_load){.users = 1, .depth = 2, .spec_k = 3, .drafts = 0, .windows = 1, .accept = 1, .tokens = 400};
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / (2 * 1000 + 300), 1e-6), "no drafts: %f", r.tok_s);
}

static void test_context_and_shared_cpus(void)
{
    /* one stage of one layer: 100 us a token plus 1 us for each position
     * attended; 100 tokens after a prompt of 100: 100 * 200 + 0 + ... + 99 us */
    cv_sim_chain c = chain(1, 1, 100, 0, 0);
    c.stage[0].layers = 1;
    c.stage[0].us_pos = 1;
    cv_sim_load l = {.users = 1, .depth = 1, .windows = 1, .tokens = 100, .prompt = 100, .n_batch = 512};
    cv_sim_result r;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 100 / 24950e-6, 1e-9), "%f", r.tok_s);
    /* two users on two stages of 1000 us: both busy, a token each 1000 us;
     * the stages on one CPU take turns: a token each 2000 us */
    c = chain(2, 4, 250, 0, 0);
    l = load(2, 2);
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / 1000, 0.01), "own CPUs: %f", r.tok_s);
    c.stage[0].cpu = c.stage[1].cpu = 7;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 1e6 / 2000, 0.01), "one CPU: %f", r.tok_s);
    /* 4 stages of 1000 us, the first two on one CPU, two users: when one
     * user's batch reaches stage 1 the other's starts on stage 0, they
     * share the CPU and both take 2000 us; then 1000 us alone on stage 1
     * and 2000 us on stages 2 and 3, where the first user's batch is back
     * on stage 0 alone: two tokens each 5000 us (taking turns, 4000) */
    c = chain(4, 4, 250, 0, 0);
    c.stage[0].cpu = c.stage[1].cpu = 7;
    cv_sim_run(&c, &l, &r);
    CHECKF(NEAR(r.tok_s, 2e6 / 5000, 0.01), "sharing a CPU: %f", r.tok_s);
}

static void test_measured_sizes(void)
{
    /* 2 mean layers; per layer 100, 110, 130, 200 and 400 us at 1, 2, 4,
     * 8 and 16 rows: 3 rows halfway between 2 and 4, 32 rows on the last
     * segment's slope (25 us a row) */
    cv_sim_stage s = {.work = 2, .us_rows = {100, 110, 130, 200, 400}, .us_layer = 1, .us_row = 1};
    CHECK(NEAR(cv_sim_stage_us(&s, 1, 0), 200, 1e-12));
    CHECK(NEAR(cv_sim_stage_us(&s, 3, 0), 240, 1e-12));
    CHECK(NEAR(cv_sim_stage_us(&s, 8, 0), 400, 1e-12));
    CHECK(NEAR(cv_sim_stage_us(&s, 32, 0), 1600, 1e-12));
    s.us_rows[0] = 0; /* none measured: the line */
    CHECK(NEAR(cv_sim_stage_us(&s, 3, 0), 6, 1e-12));
}

static void test_prompt_chunks_pipeline(void)
{
    /* 1024 tokens on 2 stages at 10 us a row: 10.24 ms on each stage. In
     * chunks (a quarter of a stage's share of what is left, 64 at least)
     * the second stage works on one while the first computes the next: the
     * first token comes after the first stage's 10.24 ms and little more,
     * not after both stages' 20.48 ms */
    cv_sim_chain c = chain(2, 1, 10, 10, 0);
    cv_sim_load l = {.users = 1, .depth = 2, .windows = 1, .tokens = 1, .prompt = 1024, .n_batch = 512};
    cv_sim_result r;
    cv_sim_run(&c, &l, &r);
    CHECKF(r.ttft_s > 10.24e-3 && r.ttft_s < 0.6 * 20.48e-3, "ttft %f s", r.ttft_s);
}

static void test_forecast_from_stated_figures(void)
{
    convoy_synth_params shape = convoy_synth_default_params();
    shape.n_embd = 4096, shape.n_layer = 32, shape.n_head = 32, shape.n_head_kv = 8, shape.n_ff = 14336;
    shape.n_vocab = 32000, shape.type = "Q4_0";
    convoy_fleet f = {.n_nodes = 2};
    f.node[0] = (convoy_fleet_node){.name = "big", .mem_budget = 64000000000ull, .gb_s = 40, .gflop_s = 400};
    f.node[1] = (convoy_fleet_node){.name = "small", .mem_budget = 2000000000ull, .gb_s = 20, .gflop_s = 200};
    convoy_forecast_params p = {.users = 1, .tokens = 64, .n_ctx = 1024};
    convoy_forecast r;
    char err[256];
    CHECKF(convoy_forecast_run(NULL, &shape, &f, &p, &r, err, sizeof err) == 0, "%s", err);
    /* one stream: the fast node holds it all, at its bandwidth over the
     * layers' and the output matrix's bytes (Q4_0: 18 bytes per 32) */
    CHECK(r.first[0] == 0 && r.last[0] == 32 && r.last[1] == r.first[1]);
    const double params = 32 * (4096.0 * 4096 * 2 + 4096.0 * 1024 * 2 + 3 * 4096.0 * 14336) + 32000 * 4096.0;
    CHECKF(NEAR(r.tok_s, 40e9 / (params * 18 / 32), 0.02), "%f tok/s", r.tok_s);
    /* four users: both nodes, within the small one's memory (a layer's
     * weights 123 MB, its KV cache of 4 slots 34 MB: 12 layers in 2 GB) */
    p.users = 4;
    CHECKF(convoy_forecast_run(NULL, &shape, &f, &p, &r, err, sizeof err) == 0, "%s", err);
    CHECKF(r.last[1] - r.first[1] > 0 && r.last[1] - r.first[1] <= 12, "small node: %d layers",
           r.last[1] - r.first[1]);
    CHECK(r.tok_s > 0 && NEAR(r.tok_s_user * 4, r.tok_s, 1e-9));
    /* a split that does not fit is refused by name */
    p.split = "0,32";
    CHECK(convoy_forecast_run(NULL, &shape, &f, &p, &r, err, sizeof err) != 0 && strstr(err, "small"));
}

int main(void)
{
    TEST_RUN(test_one_user_waits_for_every_stage);
    TEST_RUN(test_users_fill_the_stages);
    TEST_RUN(test_windows);
    TEST_RUN(test_measured_sizes);
    TEST_RUN(test_context_and_shared_cpus);
    TEST_RUN(test_prompt_chunks_pipeline);
    TEST_RUN(test_forecast_from_stated_figures);
    return test_summary();
}
