/* template.c: chat templates (template.h): a parsed Jinja template
 * (chat/jinja.h) and an OpenAI chat request body rendered through it. The
 * body is parsed here (jansson), its messages brought into the shape
 * templates expect (template.h says how), and the whole handed to the Jinja
 * engine as the template's variables. */
#include "chat/template.h"

#include <jansson.h>
#include <string.h>
#include <time.h>

#include "chat/jinja.h"
#include "core/alloc.h"
#include "core/budget.h"
#include "core/err.h"

struct cv_template {
    cv_jinja *jinja;
};

struct cv_template_pool {
    cv_budget b;
};

cv_template_pool *cv_template_pool_create(uint64_t bytes)
{
    cv_template_pool *p = cv_malloc(sizeof *p);
    if (p)
        cv_budget_init(&p->b, bytes);
    return p;
}

void cv_template_pool_free(cv_template_pool *p) { cv_free(p); }

uint64_t cv_template_pool_peak(const cv_template_pool *p) { return atomic_load(&p->b.peak); }

cv_template *cv_template_parse(const char *text, size_t len, char *err, size_t errlen)
{
    char msg[CV_ERRLEN];
    cv_jinja *j;
    if (cv_jinja_parse(text, len, &j, msg, sizeof msg) != 0) {
        cv_errf(err, errlen, "chat template %s", msg);
        return NULL;
    }
    cv_template *t = cv_malloc(sizeof *t);
    if (!t) {
        cv_jinja_free(j);
        cv_errf(err, errlen, "out of memory reading the chat template");
        return NULL;
    }
    t->jinja = j;
    return t;
}

void cv_template_free(cv_template *t)
{
    if (!t)
        return;
    cv_jinja_free(t->jinja);
    cv_free(t);
}

/* The content as one string: null or absent as "", a list of text parts
 * as their texts joined by "\n" (as vLLM gives templates that take strings). */
static int flatten_content(json_t *msg, size_t i, char *err, size_t errlen)
{
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c))
        return json_object_set_new(msg, "content", json_string("")) == 0 ? 0 : cv_errf(err, errlen, "out of memory");
    if (json_is_string(c))
        return 0;
    if (!json_is_array(c))
        return cv_errf(err, errlen, "messages[%zu].content must be a string, a list of parts or null", i);
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(json_object_get(part, "type")) ||
            strcmp(json_string_value(json_object_get(part, "type")), "text") || !json_is_string(text))
            return cv_errf(err, errlen, "messages[%zu].content[%zu] is not a text part (only text is supported)", i, k);
        total += json_string_length(text) + 1;
    }
    char *buf = cv_malloc(total + 1);
    if (!buf)
        return cv_errf(err, errlen, "out of memory");
    size_t n = 0;
    json_array_foreach(c, k, part) {
        json_t *text = json_object_get(part, "text");
        if (k)
            buf[n++] = '\n';
        memcpy(buf + n, json_string_value(text), json_string_length(text));
        n += json_string_length(text);
    }
    int rc = json_object_set_new(msg, "content", json_stringn_nocheck(buf, n));
    cv_free(buf);
    return rc == 0 ? 0 : cv_errf(err, errlen, "out of memory");
}

/* Tool calls' arguments strings that hold a JSON object become the object. */
static void parse_arguments(json_t *msg)
{
    size_t k;
    json_t *call;
    json_array_foreach(json_object_get(msg, "tool_calls"), k, call) {
        json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
        if (!json_is_string(args))
            continue;
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(parsed))
            json_object_set_new(fn, "arguments", parsed);
        else
            json_decref(parsed);
    }
}

static int prepare_messages(json_t *messages, char *err, size_t errlen)
{
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return cv_errf(err, errlen, "the request needs a non-empty messages array");
    size_t i;
    json_t *msg;
    json_array_foreach(messages, i, msg) {
        if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "role")))
            return cv_errf(err, errlen, "messages[%zu] needs a role", i);
        if (flatten_content(msg, i, err, errlen) != 0)
            return -1;
        parse_arguments(msg);
    }
    return 0;
}

/* The template's variables for a parsed request body. */
static json_t *context_of(json_t *req, const cv_render_params *p, char *err, size_t errlen)
{
    json_t *messages = json_object_get(req, "messages"), *tools = json_object_get(req, "tools");
    json_t *gen = json_object_get(req, "add_generation_prompt"), *kwargs = json_object_get(req, "chat_template_kwargs");
    if (prepare_messages(messages, err, errlen) != 0)
        return NULL;
    if (kwargs && !json_is_object(kwargs)) {
        cv_errf(err, errlen, "chat_template_kwargs must be an object");
        return NULL;
    }
    json_t *ctx = json_object();
    bool add_gen = json_is_boolean(gen) ? json_is_true(gen) : !p->no_generation_prompt;
    if (!ctx || json_object_set(ctx, "messages", messages) ||
        json_object_set_new(ctx, "tools", tools ? json_incref(tools) : json_null()) ||
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_gen)) ||
        json_object_set_new(ctx, "bos_token", json_string(p->bos_token ? p->bos_token : "")) ||
        json_object_set_new(ctx, "eos_token", json_string(p->eos_token ? p->eos_token : "")) ||
        (kwargs && json_object_update(ctx, kwargs))) {
        json_decref(ctx);
        cv_errf(err, errlen, "out of memory (or a BOS/EOS text that is not UTF-8)");
        return NULL;
    }
    return ctx;
}

int cv_render_chat(const cv_template *t, const char *request, size_t len, const cv_render_params *p, char **out,
                   size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    json_error_t je;
    json_t *req = json_loadb(request, len, 0, &je);
    if (!json_is_object(req)) {
        json_decref(req);
        return cv_errf(err, errlen, "the request is not a JSON object%s%s", req ? "" : ": ", req ? "" : je.text);
    }
    cv_jinja_env env = {p->year, p->month, p->day, NULL, p->pool ? &p->pool->b : NULL, p->stop, p->stop_user};
    if (p->year == 0) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        env.year = tm.tm_year + 1900;
        env.month = tm.tm_mon + 1;
        env.day = tm.tm_mday;
    }
    char msg[CV_ERRLEN];
    json_t *ctx = context_of(req, p, err, errlen);
    int rc = ctx ? cv_jinja_render(t->jinja, ctx, &env, out, out_len, msg, sizeof msg) : -1;
    if (ctx && rc != 0)
        cv_errf(err, errlen, "chat template %s", msg);
    json_decref(ctx);
    json_decref(req);
    return rc;
}
