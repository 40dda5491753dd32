/* llamacpp.c: llama-server's /completion and /infill (llamacpp.h). */
#include "serve/llamacpp.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "serve/fim.h"

#define INVALID "invalid_request_error"

static cv_fim_text text_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return (cv_fim_text){json_string_value(v), json_string_length(v)};
}

/* /infill's prompt ids into body's "prompt". */
static int infill_prompt(const oai_server *srv, const json_t *in, json_t *body, oai_error *e)
{
    static const char *const texts[] = {"input_prefix", "input_suffix", "prompt"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        const json_t *v = json_object_get(in, texts[i]);
        if (v && !json_is_string(v))
            return cv_oai_fail(e, 400, INVALID, NULL, texts[i], "'%s' must be a string", texts[i]);
    }
    const json_t *extra = json_object_get(in, "input_extra"), *x;
    if (extra && (!json_is_array(extra) || json_array_size(extra) > 256))
        return cv_oai_fail(e, 400, INVALID, NULL, "input_extra", "'input_extra' must be a list of at most 256 files");
    cv_fim_file files[256];
    size_t i;
    json_array_foreach(extra, i, x)
    {
        files[i] = (cv_fim_file){text_of(x, "filename"), text_of(x, "text")};
        if (!json_is_string(json_object_get(x, "text")))
            return cv_oai_fail(e, 400, INVALID, NULL, "input_extra",
                            "input_extra[%zu] must be {\"filename\": string, \"text\": string}", i);
    }
    const cv_fim_parts parts = {.prefix = text_of(in, "input_prefix"), .suffix = text_of(in, "input_suffix"),
                                .middle = text_of(in, "prompt"), .files = files, .n_files = (int)json_array_size(extra)};
    int32_t *ids = cv_malloc(sizeof *ids * (size_t)srv->n_ctx);
    if (!ids)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    char why[CV_ERRLEN];
    const int n = cv_fim_prompt(srv->model, &parts, ids, srv->n_ctx, why, sizeof why);
    json_t *list = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(list, json_integer(ids[k]));
    cv_free(ids);
    json_object_set_new(body, "prompt", list);
    return n < 0 ? cv_oai_fail(e, 400, INVALID, NULL, "input_prefix", "%s", why) : 0;
}

char *cv_llamacpp_to_openai(const oai_server *srv, bool infill, const char *body, size_t len, oai_error *e)
{
    json_t *in = cv_oai_load_object(body, len, e);
    if (!in)
        return NULL;
    json_t *out = json_deep_copy(in);
    const json_t *n_predict = json_object_get(in, "n_predict"), *n_probs = json_object_get(in, "n_probs");
    json_object_del(out, "n_predict");
    json_object_del(out, "n"); /* one answer: these shapes have no choices */
    if (n_predict && !(json_is_integer(n_predict) && json_integer_value(n_predict) < 0))
        json_object_set(out, "max_tokens", (json_t *)n_predict);
    if (!json_object_get(in, "stream"))
        json_object_set_new(out, "stream", json_false());
    int rc = 0;
    if (n_probs && !(json_is_integer(n_probs) && json_integer_value(n_probs) == 0))
        rc = cv_oai_fail(e, 400, INVALID, NULL, "n_probs", "n_probs is not supported here: /v1/completions' logprobs "
                                                        "gives the same figures");
    if (rc == 0 && infill)
        rc = infill_prompt(srv, in, out, e);
    json_decref(in);
    char *text = rc ? NULL : cv_oai_json_text(out);
    if (rc)
        json_decref(out);
    else if (!text)
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return text;
}

/* The figures of a finished generation. */
static void set_figures(json_t *j, const oai_server *srv, const char *finish, const ollama_stats *st)
{
    const double predict_s = st->total_s - st->prompt_s;
    const char *type = !strcmp(finish, "length") ? "limit" : st->stop_hit ? "word" : "eos";
    json_object_set_new(j, "stop_type", json_string(type));
    json_object_set_new(j, "stopping_word", json_string(st->stop_hit ? st->stop_hit : ""));
    json_object_set_new(j, "model", json_string(srv->model_id));
    json_object_set_new(j, "tokens_predicted", json_integer(st->eval_tokens));
    json_object_set_new(j, "tokens_evaluated", json_integer(st->prompt_tokens + st->cached_tokens));
    json_object_set_new(j, "tokens_cached", json_integer(st->cached_tokens));
    json_object_set_new(j, "timings", json_pack("{s:i,s:f,s:i,s:f,s:f}", "prompt_n", st->prompt_tokens, "prompt_ms",
                                                st->prompt_s * 1e3, "predicted_n", st->eval_tokens, "predicted_ms",
                                                predict_s * 1e3,
                                                "predicted_per_second",
                                                predict_s > 0 ? st->eval_tokens / predict_s : 0.0));
}

char *cv_llamacpp_chunk_json(const oai_server *srv, const oai_chunk *c, const ollama_stats *st, bool *none)
{
    *none = c->usage_only;
    if (*none)
        return NULL;
    json_t *j = json_pack("{s:s%,s:b,s:i}", "content", c->text ? c->text : "", c->text_len, "stop",
                          c->finish != NULL, "index", 0);
    if (j && c->finish)
        set_figures(j, srv, c->finish, st);
    json_decref(c->logprobs);
    return cv_oai_json_text(j);
}

char *cv_llamacpp_answer_json(const oai_server *srv, const oai_answer *a, const ollama_stats *st)
{
    json_t *j = json_pack("{s:s%,s:b,s:i}", "content", a->text, a->text_len, "stop", 1, "index", 0);
    if (j)
        set_figures(j, srv, a->finish, st);
    json_decref(a->logprobs);
    return cv_oai_json_text(j);
}
