/* render.h: the chat template of `convoy serve`.
 *
 * Contract: cv_serve_chat_setup picks the template once at start-up. With
 * --chat-template NAME (chat/chat.h lists the names) that built-in family
 * renders natively; with --chat-template FILE the file is a Jinja template
 * (chat/template.h's cv_template_parse). Without either, the model's own
 * tokenizer.chat_template is rendered by the Jinja engine; one the engine
 * refuses falls back, with a warning naming the construct, to the family
 * cv_chat_detect recognizes; a model without a template gets ChatML, as
 * llama.cpp does. It fails with a message for an unknown name, an unreadable
 * or refused FILE, or a template neither way renders (both reasons).
 * cv_serve_chat_name says which is used, for the start line.
 *
 * cv_serve_render_chat renders a conversation followed by the opening of the
 * assistant's turn (Jinja: add_generation_prompt true, the model's BOS/EOS
 * texts, today's date) and gives the spans of the prompt that are message
 * content: the prompt is tokenized with special tokens parsed outside them
 * only (convoy_tokenize_spans), so that what users write stays text. The
 * spans are the prompt's plain ranges (chat/plain_ranges.h), found by
 * rendering once more with each content replaced by its marker; a template
 * that changes content (trim, split) so that the markers do not map back
 * gets no spans, and a message whose content holds special token text is
 * then refused rather than turned into control tokens.
 * cv_serve_chat_stop_strings lists the texts that end an assistant turn
 * (generation stops there, besides end-of-generation tokens; none for
 * Jinja). Returns 0, or -1 with a message (a conversation the template
 * refuses, out of memory). */
#ifndef CONVOY_SERVE_RENDER_H
#define CONVOY_SERVE_RENDER_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "chat/chat.h"
#include "chat/template.h"
#include "convoy.h"
#include "serve/buf.h"
#include "serve/tools.h"

typedef struct cv_serve_chat {
    cv_chat_kind kind;           /* the native family, when jinja is NULL */
    cv_template *jinja;      /* the Jinja template, or NULL */
    char *source;                /* its text (/props shows it), or NULL */
    cv_template_pool *pool;  /* the memory its renders share (the caller's), or NULL */
    const convoy_model *model;   /* for the fallback's check of contents */
    const char *bos, *eos;       /* the model's texts of those tokens ("" when absent) */
    cv_tool_format tools;        /* how the Jinja template's model writes tool calls */
    char name[256];              /* what the start line says */
} cv_serve_chat;

/* One message; role is "system", "user", "assistant" or "tool" (Jinja
 * templates, and the built-in families with a tool format). json: the
 * request's message, whose other members (tool_calls, tool_call_id, name)
 * reach a Jinja template (a built-in family reads tool_calls); or NULL. */
typedef struct cv_serve_chat_msg {
    const char *role;
    const char *content;
    const json_t *json;
} cv_serve_chat_msg;

int cv_serve_chat_setup(const convoy_model *m, const char *override_name, cv_serve_chat *out, char *err, size_t errlen);
const char *cv_serve_chat_name(const cv_serve_chat *c);
void cv_serve_chat_free(cv_serve_chat *c);
/* How a render learns that its client left: gone(user) true stops it. */
typedef struct cv_serve_render_watch {
    bool (*gone)(void *user);
    void *user;
} cv_serve_render_watch;

/* What a request gives the template besides its messages: its tool
 * definitions (Jinja templates, and the built-in families with a tool
 * format: serve/native_tools.h), its add_generation_prompt (true
 * when absent) and its chat_template_kwargs object, whose members reach a
 * Jinja template over the other variables (a built-in family reads
 * enable_thinking); each NULL when absent. */
typedef struct cv_serve_chat_vars {
    const json_t *tools;
    const json_t *add_generation_prompt;
    const json_t *kwargs;
} cv_serve_chat_vars;

/* *spans (release with cv_free) gets *n_spans content spans of out.
 * vars: NULL, or the request's variables; watch: NULL, or asked now and
 * then while a Jinja template renders. */
int cv_serve_render_chat(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars,
                   const cv_serve_render_watch *watch, cv_buf *out, convoy_span **spans, int *n_spans, char *err,
                   size_t errlen);
/* The control-token texts ("<|im_start|>", "[INST]", ...) the template
 * writes for a short chat that are not tokens of the model's vocabulary
 * (the model would read them as plain text), listed into out (n bytes);
 * returns how many. */
int cv_serve_chat_missing_tokens(const cv_serve_chat *c, char *out, size_t n);
/* A NULL-terminated list. */
const char *const *cv_serve_chat_stop_strings(const cv_serve_chat *c);

#endif
