/* resp.c: the Responses API's response object and stream events (see
 * resp.h).
 *
 * Design: every shape is a jansson tree; the message item and its text
 * part are built by one helper each so that the .added, .done and final
 * objects agree. Events get "type" and "sequence_number" added here. */
#include "serve/resp.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

static json_t *text_part(const char *text, size_t text_len)
{
    return json_pack("{s:s,s:s%,s:[]}", "type", "output_text", "text", text, text_len, "annotations");
}

/* The assistant message; text NULL: the in-progress item, no content yet;
 * cut by max_output_tokens: "incomplete", as OpenAI marks it. */
static json_t *message_item(const resp_ids *s, const char *text, size_t text_len, const char *finish)
{
    const char *status = !text ? "in_progress" : finish && !strcmp(finish, "length") ? "incomplete" : "completed";
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", s->msg_id, "status", status, "role", "assistant",
                     "content", text ? json_pack("[o]", text_part(text, text_len)) : json_array());
}

/* A call's function_call item; done false: in progress, no arguments yet. */
static json_t *call_item(const cv_tool_call *c, bool done)
{
    char id[48];
    snprintf(id, sizeof id, "fc_%s", c->id + strlen("call_"));
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "type", "function_call", "id", id, "call_id", c->id, "name",
                     c->name, "arguments", done ? c->arguments : "", "status", done ? "completed" : "in_progress");
}

static bool has_calls(const cv_tool_calls *calls) { return calls && calls->n > 0; }

/* Whether the answer has a message item: always without calls, else when text is left besides them. */
static bool has_message(const cv_tool_calls *calls) { return !has_calls(calls) || calls->content.n > 0; }

/* The output items of a whole answer. */
static json_t *output_items(const resp_ids *s, const char *text, size_t text_len, const char *finish,
                            const cv_tool_calls *calls)
{
    json_t *out = json_array();
    if (has_calls(calls)) {
        text = calls->content.p ? calls->content.p : "";
        text_len = calls->content.n;
    }
    if (out && has_message(calls))
        json_array_append_new(out, message_item(s, text, text_len, finish));
    for (int i = 0; out && has_calls(calls) && i < calls->n; i++)
        json_array_append_new(out, call_item(&calls->calls[i], true));
    return out;
}

static json_t *response(const oai_server *srv, const resp_ids *s, const char *text, size_t text_len, const char *finish,
                        const cv_tool_calls *calls, const oai_usage *u)
{
    const bool cut = text && finish && !strcmp(finish, "length");
    json_t *usage = u ? json_pack("{s:i,s:{s:i},s:i,s:i}", "input_tokens", u->prompt_tokens, "input_tokens_details",
                                  "cached_tokens", u->cached_tokens, "output_tokens", u->completion_tokens,
                                  "total_tokens", u->prompt_tokens + u->completion_tokens)
                      : json_null();
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:o,s:o,s:n}", "id", s->id, "object", "response", "created_at",
                     (json_int_t)s->created, "status",
                     !text ? "in_progress"
                     : cut ? "incomplete"
                           : "completed",
                     "model", srv->model_id, "output",
                     text ? output_items(s, text, text_len, finish, calls) : json_array(),
                     "incomplete_details", cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null(),
                     "usage", usage, "error");
}

char *cv_resp_object_json(const oai_server *srv, const resp_ids *s, const char *text, size_t text_len,
                          const char *finish, const cv_tool_calls *calls, const oai_usage *u)
{
    json_t *j = response(srv, s, text, text_len, finish, calls, u);
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return out;
}

/* Appends event `type` with the fields of data (taken over). */
static int event(resp_ids *s, const char *type, json_t *data, cv_buf *out)
{
    if (!data)
        return -1;
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer(s->seq++));
    char *text = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    const int rc = !text || cv_buf_puts(out, "event: ") || cv_buf_puts(out, type) || cv_buf_puts(out, "\ndata: ") ||
                   cv_buf_puts(out, text) || cv_buf_puts(out, "\n\n");
    free(text);
    return rc ? -1 : 0;
}

static json_t *part_at(const resp_ids *s)
{
    return json_pack("{s:s,s:i,s:i}", "item_id", s->msg_id, "output_index", 0, "content_index", 0);
}

int cv_resp_sse_start(const oai_server *srv, resp_ids *s, cv_buf *out)
{
    if (event(s, "response.created", json_pack("{s:o}", "response", response(srv, s, NULL, 0, NULL, NULL, NULL)), out))
        return -1;
    return event(s, "response.in_progress", json_pack("{s:o}", "response", response(srv, s, NULL, 0, NULL, NULL, NULL)),
                 out);
}

/* Announces the message item and its text part, once. */
static int open_message(resp_ids *s, cv_buf *out)
{
    if (s->msg_open)
        return 0;
    s->msg_open = true;
    if (event(s, "response.output_item.added",
              json_pack("{s:i,s:o}", "output_index", 0, "item", message_item(s, NULL, 0, NULL)), out))
        return -1;
    json_t *j = part_at(s);
    if (j)
        json_object_set_new(j, "part", text_part("", 0));
    return event(s, "response.content_part.added", j, out);
}

int cv_resp_sse_delta(resp_ids *s, const char *text, size_t text_len, cv_buf *out)
{
    json_t *j = open_message(s, out) ? NULL : part_at(s);
    if (j)
        json_object_set_new(j, "delta", json_stringn(text, text_len));
    return event(s, "response.output_text.delta", j, out);
}

/* The message's closing events. */
static int close_message(resp_ids *s, const char *text, size_t text_len, const char *finish, cv_buf *out)
{
    json_t *j = open_message(s, out) ? NULL : part_at(s);
    if (j)
        json_object_set_new(j, "text", json_stringn(text, text_len));
    if (event(s, "response.output_text.done", j, out))
        return -1;
    j = part_at(s);
    if (j)
        json_object_set_new(j, "part", text_part(text, text_len));
    if (event(s, "response.content_part.done", j, out))
        return -1;
    return event(s, "response.output_item.done",
                 json_pack("{s:i,s:o}", "output_index", 0, "item", message_item(s, text, text_len, finish)), out);
}

/* A call's events at output_index i: its item added, its arguments in one delta, done. */
static int call_events(resp_ids *s, const cv_tool_call *c, int i, cv_buf *out)
{
    char id[48];
    snprintf(id, sizeof id, "fc_%s", c->id + strlen("call_"));
    if (event(s, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", i, "item", call_item(c, false)),
              out) ||
        event(s, "response.function_call_arguments.delta",
              json_pack("{s:s,s:i,s:s}", "item_id", id, "output_index", i, "delta", c->arguments), out) ||
        event(s, "response.function_call_arguments.done",
              json_pack("{s:s,s:i,s:s,s:s}", "item_id", id, "output_index", i, "name", c->name, "arguments",
                        c->arguments), out))
        return -1;
    return event(s, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", i, "item", call_item(c, true)),
                 out);
}

int cv_resp_sse_done(const oai_server *srv, resp_ids *s, const char *text, size_t text_len, const char *finish,
                  const cv_tool_calls *calls, const oai_usage *u, cv_buf *out)
{
    const char *msg = has_calls(calls) ? (calls->content.p ? calls->content.p : "") : text;
    const size_t msg_len = has_calls(calls) ? calls->content.n : text_len;
    if (has_message(calls) && close_message(s, msg, msg_len, finish, out))
        return -1;
    for (int i = 0; has_calls(calls) && i < calls->n; i++)
        if (call_events(s, &calls->calls[i], (has_message(calls) ? 1 : 0) + i, out))
            return -1;
    return event(s, strcmp(finish, "length") ? "response.completed" : "response.incomplete",
                 json_pack("{s:o}", "response", response(srv, s, text, text_len, finish, calls, u)), out);
}

int cv_resp_sse_error(resp_ids *s, const oai_error *e, cv_buf *out)
{
    return event(s, "error",
                 json_pack("{s:o,s:s,s:o}", "code", e->code ? json_string(e->code) : json_null(), "message", e->message,
                           "param", e->param[0] ? json_string(e->param) : json_null()),
                 out);
}
