/* test_plan.c: the layer planner: shares by speed, the output matrix as
 * work of the last node, memory caps, the head's extra bytes on the last
 * node, nodes left out, --split, refusals, and a mixture of experts'
 * cache: every expert, or paged within the budget. */
#include <string.h>

#include "pipe/plan.h"
#include "test.h"

#define GB 1000000000ull

static uint64_t layer16[16];

static cv_plan_model model16(void)
{
    for (int i = 0; i < 16; i++)
        layer16[i] = GB / 4; /* 16 layers of 0.25 GB: 4 GB */
    return (cv_plan_model){.n_layer = 16, .layer_bytes = layer16, .kv_bytes_per_layer = 0, .fixed_bytes = 0,
                           .head_bytes = GB / 2};
}

static void test_equal_speed_equal_share(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[4] = {{NULL, 10 * GB, 100, 0, 0, 0}, {NULL, 10 * GB, 100, 0, 0, 0}, {NULL, 10 * GB, 100, 0, 0, 0}, {NULL, 10 * GB, 100, 0, 0, 0}};
    int32_t first[4], last[4];
    char err[256];
    CHECKF(cv_plan_layers(&m, 4, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 4; i++)
        CHECKF(first[i] == 4 * i && last[i] == 4 * i + 4, "node %d: [%d, %d)", i, first[i], last[i]);
}

static void test_faster_node_more_layers(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[2] = {{NULL, 10 * GB, 50, 0, 0, 0}, {NULL, 10 * GB, 150, 0, 0, 0}}; /* node 0 three times as fast */
    int32_t first[2], last[2];
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(last[0] - first[0] == 12 && last[1] - first[1] == 4, "[%d,%d) [%d,%d)", first[0], last[0], first[1],
           last[1]);
}

/* A node that did not measure (a node that receives its layers) counts as
 * the mean of those that did: 50 and 150 us measured, the third as 75. */
static void test_unmeasured_node_as_the_mean(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[3] = {{NULL, 10 * GB, 50, 0, 0, 0}, {NULL, 10 * GB, 150, 0, 0, 0}, {NULL, 10 * GB, 0, 0, 0, 0}};
    int32_t first[3], last[3];
    char err[256];
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(last[0] - first[0] == 8 && last[1] - first[1] == 3 && last[2] - first[2] == 5, "[%d,%d) [%d,%d) [%d,%d)",
           first[0], last[0], first[1], last[1], first[2], last[2]);
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
    cv_plan_model m = {.n_layer = 5, .layer_bytes = layer5, .head_bytes = 2100000, .head_work_bytes = 2100000};
    cv_plan_node nodes[2] = {{NULL, 10 * GB, 100, 0, 0, 0}, {NULL, 10 * GB, 100, 0, 0, 0}};
    int32_t first[2], last[2];
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(last[0] == 3 && first[1] == 3 && last[1] == 5, "[%d,%d) [%d,%d)", first[0], last[0], first[1], last[1]);
    m.head_work_bytes = 8500000;
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(last[0] == 4, "a matrix of 2.5 layers: [%d,%d) [%d,%d)", first[0], last[0], first[1], last[1]);
}

static void test_memory_caps_and_head_bytes(void)
{
    cv_plan_model m = model16();
    /* 4 nodes of 1.5 GB: 6 layers fit each, but the last also holds 0.5 GB of head */
    cv_plan_node nodes[4] = {{NULL, 3 * GB / 2, 0, 0, 0, 0}, {NULL, 3 * GB / 2, 0, 0, 0, 0}, {NULL, 3 * GB / 2, 0, 0, 0, 0}, {NULL, 3 * GB / 2, 0, 0, 0, 0}};
    int32_t first[4], last[4];
    char err[256];
    CHECKF(cv_plan_layers(&m, 4, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECK(last[3] == 16);
    for (int i = 0; i < 4; i++)
        CHECKF(last[i] - first[i] <= (i == 3 ? 4 : 6), "node %d has %d layers", i, last[i] - first[i]);
    /* a single node of 1.5 GB cannot hold 4.5 GB */
    CHECK(cv_plan_layers(&m, 1, nodes, NULL, first, last, err, sizeof err) == -1);
    CHECKF(strstr(err, "needs 4.50 GB") && strstr(err, "offer 1.50 GB"), "%s", err);
}

/* A last node too small for the head and a layer: the head moves to the
 * node before it, which then holds every layer, or the plan is refused as
 * too small (it used to swing between the two nodes and leave layers out). */
static void test_head_moves_forward(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[2] = {{NULL, 46 * GB / 10, 100, 0, 0, 0}, {NULL, 6 * GB / 10, 100, 0, 0, 0}};
    int32_t first[2], last[2];
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(first[0] == 0 && last[0] == 16 && first[1] == last[1], "[%d,%d) [%d,%d)", first[0], last[0], first[1],
           last[1]);
    nodes[0].mem_budget = 42 * GB / 10; /* 4 GB of layers and the 0.5 GB head no longer fit */
    CHECK(cv_plan_layers(&m, 2, nodes, NULL, first, last, err, sizeof err) == -1);
    CHECKF(strstr(err, "offer"), "%s", err);
}

static void test_slow_node_left_out(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[3] = {{NULL, 10 * GB, 10, 0, 0, 0}, {NULL, 10 * GB, 100000, 0, 0, 0}, {NULL, 10 * GB, 10, 0, 0, 0}};
    int32_t first[3], last[3];
    char err[256];
    CHECKF(cv_plan_layers(&m, 3, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(first[1] == last[1], "slow node got [%d, %d)", first[1], last[1]);
    CHECK(last[0] - first[0] == 8 && last[2] == 16);
}

static void test_split_override(void)
{
    cv_plan_model m = model16();
    cv_plan_node nodes[2] = {{NULL, 10 * GB, 10, 0, 0, 0}, {NULL, 10 * GB, 10, 0, 0, 0}};
    int32_t first[2], last[2];
    char err[256];
    int32_t split[2] = {3, 13};
    CHECKF(cv_plan_layers(&m, 2, nodes, split, first, last, err, sizeof err) == 0, "%s", err);
    CHECK(first[1] == 3 && last[1] == 16);
    int32_t bad[2] = {3, 12};
    CHECK(cv_plan_layers(&m, 2, nodes, bad, first, last, err, sizeof err) == -1 && strstr(err, "covers 15"));
    cv_plan_node small[2] = {{"node a:1", GB, 10, 0, 0, 0}, {NULL, 10 * GB, 10, 0, 0, 0}};
    int32_t heavy[2] = {8, 8};
    CHECK(cv_plan_layers(&m, 2, small, heavy, first, last, err, sizeof err) == -1 && strstr(err, "node a:1"));
}

/* Shards: each node only inside the layers its file holds, in chain order. */
static void test_held_ranges(void)
{
    cv_plan_model m = model16();
    int32_t first[3], last[3];
    char err[256];
    cv_plan_node shards[3] = {{"a", 10 * GB, 10, 0, 0, 6}, {"b", 10 * GB, 10, 0, 6, 12}, {"c", 10 * GB, 10, 0, 12, 16}};
    CHECKF(cv_plan_layers(&m, 3, shards, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECK(first[0] == 0 && last[0] == 6 && first[1] == 6 && last[1] == 12 && first[2] == 12 && last[2] == 16);
    /* a whole-model node before shards takes only what they leave */
    cv_plan_node mixed[2] = {{"local", 10 * GB, 10, 0, 0, 0}, {"b", 10 * GB, 10, 0, 4, 16}};
    CHECKF(cv_plan_layers(&m, 2, mixed, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECK(last[0] == 4 && first[1] == 4 && last[1] == 16);
    /* a gap in chain order names the node where the chain stops */
    cv_plan_node gap[2] = {{"a", 10 * GB, 10, 0, 0, 6}, {"c", 10 * GB, 10, 0, 8, 16}};
    CHECK(cv_plan_layers(&m, 2, gap, NULL, first, last, err, sizeof err) == -1 && strstr(err, "c holds layers [8, 16)") &&
          strstr(err, "[6, 8)"));
    cv_plan_node short_end[2] = {{"a", 10 * GB, 10, 0, 0, 6}, {"b", 10 * GB, 10, 0, 6, 12}};
    CHECK(cv_plan_layers(&m, 2, short_end, NULL, first, last, err, sizeof err) == -1 && strstr(err, "[12, 16)"));
    /* --split outside a node's range */
    int32_t split[3] = {4, 8, 4};
    CHECK(cv_plan_layers(&m, 3, shards, split, first, last, err, sizeof err) == -1 &&
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
    const cv_plan_node roomy = {NULL, 10 * GB, 0, 0, 0, 0}, tight = {NULL, GB, 0, 0, 0, 0}, none = {0};
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
    int32_t first[2], last[2];
    char err[256];
    CHECKF(cv_plan_layers(&m, 2, nodes, NULL, first, last, err, sizeof err) == 0, "%s", err);
    CHECKF(last[0] == 8 && last[1] == 16, "[%d, %d) [%d, %d)", first[0], last[0], first[1], last[1]);
    /* one node of 1 GB cannot: the least it needs counts the fewest slots */
    CHECK(cv_plan_layers(&m, 1, nodes, NULL, first, last, err, sizeof err) == -1);
    CHECKF(strstr(err, "needs 1.39 GB"), "%s", err);
}

int main(void)
{
    TEST_RUN(test_equal_speed_equal_share);
    TEST_RUN(test_faster_node_more_layers);
    TEST_RUN(test_unmeasured_node_as_the_mean);
    TEST_RUN(test_head_matrix_counts_as_work);
    TEST_RUN(test_memory_caps_and_head_bytes);
    TEST_RUN(test_head_moves_forward);
    TEST_RUN(test_slow_node_left_out);
    TEST_RUN(test_split_override);
    TEST_RUN(test_held_ranges);
    TEST_RUN(test_experts_paged);
    return test_summary();
}
