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
 * Streamed: sv_think_push takes the output as it comes and appends to
 * `reasoning` and `content` what is now known to be each; it holds back a
 * tail that may be the start of a tag or whitespace that may be trimmed,
 * until more text (or the end, over) tells. Tags are ASCII, so nothing is
 * ever cut inside a UTF-8 character. Returns 0, or -1 when out of memory. */
#ifndef CONVOY_SERVE_THINK_H
#define CONVOY_SERVE_THINK_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/buf.h"

typedef enum sv_think_state {
    SV_THINK_START,   /* nothing but whitespace yet: a block may open */
    SV_THINK_IN,      /* in the block */
    SV_THINK_AFTER,   /* past </think>: whitespace is dropped until content */
    SV_THINK_CONTENT, /* the rest is content */
} sv_think_state;

typedef struct sv_think {
    sv_think_state state;
    bool told;   /* some reasoning was appended (its leading whitespace is gone) */
    sv_buf held; /* output not yet told */
} sv_think;

/* open: the prompt opened the block (sv_think_opens). */
void sv_think_init(sv_think *t, bool open);
int sv_think_push(sv_think *t, const char *p, size_t n, bool over, sv_buf *reasoning, sv_buf *content);
void sv_think_free(sv_think *t);
/* Whether a rendered prompt ends by opening a block ("<think>" and whitespace). */
bool sv_think_opens(const char *prompt, size_t n);

#endif
