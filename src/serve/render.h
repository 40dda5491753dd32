/* render.h: a conversation rendered into the prompt text of a chat model.
 *
 * Contract: sv_render_chat writes the messages in the named template,
 * followed by the opening of the assistant's turn (the generation prompt),
 * into out. Known templates: "chatml" (<|im_start|>ROLE\nCONTENT<|im_end|>\n
 * per message, then <|im_start|>assistant\n). The prompt is tokenized with
 * special tokens parsed. sv_chat_stop_strings lists the texts that end an
 * assistant turn in a template (for vocabularies without them as tokens).
 * Returns 0, or -1 with a message (unknown template, out of memory). */
#ifndef CONVOY_SERVE_RENDER_H
#define CONVOY_SERVE_RENDER_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/buf.h"

typedef struct sv_chat_msg {
    const char *role;
    const char *content;
} sv_chat_msg;

bool sv_chat_template_known(const char *name);
int sv_render_chat(const char *tmpl, const sv_chat_msg *msgs, int n, sv_buf *out, char *err, size_t errlen);
/* A NULL-terminated list. */
const char *const *sv_chat_stop_strings(const char *tmpl);

#endif
