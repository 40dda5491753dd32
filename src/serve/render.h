/* render.h: the chat template of `convoy serve`.
 *
 * Contract: sv_chat_setup picks the template once at start-up: the
 * --chat-template NAME when given (model/chat.h lists the names), else
 * the one recognized from the model's tokenizer.chat_template, else (a
 * model without a template) ChatML, as llama.cpp does; it fails with a
 * message for an unknown name or an unrecognized template. sv_render_chat
 * renders a conversation natively (no Jinja), followed by the opening of
 * the assistant's turn; the prompt is then tokenized with special tokens
 * parsed. sv_chat_stop_strings lists the texts that end an assistant turn
 * (generation stops there, besides end-of-generation tokens). Returns 0,
 * or -1 with a message (a conversation the template refuses, out of
 * memory). */
#ifndef CONVOY_SERVE_RENDER_H
#define CONVOY_SERVE_RENDER_H

#include <stdbool.h>
#include <stddef.h>

#include "convoy.h"
#include "model/chat.h"
#include "serve/buf.h"

typedef struct sv_chat {
    cv_chat_kind kind;
    const char *bos, *eos; /* the model's texts of those tokens ("" when absent) */
} sv_chat;

/* One message; role is "system", "user" or "assistant". */
typedef struct sv_chat_msg {
    const char *role;
    const char *content;
} sv_chat_msg;

int sv_chat_setup(const convoy_model *m, const char *override_name, sv_chat *out, char *err, size_t errlen);
const char *sv_chat_name(const sv_chat *c);
int sv_render_chat(const sv_chat *c, const sv_chat_msg *msgs, int n, sv_buf *out, char *err, size_t errlen);
/* A NULL-terminated list. */
const char *const *sv_chat_stop_strings(const sv_chat *c);

#endif
