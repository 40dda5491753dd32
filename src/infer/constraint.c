/* constraint.c: a slot's grammar over the ids it generates (see
 * constraint.h). The matcher state moves only forward, so a truncation
 * replays the kept ids from the start: truncations come with rejected
 * drafts and failovers, rarely, and the ids are few. */
#include "infer/constraint.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "model/vocab.h"

struct cv_constraint {
    cv_grammar *grammar;
    cv_grammar_state *state;
    int32_t from;
    int32_t *ids;   /* [n_ctx] ids entered at from, from + 1, ... */
    int32_t n_ids;
    int32_t n_ctx;
    int32_t broken; /* ids matched before one was refused; -1 while none was */
};

/* ---- the vocabulary's pieces ---- */

static int collect_pieces(cv_vocab_pieces *vp, const cv_vocab *v, char *err, size_t errlen)
{
    const int32_t n = v->n_vocab;
    char **bytes = cv_calloc((size_t)n, sizeof *bytes);
    uint32_t *len = cv_calloc((size_t)n, sizeof *len);
    vp->eog = cv_calloc((size_t)n, sizeof *vp->eog);
    int rc = -1;
    if (!bytes || !len || !vp->eog) {
        cv_errf(err, errlen, "out of memory for %d token pieces", n);
        goto done;
    }
    char buf[256];
    for (int32_t id = 0; id < n; id++) {
        const int k = cv_token_piece(v, id, false, buf, sizeof buf);
        if (cv_token_is_eog(v, id))
            vp->eog[vp->n_eog++] = id;
        if (k <= 0)
            continue; /* control tokens and pieces too long to be text */
        if (!(bytes[id] = cv_malloc((size_t)k))) {
            cv_errf(err, errlen, "out of memory for token pieces");
            goto done;
        }
        memcpy(bytes[id], buf, (size_t)k);
        len[id] = (uint32_t)k;
    }
    vp->pieces = cv_grammar_pieces_create(n, (const char *const *)bytes, len);
    vp->n_vocab = n;
    rc = vp->pieces ? 0 : cv_errf(err, errlen, "out of memory for the grammar's vocabulary");
done:
    for (int32_t id = 0; bytes && id < n; id++)
        cv_free(bytes[id]);
    cv_free(bytes);
    cv_free(len);
    return rc;
}

int cv_vocab_pieces_load(cv_vocab_pieces *vp, const gguf_file *f, char *err, size_t errlen)
{
    memset(vp, 0, sizeof *vp);
    cv_vocab v;
    if (cv_vocab_load(&v, f, err, errlen))
        return -1;
    const int rc = collect_pieces(vp, &v, err, errlen);
    cv_vocab_free(&v);
    if (rc)
        cv_vocab_pieces_free(vp);
    return rc;
}

void cv_vocab_pieces_free(cv_vocab_pieces *vp)
{
    cv_grammar_pieces_free(vp->pieces);
    cv_free(vp->eog);
    memset(vp, 0, sizeof *vp);
}

/* ---- a slot's constraint ---- */

cv_constraint *cv_constraint_create(const char *text, size_t len, int32_t from, int32_t n_ctx, char *err,
                                    size_t errlen)
{
    if (len > CV_CONSTRAINT_TEXT_MAX) {
        cv_errf(err, errlen, "the grammar has %zu bytes, at most %u are taken", len, CV_CONSTRAINT_TEXT_MAX);
        return NULL;
    }
    if (from < 0 || n_ctx < 1) {
        cv_errf(err, errlen, "a grammar from position %d in a context of %d", from, n_ctx);
        return NULL;
    }
    cv_constraint *c = cv_calloc(1, sizeof *c);
    if (!c) {
        cv_errf(err, errlen, "out of memory for a grammar");
        return NULL;
    }
    c->from = from;
    c->n_ctx = n_ctx;
    c->broken = -1;
    if (!(c->grammar = cv_grammar_parse(text, len, err, errlen)))
        goto fail;
    c->state = cv_grammar_state_create(c->grammar);
    c->ids = cv_malloc(sizeof(int32_t) * (size_t)n_ctx);
    if (!c->state || !c->ids) {
        cv_errf(err, errlen, "out of memory for a grammar's state");
        goto fail;
    }
    return c;
fail:
    cv_constraint_free(c);
    return NULL;
}

void cv_constraint_free(cv_constraint *c)
{
    if (!c)
        return;
    cv_grammar_state_free(c->state);
    cv_grammar_free(c->grammar);
    cv_free(c->ids);
    cv_free(c);
}

static bool is_eog(const cv_vocab_pieces *vp, int32_t id)
{
    for (int32_t i = 0; i < vp->n_eog; i++)
        if (vp->eog[i] == id)
            return true;
    return false;
}

/* Matches the piece of id; a refusal breaks the constraint. An
 * end-of-generation token where the grammar may end is allowed (it
 * enters when a request ignores EOS) and matches nothing. */
static void match(cv_constraint *c, const cv_vocab_pieces *vp, int32_t id)
{
    const char *bytes;
    const uint32_t n = cv_grammar_piece(vp->pieces, id, &bytes);
    const bool allowed = n ? cv_grammar_accept(c->state, bytes, n) == 0
                           : is_eog(vp, id) && cv_grammar_complete(c->state);
    if (c->broken < 0 && !allowed)
        c->broken = c->n_ids;
    c->ids[c->n_ids++] = id;
}

void cv_constraint_enter(cv_constraint *c, const cv_vocab_pieces *vp, int32_t pos, int32_t id)
{
    /* positions come in order from the span: pos == from + n_ids */
    if (pos < c->from || pos - c->from != c->n_ids || c->n_ids >= c->n_ctx)
        return;
    match(c, vp, id);
}

void cv_constraint_truncate(cv_constraint *c, const cv_vocab_pieces *vp, int32_t len)
{
    const int32_t keep = len - c->from < 0 ? 0 : len - c->from;
    if (keep >= c->n_ids)
        return;
    cv_grammar_state_reset(c->state);
    c->broken = -1;
    c->n_ids = 0;
    while (c->n_ids < keep)
        match(c, vp, c->ids[c->n_ids]);
}

const float *cv_constraint_mask(const cv_constraint *c, const cv_vocab_pieces *vp, int32_t pos,
                                const float *logits, float *out)
{
    if (pos < c->from - 1)
        return NULL;
    const bool can_end = c->broken >= 0 || cv_grammar_complete(c->state);
    if (c->broken >= 0) {
        for (int32_t i = 0; i < vp->n_vocab; i++)
            out[i] = -INFINITY;
    } else {
        memcpy(out, logits, sizeof(float) * (size_t)vp->n_vocab);
        cv_grammar_mask(c->state, vp->pieces, out);
    }
    for (int32_t i = 0; i < vp->n_eog; i++)
        out[vp->eog[i]] = can_end ? logits[vp->eog[i]] : -INFINITY;
    return out;
}
