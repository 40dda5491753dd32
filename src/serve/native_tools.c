/* native_tools.c: see native_tools.h. The texts are those of the
 * reference templates in ../shared/reference/chat-templates (Qwen2.5's
 * and Qwen3's tools block; the shapes of calls and results of those,
 * Llama 3.1's and Mistral Nemo's); chat/chat.c writes the rest. */
#include "serve/native_tools.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

static const char TOOLS_HEAD[] = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_TAIL[] = "\n</tools>\n\nFor each function call, return a json object with function name and "
                                 "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                                 "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

cv_tool_format cv_native_tool_format(cv_chat_kind k)
{
    switch (k) {
    case CV_CHAT_CHATML:
    case CV_CHAT_QWEN25:
    case CV_CHAT_QWEN3: return CV_TOOLS_HERMES;
    case CV_CHAT_LLAMA31: return CV_TOOLS_LLAMA3;
    case CV_CHAT_MISTRAL: return CV_TOOLS_MISTRAL;
    default: return CV_TOOLS_NONE;
    }
}

static bool is(const char *role, const char *name) { return role && !strcmp(role, name); }

static const json_t *tool_calls(const cv_native_msg *m)
{
    const json_t *c = json_object_get(m->json, "tool_calls");
    return is(m->role, "assistant") && json_is_array(c) && json_array_size(c) ? c : NULL;
}

bool cv_native_tools_needed(const cv_native_msg *msgs, int n, const json_t *tools)
{
    bool needed = json_array_size(tools) > 0;
    for (int i = 0; i < n && !needed; i++)
        needed = is(msgs[i].role, "tool") || tool_calls(&msgs[i]);
    return needed;
}

/* Python's json.dumps of v (", " and ": " between items, UTF-8 as is). */
static int put_json(cv_buf *b, const json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_INDENT(0) | JSON_REAL_PRECISION(17));
    const int rc = !s || cv_buf_puts(b, s);
    free(s);
    return rc ? -1 : 0;
}

/* The system message with the tools: its content (or qwen2.5's default)
 * then the tools block. */
static int system_with_tools(cv_chat_kind k, const cv_native_msg *first, const json_t *tools, cv_buf *b)
{
    const bool sys = is(first->role, "system");
    int rc = 0;
    if (sys || cv_chat_default_system(k))
        rc = cv_buf_puts(b, sys ? first->content : cv_chat_default_system(k)) || cv_buf_puts(b, "\n\n");
    rc = rc || cv_buf_puts(b, TOOLS_HEAD);
    for (size_t i = 0; !rc && i < json_array_size(tools); i++)
        rc = cv_buf_puts(b, "\n") || put_json(b, json_array_get(tools, i));
    return rc || cv_buf_puts(b, TOOLS_TAIL) ? -1 : 0;
}

/* A call's arguments: an object, or a string holding one (written as the
 * object, except for qwen3, which writes a string as it is). */
static int put_arguments(cv_chat_kind k, cv_buf *b, const json_t *args)
{
    if (!args)
        return cv_buf_puts(b, "{}");
    if (!json_is_string(args) || k == CV_CHAT_QWEN3)
        return json_is_string(args) ? cv_buf_puts(b, json_string_value(args)) : put_json(b, args);
    json_t *v = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
    const int rc = put_json(b, v ? v : args);
    json_decref(v);
    return rc;
}

/* Call i of calls in the family's shape: Hermes <tool_call> blocks (after
 * a newline but for the first of a message without content), Llama's
 * {"name", "parameters"}, Mistral's {"name", "arguments", "id"} (after
 * ", " but for the first). */
static int put_call(cv_chat_kind k, const json_t *calls, size_t i, bool content, cv_buf *b, char *err, size_t errlen)
{
    const json_t *c = json_array_get(calls, i), *fn = json_object_get(c, "function");
    const json_t *f = json_is_object(fn) ? fn : c;
    const char *name = json_string_value(json_object_get(f, "name"));
    const char *id = json_string_value(json_object_get(c, "id"));
    if (!name)
        return cv_errf(err, errlen, "a tool call in the messages has no function name");
    const bool hermes = cv_native_tool_format(k) == CV_TOOLS_HERMES;
    const char *opening = hermes ? "<tool_call>\n{\"name\": \"" : "{\"name\": \"";
    const char *sep = k == CV_CHAT_MISTRAL ? ", " : "\n";
    const int rc = ((i > 0 || (content && k != CV_CHAT_MISTRAL)) && cv_buf_puts(b, sep)) || cv_buf_puts(b, opening) ||
                   cv_buf_puts(b, name) ||
                   cv_buf_puts(b, k == CV_CHAT_LLAMA31 ? "\", \"parameters\": " : "\", \"arguments\": ") ||
                   put_arguments(k, b, json_object_get(f, "arguments")) ||
                   (k == CV_CHAT_MISTRAL && (cv_buf_puts(b, ", \"id\": \"") || cv_buf_puts(b, id ? id : "") ||
                                             cv_buf_puts(b, "\""))) ||
                   cv_buf_puts(b, hermes ? "}\n</tool_call>" : "}");
    return rc ? cv_errf(err, errlen, "out of memory rendering the chat") : 0;
}

/* An assistant message with tool calls: Hermes its content then the
 * calls; Llama its one call; Mistral [TOOL_CALLS] and the list. */
static int assistant_with_calls(cv_chat_kind k, const cv_native_msg *m, cv_buf *b, char *err, size_t errlen)
{
    const json_t *calls = tool_calls(m);
    if (k == CV_CHAT_LLAMA31 && json_array_size(calls) != 1)
        return cv_errf(err, errlen, "llama3.1 chat template: This model only supports single tool-calls at once!");
    const bool hermes = cv_native_tool_format(k) == CV_TOOLS_HERMES;
    int rc = hermes && !m->empty ? cv_buf_puts(b, m->content)
             : k == CV_CHAT_MISTRAL  ? cv_buf_puts(b, "[TOOL_CALLS][")
                                     : 0;
    for (size_t i = 0; !rc && i < json_array_size(calls); i++)
        rc = put_call(k, calls, i, hermes && !m->empty, b, err, errlen);
    if (!rc && k == CV_CHAT_MISTRAL && cv_buf_puts(b, "]"))
        rc = -1;
    return rc ? cv_errf(err, errlen, "out of memory rendering the chat") : 0;
}

/* A tool result: Llama's content as a JSON string, Mistral's {"content", "call_id"}. */
static int tool_result(cv_chat_kind k, const cv_native_msg *m, cv_buf *b)
{
    if (k == CV_CHAT_MISTRAL) {
        const char *id = json_string_value(json_object_get(m->json, "tool_call_id"));
        return cv_buf_puts(b, "{\"content\": ") || cv_buf_puts(b, m->content) || cv_buf_puts(b, ", \"call_id\": \"") ||
                       cv_buf_puts(b, id ? id : "") || cv_buf_puts(b, "\"}")
                   ? -1
                   : 0;
    }
    json_t *s = json_string(m->content);
    const int rc = s ? put_json(b, s) : -1;
    json_decref(s);
    return rc;
}

/* Message i (Hermes: a run of tool messages from i, *used of them) as one message of the family into b. */
static int plain_message(cv_chat_kind k, const cv_native_msg *msgs, int n, int i, int *used, cv_chat_msg *out,
                         cv_buf *b, char *err, size_t errlen)
{
    *used = 1;
    if (tool_calls(&msgs[i])) {
        out->role = cv_native_tool_format(k) == CV_TOOLS_HERMES ? CV_CHAT_ASSISTANT : CV_CHAT_TOOL_CALL;
        return assistant_with_calls(k, &msgs[i], b, err, errlen);
    }
    if (!is(msgs[i].role, "tool")) {
        const int r = cv_chat_role_from_name(msgs[i].role);
        if (r < 0)
            return cv_errf(err, errlen, "messages[%d]: role '%s' is not supported", i, msgs[i].role);
        out->role = (cv_chat_role)r;
        return cv_buf_puts(b, msgs[i].content) ? cv_errf(err, errlen, "out of memory rendering the chat") : 0;
    }
    if (cv_native_tool_format(k) != CV_TOOLS_HERMES) {
        out->role = CV_CHAT_TOOL;
        return tool_result(k, &msgs[i], b) ? cv_errf(err, errlen, "out of memory rendering the chat") : 0;
    }
    out->role = CV_CHAT_USER;
    int rc = 0;
    for (*used = 0; i + *used < n && is(msgs[i + *used].role, "tool") && !rc; (*used)++)
        rc = (*used > 0 && cv_buf_puts(b, "\n")) || cv_buf_puts(b, "<tool_response>\n") ||
             cv_buf_puts(b, msgs[i + *used].content) || cv_buf_puts(b, "\n</tool_response>");
    return rc ? cv_errf(err, errlen, "out of memory rendering the chat") : 0;
}

/* Mistral's list of tools: each {"type": "function", "function": {...}}
 * with the function's members but "return", strings written unescaped as
 * the template writes them. */
static int mistral_tools(const json_t *tools, cv_buf *b)
{
    int rc = cv_buf_puts(b, "[");
    for (size_t i = 0; !rc && i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        rc = (i > 0 && cv_buf_puts(b, ", ")) || cv_buf_puts(b, "{\"type\": \"function\", \"function\": {");
        const char *key;
        const json_t *val;
        bool first = true;
        json_object_foreach((json_t *)fn, key, val)
        {
            if (rc || !strcmp(key, "return"))
                continue;
            rc = (!first && cv_buf_puts(b, ", ")) || cv_buf_puts(b, "\"") || cv_buf_puts(b, key) ||
                 cv_buf_puts(b, "\": ") ||
                 (json_is_string(val) ? cv_buf_puts(b, "\"") || cv_buf_puts(b, json_string_value(val)) ||
                                            cv_buf_puts(b, "\"")
                                      : put_json(b, val));
            first = false;
        }
        rc = rc || cv_buf_puts(b, "}}");
    }
    return rc || cv_buf_puts(b, "]") ? -1 : 0;
}

/* The tools' text for llama3.1 (each as indented JSON and a blank line) and mistral. */
static int tools_text(cv_chat_kind k, const json_t *tools, cv_buf *b)
{
    if (k == CV_CHAT_MISTRAL)
        return mistral_tools(tools, b);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        char *s = json_dumps(json_array_get(tools, i), JSON_INDENT(4) | JSON_REAL_PRECISION(17));
        const int rc = !s || cv_buf_puts(b, s) || cv_buf_puts(b, "\n\n");
        free(s);
        if (rc)
            return -1;
    }
    return 0;
}

int cv_native_tool_msgs(cv_chat_kind k, const cv_native_msg *msgs, int n, const json_t *tools, cv_native_chat *out,
                        char *err, size_t errlen)
{
    *out = (cv_native_chat){0};
    const bool hermes = cv_native_tool_format(k) == CV_TOOLS_HERMES, with_tools = json_array_size(tools) > 0;
    const int cap = n + 1;
    out->msgs = cv_calloc((size_t)cap, sizeof *out->msgs);
    out->texts = cv_calloc((size_t)cap, sizeof *out->texts);
    int rc = out->msgs && out->texts ? 0 : cv_errf(err, errlen, "out of memory rendering the chat");
    int i = 0;
    if (rc == 0 && with_tools && !hermes && (tools_text(k, tools, &out->tools) || cv_buf_puts(&out->tools, "")))
        rc = cv_errf(err, errlen, "out of memory rendering the chat");
    if (rc == 0 && with_tools && hermes) {
        rc = system_with_tools(k, &msgs[0], tools, &out->texts[0]) ? cv_errf(err, errlen, "out of memory") : 0;
        out->msgs[out->n++].role = CV_CHAT_SYSTEM;
        i = is(msgs[0].role, "system") ? 1 : 0;
    }
    while (rc == 0 && i < n) {
        int used = 1;
        rc = plain_message(k, msgs, n, i, &used, &out->msgs[out->n], &out->texts[out->n], err, errlen);
        out->n++;
        i += used;
    }
    for (int m = 0; rc == 0 && m < out->n; m++)
        out->msgs[m].content = out->texts[m].p ? out->texts[m].p : "";
    if (rc)
        cv_native_chat_free(out);
    return rc;
}

void cv_native_chat_free(cv_native_chat *c)
{
    for (int i = 0; c->texts && i < c->n; i++)
        cv_buf_free(&c->texts[i]);
    cv_free(c->texts);
    cv_free(c->msgs);
    cv_buf_free(&c->tools);
    *c = (cv_native_chat){0};
}
