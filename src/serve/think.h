/* think.h: a thinking model's reasoning kept apart from its answer, as
 * llama-server's --reasoning-format deepseek does: what the model writes
 * between <think> and </think> at the very start of its output (leading
 * whitespace aside) becomes the message's reasoning_content, the rest its
 * content. Where the prompt already opened the block (a template that ends
 * the generation prompt with "<think>\n", as DeepSeek-R1's does), the
 * output starts inside it. Reasoning loses its leading and trailing
 * whitespace, content the whitespace after </think>; an output that does
 * not open a block is all content, byte for byte.
 *
 * Streamed: cv_think_push takes the output as it comes and appends to
 * `reasoning` and `content` what is now known to be each; it holds back a
 * tail that may be the start of a tag or whitespace that may be trimmed,
 * until more text (or the end, over) tells. Tags are ASCII, so nothing is
 * ever cut inside a UTF-8 character. Returns 0, or -1 when out of memory. */
#ifndef CONVOY_SERVE_THINK_H
#define CONVOY_SERVE_THINK_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/buf.h"

typedef enum cv_think_state {
    CV_THINK_START,   /* nothing but whitespace yet: a block may open */
    CV_THINK_IN,      /* in the block */
    CV_THINK_AFTER,   /* past </think>: whitespace is dropped until content */
    CV_THINK_CONTENT, /* the rest is content */
} cv_think_state;

typedef struct cv_think {
    cv_think_state state;
    bool told;   /* some reasoning was appended (its leading whitespace is gone) */
    cv_buf held; /* output not yet told */
} cv_think;

/* open: the prompt opened the block (cv_think_opens). */
void cv_think_init(cv_think *t, bool open);
int cv_think_push(cv_think *t, const char *p, size_t n, bool over, cv_buf *reasoning, cv_buf *content);
void cv_think_free(cv_think *t);
/* Whether a rendered prompt ends by opening a block ("<think>" and whitespace). */
bool cv_think_opens(const char *prompt, size_t n);

#endif
