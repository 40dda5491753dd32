/* generate.c: one sequence from prompt to its last token (include/convoy.h),
 * plainly or speculatively, for the CLI and the benchmarks. The prompt goes
 * in chunks of the context's batch size; then each round feeds the newest
 * token, with the drafts of the slot's convoy_spec when there is one, and
 * hands every emitted token to the caller in order. Buffers are sized at
 * the call (a batch), so rounds allocate nothing. */
#include <string.h>

#include "convoy.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"

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
    int32_t *tok = cv_malloc(sizeof(int32_t) * (size_t)n_batch * 3);
    uint8_t *want = cv_malloc((size_t)n_batch);
    if (!tok || !want) {
        cv_free(tok);
        cv_free(want);
        return cv_errf(err, errlen, "out of memory");
    }
    int32_t *pos = tok + n_batch, *seqs = pos + n_batch;
    for (int32_t i = 0; i < n_batch; i++)
        seqs[i] = seq;
    int rc = 0;
    int32_t out[CONVOY_SPEC_K_LIMIT + 1];
    double t = cv_now_s();
    for (int32_t p = convoy_seq_len(c, seq); p < n_hist && !rc;) { /* the prompt */
        const int32_t n = n_hist - p < n_batch ? n_hist - p : n_batch;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = p + i;
            want[i] = p + i == n_hist - 1;
        }
        const convoy_batch b = {.n_tokens = n, .token = hist + p, .pos = pos, .seq = seqs, .want = want};
        rc = convoy_step(c, &b, out, err, errlen);
        p += n;
    }
    st->prefill_s = cv_now_s() - t;
    t = cv_now_s();
    int32_t n_out = 1;
    bool stop = rc != 0 || n_predict == 0;
    while (!stop) {
        for (int32_t i = 0; i < n_out && !stop; i++) {
            hist[n_hist++] = out[i];
            st->n_gen++;
            stop = on_token(user, out[i]) || st->n_gen == n_predict;
        }
        if (stop)
            break;
        /* the newest token and its drafts; a round emits at most drafts + 1 */
        const int32_t room = n_predict - st->n_gen - 1;
        const double t_round = cv_now_s();
        const bool speculate = spec && room > 0;
        convoy_spec_req req = {.seq = seq, .hist = hist, .n_hist = n_hist, .max_draft = room, .drafts = tok + 1};
        if (speculate && (rc = convoy_spec_propose(spec, &req, 1, err, errlen)))
            break;
        const int32_t n_draft = req.n_draft;
        tok[0] = hist[n_hist - 1];
        for (int32_t i = 0; i <= n_draft; i++) {
            pos[i] = n_hist - 1 + i;
            want[i] = i == 0 ? CONVOY_WANT_SAMPLE : CONVOY_WANT_DRAFT;
        }
        const convoy_batch b = {.n_tokens = n_draft + 1, .token = tok, .pos = pos, .seq = seqs, .want = want};
        if ((rc = convoy_step(c, &b, out, err, errlen)))
            break;
        n_out = 1 + convoy_spec_n_accepted(out, n_draft);
        if (speculate)
            convoy_spec_observe(spec, seq, n_draft, n_out - 1, cv_now_s() - t_round);
        st->rounds++;
        st->drafted += n_draft;
        st->accepted += n_out - 1;
    }
    st->decode_s = cv_now_s() - t;
    cv_free(tok);
    cv_free(want);
    return rc ? -1 : 0;
}
