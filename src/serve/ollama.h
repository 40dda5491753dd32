/* ollama.h: Ollama's API on convoy serve's port, for the clients that
 * speak it (Open WebUI, Continue, editors, the ollama libraries):
 * POST /api/chat and /api/generate, GET /api/tags, /api/ps and
 * /api/version, POST /api/show.
 *
 * Contract: a generation body is read as the OpenAI body it means
 * (cv_ollama_to_openai), so that cv_oai_parse_request checks it as it checks
 * every request: /api/chat becomes a chat (messages, tools, format "json"
 * or a JSON schema, options, think), /api/generate a chat of its system and
 * prompt, or with raw a completion of the prompt as it is. Ollama's stream
 * default (true) holds. options: temperature, top_k, top_p, min_p, seed,
 * num_predict (-1, -2: no limit but the context), stop, repeat_penalty,
 * repeat_last_n, presence_penalty, frequency_penalty; the options of
 * Ollama's runtime (num_ctx, num_gpu, num_thread, ...) and keep_alive
 * have no meaning here and are ignored; images, a generate's template
 * and context are refused by name; a generate's suffix makes the prompt a
 * fill-in-the-middle one (serve/fim.h). think true or false sets the
 * template's enable_thinking, a level ("low", "medium", "high") its
 * reasoning_effort; a thinking block always comes apart as "thinking".
 * A body with no prompt (generate) or no messages (chat) only asks for the
 * model to be loaded: *load_only, answered by cv_ollama_loaded_json.
 *
 * Answers are Ollama's shapes: a streamed answer is one JSON object per
 * line (application/x-ndjson), its text in message.content (chat) or
 * response (generate), its thinking apart, tool calls as objects in
 * message.tool_calls; the last line has done true, done_reason and the
 * counts and durations (nanoseconds). Errors are {"error": MESSAGE}, as a
 * body or as a stream's last line. Texts given must be valid UTF-8. Every
 * *_json returns a NUL-terminated text to free with free, NULL when
 * memory runs out. */
#ifndef CONVOY_SERVE_OLLAMA_H
#define CONVOY_SERVE_OLLAMA_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/extra.h"
#include "serve/oai.h"

typedef enum ollama_kind { OLLAMA_CHAT, OLLAMA_GENERATE } ollama_kind;

/* The OpenAI body for an Ollama one (its kind into *kind); NULL with e
 * filled, or with *load_only set for a body that only loads the model. */
char *cv_ollama_to_openai(ollama_kind k, const char *body, size_t len, oai_kind *kind, bool *load_only, oai_error *e);

/* A generation's counts and times for the last line. */
typedef struct ollama_stats {
    int32_t prompt_tokens;   /* evaluated: the prompt less what the slot's cache held */
    int32_t cached_tokens;   /* what the cache held */
    int32_t eval_tokens;
    double total_s, prompt_s; /* from the request's arrival: to the end, to the first token */
    const char *stop_hit;     /* the stop string that ended the text, or NULL (llama-server's stopping_word) */
} ollama_stats;

/* A streamed line for a chunk of oai.h's: text, thinking, or the first
 * chunk of a tool call (its arguments' chunk gives nothing: NULL with
 * *none set); a chunk with finish is the last line, with st. */
char *cv_ollama_chunk_json(const oai_server *srv, ollama_kind k, const oai_chunk *c, const ollama_stats *st,
                        bool *none);
/* A whole answer. */
char *cv_ollama_answer_json(const oai_server *srv, ollama_kind k, const oai_answer *a, const ollama_stats *st);
/* The answer to a body that only loads the model. */
char *cv_ollama_loaded_json(const oai_server *srv, ollama_kind k);
char *cv_ollama_error_json(const oai_error *e);

/* GET /api/tags (running false) and /api/ps (true): the one model. */
char *cv_ollama_models_json(const oai_server *srv, const cv_props *p, bool running);
/* POST /api/show: the model's details; NULL with e filled. */
char *cv_ollama_show_json(const oai_server *srv, const cv_props *p, const char *body, size_t len, oai_error *e);
char *cv_ollama_version_json(const cv_props *p);

#endif
