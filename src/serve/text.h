/* text.h: the text a client sees from a stream of generated tokens.
 *
 * Contract: cv_text turns token ids into UTF-8 text (convoy_detok: a
 * character split over tokens is held back until complete) and applies the
 * request's stop strings: the text ends right before the first occurrence
 * of any of them, which is never sent. While the tail of the text could
 * still be the start of a stop string it is held back too, so text once
 * emitted is final; cv_text_finish releases what is held at the end of the
 * stream (an incomplete character becomes U+FFFD). Push and finish append
 * the newly final text to `out` and return 1 when a stop string has
 * matched (push and finish then do nothing more), 0 otherwise, -1 when
 * memory runs out. Stop strings are borrowed (they must outlive the
 * cv_text) and empty ones are ignored.
 *
 * A control token detokenizes as nothing. cv_text_show makes the token
 * whose vocabulary text is `marker` (a tool-call marker, tools.h) read as
 * that text, as llama-server's preserved tokens: 0 when shown, or when the
 * vocabulary has no such single token (the marker is then plain text
 * anyway); -1 when CV_TEXT_SHOWN tokens are shown already. */
#ifndef CONVOY_SERVE_TEXT_H
#define CONVOY_SERVE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convoy.h"
#include "serve/buf.h"

#define CV_TEXT_SHOWN 4

typedef struct cv_text {
    const convoy_model *model;
    convoy_detok *detok;
    int32_t shown[CV_TEXT_SHOWN]; /* control tokens read as their text */
    int n_shown;
    const char *const *stop;
    int n_stop;
    cv_buf pending; /* decoded text not yet emitted */
    cv_buf piece;   /* scratch for one token's text */
    const char *stop_hit; /* the stop string that ended the text; NULL while none has */
} cv_text;

int cv_text_init(cv_text *t, const convoy_model *m, const char *const *stop, int n_stop);
void cv_text_free(cv_text *t);
int cv_text_show(cv_text *t, const char *marker);
int cv_text_push(cv_text *t, int32_t id, cv_buf *out);
int cv_text_finish(cv_text *t, cv_buf *out);
/* The whole text of n ids (no stop strings) appended to out, NUL after it
 * (not counted); -1 when memory runs out. */
int cv_text_of(const convoy_model *m, const int32_t *ids, int32_t n, cv_buf *out);

#endif
