/* test_embed.c: embeddings through the engine API, against a reference
 * computed here without the engine's pooling code: stories260K's forward
 * pass bound without its output matrix (so it returns the last layer's hidden
 * states) runs the prompt one token at a time; each state gets the output
 * norm, the states are summed in position order and divided by their
 * number, and the mean is L2-normalized with the norm summed in double.
 *
 * Tolerance: none. Every step the engine takes (the output norm of a row,
 * float sums in position order, the division, the normalization) has one
 * order of operations, and the forward pass gives the same bits for a
 * token whatever its batch and thread count (infer/forward.h), so the
 * embedding must equal the reference bit for bit: alone, batched with
 * another sequence that samples, cut into several batches, on 1 and 2
 * threads, on a 2- and a 3-stage chain, and after the last stage died
 * and a standby took its place mid-prompt. CLS and last pooling, a pool emptied by a truncate and the
 * refusal of an unknown want are checked too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convoy.h"
#include "core/pool.h"
#include "infer/forward.h"
#include "infer/kv.h"
#include "kernels/kernels.h"
#include "model/llama.h"
#include "test.h"
#include "stage_test.h"

#define N_MAX 64
#define N_CTX 128

static const char *const PROMPT = "Once upon a time, there was a little girl who liked to play in the park.";
static const char *const OTHER = "The dog ran to the big tree.";

/* The prompt's final normalized hidden states [n][n_embd], one token per
 * forward pass of the model bound without its output matrix. */
static int reference_states(const char *path, const int32_t *tok, int n, float *states)
{
    char err[512];
    cv_llama m;
    CHECKF(cv_llama_load(&m, path, 0, -1, err, sizeof err) == 0, "%s", err);
    const cv_llama_hparams *hp = &m.hp;
    const int32_t n_layer = hp->n_layer, n_embd = hp->n_embd;
    m.hp.n_layer = n_layer + 1; /* the layers end before a head: the pass returns hidden states */
    cv_kv kv; /* the engine's default cache type, as the contexts below have */
    const cv_type kv_type = convoy_ctx_default_params().kv_f16 ? CV_TYPE_F16 : CV_TYPE_F32;
    CHECKF(cv_kv_create(&kv, kv_type, 1, N_CTX, 0, n_layer, hp->n_head_kv * hp->head_dim, err, sizeof err) == 0,
           "%s", err);
    cv_pool *pool = cv_pool_create(1);
    cv_forward *f = cv_forward_create(&m, &kv, pool, NULL, 1, err, sizeof err);
    CHECKF(f != NULL, "%s", err);
    float *h = malloc(sizeof(float) * (size_t)n_embd);
    int rc = f && h ? 0 : -1;
    for (int32_t t = 0; t < n && !rc; t++) {
        const int32_t seq = 0;
        const uint8_t want = CV_WANT_NONE;
        const cv_batch b = {.n_tokens = 1, .token = &tok[t], .pos = &t, .seq = &seq, .want = &want};
        rc = cv_forward_run(f, &b, NULL, h, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        double sum = 0.0; /* the output norm as llama.cpp's rms_norm: squares summed in double */
        for (int32_t i = 0; i < n_embd; i++)
            sum += (double)(h[i] * h[i]);
        const float scale = 1.0f / sqrtf((float)(sum / n_embd) + hp->rms_eps);
        for (int32_t i = 0; i < n_embd; i++)
            states[(size_t)t * n_embd + i] = (h[i] * scale) * m.output_norm[i];
    }
    free(h);
    cv_forward_free(f);
    cv_pool_free(pool);
    cv_kv_free(&kv);
    m.hp.n_layer = n_layer;
    cv_llama_free(&m);
    return rc;
}

/* llama.cpp's common_embd_normalize (L2), in place. */
static void normalize(float *x, int32_t n)
{
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += x[i] * x[i];
    sum = sqrt(sum);
    const double norm = sum > 0.0 ? 1.0 / sum : 0.0;
    for (int32_t i = 0; i < n; i++)
        x[i] = (float)(x[i] * norm);
}

/* The reference embedding of states [n][n_embd] pooled as `pooling`. */
static void reference_embedding(const float *states, int n, int32_t n_embd, int pooling, float *out)
{
    const float *from = pooling == CONVOY_POOLING_LAST ? states + (size_t)(n - 1) * n_embd : states;
    memcpy(out, from, sizeof(float) * (size_t)n_embd);
    if (pooling == CONVOY_POOLING_MEAN) {
        for (int t = 1; t < n; t++)
            for (int32_t i = 0; i < n_embd; i++)
                out[i] += states[(size_t)t * n_embd + i];
        for (int32_t i = 0; i < n_embd; i++)
            out[i] /= (float)n;
    }
    normalize(out, n_embd);
}

typedef struct setup {
    char path[512];
    convoy_model *m;
    convoy_model_info info;
    int32_t tok[N_MAX], other[N_MAX];
    int n_tok, n_other;
    float *states;
    float *ref, *got; /* [n_embd] the reference's mean embedding, and the engine's */
} setup;

static int setup_open(setup *s)
{
    char err[512];
    memset(s, 0, sizeof *s);
    if (!test_shared_path(s->path, sizeof s->path, "models/stories260K.gguf"))
        return -1;
    s->m = convoy_model_load(s->path, err, sizeof err);
    CHECKF(s->m != NULL, "%s", err);
    if (!s->m)
        return -1;
    convoy_model_get_info(s->m, &s->info);
    s->n_tok = convoy_tokenize(s->m, PROMPT, strlen(PROMPT), true, false, s->tok, N_MAX);
    s->n_other = convoy_tokenize(s->m, OTHER, strlen(OTHER), true, false, s->other, N_MAX);
    CHECK(s->n_tok > 8 && s->n_other > 3);
    const size_t ne = (size_t)s->info.n_embd;
    s->states = malloc(sizeof(float) * (size_t)s->n_tok * ne);
    s->ref = malloc(sizeof(float) * ne);
    s->got = malloc(sizeof(float) * ne);
    if (!s->states || !s->ref || !s->got || s->n_tok <= 8 || reference_states(s->path, s->tok, s->n_tok, s->states))
        return -1;
    reference_embedding(s->states, s->n_tok, s->info.n_embd, CONVOY_POOLING_MEAN, s->ref);
    return 0;
}

static void setup_close(setup *s)
{
    free(s->states);
    free(s->ref);
    free(s->got);
    convoy_model_free(s->m);
}

static convoy_ctx *make_ctx_on(setup *s, int threads, int pooling, const char *nodes, const char *split,
                               const char *standby)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.nodes = nodes;
    p.standby = standby;
    p.split = split;
    p.want_logits = nodes != NULL; /* the sampled row's logits are checked */
    p.n_threads = threads;
    p.n_slot = 2;
    p.n_batch = 64;
    p.n_ctx = N_CTX;
    p.pooling = pooling;
    convoy_ctx *c = convoy_ctx_create(s->m, &p, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    return c;
}

static convoy_ctx *make_ctx(setup *s, int threads, int pooling)
{
    return make_ctx_on(s, threads, pooling, NULL, NULL, NULL);
}

/* Runs the prompt into slot 0 in batches of chunk tokens (its rows pooled,
 * the last one _EMBED); with `other`, slot 1's prompt rides in the first
 * batch, its last row sampled. Returns the embedding (copied to out) and
 * checks the sampled row. 0, or -1 on failure. */
static pid_t kill_after_first; /* a stage SIGKILLed after the first batch (test_failover), or 0 */

static int embed(convoy_ctx *c, const setup *s, int chunk, bool other, float *out)
{
    int32_t tok[2 * N_MAX], pos[2 * N_MAX], seq[2 * N_MAX], ids[2 * N_MAX];
    uint8_t want[2 * N_MAX];
    char err[512];
    for (int start = 0; start < s->n_tok; start += chunk) {
        int n = 0, embed_row = 0;
        for (int t = start; t < s->n_tok && t < start + chunk; t++, n++) {
            tok[n] = s->tok[t], pos[n] = t, seq[n] = 0;
            want[n] = t == s->n_tok - 1 ? CONVOY_WANT_EMBED : CONVOY_WANT_POOL;
        }
        for (int t = 0; other && start == 0 && t < s->n_other; t++, n++) {
            tok[n] = s->other[t], pos[n] = t, seq[n] = 1;
            want[n] = t == s->n_other - 1 ? CONVOY_WANT_SAMPLE : CONVOY_WANT_NONE;
        }
        const convoy_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq = seq, .want = want};
        if (convoy_step(c, &b, ids, err, sizeof err)) {
            CHECKF(0, "%s", err);
            return -1;
        }
        if (kill_after_first) {
            test_stop_stage(kill_after_first);
            kill_after_first = 0;
        }
        const bool last = start + chunk >= s->n_tok;
        if (last) {
            CHECK(ids[0] == -1 && convoy_embedding(c, 0) != NULL);
            memcpy(out, convoy_embedding(c, 0), sizeof(float) * (size_t)s->info.n_embd);
            embed_row = 1;
        }
        if (other && start == 0) { /* the sampled row: an id and logits, and no embedding */
            CHECK(ids[embed_row] >= 0 && convoy_embedding(c, embed_row) == NULL);
            CHECK(convoy_logits(c, embed_row)[ids[embed_row]] != 0.0f);
        }
    }
    return 0;
}

static void check_same(const float *a, const float *b, int32_t n, const char *what)
{
    int diff = -1;
    for (int32_t i = 0; i < n && diff < 0; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            diff = i;
    CHECKF(diff < 0, "%s: element %d is %.9g, the reference's %.9g", what, diff, a[diff], b[diff]);
}

static void test_mean_bit_identical(void)
{
    setup s;
    if (setup_open(&s)) {
        setup_close(&s);
        return;
    }
    const int32_t ne = s.info.n_embd;
    const float *ref = s.ref;
    float *got = s.got;
    double norm = 0;
    for (int32_t i = 0; i < ne; i++)
        norm += (double)ref[i] * ref[i];
    CHECKF(fabs(norm - 1.0) < 1e-5, "norm %g", norm);
    for (int threads = 1; threads <= 2; threads++) {
        convoy_ctx *c = make_ctx(&s, threads, 0);
        CHECK(convoy_ctx_pooling(c) == CONVOY_POOLING_MEAN); /* stories260K has no pooling_type */
        char what[64];
        static const struct {
            int chunk;
            bool other;
            const char *name;
        } runs[] = {{N_MAX, false, "alone"}, {N_MAX, true, "batched"}, {5, false, "chunks of 5"},
                    {3, true, "chunks of 3, batched"}};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0] && c; r++) {
            char err[512];
            CHECK(convoy_seq_free(c, 0, err, sizeof err) == 0 && convoy_seq_free(c, 1, err, sizeof err) == 0);
            if (embed(c, &s, runs[r].chunk, runs[r].other, got) == 0) {
                snprintf(what, sizeof what, "%s, %d threads", runs[r].name, threads);
                check_same(got, ref, ne, what);
            }
        }
        convoy_ctx_free(c);
    }
    setup_close(&s);
}

/* CLS and last pooling; a truncate to 0 empties the pool, so a second run
 * of the prompt gives the same vector. */
static void test_cls_last_and_reset(void)
{
    setup s;
    if (setup_open(&s)) {
        setup_close(&s);
        return;
    }
    const int32_t ne = s.info.n_embd;
    float *ref = s.ref, *got = s.got; /* the reference's is pooled anew for each type */
    const int types[2] = {CONVOY_POOLING_CLS, CONVOY_POOLING_LAST};
    for (int k = 0; k < 2; k++) {
        convoy_ctx *c = make_ctx(&s, 1, types[k]);
        if (!c)
            continue;
        char err[512];
        reference_embedding(s.states, s.n_tok, ne, types[k], ref);
        for (int round = 0; round < 2; round++) {
            if (embed(c, &s, 4, false, got) == 0)
                check_same(got, ref, ne, types[k] == CONVOY_POOLING_CLS ? "cls" : "last");
            CHECK(convoy_seq_truncate(c, 0, 0, err, sizeof err) == 0);
        }
        convoy_ctx_free(c);
    }
    /* a want the engine does not know is refused, naming it */
    convoy_ctx *c = make_ctx(&s, 1, 0);
    if (c) {
        char err[512] = "";
        const int32_t pos = 0, seq = 0, ids_n = 1;
        const uint8_t want = CONVOY_WANT_EMBED + 1;
        int32_t id;
        const convoy_batch b = {.n_tokens = ids_n, .token = s.tok, .pos = &pos, .seq = &seq, .want = &want};
        CHECK(convoy_step(c, &b, &id, err, sizeof err) == -1 && strstr(err, "want 5"));
        convoy_ctx_free(c);
    }
    setup_close(&s);
}

/* Three `convoy stage` processes of the model, and their end (a pid of 0
 * is one that was stopped already). */
static void start_stages(const char *path, pid_t pid[3], int port[3])
{
    for (int i = 0; i < 3; i++)
        pid[i] = test_start_stage(path, &port[i]);
}

static void stop_stages(const pid_t pid[3])
{
    for (int i = 0; i < 3; i++)
        if (pid[i])
            test_stop_stage(pid[i]);
}

/* A 2- and a 3-stage chain (the last stage pools; RESULT carries the
 * vector) give the reference's bits, with a sampled row beside the
 * embedding (logits and embedding rows in one RESULT) and in chunks. */
static void test_chain_bit_identical(void)
{
    setup s;
    if (setup_open(&s)) {
        setup_close(&s);
        return;
    }
    const int32_t ne = s.info.n_embd;
    int port[3];
    pid_t pid[3];
    start_stages(s.path, pid, port);
    char nodes[2][128];
    snprintf(nodes[0], sizeof nodes[0], "127.0.0.1:%d,127.0.0.1:%d", port[0], port[1]);
    snprintf(nodes[1], sizeof nodes[1], "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", port[0], port[1], port[2]);
    const char *split[2] = {"2,3", "1,2,2"};
    for (int k = 0; k < 2; k++) {
        convoy_ctx *c = make_ctx_on(&s, 1, 0, nodes[k], split[k], NULL);
        if (!c)
            continue;
        char what[64];
        for (int chunk = 4; chunk <= N_MAX; chunk += N_MAX - 4) {
            char err[512];
            CHECK(convoy_seq_free(c, 0, err, sizeof err) == 0 && convoy_seq_free(c, 1, err, sizeof err) == 0);
            if (embed(c, &s, chunk, true, s.got) == 0) {
                snprintf(what, sizeof what, "%d stages, chunks of %d", k + 2, chunk);
                check_same(s.got, s.ref, ne, what);
            }
        }
        convoy_ctx_free(c);
    }
    stop_stages(pid);
    setup_close(&s);
}

/* The last stage dies with a slot's pool half full: the standby takes its
 * place, the head's journal replays the pooled rows as pooled rows, and
 * the embedding is still the reference's. */
static void test_failover(void)
{
    setup s;
    if (setup_open(&s)) {
        setup_close(&s);
        return;
    }
    const int32_t ne = s.info.n_embd;
    int port[3];
    pid_t pid[3];
    start_stages(s.path, pid, port);
    char nodes[64], spare[32];
    snprintf(nodes, sizeof nodes, "127.0.0.1:%d,127.0.0.1:%d", port[0], port[1]);
    snprintf(spare, sizeof spare, "127.0.0.1:%d", port[2]);
    convoy_ctx *c = make_ctx_on(&s, 1, 0, nodes, "2,3", spare);
    if (c) {
        kill_after_first = pid[1];
        pid[1] = 0;
        if (embed(c, &s, 6, true, s.got) == 0)
            check_same(s.got, s.ref, ne, "after a failover");
        convoy_ctx_stats st;
        convoy_ctx_get_stats(c, &st);
        CHECKF(st.failovers == 1, "%llu failovers", (unsigned long long)st.failovers);
        convoy_ctx_free(c);
    }
    stop_stages(pid);
    setup_close(&s);
}

int main(void)
{
    cv_kernels_init(0);
    TEST_RUN(test_mean_bit_identical);
    TEST_RUN(test_cls_last_and_reset);
    TEST_RUN(test_chain_bit_identical);
    TEST_RUN(test_failover);
    return test_summary();
}
