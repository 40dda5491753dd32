/* ollama.c: see ollama.h. The requests: cv_ollama_to_openai copies what
 * carries over member by member (chat_body, generate_body, copy_options,
 * copy_format, copy_think) after refusing what does not (refuse_unsupported).
 * The answers: one builder per shape (line_of for every line, the message
 * or response text, done_fields for the last line's figures), the model's
 * entries from details_of. */
#include "serve/ollama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#include "convoy.h"

/* ---- requests ---- */

/* The unsupported members, refused by name (a 400 naming each). */
static int refuse_unsupported(ollama_kind k, const json_t *body, oai_error *e)
{
    const json_t *msg;
    size_t i;
    const json_t *images = json_object_get(body, "images");
    if (json_array_size(images) > 0)
        return cv_oai_fail(e, 400, "invalid_request_error", NULL, "images", "images: this server's models read text");
    const json_t *opts = json_object_get(body, "options"), *format = json_object_get(body, "format");
    if (opts && !json_is_object(opts) && !json_is_null(opts))
        return cv_oai_fail(e, 400, "invalid_request_error", NULL, "options", "options must be an object");
    const bool format_ok = !format || json_is_null(format) || json_is_object(format) ||
                           (json_is_string(format) && (!*json_string_value(format) ||
                                                       !strcmp(json_string_value(format), "json")));
    if (!format_ok)
        return cv_oai_fail(e, 400, "invalid_request_error", NULL, "format", "format is \"json\" or a JSON schema");
    json_array_foreach(json_object_get(body, "messages"), i, msg)
        if (json_array_size(json_object_get(msg, "images")) > 0)
            return cv_oai_fail(e, 400, "invalid_request_error", NULL, "images",
                            "messages[%zu].images: this server's models read text", i);
    if (k == OLLAMA_CHAT)
        return 0;
    const char *tmpl = json_string_value(json_object_get(body, "template"));
    if (tmpl && *tmpl)
        return cv_oai_fail(e, 400, "invalid_request_error", NULL, "template",
                        "template (a Go template) is not supported: give the whole prompt with raw: true");
    if (json_array_size(json_object_get(body, "context")) > 0)
        return cv_oai_fail(e, 400, "invalid_request_error", NULL, "context",
                        "context (deprecated) is not supported: send the conversation to /api/chat");
    return 0;
}

/* options -> the OpenAI and llama-server sampling members. */
static void copy_options(const json_t *opts, json_t *out)
{
    static const char *const same[] = {"temperature",     "top_k",         "top_p",           "min_p",
                                       "seed",            "stop",          "repeat_penalty",  "repeat_last_n",
                                       "presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        json_t *v = json_object_get(opts, same[i]);
        if (v)
            json_object_set(out, same[i], v);
    }
    const json_t *n = json_object_get(opts, "num_predict");
    if (n && !(json_is_integer(n) && json_integer_value(n) < 0)) /* -1, -2: up to the context's end */
        json_object_set(out, "max_tokens", (json_t *)n);
}

/* format "json" or a schema -> response_format. */
static void copy_format(const json_t *format, json_t *out)
{
    if (json_is_string(format) && !strcmp(json_string_value(format), "json"))
        json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
    else if (json_is_object(format))
        json_object_set_new(out, "response_format",
                            json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name", "format",
                                      "schema", format));
}

/* think -> the template's enable_thinking or reasoning_effort; the
 * thinking always comes apart. */
static void copy_think(const json_t *think, json_t *out)
{
    json_object_set_new(out, "reasoning_format", json_string("deepseek"));
    if (json_is_boolean(think))
        json_object_set_new(out, "chat_template_kwargs", json_pack("{s:O}", "enable_thinking", think));
    else if (json_is_string(think))
        json_object_set_new(out, "chat_template_kwargs", json_pack("{s:O}", "reasoning_effort", think));
}

/* A chat message: the same, with tool call arguments as JSON texts and a
 * tool result's tool_name as its name. */
static json_t *chat_message(const json_t *m)
{
    json_t *out = json_deep_copy(m), *call;
    size_t i;
    json_object_del(out, "images");
    json_object_del(out, "thinking");
    const json_t *tool_name = json_object_get(m, "tool_name");
    if (tool_name && !json_object_get(m, "name"))
        json_object_set(out, "name", (json_t *)tool_name);
    json_object_del(out, "tool_name");
    json_array_foreach(json_object_get(out, "tool_calls"), i, call)
    {
        json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
        char *text = json_is_object(args) ? cv_oai_json_text(json_incref(args)) : NULL;
        if (text)
            json_object_set_new(fn, "arguments", json_string(text));
        free(text);
        if (!json_object_get(call, "type"))
            json_object_set_new(call, "type", json_string("function"));
        if (!json_object_get(call, "id")) {
            char id[32];
            snprintf(id, sizeof id, "call_%zu", i);
            json_object_set_new(call, "id", json_string(id));
        }
    }
    return out;
}

static void chat_body(const json_t *body, json_t *out)
{
    const json_t *msgs = json_object_get(body, "messages"), *m;
    size_t i;
    json_t *list = json_is_array(msgs) ? json_array() : json_incref((json_t *)msgs);
    json_array_foreach(msgs, i, m)
        json_array_append_new(list, json_is_object(m) ? chat_message(m) : json_incref((json_t *)m));
    json_object_set_new(out, "messages", list ? list : json_null());
    const json_t *tools = json_object_get(body, "tools");
    if (tools)
        json_object_set(out, "tools", (json_t *)tools);
}

/* A generate: its system and prompt as a chat, with raw the prompt alone,
 * with a suffix the fill-in-the-middle completion between them. */
static void generate_body(const json_t *body, json_t *out, oai_kind *kind)
{
    const json_t *prompt = json_object_get(body, "prompt"), *system = json_object_get(body, "system");
    const json_t *suffix = json_object_get(body, "suffix");
    const bool fim = json_is_string(suffix) && *json_string_value(suffix);
    if (fim || json_is_true(json_object_get(body, "raw"))) {
        *kind = OAI_COMPLETIONS;
        json_object_set(out, "prompt", (json_t *)prompt);
        if (fim)
            json_object_set(out, "suffix", (json_t *)suffix);
        return;
    }
    json_t *msgs = json_array();
    if (json_is_string(system) && *json_string_value(system))
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", prompt));
    json_object_set_new(out, "messages", msgs);
}

char *cv_ollama_to_openai(ollama_kind k, const char *body, size_t len, oai_kind *kind, bool *load_only, oai_error *e)
{
    json_error_t je;
    json_t *in = json_loadb(body, len, 0, &je);
    *load_only = false;
    *kind = OAI_CHAT;
    if (!json_is_object(in)) {
        json_decref(in);
        cv_oai_fail(e, 400, "invalid_request_error", NULL, NULL, "the body is not a JSON object%s%s", in ? "" : ": ",
                 in ? "" : je.text);
        return NULL;
    }
    const json_t *prompt = json_object_get(in, "prompt"), *msgs = json_object_get(in, "messages");
    *load_only = k == OLLAMA_GENERATE ? !prompt || (json_is_string(prompt) && !*json_string_value(prompt))
                                      : !msgs || (json_is_array(msgs) && json_array_size(msgs) == 0);
    if (*load_only || refuse_unsupported(k, in, e)) {
        json_decref(in);
        return NULL;
    }
    const json_t *stream = json_object_get(in, "stream");
    json_t *out = json_pack("{s:O?, s:b}", "model", json_object_get(in, "model"), "stream",
                            stream ? json_is_true(stream) : true);
    if (k == OLLAMA_CHAT)
        chat_body(in, out);
    else
        generate_body(in, out, kind);
    copy_options(json_object_get(in, "options"), out);
    copy_format(json_object_get(in, "format"), out);
    if (*kind == OAI_CHAT)
        copy_think(json_object_get(in, "think"), out);
    json_decref(in);
    char *text = cv_oai_json_text(out);
    if (!text)
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return text;
}

/* ---- answers ---- */

/* RFC 3339 with microseconds, as Ollama's created_at. */
static void now_rfc3339(char *out, size_t n)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, n, "%s.%06ldZ", day, (long)tv.tv_usec);
}

/* {"model", "created_at"} that every line starts with. */
static json_t *line_of(const oai_server *srv)
{
    char at[48];
    now_rfc3339(at, sizeof at);
    return json_pack("{s:s, s:s}", "model", srv->model_id, "created_at", at);
}

/* A tool call as Ollama gives it: {"function": {"name", "arguments": OBJECT}}. */
static json_t *tool_call_json(const cv_tool_call *c)
{
    json_t *args = json_loads(c->arguments ? c->arguments : "{}", 0, NULL);
    return json_pack("{s:{s:s, s:o}}", "function", "name", c->name ? c->name : "", "arguments",
                     args ? args : json_object());
}

/* The text of a chat's message or a generate's response, and its thinking. */
static void set_text(json_t *line, ollama_kind k, const char *text, size_t len, const char *thinking,
                     size_t thinking_len, json_t *calls)
{
    if (k == OLLAMA_GENERATE) {
        json_object_set_new(line, "response", json_stringn(text ? text : "", text ? len : 0));
        if (thinking)
            json_object_set_new(line, "thinking", json_stringn(thinking, thinking_len));
        json_decref(calls);
        return;
    }
    json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", text ? text : "", text ? len : 0);
    if (thinking)
        json_object_set_new(msg, "thinking", json_stringn(thinking, thinking_len));
    if (calls)
        json_object_set_new(msg, "tool_calls", calls);
    json_object_set_new(line, "message", msg);
}

/* done, done_reason, the counts and the durations in nanoseconds. */
static void done_fields(json_t *line, const char *reason, const ollama_stats *st)
{
    const double eval_s = st->total_s > st->prompt_s ? st->total_s - st->prompt_s : 0;
    json_object_set_new(line, "done", json_true());
    json_object_set_new(line, "done_reason", json_string(reason));
    json_object_set_new(line, "total_duration", json_integer((json_int_t)(st->total_s * 1e9)));
    json_object_set_new(line, "load_duration", json_integer(0));
    json_object_set_new(line, "prompt_eval_count", json_integer(st->prompt_tokens));
    json_object_set_new(line, "prompt_eval_duration", json_integer((json_int_t)(st->prompt_s * 1e9)));
    json_object_set_new(line, "eval_count", json_integer(st->eval_tokens));
    json_object_set_new(line, "eval_duration", json_integer((json_int_t)(eval_s * 1e9)));
}

char *cv_ollama_chunk_json(const oai_server *srv, ollama_kind k, const oai_chunk *c, const ollama_stats *st,
                        bool *none)
{
    *none = c->usage_only || (c->call && c->call_args);
    if (*none)
        return NULL;
    json_t *line = line_of(srv);
    json_t *calls = c->call ? json_pack("[o]", tool_call_json(c->call)) : NULL;
    set_text(line, k, c->text, c->text_len, c->reasoning, c->reasoning_len, calls);
    if (c->finish)
        done_fields(line, !strcmp(c->finish, "length") ? "length" : "stop", st);
    else
        json_object_set_new(line, "done", json_false());
    return cv_oai_json_text(line);
}

char *cv_ollama_answer_json(const oai_server *srv, ollama_kind k, const oai_answer *a, const ollama_stats *st)
{
    json_t *line = line_of(srv), *calls = NULL;
    if (a->calls && a->calls->n > 0) {
        calls = json_array();
        for (int i = 0; i < a->calls->n; i++)
            json_array_append_new(calls, tool_call_json(&a->calls->calls[i]));
    }
    const bool called = calls != NULL;
    const char *text = called ? a->calls->content.p : a->text;
    const size_t len = called ? a->calls->content.n : a->text_len;
    set_text(line, k, text, len, a->reasoning, a->reasoning_len, calls);
    done_fields(line, !strcmp(a->finish, "length") ? "length" : "stop", st);
    json_decref(a->logprobs);
    return cv_oai_json_text(line);
}

char *cv_ollama_loaded_json(const oai_server *srv, ollama_kind k)
{
    json_t *line = line_of(srv);
    set_text(line, k, "", 0, NULL, 0, NULL);
    json_object_set_new(line, "done", json_true());
    json_object_set_new(line, "done_reason", json_string("load"));
    return cv_oai_json_text(line);
}

char *cv_ollama_error_json(const oai_error *e) { return cv_oai_json_text(json_pack("{s:s}", "error", e->message)); }

/* ---- the model ---- */

/* "1.2B", "260.1K": a parameter count as Ollama writes it. */
static void parameter_size(uint64_t n, char *out, size_t len)
{
    static const struct {
        double scale;
        const char *unit;
    } units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}, {1, ""}};
    size_t i = 0;
    while (i + 1 < sizeof units / sizeof units[0] && n < units[i].scale)
        i++;
    snprintf(out, len, "%.1f%s", n / units[i].scale, units[i].unit);
}

static json_t *details_of(const convoy_model_info *info)
{
    char size[32];
    parameter_size(info->n_params, size, sizeof size);
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "gguf", "family", info->arch,
                     "families", info->arch, "parameter_size", size, "quantization_level", info->file_type);
}

/* The model's digest: its id (convoy.h's convoy_model_id, a BLAKE2b-256 of
 * its tokenizer, hyperparameters and tensor directory), in hex. */
static void digest_of(const convoy_model *m, char *out, size_t n)
{
    uint8_t id[CONVOY_MODEL_ID_BYTES];
    out[0] = '\0';
    if (convoy_model_id(m, id, NULL, 0) != 0 || n < 2 * CONVOY_MODEL_ID_BYTES + 1)
        return;
    for (int i = 0; i < CONVOY_MODEL_ID_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static void file_time(const struct stat *st, char *out, size_t n)
{
    struct tm tm;
    gmtime_r(&st->st_mtime, &tm);
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

char *cv_ollama_models_json(const oai_server *srv, const cv_props *p, bool running)
{
    convoy_model_info info;
    struct stat st = {0};
    char digest[2 * CONVOY_MODEL_ID_BYTES + 1], modified[40];
    convoy_model_get_info(srv->model, &info);
    stat(p->model_path, &st);
    digest_of(srv->model, digest, sizeof digest);
    file_time(&st, modified, sizeof modified);
    json_t *entry = json_pack("{s:s, s:s, s:I, s:s, s:o}", "name", srv->model_id, "model", srv->model_id, "size",
                              (json_int_t)st.st_size, "digest", digest, "details", details_of(&info));
    if (running) /* loaded for as long as the server runs */
        json_object_update_new(entry, json_pack("{s:s, s:i, s:i}", "expires_at", "2318-01-01T00:00:00Z",
                                                "size_vram", 0, "context_length", srv->n_ctx));
    else
        json_object_set_new(entry, "modified_at", json_string(modified));
    return cv_oai_json_text(json_pack("{s:[o]}", "models", entry));
}

/* /api/show's model_info: the GGUF keys Ollama lists that convoy keeps. */
static json_t *model_info_of(const convoy_model_info *info)
{
    char key[96];
    json_t *mi = json_pack("{s:s, s:I}", "general.architecture", info->arch, "general.parameter_count",
                           (json_int_t)info->n_params);
    const struct {
        const char *suffix;
        int32_t v;
    } keys[] = {{"context_length", info->n_ctx_train}, {"embedding_length", info->n_embd},
                {"block_count", info->n_layer}, {"vocab_size", info->n_vocab}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", info->arch, keys[i].suffix);
        json_object_set_new(mi, key, json_integer(keys[i].v));
    }
    return mi;
}

char *cv_ollama_show_json(const oai_server *srv, const cv_props *p, const char *body, size_t len, oai_error *e)
{
    json_t *in = json_loadb(body, len, 0, NULL);
    const char *name = json_string_value(json_object_get(in, "model"));
    name = name ? name : json_string_value(json_object_get(in, "name"));
    if (srv->strict_model && (!name || strcmp(name, srv->model_id))) {
        cv_oai_fail(e, 404, "invalid_request_error", "model_not_found", "model", "model '%.200s' not found",
                 name ? name : "");
        json_decref(in);
        return NULL;
    }
    json_decref(in);
    const convoy_sampling_params d = convoy_sampling_default_params();
    convoy_model_info info;
    convoy_model_get_info(srv->model, &info);
    char params[256], modelfile[4200];
    snprintf(params, sizeof params, "temperature %g\ntop_k %d\ntop_p %g\nmin_p %g", (double)d.temp, d.top_k,
             (double)d.top_p, (double)d.min_p);
    snprintf(modelfile, sizeof modelfile, "# convoy serves this file\nFROM %s\n", p->model_path);
    json_t *caps = json_pack("[s]", "completion");
    if (srv->chat->tools != CV_TOOLS_NONE)
        json_array_append_new(caps, json_string("tools"));
    return cv_oai_json_text(json_pack("{s:s, s:s, s:s, s:o, s:o, s:o}", "modelfile", modelfile, "parameters", params,
                                   "template", srv->chat->source ? srv->chat->source : "", "details",
                                   details_of(&info), "model_info", model_info_of(&info), "capabilities", caps));
}

char *cv_ollama_version_json(const cv_props *p) { return cv_oai_json_text(json_pack("{s:s}", "version", p->version)); }
