/* text.c: see text.h. After each token the pending text is searched for
 * the earliest stop string; without one, everything but its longest tail
 * that is a proper prefix of some stop string is emitted. A held tail
 * starts with the first byte of a stop string (a UTF-8 lead byte), so the
 * cut never splits a character. Any occurrence of a stop string starts in
 * the pending text: had it started in emitted text, its beginning would
 * have been a held tail. */
#include "serve/text.h"

#include <string.h>

int cv_text_init(cv_text *t, const convoy_model *m, const char *const *stop, int n_stop)
{
    memset(t, 0, sizeof *t);
    t->model = m;
    t->stop = stop;
    t->n_stop = n_stop;
    t->detok = convoy_detok_create(m);
    return t->detok ? 0 : -1;
}

void cv_text_free(cv_text *t)
{
    convoy_detok_free(t->detok);
    cv_buf_free(&t->pending);
    cv_buf_free(&t->piece);
    memset(t, 0, sizeof *t);
}

/* Length of the longest tail of s[0, n) that is a proper prefix of p. */
static size_t prefix_tail(const char *s, size_t n, const char *p, size_t np)
{
    size_t k = n < np - 1 ? n : np - 1;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, p, k))
            return k;
    return 0;
}

/* Emits what is final in pending. final: the stream has ended. */
static int settle(cv_text *t, cv_buf *out, bool final)
{
    const char *s = t->pending.p ? t->pending.p : "";
    const size_t n = t->pending.n;
    size_t cut = n, hold = 0;
    const char *word = NULL;
    for (int i = 0; i < t->n_stop; i++) {
        const size_t np = strlen(t->stop[i]);
        if (np == 0 || np > n)
            continue;
        const char *hit = memmem(s, n, t->stop[i], np);
        if (hit && (size_t)(hit - s) < cut) {
            cut = (size_t)(hit - s);
            word = t->stop[i];
        }
    }
    if (word) {
        if (cv_buf_append(out, s, cut))
            return -1;
        t->stop_hit = word;
        cv_buf_consume(&t->pending, n);
        return 1;
    }
    if (!final)
        for (int i = 0; i < t->n_stop; i++) {
            const size_t np = strlen(t->stop[i]);
            if (np > 0) {
                const size_t k = prefix_tail(s, n, t->stop[i], np);
                if (k > hold)
                    hold = k;
            }
        }
    if (cv_buf_append(out, s, n - hold))
        return -1;
    cv_buf_consume(&t->pending, n - hold);
    return 0;
}

int cv_text_show(cv_text *t, const char *marker)
{
    int32_t ids[2];
    const int n = convoy_tokenize(t->model, marker, strlen(marker), false, true, ids, 2);
    const char *text = n == 1 ? convoy_token_text(t->model, ids[0]) : NULL;
    if (!text || strcmp(text, marker))
        return 0;
    if (t->n_shown == CV_TEXT_SHOWN)
        return -1;
    t->shown[t->n_shown++] = ids[0];
    return 0;
}

static bool is_shown(const cv_text *t, int32_t id)
{
    for (int i = 0; i < t->n_shown; i++)
        if (t->shown[i] == id)
            return true;
    return false;
}

/* What the detokenizer holds into pending: a character left unfinished
 * (before the end, or before a shown token) is ill-formed, U+FFFD. */
static int flush_held(cv_text *t)
{
    char tail[8];
    const int k = convoy_detok_flush(t->detok, tail, sizeof tail);
    return k > 0 && cv_buf_append(&t->pending, tail, (size_t)k) ? -1 : 0;
}

/* A shown token's text after what the detokenizer holds. */
static int push_shown(cv_text *t, int32_t id)
{
    return flush_held(t) || cv_buf_puts(&t->pending, convoy_token_text(t->model, id)) ? -1 : 0;
}

int cv_text_push(cv_text *t, int32_t id, cv_buf *out)
{
    if (t->stop_hit)
        return 1;
    if (is_shown(t, id))
        return push_shown(t, id) ? -1 : settle(t, out, false);
    if (cv_buf_reserve(&t->piece, 64))
        return -1;
    int k = convoy_detok_push(t->detok, id, t->piece.p, (int32_t)(t->piece.cap - 1));
    if (k < 0) {
        if (cv_buf_reserve(&t->piece, (size_t)-k))
            return -1;
        k = convoy_detok_push(t->detok, id, t->piece.p, (int32_t)(t->piece.cap - 1));
        if (k < 0)
            return -1;
    }
    if (cv_buf_append(&t->pending, t->piece.p, (size_t)k))
        return -1;
    return settle(t, out, false);
}

int cv_text_finish(cv_text *t, cv_buf *out)
{
    if (t->stop_hit)
        return 1;
    return flush_held(t) ? -1 : settle(t, out, true);
}

int cv_text_of(const convoy_model *m, const int32_t *ids, int32_t n, cv_buf *out)
{
    cv_text text;
    if (cv_text_init(&text, m, NULL, 0))
        return -1;
    int rc = 0;
    for (int32_t i = 0; i < n && rc == 0; i++)
        rc = cv_text_push(&text, ids[i], out) < 0 ? -1 : 0;
    if (rc == 0 && (cv_text_finish(&text, out) < 0 || cv_buf_append(out, "", 0)))
        rc = -1;
    cv_text_free(&text);
    return rc;
}
