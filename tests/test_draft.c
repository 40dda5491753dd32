/* test_draft.c: the drafters of speculative decoding against their contract.
 * - ngram: the continuation of the most recent match, longer n-grams
 *   first, nothing without a match, k and the end of the history respected;
 * - model (stories260K as its own draft): proposals equal the greedy
 *   continuation of a separate stage stepping one token at a time, also
 *   after a rejection or an acceptance changed the history (the KV cache is
 *   truncated to the shared prefix) and near the end of the context; two
 *   slots in one call (catch-up over several batches) give what each gets
 *   alone; a proposal allocates nothing;
 * - failures: a mismatched vocabulary, a missing file, bad requests and a
 *   bad id give messages, and the drafter stays usable. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "infer/draft.h"
#include "infer/span.h"
#include "kernels/kernels.h"
#include "test.h"

enum { N_VOCAB = 512, K_MAX = 6, REF_CTX = 256, REF_BATCH = 64, N_HIST_MAX = 200 };

static char model[1024];
static cv_span ref;
static bool ref_open;

/* Up to k ids proposed by d for one slot; returns n_out, or -1. */
static int32_t propose_one(cv_drafter *d, int32_t slot, const int32_t *hist, int32_t n_hist, int32_t k, int32_t *out)
{
    char err[512];
    cv_draft_req r = {.slot = slot, .hist = hist, .n_hist = n_hist, .k = k, .out = out};
    if (cv_drafter_propose(d, &r, 1, err, sizeof err)) {
        CHECKF(0, "propose: %s", err);
        return -1;
    }
    return r.n_out;
}

/* ---- ngram ---- */

static cv_drafter *open_ngram(void)
{
    char err[512];
    const cv_drafter_params p = {.n_slot = 2, .n_ctx = 64, .n_threads = 1, .n_vocab = N_VOCAB, .k_max = K_MAX};
    cv_drafter *d = cv_drafter_open("ngram", &p, err, sizeof err);
    CHECKF(d != NULL, "%s", err);
    return d;
}

static bool ids_equal(const int32_t *a, const int32_t *b, int32_t n)
{
    return memcmp(a, b, sizeof *a * (size_t)n) == 0;
}

static void test_ngram_most_recent_match(void)
{
    cv_drafter *d = open_ngram();
    if (!d)
        return;
    CHECK(strcmp(cv_drafter_name(d), "ngram") == 0);
    const int32_t hist[] = {10, 1, 2, 3, 20, 21, 1, 2, 3, 30, 31, 32, 1, 2, 3};
    int32_t out[K_MAX];
    CHECK(propose_one(d, 0, hist, 15, 4, out) == 4);
    CHECK(ids_equal(out, (const int32_t[]){30, 31, 32, 1}, 4));
    CHECK(propose_one(d, 0, hist, 15, 1, out) == 1 && out[0] == 30);
    cv_drafter_free(d);
}

static void test_ngram_prefers_longer(void)
{
    cv_drafter *d = open_ngram();
    if (!d)
        return;
    int32_t out[K_MAX];
    /* [1 2 3] follows by 40, [3] alone more recently by 50 */
    const int32_t three[] = {1, 2, 3, 40, 41, 3, 50, 1, 2, 3};
    CHECK(propose_one(d, 0, three, 10, 2, out) == 2 && out[0] == 40 && out[1] == 41);
    /* no earlier [9 2 3]; [2 3] followed by 60, [3] alone more recently by 70 */
    const int32_t two[] = {7, 2, 3, 60, 3, 70, 9, 2, 3};
    CHECK(propose_one(d, 0, two, 9, 2, out) == 2 && out[0] == 60 && out[1] == 3);
    /* only [3] recurs */
    const int32_t one[] = {3, 80, 5, 6, 3};
    CHECK(propose_one(d, 0, one, 5, 1, out) == 1 && out[0] == 80);
    cv_drafter_free(d);
}

static void test_ngram_no_match_and_history_end(void)
{
    cv_drafter *d = open_ngram();
    if (!d)
        return;
    int32_t out[K_MAX];
    const int32_t none[] = {1, 2, 3, 4};
    CHECK(propose_one(d, 0, none, 4, K_MAX, out) == 0);
    CHECK(propose_one(d, 0, none, 1, K_MAX, out) == 0);
    /* [1 2] recurs; its continuation runs into the end of the history */
    const int32_t tail[] = {5, 1, 2, 9, 1, 2};
    CHECK(propose_one(d, 0, tail, 6, 5, out) == 3);
    CHECK(ids_equal(out, (const int32_t[]){9, 1, 2}, 3));
    /* a run of one id: the match overlaps the last n-gram but ends before it */
    const int32_t run[] = {4, 4, 4, 4};
    CHECK(propose_one(d, 0, run, 4, 3, out) == 1 && out[0] == 4);
    cv_drafter_free(d);
}

static void test_ngram_several_requests(void)
{
    cv_drafter *d = open_ngram();
    if (!d)
        return;
    const int32_t a[] = {1, 2, 3, 4, 1, 2}, b[] = {7, 8, 9};
    int32_t out_a[K_MAX], out_b[K_MAX];
    cv_draft_req r[2] = {{.slot = 1, .hist = a, .n_hist = 6, .k = 2, .out = out_a},
                         {.slot = 0, .hist = b, .n_hist = 3, .k = 2, .out = out_b}};
    char err[512];
    CHECKF(cv_drafter_propose(d, r, 2, err, sizeof err) == 0, "%s", err);
    CHECK(r[0].n_out == 2 && out_a[0] == 3 && out_a[1] == 4);
    CHECK(r[1].n_out == 0);
    cv_drafter_free(d);
}

static void test_bad_requests_refused(void)
{
    cv_drafter *d = open_ngram();
    if (!d)
        return;
    const int32_t h[] = {1, 2, 1};
    int32_t out[K_MAX + 1], out2[K_MAX];
    char err[512];
    cv_draft_req r = {.slot = 0, .hist = h, .n_hist = 3, .k = K_MAX + 1, .out = out};
    CHECK(cv_drafter_propose(d, &r, 1, err, sizeof err) == -1 && strstr(err, "k = 7"));
    r.k = 1;
    r.slot = 2;
    CHECK(cv_drafter_propose(d, &r, 1, err, sizeof err) == -1 && strstr(err, "slot 2"));
    r.slot = 0;
    r.n_hist = 0;
    CHECK(cv_drafter_propose(d, &r, 1, err, sizeof err) == -1 && strstr(err, "empty history"));
    cv_draft_req twice[2] = {{.slot = 1, .hist = h, .n_hist = 3, .k = 1, .out = out},
                             {.slot = 1, .hist = h, .n_hist = 3, .k = 1, .out = out2}};
    CHECK(cv_drafter_propose(d, twice, 2, err, sizeof err) == -1 && strstr(err, "twice"));
    CHECK(twice[0].n_out == 0 && twice[1].n_out == 0);
    /* the same slots in the next call are fine */
    twice[1].slot = 0;
    CHECKF(cv_drafter_propose(d, twice, 2, err, sizeof err) == 0, "%s", err);
    CHECK(twice[0].n_out == 1 && out[0] == 2);
    cv_drafter_free(d);
}

/* ---- model ---- */

/* The greedy continuation of hist, k ids, by a separate one-slot stage
 * fed the history in chunks and then one token at a time. */
static void greedy_ref(const int32_t *hist, int32_t n_hist, int32_t k, int32_t *out)
{
    char err[512];
    if (!ref_open) {
        const cv_span_params p = {
            .l0 = 0, .l1 = -1, .n_threads = 1, .n_ctx = REF_CTX, .n_slot = 1, .n_batch = REF_BATCH};
        ref_open = cv_span_open(&ref, model, &p, err, sizeof err) == 0;
        CHECKF(ref_open, "%s", err);
        if (!ref_open)
            return;
    }
    cv_span_seq_free(&ref, 0);
    int32_t pos[REF_BATCH], seq[REF_BATCH] = {0}, next = -1;
    uint8_t want[REF_BATCH];
    for (int32_t start = 0; start < n_hist; start += REF_BATCH) {
        const int32_t n = n_hist - start < REF_BATCH ? n_hist - start : REF_BATCH;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = start + i;
            want[i] = start + i == n_hist - 1;
        }
        const cv_batch b = {.n_tokens = n, .token = hist + start, .pos = pos, .seq = seq, .want = want};
        CHECKF(cv_span_step(&ref, &b, NULL, NULL, &next, err, sizeof err) == 0, "%s", err);
    }
    for (int32_t j = 0; j < k; j++) {
        out[j] = next;
        if (j + 1 == k)
            break;
        int32_t p = n_hist + j;
        uint8_t w = 1;
        const cv_batch one = {.n_tokens = 1, .token = &out[j], .pos = &p, .seq = seq, .want = &w};
        CHECKF(cv_span_step(&ref, &one, NULL, NULL, &next, err, sizeof err) == 0, "%s", err);
    }
}

static int32_t hist_id(int32_t s, int32_t i) { return i == 0 ? 1 : 3 + (s * 131 + i * 17) % 500; }

static cv_drafter *open_model(int32_t n_slot, int32_t n_ctx)
{
    char err[512];
    const cv_drafter_params p = {.n_slot = n_slot, .n_ctx = n_ctx, .n_threads = 1, .n_vocab = N_VOCAB, .k_max = K_MAX};
    cv_drafter *d = cv_drafter_open(model, &p, err, sizeof err);
    CHECKF(d != NULL, "%s", err);
    return d;
}

/* d's proposal for hist equals the reference greedy continuation (of
 * n_expect ids) and allocates nothing. */
static void check_proposal(cv_drafter *d, int32_t slot, const int32_t *hist, int32_t n_hist, int32_t k,
                           int32_t n_expect, const char *what)
{
    int32_t got[K_MAX], want[K_MAX];
    const uint64_t before = cv_alloc_count();
    cv_alloc_forbid(1);
    const int32_t n = propose_one(d, slot, hist, n_hist, k, got);
    cv_alloc_forbid(0);
    CHECKF(cv_alloc_count() == before, "%s: the proposal allocated", what);
    CHECKF(n == n_expect, "%s: %d ids proposed, expected %d", what, n, n_expect);
    if (n_expect > 0)
        greedy_ref(hist, n_hist, n_expect, want);
    CHECKF(n != n_expect || ids_equal(got, want, n), "%s: proposal differs from the greedy continuation", what);
}

static void test_model_greedy_after_rejection_and_acceptance(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    cv_drafter *d = open_model(2, 160);
    if (!d)
        return;
    CHECK(strcmp(cv_drafter_name(d), "model") == 0);
    int32_t hist[N_HIST_MAX], draft[K_MAX];
    int32_t n = 12;
    for (int32_t i = 0; i < n; i++)
        hist[i] = hist_id(0, i);
    check_proposal(d, 0, hist, n, 5, 5, "fresh slot");
    CHECK(propose_one(d, 0, hist, n, 5, draft) == 5);
    check_proposal(d, 0, hist, n, 5, 5, "the same history again");

    /* the target accepts two drafts and then emits another id */
    hist[n] = draft[0];
    hist[n + 1] = draft[1];
    hist[n + 2] = (draft[2] + 1) % N_VOCAB;
    n += 3;
    check_proposal(d, 0, hist, n, 5, 5, "after a rejection");
    CHECK(propose_one(d, 0, hist, n, 4, draft) == 4);

    /* all four accepted, plus the target's own next id */
    memcpy(hist + n, draft, sizeof draft[0] * 4);
    n += 4;
    hist[n] = (draft[3] + 7) % N_VOCAB;
    n++;
    check_proposal(d, 0, hist, n, K_MAX, K_MAX, "after a full acceptance");

    /* a history that leaves the cache in the middle (a slot reused without
     * seq_free: positions 4.. differ), then a short prefix of it with a new
     * id */
    for (int32_t i = 4; i < n; i++)
        hist[i] = hist_id(5, i);
    check_proposal(d, 0, hist, n, 5, 5, "a history that differs from position 4");
    hist[3] = (hist[3] + 1) % N_VOCAB;
    check_proposal(d, 0, hist, 4, 3, 3, "after a rollback to 3 ids");
    check_proposal(d, 0, hist, 1, 2, 2, "a history of one id");

    cv_drafter_seq_free(d, 0);
    check_proposal(d, 0, hist, n, 5, 5, "after the slot was freed");
    cv_drafter_free(d);
}

static void test_model_two_slots_one_call(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    cv_drafter *together = open_model(2, 160), *alone = open_model(2, 160);
    if (together && alone) {
        /* 100 + 90 history ids: the catch-up takes more than one batch */
        enum { NA = 100, NB = 90 };
        int32_t a[NA], b[NB], out_a[K_MAX], out_b[K_MAX], ref_a[K_MAX], ref_b[K_MAX];
        for (int32_t i = 0; i < NA; i++)
            a[i] = hist_id(1, i);
        for (int32_t i = 0; i < NB; i++)
            b[i] = hist_id(2, i);
        cv_draft_req r[2] = {{.slot = 1, .hist = a, .n_hist = NA, .k = K_MAX, .out = out_a},
                             {.slot = 0, .hist = b, .n_hist = NB, .k = 3, .out = out_b}};
        char err[512];
        const uint64_t before = cv_alloc_count();
        CHECKF(cv_drafter_propose(together, r, 2, err, sizeof err) == 0, "%s", err);
        CHECK(cv_alloc_count() == before);
        CHECK(r[0].n_out == K_MAX && r[1].n_out == 3);
        CHECK(propose_one(alone, 1, a, NA, K_MAX, ref_a) == K_MAX);
        CHECK(propose_one(alone, 0, b, NB, 3, ref_b) == 3);
        CHECK(ids_equal(out_a, ref_a, K_MAX));
        CHECK(ids_equal(out_b, ref_b, 3));
        greedy_ref(a, NA, K_MAX, ref_a);
        greedy_ref(b, NB, 3, ref_b);
        CHECK(ids_equal(out_a, ref_a, K_MAX));
        CHECK(ids_equal(out_b, ref_b, 3));

        /* both rejected at different points, proposed together again */
        a[NA - 3] = (a[NA - 3] + 1) % N_VOCAB;
        b[NB - 1] = (out_b[0] + 1) % N_VOCAB;
        r[0].n_hist = NA - 2;
        CHECKF(cv_drafter_propose(together, r, 2, err, sizeof err) == 0, "%s", err);
        greedy_ref(a, NA - 2, K_MAX, ref_a);
        greedy_ref(b, NB, 3, ref_b);
        CHECK(r[0].n_out == K_MAX && ids_equal(out_a, ref_a, K_MAX));
        CHECK(r[1].n_out == 3 && ids_equal(out_b, ref_b, 3));
    }
    cv_drafter_free(together);
    cv_drafter_free(alone);
}

static void test_model_context_end(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    cv_drafter *d = open_model(1, 16);
    if (!d)
        return;
    int32_t hist[20];
    for (int32_t i = 0; i < 20; i++)
        hist[i] = hist_id(3, i);
    check_proposal(d, 0, hist, 13, 5, 4, "13 ids in a context of 16");
    check_proposal(d, 0, hist, 14, 5, 3, "14 ids in a context of 16");
    check_proposal(d, 0, hist, 16, 5, 1, "a full context");
    check_proposal(d, 0, hist, 17, 5, 0, "a history longer than the context");
    check_proposal(d, 0, hist, 10, 5, 5, "10 ids after those");
    cv_drafter_free(d);
}

static void test_model_bad_id_then_usable(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    cv_drafter *d = open_model(2, 64);
    if (!d)
        return;
    int32_t hist[10], out[K_MAX];
    for (int32_t i = 0; i < 10; i++)
        hist[i] = hist_id(4, i);
    check_proposal(d, 1, hist, 10, 4, 4, "before the bad id");
    hist[6] = N_VOCAB;
    char err[512];
    cv_draft_req r = {.slot = 1, .hist = hist, .n_hist = 10, .k = 4, .out = out};
    CHECK(cv_drafter_propose(d, &r, 1, err, sizeof err) == -1 && strstr(err, "vocabulary") && r.n_out == 0);
    hist[6] = 7;
    check_proposal(d, 1, hist, 10, 4, 4, "after the bad id");
    cv_drafter_free(d);
}

static void test_model_vocab_mismatch(void)
{
    if (!test_shared_path(model, sizeof model, "models/stories260K.gguf"))
        return;
    char err[512] = "";
    const cv_drafter_params p = {.n_slot = 1, .n_ctx = 32, .n_threads = 1, .n_vocab = 1000, .k_max = K_MAX};
    CHECK(cv_drafter_open(model, &p, err, sizeof err) == NULL);
    CHECKF(strstr(err, "512") && strstr(err, "1000"), "message: %s", err);
}

static void test_missing_draft_model(void)
{
    char err[512] = "";
    const cv_drafter_params p = {.n_slot = 1, .n_ctx = 32, .n_threads = 1, .n_vocab = N_VOCAB, .k_max = K_MAX};
    CHECK(cv_drafter_open("/nonexistent/draft.gguf", &p, err, sizeof err) == NULL);
    CHECKF(strstr(err, "/nonexistent/draft.gguf") != NULL, "message: %s", err);
    CHECK(cv_drafter_open("", &p, err, sizeof err) == NULL && err[0]);
}

int main(void)
{
    cv_kernels_init(0);
    TEST_RUN(test_ngram_most_recent_match);
    TEST_RUN(test_ngram_prefers_longer);
    TEST_RUN(test_ngram_no_match_and_history_end);
    TEST_RUN(test_ngram_several_requests);
    TEST_RUN(test_bad_requests_refused);
    TEST_RUN(test_model_greedy_after_rejection_and_acceptance);
    TEST_RUN(test_model_two_slots_one_call);
    TEST_RUN(test_model_context_end);
    TEST_RUN(test_model_bad_id_then_usable);
    TEST_RUN(test_model_vocab_mismatch);
    TEST_RUN(test_missing_draft_model);
    if (ref_open)
        cv_span_close(&ref);
    return test_summary();
}
