/* extra.c: see extra.h. Bodies are read with jansson like oai.c's. */
#include "serve/extra.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"
#include "serve/buf.h"
#include "serve/text.h"

#define INVALID "invalid_request_error"

static char *oom(oai_error *e)
{
    cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return NULL;
}

/* A boolean field (absent or null: dflt); -1 with e filled when not one. */
static int flag(const json_t *o, const char *key, bool dflt, bool *out, oai_error *e)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return cv_oai_fail(e, 400, INVALID, NULL, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* A token's piece: a string when valid UTF-8, else a list of its bytes. */
static json_t *piece_json(const convoy_model *m, int32_t id)
{
    char raw[256];
    const int n = convoy_token_piece(m, id, raw, sizeof raw);
    size_t at = 0, len = n > 0 ? (size_t)n : 0;
    while (at < len && cv_utf8_len(raw + at, len - at))
        at += cv_utf8_len(raw + at, len - at);
    if (at == len)
        return json_stringn(raw, len);
    json_t *bytes = json_array();
    for (size_t i = 0; bytes && i < len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)raw[i]));
    return bytes;
}

static json_t *tokens_json(const convoy_model *m, const int32_t *ids, int n, bool with_pieces)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, with_pieces ? json_pack("{s:i,s:o}", "id", ids[i], "piece", piece_json(m, ids[i]))
                                             : json_integer(ids[i]));
    return json_pack("{s:o}", "tokens", a);
}

/* The ids of text (specials as the flags say) as a /tokenize answer. */
static char *tokenize(const oai_server *srv, const json_t *content, bool add_special, bool parse_special,
                      bool with_pieces, oai_error *e)
{
    const size_t n_text = json_string_length(content);
    /* every token holds a byte of the text at least, but the specials */
    const int32_t cap = n_text < (size_t)INT32_MAX - 8 ? (int32_t)n_text + 8 : INT32_MAX;
    int32_t *ids = cv_malloc(sizeof *ids * (size_t)cap);
    if (!ids)
        return oom(e);
    const int n = convoy_tokenize(srv->model, json_string_value(content), n_text, add_special, parse_special, ids,
                                  cap);
    char *res = NULL;
    if (n < 0)
        cv_oai_fail(e, 400, INVALID, NULL, "content", "the text cannot be tokenized (too long)");
    else if (!(res = cv_oai_json_text(tokens_json(srv->model, ids, n, with_pieces))))
        oom(e);
    cv_free(ids);
    return res;
}

char *cv_tokenize_json(const oai_server *srv, const char *body, size_t len, oai_error *e)
{
    json_t *root = cv_oai_load_object(body, len, e);
    if (!root)
        return NULL;
    json_t *content = json_object_get(root, "content");
    bool add_special, parse_special, with_pieces;
    char *res = NULL;
    if (!json_is_string(content))
        cv_oai_fail(e, 400, INVALID, NULL, "content", "'content' must be a string");
    else if (flag(root, "add_special", false, &add_special, e) == 0 &&
             flag(root, "parse_special", true, &parse_special, e) == 0 &&
             flag(root, "with_pieces", false, &with_pieces, e) == 0)
        res = tokenize(srv, content, add_special, parse_special, with_pieces, e);
    json_decref(root);
    return res;
}

/* The text of the ids of a /detokenize body into out; -1 with e filled. */
static int detokenize(const oai_server *srv, const json_t *tokens, cv_buf *out, oai_error *e)
{
    convoy_model_info info;
    convoy_model_get_info(srv->model, &info);
    const size_t n = json_array_size(tokens);
    int32_t *ids = cv_malloc(sizeof *ids * (n ? n : 1));
    if (!ids)
        return oom(e), -1;
    size_t i;
    json_t *t;
    int rc = 0;
    json_array_foreach(tokens, i, t)
    {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= info.n_vocab) {
            rc = cv_oai_fail(e, 400, INVALID, NULL, "tokens", "'tokens' item %zu is not a token id (an integer in "
                                                            "[0, %d))", i, info.n_vocab);
            break;
        }
        ids[i] = (int32_t)json_integer_value(t);
    }
    if (rc == 0 && cv_text_of(srv->model, ids, (int32_t)n, out))
        rc = (oom(e), -1);
    cv_free(ids);
    return rc;
}

char *cv_detokenize_json(const oai_server *srv, const char *body, size_t len, oai_error *e)
{
    json_t *root = cv_oai_load_object(body, len, e);
    if (!root)
        return NULL;
    json_t *tokens = json_object_get(root, "tokens");
    char *res = NULL;
    cv_buf out = {0};
    if (!json_is_array(tokens))
        cv_oai_fail(e, 400, INVALID, NULL, "tokens", "'tokens' must be a list of token ids");
    else if (detokenize(srv, tokens, &out, e) == 0 &&
             !(res = cv_oai_json_text(json_pack("{s:s%}", "content", out.p, out.n))))
        oom(e);
    cv_buf_free(&out);
    json_decref(root);
    return res;
}

char *cv_props_json(const oai_server *srv, const cv_props *p, const convoy_node_costs *nodes)
{
    const convoy_sampling_params d = convoy_sampling_default_params();
    const cv_serve_chat *chat = srv->chat;
    json_t *params = json_pack("{s:I,s:f,s:i,s:f,s:f}", "seed", (json_int_t)p->seed, "temperature", (double)d.temp,
                               "top_k", d.top_k, "top_p", (double)d.top_p, "min_p", (double)d.min_p);
    json_t *list = json_array();
    for (int i = 0; nodes && i < nodes->n_nodes; i++)
        json_array_append_new(list, json_pack("{s:s, s:i}", "node", nodes->node[i].addr, "layers",
                                              nodes->node[i].layers));
    return cv_oai_json_text(json_pack("{s:{s:i,s:o},s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:o}",
                                   "default_generation_settings", "n_ctx", srv->n_ctx, "params", params,
                                   "total_slots", p->n_slot, "model_alias", srv->model_id, "model_path",
                                   p->model_path, "chat_template", chat->source ? chat->source : "",
                                   "chat_template_name", chat->name, "bos_token", chat->bos, "eos_token", chat->eos,
                                   "build_info", p->build_info, "nodes", list));
}
