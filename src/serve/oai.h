/* oai.h: the OpenAI API's shapes: request bodies in, JSON bodies out.
 *
 * Contract: cv_oai_parse_request checks a /v1/completions,
 * /v1/chat/completions or /v1/responses body completely before anything
 * runs: JSON syntax, the type and range of every parameter it knows, the
 * model name, the prompt (a string, or one list of token ids; for chat,
 * the messages, rendered with the server's chat template and the request's
 * tools and chat_template_kwargs; for responses, the request read as a
 * chat (resp.h: instructions, input messages and function call items,
 * function tools) and rendered the same way) tokenized against the
 * context, and max_tokens (max_output_tokens) against the room the prompt
 * leaves. Responses are stateless: previous_response_id is refused.
 * tool_choice "required" or a named function (serve/tool_grammar.h)
 * holds the output to a call of the tools in the template's call format
 * (a 400 when the format is not recognized, the function is not among
 * the tools, or a response_format or grammar is given too); tools with a
 * built-in family that renders none are a 400 naming it. On failure it fills
 * an oai_error (HTTP status, OpenAI error type and code, the parameter at
 * fault, a message naming the problem) and returns -1; the request then
 * holds nothing. A completion's suffix makes a fill-in-the-middle prompt
 * (serve/fim.h), echo puts the prompt's text first (not with logprobs).
 * Parameters the server cannot honour (best_of) are refused rather than
 * ignored; logit_bias is read as serve/bias.h says. Structured output:
 * response_format (text.format on /v1/responses) json_object or
 * json_schema, or llama-server's json_schema and grammar (GBNF) fields,
 * become the grammar the output is held to (serve/schema.h); a schema or
 * grammar the server cannot hold output to is a 400 naming why. Unknown fields are ignored, as OpenAI's own
 * server does for most of them.
 * Sampling parameters not given take convoy's defaults (those of `convoy
 * run` and llama.cpp: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05);
 * without a seed the caller's random seed is used.
 *
 * The oai_*_json functions return a NUL-terminated JSON text allocated
 * with malloc (free it with free), or NULL when memory runs out. Texts
 * given to them must be valid UTF-8; token pieces, which may be parts of a
 * character, are made valid (U+FFFD) where they appear as strings and are
 * given exactly in "bytes". */
#ifndef CONVOY_SERVE_OAI_H
#define CONVOY_SERVE_OAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "convoy.h"
#include "serve/buf.h"
#include "serve/render.h"
#include "serve/sched.h"

typedef enum oai_kind { OAI_COMPLETIONS, OAI_CHAT, OAI_RESPONSES } oai_kind;

typedef struct oai_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* NULL, or "model_not_found", "context_length_exceeded", ... */
    char param[64];   /* the parameter at fault, "" for none */
    char message[512];
} oai_error;

/* What requests are checked against. The server serves one model: any
 * model name a request gives (or none) is served and answered as model_id,
 * as llama-server does, unless strict_model (then another name is a 404
 * model_not_found and a missing one a 400, as OpenAI answers). */
typedef struct oai_server {
    const convoy_model *model;
    const char *model_id;
    int32_t n_ctx;
    const cv_serve_chat *chat;
    bool strict_model;
    bool split_reasoning; /* --reasoning-format deepseek (the default): chat answers' <think> blocks become
                             reasoning_content (serve/think.h); a request's reasoning_format overrides it */
} oai_server;

#define OAI_MAX_CHOICES 16

typedef struct oai_request {
    oai_kind kind;
    bool stream;
    bool include_usage;
    int32_t *prompt;
    cv_request_params params; /* params.prompt points into prompt */
    char **stop;              /* stop strings (with the template's end-of-turn texts for chat) */
    cv_tool_format tools;     /* chat with tools (tool_choice not "none"): how to read calls back; else NONE */
    bool split_reasoning;     /* chat: <think> blocks become reasoning_content */
    bool think_open;          /* chat: the prompt opened a <think> block (think.h) */
    char *grammar;            /* the output's grammar (params.grammar), or NULL */
    convoy_logit_bias *bias;  /* params.sampler.logit_bias, or NULL */
    cv_buf echo;              /* completions with echo: the prompt's text, which starts the answer */
    int n_stop;
    int n_choices;            /* n: choices asked for (1..OAI_MAX_CHOICES); the caller runs them */
    const cv_serve_render_watch *watch; /* cv_oai_parse_request's, while it runs */
} oai_request;

/* watch: NULL, or how the chat template's render learns that the client left. */
int cv_oai_parse_request(const oai_server *srv, oai_kind kind, const char *body, size_t len, uint64_t default_seed,
                      const cv_serve_render_watch *watch, oai_request *out, oai_error *e);
void cv_oai_request_free(oai_request *r);
/* llama-server's /apply-template: a chat body's messages, tools and
 * chat_template_kwargs rendered exactly as cv_oai_parse_request renders them
 * for the model, answered {"prompt": TEXT}; NULL with e filled. */
char *cv_oai_apply_template_json(const oai_server *srv, const char *body, size_t len, oai_error *e);

/* Fills e; returns -1 so that failure paths read `return cv_oai_fail(...)`. */
int cv_oai_fail(oai_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
char *cv_oai_error_json(const oai_error *e);
/* j's compact JSON text (free with free), j released; NULL for NULL or when out of memory. */
char *cv_oai_json_text(json_t *j);
/* The request body as a JSON object, or NULL with e filled (400). */
json_t *cv_oai_load_object(const char *body, size_t len, oai_error *e);
/* The request's "model": any name (or none) unless the server is strict;
 * -1 with e filled. */
int cv_oai_check_model(const oai_server *srv, const json_t *root, oai_error *e);

/* The logprobs of n tokens in the shape of the request's kind:
 * completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
 * (offsets counted from text_offset); chat: {"content": [...]}. Returns a
 * new reference (NULL when out of memory). */
json_t *cv_oai_logprobs(const convoy_model *m, oai_kind kind, const cv_request *r, int32_t first, int32_t n,
                     int32_t top, size_t text_offset);

typedef struct oai_usage {
    int32_t prompt_tokens;
    int32_t cached_tokens; /* of the prompt's, taken from the slot's cache */
    int32_t completion_tokens;
} oai_usage;

/* A whole answer (non-streaming). logprobs: NULL or a reference that is
 * taken over. finish: "stop" or "length". calls: NULL, or (chat) the tool
 * calls read out of text: when there are any, the message's content is
 * calls->content (null when empty), it gets "tool_calls" [{id, type
 * "function", function {name, arguments}}] and finish_reason is
 * "tool_calls", as OpenAI answers. reasoning (chat; NULL: none): the
 * message's reasoning_content. */
typedef struct oai_answer {
    const char *text;
    size_t text_len;
    const char *reasoning;
    size_t reasoning_len;
    const char *finish;
    const cv_tool_calls *calls;
    json_t *logprobs;
    const oai_usage *usage;
} oai_answer;
char *cv_oai_response_json(const oai_server *srv, oai_kind kind, const char *id, long long created,
                           const oai_answer *a);
/* The same with n choices (index i: a[i]) and the usage of them all. */
char *cv_oai_choices_json(const oai_server *srv, oai_kind kind, const char *id, long long created, const oai_answer *a,
                       int n, const oai_usage *usage);

/* A streamed chunk: text (with the role in the first of a chat), or
 * (chat) reasoning as its own delta, a tool call's opening or arguments, the
 * end, or the usage alone. */
typedef struct oai_chunk {
    const char *text;
    size_t text_len;
    const char *reasoning; /* chat: a reasoning_content delta instead of text, when not NULL */
    size_t reasoning_len;
    bool first;
    int index; /* the choice's (n > 1) */
    const char *finish;
    json_t *logprobs;
    const oai_usage *usage;
    bool include_usage;
    bool usage_only;
    const cv_tool_call *call;
    int call_index;
    bool call_args;
} oai_chunk;
char *cv_oai_chunk_json(const oai_server *srv, oai_kind kind, const char *id, long long created, const oai_chunk *c);
/* {"status":"ok"}, or for a 503 {"status":"unavailable","error":{"code":503,
 * "message":MESSAGE,"type":"unavailable_error"}} (llama-server's error). */
char *cv_oai_health_json(const char *error);
char *cv_oai_models_json(const oai_server *srv, long long created);
char *cv_oai_model_json(const oai_server *srv, long long created);

#endif
