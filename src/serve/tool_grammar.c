/* tool_grammar.c: see tool_grammar.h.
 *
 * Design: the calls are described as one JSON schema (a call object
 * {"name": {"const": X}, ARGS: parameters}, anyOf over the tools, in an
 * array for Mistral) and compiled by cv_schema_grammar; its start rule is
 * then renamed and wrapped in a start rule that writes the format's
 * markers around it. */
#include "serve/tool_grammar.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "serve/buf.h"
#include "serve/schema.h"

/* The function object of tool i, or NULL with err filled. */
static const json_t *tool_function(const json_t *tools, size_t i, char *err, size_t errlen)
{
    const json_t *t = json_array_get(tools, i), *type = json_object_get(t, "type");
    const json_t *fn = json_object_get(t, "function");
    if (!json_is_object(t) || (type && (!json_is_string(type) || strcmp(json_string_value(type), "function")))) {
        cv_errf(err, errlen, "tools[%zu] must be an object of type \"function\"", i);
        return NULL;
    }
    if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
        cv_errf(err, errlen, "tools[%zu].function must be an object with a string 'name'", i);
        return NULL;
    }
    const json_t *params = json_object_get(fn, "parameters");
    if (params && !json_is_null(params) && !json_is_object(params)) {
        cv_errf(err, errlen, "tools[%zu].function.parameters must be a JSON schema (an object)", i);
        return NULL;
    }
    return fn;
}

/* The name a tool_choice object gives: chat's function.name or the Responses API's name. */
static const char *choice_name(const json_t *choice)
{
    const json_t *fn = json_object_get(choice, "function");
    const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : json_object_get(choice, "name");
    const char *type = json_string_value(json_object_get(choice, "type"));
    return type && !strcmp(type, "function") ? json_string_value(name) : NULL;
}

int cv_tool_choice_read(const json_t *tools, const json_t *choice, cv_tool_choice *out, char *err, size_t errlen)
{
    *out = (cv_tool_choice){CV_TOOL_AUTO, NULL};
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!tool_function(tools, i, err, errlen))
            return -1;
    const char *s = json_string_value(choice);
    if (!choice || json_is_null(choice) || (s && !strcmp(s, "auto")))
        return 0;
    if (s && (!strcmp(s, "none") || !strcmp(s, "required"))) {
        out->mode = !strcmp(s, "none") ? CV_TOOL_NONE : CV_TOOL_REQUIRED;
        return 0;
    }
    const char *name = json_is_object(choice) ? choice_name(choice) : NULL;
    if (!name)
        return cv_errf(err, errlen, "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function "
                                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(tools, i), "function"),
                                                      "name")), name)) {
            *out = (cv_tool_choice){CV_TOOL_NAMED, name};
            return 0;
        }
    return cv_errf(err, errlen, "'tool_choice' names the function '%.200s', which is not among the tools", name);
}

/* Points every "#..." $ref in v (the parameters, now at `at` in the
 * whole schema) at its place there. Returns 0, or -1 when out of memory. */
static int move_refs(json_t *v, const char *at)
{
    const char *key;
    json_t *m;
    size_t i;
    json_array_foreach(v, i, m)
    {
        if (move_refs(m, at))
            return -1;
    }
    json_object_foreach(v, key, m)
    {
        const char *ref = json_string_value(m);
        if (!strcmp(key, "$ref") && ref && ref[0] == '#') {
            char *moved = cv_malloc(strlen(at) + strlen(ref) + 2);
            if (!moved)
                return -1;
            sprintf(moved, "#%s%s", at, ref + 1);
            const int rc = json_object_set_new(v, key, json_string(moved));
            cv_free(moved);
            if (rc)
                return -1;
        } else if (move_refs(m, at)) {
            return -1;
        }
    }
    return 0;
}

/* The schema of one call of fn: {"name": its name, key: its parameters}
 * (placed at `at` in the whole schema); parameters that list properties
 * and say nothing of others take no others (as llama.cpp holds calls), so
 * a call holds only the named ones. */
static json_t *call_schema(const json_t *fn, const char *key, const char *at)
{
    const json_t *params = json_object_get(fn, "parameters");
    json_t *args = json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    if (args && json_object_get(args, "properties") && !json_object_get(args, "additionalProperties"))
        json_object_set_new(args, "additionalProperties", json_false());
    if (args && move_refs(args, at)) {
        json_decref(args);
        return NULL;
    }
    return json_pack("{s:s,s:{s:{s:O},s:o},s:[s,s],s:b}", "type", "object", "properties", "name", "const",
                     json_object_get(fn, "name"), key, args, "required", "name", key, "additionalProperties", 0);
}

/* The number of the tools a call may be of: name's, or all. */
static size_t callable(const json_t *tools, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(tools); i++)
        n += !name || !strcmp(name, json_string_value(json_object_get(
                                           json_object_get(json_array_get(tools, i), "function"), "name")));
    return n;
}

/* The schema of one call of the tools (only name's when not NULL), placed
 * at `at` in the whole schema; each tool's parameters are compiled alone
 * first, so that a refusal names it. */
static json_t *calls_schema(const json_t *tools, const char *name, const char *key, const char *at, char *err,
                            size_t errlen)
{
    const size_t n = callable(tools, name);
    json_t *any = json_array();
    for (size_t i = 0; any && i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (name && strcmp(name, fname))
            continue;
        char path[96], why[CV_ERRLEN];
        if (n == 1)
            snprintf(path, sizeof path, "%s/properties/%s", at, key);
        else
            snprintf(path, sizeof path, "%s/anyOf/%zu/properties/%s", at, json_array_size(any), key);
        const json_t *params = json_object_get(fn, "parameters");
        char *g = json_is_object(params) ? cv_schema_grammar(params, why, sizeof why) : NULL;
        json_t *one = g || !json_is_object(params) ? call_schema(fn, key, path) : NULL;
        cv_free(g);
        if (!one) {
            json_decref(any);
            if (!g && json_is_object(params))
                cv_errf(err, errlen, "tools[%zu] (%.100s): its parameters schema is not supported: %s", i, fname, why);
            else
                cv_errf(err, errlen, "out of memory");
            return NULL;
        }
        json_array_append_new(any, one);
    }
    if (!any || json_array_size(any) == 0) {
        json_decref(any);
        cv_errf(err, errlen, any ? "there are no tools to call" : "out of memory");
        return NULL;
    }
    if (json_array_size(any) == 1) {
        json_t *one = json_incref(json_array_get(any, 0));
        json_decref(any);
        return one;
    }
    return json_pack("{s:o}", "anyOf", any);
}

/* The end of the GBNF element that starts at p when it is a literal,
 * class, comment or repetition bound (which hold no rule names), else p. */
static const char *skip_opaque(const char *p)
{
    const char close = *p == '"' ? '"' : *p == '[' ? ']' : *p == '{' ? '}' : *p == '#' ? '\n' : 0;
    if (!close)
        return p;
    for (p++; *p && *p != close; p++)
        if (*p == '\\' && close != '\n' && p[1])
            p++;
    return *p ? p + 1 : p;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

/* g with every rule name `from` written `to` (to NULL: only whether from
 * occurs, as 0 or 1). Returns 0, 1, or -1 when out of memory. */
static int rename_rule(const char *g, const char *from, const char *to, cv_buf *out)
{
    const size_t nf = strlen(from);
    for (const char *p = g; *p;) {
        const char *q = skip_opaque(p);
        if (q == p && name_char(*p)) {
            while (name_char(*q))
                q++;
            const bool hit = (size_t)(q - p) == nf && !memcmp(p, from, nf);
            if (hit && !to)
                return 1;
            if (to && (hit ? cv_buf_puts(out, to) : cv_buf_append(out, p, (size_t)(q - p))))
                return -1;
        } else {
            q = q == p ? p + 1 : q;
            if (to && cv_buf_append(out, p, (size_t)(q - p)))
                return -1;
        }
        p = q;
    }
    return 0;
}

/* The format's start rule around the call rule `c` (Mistral: the array's). */
static int start_rule(cv_tool_format f, const char *c, bool parallel, cv_buf *out)
{
    char line[256];
    if (f == CV_TOOLS_HERMES && parallel)
        snprintf(line, sizeof line,
                 "root ::= \"<tool_call>\\n\" %s \"\\n</tool_call>\" "
                 "(\"\\n<tool_call>\\n\" %s \"\\n</tool_call>\")*\n", c, c);
    else if (f == CV_TOOLS_HERMES)
        snprintf(line, sizeof line, "root ::= \"<tool_call>\\n\" %s \"\\n</tool_call>\"\n", c);
    else if (f == CV_TOOLS_MISTRAL)
        snprintf(line, sizeof line, "root ::= \"[TOOL_CALLS]\" %s\n", c);
    else
        snprintf(line, sizeof line, "root ::= %s\n", c);
    return cv_buf_puts(out, line);
}

/* The grammar of schema, its start rule renamed and wrapped for format f. */
static char *wrap(cv_tool_format f, const json_t *schema, bool parallel, char *err, size_t errlen)
{
    char why[CV_ERRLEN], name[64] = "tool-call";
    char *g = cv_schema_grammar(schema, why, sizeof why);
    if (!g) {
        cv_errf(err, errlen, "the tools' calls cannot be held to a grammar: %s", why);
        return NULL;
    }
    cv_buf out = {0};
    int rc = 0;
    for (int k = 2; (rc = rename_rule(g, name, NULL, NULL)) == 1; k++)
        snprintf(name, sizeof name, "tool-call-%d", k);
    if (rc == 0)
        rc = start_rule(f, name, parallel, &out);
    if (rc == 0)
        rc = rename_rule(g, "root", name, &out);
    cv_free(g);
    if (rc) {
        cv_buf_free(&out);
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    return out.p;
}

char *cv_tool_grammar(cv_tool_format f, const json_t *tools, const char *name, bool parallel, char *err,
                      size_t errlen)
{
    if (f == CV_TOOLS_NONE) {
        cv_errf(err, errlen, "the chat template's tool-call format is not recognized, so no call can be forced");
        return NULL;
    }
    json_t *one = calls_schema(tools, name, f == CV_TOOLS_LLAMA3 ? "parameters" : "arguments",
                               f == CV_TOOLS_MISTRAL ? "/items" : "", err, errlen);
    if (!one)
        return NULL;
    json_t *schema = one;
    if (f == CV_TOOLS_MISTRAL)
        schema = parallel ? json_pack("{s:s,s:o,s:i}", "type", "array", "items", one, "minItems", 1)
                          : json_pack("{s:s,s:o,s:i,s:i}", "type", "array", "items", one, "minItems", 1, "maxItems", 1);
    char *g = schema ? wrap(f, schema, parallel && f == CV_TOOLS_HERMES, err, errlen) : NULL;
    if (!schema)
        cv_errf(err, errlen, "out of memory");
    json_decref(schema);
    return g;
}
