/* convoy.h: the engine API that the CLI and the HTTP server use.
 *
 * Contract: a convoy_model is a loaded GGUF (weights mapped, vocabulary
 * parsed); a convoy_ctx owns everything inference needs for it: a thread
 * pool, a KV cache of n_slot sequence slots of n_ctx positions, and the
 * buffers of the forward pass, all allocated at creation. convoy_decode
 * runs one batch of tokens from any slots (each slot's tokens continuing
 * its cached length) and writes the logits of the wanted tokens; it
 * allocates nothing. Results are bit-identical whatever the batch
 * composition and thread count. One thread at a time may use a convoy_ctx
 * (the engine is owned by one inference thread); a convoy_model may be
 * shared read-only. Failures return -1 (or NULL) with a message in err.
 *
 * The kernels must be selected first with cv_kernels_init (kernels/kernels.h);
 * the convoy binary does so at start-up.
 *
 * Sampling is part of the API through infer/sampler.h. */
#ifndef CONVOY_H
#define CONVOY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer/sampler.h"

typedef struct convoy_model convoy_model;
typedef struct convoy_ctx convoy_ctx;

typedef struct convoy_model_info {
    char arch[32];
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_layer;
    int32_t n_embd;
    int32_t bos, eos;
    uint64_t bytes_per_token; /* weight bytes read per decoded token */
} convoy_model_info;

convoy_model *convoy_model_load(const char *path, char *err, size_t errlen);
void convoy_model_free(convoy_model *m);
void convoy_model_get_info(const convoy_model *m, convoy_model_info *info);

/* Tokenization as llama.cpp's llama_tokenize (see model/vocab.h). */
int convoy_tokenize(const convoy_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                    int32_t *out, int32_t n_max);
int convoy_token_piece(const convoy_model *m, int32_t id, char *buf, int32_t n);
bool convoy_token_is_eog(const convoy_model *m, int32_t id);

/* The token's text as the vocabulary stores it ("<s>", "<|im_end|>", ...),
 * or NULL outside the vocabulary. */
const char *convoy_token_text(const convoy_model *m, int32_t id);
/* The GGUF's tokenizer.chat_template (NUL-terminated), or NULL. */
const char *convoy_model_chat_template(const convoy_model *m);

/* Streaming detokenizer: each push returns only complete UTF-8. */
typedef struct convoy_detok convoy_detok;
convoy_detok *convoy_detok_create(const convoy_model *m);
int convoy_detok_push(convoy_detok *d, int32_t id, char *out, int32_t n);
int convoy_detok_flush(convoy_detok *d, char *out, int32_t n);
void convoy_detok_free(convoy_detok *d);

typedef struct convoy_ctx_params {
    int32_t n_threads; /* default 1 */
    int32_t n_ctx;     /* positions per slot; 0 = the model's training context */
    int32_t n_slot;    /* sequence slots; default 1 */
    int32_t n_batch;   /* most tokens per convoy_decode; default 512 */
    bool kv_f16;       /* F16 KV cache instead of F32 */
    uint64_t mem_budget; /* bytes this machine may use; 0 = no limit */
    /* A pipeline: "host:port,host:port,..." of `convoy stage` nodes in chain
     * order (NULL = run every layer here). This machine then holds only the
     * embeddings; the nodes hold the layers, the last one samples. */
    const char *nodes;
    const char *split;   /* "a,b,c": layers per node instead of the planner's split */
    const char *wire;    /* activations on the wire: "f32" (default, lossless), "f16" or "q8_0" (lossy) */
    int32_t timeout_ms;  /* a node's answer must come within this; default 30000 */
    bool want_logits;    /* pipelines: return full logits rows (for tests; costs bandwidth) */
} convoy_ctx_params;

convoy_ctx_params convoy_ctx_default_params(void);
convoy_ctx *convoy_ctx_create(convoy_model *m, const convoy_ctx_params *p, char *err, size_t errlen);
void convoy_ctx_free(convoy_ctx *c);
int32_t convoy_ctx_n_ctx(const convoy_ctx *c);
int32_t convoy_ctx_n_batch(const convoy_ctx *c);

typedef struct convoy_batch {
    int32_t n_tokens;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq;
    const uint8_t *want; /* logits wanted for this token */
} convoy_batch;

/* Runs a batch and samples each wanted token with its slot's sampler
 * (greedy until convoy_set_sampler): tokens[i] is the id sampled for the
 * i-th wanted token in batch order. Every token of the batch enters its
 * slot's penalty history. */
int convoy_step(convoy_ctx *c, const convoy_batch *b, int32_t *tokens, char *err, size_t errlen);
/* Micro-batches (DESIGN.md §4): up to convoy_ctx_depth batches in flight
 * (1 on one machine, the number of stages on a pipeline), so that every
 * stage works on a different batch. convoy_submit starts a batch (on one
 * machine it runs it); convoy_collect waits for the oldest batch in flight
 * and writes its sampled ids (*n_tokens, one per wanted token). A slot may
 * be in only one batch in flight. Tokens are the same as with convoy_step. */
int convoy_ctx_depth(const convoy_ctx *c);
int convoy_submit(convoy_ctx *c, const convoy_batch *b, char *err, size_t errlen);
int convoy_collect(convoy_ctx *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen);
/* Logits [n_vocab] of the i-th wanted token of the last step. */
const float *convoy_logits(const convoy_ctx *c, int32_t i);
/* convoy_step, then a copy of the wanted tokens' logits into logits
 * [number of wanted tokens][n_vocab]. */
int convoy_decode(convoy_ctx *c, const convoy_batch *b, float *logits, char *err, size_t errlen);
/* Sampling parameters of a slot (allocates: call at request setup). */
int convoy_set_sampler(convoy_ctx *c, int32_t seq, const cv_sampler_params *p, char *err, size_t errlen);

int32_t convoy_seq_len(const convoy_ctx *c, int32_t seq);
/* Keeps the first len positions of a slot (rollback: no copy). */
int convoy_seq_truncate(convoy_ctx *c, int32_t seq, int32_t len, char *err, size_t errlen);
/* Empties a slot and resets its sampler to greedy. */
int convoy_seq_free(convoy_ctx *c, int32_t seq, char *err, size_t errlen);

#endif
