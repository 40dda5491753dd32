/* test_sampler.c: the sampler chain against its contract: greedy ties,
 * seeded reproducibility, each truncation stage, penalties, rewinds of the
 * penalty history longer than its window, temperature,
 * the empirical distribution of draws, no allocation in sample, and rows
 * with NaN / infinite logits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "infer/sampler.h"
#include "test.h"

/* Parameters with every stage off and temperature 1: a plain softmax draw. */
static cv_sampler_params plain_params(uint64_t seed)
{
    cv_sampler_params p = cv_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.freq_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.seed = seed;
    return p;
}

static cv_sampler_params greedy_params(void)
{
    cv_sampler_params p = plain_params(0);
    p.temp = 0.0f;
    return p;
}

/* Deterministic pseudo-random logits in [-scale, scale), independent of the
 * sampler's own RNG. */
static void fill_logits(float *x, int n, uint32_t seed, float scale)
{
    uint32_t st = seed * 2654435761u + 1u;
    for (int i = 0; i < n; i++) {
        st = st * 1664525u + 1013904223u;
        x[i] = ((float)(st >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
}

/* Draws n ids and counts them per id in hist[n_vocab]. */
static void draw_histogram(cv_sampler *s, const float *logits, int n_vocab, int n, int *hist)
{
    for (int i = 0; i < n_vocab; i++)
        hist[i] = 0;
    for (int i = 0; i < n; i++) {
        int32_t id = cv_sampler_sample(s, logits);
        if (id >= 0 && id < n_vocab)
            hist[id]++;
    }
}

static void test_argmax_ties(void)
{
    float x[] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    CHECK(cv_argmax(x, 5) == 1);
    CHECK(cv_argmax(x, 1) == 0);
    CHECK(cv_argmax(x, 0) == -1);
    float y[] = {-5.0f, -5.0f, -7.0f};
    CHECK(cv_argmax(y, 3) == 0);
    float z[] = {NAN, -1.0f, NAN, 4.0f, 4.0f};
    CHECK(cv_argmax(z, 5) == 3);
}

static void test_greedy(void)
{
    cv_sampler_params p = greedy_params();
    cv_sampler *s = cv_sampler_create(&p, 5, 0);
    CHECK(s != NULL);
    if (!s)
        return;
    float x[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    for (int i = 0; i < 10; i++)
        CHECK(cv_sampler_sample(s, x) == 1);
    cv_sampler_free(s);

    enum { N = 3000 };
    static float big[N];
    p.temp = -1.0f;
    s = cv_sampler_create(&p, N, 0);
    for (uint32_t seed = 1; seed <= 20; seed++) {
        fill_logits(big, N, seed, 8.0f);
        CHECK(cv_sampler_sample(s, big) == cv_argmax(big, N));
    }
    cv_sampler_free(s);
}

/* The bias moves logits before everything: it turns greedy's choice, -inf
 * bans an id from every draw, and the caller's array is not kept. */
static void test_logit_bias(void)
{
    cv_logit_bias bias[2] = {{2, 3.0f}, {1, -INFINITY}};
    cv_sampler_params p = greedy_params();
    p.bias = bias;
    p.n_bias = 2;
    cv_sampler *s = cv_sampler_create(&p, 5, 0);
    bias[0].bias = -100.0f; /* not read after create */
    float x[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    CHECK(s && cv_sampler_sample(s, x) == 2);
    cv_sampler_free(s);
    p = plain_params(7);
    p.bias = bias + 1;
    p.n_bias = 1;
    s = cv_sampler_create(&p, 5, 0);
    float flat[5] = {0};
    int hits[5] = {0};
    for (int i = 0; s && i < 500; i++)
        hits[cv_sampler_sample(s, flat)]++;
    CHECK(s && hits[1] == 0 && hits[0] > 0 && hits[4] > 0);
    cv_sampler_free(s);
    char err[128];
    CHECK(cv_logit_bias_check(bias, 2, 2, err, sizeof err) == -1); /* id 2 of a 2-id vocabulary */
    bias[0] = (cv_logit_bias){0, NAN};
    CHECK(cv_logit_bias_check(bias, 1, 5, err, sizeof err) == -1);
    bias[0].bias = -INFINITY;
    CHECK(cv_logit_bias_check(bias, 2, 5, err, sizeof err) == 0);
}

static void test_seed_reproducible(void)
{
    enum { V = 32, DRAWS = 1000 };
    float x[V];
    fill_logits(x, V, 7, 1.5f);
    cv_sampler_params p = plain_params(42);
    cv_sampler *a = cv_sampler_create(&p, V, 0);
    cv_sampler *b = cv_sampler_create(&p, V, 0);
    p.seed = 43;
    cv_sampler *c = cv_sampler_create(&p, V, 0);
    static int32_t seq_a[DRAWS];
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < DRAWS; i++) {
        seq_a[i] = cv_sampler_sample(a, x);
        same_ab &= seq_a[i] == cv_sampler_sample(b, x);
        same_ac &= seq_a[i] == cv_sampler_sample(c, x);
    }
    CHECK(same_ab);
    CHECK(!same_ac);

    cv_sampler_reset(a);
    int same_after_reset = 1;
    for (int i = 0; i < DRAWS; i++)
        same_after_reset &= seq_a[i] == cv_sampler_sample(a, x);
    CHECK(same_after_reset);
    cv_sampler_free(a);
    cv_sampler_free(b);
    cv_sampler_free(c);
}

/* A sampler created with n_draws = k draws what one that has sampled k
 * times draws next (a sequence replayed onto another node). */
static void test_resume_after_draws(void)
{
    enum { V = 64, DRAWS = 300 };
    float x[V];
    fill_logits(x, V, 11, 2.0f);
    cv_sampler_params p = plain_params(1234);
    cv_sampler *a = cv_sampler_create(&p, V, 0);
    static int32_t ids[DRAWS];
    for (int i = 0; i < DRAWS; i++)
        ids[i] = cv_sampler_sample(a, x);
    const uint64_t ks[] = {0, 1, 2, 37, 128, 299};
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
        p.n_draws = ks[j];
        cv_sampler *b = cv_sampler_create(&p, V, 0);
        int same = 1;
        for (uint64_t i = ks[j]; i < DRAWS; i++)
            same &= ids[i] == cv_sampler_sample(b, x);
        CHECK(same);
        cv_sampler_free(b);
    }
    p.n_draws = UINT64_MAX; /* any count from the wire is quick */
    cv_sampler *c = cv_sampler_create(&p, V, 0);
    CHECK(c && cv_sampler_sample(c, x) >= 0);
    cv_sampler_free(c);
    cv_sampler_free(a);
}

static void test_top_k_one_is_greedy(void)
{
    enum { V = 1000 };
    static float x[V];
    for (uint64_t seed = 0; seed < 50; seed++) {
        cv_sampler_params p = plain_params(seed);
        p.temp = 5.0f;
        p.top_k = 1;
        cv_sampler *s = cv_sampler_create(&p, V, 0);
        fill_logits(x, V, (uint32_t)seed + 100, 2.0f);
        CHECK(cv_sampler_sample(s, x) == cv_argmax(x, V));
        cv_sampler_free(s);
    }
}

static void test_top_p_tiny_is_greedy(void)
{
    enum { V = 1000 };
    static float x[V];
    for (uint64_t seed = 0; seed < 50; seed++) {
        cv_sampler_params p = plain_params(seed);
        p.temp = 5.0f;
        p.top_p = 1e-6f;
        cv_sampler *s = cv_sampler_create(&p, V, 0);
        fill_logits(x, V, (uint32_t)seed + 200, 2.0f);
        CHECK(cv_sampler_sample(s, x) == cv_argmax(x, V));
        cv_sampler_free(s);
    }
}

/* With a high temperature every kept id shows up; none outside the set may. */
static void test_top_k_keeps_the_k_best(void)
{
    enum { V = 500, K = 5, DRAWS = 4000 };
    static float x[V];
    static int hist[V];
    fill_logits(x, V, 31, 3.0f);
    x[17] = x[cv_argmax(x, V)]; /* a tie at the top: both ids must be kept */
    int kept[V] = {0};
    float work[V];
    for (int i = 0; i < V; i++)
        work[i] = x[i];
    for (int j = 0; j < K; j++) {
        int m = cv_argmax(work, V);
        kept[m] = 1;
        work[m] = -INFINITY;
    }
    cv_sampler_params p = plain_params(5);
    p.temp = 100.0f;
    p.top_k = K;
    cv_sampler *s = cv_sampler_create(&p, V, 0);
    draw_histogram(s, x, V, DRAWS, hist);
    for (int i = 0; i < V; i++) {
        if (kept[i])
            CHECKF(hist[i] > 0, "id %d is among the top %d but was never drawn", i, K);
        else
            CHECKF(hist[i] == 0, "id %d is outside the top %d but was drawn %d times", i, K,
                   hist[i]);
    }
    cv_sampler_free(s);
}

/* Equal logits rank by id: a cut through a tie keeps the lowest ids. */
static void test_ties_cut_by_id(void)
{
    enum { V = 6, DRAWS = 2000 };
    float x[V] = {1.0f, 3.0f, 0.0f, 3.0f, 3.0f, 3.0f};
    int hist[V];
    cv_sampler_params p = plain_params(21);
    p.temp = 10.0f;
    p.top_k = 2;
    cv_sampler *s = cv_sampler_create(&p, V, 0);
    draw_histogram(s, x, V, DRAWS, hist);
    CHECK(hist[1] > 0 && hist[3] > 0);
    CHECK(hist[0] == 0 && hist[2] == 0 && hist[4] == 0 && hist[5] == 0);
    cv_sampler_free(s);

    p = plain_params(22);
    p.top_p = 1e-6f;
    s = cv_sampler_create(&p, V, 0);
    for (int i = 0; i < 20; i++)
        CHECK(cv_sampler_sample(s, x) == 1);
    cv_sampler_free(s);
}

/* Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps two, 0.85 three. */
static void test_top_p_set(void)
{
    enum { V = 4, DRAWS = 3000 };
    float x[V] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    int hist[V];
    const float top_p[] = {0.75f, 0.85f};
    const int n_kept[] = {2, 3};
    for (int t = 0; t < 2; t++) {
        cv_sampler_params p = plain_params(9);
        p.top_p = top_p[t];
        p.temp = 50.0f;
        cv_sampler *s = cv_sampler_create(&p, V, 0);
        draw_histogram(s, x, V, DRAWS, hist);
        for (int i = 0; i < V; i++)
            CHECKF((hist[i] > 0) == (i < n_kept[t]), "top_p %.2f: id %d drawn %d times",
                   (double)top_p[t], i, hist[i]);
        cv_sampler_free(s);
    }

    /* top-p measures mass within the top-k set (llama.cpp): with top_k 2 the
     * best id holds 0.5 / 0.8 = 0.625 >= 0.6 of it, so it stands alone. */
    cv_sampler_params p = plain_params(10);
    p.top_p = 0.6f;
    p.temp = 50.0f;
    cv_sampler *s = cv_sampler_create(&p, V, 0);
    draw_histogram(s, x, V, DRAWS, hist);
    CHECK(hist[0] > 0 && hist[1] > 0 && hist[2] == 0);
    cv_sampler_free(s);
    p.top_k = 2;
    s = cv_sampler_create(&p, V, 0);
    draw_histogram(s, x, V, DRAWS, hist);
    CHECK(hist[0] == DRAWS);
    cv_sampler_free(s);
}

/* min_p keeps exactly the ids with p >= min_p * p_max. */
static void test_min_p(void)
{
    enum { V = 5, DRAWS = 3000 };
    /* p / p_max = 1, 0.5, 0.2, 0.09, 0.5 */
    float x[V] = {0.0f, logf(0.5f), logf(0.2f), logf(0.09f), logf(0.5f)};
    int hist[V];
    const float min_p[] = {0.3f, 0.1f, 0.6f};
    const int expect_kept[3][V] = {{1, 1, 0, 0, 1}, {1, 1, 1, 0, 1}, {1, 0, 0, 0, 0}};
    for (int t = 0; t < 3; t++) {
        cv_sampler_params p = plain_params(11);
        p.min_p = min_p[t];
        p.temp = 50.0f;
        cv_sampler *s = cv_sampler_create(&p, V, 0);
        draw_histogram(s, x, V, DRAWS, hist);
        for (int i = 0; i < V; i++)
            CHECKF((hist[i] > 0) == expect_kept[t][i], "min_p %.2f: id %d drawn %d times",
                   (double)min_p[t], i, hist[i]);
        cv_sampler_free(s);
    }
}

static void test_repeat_penalty(void)
{
    cv_sampler_params p = greedy_params();
    p.repeat_penalty = 1.1f;
    p.penalty_last_n = 2;
    cv_sampler *s = cv_sampler_create(&p, 4, 0);
    float pos[] = {2.0f, 1.9f, -3.0f, -3.0f};
    CHECK(cv_sampler_sample(s, pos) == 0);
    cv_sampler_accept(s, 0); /* 2.0 / 1.1 = 1.82 < 1.9 */
    CHECK(cv_sampler_sample(s, pos) == 1);
    cv_sampler_accept(s, 2);
    CHECK(cv_sampler_sample(s, pos) == 1);
    cv_sampler_accept(s, 3); /* id 0 leaves the window of 2 */
    CHECK(cv_sampler_sample(s, pos) == 0);

    cv_sampler_reset(s);
    float neg[] = {-1.0f, -1.05f, -3.0f, -3.0f};
    CHECK(cv_sampler_sample(s, neg) == 0);
    cv_sampler_accept(s, 0); /* -1.0 * 1.1 = -1.1 < -1.05 */
    CHECK(cv_sampler_sample(s, neg) == 1);
    cv_sampler_reset(s);
    CHECK(cv_sampler_sample(s, neg) == 0);
    cv_sampler_free(s);
}

/* Accepting 300 ids and taking 250 back leaves the penalties of the first
 * 50: the same greedy choices as a sampler that only accepted those. */
static void test_long_rewind_exact(void)
{
    enum { V = 16, N_CTX = 512 };
    cv_sampler_params p = greedy_params();
    p.penalty_last_n = 32;
    p.freq_penalty = 0.5f;
    cv_sampler *a = cv_sampler_create(&p, V, N_CTX), *b = cv_sampler_create(&p, V, N_CTX);
    CHECK(a && b);
    if (!a || !b) {
        cv_sampler_free(a);
        cv_sampler_free(b);
        return;
    }
    for (int i = 0; i < 300; i++) {
        const int32_t id = (i * 7 + i / 3) % V;
        cv_sampler_accept(a, id);
        if (i < 50)
            cv_sampler_accept(b, id);
    }
    cv_sampler_rewind(a, 250);
    float x[V];
    for (uint32_t step = 0; step < 100; step++) {
        fill_logits(x, V, step + 1, 1.0f);
        const int32_t ia = cv_sampler_sample(a, x), ib = cv_sampler_sample(b, x);
        CHECKF(ia == ib, "step %u: %d after the rewind, %d without", step, ia, ib);
        cv_sampler_accept(a, ia);
        cv_sampler_accept(b, ib);
    }
    cv_sampler_free(a);
    cv_sampler_free(b);
}

static void test_frequency_presence_penalty(void)
{
    float x[] = {2.0f, 1.5f, 0.0f};
    cv_sampler_params p = greedy_params();
    p.freq_penalty = 0.3f;
    cv_sampler *s = cv_sampler_create(&p, 3, 0);
    cv_sampler_accept(s, 0); /* 2.0 - 0.3 = 1.7 > 1.5 */
    CHECK(cv_sampler_sample(s, x) == 0);
    cv_sampler_accept(s, 0); /* 2.0 - 0.6 = 1.4 < 1.5 */
    CHECK(cv_sampler_sample(s, x) == 1);
    cv_sampler_free(s);

    p = greedy_params();
    p.presence_penalty = 0.6f;
    s = cv_sampler_create(&p, 3, 0);
    cv_sampler_accept(s, 1); /* penalizing the runner-up changes nothing */
    CHECK(cv_sampler_sample(s, x) == 0);
    cv_sampler_accept(s, 0); /* both penalized: 1.4 > 0.9 */
    CHECK(cv_sampler_sample(s, x) == 0);
    cv_sampler_reset(s);
    cv_sampler_accept(s, 0); /* 2.0 - 0.6 = 1.4 < 1.5 */
    CHECK(cv_sampler_sample(s, x) == 1);
    float y[] = {2.0f, 1.3f, 0.0f};
    CHECK(cv_sampler_sample(s, y) == 0);
    cv_sampler_accept(s, 0); /* presence does not grow with the count: 1.4 > 1.3 */
    cv_sampler_accept(s, 0);
    CHECK(cv_sampler_sample(s, y) == 0);
    cv_sampler_free(s);

    /* Out-of-range ids are ignored, and sample leaves the caller's row alone. */
    p = greedy_params();
    p.repeat_penalty = 2.0f;
    s = cv_sampler_create(&p, 3, 0);
    cv_sampler_accept(s, -1);
    cv_sampler_accept(s, 3);
    cv_sampler_accept(s, 0);
    float before[3];
    memcpy(before, x, sizeof(x));
    CHECK(cv_sampler_sample(s, x) == 1);
    CHECK(memcmp(before, x, sizeof(x)) == 0);
    cv_sampler_free(s);
}

/* Draw frequencies of a known distribution, at temperature 1 and 2.
 * 20000 draws: the standard error of a frequency is at most 0.0036, the
 * bound 0.02 is over 5 of them. */
static void test_empirical_distribution(void)
{
    enum { V = 4, DRAWS = 20000 };
    const double prob[V] = {0.5, 0.25, 0.125, 0.125};
    float x[V];
    for (int i = 0; i < V; i++)
        x[i] = (float)log(prob[i]) + 3.0f;
    int hist[V];
    const float temps[] = {1.0f, 2.0f};
    for (int t = 0; t < 2; t++) {
        double expect[V], norm = 0.0;
        for (int i = 0; i < V; i++) {
            expect[i] = pow(prob[i], 1.0 / temps[t]);
            norm += expect[i];
        }
        cv_sampler_params p = plain_params(1234);
        p.temp = temps[t];
        cv_sampler *s = cv_sampler_create(&p, V, 0);
        draw_histogram(s, x, V, DRAWS, hist);
        for (int i = 0; i < V; i++) {
            double f = (double)hist[i] / DRAWS;
            CHECKF(fabs(f - expect[i] / norm) < 0.02, "temp %.1f id %d: frequency %.4f, probability %.4f",
                   (double)temps[t], i, f, expect[i] / norm);
        }
        cv_sampler_free(s);
    }
}

static void test_sample_allocates_nothing(void)
{
    enum { V = 2000 };
    static float x[V];
    fill_logits(x, V, 3, 4.0f);
    cv_sampler_params params[3];
    params[0] = cv_sampler_default_params();
    params[0].repeat_penalty = 1.3f;
    params[0].freq_penalty = 0.1f;
    params[0].presence_penalty = 0.2f;
    params[1] = plain_params(8);
    params[1].top_p = 0.9f;
    params[2] = greedy_params();
    params[2].repeat_penalty = 1.2f;
    for (int t = 0; t < 3; t++) {
        cv_sampler *s = cv_sampler_create(&params[t], V, 0);
        CHECK(s != NULL);
        if (!s)
            continue;
        uint64_t before = cv_alloc_count();
        for (int i = 0; i < 50; i++)
            cv_sampler_accept(s, cv_sampler_sample(s, x));
        cv_sampler_reset(s);
        CHECKF(cv_alloc_count() == before, "params %d: %llu allocations in sample", t,
               (unsigned long long)(cv_alloc_count() - before));
        cv_sampler_free(s);
    }
}

static void test_bad_rows(void)
{
    CHECK(cv_sampler_create(NULL, 0, 0) == NULL);
    cv_sampler_params p = plain_params(1);
    CHECK(cv_sampler_create(&p, -3, 0) == NULL);

    float nan_row[] = {NAN, 1.0f, NAN, 0.5f};
    p.temp = 1.0f;
    cv_sampler *s = cv_sampler_create(&p, 4, 0);
    for (int i = 0; i < 200; i++) {
        int32_t id = cv_sampler_sample(s, nan_row);
        CHECKF(id == 1 || id == 3, "drew %d from a row whose other logits are NaN", id);
    }
    float inf_row[] = {1.0f, INFINITY, 3.0f, INFINITY};
    for (int i = 0; i < 200; i++) {
        int32_t id = cv_sampler_sample(s, inf_row);
        CHECKF(id == 1 || id == 3, "drew %d, not one of the +inf logits", id);
    }
    float ninf_row[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int i = 0; i < 50; i++) {
        int32_t id = cv_sampler_sample(s, ninf_row);
        CHECK(id >= 0 && id < 4);
    }
    cv_sampler_free(s);

    p = greedy_params();
    s = cv_sampler_create(&p, 4, 0);
    CHECK(cv_sampler_sample(s, nan_row) == 1);
    CHECK(cv_sampler_sample(s, inf_row) == 1);
    CHECK(cv_sampler_sample(s, ninf_row) == 0);
    cv_sampler_free(s);
}

int main(void)
{
    TEST_RUN(test_argmax_ties);
    TEST_RUN(test_greedy);
    TEST_RUN(test_seed_reproducible);
    TEST_RUN(test_resume_after_draws);
    TEST_RUN(test_top_k_one_is_greedy);
    TEST_RUN(test_top_p_tiny_is_greedy);
    TEST_RUN(test_top_k_keeps_the_k_best);
    TEST_RUN(test_ties_cut_by_id);
    TEST_RUN(test_top_p_set);
    TEST_RUN(test_min_p);
    TEST_RUN(test_repeat_penalty);
    TEST_RUN(test_frequency_presence_penalty);
    TEST_RUN(test_long_rewind_exact);
    TEST_RUN(test_empirical_distribution);
    TEST_RUN(test_sample_allocates_nothing);
    TEST_RUN(test_bad_rows);
    TEST_RUN(test_logit_bias);
    return test_summary();
}
