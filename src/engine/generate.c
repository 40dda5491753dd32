/* generate.c: one sequence from prompt to its last token (include/convoy.h),
 * plainly or speculatively, for the CLI and the benchmarks. The prompt goes
 * in chunks of the context's batch size; then each round feeds the newest
 * token, with the drafts of the slot's convoy_spec when there is one, and
 * hands every emitted token to the caller in order.
 *
 * Windows in flight (a pipeline, convoy_spec_windows > 1): while a window
 * travels, the next is drafted as if it were accepted whole and sent
 * behind it, its first row a guess of what the previous window's last row
 * samples (span.h), up to D windows at once. hist holds the emitted tokens,
 * then the drafts in flight (the history the drafter continues). A window
 * cut short makes every later one stale: their results are collected and
 * dropped, and the next window starts again from the last emitted token.
 * Buffers are sized at the call, so rounds allocate nothing. */
#include <string.h>

#include "convoy.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"

/* A window in flight: rows at history indices [first, first + n_rows),
 * each row's output the token at the next index. */
typedef struct gen_window {
    int32_t first, n_rows;
    bool guess;  /* its first row guesses the previous window's last output */
    bool stale;  /* an earlier window was cut short */
    bool asked;  /* the drafter was asked (a round of 0 drafts measures the fixed cost too) */
    double sent; /* seconds */
} gen_window;

typedef struct gen_state {
    convoy_ctx *c;
    convoy_spec *spec;
    int32_t seq, n_predict;
    double stage_s; /* seconds per token at the slowest stage */
    int32_t *hist, n_hist; /* emitted tokens; drafts in flight up to hyp_end */
    int32_t hyp_end;       /* index after the last row sent to a live window */
    int32_t *tok, *pos, *seqs, *out;
    uint8_t *want;
    gen_window win[CONVOY_SPEC_WINDOWS_MAX];
    int oldest, in_flight, live; /* windows in flight; of them not stale */
    convoy_token_fn on_token;
    void *user;
    convoy_gen_stats *st;
    bool stop;
} gen_state;

/* Sends the prompt chunk of n tokens at position p (its last row samples
 * when it ends the prompt); the batch's arrays are copied on submit. */
static int send_chunk(gen_state *g, int32_t p, int32_t n, int32_t n_hist, char *err, size_t errlen)
{
    for (int32_t i = 0; i < n; i++) {
        g->pos[i] = p + i;
        g->want[i] = p + i == n_hist - 1;
    }
    const convoy_batch b = {.n_tokens = n, .token = g->hist + p, .pos = g->pos, .seq = g->seqs, .want = g->want};
    return convoy_submit(g->c, &b, err, errlen);
}

/* The history [seq_len, n_hist) in prompt chunks, up to depth in flight,
 * so that on a pipeline every stage works on one (a stage runs a slot's
 * chunks in order, as it runs windows); the last chunk's sampled id into
 * g->out. */
static int prefill(gen_state *g, int32_t n_hist, char *err, size_t errlen)
{
    int in_flight = 0, rc = 0;
    for (int32_t p = convoy_seq_len(g->c, g->seq); !rc && (p < n_hist || in_flight > 0);) {
        const int32_t n = p < n_hist ? convoy_ctx_prefill_chunk(g->c, n_hist - p) : 0;
        if (n > 0 && in_flight < convoy_ctx_prefill_depth(g->c)) {
            rc = send_chunk(g, p, n, n_hist, err, errlen);
            p += n;
            in_flight++;
            continue;
        }
        int32_t n_out;
        rc = convoy_collect(g->c, g->out, &n_out, err, errlen);
        in_flight--;
    }
    return rc;
}

/* Hands emitted tokens to the caller until it or n_predict stops. */
static void emit(gen_state *g, const int32_t *ids, int32_t n)
{
    for (int32_t i = 0; i < n && !g->stop; i++) {
        g->hist[g->n_hist++] = ids[i];
        g->st->n_gen++;
        g->stop = g->on_token(g->user, ids[i]) || g->st->n_gen == g->n_predict;
    }
}

/* Drafts and sends the next window; *sent 0 when there was nothing to send
 * behind the windows in flight (no drafts, or no room for more). */
static int send_window(gen_state *g, int *sent, char *err, size_t errlen)
{
    *sent = 0;
    const bool guess = g->live > 0;
    /* all drafts in flight accepted, plus the last window's own output */
    const int32_t room = g->n_predict - g->st->n_gen - 1 - (g->hyp_end - g->n_hist);
    if (guess && room < 1)
        return 0;
    convoy_spec_req req = {.seq = g->seq, .hist = g->hist, .n_hist = g->hyp_end, .max_draft = room > 0 ? room : 0,
                           .drafts = g->tok + 1};
    const bool ask = g->spec && req.max_draft > 0;
    if (ask && convoy_spec_propose(g->spec, &req, 1, err, errlen))
        return -1;
    if (guess && req.n_draft == 0)
        return 0;
    /* a first window leads with the newest emitted token */
    const int32_t *rows = guess ? g->tok + 1 : g->tok, n_rows = req.n_draft + (guess ? 0 : 1);
    const int32_t first = guess ? g->hyp_end : g->hyp_end - 1;
    g->tok[0] = g->hist[g->hyp_end - 1];
    for (int32_t i = 0; i < n_rows; i++) {
        g->pos[i] = first + i;
        g->want[i] = i == 0 && !guess ? CONVOY_WANT_SAMPLE : CONVOY_WANT_DRAFT;
        g->hist[first + i] = rows[i]; /* drafts join the history the drafter continues */
    }
    const convoy_batch b = {.n_tokens = n_rows, .token = rows, .pos = g->pos, .seq = g->seqs, .want = g->want};
    if (convoy_submit(g->c, &b, err, errlen))
        return -1;
    g->win[(g->oldest + g->in_flight) % CONVOY_SPEC_WINDOWS_MAX] =
        (gen_window){.first = first, .n_rows = n_rows, .guess = guess, .asked = ask, .sent = cv_now_s()};
    g->in_flight++;
    g->live++;
    if (g->spec)
        convoy_spec_sent(g->spec);
    g->hyp_end = first + n_rows;
    g->st->windows++;
    *sent = 1;
    return 0;
}

/* Marks every window in flight stale: the history after the emitted
 * tokens is no longer the drafts'. */
static void cut(gen_state *g)
{
    for (int k = 0; k < g->in_flight; k++)
        g->win[(g->oldest + k) % CONVOY_SPEC_WINDOWS_MAX].stale = true;
    g->live = 0;
    g->hyp_end = g->n_hist;
}

/* Collects the oldest window: emits its accepted outputs, or drops a stale
 * window's. */
static int take_window(gen_state *g, char *err, size_t errlen)
{
    gen_window w = g->win[g->oldest];
    int32_t n_out;
    const double t0 = cv_now_s();
    if (convoy_collect(g->c, g->out, &n_out, err, errlen))
        return -1;
    if (g->spec)
        convoy_spec_collected(g->spec, w.sent, t0, cv_now_s(), convoy_collect_waited(g->c));
    g->oldest = (g->oldest + 1) % CONVOY_SPEC_WINDOWS_MAX;
    g->in_flight--;
    if (w.stale) {
        g->st->stale++;
        return 0;
    }
    g->live--;
    int32_t e = 0; /* outputs emitted: the leading ids */
    while (e < w.n_rows && g->out[e] >= 0)
        e++;
    const int32_t n_draft = w.guess ? w.n_rows : w.n_rows - 1, accepted = w.guess ? e : e - 1;
    if (w.asked)
        convoy_spec_observe(g->spec, g->seq, n_draft, accepted, cv_now_s() - w.sent);
    g->st->rounds++;
    g->st->drafted += n_draft;
    g->st->accepted += accepted;
    emit(g, g->out, e); /* the tokens at w.first + 1 on: g->n_hist is w.first + 1 */
    if (e < w.n_rows)
        cut(g);
    else if (g->hyp_end < g->n_hist) /* the last window in flight, accepted whole */
        g->hyp_end = g->n_hist;
    return 0;
}

/* Fills the windows the spec chooses (at most the context's depth), then
 * takes the oldest. */
static int gen_round(gen_state *g, char *err, size_t errlen)
{
    const int32_t depth = g->spec ? convoy_spec_windows(g->spec, g->seq, g->stage_s, convoy_ctx_depth(g->c)) : 1;
    int sent = 1;
    while (g->in_flight < depth && sent)
        if (send_window(g, &sent, err, errlen))
            return -1;
    return take_window(g, err, errlen);
}

/* Windows still in flight when generation stops are dropped. */
static int drain(gen_state *g, char *err, size_t errlen)
{
    cut(g);
    while (g->in_flight)
        if (take_window(g, err, errlen))
            return -1;
    return 0;
}


int convoy_generate(convoy_ctx *c, convoy_spec *spec, int32_t seq, int32_t *hist, int32_t n_hist, int32_t n_predict,
                    convoy_token_fn on_token, void *user, convoy_gen_stats *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    const int32_t n_batch = convoy_ctx_n_batch(c);
    if (n_hist < 1 || n_hist + n_predict > convoy_ctx_n_ctx(c))
        return cv_errf(err, errlen, "%d prompt tokens and %d to generate do not fit the context of %d", n_hist,
                       n_predict, convoy_ctx_n_ctx(c));
    if (convoy_seq_len(c, seq) >= n_hist) /* the last prompt token must run to sample from it */
        return cv_errf(err, errlen, "slot %d holds %d tokens already, the prompt has %d", seq,
                       convoy_seq_len(c, seq), n_hist);
    gen_state g = {.c = c, .spec = spec, .seq = seq, .n_predict = n_predict, .stage_s = convoy_ctx_stage_seconds(c),
                   .hist = hist, .n_hist = n_hist, .hyp_end = n_hist, .on_token = on_token, .user = user, .st = st};
    g.tok = cv_malloc(sizeof(int32_t) * (size_t)n_batch * 4);
    g.want = cv_malloc((size_t)n_batch);
    if (!g.tok || !g.want) {
        cv_free(g.tok);
        cv_free(g.want);
        return cv_errf(err, errlen, "out of memory");
    }
    g.pos = g.tok + n_batch;
    g.seqs = g.pos + n_batch;
    g.out = g.seqs + n_batch;
    for (int32_t i = 0; i < n_batch; i++)
        g.seqs[i] = seq;
    double t = cv_now_s();
    int rc = prefill(&g, n_hist, err, errlen);
    st->prefill_s = cv_now_s() - t;
    t = cv_now_s();
    g.stop = rc != 0 || n_predict == 0;
    emit(&g, g.out, g.stop ? 0 : 1); /* the prompt's last row sampled the first */
    g.hyp_end = g.n_hist;
    while (!rc && !g.stop)
        rc = gen_round(&g, err, errlen);
    if (!rc)
        rc = drain(&g, err, errlen);
    if (spec) /* the time until the next generation is not the head's per window */
        convoy_spec_idle(spec);
    st->decode_s = cv_now_s() - t;
    cv_free(g.tok);
    cv_free(g.want);
    return rc ? -1 : 0;
}
