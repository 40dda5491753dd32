/* embed.h: the embedding routes of `convoy serve --embeddings`, in the
 * shapes of OpenAI (llama-server's too) and Ollama.
 *
 * Contract: cv_embed_answer reads a body, runs each of its inputs as its
 * own embedding request of the scheduler (sched.h: a cold slot, the
 * prompt pooled; several inputs run in parallel slots, batched like
 * completions) and returns the answer's JSON (free with free):
 *   CV_EMBED_OPENAI (POST /v1/embeddings, /embeddings): "input" a string,
 *     a list of strings, a list of token ids or a list of lists of ids;
 *     "encoding_format" "float" (the default) or "base64" (each vector's
 *     little-endian f32 bytes, as OpenAI's); "model" any name (unless the
 *     server is strict). Answer {"object": "list", "data": [{"object":
 *     "embedding", "index": i, "embedding": [...]}], "model", "usage":
 *     {"prompt_tokens", "total_tokens"}}.
 *   CV_EMBED_OLLAMA (POST /api/embed): "input" a string or a list of
 *     strings. Answer {"model", "embeddings": [[...]], "total_duration",
 *     "load_duration", "prompt_eval_count"} (nanoseconds).
 *   CV_EMBED_OLLAMA_LEGACY (POST /api/embeddings): "prompt" a string.
 *     Answer {"embedding": [...]}.
 * Texts are tokenized with the model's BOS (special tokens parsed), as
 * llama-server does; ids are taken as they are. An empty input (an empty
 * text, list or list of ids), an id outside the vocabulary or an input
 * longer than the context is a 400 naming it. Vectors are the engine's
 * (convoy_embedding: pooled, L2-normalized), floats printed with 9
 * significant digits, which give back the same float32.
 *
 * While it waits, gone(user) is asked every poll_ms: true (the client
 * left) cancels the requests and returns NULL with e->status 0. A submit
 * the scheduler refuses returns NULL with *refused (CV_SUBMIT_FULL, ...)
 * and its reason in e (the caller answers 503); other failures return
 * NULL with e filled. *n_prompt gets the tokens of all inputs. */
#ifndef CONVOY_SERVE_EMBED_H
#define CONVOY_SERVE_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/oai.h"
#include "serve/sched.h"

typedef enum cv_embed_api { CV_EMBED_OPENAI, CV_EMBED_OLLAMA, CV_EMBED_OLLAMA_LEGACY } cv_embed_api;

typedef struct cv_embed_run {
    cv_sched *sched;
    const oai_server *srv;
    uint64_t client;          /* the scheduler's client of the requests */
    bool (*gone)(void *user); /* whether the client left */
    void *user;
    int poll_ms;
} cv_embed_run;

char *cv_embed_answer(const cv_embed_run *run, cv_embed_api api, const char *body, size_t len, int32_t *n_prompt,
                      cv_submit_result *refused, oai_error *e);

#endif
