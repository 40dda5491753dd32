/* test_constraint.c: output held to a grammar (convoy_set_grammar, over
 * infer/constraint.h) on stories260K, one machine.
 *
 * - Sampled at temperature 1 with 12 seeds, every output is a sentence of
 *   the grammar (checked with the grammar matcher itself, and by its shape)
 *   that ends with EOS by itself.
 * - The same seeds batched three at a time, and with ngram speculation, give
 *   the very ids they give alone.
 * - A slot cut back (convoy_seq_truncate) and run again greedily continues
 *   with the same ids: the grammar's state follows the cut.
 * - A forced token the grammar refuses ends the slot: only EOS may follow.
 * - A grammar from before the slot's end, a malformed one (named by line),
 *   and one over the size cap are refused. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "convoy.h"
#include "infer/grammar.h"
#include "kernels/kernels.h"
#include "test.h"
#include "model_test.h"

#define N_CTX 256
#define N_PREDICT 120

static convoy_model *model;
static convoy_model_info info;

/* A sentence, a number and a list: enough choice for the seeds to matter,
 * bounded so that every run ends. */
static const char GRAMMAR[] = "root ::= \"Once\" (\" upon a time\" | \" there was\") \" \" name \" had \" num \" \" "
                              "pet (\", \" pet){0,2} \".\"\n"
                              "name ::= [A-Z] [a-z]{1,8}\n"
                              "num ::= [1-9] [0-9]?\n"
                              "pet ::= \"cats\" | \"dogs\" | \"birds\"\n";

typedef struct run {
    int32_t hist[N_CTX];
    int32_t n_prompt, n_hist;
    bool ended; /* with EOS */
} run;

static int on_token(void *user, int32_t id)
{
    run *r = user;
    if (id == info.eos) {
        r->ended = true;
        return 1;
    }
    return 0;
}

static void run_init(run *r)
{
    memset(r, 0, sizeof *r);
    r->n_prompt = convoy_tokenize(model, "Tell me a story.", 16, true, false, r->hist, N_CTX);
}

/* Sets slot seq up (seed, temperature) with the grammar from the prompt's end. */
static void setup(convoy_ctx *c, int32_t seq, const run *r, uint64_t seed, float temp)
{
    char err[512];
    convoy_sampling_params sp = convoy_sampling_default_params();
    sp.seed = seed;
    sp.temp = temp;
    CHECKF(convoy_set_sampler(c, seq, &sp, err, sizeof err) == 0, "%s", err);
    CHECKF(convoy_set_grammar(c, seq, GRAMMAR, strlen(GRAMMAR), r->n_prompt, err, sizeof err) == 0, "%s", err);
}

/* Generates one run in slot 0; the slot is freed after. */
static void generate_alone(convoy_ctx *c, convoy_spec *spec, run *r, uint64_t seed, float temp)
{
    char err[512];
    setup(c, 0, r, seed, temp);
    r->n_hist = r->n_prompt;
    convoy_gen_stats st;
    CHECKF(convoy_generate(c, spec, 0, r->hist, r->n_prompt, N_PREDICT, on_token, r, &st, err, sizeof err) == 0, "%s",
           err);
    r->n_hist = r->n_prompt + st.n_gen;
    convoy_seq_free(c, 0, err, sizeof err);
    if (spec)
        convoy_spec_seq_free(spec, 0);
}

/* The text of the generated ids (EOS left out). */
static int text_of(const run *r, char *out, int cap)
{
    int n = 0;
    for (int32_t i = r->n_prompt; i < r->n_hist; i++) {
        if (r->hist[i] == info.eos)
            break;
        const int k = convoy_token_piece(model, r->hist[i], out + n, cap - n);
        if (k < 0)
            return -1;
        n += k;
    }
    out[n] = 0;
    return n;
}

/* One machine, N_CTX positions per slot; NULL (reported) on failure. */
static convoy_ctx *make_ctx(int32_t n_slot)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_ctx = N_CTX;
    p.n_slot = n_slot;
    convoy_ctx *c = convoy_ctx_create(model, &p, err, sizeof err);
    CHECKF(c, "%s", err);
    return c;
}

static run alone[12];

static void test_sentences(void)
{
    char err[512], text[1024];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_ctx = N_CTX;
    convoy_ctx *c = convoy_ctx_create(model, &p, err, sizeof err);
    CHECKF(c, "%s", err);
    if (!c)
        return;
    cv_grammar *g = cv_grammar_parse(GRAMMAR, strlen(GRAMMAR), err, sizeof err);
    CHECKF(g, "%s", err);
    int distinct = 0;
    char first[1024] = "";
    for (int i = 0; i < 12 && g; i++) {
        run_init(&alone[i]);
        generate_alone(c, NULL, &alone[i], 100 + (uint64_t)i, 1.0f);
        const int n = text_of(&alone[i], text, sizeof text);
        cv_grammar_state *s = cv_grammar_state_create(g);
        const bool held = n >= 0 && s && cv_grammar_accept(s, text, (size_t)n) == 0 && cv_grammar_complete(s);
        CHECKF(alone[i].ended && held && !strncmp(text, "Once ", 5) && text[n - 1] == '.', "seed %d: \"%s\"%s",
               100 + i, text, alone[i].ended ? "" : " (no EOS)");
        cv_grammar_state_free(s);
        if (i == 0)
            snprintf(first, sizeof first, "%s", text);
        distinct += i == 0 || strcmp(text, first) != 0;
        if (i < 3)
            printf("  seed %d: %s\n", 100 + i, text);
    }
    CHECKF(distinct > 3, "%d of 12 outputs differ from the first", distinct);
    cv_grammar_free(g);
    convoy_ctx_free(c);
}

/* The same seeds three at a time in one context, with and without ngram
 * drafts: the ids each gets alone. */
static void test_batched_and_speculative(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(3);
    if (!c)
        return;
    for (int with_spec = 0; with_spec < 2; with_spec++) {
        convoy_spec *spec = NULL;
        if (with_spec) {
            convoy_spec_params sp = convoy_spec_default_params();
            sp.draft = "ngram";
            sp.k = 4;
            sp.k_max = 4;
            spec = convoy_spec_create(c, model, &sp, err, sizeof err);
            CHECKF(spec, "%s", err);
        }
        for (int i = 0; i < 12; i += 3) {
            /* batched: one step decodes the three slots together */
            run r[3];
            int32_t tok[3], pos[3], seq[3];
            uint8_t want[3];
            bool live[3];
            for (int k = 0; k < 3; k++) {
                run_init(&r[k]);
                setup(c, k, &r[k], 100 + (uint64_t)(i + k), 1.0f);
                r[k].n_hist = r[k].n_prompt;
            }
            /* prompts one by one, then decode rounds of all live slots */
            for (int k = 0; k < 3; k++) {
                int32_t ids[1];
                int32_t ppos[64], pseq[64];
                uint8_t pwant[64];
                for (int32_t t = 0; t < r[k].n_prompt; t++) {
                    ppos[t] = t;
                    pseq[t] = k;
                    pwant[t] = t == r[k].n_prompt - 1;
                }
                const convoy_batch b = {r[k].n_prompt, r[k].hist, ppos, pseq, pwant};
                CHECKF(convoy_step(c, &b, ids, err, sizeof err) == 0, "%s", err);
                r[k].hist[r[k].n_hist++] = ids[0];
                live[k] = ids[0] != info.eos;
                r[k].ended = !live[k];
            }
            for (int round = 0; round < N_PREDICT; round++) {
                int n = 0;
                for (int k = 0; k < 3; k++)
                    if (live[k] && r[k].n_hist - r[k].n_prompt < N_PREDICT) {
                        tok[n] = r[k].hist[r[k].n_hist - 1];
                        pos[n] = r[k].n_hist - 1;
                        seq[n] = k;
                        want[n] = 1;
                        n++;
                    }
                if (!n)
                    break;
                int32_t ids[3];
                const convoy_batch b = {n, tok, pos, seq, want};
                CHECKF(convoy_step(c, &b, ids, err, sizeof err) == 0, "%s", err);
                for (int j = 0; j < n; j++) {
                    run *rr = &r[seq[j]];
                    rr->hist[rr->n_hist++] = ids[j];
                    if (ids[j] == info.eos)
                        live[seq[j]] = false, rr->ended = true;
                }
            }
            for (int k = 0; k < 3; k++) {
                convoy_seq_free(c, k, err, sizeof err);
                CHECKF(r[k].n_hist == alone[i + k].n_hist &&
                           !memcmp(r[k].hist, alone[i + k].hist, sizeof(int32_t) * (size_t)r[k].n_hist),
                       "seed %d batched%s differs from alone", 100 + i + k, with_spec ? " (spec run)" : "");
            }
            if (spec) { /* each alone, speculating */
                for (int k = 0; k < 3; k++) {
                    run s;
                    run_init(&s);
                    generate_alone(c, spec, &s, 100 + (uint64_t)(i + k), 1.0f);
                    CHECKF(s.n_hist == alone[i + k].n_hist &&
                               !memcmp(s.hist, alone[i + k].hist, sizeof(int32_t) * (size_t)s.n_hist),
                           "seed %d with ngram drafts differs from plain decoding", 100 + i + k);
                }
            }
        }
        convoy_spec_free(spec);
    }
    convoy_ctx_free(c);
}

/* Greedy: cut back into the generated part and decode again, token by
 * token: the same ids, so the grammar's state went back with the slot. */
static void test_truncate(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(1);
    if (!c)
        return;
    run a;
    run_init(&a);
    setup(c, 0, &a, 1, 0.0f);
    convoy_gen_stats st;
    CHECKF(convoy_generate(c, NULL, 0, a.hist, a.n_prompt, N_PREDICT, on_token, &a, &st, err, sizeof err) == 0, "%s",
           err);
    a.n_hist = a.n_prompt + st.n_gen;
    CHECK(a.ended && st.n_gen > 6);
    for (int32_t keep = a.n_hist - 2; keep >= a.n_prompt; keep -= 3) {
        CHECK(convoy_seq_truncate(c, 0, keep, err, sizeof err) == 0);
        bool same = true;
        for (int32_t pos = keep; pos + 1 < a.n_hist && same; pos++) {
            const int32_t seq = 0;
            const uint8_t want = 1;
            int32_t id;
            const convoy_batch b = {1, &a.hist[pos], &pos, &seq, &want};
            same = convoy_step(c, &b, &id, err, sizeof err) == 0 && id == a.hist[pos + 1];
        }
        CHECKF(same, "cut back to %d, the slot does not go on as before", keep);
    }
    convoy_ctx_free(c);
}

/* A token the grammar refuses, forced in: from then on only EOS. */
static void test_forced_refusal(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(1);
    if (!c)
        return;
    run a;
    run_init(&a);
    setup(c, 0, &a, 5, 1.0f);
    int32_t ids[2];
    a.hist[a.n_prompt] = convoy_tokenize(model, "x", 1, false, false, ids, 2) == 1 ? ids[0] : 0;
    int32_t pos[64], seq[64];
    uint8_t want[64] = {0};
    for (int32_t t = 0; t <= a.n_prompt; t++)
        pos[t] = t, seq[t] = 0;
    want[a.n_prompt] = 1;
    const convoy_batch b = {a.n_prompt + 1, a.hist, pos, seq, want};
    CHECKF(convoy_step(c, &b, ids, err, sizeof err) == 0, "%s", err);
    CHECKF(ids[0] == info.eos, "after a refused token the slot samples %d, not EOS %d", ids[0], info.eos);
    convoy_ctx_free(c);
}

static void test_refusals(void)
{
    char err[512];
    convoy_ctx *c = make_ctx(1);
    if (!c)
        return;
    convoy_sampling_params sp = convoy_sampling_default_params();
    CHECK(convoy_set_sampler(c, 0, &sp, err, sizeof err) == 0);
    const char *bad = "root ::= \"a\" b\n";
    CHECK(convoy_set_grammar(c, 0, bad, strlen(bad), 0, err, sizeof err) == -1 && strstr(err, "line 1") &&
          strstr(err, "b"));
    const int32_t tok[2] = {1, 300}, pos[2] = {0, 1}, seq[2] = {0, 0};
    const uint8_t want[2] = {0, 0};
    const convoy_batch b = {2, tok, pos, seq, want};
    int32_t ids[1];
    CHECK(convoy_step(c, &b, ids, err, sizeof err) == 0);
    CHECK(convoy_set_grammar(c, 0, GRAMMAR, strlen(GRAMMAR), 1, err, sizeof err) == -1 && strstr(err, "holds 2"));
    char *big = malloc(70000);
    memset(big, ' ', 70000);
    memcpy(big, "root ::= \"a\"", 12);
    CHECK(convoy_grammar_check(big, 70000, err, sizeof err) == -1 && strstr(err, "70000 bytes"));
    free(big);
    convoy_ctx_free(c);
}

int main(void)
{
    cv_kernels_init(0);
    if (!(model = test_load_stories()))
        return test_summary();
    convoy_model_get_info(model, &info);
    TEST_RUN(test_sentences);
    TEST_RUN(test_batched_and_speculative);
    TEST_RUN(test_truncate);
    TEST_RUN(test_forced_refusal);
    TEST_RUN(test_refusals);
    convoy_model_free(model);
    return test_summary();
}
