/* render.c: chat templates for the server (see render.h), over the native
 * renderers of chat/chat.h and the Jinja templates of chat/template.h. What
 * needs the model is here: the template chosen from it, the prompt's plain
 * ranges (chat/plain_ranges.h) turned into the engine's spans, contents and
 * a template's control tokens checked against its vocabulary. */
#include "serve/render.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "chat/plain_ranges.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/fmap.h"
#include "serve/log.h"
#include "serve/native_tools.h"

/* Parses the Jinja template text into c; its name as given. */
static int use_jinja(cv_serve_chat *c, const char *text, size_t len, const char *name, char *err, size_t errlen)
{
    if (!(c->jinja = cv_template_parse(text, len, err, errlen)))
        return -1;
    if (!(c->source = cv_malloc(len + 1))) {
        cv_template_free(c->jinja);
        c->jinja = NULL;
        return cv_errf(err, errlen, "out of memory");
    }
    memcpy(c->source, text, len);
    c->source[len] = 0;
    c->tools = cv_tools_detect(text);
    snprintf(c->name, sizeof c->name, "%s", name);
    return 0;
}

static int use_file(cv_serve_chat *c, const char *path, char *err, size_t errlen)
{
    struct stat st;
    char why[CV_ERRLEN];
    const int fd = cv_open_regular(path, &st, why, sizeof why);
    if (fd < 0 && errno == ENOENT)
        return cv_errf(err, errlen, "unknown chat template '%s' (neither a file nor one of: %s)", path,
                       cv_chat_kind_names());
    if (fd < 0)
        return cv_errf(err, errlen, "the chat template %s", why);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return cv_errf(err, errlen, "cannot read the chat template %s", path);
    }
    cv_buf text = {0};
    char chunk[4096];
    size_t got;
    int rc = 0;
    while (rc == 0 && (got = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = cv_buf_append(&text, chunk, got);
    if (rc || ferror(f))
        rc = cv_errf(err, errlen, "cannot read the chat template %s", path);
    fclose(f);
    char msg[CV_ERRLEN];
    if (rc == 0 && use_jinja(c, text.p ? text.p : "", text.n, path, msg, sizeof msg))
        rc = cv_errf(err, errlen, "%s: %s", path, msg);
    cv_buf_free(&text);
    return rc;
}

static void use_native(cv_serve_chat *c, cv_chat_kind kind)
{
    c->kind = kind;
    snprintf(c->name, sizeof c->name, "%s (built in)", cv_chat_kind_name(kind));
}

int cv_serve_chat_setup(const convoy_model *m, const char *override_name, cv_serve_chat *out, char *err, size_t errlen)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    const char *bos = convoy_token_text(m, info.bos), *eos = convoy_token_text(m, info.eos);
    *out = (cv_serve_chat){.model = m, .bos = bos ? bos : "", .eos = eos ? eos : ""};
    if (override_name) {
        const int k = cv_chat_kind_from_name(override_name);
        if (k < 0)
            return use_file(out, override_name, err, errlen);
        use_native(out, (cv_chat_kind)k);
        return 0;
    }
    const char *tmpl = convoy_model_chat_template(m);
    if (!tmpl) {
        use_native(out, (cv_chat_kind)cv_chat_kind_from_name("chatml"));
        return 0;
    }
    char why[CV_ERRLEN], why_native[CV_ERRLEN];
    if (use_jinja(out, tmpl, strlen(tmpl), "the model's own (Jinja)", why, sizeof why) == 0)
        return 0;
    cv_chat_kind kind;
    if (cv_chat_detect(tmpl, &kind, why_native, sizeof why_native))
        return cv_errf(err, errlen, "the model's %s; and natively: %s", why, why_native);
    cv_log(CV_LOG_WARN, "the model's %s; rendering it as the built-in %s instead", why, cv_chat_kind_name(kind));
    use_native(out, kind);
    return 0;
}

void cv_serve_chat_free(cv_serve_chat *c)
{
    cv_template_free(c->jinja);
    c->jinja = NULL;
    cv_free(c->source);
    c->source = NULL;
}

const char *cv_serve_chat_name(const cv_serve_chat *c) { return c->name; }

/* The messages (and the request's variables) as a chat request body,
 * contents replaced by markers when marked. */
static char *request_of(const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars, bool marked)
{
    json_t *arr = json_array(), *req = json_pack("{s:o}", "messages", arr);
    char mark[CV_PLAIN_MARK_MAX];
    if (req && vars->tools)
        json_object_set(req, "tools", (json_t *)vars->tools);
    if (req && vars->add_generation_prompt)
        json_object_set(req, "add_generation_prompt", (json_t *)vars->add_generation_prompt);
    if (req && vars->kwargs)
        json_object_set(req, "chat_template_kwargs", (json_t *)vars->kwargs);
    for (int i = 0; req && i < n; i++) {
        cv_plain_mark(mark, sizeof mark, i);
        json_t *m = msgs[i].json ? json_copy((json_t *)msgs[i].json) : json_object();
        json_object_set_new(m, "role", json_string(msgs[i].role));
        json_object_set_new(m, "content", json_string(marked ? mark : msgs[i].content));
        json_array_append_new(arr, m);
    }
    char *body = req && json_array_size(arr) == (size_t)n ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return body;
}

static int render_jinja(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars,
                        const cv_serve_render_watch *watch, bool marked, cv_buf *out, char *err, size_t errlen)
{
    char *body = request_of(msgs, n, vars, marked), *text = NULL;
    if (!body)
        return cv_errf(err, errlen, "out of memory (or a message that is not UTF-8)");
    const cv_render_params p = {.bos_token = c->bos, .eos_token = c->eos, .pool = c->pool,
                                    .stop = watch ? watch->gone : NULL, .stop_user = watch ? watch->user : NULL};
    size_t len;
    int rc = cv_render_chat(c->jinja, body, strlen(body), &p, &text, &len, err, errlen);
    if (rc == 0 && cv_buf_append(out, text, len))
        rc = cv_errf(err, errlen, "out of memory rendering the chat");
    cv_free(text);
    free(body);
    return rc;
}

/* The conversation as a family's plain messages into *cm (release with
 * cv_free): contents or their markers; with tools, tool calls or tool
 * results, rewritten by serve/native_tools.h into tc. */
static int native_msgs(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars,
                       bool marked, char (*marks)[CV_PLAIN_MARK_MAX], cv_chat_msg **cm, int *n_cm, cv_native_chat *tc,
                       char *err, size_t errlen)
{
    cv_native_msg *nm = cv_calloc((size_t)(n > 0 ? n : 1), sizeof *nm);
    *cm = cv_calloc((size_t)(n > 0 ? n : 1), sizeof **cm);
    *n_cm = n;
    int rc = nm && *cm ? 0 : cv_errf(err, errlen, "out of memory rendering the chat");
    for (int i = 0; i < n && rc == 0; i++) {
        cv_plain_mark(marks[i], sizeof marks[i], i);
        nm[i] = (cv_native_msg){msgs[i].role, marked ? marks[i] : msgs[i].content, !msgs[i].content[0], msgs[i].json};
    }
    if (rc == 0 && cv_native_tool_format(c->kind) != CV_TOOLS_NONE && cv_native_tools_needed(nm, n, vars->tools)) {
        rc = cv_native_tool_msgs(c->kind, nm, n, vars->tools, tc, err, errlen);
        if (rc == 0) {
            cv_free(*cm);
            *cm = tc->msgs;
            *n_cm = tc->n;
        }
        cv_free(nm);
        return rc;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        const int role = cv_chat_role_from_name(msgs[i].role);
        if (role < 0)
            rc = cv_errf(err, errlen, "messages[%d]: role '%s' is not supported", i, msgs[i].role);
        (*cm)[i] = (cv_chat_msg){.role = (cv_chat_role)role, .content = nm[i].content};
    }
    cv_free(nm);
    return rc;
}

/* A built-in family's render: add_generation_prompt false leaves the
 * assistant's turn unopened; Qwen3 reads enable_thinking false. */
static int render_native(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars,
                         bool marked, cv_buf *out, char *err, size_t errlen)
{
    const bool gen = !json_is_false(vars->add_generation_prompt);
    char(*marks)[CV_PLAIN_MARK_MAX] = cv_calloc((size_t)(n > 0 ? n : 1), sizeof *marks);
    cv_chat_msg *cm = NULL;
    cv_native_chat tc = {0};
    int n_cm = 0;
    int rc = marks ? native_msgs(c, msgs, n, vars, marked, marks, &cm, &n_cm, &tc, err, errlen)
                   : cv_errf(err, errlen, "out of memory rendering the chat");
    const cv_chat_opts opts = {.disable_thinking = json_is_false(json_object_get(vars->kwargs, "enable_thinking")),
                               .tools = tc.tools.n ? tc.tools.p : NULL};
    size_t len = 0;
    if (rc == 0)
        rc = cv_chat_render(c->kind, cm, n_cm, gen, c->bos, c->eos, &opts, NULL, 0, &len, err, errlen);
    if (rc == 0 && cv_buf_reserve(out, len + 1))
        rc = cv_errf(err, errlen, "out of memory rendering the chat");
    if (rc == 0)
        rc = cv_chat_render(c->kind, cm, n_cm, gen, c->bos, c->eos, &opts, out->p + out->n, len + 1, &len, err,
                            errlen);
    if (rc == 0)
        out->n += len;
    if (cm != tc.msgs)
        cv_free(cm);
    cv_native_chat_free(&tc);
    cv_free(marks);
    return rc;
}

static int render_with(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars,
                       const cv_serve_render_watch *watch, bool marked, cv_buf *out, char *err, size_t errlen)
{
    static const cv_serve_chat_vars none = {0};
    vars = vars ? vars : &none;
    return c->jinja ? render_jinja(c, msgs, n, vars, watch, marked, out, err, errlen)
                    : render_native(c, msgs, n, vars, marked, out, err, errlen);
}

/* The plain ranges of the prompt (out's bytes from at), found from its
 * marked rendering, as the engine's spans of out. Returns 1 with the spans,
 * 0 with none when the template changed the contents, -1 when out of
 * memory. */
static int find_spans(const cv_buf *out, size_t at, const cv_buf *marked, const cv_serve_chat_msg *msgs, int n,
                      convoy_span **spans, int *n_spans)
{
    const char **contents = cv_malloc(sizeof *contents * (size_t)(n > 0 ? n : 1));
    if (!contents)
        return -1;
    for (int i = 0; i < n; i++)
        contents[i] = msgs[i].content;
    cv_plain_range *ranges;
    int n_ranges;
    int rc = cv_plain_ranges_find(out->p ? out->p + at : "", out->n - at, marked->p ? marked->p : "", marked->n,
                                  contents, n, &ranges, &n_ranges);
    cv_free(contents);
    if (rc == 1 && n_ranges > 0 && !(*spans = cv_malloc(sizeof **spans * (size_t)n_ranges)))
        rc = -1;
    for (int i = 0; rc == 1 && i < n_ranges; i++)
        (*spans)[i] = (convoy_span){at + ranges[i].off, ranges[i].len};
    if (rc == 1)
        *n_spans = n_ranges;
    cv_free(ranges);
    return rc;
}

/* Without spans: refuses a content that holds special token text. */
static int check_contents(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        const size_t len = strlen(msgs[i].content);
        int32_t *ids = cv_malloc(sizeof(int32_t) * 2 * (len + 1));
        if (!ids)
            return cv_errf(err, errlen, "out of memory rendering the chat");
        const int a = convoy_tokenize(c->model, msgs[i].content, len, false, true, ids, (int32_t)(len + 1));
        const int b = convoy_tokenize(c->model, msgs[i].content, len, false, false, ids + len + 1, (int32_t)(len + 1));
        const bool same = a == b && a >= 0 && memcmp(ids, ids + len + 1, sizeof(int32_t) * (size_t)a) == 0;
        cv_free(ids);
        if (!same)
            return cv_errf(err, errlen, "messages[%d].content holds a control token's text, which this chat template "
                                        "does not keep apart from its own", i);
    }
    return 0;
}

int cv_serve_render_chat(const cv_serve_chat *c, const cv_serve_chat_msg *msgs, int n, const cv_serve_chat_vars *vars,
                   const cv_serve_render_watch *watch, cv_buf *out, convoy_span **spans, int *n_spans, char *err,
                   size_t errlen)
{
    *spans = NULL;
    *n_spans = 0;
    cv_buf marked = {0};
    const size_t at = out->n;
    int rc = render_with(c, msgs, n, vars, watch, false, out, err, errlen);
    if (rc == 0)
        rc = render_with(c, msgs, n, vars, watch, true, &marked, err, errlen);
    const int found = rc == 0 ? find_spans(out, at, &marked, msgs, n, spans, n_spans) : 1;
    if (found < 0)
        rc = cv_errf(err, errlen, "out of memory rendering the chat");
    if (found == 0) /* the template changed the contents: no spans, and a check instead */
        rc = check_contents(c, msgs, n, err, errlen);
    cv_buf_free(&marked);
    return rc;
}

/* The end of a control token's text that starts at p ("<|x|>", "<｜x｜>",
 * "[INST]", "<start_of_turn>"), or NULL when none starts there. */
static const char *control_end(const char *p)
{
    static const struct {
        const char *open, *close;
    } shapes[] = {{"<|", "|>"}, {"<\xef\xbd\x9c", "\xef\xbd\x9c>"}, {"[", "]"}, {"<", ">"}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const size_t no = strlen(shapes[s].open);
        if (strncmp(p, shapes[s].open, no))
            continue;
        const char *close = strstr(p + no, shapes[s].close);
        const size_t inner = close ? (size_t)(close - p - no) : 0;
        if (!close || inner < 2 || inner > 40)
            continue;
        bool word = true, upper = true, underscore = false; /* "[INST]" and "<end_of_turn>", not "[1]" or "<b>" */
        for (const char *q = p + no; q < close; q++) {
            word &= *q == '_' || *q == '/' || *q == '-' || (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
                    (*q >= '0' && *q <= '9') || (unsigned char)*q >= 0x80;
            upper &= *q == '_' || *q == '/' || (*q >= 'A' && *q <= 'Z');
            underscore |= *q == '_';
        }
        if (word && (s < 2 || (s == 2 && upper) || (s == 3 && underscore)))
            return close + strlen(shapes[s].close);
    }
    return NULL;
}

int cv_serve_chat_missing_tokens(const cv_serve_chat *c, char *out, size_t n)
{
    /* no system turn: some templates refuse one */
    const cv_serve_chat_msg msgs[3] = {{"user", "u", NULL}, {"assistant", "a", NULL}, {"user", "v", NULL}};
    cv_buf text = {0};
    char err[CV_ERRLEN];
    int missing = 0;
    size_t used = 0;
    out[0] = 0;
    if (render_with(c, msgs, 3, NULL, NULL, false, &text, err, sizeof err) == 0 && cv_buf_puts(&text, "") == 0)
        for (const char *p = text.p; *p; p++) {
            const char *end = control_end(p);
            int32_t id[2];
            if (!end || convoy_tokenize(c->model, p, (size_t)(end - p), false, true, id, 2) == 1)
                continue;
            const int k = (int)(end - p);
            char one[64];
            snprintf(one, sizeof one, "%.*s", k, p);
            if (!strstr(out, one) && used + (size_t)k + 3 < n) {
                used += (size_t)snprintf(out + used, n - used, "%s%s", missing ? ", " : "", one);
                missing++;
            }
            p = end - 1;
        }
    cv_buf_free(&text);
    return missing;
}

const char *const *cv_serve_chat_stop_strings(const cv_serve_chat *c)
{
    static const char *const none[] = {NULL};
    return c->jinja ? none : cv_chat_stop_strings(c->kind);
}
