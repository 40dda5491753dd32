/* extra.h: the routes beside OpenAI's that llama-server's clients use,
 * in llama-server's shapes.
 *
 * Contract: cv_tokenize_json answers a /tokenize body {"content": TEXT,
 * "add_special": false, "parse_special": true, "with_pieces": false} (the
 * defaults shown) with {"tokens": [ID, ...]}, or with with_pieces
 * {"tokens": [{"id": ID, "piece": PIECE}, ...]}, PIECE the token's text as
 * a string when it is valid UTF-8, else its bytes as a list of numbers.
 * cv_detokenize_json answers {"tokens": [ID, ...]} with {"content": TEXT},
 * the tokens' text (an incomplete character at the end becomes U+FFFD);
 * every id must be in the vocabulary. Both check the body completely and
 * on failure return NULL with e filled (400 naming the field, 500 when
 * memory runs out). cv_props_json is /props: {"default_generation_settings":
 * {"n_ctx", "params": {"seed", "temperature", "top_k", "top_p", "min_p"}},
 * "total_slots", "model_alias", "model_path", "chat_template" (the Jinja
 * template in use, "" for a built-in family), "chat_template_name" (which
 * one: the start line's words), "bos_token", "eos_token" (the model's texts
 * of those tokens), "build_info"}; NULL when out of memory.

 * Returned texts are malloc'd JSON (free with free). */
#ifndef CONVOY_SERVE_EXTRA_H
#define CONVOY_SERVE_EXTRA_H

#include <stddef.h>
#include <stdint.h>

#include "serve/oai.h"

typedef struct cv_props {
    int32_t n_slot;
    const char *model_path;
    const char *build_info;
    const char *version; /* convoy's, "0.1.0" */
    int64_t seed; /* the seed of requests that give none; -1: a fresh one each */
} cv_props;

char *cv_tokenize_json(const oai_server *srv, const char *body, size_t len, oai_error *e);
char *cv_detokenize_json(const oai_server *srv, const char *body, size_t len, oai_error *e);
/* llama-server's /props, with "nodes": [{"node", "layers"}] for a pipeline
 * (nodes: the scheduler's figures; none on one machine). */
char *cv_props_json(const oai_server *srv, const cv_props *p, const convoy_node_costs *nodes);

#endif
