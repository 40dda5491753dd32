/* embed.c: the embedding routes (see embed.h): the body's inputs as token
 * ids, one scheduler request each (all submitted before any is waited
 * for, so that they share slots and batches), then the vectors in the
 * route's shape. */
#include "serve/embed.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"

#define INVALID "invalid_request_error"

/* The inputs of a body: each one's token ids. */
typedef struct inputs {
    int32_t n;
    int32_t **ids;  /* [n] */
    int32_t *n_ids; /* [n] */
    int32_t n_tokens;
} inputs;

static void inputs_free(inputs *in)
{
    for (int32_t i = 0; in->ids && i < in->n; i++)
        cv_free(in->ids[i]);
    cv_free(in->ids);
    cv_free(in->n_ids);
    memset(in, 0, sizeof *in);
}

/* Input i's ids: the text's with BOS (specials parsed), as llama-server
 * tokenizes an embedding's input; what names the input in a message. */
static int text_input(const oai_server *srv, const json_t *v, int32_t i, const char *field, const char *what,
                      inputs *in, oai_error *e)
{
    const size_t n_text = json_string_length(v);
    if (n_text == 0)
        return cv_oai_fail(e, 400, INVALID, NULL, field, "%s is an empty text", what);
    if (n_text > (size_t)INT32_MAX - 8)
        return cv_oai_fail(e, 400, INVALID, NULL, field, "%s is too long", what);
    const int32_t cap = (int32_t)n_text + 8; /* a token holds a byte at least, but BOS and the specials */
    if (!(in->ids[i] = cv_malloc(sizeof(int32_t) * (size_t)cap)))
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    in->n_ids[i] = convoy_tokenize(srv->model, json_string_value(v), n_text, true, true, in->ids[i], cap);
    if (in->n_ids[i] < 1)
        return cv_oai_fail(e, 400, INVALID, NULL, field, "%s cannot be tokenized", what);
    return 0;
}

/* Input i's ids as the body lists them: each in the vocabulary. */
static int ids_input(const oai_server *srv, const json_t *v, int32_t i, const char *field, const char *what,
                     inputs *in, oai_error *e)
{
    convoy_model_info info;
    convoy_model_get_info(srv->model, &info);
    const size_t n = json_array_size(v);
    if (n == 0)
        return cv_oai_fail(e, 400, INVALID, NULL, field, "%s is an empty list of token ids", what);
    if (n > (size_t)INT32_MAX || !(in->ids[i] = cv_malloc(sizeof(int32_t) * n)))
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t k;
    json_t *t;
    json_array_foreach(v, k, t)
    {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= info.n_vocab)
            return cv_oai_fail(e, 400, INVALID, NULL, field, "%s: item %zu is not a token id (an integer in [0, %d))",
                            what, k, info.n_vocab);
        in->ids[i][k] = (int32_t)json_integer_value(t);
    }
    in->n_ids[i] = (int32_t)n;
    return 0;
}

/* The inputs of v: a string, a list of strings, and (ids true) a list of
 * ids or a list of lists of ids. */
static int read_inputs(const oai_server *srv, const json_t *v, const char *field, bool ids, inputs *in, oai_error *e)
{
    const bool list = json_is_array(v);
    const bool one_ids = ids && list && json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0));
    if (!json_is_string(v) && !list)
        return cv_oai_fail(e, 400, INVALID, NULL, field, "'%s' must be %s", field,
                        ids ? "a string, a list of strings or a list of token ids" : "a string or a list of strings");
    if (list && json_array_size(v) == 0)
        return cv_oai_fail(e, 400, INVALID, NULL, field, "'%s' is empty", field);
    in->n = !list || one_ids ? 1 : (int32_t)json_array_size(v);
    in->ids = cv_calloc((size_t)in->n, sizeof *in->ids);
    in->n_ids = cv_calloc((size_t)in->n, sizeof *in->n_ids);
    if (!in->ids || !in->n_ids)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int32_t i = 0; i < in->n; i++) {
        const bool whole = !list || one_ids;
        const json_t *item = whole ? v : json_array_get(v, (size_t)i);
        char what[64];
        snprintf(what, sizeof what, whole ? "'%s'" : "'%s' item %d", field, i);
        int rc;
        if (json_is_string(item))
            rc = text_input(srv, item, i, field, what, in, e);
        else if (ids && json_is_array(item))
            rc = ids_input(srv, item, i, field, what, in, e);
        else
            rc = cv_oai_fail(e, 400, INVALID, NULL, field, "%s must be %s", what,
                          ids ? "a string or a list of token ids" : "a string");
        if (rc)
            return -1;
        if (in->n_ids[i] > srv->n_ctx)
            return cv_oai_fail(e, 400, INVALID, NULL, field, "%s has %d tokens, more than the context's %d", what,
                            in->n_ids[i], srv->n_ctx);
        in->n_tokens += in->n_ids[i];
    }
    return 0;
}

/* The body's inputs and encoding (base64 or floats). */
static int parse_body(const oai_server *srv, cv_embed_api api, const json_t *root, inputs *in, bool *base64,
                      oai_error *e)
{
    *base64 = false;
    if (cv_oai_check_model(srv, root, e))
        return -1;
    if (api == CV_EMBED_OLLAMA_LEGACY) {
        const json_t *prompt = json_object_get(root, "prompt");
        if (!json_is_string(prompt))
            return cv_oai_fail(e, 400, INVALID, NULL, "prompt", "'prompt' must be a string");
        return read_inputs(srv, prompt, "prompt", false, in, e);
    }
    const json_t *input = json_object_get(root, "input");
    if (!input || json_is_null(input))
        return cv_oai_fail(e, 400, INVALID, NULL, "input", "'input' is missing");
    const json_t *format = json_object_get(root, "encoding_format");
    if (api == CV_EMBED_OPENAI && format && !json_is_null(format)) {
        const char *f = json_string_value(format);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return cv_oai_fail(e, 400, INVALID, NULL, "encoding_format", "'encoding_format' must be \"float\" or "
                                                                      "\"base64\"");
        *base64 = !strcmp(f, "base64");
    }
    return read_inputs(srv, input, "input", api == CV_EMBED_OPENAI, in, e);
}

/* Releases (and so cancels) the first n requests. */
static void release_all(cv_request **r, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        cv_request_release(r[i]);
}

/* Submits every input, each as its own request of run->client. */
static int submit_all(const cv_embed_run *run, const inputs *in, cv_request **reqs, cv_submit_result *refused,
                      oai_error *e)
{
    for (int32_t i = 0; i < in->n; i++) {
        const cv_request_params p = {.prompt = in->ids[i], .n_prompt = in->n_ids[i], .embed = true,
                                     .sampler = convoy_sampling_default_params(), .top_logprobs = -1,
                                     .client = run->client};
        char err[CV_ERRLEN];
        const cv_submit_result sr = cv_sched_submit(run->sched, &p, &reqs[i], err, sizeof err);
        if (sr != CV_SUBMIT_OK) {
            release_all(reqs, i);
            *refused = sr;
            return cv_oai_fail(e, 503, "server_error", NULL, NULL, "%s", err);
        }
    }
    return 0;
}

/* Waits for every request and copies its vector into vecs [n][n_embd]; -1
 * with e filled (status 0: the client left). Releases the requests. */
static int wait_all(const cv_embed_run *run, const inputs *in, cv_request **reqs, float *vecs, int32_t n_embd,
                    oai_error *e)
{
    int rc = 0;
    for (int32_t i = 0; i < in->n && rc == 0; i++) {
        cv_finish fin = CV_RUNNING;
        while (fin == CV_RUNNING && rc == 0) {
            cv_request_wait(reqs[i], 0, run->poll_ms, &fin);
            if (fin == CV_RUNNING && run->gone(run->user))
                rc = -1;
        }
        const float *v = rc == 0 ? cv_request_embedding(reqs[i]) : NULL;
        if (v)
            memcpy(vecs + (size_t)i * n_embd, v, sizeof(float) * (size_t)n_embd);
        else if (rc == 0)
            rc = cv_oai_fail(e, 500, "server_error", NULL, NULL, "input %d: %s", i,
                          fin == CV_FINISH_ERROR ? cv_request_error(reqs[i]) : "the embedding was cancelled");
    }
    release_all(reqs, in->n);
    return rc;
}

static json_t *floats_json(const float *v, int32_t n)
{
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_real((double)v[i]));
    return a;
}

/* The vector's little-endian float32 bytes in base64 (RFC 4648, padded). */
static json_t *base64_json(const float *v, int32_t n)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t len = 4 * (size_t)n;
    const uint8_t *b = (const uint8_t *)v; /* this host is little-endian (pipe/proto.h builds only there) */
    char *out = cv_malloc((len + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        const uint32_t w = (uint32_t)b[i] << 16 | (i + 1 < len ? (uint32_t)b[i + 1] << 8 : 0) |
                           (i + 2 < len ? b[i + 2] : 0);
        out[o++] = digits[w >> 18 & 63];
        out[o++] = digits[w >> 12 & 63];
        out[o++] = i + 1 < len ? digits[w >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? digits[w & 63] : '=';
    }
    json_t *s = json_stringn(out, o);
    cv_free(out);
    return s;
}

static json_t *openai_json(const oai_server *srv, const inputs *in, const float *vecs, int32_t n_embd, bool base64)
{
    json_t *data = json_array();
    for (int32_t i = 0; data && i < in->n; i++) {
        const float *v = vecs + (size_t)i * n_embd;
        json_array_append_new(data, json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding",
                                              base64 ? base64_json(v, n_embd) : floats_json(v, n_embd)));
    }
    return json_pack("{s:s,s:o,s:s,s:{s:i,s:i}}", "object", "list", "data", data, "model", srv->model_id, "usage",
                     "prompt_tokens", in->n_tokens, "total_tokens", in->n_tokens);
}

static json_t *ollama_json(const oai_server *srv, cv_embed_api api, const inputs *in, const float *vecs,
                           int32_t n_embd, double seconds)
{
    if (api == CV_EMBED_OLLAMA_LEGACY)
        return json_pack("{s:o}", "embedding", floats_json(vecs, n_embd));
    json_t *all = json_array();
    for (int32_t i = 0; all && i < in->n; i++)
        json_array_append_new(all, floats_json(vecs + (size_t)i * n_embd, n_embd));
    return json_pack("{s:s,s:o,s:I,s:i,s:i}", "model", srv->model_id, "embeddings", all, "total_duration",
                     (json_int_t)(seconds * 1e9), "load_duration", 0, "prompt_eval_count", in->n_tokens);
}

/* Runs the inputs and answers them; the requests are gone when it returns. */
static char *run_inputs(const cv_embed_run *run, cv_embed_api api, const inputs *in, bool base64, double t0,
                        cv_submit_result *refused, oai_error *e)
{
    convoy_model_info info;
    convoy_model_get_info(run->srv->model, &info);
    cv_request **reqs = cv_calloc((size_t)in->n, sizeof *reqs);
    float *vecs = cv_malloc(sizeof(float) * (size_t)in->n * (size_t)info.n_embd);
    char *res = NULL;
    if (!reqs || !vecs)
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    else if (submit_all(run, in, reqs, refused, e) == 0 && wait_all(run, in, reqs, vecs, info.n_embd, e) == 0) {
        json_t *j = api == CV_EMBED_OPENAI ? openai_json(run->srv, in, vecs, info.n_embd, base64)
                                           : ollama_json(run->srv, api, in, vecs, info.n_embd, cv_now_s() - t0);
        res = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
        json_decref(j);
        if (!res)
            cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    cv_free(reqs);
    cv_free(vecs);
    return res;
}

char *cv_embed_answer(const cv_embed_run *run, cv_embed_api api, const char *body, size_t len, int32_t *n_prompt,
                      cv_submit_result *refused, oai_error *e)
{
    const double t0 = cv_now_s();
    *refused = CV_SUBMIT_OK;
    *n_prompt = 0;
    json_t *root = cv_oai_load_object(body, len, e);
    if (!root)
        return NULL;
    inputs in = {0};
    bool base64;
    char *res = NULL;
    if (parse_body(run->srv, api, root, &in, &base64, e) == 0) {
        *n_prompt = in.n_tokens;
        res = run_inputs(run, api, &in, base64, t0, refused, e);
    }
    inputs_free(&in);
    json_decref(root);
    return res;
}
