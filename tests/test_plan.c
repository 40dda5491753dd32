/* test_plan.c: the layer planner: shares by speed, searches for the
 * fastest plan of one or several streams, the output matrix as work of
 * the last node, memory caps, the head's extra bytes on the last
 * node, nodes left out, --split, refusals, and a mixture of experts'
 * cache: every expert, or paged within the budget; a stage's work, and
 * the measured costs that a plan can be made from again. */
#include <math.h>
#include <string.h>

#include "pipe/costs.h"
#include "pipe/plan.h"
#include "test.h"

#define GB 1000000000ull

static uint64_t layer16[16];

static cv_plan_node node(const char *name, uint64_t budget, uint32_t us)
{
    return (cv_plan_node){.name = name, .mem_budget = budget, .us_per_layer_token = us};
}

/* A node whose file holds layers [l0, l1) only. */
static cv_plan_node shard(const char *name, uint64_t budget, uint32_t us, int32_t l0, int32_t l1)
{
    return (cv_plan_node){.name = name, .mem_budget = budget, .us_per_layer_token = us, .held_l0 = l0, .held_l1 = l1};
}

static cv_plan_model model16(void)
{
    for (int i = 0; i < 16; i++)
        layer16[i] = GB / 4; /* 16 layers of 0.25 GB: 4 GB */
    return (cv_plan_model){.n_layer = 16, .layer_bytes = layer16, .kv_bytes_per_layer = 0, .fixed_bytes = 0,
                           .output_bytes = GB / 2};
}

static void test_equal_speed_equal_share(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[4] = {node(NULL, 10 * GB, 100), node(NULL, 10 * GB, 100), node(NULL, 10 * GB, 100),
                             node(NULL, 10 * GB, 100)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 4, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 4; i++)
        CHECKF(p.first[i] == 4 * i && p.last[i] == 4 * i + 4, "node %d: [%d, %d)", i, p.first[i], p.last[i]);
}

/* Two nodes that must share 16 layers (each holds 14), node 0 three times
 * as fast. Several streams go at the slowest stage's pace, least at
 * 12 + 4 (600 us each: shares in proportion to speed); one stream waits
 * for both stages in turn, least with the fast node full: 14 + 2 (1000 us
 * against 1200). */
static void test_streams_choose_the_objective(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[2] = {node(NULL, 14 * GB / 4, 50), node(NULL, 14 * GB / 4 + GB / 2, 150)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, 2, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 12 && p.last[1] == 16, "[%d,%d) [%d,%d)", p.first[0], p.last[0], p.first[1], p.last[1]);
    CHECKF(p.us_token == 600 && p.us_shared == 600, "%.1f %.1f", p.us_token, p.us_shared);
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 14 && p.last[1] == 16, "[%d,%d) [%d,%d)", p.first[0], p.last[0], p.first[1], p.last[1]);
    CHECKF(p.us_token == 1000 && p.us_shared == 1200, "%.1f %.1f", p.us_token, p.us_shared);
}

/* A node that did not measure (a node that receives its layers) counts as
 * the mean of those that did: 50 and 150 us measured, the third as 75.
 * Several streams: 8 + 3 + 5, the slowest stage 450 us. One stream with
 * no memory limit: the fast node alone, 800 us (1225 shared). */
static void test_unmeasured_node_as_the_mean(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[3] = {node(NULL, 10 * GB, 50), node(NULL, 10 * GB, 150), node(NULL, 10 * GB, 0)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 3, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 8 && p.last[1] == 11 && p.last[2] == 16, "[%d,%d) [%d,%d) [%d,%d)", p.first[0], p.last[0],
           p.first[1], p.last[1], p.first[2], p.last[2]);
    CHECKF(p.us_token > 449.99 && p.us_token < 450.01, "%.3f", p.us_token);
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 16 && p.us_token == 800, "[%d,%d) %.1f", p.first[0], p.last[0], p.us_token);
    CHECKF(p.us_shared > 1224.99 && p.us_shared < 1225.01, "%.3f", p.us_shared);
}

/* 3 nodes of 2.5 GB (10 layers; 8 with the output matrix), the middle
 * one 4 times slower. One stream: shared 7 + 2 + 7 take 2200 us, 8 + 8
 * without the slow node 1600. Several: 7 + 2 + 7 keep the slowest stage at 800 us,
 * as 8 + 8 would: the shared plan stays. */
static void test_slow_node_left_out_by_search(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[3] = {node("a", 5 * GB / 2, 100), node("slow", 5 * GB / 2, 400), node("c", 5 * GB / 2, 100)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 8 && p.first[1] == p.last[1] && p.last[2] == 16, "[%d,%d) [%d,%d) [%d,%d)", p.first[0],
           p.last[0], p.first[1], p.last[1], p.first[2], p.last[2]);
    CHECKF(p.us_token == 1600 && p.us_shared == 2200, "%.1f %.1f", p.us_token, p.us_shared);
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 3, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 7 && p.last[1] == 9 && p.us_token == 800 && p.us_shared == 800, "[%d,%d) [%d,%d) %.1f %.1f",
           p.first[0], p.last[0], p.first[1], p.last[1], p.us_token, p.us_shared);
    /* within the margin the shared plan stays: the middle node 5% slower */
    nodes[1].us_per_layer_token = 105;
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[1] > p.first[1] && p.us_token == p.us_shared, "[%d,%d) %.1f %.1f", p.first[1], p.last[1],
           p.us_token, p.us_shared);
}

/* This machine's stage never ends a chain of several nodes: the fastest,
 * with no memory limit, keeps all but one layer, the one a remote node
 * needs to end the chain. */
static void test_local_never_last(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[3] = {node("local", 10 * GB, 10), node(NULL, 10 * GB, 20), node(NULL, 10 * GB, 20)};
    nodes[0].local = true;
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 15 && p.last[2] == 16 && p.us_token == 170, "[%d,%d) [%d,%d) [%d,%d) %.1f", p.first[0],
           p.last[0], p.first[1], p.last[1], p.first[2], p.last[2], p.us_token);
}

/* 5 layers of 3.4 MB and a 2.1 MB output matrix over 2 equal nodes: the
 * last node's matrix is worth 0.62 of a layer, so 3 + 2 balances better
 * (3 vs 2.62) than 2 + 3 (2 vs 3.62); with a matrix worth 2.5 layers,
 * 4 + 1 (4 vs 3.5). */
static void test_head_matrix_counts_as_work(void)
{
    uint64_t layer5[5];
    for (int i = 0; i < 5; i++)
        layer5[i] = 3400000;
    cv_plan_model m = {.n_layer = 5, .layer_bytes = layer5, .output_bytes = 2100000, .output_work_bytes = 2100000};
    cv_plan_node nodes[2] = {node(NULL, 10 * GB, 100), node(NULL, 10 * GB, 100)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 3 && p.first[1] == 3 && p.last[1] == 5, "[%d,%d) [%d,%d)", p.first[0], p.last[0], p.first[1],
           p.last[1]);
    m.output_work_bytes = 8500000;
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 4, "a matrix of 2.5 layers: [%d,%d) [%d,%d)", p.first[0], p.last[0], p.first[1], p.last[1]);
}

static void test_memory_caps_and_output_bytes(void)
{
    cv_plan_model m = model16();
    /* 4 nodes of 1.5 GB: 6 layers fit each, but the last also holds 0.5 GB of head */
    cv_plan_node nodes[4] = {node(NULL, 3 * GB / 2, 0), node(NULL, 3 * GB / 2, 0), node(NULL, 3 * GB / 2, 0),
                             node(NULL, 3 * GB / 2, 0)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 4, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.last[3] == 16);
    for (int i = 0; i < 4; i++)
        CHECKF(p.last[i] - p.first[i] <= (i == 3 ? 4 : 6), "node %d has %d layers", i, p.last[i] - p.first[i]);
    /* a single node of 1.5 GB cannot hold 4.5 GB */
    CHECK(cv_plan_layers(&m, 1, nodes, NULL, 1, &p, err, sizeof err) == -1);
    CHECKF(strstr(err, "needs 4.50 GB") && strstr(err, "offer 1.50 GB"), "%s", err);
}

/* A last node too small for the head and a layer: the head moves to the
 * node before it, which then holds every layer, or the plan is refused as
 * too small (it used to swing between the two nodes and leave layers out). */
static void test_head_moves_forward(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[2] = {node(NULL, 46 * GB / 10, 100), node(NULL, 6 * GB / 10, 100)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.first[0] == 0 && p.last[0] == 16 && p.first[1] == p.last[1], "[%d,%d) [%d,%d)", p.first[0],
           p.last[0], p.first[1], p.last[1]);
    nodes[0].mem_budget = 42 * GB / 10; /* 4 GB of layers and the 0.5 GB head no longer fit */
    CHECK(cv_plan_layers(&m, 2, nodes, NULL, 1, &p, err, sizeof err) == -1);
    CHECKF(strstr(err, "offer"), "%s", err);
}

static void test_slow_node_left_out(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[3] = {node(NULL, 10 * GB, 10), node(NULL, 10 * GB, 100000), node(NULL, 10 * GB, 10)};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.first[1] == p.last[1], "slow node got [%d, %d)", p.first[1], p.last[1]);
    CHECK(p.last[0] - p.first[0] == 8 && p.last[2] == 16);
}

static void test_split_override(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[2] = {node(NULL, 10 * GB, 10), node(NULL, 10 * GB, 10)};
    cv_plan_result p;
    char err[256];
    int32_t split[2] = {3, 13};
    CHECKF(cv_plan_layers(&m, 2, nodes, split, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.first[1] == 3 && p.last[1] == 16);
    int32_t bad[2] = {3, 12};
    CHECK(cv_plan_layers(&m, 2, nodes, bad, 1, &p, err, sizeof err) == -1 && strstr(err, "covers 15"));
    cv_plan_node small[2] = {node("node a:1", GB, 10), node(NULL, 10 * GB, 10)};
    int32_t heavy[2] = {8, 8};
    CHECK(cv_plan_layers(&m, 2, small, heavy, 1, &p, err, sizeof err) == -1 && strstr(err, "node a:1"));
}

/* Shards: each node only inside the layers its file holds, in chain order. */
static void test_held_ranges(void)
{
    cv_plan_model m = model16();
    cv_plan_result p;
    char err[256];
    cv_plan_node shards[3] = {shard("a", 10 * GB, 10, 0, 6), shard("b", 10 * GB, 10, 6, 12),
                              shard("c", 10 * GB, 10, 12, 16)};
    CHECKF(cv_plan_layers(&m, 3, shards, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.first[0] == 0 && p.last[0] == 6 && p.first[1] == 6 && p.last[1] == 12 && p.first[2] == 12 &&
          p.last[2] == 16);
    /* a whole-model node before shards takes only what they leave */
    cv_plan_node mixed[2] = {node("local", 10 * GB, 10), shard("b", 10 * GB, 10, 4, 16)};
    CHECKF(cv_plan_layers(&m, 2, mixed, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.last[0] == 4 && p.first[1] == 4 && p.last[1] == 16);
    /* a gap in chain order names the node where the chain stops */
    cv_plan_node gap[2] = {shard("a", 10 * GB, 10, 0, 6), shard("c", 10 * GB, 10, 8, 16)};
    CHECK(cv_plan_layers(&m, 2, gap, NULL, 1, &p, err, sizeof err) == -1 && strstr(err, "c holds layers [8, 16)") &&
          strstr(err, "[6, 8)"));
    cv_plan_node short_end[2] = {shard("a", 10 * GB, 10, 0, 6), shard("b", 10 * GB, 10, 6, 12)};
    CHECK(cv_plan_layers(&m, 2, short_end, NULL, 1, &p, err, sizeof err) == -1 && strstr(err, "[12, 16)"));
    /* --split outside a node's range */
    int32_t split[3] = {4, 8, 4};
    CHECK(cv_plan_layers(&m, 3, shards, split, 1, &p, err, sizeof err) == -1 &&
          strstr(err, "b holds layers [6, 12) only") && strstr(err, "[4, 12)"));
}

/* A mixture of experts: 16 layers of 0.05 GB besides their 10 experts of
 * 0.02 GB (0.25 GB a layer in all), a batch needing 4 slots. A node holds
 * a slot for every expert of its layers where its budget allows, else what
 * the budget leaves (no fewer than 4), and is planned as long as that fits. */
static void test_experts_paged(void)
{
    cv_plan_model m = model16();
    for (int i = 0; i < 16; i++)
        layer16[i] = GB / 20;
    m.expert_slot_bytes = GB / 50;
    m.expert_fixed_bytes = GB / 100;
    m.layer_experts = 10;
    m.min_expert_slots = 4;
    const cv_plan_node roomy = node(NULL, 10 * GB, 0), tight = node(NULL, GB, 0), none = {0};
    /* 4 layers: 0.2 GB, 40 experts: 0.8 GB, their cache's own 0.01 GB */
    CHECK(cv_plan_expert_slots(&m, &roomy, 0, 4) == 40);
    CHECK(cv_plan_range_bytes(&m, &roomy, 0, 4) == GB / 5 + GB / 100 + 40 * (GB / 50));
    CHECK(cv_plan_expert_slots(&m, &none, 0, 4) == 40); /* no budget: no limit */
    /* 1 GB leaves (1 - 0.2 - 0.01) / 0.02 = 39 slots: paged */
    CHECK(cv_plan_expert_slots(&m, &tight, 0, 4) == 39);
    CHECK(cv_plan_range_bytes(&m, &tight, 0, 4) <= GB);
    /* 12 layers (0.6 GB) leave 19 slots of 120; 16 layers (0.8 GB + head) the fewest, 4, over the budget */
    CHECK(cv_plan_expert_slots(&m, &tight, 0, 12) == 19);
    CHECK(cv_plan_expert_slots(&m, &tight, 0, 16) == 4);
    CHECK(cv_plan_range_bytes(&m, &tight, 0, 16) > GB);
    /* two nodes of 1 GB hold the 4 GB model paged: 8 layers each */
    cv_plan_node nodes[2] = {tight, tight};
    cv_plan_result p;
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, 1, &p, err, sizeof err) == 0, "%s", err);
    CHECKF(p.last[0] == 8 && p.last[1] == 16, "[%d, %d) [%d, %d)", p.first[0], p.last[0], p.first[1], p.last[1]);
    /* one node of 1 GB cannot: the least it needs counts the fewest slots */
    CHECK(cv_plan_layers(&m, 1, nodes, NULL, 1, &p, err, sizeof err) == -1);
    CHECKF(strstr(err, "needs 1.39 GB"), "%s", err);
}

/* A stage's work in mean layers: the output matrix counts on the last. */
static void test_stage_work(void)
{
    cv_plan_model m = model16();
    m.output_work_bytes = GB / 2; /* two layers' worth */
    CHECK(cv_plan_stage_work(&m, 0, 4) == 4.0);
    CHECK(cv_plan_stage_work(&m, 12, 16) == 6.0);
    CHECK(cv_plan_stage_work(&m, 5, 5) == 0.0);
    layer16[0] = GB / 4 * 9; /* one heavy layer: 24 mean-layer units over 16 layers, the mean is 0.375 GB */
    CHECK(fabs(cv_plan_stage_work(&m, 0, 1) - 6.0) < 1e-9 && fabs(cv_plan_stage_work(&m, 1, 2) - 2.0 / 3) < 1e-9);
}

/* A batch's stage times become us per layer and token; a sample's weight
 * grows with its age (half after a half-life); hops from a lone batch. */
static void test_costs_decay(void)
{
    cv_costs c;
    cv_costs_init(&c, 2);
    const double work[2] = {2.0, 4.0};
    const int64_t ms = 1000000;
    cv_costs_add(&c, (const uint32_t[]){800, 4000}, work, 4, -1, 3, 1000 * ms); /* the first sample: taken whole */
    CHECK(c.us[0] == 100.0 && c.us[1] == 250.0 && c.hop_us == 0 && c.batches == 1);
    cv_costs_add(&c, (const uint32_t[]){1600, 4000}, work, 4, -1, 3,
                 (1000 + CV_COSTS_HALF_LIFE_MS) * ms); /* a half-life later: halfway */
    CHECK(fabs(c.us[0] - 150.0) < 1e-9 && fabs(c.us[1] - 250.0) < 1e-9);
    cv_costs_add(&c, (const uint32_t[]){1600, 4000}, work, 4, -1, 3,
                 (1000 + CV_COSTS_HALF_LIFE_MS) * ms); /* at once: no weight */
    CHECK(fabs(c.us[0] - 150.0) < 1e-9);
    /* alone in flight: 6.4 ms round trip, 4.0 ms of it the stages', over 3 hops */
    cv_costs_add(&c, (const uint32_t[]){1000, 3000}, work, 1, 6400 * 1000, 3, 5000 * ms);
    CHECK(fabs(c.hop_us - 800.0) < 1e-9 && c.batches == 4);
}

int main(void)
{
    TEST_RUN(test_stage_work);
    TEST_RUN(test_costs_decay);
    TEST_RUN(test_equal_speed_equal_share);
    TEST_RUN(test_streams_choose_the_objective);
    TEST_RUN(test_unmeasured_node_as_the_mean);
    TEST_RUN(test_head_matrix_counts_as_work);
    TEST_RUN(test_memory_caps_and_output_bytes);
    TEST_RUN(test_head_moves_forward);
    TEST_RUN(test_slow_node_left_out);
    TEST_RUN(test_slow_node_left_out_by_search);
    TEST_RUN(test_local_never_last);
    TEST_RUN(test_split_override);
    TEST_RUN(test_held_ranges);
    TEST_RUN(test_experts_paged);
    return test_summary();
}
