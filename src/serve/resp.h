/* resp.h: the output shapes of OpenAI's Responses API (POST /v1/responses).
 *
 * Contract: one answer is one assistant message with one output_text part.
 * resp_object_json returns the response object ({"object": "response",
 * "status", "output", "usage", ...}) as a malloc'ed JSON text (NULL when
 * memory runs out): status "completed", or "incomplete" with
 * incomplete_details {"reason": "max_output_tokens"} when finish is
 * "length"; with text NULL, the "in_progress" object of a stream's first
 * events (no output, usage null).
 * The resp_sse_* functions append server-sent events as OpenAI sends them
 * ("event: TYPE" then "data: {"type": TYPE, "sequence_number": N, ...}"),
 * numbering them through s->seq; they return 0, or -1 when memory runs
 * out. A stream is resp_sse_start (response.created, response.in_progress,
 * response.output_item.added, response.content_part.added), any number of
 * resp_sse_delta (response.output_text.delta), then resp_sse_done (the
 * .done events and response.completed or response.incomplete) or
 * resp_sse_error (an "error" event). Texts must be valid UTF-8. */
#ifndef CONVOY_SERVE_RESP_H
#define CONVOY_SERVE_RESP_H

#include <stddef.h>

#include "serve/buf.h"
#include "serve/oai.h"

typedef struct resp_ids {
    const char *id;     /* "resp_..." */
    const char *msg_id; /* "msg_..." */
    long long created;
    int seq; /* the next event's sequence_number */
} resp_ids;

char *resp_object_json(const oai_server *srv, const resp_ids *s, const char *text, size_t text_len, const char *finish,
                       const oai_usage *u);
int resp_sse_start(const oai_server *srv, resp_ids *s, sv_buf *out);
int resp_sse_delta(resp_ids *s, const char *text, size_t text_len, sv_buf *out);
int resp_sse_done(const oai_server *srv, resp_ids *s, const char *text, size_t text_len, const char *finish,
                  const oai_usage *u, sv_buf *out);
int resp_sse_error(resp_ids *s, const oai_error *e, sv_buf *out);

#endif
