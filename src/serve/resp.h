/* resp.h: OpenAI's Responses API (POST /v1/responses): the request read
 * as a chat, the response object and its stream events.
 *
 * Contract: cv_resp_chat_body turns a request body into the chat body that
 * oai.h parses ({"messages", "tools", "tool_choice",
 * "parallel_tool_calls"}), or NULL with e filled (a 400 naming the field):
 * instructions become a system message first, then input, a string (one
 * user message) or a list of items: messages (type "message", or with a
 * 'role'), function_call items (assistant tool calls {id: call_id, name,
 * arguments}; consecutive ones, and those right after an assistant
 * message, join that message) and function_call_output items (tool
 * messages {tool_call_id: call_id, content: output}). Function tools
 * {"type": "function", "name", "description", "parameters"} become chat
 * tools; other tool types and item types are refused, as is
 * previous_response_id (this server stores no responses).
 *
 * One answer is an assistant message with one output_text part and, when
 * calls (may be NULL) holds tool calls, their function_call items
 * {"type": "function_call", "id", "call_id", "name", "arguments",
 * "status"} after it; with calls the message holds calls->content and is
 * left out when that is empty.
 * cv_resp_object_json returns the response object ({"object": "response",
 * "status", "output", "usage", ...}) as a malloc'ed JSON text (NULL when
 * memory runs out): status "completed", or "incomplete" with
 * incomplete_details {"reason": "max_output_tokens"} when finish is
 * "length"; with text NULL, the "in_progress" object of a stream's first
 * events (no output, usage null).
 * The resp_sse_* functions append server-sent events as OpenAI sends them
 * ("event: TYPE" then "data: {"type": TYPE, "sequence_number": N, ...}"),
 * numbering them through s->seq; they return 0, or -1 when memory runs
 * out. A stream is cv_resp_sse_start (response.created, response.in_progress),
 * any number of cv_resp_sse_delta (response.output_text.delta, the first
 * after response.output_item.added and response.content_part.added for
 * the message), then cv_resp_sse_done (the message's .done events, each
 * call's response.output_item.added, response.function_call_arguments
 * .delta and .done, response.output_item.done, then response.completed or
 * response.incomplete) or cv_resp_sse_error (an "error" event). Texts must be
 * valid UTF-8. */
#ifndef CONVOY_SERVE_RESP_H
#define CONVOY_SERVE_RESP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "serve/buf.h"
#include "serve/oai.h"
#include "serve/tools.h"

typedef struct resp_ids {
    const char *id;     /* "resp_..." */
    const char *msg_id; /* "msg_..." */
    long long created;
    int seq;       /* the next event's sequence_number */
    bool msg_open; /* the message item was announced */
} resp_ids;

json_t *cv_resp_chat_body(const json_t *body, oai_error *e);

char *cv_resp_object_json(const oai_server *srv, const resp_ids *s, const char *text, size_t text_len,
                          const char *finish, const cv_tool_calls *calls, const oai_usage *u);
int cv_resp_sse_start(const oai_server *srv, resp_ids *s, cv_buf *out);
int cv_resp_sse_delta(resp_ids *s, const char *text, size_t text_len, cv_buf *out);
int cv_resp_sse_done(const oai_server *srv, resp_ids *s, const char *text, size_t text_len, const char *finish,
                  const cv_tool_calls *calls, const oai_usage *u, cv_buf *out);
int cv_resp_sse_error(resp_ids *s, const oai_error *e, cv_buf *out);

#endif
