/* oai.c: OpenAI request parsing and response shapes (see oai.h).
 *
 * Design: parsing reads the body with jansson into a tree, checks each
 * known field with one helper per JSON type (absent and null both mean
 * "not given"), then builds the prompt: a completion's string or token
 * list, or the chat messages rendered by cv_serve_render_chat. Everything the
 * request keeps (prompt tokens, stop strings) is copied out of the tree,
 * which is freed before returning. Responses are built as jansson trees
 * and dumped compactly. */
#include "serve/oai.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"
#include "serve/bias.h"
#include "serve/buf.h"
#include "serve/fim.h"
#include "serve/native_tools.h"
#include "serve/render.h"
#include "serve/resp.h"
#include "serve/schema.h"
#include "serve/text.h"
#include "serve/think.h"
#include "serve/tool_grammar.h"

#define INVALID "invalid_request_error"
enum { MAX_STOP = 16, MAX_STOP_LEN = 1024 };

int cv_oai_fail(oai_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* The field that holds a request's prompt. */
static const char *prompt_param(oai_kind k)
{
    return k == OAI_COMPLETIONS ? "prompt" : k == OAI_CHAT ? "messages" : "input";
}

static int bad(oai_error *e, const char *param, const char *fmt, const char *what)
{
    return cv_oai_fail(e, 400, INVALID, NULL, param, fmt, param, what);
}

/* The value of key, or NULL when absent or null. */
static json_t *opt(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int get_number(const json_t *o, const char *key, double lo, double hi, float *out, oai_error *e)
{
    json_t *v = opt(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bad(e, key, "'%s' must be %s", "a number");
    const double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return cv_oai_fail(e, 400, INVALID, NULL, key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = (float)d;
    return 0;
}

static int get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, oai_error *e)
{
    json_t *v = opt(o, key);
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return bad(e, key, "'%s' must be %s", "an integer");
    const long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return cv_oai_fail(e, 400, INVALID, NULL, key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(const json_t *o, const char *key, bool *out, oai_error *e)
{
    json_t *v = opt(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(e, key, "'%s' must be %s", "a boolean");
    *out = json_is_true(v);
    return 0;
}

static int add_stop(oai_request *r, const char *s, size_t n, oai_error *e)
{
    if (n == 0)
        return 0;
    if (r->n_stop == MAX_STOP)
        return cv_oai_fail(e, 400, INVALID, NULL, "stop", "'stop' may hold at most %d strings", MAX_STOP - 2);
    if (n > MAX_STOP_LEN)
        return cv_oai_fail(e, 400, INVALID, NULL, "stop", "a stop string may be at most %d bytes long", MAX_STOP_LEN);
    char *c = cv_malloc(n + 1);
    if (!c)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    memcpy(c, s, n);
    c[n] = 0;
    r->stop[r->n_stop++] = c;
    return 0;
}

static int parse_stop(const json_t *body, oai_request *r, oai_error *e)
{
    json_t *v = opt(body, "stop");
    if (!v)
        return 0;
    if (json_is_string(v))
        return add_stop(r, json_string_value(v), json_string_length(v), e);
    if (!json_is_array(v))
        return bad(e, "stop", "'%s' must be %s", "a string or a list of strings");
    if (json_array_size(v) > MAX_STOP - 2)
        return cv_oai_fail(e, 400, INVALID, NULL, "stop", "'stop' may hold at most %d strings", MAX_STOP - 2);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s))
            return bad(e, "stop", "'%s' must be %s", "a string or a list of strings");
        if (add_stop(r, json_string_value(s), json_string_length(s), e))
            return -1;
    }
    return 0;
}

/* Fields this server cannot honour, refused when given a non-default value. */
static int refuse_unsupported(const json_t *body, oai_kind kind, oai_error *e)
{
    long long n = 1;
    if (kind == OAI_COMPLETIONS && get_int(body, "best_of", 1, 1, &n, e))
        return cv_oai_fail(e, 400, INVALID, NULL, "best_of", "only best_of = 1 is supported");
    json_t *v = opt(body, "tools");
    if (kind == OAI_COMPLETIONS && v && (!json_is_array(v) || json_array_size(v) > 0))
        return cv_oai_fail(e, 400, INVALID, NULL, "tools", "tools are supported on /v1/chat/completions and "
                                                        "/v1/responses only");
    return 0;
}

/* Keeps a grammar for the request; NULL grammar: out of memory. */
static int take_grammar(oai_request *r, char *grammar, const char *param, oai_error *e)
{
    if (!grammar)
        return cv_oai_fail(e, 500, "server_error", NULL, param, "out of memory");
    char why[CV_ERRLEN];
    if (convoy_grammar_check(grammar, strlen(grammar), why, sizeof why)) {
        cv_free(grammar);
        return cv_oai_fail(e, 400, INVALID, NULL, param, "the grammar is refused: %s", why);
    }
    r->grammar = grammar;
    r->params.grammar = grammar;
    r->params.grammar_len = strlen(grammar);
    return 0;
}

/* A JSON schema's grammar. */
static int take_schema(oai_request *r, const json_t *schema, const char *param, oai_error *e)
{
    if (!json_is_object(schema) && !json_is_true(schema))
        return bad(e, param, "'%s' must be %s", "a JSON schema (an object)");
    char why[CV_ERRLEN];
    char *g = cv_schema_grammar(schema, why, sizeof why);
    if (!g)
        return cv_oai_fail(e, 400, INVALID, NULL, param, "the JSON schema is not supported: %s", why);
    return take_grammar(r, g, param, e);
}

/* A format object: {"type": "text"}, {"type": "json_object"} (with an
 * optional "schema", as llama-server takes it) or {"type": "json_schema"}
 * whose "schema" is in its "json_schema" (chat, completions) or in itself
 * (responses: schema_inside). */
static int parse_format_object(oai_request *r, const json_t *f, const char *param, bool schema_inside,
                               oai_error *e)
{
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type)
        return bad(e, param, "'%s' must be %s", "an object with a \"type\"");
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        const json_t *schema = json_object_get(f, "schema");
        return schema ? take_schema(r, schema, param, e) : take_grammar(r, cv_schema_any_object_grammar(), param, e);
    }
    if (!strcmp(type, "json_schema")) {
        const json_t *holder = schema_inside ? f : json_object_get(f, "json_schema");
        const json_t *schema = json_object_get(holder, "schema");
        if (!schema)
            return cv_oai_fail(e, 400, INVALID, NULL, param, "a json_schema format needs its \"schema\"");
        return take_schema(r, schema, param, e);
    }
    return cv_oai_fail(e, 400, INVALID, NULL, param,
                       "the format type '%s' is not one of text, json_object, json_schema", type);
}

/* Constrained output, from at most one of: response_format (chat and
 * completions), text.format (responses), json_schema or grammar
 * (llama-server's own fields). */
static int parse_format(const json_t *body, oai_kind kind, oai_request *r, oai_error *e)
{
    const json_t *rf = opt(body, "response_format"), *tf = opt(opt(body, "text"), "format");
    const json_t *js = opt(body, "json_schema"), *gr = opt(body, "grammar");
    if (kind == OAI_RESPONSES && rf)
        return cv_oai_fail(e, 400, INVALID, NULL, "response_format", "/v1/responses takes text.format instead");
    const int n = (rf != NULL) + (tf != NULL) + (js != NULL) + (gr != NULL);
    if (n > 1)
        return cv_oai_fail(e, 400, INVALID, NULL, gr ? "grammar" : "json_schema",
                        "give one of response_format, text.format, json_schema and grammar");
    if (rf)
        return parse_format_object(r, rf, "response_format", false, e);
    if (tf)
        return parse_format_object(r, tf, "text.format", true, e);
    if (js)
        return take_schema(r, js, "json_schema", e);
    if (gr) {
        if (!json_is_string(gr))
            return bad(e, "grammar", "'%s' must be %s", "a string (GBNF)");
        char *g = cv_malloc(json_string_length(gr) + 1);
        if (g)
            memcpy(g, json_string_value(gr), json_string_length(gr) + 1);
        return take_grammar(r, g, "grammar", e);
    }
    return 0;
}

static int parse_sampling(const json_t *body, uint64_t default_seed, oai_request *r, oai_error *e)
{
    convoy_sampling_params *sp = &r->params.sampler;
    *sp = convoy_sampling_default_params();
    sp->seed = default_seed;
    long long x;
    if (get_number(body, "temperature", 0.0, 2.0, &sp->temp, e) || get_number(body, "top_p", 0.0, 1.0, &sp->top_p, e) ||
        get_number(body, "min_p", 0.0, 1.0, &sp->min_p, e) ||
        get_number(body, "presence_penalty", -2.0, 2.0, &sp->presence_penalty, e) ||
        get_number(body, "frequency_penalty", -2.0, 2.0, &sp->freq_penalty, e) ||
        get_number(body, "repeat_penalty", 0.0, 10.0, &sp->repeat_penalty, e))
        return -1;
    x = sp->top_k;
    if (get_int(body, "top_k", 0, INT32_MAX, &x, e))
        return -1;
    sp->top_k = (int32_t)x;
    x = sp->penalty_last_n;
    if (get_int(body, "repeat_last_n", -1, 1 << 20, &x, e)) /* -1: the whole context, as llama-server's */
        return -1;
    sp->penalty_last_n = (int32_t)x;
    x = 0;
    json_t *seed = opt(body, "seed");
    if (seed) {
        if (get_int(body, "seed", LLONG_MIN, LLONG_MAX, &x, e))
            return -1;
        sp->seed = (uint64_t)x;
    }
    bool cache_prompt = true;
    long long slot = -1;
    if (get_bool(body, "ignore_eos", &r->params.ignore_eos, e) || get_bool(body, "cache_prompt", &cache_prompt, e) ||
        get_int(body, "id_slot", -1, INT32_MAX, &slot, e))
        return -1;
    r->params.cold = !cache_prompt;
    r->params.pin = slot >= 0;
    r->params.slot = (int32_t)slot;
    return 0;
}

static int parse_logit_bias(const oai_server *srv, const json_t *body, oai_request *r, oai_error *e)
{
    const json_t *v = opt(body, "logit_bias");
    char why[CV_ERRLEN];
    if (v && cv_logit_bias_parse(srv->model, v, &r->bias, &r->params.sampler.n_logit_bias, why, sizeof why))
        return cv_oai_fail(e, strcmp(why, "out of memory") ? 400 : 500, INVALID, NULL, "logit_bias", "'logit_bias': %s",
                        why);
    r->params.sampler.logit_bias = r->bias;
    return 0;
}

static int parse_logprobs(const json_t *body, oai_kind kind, oai_request *r, oai_error *e)
{
    long long top = -1;
    if (kind == OAI_RESPONSES) {
        if (opt(body, "top_logprobs"))
            return cv_oai_fail(e, 400, INVALID, NULL, "top_logprobs",
                               "'top_logprobs' is not supported on /v1/responses");
    } else if (kind == OAI_COMPLETIONS) {
        if (get_int(body, "logprobs", 0, CONVOY_MAX_TOP_LOGPROBS, &top, e))
            return -1;
    } else {
        bool on = false;
        if (get_bool(body, "logprobs", &on, e))
            return -1;
        long long k = -1;
        if (get_int(body, "top_logprobs", 0, CONVOY_MAX_TOP_LOGPROBS, &k, e))
            return -1;
        if (k >= 0 && !on)
            return cv_oai_fail(e, 400, INVALID, NULL, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
        top = on ? (k >= 0 ? k : 0) : -1;
    }
    r->params.top_logprobs = (int32_t)top;
    return 0;
}

/* Tokenizes text into r->prompt (at most n_ctx tokens are kept), special
 * tokens parsed outside the plain ranges. */
static int tokenize_prompt(const oai_server *srv, const char *text, size_t len, const convoy_span *plain, int n_plain,
                           oai_request *r, oai_error *e)
{
    r->prompt = cv_malloc(sizeof(int32_t) * (size_t)srv->n_ctx);
    if (!r->prompt)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const int n = convoy_tokenize_spans(srv->model, text, len, true, plain, n_plain, r->prompt, srv->n_ctx);
    if (n == INT_MIN)
        return cv_oai_fail(e, 400, INVALID, NULL, prompt_param(r->kind), "the prompt cannot be tokenized (too long)");
    if (n < 0)
        return cv_oai_fail(e, 400, INVALID, "context_length_exceeded", prompt_param(r->kind),
                           "the prompt has %d tokens, more than the context of %d tokens", -n, srv->n_ctx);
    r->params.n_prompt = n;
    return 0;
}

/* A completion's prompt as the text of a fill-in-the-middle prompt
 * (serve/fim.h) whose suffix is `suffix`. */
static int fim_prompt(const oai_server *srv, const json_t *prompt, const json_t *suffix, oai_request *r,
                      oai_error *e)
{
    if (!json_is_string(prompt) || !json_is_string(suffix))
        return bad(e, "suffix", "'%s' needs %s", "a string prompt and a string suffix");
    r->prompt = cv_malloc(sizeof(int32_t) * (size_t)srv->n_ctx);
    if (!r->prompt)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cv_fim_parts parts = {.prefix = {json_string_value(prompt), json_string_length(prompt)},
                                .suffix = {json_string_value(suffix), json_string_length(suffix)}};
    char why[CV_ERRLEN];
    const int n = cv_fim_prompt(srv->model, &parts, r->prompt, srv->n_ctx - 1, why, sizeof why);
    if (n < 0)
        return cv_oai_fail(e, 400, INVALID, NULL, "suffix", "%s", why);
    r->params.n_prompt = n;
    return 0;
}

/* echo (completions): the prompt's text starts the answer. */
static int parse_echo(const oai_server *srv, const json_t *body, oai_request *r, oai_error *e)
{
    bool echo = false;
    if (r->kind != OAI_COMPLETIONS || !opt(body, "echo"))
        return 0;
    if (get_bool(body, "echo", &echo, e))
        return -1;
    if (!echo)
        return 0;
    if (opt(body, "logprobs"))
        return cv_oai_fail(e, 400, INVALID, NULL, "echo", "'echo' with 'logprobs' (the prompt's own) is not supported");
    const json_t *p = opt(body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    const int rc = json_is_string(p) ? cv_buf_append(&r->echo, json_string_value(p), json_string_length(p))
                                     : cv_text_of(srv->model, r->prompt, r->params.n_prompt, &r->echo);
    return rc ? cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
}

static int parse_prompt(const oai_server *srv, const json_t *body, oai_request *r, oai_error *e)
{
    json_t *p = opt(body, "prompt");
    if (p && opt(body, "suffix"))
        return fim_prompt(srv, p, opt(body, "suffix"), r, e);
    if (!p)
        return cv_oai_fail(e, 400, INVALID, NULL, "prompt", "you must provide a 'prompt'");
    if (json_is_array(p) && json_array_size(p) == 1 && (json_is_string(json_array_get(p, 0)) ||
                                                        json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p))
        return tokenize_prompt(srv, json_string_value(p), json_string_length(p), NULL, 0, r, e);
    if (!json_is_array(p))
        return bad(e, "prompt", "'%s' must be %s", "a string or a list of token ids");
    const size_t n = json_array_size(p);
    if (n > 0 && (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        return cv_oai_fail(e, 400, INVALID, NULL, "prompt", "only one prompt per request is supported");
    if (n >= (size_t)srv->n_ctx)
        return cv_oai_fail(e, 400, INVALID, "context_length_exceeded", "prompt",
                        "the prompt has %zu tokens, more than the context of %d tokens", n, srv->n_ctx);
    r->prompt = cv_malloc(sizeof(int32_t) * (n ? n : 1));
    if (!r->prompt)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    convoy_model_info info;
    convoy_model_get_info(srv->model, &info);
    size_t i;
    json_t *t;
    json_array_foreach(p, i, t)
    {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= info.n_vocab)
            return cv_oai_fail(e, 400, INVALID, NULL, "prompt",
                            "'prompt' item %zu is not a token id (an integer in [0, %d))", i, info.n_vocab);
        r->prompt[i] = (int32_t)json_integer_value(t);
    }
    r->params.n_prompt = (int32_t)n;
    return 0;
}

/* A text part's type: chat's "text", or the Responses API's "input_text"
 * (what users write) and "output_text" (earlier answers). */
static bool text_part(const json_t *type)
{
    const char *t = json_string_value(type);
    return t && (!strcmp(t, "text") || !strcmp(t, "input_text") || !strcmp(t, "output_text"));
}

/* A message's content: a string, a list of text parts (joined by
 * newlines), or null (""); appended to out. Roles are system (also
 * OpenAI's "developer"), user and assistant. */
static int message_content(const json_t *m, const char *param, size_t i, cv_buf *out, oai_error *e)
{
    json_t *c = opt(m, "content");
    if (!c)
        return 0;
    if (json_is_string(c))
        return cv_buf_append(out, json_string_value(c), json_string_length(c));
    if (!json_is_array(c))
        return cv_oai_fail(e, 400, INVALID, NULL, param, "%s[%zu].content must be a string or a list of content parts",
                        param, i);
    size_t k;
    json_t *part;
    json_array_foreach(c, k, part)
    {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!text_part(type) || !json_is_string(text))
            return cv_oai_fail(e, 400, INVALID, NULL, param,
                            "%s[%zu].content[%zu]: only text parts ({\"type\": \"text\", \"text\": ...}) "
                            "are supported", param, i, k);
        if ((k > 0 && cv_buf_puts(out, "\n")) || cv_buf_append(out, json_string_value(text), json_string_length(text)))
            return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* The messages msgs (a non-empty array, given in the request's field
 * param) rendered with the chat template and the request's variables:
 * the prompt and its plain ranges (release with cv_free). */
static int chat_prompt(const oai_server *srv, const json_t *msgs, const char *param, const cv_serve_chat_vars *vars,
                       const cv_serve_render_watch *watch, cv_buf *prompt, convoy_span **spans, int *n_spans,
                       oai_error *e)
{
    const size_t n = json_array_size(msgs);
    cv_serve_chat_msg *cm = cv_calloc(n, sizeof *cm);
    cv_buf *texts = cv_calloc(n, sizeof *texts);
    char err[256];
    int rc = -1;
    if (!cm || !texts) {
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            cv_oai_fail(e, 400, INVALID, NULL, param, "%s[%zu] must be an object with a string 'role'", param, i);
            goto done;
        }
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer"))
            rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool")) {
            cv_oai_fail(e, 400, INVALID, NULL, param, "%s[%zu].role must be system, developer, user, assistant or tool",
                     param, i);
            goto done;
        }
        if (message_content(m, param, i, &texts[i], e))
            goto done;
        cm[i].role = rs;
        cm[i].content = texts[i].p ? texts[i].p : "";
        cm[i].json = m;
    }
    if (cv_serve_render_chat(srv->chat, cm, (int)n, vars, watch, prompt, spans, n_spans, err, sizeof err)) {
        cv_oai_fail(e, 400, INVALID, NULL, param, "%s", err);
        goto done;
    }
    rc = 0;
done:
    for (size_t i = 0; texts && i < n; i++)
        cv_buf_free(&texts[i]);
    cv_free(texts);
    cv_free(cm);
    return rc;
}

/* The messages rendered, tokenized, and the template's stop strings. */
static int render_messages(const oai_server *srv, const json_t *msgs, const char *param, const cv_serve_chat_vars *vars,
                           oai_request *r, oai_error *e)
{
    cv_buf prompt = {0};
    convoy_span *spans = NULL;
    int n_spans = 0;
    int rc = chat_prompt(srv, msgs, param, vars, r->watch, &prompt, &spans, &n_spans, e);
    if (rc == 0)
        rc = tokenize_prompt(srv, prompt.p, prompt.n, spans, n_spans, r, e);
    r->think_open = rc == 0 && cv_think_opens(prompt.p, prompt.n);
    for (const char *const *s = cv_serve_chat_stop_strings(srv->chat); rc == 0 && *s; s++)
        rc = add_stop(r, *s, strlen(*s), e);
    cv_free(spans);
    cv_buf_free(&prompt);
    return rc;
}

/* tools and tool_choice: vars->tools gets the tools the template sees
 * (NULL for none or tool_choice "none"), *format how to read calls back
 * (the Jinja template's, or a built-in family's: serve/native_tools.h),
 * *choice what tool_choice asks; add_generation_prompt and
 * chat_template_kwargs as given. */
static int parse_chat_vars(const oai_server *srv, const json_t *body, cv_serve_chat_vars *vars, cv_tool_format *format,
                           cv_tool_choice *choice, oai_error *e)
{
    const json_t *t = opt(body, "tools");
    *vars = (cv_serve_chat_vars){.add_generation_prompt = opt(body, "add_generation_prompt"),
                           .kwargs = opt(body, "chat_template_kwargs")};
    *format = CV_TOOLS_NONE;
    if (vars->kwargs && !json_is_object(vars->kwargs))
        return bad(e, "chat_template_kwargs", "'%s' must be %s", "an object");
    if (t && !json_is_array(t))
        return bad(e, "tools", "'%s' must be %s", "a list of tools");
    char why[CV_ERRLEN];
    if (cv_tool_choice_read(t, opt(body, "tool_choice"), choice, why, sizeof why))
        return cv_oai_fail(e, 400, INVALID, NULL, strncmp(why, "tools", 5) ? "tool_choice" : "tools", "%s", why);
    const bool forced = choice->mode == CV_TOOL_REQUIRED || choice->mode == CV_TOOL_NAMED;
    if (forced && json_array_size(t) == 0)
        return cv_oai_fail(e, 400, INVALID, NULL, "tool_choice", "a forced tool_choice needs 'tools'");
    if (!t || json_array_size(t) == 0 || choice->mode == CV_TOOL_NONE)
        return 0;
    *format = srv->chat->jinja ? srv->chat->tools : cv_native_tool_format(srv->chat->kind);
    if (!srv->chat->jinja && *format == CV_TOOLS_NONE)
        return cv_oai_fail(e, 400, INVALID, NULL, "tools", "the built-in chat template %s has no tool format",
                        srv->chat->name);
    vars->tools = t;
    return 0;
}

/* A forced call (tool_choice "required" or a function) held to a grammar
 * in the format the template teaches; parallel_tool_calls false: one. */
static int force_call(const json_t *body, const cv_serve_chat_vars *vars, const cv_tool_choice *choice, oai_request *r,
                      oai_error *e)
{
    if (choice->mode != CV_TOOL_REQUIRED && choice->mode != CV_TOOL_NAMED)
        return 0;
    if (r->grammar)
        return cv_oai_fail(e, 400, INVALID, NULL, "tool_choice",
                        "a forced tool call (tool_choice) cannot be combined with response_format, json_schema or "
                        "grammar");
    bool parallel = true;
    if (get_bool(body, "parallel_tool_calls", &parallel, e))
        return -1;
    char why[CV_ERRLEN];
    char *g = cv_tool_grammar(r->tools, vars->tools, choice->name, parallel, why, sizeof why);
    if (!g)
        return cv_oai_fail(e, 400, INVALID, NULL, "tool_choice", "%s", why);
    return take_grammar(r, g, "tool_choice", e);
}

/* A chat body's messages, checked (param: the field they came in). */
static const json_t *chat_messages(const json_t *body, const char *param, oai_error *e)
{
    const json_t *msgs = opt(body, "messages");
    if (!msgs)
        cv_oai_fail(e, 400, INVALID, NULL, param, "you must provide '%s'", param);
    else if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        bad(e, param, "'%s' must be %s", "a non-empty list of messages");
    else
        return msgs;
    return NULL;
}

/* reasoning_format, llama-server's: "none" keeps <think> blocks in the
 * content; "deepseek" (and llama-server's "auto" and "deepseek-legacy")
 * splits them off; absent: the server's --reasoning-format. */
static int parse_reasoning_format(const oai_server *srv, const json_t *body, oai_request *r, oai_error *e)
{
    const json_t *f = opt(body, "reasoning_format");
    const char *v = json_string_value(f);
    r->split_reasoning = srv->split_reasoning;
    if (!f)
        return 0;
    if (!v || (strcmp(v, "none") && strcmp(v, "deepseek") && strcmp(v, "auto") && strcmp(v, "deepseek-legacy")))
        return bad(e, "reasoning_format", "'%s' must be %s", "\"none\", \"deepseek\" or \"auto\"");
    r->split_reasoning = strcmp(v, "none") != 0;
    return 0;
}

/* A chat-shaped body (its field `param` holds the messages): tools,
 * a forced call, reasoning_format, then the messages rendered. */
static int parse_chat(const oai_server *srv, const json_t *body, const char *param, oai_request *r, oai_error *e)
{
    const json_t *msgs = chat_messages(body, param, e);
    cv_serve_chat_vars vars;
    cv_tool_choice choice;
    if (!msgs || parse_chat_vars(srv, body, &vars, &r->tools, &choice, e) || force_call(body, &vars, &choice, r, e) ||
        parse_reasoning_format(srv, body, r, e))
        return -1;
    return render_messages(srv, msgs, param, &vars, r, e);
}

/* The Responses API's request as a chat (resp.h), parsed as one. */
static int parse_input(const oai_server *srv, const json_t *body, oai_request *r, oai_error *e)
{
    json_t *chat = cv_resp_chat_body(body, e);
    const int rc = chat ? parse_chat(srv, chat, "input", r, e) : -1;
    json_decref(chat);
    return rc;
}

static int parse_max_tokens(const oai_server *srv, const json_t *body, oai_request *r, oai_error *e)
{
    const int32_t room = srv->n_ctx - r->params.n_prompt;
    const char *key = r->kind == OAI_RESPONSES                               ? "max_output_tokens"
                      : r->kind == OAI_CHAT && opt(body, "max_completion_tokens") ? "max_completion_tokens"
                                                                                  : "max_tokens";
    long long m = -1;
    if (get_int(body, key, LLONG_MIN, LLONG_MAX, &m, e))
        return -1;
    if (m == -1 && !opt(body, key)) {
        r->params.max_tokens = r->kind == OAI_COMPLETIONS && room > 16 ? 16 : room;
        return 0;
    }
    if (m < 1)
        return cv_oai_fail(e, 400, INVALID, NULL, key, "'%s' must be at least 1, got %lld", key, m);
    if (m > room)
        return cv_oai_fail(e, 400, INVALID, NULL, key,
                        "'%s' is %lld, but the prompt's %d tokens leave room for only %d in the context of %d "
                        "tokens", key, m, r->params.n_prompt, room, srv->n_ctx);
    r->params.max_tokens = (int32_t)m;
    return 0;
}

int cv_oai_check_model(const oai_server *srv, const json_t *root, oai_error *e)
{
    json_t *model = opt(root, "model");
    if (model && !json_is_string(model))
        return bad(e, "model", "'%s' must be %s", "a string");
    if (!srv->strict_model)
        return 0;
    if (!model)
        return cv_oai_fail(e, 400, INVALID, NULL, "model", "you must provide a 'model' parameter");
    if (strcmp(json_string_value(model), srv->model_id))
        return cv_oai_fail(e, 404, INVALID, "model_not_found", "model",
                        "the model '%.200s' does not exist: this server serves '%.200s'", json_string_value(model),
                        srv->model_id);
    return 0;
}

json_t *cv_oai_load_object(const char *body, size_t len, oai_error *e)
{
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root)
        cv_oai_fail(e, 400, INVALID, NULL, NULL, "the request body is not valid JSON: %s (line %d, column %d)",
                 jerr.text, jerr.line, jerr.column);
    else if (!json_is_object(root))
        cv_oai_fail(e, 400, INVALID, NULL, NULL, "the request body must be a JSON object");
    else
        return root;
    json_decref(root);
    return NULL;
}

int cv_oai_parse_request(const oai_server *srv, oai_kind kind, const char *body, size_t len, uint64_t default_seed,
                      const cv_serve_render_watch *watch, oai_request *out, oai_error *e)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->watch = watch;
    json_t *root = cv_oai_load_object(body, len, e);
    if (!root)
        return -1;
    int rc = -1;
    out->stop = cv_calloc(MAX_STOP, sizeof *out->stop);
    if (!out->stop) {
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    if (cv_oai_check_model(srv, root, e))
        goto done;
    json_t *so = opt(root, "stream_options");
    long long n_choices = 1;
    if (get_int(root, "n", 1, kind == OAI_RESPONSES ? 1 : OAI_MAX_CHOICES, &n_choices, e))
        goto done;
    out->n_choices = (int)n_choices;
    if (refuse_unsupported(root, kind, e) || get_bool(root, "stream", &out->stream, e) ||
        parse_sampling(root, default_seed, out, e) || parse_logit_bias(srv, root, out, e) ||
        parse_logprobs(root, kind, out, e) ||
        parse_stop(root, out, e) || parse_format(root, kind, out, e))
        goto done;
    if (so) {
        if (!out->stream) {
            cv_oai_fail(e, 400, INVALID, NULL, "stream_options", "'stream_options' is only allowed with stream: true");
            goto done;
        }
        if (!json_is_object(so)) {
            bad(e, "stream_options", "'%s' must be %s", "an object");
            goto done;
        }
        if (get_bool(so, "include_usage", &out->include_usage, e))
            goto done;
    }
    if (kind == OAI_COMPLETIONS ? parse_prompt(srv, root, out, e)
        : kind == OAI_CHAT      ? parse_chat(srv, root, "messages", out, e)
                                : parse_input(srv, root, out, e))
        goto done;
    if (parse_echo(srv, root, out, e))
        goto done;
    if (out->params.n_prompt == 0) {
        cv_oai_fail(e, 400, INVALID, NULL, prompt_param(kind), "the prompt is empty (and the model adds no BOS token)");
        goto done;
    }
    if (out->params.n_prompt >= srv->n_ctx) {
        cv_oai_fail(e, 400, INVALID, "context_length_exceeded", prompt_param(kind),
                    "the prompt has %d tokens; the context holds %d, so no token is left to generate",
                    out->params.n_prompt, srv->n_ctx);
        goto done;
    }
    if (parse_max_tokens(srv, root, out, e))
        goto done;
    out->params.prompt = out->prompt;
    rc = 0;
done:
    json_decref(root);
    if (rc)
        cv_oai_request_free(out);
    return rc;
}

char *cv_oai_apply_template_json(const oai_server *srv, const char *body, size_t len, oai_error *e)
{
    json_t *root = cv_oai_load_object(body, len, e), *answer = NULL;
    const json_t *msgs = root ? chat_messages(root, "messages", e) : NULL;
    cv_serve_chat_vars vars;
    cv_tool_format format;
    cv_tool_choice choice;
    cv_buf prompt = {0};
    convoy_span *spans = NULL;
    int n_spans = 0;
    if (msgs && parse_chat_vars(srv, root, &vars, &format, &choice, e) == 0 &&
        chat_prompt(srv, msgs, "messages", &vars, NULL, &prompt, &spans, &n_spans, e) == 0 &&
        !(answer = json_pack("{s:s%}", "prompt", prompt.p ? prompt.p : "", prompt.n)))
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    cv_free(spans);
    cv_buf_free(&prompt);
    json_decref(root);
    return answer ? cv_oai_json_text(answer) : NULL;
}

void cv_oai_request_free(oai_request *r)
{
    for (int i = 0; i < r->n_stop; i++)
        cv_free(r->stop[i]);
    cv_free(r->stop);
    cv_free(r->prompt);
    cv_free(r->grammar);
    cv_free(r->bias);
    cv_buf_free(&r->echo);
    memset(r, 0, sizeof *r);
}

char *cv_oai_json_text(json_t *j)
{
    if (!j)
        return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static json_t *str_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }

char *cv_oai_error_json(const oai_error *e)
{
    return cv_oai_json_text(json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type", e->type, "param",
                          str_or_null(e->param), "code", str_or_null(e->code)));
}

/* A JSON number for a log-probability (JSON has no infinities). */
static json_t *lp_real(float x) { return json_real(isfinite(x) ? (double)x : -9999.0); }

/* The piece of a token as a valid UTF-8 string (bytes of an incomplete or
 * invalid character become U+FFFD) and as its raw bytes. */
static void token_strings(const convoy_model *m, int32_t id, cv_buf *text, char *raw, int *n_raw, int cap)
{
    int n = convoy_token_piece(m, id, raw, cap);
    *n_raw = n < 0 ? 0 : n;
    text->n = 0;
    cv_buf_append(text, "", 0);
    for (int i = 0; i < *n_raw;) {
        const size_t len = cv_utf8_len(raw + i, (size_t)(*n_raw - i));
        if (len) {
            cv_buf_append(text, raw + i, len);
            i += (int)len;
        } else {
            cv_buf_puts(text, "\xEF\xBF\xBD");
            i++;
        }
    }
}

static json_t *bytes_array(const char *raw, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)raw[i]));
    return a;
}

json_t *cv_oai_logprobs(const convoy_model *m, oai_kind kind, const cv_request *r, int32_t first, int32_t n,
                     int32_t top, size_t text_offset)
{
    char raw[256];
    int n_raw;
    cv_buf text = {0};
    json_t *res = NULL;
    if (kind == OAI_COMPLETIONS) {
        json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
        for (int32_t i = first; i < first + n; i++) {
            const convoy_logprob *lp = cv_request_logprobs(r, i);
            token_strings(m, lp[0].id, &text, raw, &n_raw, sizeof raw);
            json_array_append_new(tokens, json_string(text.p));
            json_array_append_new(lps, lp_real(lp[0].logprob));
            json_array_append_new(offs, json_integer((json_int_t)text_offset));
            text_offset += (size_t)n_raw;
            json_t *alt = json_object();
            for (int32_t k = 1; k <= top; k++) {
                token_strings(m, lp[k].id, &text, raw, &n_raw, sizeof raw);
                json_object_set_new(alt, text.p, lp_real(lp[k].logprob));
            }
            json_array_append_new(tops, alt);
        }
        res = json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                        "text_offset", offs);
    } else {
        json_t *content = json_array();
        for (int32_t i = first; i < first + n; i++) {
            const convoy_logprob *lp = cv_request_logprobs(r, i);
            json_t *alts = json_array();
            for (int32_t k = 1; k <= top; k++) {
                token_strings(m, lp[k].id, &text, raw, &n_raw, sizeof raw);
                json_array_append_new(alts, json_pack("{s:s,s:o,s:o}", "token", text.p, "logprob",
                                                      lp_real(lp[k].logprob), "bytes", bytes_array(raw, n_raw)));
            }
            token_strings(m, lp[0].id, &text, raw, &n_raw, sizeof raw);
            json_array_append_new(content, json_pack("{s:s,s:o,s:o,s:o}", "token", text.p, "logprob",
                                                     lp_real(lp[0].logprob), "bytes", bytes_array(raw, n_raw),
                                                     "top_logprobs", alts));
        }
        res = json_pack("{s:o,s:n}", "content", content, "refusal");
    }
    cv_buf_free(&text);
    return res;
}

static json_t *usage_json(const oai_usage *u)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", u->cached_tokens);
}

/* OpenAI's tool_calls array: [{id, type "function", function {name, arguments}}]. */
static json_t *tool_calls_json(const cv_tool_calls *calls)
{
    json_t *a = json_array();
    for (int i = 0; i < calls->n; i++)
        json_array_append_new(a, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", calls->calls[i].id, "type", "function",
                                           "function", "name", calls->calls[i].name, "arguments",
                                           calls->calls[i].arguments));
    return a;
}

/* A chat answer's message: the text, or with tool calls their content (null
 * when empty) and the calls; and the reasoning kept apart. */
static json_t *chat_message(const oai_answer *a)
{
    json_t *m;
    if (!a->calls || a->calls->n == 0) {
        m = json_pack("{s:s,s:s%,s:n}", "role", "assistant", "content", a->text, a->text_len, "refusal");
    } else {
        json_t *content = a->calls->content.n ? json_stringn(a->calls->content.p, a->calls->content.n) : json_null();
        m = json_pack("{s:s,s:o,s:n,s:o}", "role", "assistant", "content", content, "refusal", "tool_calls",
                      tool_calls_json(a->calls));
    }
    if (m && a->reasoning)
        json_object_set_new(m, "reasoning_content", json_stringn(a->reasoning, a->reasoning_len));
    return m;
}

static json_t *choice_json(oai_kind kind, const oai_answer *a, int index)
{
    json_t *logprobs = a->logprobs ? a->logprobs : json_null();
    if (kind == OAI_COMPLETIONS)
        return json_pack("{s:s%,s:i,s:o,s:s}", "text", a->text, a->text_len, "index", index, "logprobs", logprobs,
                         "finish_reason", a->finish);
    const char *finish = a->calls && a->calls->n ? "tool_calls" : a->finish;
    return json_pack("{s:i,s:o,s:o,s:s}", "index", index, "message", chat_message(a), "logprobs", logprobs,
                     "finish_reason", finish);
}

char *cv_oai_choices_json(const oai_server *srv, oai_kind kind, const char *id, long long created, const oai_answer *a,
                       int n, const oai_usage *usage)
{
    json_t *choices = json_array();
    for (int i = 0; i < n && choices; i++)
        if (json_array_append_new(choices, choice_json(kind, &a[i], i))) { /* invalid UTF-8: no body */
            json_decref(choices);
            choices = NULL;
        }
    return cv_oai_json_text(json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", id, "object",
                                   kind == OAI_COMPLETIONS ? "text_completion" : "chat.completion", "created",
                                   (json_int_t)created, "model", srv->model_id, "choices", choices, "usage",
                                   usage_json(usage)));
}

char *cv_oai_response_json(const oai_server *srv, oai_kind kind, const char *id, long long created, const oai_answer *a)
{
    return cv_oai_choices_json(srv, kind, id, created, a, 1, a->usage);
}

/* A chat chunk's delta: a tool call's opening or arguments, the end (empty),
 * or text (with the role in the first). */
static json_t *chat_delta(const oai_chunk *c)
{
    if (c->call && c->call_args)
        return json_pack("{s:[{s:i,s:{s:s}}]}", "tool_calls", "index", c->call_index, "function", "arguments",
                         c->call->arguments);
    if (c->call)
        return json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index", c->call_index, "id", c->call->id,
                         "type", "function", "function", "name", c->call->name, "arguments", "");
    if (c->finish && c->text_len == 0 && !c->first)
        return json_object();
    const char *key = c->reasoning ? "reasoning_content" : "content";
    const char *text = c->reasoning ? c->reasoning : c->text;
    const size_t len = c->reasoning ? c->reasoning_len : c->text_len;
    return c->first ? json_pack("{s:s,s:s%}", "role", "assistant", key, text, len) : json_pack("{s:s%}", key, text, len);
}

char *cv_oai_chunk_json(const oai_server *srv, oai_kind kind, const char *id, long long created, const oai_chunk *c)
{
    json_t *choices = json_array();
    json_t *logprobs = c->logprobs ? c->logprobs : json_null();
    if (c->usage_only) {
        json_decref(logprobs);
    } else if (kind == OAI_COMPLETIONS) {
        json_array_append_new(choices, json_pack("{s:s%,s:i,s:o,s:o}", "text", c->text, c->text_len, "index",
                                                 c->index, "logprobs", logprobs, "finish_reason",
                                                 str_or_null(c->finish)));
    } else {
        json_array_append_new(choices, json_pack("{s:i,s:o,s:o,s:o}", "index", c->index, "delta", chat_delta(c),
                                                 "logprobs", logprobs, "finish_reason", str_or_null(c->finish)));
    }
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", id, "object",
                          kind == OAI_COMPLETIONS ? "text_completion" : "chat.completion.chunk", "created",
                          (json_int_t)created, "model", srv->model_id, "choices", choices);
    if (j && (c->usage || c->include_usage))
        json_object_set_new(j, "usage", c->usage ? usage_json(c->usage) : json_null());
    return cv_oai_json_text(j);
}

static json_t *model_object(const oai_server *srv, long long created)
{
    convoy_model_info info;
    convoy_model_get_info(srv->model, &info);
    return json_pack("{s:s,s:s,s:I,s:s,s:{s:s,s:i,s:i,s:i}}", "id", srv->model_id, "object", "model", "created",
                     (json_int_t)created, "owned_by", "convoy", "meta", "arch", info.arch, "n_ctx", srv->n_ctx,
                     "n_vocab", info.n_vocab, "n_layer", info.n_layer);
}

char *cv_oai_models_json(const oai_server *srv, long long created)
{
    return cv_oai_json_text(json_pack("{s:s,s:[o]}", "object", "list", "data", model_object(srv, created)));
}

char *cv_oai_model_json(const oai_server *srv, long long created)
{
    return cv_oai_json_text(model_object(srv, created));
}

char *cv_oai_health_json(const char *error)
{
    return cv_oai_json_text(error ? json_pack("{s:s,s:{s:i,s:s,s:s}}", "status", "unavailable", "error", "code", 503,
                                           "message", error, "type", "unavailable_error")
                               : json_pack("{s:s}", "status", "ok"));
}
