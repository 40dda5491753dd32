/* tools.c: see tools.h. */
#include "serve/tools.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/splitmix.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define PYTHON_TAG "<|python_tag|>"

cv_tool_format cv_tools_detect(const char *t)
{
    if (!t)
        return CV_TOOLS_NONE;
    if (strstr(t, HERMES_OPEN))
        return CV_TOOLS_HERMES;
    if (strstr(t, MISTRAL_OPEN))
        return CV_TOOLS_MISTRAL;
    if (strstr(t, PYTHON_TAG) || (strstr(t, "<|start_header_id|>") && strstr(t, "parameters")))
        return CV_TOOLS_LLAMA3;
    return CV_TOOLS_NONE;
}

void cv_tool_calls_free(cv_tool_calls *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->calls[i].name);
        free(c->calls[i].arguments);
    }
    cv_free(c->calls);
    cv_buf_free(&c->content);
    *c = (cv_tool_calls){0};
}

static const char *find(const char *p, const char *end, const char *needle)
{
    const size_t k = strlen(needle);
    for (; (size_t)(end - p) >= k; p++)
        if (!memcmp(p, needle, k))
            return p;
    return NULL;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* Reads one JSON value at [p, end); *used gets the bytes it took. */
static json_t *load_prefix(const char *p, const char *end, size_t *used)
{
    json_error_t je;
    json_t *v = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    *used = v ? (size_t)je.position : 0;
    if (v && *used > (size_t)(end - p)) {
        json_decref(v);
        return NULL;
    }
    return v;
}

/* Appends the call object o ({name, arguments|parameters}); returns 1 when
 * o is not a call, -1 out of memory. */
static int add_call(cv_tool_calls *out, const json_t *o, uint64_t seed)
{
    const json_t *name = json_object_get(o, "name");
    const json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    if (!json_is_object(o) || !json_is_string(name) || (args && !json_is_object(args) && !json_is_string(args)))
        return 1;
    cv_tool_call *grown = cv_realloc(out->calls, sizeof *grown * (size_t)(out->n + 1));
    if (!grown)
        return -1;
    out->calls = grown;
    cv_tool_call *c = &grown[out->n];
    c->name = strdup(json_string_value(name));
    c->arguments = !args                  ? strdup("{}")
                   : json_is_string(args) ? strdup(json_string_value(args))
                                          : json_dumps(args, JSON_COMPACT);
    uint64_t r = cv_splitmix64(seed + (uint64_t)out->n * CV_SPLITMIX_GAMMA);
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    memcpy(c->id, "call_", 5);
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0)
            r = cv_splitmix64(r);
        c->id[5 + i] = digits[(r >> (8 * (i % 8))) % 62];
    }
    c->id[29] = '\0';
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return -1;
    }
    out->n++;
    return 0;
}

/* Adds the calls of a JSON value (one call object, or for arrays each);
 * returns 1, adding none, when any is not a call. */
static int add_calls(cv_tool_calls *out, const json_t *v, uint64_t seed)
{
    const int before = out->n;
    int rc = 0;
    if (json_is_array(v)) {
        rc = json_array_size(v) ? 0 : 1;
        for (size_t i = 0; rc == 0 && i < json_array_size(v); i++)
            rc = add_call(out, json_array_get(v, i), seed);
    } else {
        rc = add_call(out, v, seed);
    }
    while (rc != 0 && out->n > before) {
        out->n--;
        free(out->calls[out->n].name);
        free(out->calls[out->n].arguments);
    }
    return rc;
}

/* Hermes: each <tool_call>JSON</tool_call> a call, all else content. */
static int parse_hermes(const char *p, const char *end, uint64_t seed, cv_tool_calls *out)
{
    const size_t lo = strlen(HERMES_OPEN), lc = strlen(HERMES_CLOSE);
    bool after_call = false;
    for (;;) {
        const char *o = find(p, end, HERMES_OPEN);
        const char *stop = o ? o : end;
        /* only whitespace after a call: the separator of calls, not content */
        if (!(after_call && skip_ws(p, stop) == stop) && cv_buf_append(&out->content, p, (size_t)(stop - p)))
            return -1;
        if (!o)
            return 0;
        const char *j = skip_ws(o + lo, end);
        size_t used;
        json_t *v = load_prefix(j, end, &used);
        const char *c = v ? skip_ws(j + used, end) : NULL;
        int rc = 1;
        if (c && (size_t)(end - c) >= lc && !memcmp(c, HERMES_CLOSE, lc))
            rc = add_calls(out, v, seed);
        json_decref(v);
        if (rc < 0)
            return -1;
        /* Not a call: its opening marker stays text and reading goes on after it. */
        const char *next = rc == 0 ? c + lc : o + lo;
        if (rc != 0 && cv_buf_append(&out->content, o, lo))
            return -1;
        after_call = rc == 0;
        p = next;
    }
}

/* Mistral: text, then [TOOL_CALLS] and a JSON array (or object) of calls. */
static int parse_mistral(const char *p, const char *end, uint64_t seed, cv_tool_calls *out)
{
    const char *o = find(p, end, MISTRAL_OPEN);
    if (!o)
        return cv_buf_append(&out->content, p, (size_t)(end - p));
    const char *j = skip_ws(o + strlen(MISTRAL_OPEN), end);
    size_t used;
    json_t *v = load_prefix(j, end, &used);
    const int rc = v ? add_calls(out, v, seed) : 1;
    json_decref(v);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return cv_buf_append(&out->content, p, (size_t)(end - p));
    const char *after = skip_ws(j + used, end);
    return cv_buf_append(&out->content, p, (size_t)(o - p)) ||
           cv_buf_append(&out->content, after, (size_t)(end - after));
}

/* Llama 3.x: the whole output one call object (or an array of them). */
static int parse_llama3(const char *p, const char *end, uint64_t seed, cv_tool_calls *out)
{
    const char *j = skip_ws(p, end);
    const size_t lt = strlen(PYTHON_TAG);
    if ((size_t)(end - j) >= lt && !memcmp(j, PYTHON_TAG, lt))
        j = skip_ws(j + lt, end);
    size_t used;
    json_t *v = j < end && (*j == '{' || *j == '[') ? load_prefix(j, end, &used) : NULL;
    const int rc = v && skip_ws(j + used, end) == end ? add_calls(out, v, seed) : 1;
    json_decref(v);
    if (rc < 0)
        return -1;
    return rc > 0 ? cv_buf_append(&out->content, p, (size_t)(end - p)) : cv_buf_append(&out->content, "", 0);
}

int cv_tools_parse(cv_tool_format f, const char *text, size_t len, uint64_t seed, cv_tool_calls *out)
{
    *out = (cv_tool_calls){0};
    const char *end = text + len;
    const int rc = f == CV_TOOLS_HERMES    ? parse_hermes(text, end, seed, out)
                   : f == CV_TOOLS_MISTRAL ? parse_mistral(text, end, seed, out)
                   : f == CV_TOOLS_LLAMA3  ? parse_llama3(text, end, seed, out)
                                           : cv_buf_append(&out->content, text, len);
    if (rc)
        cv_tool_calls_free(out);
    return rc ? -1 : 0;
}

/* Bytes of [text, text+len) before marker starts in it, or may start at its end. */
static size_t before_marker(const char *text, size_t len, const char *marker)
{
    const char *m = find(text, text + len, marker);
    if (m)
        return (size_t)(m - text);
    const size_t k = strlen(marker);
    for (size_t i = len > k ? len - k + 1 : 0; i < len; i++)
        if (!memcmp(text + i, marker, len - i))
            return i;
    return len;
}

const char *const *cv_tools_markers(cv_tool_format f)
{
    static const char *const hermes[] = {HERMES_OPEN, HERMES_CLOSE, NULL}, *const mistral[] = {MISTRAL_OPEN, NULL},
                             *const llama3[] = {PYTHON_TAG, NULL}, *const none[] = {NULL};
    return f == CV_TOOLS_HERMES ? hermes : f == CV_TOOLS_MISTRAL ? mistral : f == CV_TOOLS_LLAMA3 ? llama3 : none;
}

size_t cv_tools_safe(cv_tool_format f, const char *text, size_t len)
{
    if (f == CV_TOOLS_HERMES)
        return before_marker(text, len, HERMES_OPEN);
    if (f == CV_TOOLS_MISTRAL)
        return before_marker(text, len, MISTRAL_OPEN);
    if (f == CV_TOOLS_LLAMA3) {
        const char *j = skip_ws(text, text + len);
        const size_t lead = (size_t)(j - text);
        if (j == text + len || *j == '{' || *j == '[' || before_marker(j, len - lead, PYTHON_TAG) == 0)
            return 0;
        return len;
    }
    return len;
}
