/* resp_in.c: a Responses API request read as a chat body (cv_resp_chat_body,
 * see resp.h).
 *
 * Design: the chat body is built as a new jansson tree that holds
 * references to the request's own values (messages, parameters), so
 * nothing is copied but the items that change shape. */
#include <string.h>

#include "serve/resp.h"

#define INVALID "invalid_request_error"

/* The value of key, or NULL when absent or null. */
static json_t *opt(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static const char *item_type(const json_t *item)
{
    const json_t *t = json_object_get(item, "type");
    return json_is_string(t) ? json_string_value(t) : t ? "" : "message";
}

/* The assistant message that a function call joins: the last one when it
 * is an assistant's, else a new one. */
static json_t *assistant_for_call(json_t *msgs)
{
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!last || !role || strcmp(role, "assistant")) {
        json_array_append_new(msgs, json_pack("{s:s,s:n}", "role", "assistant", "content"));
        return json_array_get(msgs, json_array_size(msgs) - 1);
    }
    /* the request's own message stays as it was */
    json_t *copy = json_copy(last);
    json_array_set_new(msgs, json_array_size(msgs) - 1, copy);
    return copy;
}

/* A function_call item {call_id, name, arguments} as a tool call of the assistant's message. */
static int add_call(json_t *msgs, const json_t *item, size_t i, oai_error *e)
{
    const json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
    const json_t *args = json_object_get(item, "arguments");
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
        return cv_oai_fail(e, 400, INVALID, NULL, "input",
                        "input[%zu]: a function_call item needs string 'call_id', 'name' and 'arguments'", i);
    json_t *m = assistant_for_call(msgs);
    json_t *calls = m ? json_object_get(m, "tool_calls") : NULL;
    if (m && !json_is_array(calls)) {
        calls = json_array();
        json_object_set_new(m, "tool_calls", calls);
    }
    if (!calls || json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function",
                                                         "function", "name", name, "arguments", args)))
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

/* One input item appended to msgs as chat messages. */
static int add_item(json_t *msgs, json_t *item, size_t i, oai_error *e)
{
    const char *type = json_is_object(item) ? item_type(item) : "";
    if (!strcmp(type, "message"))
        return json_array_append(msgs, item) ? cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    if (!strcmp(type, "function_call"))
        return add_call(msgs, item, i, e);
    if (!strcmp(type, "function_call_output")) {
        const json_t *id = json_object_get(item, "call_id"), *output = json_object_get(item, "output");
        if (!json_is_string(id) || !json_is_string(output))
            return cv_oai_fail(e, 400, INVALID, NULL, "input",
                            "input[%zu]: a function_call_output item needs string 'call_id' and 'output'", i);
        return json_array_append_new(msgs, json_pack("{s:s,s:O,s:O}", "role", "tool", "tool_call_id", id, "content",
                                                     output))
                   ? cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory")
                   : 0;
    }
    return cv_oai_fail(e, 400, INVALID, NULL, "input",
                    "input[%zu]: items of type \"%.40s\" are not supported (only message, function_call and "
                    "function_call_output)", i, type);
}

/* The Responses API's function tools as chat tools. */
static json_t *chat_tools(const json_t *tools, oai_error *e)
{
    if (!json_is_array(tools)) {
        cv_oai_fail(e, 400, INVALID, NULL, "tools", "'tools' must be a list of tools");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") || !json_is_string(json_object_get(t, "name"))) {
            json_decref(out);
            cv_oai_fail(e, 400, INVALID, NULL, "tools",
                     "tools[%zu]: only function tools ({\"type\": \"function\", \"name\", \"parameters\"}) are "
                     "supported", i);
            return NULL;
        }
        json_t *fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
        if (fn && opt(t, "description"))
            json_object_set(fn, "description", opt(t, "description"));
        if (fn && opt(t, "parameters"))
            json_object_set(fn, "parameters", opt(t, "parameters"));
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return out;
}

/* instructions, then input, as chat messages into chat's "messages". */
static int chat_messages(const json_t *body, json_t *chat, oai_error *e)
{
    json_t *in = opt(body, "input"), *ins = opt(body, "instructions");
    if (!in)
        return cv_oai_fail(e, 400, INVALID, NULL, "input", "you must provide 'input'");
    if (ins && !json_is_string(ins))
        return cv_oai_fail(e, 400, INVALID, NULL, "instructions", "'instructions' must be a string");
    if (!json_is_string(in) && (!json_is_array(in) || json_array_size(in) == 0))
        return cv_oai_fail(e, 400, INVALID, NULL, "input", "'input' must be a string or a non-empty list of items");
    json_t *msgs = json_array();
    if (!msgs || json_object_set_new(chat, "messages", msgs))
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (ins)
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    if (json_is_string(in))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", in));
    for (size_t i = 0; json_is_array(in) && i < json_array_size(in); i++)
        if (add_item(msgs, json_array_get(in, i), i, e))
            return -1;
    return 0;
}

json_t *cv_resp_chat_body(const json_t *body, oai_error *e)
{
    if (opt(body, "previous_response_id")) {
        cv_oai_fail(e, 400, INVALID, NULL, "previous_response_id",
                 "'previous_response_id' is not supported: this server stores no responses; send the whole "
                 "conversation in 'input'");
        return NULL;
    }
    json_t *chat = json_object();
    if (!chat) {
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    static const char *const kept[] = {"tool_choice", "parallel_tool_calls"};
    for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++)
        if (opt(body, kept[k]))
            json_object_set(chat, kept[k], opt(body, kept[k]));
    json_t *tools = opt(body, "tools") ? chat_tools(opt(body, "tools"), e) : NULL;
    if ((opt(body, "tools") && !tools) || (tools && json_object_set_new(chat, "tools", tools)) ||
        chat_messages(body, chat, e)) {
        json_decref(chat);
        return NULL;
    }
    return chat;
}
