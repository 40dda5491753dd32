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
 * cv_text) and empty ones are ignored. */
#ifndef CONVOY_SERVE_TEXT_H
#define CONVOY_SERVE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convoy.h"
#include "serve/buf.h"

typedef struct cv_text {
    convoy_detok *detok;
    const char *const *stop;
    int n_stop;
    cv_buf pending; /* decoded text not yet emitted */
    cv_buf piece;   /* scratch for one token's text */
    const char *stop_hit; /* the stop string that ended the text; NULL while none has */
} cv_text;

int cv_text_init(cv_text *t, const convoy_model *m, const char *const *stop, int n_stop);
void cv_text_free(cv_text *t);
int cv_text_push(cv_text *t, int32_t id, cv_buf *out);
int cv_text_finish(cv_text *t, cv_buf *out);
/* The whole text of n ids (no stop strings) appended to out, NUL after it
 * (not counted); -1 when memory runs out. */
int cv_text_of(const convoy_model *m, const int32_t *ids, int32_t n, cv_buf *out);

#endif
