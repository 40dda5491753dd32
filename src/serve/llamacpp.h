/* llamacpp.h: llama-server's own generation routes, POST /completion and
 * POST /infill, for the editors and scripts written against them
 * (llama.vim, llama.vscode, and llama-server's own examples).
 *
 * Contract: a body is read as the /v1/completions body it means
 * (cv_llamacpp_to_openai), so cv_oai_parse_request checks it as every request:
 * n_predict becomes max_tokens (a negative one: up to the context), the
 * sampling members, stop, seed, stream (default false), ignore_eos,
 * logit_bias, grammar, json_schema, cache_prompt and id_slot keep their
 * names; n_probs is refused by name (/v1/completions' logprobs give them).
 * /infill builds a fill-in-the-middle prompt (serve/fim.h) of input_prefix,
 * input_suffix, input_extra ([{filename, text}]) and prompt (the start of
 * the middle); a model without FIM tokens is a 400 saying so.
 *
 * Answers are llama-server's shapes: {"content", "stop": true,
 * "stop_type" ("eos", "limit", or "word" for a stop string, which
 * "stopping_word" names), "model", "tokens_predicted",
 * "tokens_evaluated", "tokens_cached", "timings"}; streamed, one event of
 * {"content", "stop": false} per text chunk and the whole figures with the
 * last, without OpenAI's [DONE]. Each *_json returns a text to free with
 * free, NULL when memory runs out. */
#ifndef CONVOY_SERVE_LLAMACPP_H
#define CONVOY_SERVE_LLAMACPP_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/oai.h"
#include "serve/ollama.h"

/* The /v1/completions body for a /completion (infill false) or /infill
 * body; NULL with e filled. */
char *cv_llamacpp_to_openai(const oai_server *srv, bool infill, const char *body, size_t len, oai_error *e);
/* A streamed event's JSON for a chunk (usage-only chunks give nothing: NULL with *none). */
char *cv_llamacpp_chunk_json(const oai_server *srv, const oai_chunk *c, const ollama_stats *st, bool *none);
char *cv_llamacpp_answer_json(const oai_server *srv, const oai_answer *a, const ollama_stats *st);

#endif
