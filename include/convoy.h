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
 * shared read-only. The kernels for this CPU are selected when the
 * program starts.
 *
 * Errors: a function that can fail returns -1 (or NULL) and writes one
 * sentence into the caller's buffer err of errlen bytes, always
 * NUL-terminated and cut to fit; CONVOY_ERR_MAX bytes is the size the
 * engine's messages are written for (NULL err discards the message).
 *
 * The sections below (`---- concern ----`) group the API by concern: the
 * inference API first, then the tools that read and write model files.
 *
 * This header includes only standard headers: src/engine/ implements it
 * over the layers below (infer/ for one machine, pipe/ for a chain). */
#ifndef CONVOY_H
#define CONVOY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The size of an error buffer that holds the engine's messages. */
#define CONVOY_ERR_MAX 512

/* ---- models: a GGUF loaded, its facts and identity ---- */

typedef struct convoy_model convoy_model;
typedef struct convoy_ctx convoy_ctx;

typedef struct convoy_model_info {
    char arch[32];
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_embd_kv; /* K (and V) values per position and layer: n_head_kv * head_dim */
    int32_t bos, eos;
    bool add_bos;             /* a prompt starts with BOS */
    /* Fill-in-the-middle tokens (prefix, suffix, middle, repository, file
     * separator), -1 when the model has none. */
    int32_t fim_pre, fim_suf, fim_mid, fim_rep, fim_sep;
    uint64_t bytes_per_token; /* weight bytes read per decoded token */
    uint64_t n_params;        /* the tensors' elements */
    char file_type[16];       /* general.file_type's name as llama.cpp gives it ("Q4_K_M"), or "" */
} convoy_model_info;

convoy_model *convoy_model_load(const char *path, char *err, size_t errlen);
void convoy_model_free(convoy_model *m);
void convoy_model_get_info(const convoy_model *m, convoy_model_info *info);
/* The model's identity for files that hold its tokens: a BLAKE2b-256 of
 * the tokenizer, the hyperparameters and the tensor directory
 * (model/fingerprint.h's meta hash; instant, no weight is read). */
#define CONVOY_MODEL_ID_BYTES 32
int convoy_model_id(const convoy_model *m, uint8_t out[CONVOY_MODEL_ID_BYTES], char *err, size_t errlen);

/* ---- tokens: text to ids and back ---- */

/* Tokenization as llama.cpp's llama_tokenize (see model/vocab.h). */
int convoy_tokenize(const convoy_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                    int32_t *out, int32_t n_max);
/* convoy_tokenize with special tokens parsed, except inside the plain
 * ranges (byte ranges of text, sorted and disjoint): a rendered chat whose
 * message contents must stay text ("<|im_start|>" a user writes is not the
 * control token). */
typedef struct convoy_span {
    size_t off, len;
} convoy_span;
int convoy_tokenize_spans(const convoy_model *m, const char *text, size_t len, bool add_special,
                          const convoy_span *plain, int32_t n_plain, int32_t *out, int32_t n_max);
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

/* ---- contexts: the KV cache's slots over one machine or a pipeline ---- */

typedef struct convoy_ctx_params {
    int32_t n_threads; /* default: the physical cores this process may run on */
    int32_t n_ctx;     /* positions per slot; 0 = the model's training context */
    int32_t n_slot;    /* sequence slots; default 1 */
    int32_t n_batch;   /* most tokens per convoy_decode; default 512 */
    bool kv_f16;       /* F16 KV cache (on every stage of a chain); default true, as llama.cpp; false: F32 */
    bool mlock;        /* this machine's layers' weights locked in memory (never swapped out) */
    uint64_t mem_budget; /* bytes this machine may use; 0 = no limit */
    /* A pipeline: "host:port,host:port,..." of `convoy stage` nodes in chain
     * order (NULL = run every layer here). This machine then holds only the
     * embeddings; the nodes hold the layers, the last one samples. A first
     * node "local" makes this machine the first stage: it runs the first
     * layers itself (planned with mem_budget and its speed like the nodes). */
    const char *nodes;
    const char *split;   /* "a,b,c": layers per node instead of the planner's split */
    const char *wire;    /* activations on the wire: "f32" (default, lossless), "f16" or "q8_0" (lossy) */
    const char *standby; /* "host:port,...": spare nodes that take a failed node's place */
    int32_t failover_wait_ms; /* how long a failover keeps trying before the pipeline is down; default 15000 */
    int32_t timeout_ms;  /* the peer timeout: the longest a node may stay silent (no result, no pulse of
                            a working node, no answer to a PING): it counts silence, not work; default 5000 */
    /* Where the engine reports a pipeline's plan when it opens (which node
     * holds which layers) and failovers (the node, the cause, the new
     * plan); NULL: stderr. */
    void (*log)(void *user, const char *line);
    void *log_user;
    bool want_logits;    /* pipelines: return full logits rows (for tests; costs bandwidth) */
    /* Pipelines: the cluster key file (`convoy keygen`, the same on every
     * stage): links are then authenticated and encrypted. NULL: plaintext,
     * which is refused for a node not on loopback unless insecure. */
    const char *key_file;
    bool insecure;
    /* Pipelines: batches that may be in flight at once; 0 = one per stage.
     * Speculative windows in flight need one per window. At most 16. */
    int32_t depth;
    /* Pipelines: tokens per prompt chunk in convoy_generate, whose chunks go
     * down the chain up to depth at a time (stage 2 runs chunk 1 while
     * stage 1 runs chunk 2; convoy serve too); 0 = chosen (a quarter of a
     * stage's share of the prompt left, 64 to n_batch tokens), -1 = off
     * (n_batch tokens at a time, each through the whole chain before the
     * next). */
    int32_t prefill_chunk;
    /* Pipelines without a split: each stage reports its time of every batch,
     * and when the measured costs drift (a node slows down) so that another
     * plan is predicted faster by 15% for 5 s, the layers move there as a
     * failover would (every slot replayed, output unchanged); a move that
     * measures slower is undone and not tried again for 2 minutes. Default
     * true. */
    bool rebalance;
    /* The embeddings' pooling (convoy_embedding): 0 the model's
     * {arch}.pooling_type (mean when absent), or a CONVOY_POOLING_*. */
    int32_t pooling;
} convoy_ctx_params;

/* llama.cpp's pooling_type values. */
enum { CONVOY_POOLING_NONE = 0, CONVOY_POOLING_MEAN = 1, CONVOY_POOLING_CLS = 2, CONVOY_POOLING_LAST = 3 };

convoy_ctx_params convoy_ctx_default_params(void);
convoy_ctx *convoy_ctx_create(convoy_model *m, const convoy_ctx_params *p, char *err, size_t errlen);
void convoy_ctx_free(convoy_ctx *c);
int32_t convoy_ctx_n_ctx(const convoy_ctx *c);
int32_t convoy_ctx_n_slot(const convoy_ctx *c);
int32_t convoy_ctx_n_batch(const convoy_ctx *c);
/* The tokens of the next prompt chunk when n_left prompt tokens remain
 * (convoy_ctx_params.prefill_chunk), and how many of a sequence's chunks
 * may be in flight: the context's depth, 1 with chunking off. */
int32_t convoy_ctx_prefill_chunk(const convoy_ctx *c, int32_t n_left);
int convoy_ctx_prefill_depth(const convoy_ctx *c);

/* Failover. The head keeps every slot's tokens and sampler (with the draws
 * it made). When a node dies, refuses or stays silent past the peer
 * timeout, the call that saw it closes the chain at once (releasing the
 * other nodes), opens a new one over the nodes that answer (a standby in
 * the failed node's place, the node itself when it is back, or the
 * survivors when their budgets hold the model; tries are repeated for up to
 * failover_wait_ms), replays every slot into it and runs the call again: the caller sees a slower call, and the ids
 * that follow are those the failed chain would have given, greedy or
 * sampled. When no chain can be opened the pipeline is down: steps,
 * submits, collects and convoy_set_sampler fail naming the failure, the
 * batches in flight are lost, freeing or cutting a slot is noted.
 * convoy_ctx_reconnect then tries again (the same way, every node asked):
 * 0 when the pipeline is up (at once if it was), -1 with the reason, e.g.
 * the node it cannot reach. It may take up to the handshake's timeout; the
 * caller chooses when to try. One machine is never down. */
bool convoy_ctx_is_down(const convoy_ctx *c);
/* True while a failover is at work (a node failed; no chain serves until a
 * new one is replayed, or the pipeline goes down). Unlike the other calls
 * on a context, any thread may ask it at any time. */
bool convoy_ctx_failing_over(convoy_ctx *c);
int convoy_ctx_reconnect(convoy_ctx *c, char *err, size_t errlen);
/* An idle pipeline's health check, with no batch in flight: every node must
 * answer within the timeout, else the pipeline goes down (-1, naming the
 * node). 0 on one machine. */
int convoy_ctx_check(convoy_ctx *c, char *err, size_t errlen);

typedef struct convoy_ctx_stats {
    uint64_t failovers;       /* chains replaced after a failure, every slot replayed */
    double failover_seconds;  /* their pauses in all: closing, re-planning, replaying */
    uint64_t replayed_tokens; /* tokens prefilled again by failovers and moves */
    uint64_t rebalances;      /* layers moved while serving because the measured costs drifted */
    uint64_t rebalances_undone; /* of them, moves back after a move that measured slower */
    double rebalance_seconds; /* their pauses in all */
} convoy_ctx_stats;
void convoy_ctx_get_stats(const convoy_ctx *c, convoy_ctx_stats *out);

/* A pipeline's nodes as the serving chain measures them: each stage times
 * every batch it runs (decayed means, a sample's weight halving every 2 s),
 * in microseconds per layer and token, beside the speed the node probed
 * when the chain opened. */
#define CONVOY_MAX_NODES 16
typedef struct convoy_node_costs {
    int n_nodes;                       /* 0 on one machine or while the pipeline is down */
    struct {
        char addr[256];                /* "host:port", or "local" */
        int32_t layers;                /* 0: left out */
        double us_measured;            /* 0: nothing measured yet */
        double us_probed;              /* 0: not measured */
        uint64_t mem_budget;           /* bytes, as it answered the plan's query */
        double us_last;                /* the last batch's time on its stage (not per token); 0: none */
        double work;                   /* its layers' work per token in mean layers (by bytes); 0: none */
    } node[CONVOY_MAX_NODES];
    double us_hop;                     /* one hop's mean time, from batches alone in flight; 0: none yet */
    double us_last_round_trip;         /* the last batch's round trip when it was alone in flight, else 0 */
} convoy_node_costs;
void convoy_ctx_get_node_costs(const convoy_ctx *c, convoy_node_costs *out);

/* ---- fleets: a model's speed on machines, measured or forecast ---- */

#define CONVOY_FLEET_ROWS 5

/* An AVX2 core's multiply-adds per second in batched quantized products
 * (GFLOP/s): one EPYC core measures 300 to 600 (`convoy plan --nodes`). */
#define CONVOY_FLEET_GFLOPS_PER_CORE 250

/* Fleets (`convoy plan`, engine/forecast.c): a model's predicted speed on
 * machines in chain order, from each one's costs (measured on a live chain
 * by convoy_fleet_measure, or stated), by a simulation of the pipeline
 * (pipe/simulate.h): the plan the planner would make, tokens per second
 * per user and in all, time to first token, and each node's busy time. */
struct convoy_synth_params;
typedef struct convoy_fleet_node {
    char name[64];
    uint64_t mem_budget;   /* bytes */
    /* measured (0: from the stated figures below) */
    double us_layer;       /* microseconds per mean layer for a batch of one row (decode) */
    double us_row;         /* what each further row of a batch adds (a line through the sizes measured) */
    double us_rows[CONVOY_FLEET_ROWS]; /* per mean layer at 1, 2, 4, 8 and 16 rows; 0: the line */
    double us_pos;         /* what each position of context a row attends to adds, per layer */
    double hop_us;         /* the link into this node: its latency, */
    double hop_us_per_row; /* and one row's activations over its bandwidth */
    /* stated: the weights' bytes it reads per second (GB/s), the multiply-adds
     * it does (GFLOP/s; 0: CONVOY_FLEET_GFLOPS_PER_CORE for each of its
     * cores), the link's round trip (ms) and bandwidth (Mbit/s) */
    double gb_s, gflop_s, rtt_ms, mbit_s;
    int cores;
    int cpu;               /* nodes with the same cpu > 0 share one CPU (take turns); 0: its own */
} convoy_fleet_node;

typedef struct convoy_fleet {
    int n_nodes;
    convoy_fleet_node node[CONVOY_MAX_NODES];
    double back_us, back_us_per_row; /* the last node's link back to the head (measured) */
    double back_rtt_ms, back_mbit_s; /* (stated; 0: the last node's link's) */
} convoy_fleet;

/* The measured nodes' figures in the stated units for the model (m, or
 * shape as in convoy_forecast_run): GB/s and GFLOP/s, one per node of f
 * (0 where not measured). */
void convoy_fleet_rates(const convoy_model *m, const struct convoy_synth_params *shape, const convoy_fleet *f,
                        double *gb_s, double *gflop_s);

/* Calibrates the fleet of c's pipeline (2 s): batches of 1 to 16 rows,
 * each alone in flight, give each stage's us_layer and us_row (a
 * least-squares line through the means of its times per mean layer), a
 * row far into the context its us_pos, and the hops' costs (the round
 * trip less the stages', shared by the hops). A node without layers counts
 * at its probe. Uses slot 0 and leaves it empty. */
int convoy_fleet_measure(convoy_ctx *c, convoy_fleet *out, char *err, size_t errlen);

typedef struct convoy_forecast_params {
    int32_t users;   /* streams at once (one slot each) */
    int32_t spec_k;  /* drafts per verify window; 0: no speculation */
    int32_t windows; /* windows in flight per user (a pipeline speculating); default 1 */
    double accept;   /* a draft's acceptance rate */
    double drafts;   /* the drafts a window carries on average (K, or none where the drafter finds
                        nothing); 0: spec_k */
    int32_t tokens;  /* tokens each user decodes; default 128 */
    int32_t prompt;  /* a prompt's tokens for the time to first token; 0: none */
    int32_t n_ctx;   /* positions per slot (KV cache in the memory plan); default 4096 */
    int32_t n_batch; /* default 512 */
    bool kv_f16;
    const char *split; /* "a,b,c": layers per node instead of the planner's */
} convoy_forecast_params;

typedef struct convoy_forecast {
    int32_t first[CONVOY_MAX_NODES], last[CONVOY_MAX_NODES]; /* each node's layers [first, last) */
    double tok_s;      /* all users' decoded tokens per second */
    double tok_s_user;
    double ttft_s;     /* the prompt's time to first token, alone; 0 without one */
    double busy[CONVOY_MAX_NODES]; /* each node's busy fraction while decoding */
    int busiest;       /* the node busy longest */
} convoy_forecast;

/* The model is m's file, or (m NULL) a dense Llama of shape's dims with
 * its matrices of shape->type (the output matrix too): a model not at hand. */
int convoy_forecast_run(const convoy_model *m, const struct convoy_synth_params *shape, const convoy_fleet *f,
                        const convoy_forecast_params *p, convoy_forecast *out, char *err, size_t errlen);

/* ---- sampling: a slot's parameters ---- */

/* A slot's sampling, llama.cpp's default chain: repetition / frequency /
 * presence penalties, top-k, top-p, min-p, temperature, then a draw with
 * the slot's RNG (64-bit PCG from seed); temp 0 is greedy (argmax, ties to
 * the lowest id). */
typedef struct convoy_logit_bias {
    int32_t id;
    float bias; /* added to the id's logit; -INFINITY bans it */
} convoy_logit_bias;

#define CONVOY_MAX_LOGIT_BIAS 4096

typedef struct convoy_sampling_params {
    float temp;             /* 0 = greedy */
    int32_t top_k;          /* 0 = off */
    float top_p;            /* 1 = off */
    float min_p;            /* 0 = off */
    float repeat_penalty;   /* 1 = off */
    int32_t penalty_last_n; /* ids of history the penalties see: 0 none; -1, or more than n_ctx, all */
    float freq_penalty;
    float presence_penalty;
    uint64_t seed;
    /* Log-probabilities for convoy_logprobs: -1 none; else the sampled id's
     * and n_logprobs alternatives (up to CONVOY_MAX_TOP_LOGPROBS). */
    int32_t n_logprobs;
    /* Logit bias (OpenAI's logit_bias): up to CONVOY_MAX_LOGIT_BIAS ids
     * whose logits are moved before penalties and sampling (not in
     * log-probabilities); convoy_set_sampler copies them. */
    const convoy_logit_bias *logit_bias;
    int32_t n_logit_bias;
} convoy_sampling_params;

#define CONVOY_MAX_TOP_LOGPROBS 20

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off (last 64),
 * seed 0, no logprobs: llama.cpp's defaults. */
convoy_sampling_params convoy_sampling_default_params(void);

/* ---- steps: batches, their outputs, the slots' samplers, grammars and lengths ---- */

enum {
    CONVOY_WANT_NONE = 0,
    CONVOY_WANT_SAMPLE = 1,
    CONVOY_WANT_DRAFT = 2,
    CONVOY_WANT_POOL = 3,
    CONVOY_WANT_EMBED = 4,
};

typedef struct convoy_batch {
    int32_t n_tokens;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq;
    /* CONVOY_WANT_NONE: no output; _SAMPLE: sample this token's output;
     * _DRAFT: this token is a draft (speculation): a guess of what the
     * slot's previous token in the batch, wanted and one position before,
     * samples; _POOL: add this token's final hidden state (after the
     * output norm; no logits, no sampling) to its slot's pool; _EMBED: the
     * same, and output the slot's embedding (convoy_embedding). */
    const uint8_t *want;
} convoy_batch;

/* Runs a batch and samples each wanted token with its slot's sampler
 * (greedy until convoy_set_sampler): tokens[i] is the id sampled for the
 * i-th wanted token in batch order. Every token of the batch enters its
 * slot's penalty history.
 *
 * Drafts: the output of a token that a draft follows is sampled as without
 * the draft, and the draft accepted when it is that id (for a
 * deterministic drafter this is the rejection rule). From the first
 * rejected draft on, the slot's wanted tokens give -1 (and logits of
 * zeros) and the slot is cut back after the last emitted one, here and,
 * with the next batch, on every node: a slot with drafts continues at
 * convoy_seq_len. Accepted drafts
 * plus the token emitted at the first rejection (or after the last draft)
 * are exactly the tokens plain decoding would give, one step each, at any
 * temperature (each emitted token takes one draw of the slot's RNG).
 *
 * Windows in flight: a slot's first token in a batch may be a draft too,
 * of the id its last wanted row (in an earlier batch, one position
 * before) gave: a window sent before that result came back. A wrong guess
 * emits -1 from its row on. When the slot was cut back meanwhile (an
 * earlier window's draft rejected), the window starts past the slot's
 * length: it is stale, and every wanted row of it gives -1, draws nothing
 * and changes nothing. */
int convoy_step(convoy_ctx *c, const convoy_batch *b, int32_t *tokens, char *err, size_t errlen);
/* Micro-batches (docs/DESIGN.md §9.2): up to convoy_ctx_depth batches in flight
 * (1 on one machine, the number of stages on a pipeline), so that every
 * stage works on a different batch. convoy_submit starts a batch (on one
 * machine it runs it); convoy_collect waits for the oldest batch in flight
 * and writes its sampled ids (*n_tokens, one per wanted token). A slot may
 * be in several batches in flight only as windows (above): each later one
 * opening with a draft. Tokens are the same as with convoy_step. */
int convoy_ctx_depth(const convoy_ctx *c);
/* The machines a batch passes: a pipeline's stages (the head's own layers
 * included), 1 on one machine or while the pipeline is down. */
int convoy_ctx_stages(const convoy_ctx *c);
/* Seconds a token of a batch takes at a pipeline's slowest stage, from the
 * stages' speed probes (decode's cost: an upper bound); 0 on one machine. */
double convoy_ctx_stage_seconds(const convoy_ctx *c);
int convoy_submit(convoy_ctx *c, const convoy_batch *b, char *err, size_t errlen);
int convoy_collect(convoy_ctx *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen);
/* Whether the last convoy_collect waited for its batch's result (on a
 * pipeline: it had not come back when the collect was called). Then the
 * time from the submit to the collect's return is the batch's round trip;
 * else it also holds the caller's delay in collecting. */
bool convoy_collect_waited(const convoy_ctx *c);
/* Embeddings. A slot's pool holds the final hidden states of its rows
 * with want _POOL or _EMBED, added in position order (so the same bits
 * however the sequence is cut into batches, on one machine or on a chain,
 * where the last stage pools): mean pooling sums them in float and divides
 * by their number, CLS keeps the row at position 0, last the latest. A
 * row at position 0 starts the pool anew; truncating the slot below the
 * rows pooled (a rollback included) or freeing it empties the pool. An
 * _EMBED row is a wanted token: its id is -1 (no token; its logits are
 * zeros) and convoy_embedding gives the slot's embedding, the pool
 * L2-normalized (n_embd floats, llama.cpp's normalization: the norm
 * summed in double), until the next step or collect; NULL for another
 * wanted token. A context whose pooling is none refuses pooled rows. */
const float *convoy_embedding(const convoy_ctx *c, int32_t i);
/* The context's pooling type: CONVOY_POOLING_* (convoy_ctx_params.pooling,
 * else the model's {arch}.pooling_type, mean when the file has none). */
int32_t convoy_ctx_pooling(const convoy_ctx *c);

/* Logits [n_vocab] of the i-th wanted token of the last step. */
const float *convoy_logits(const convoy_ctx *c, int32_t i);
/* convoy_step, then a copy of the wanted tokens' logits into logits
 * [number of wanted tokens][n_vocab]. */
int convoy_decode(convoy_ctx *c, const convoy_batch *b, float *logits, char *err, size_t errlen);
/* Sampling parameters of a slot (allocates: call at request setup). */
int convoy_set_sampler(convoy_ctx *c, int32_t seq, const convoy_sampling_params *p, char *err, size_t errlen);
/* Constrained output: after convoy_set_sampler, holds the slot's tokens at
 * positions >= from (the first generated one, at least the slot's length)
 * to a GBNF grammar (llama.cpp's grammar language, root rule `root`): each
 * sampled token is one whose text the grammar allows next, or an
 * end-of-generation token once the grammar may end. The stage that samples
 * applies it, so one machine and a pipeline give the same ids. Until the
 * slot's sampler is set again or the slot is freed. convoy_grammar_check
 * parses a grammar alone (the same errors, naming the line). A grammar has
 * at most CONVOY_GRAMMAR_TEXT_MAX bytes. */
#define CONVOY_GRAMMAR_TEXT_MAX 65520u
int convoy_grammar_check(const char *text, size_t len, char *err, size_t errlen);
int convoy_set_grammar(convoy_ctx *c, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                       size_t errlen);

/* The log-probabilities of the i-th wanted token of the last step or
 * collect, for a slot whose sampler asked for them (n_logprobs >= 0):
 * out[0] is the sampled id's, out[1 .. n_logprobs] the most likely ids,
 * most likely first, ties to the lower id (log-softmax of the raw logits,
 * before penalties and temperature). The same bits on one machine and on a
 * chain, where the last stage computes them. Returns the entries written
 * (1 + n_logprobs), 0 for a row that emitted no token (after a rejected
 * draft) or whose slot asked for none. out holds 1 + CONVOY_MAX_TOP_LOGPROBS. */
typedef struct convoy_logprob {
    int32_t id;
    float logprob;
} convoy_logprob;
int convoy_logprobs(const convoy_ctx *c, int32_t i, convoy_logprob *out);

int32_t convoy_seq_len(const convoy_ctx *c, int32_t seq);
/* Keeps the first len positions of a slot (rollback: no copy). These two
 * fail, naming it, on a slot outside [0, n_slot). */
int convoy_seq_truncate(convoy_ctx *c, int32_t seq, int32_t len, char *err, size_t errlen);
/* Empties a slot and resets its sampler to greedy. */
int convoy_seq_free(convoy_ctx *c, int32_t seq, char *err, size_t errlen);
/* Empties slot dst, then gives it the first len positions of slot src (at
 * most src's length), as src computed them: their KV copied on every stage
 * of a chain, so dst continues with the very bits src would (a prompt
 * cache). Neither slot may be in a batch in flight. */
int convoy_seq_copy(convoy_ctx *c, int32_t src, int32_t dst, int32_t len, char *err, size_t errlen);

/* ---- speculative decoding ---- */

/* Speculative decoding (docs/DESIGN.md §11). A convoy_spec proposes drafts for
 * slots of a context from a drafter at the head: "ngram" (the continuation
 * of the latest earlier occurrence of the last tokens) or a GGUF draft
 * model with the target's vocabulary, run greedily on this machine. K, the
 * drafts per round, is fixed (k > 0) or chosen per slot from its measured
 * acceptance and the measured cost of a round (k = 0). A round: propose,
 * submit the slot's newest token (want 1) followed by its drafts (want 2),
 * collect, count the accepted drafts (the leading outputs equal to the
 * drafts), observe. */
typedef struct convoy_spec convoy_spec;

/* The most drafts a round may carry (--spec-k, --spec-k-max): bounds the
 * per-round buffer of convoy_generate. */
#define CONVOY_SPEC_K_LIMIT 63

typedef struct convoy_spec_params {
    const char *draft; /* "ngram" or the path of a draft GGUF */
    int32_t k;         /* drafts per round; 0 = chosen automatically */
    int32_t k_max;     /* most drafts per round (default 16) */
    int32_t n_threads; /* threads of the draft model */
    int32_t windows;   /* windows in flight per sequence on a pipeline; 0 = chosen (default; convoy_generate) */
} convoy_spec_params;

/* The most windows one sequence keeps in flight. */
#define CONVOY_SPEC_WINDOWS_MAX 16

typedef struct convoy_spec_req {
    int32_t seq;
    const int32_t *hist; /* the slot's whole history; the last id is the newest, not yet run */
    int32_t n_hist;
    int32_t max_draft;   /* most drafts the caller can use (tokens left, batch room); 0: none */
    int32_t *drafts;     /* [k_max]: the proposal */
    int32_t n_draft;     /* written: 0 .. K */
} convoy_spec_req;

typedef struct convoy_spec_stats {
    uint64_t rounds, drafted, accepted;
} convoy_spec_stats;

convoy_spec_params convoy_spec_default_params(void);
convoy_spec *convoy_spec_create(convoy_ctx *c, const convoy_model *m, const convoy_spec_params *p, char *err,
                                size_t errlen);
void convoy_spec_free(convoy_spec *s);
int32_t convoy_spec_k_max(const convoy_spec *s); /* the size a request's drafts array needs */
/* Windows in flight for seq's next window: the fixed number, else the
 * count that maximizes the expected tokens per second, from the sequence's
 * acceptance, the K it last drafted, the windows' measured latency and the
 * head's time per window (convoy_spec_collected), the drafter's
 * measured time per draft and stage_s, the seconds a token takes at the
 * slowest stage (a window cut short makes the ones behind it stale;
 * windows beyond what the round trip hides only queue), at most max; where
 * the round trip hides only a few windows' work, the tokens per second
 * measured with one window and with that count choose between them. */
int32_t convoy_spec_windows(convoy_spec *s, int32_t seq, double stage_s, int32_t max);
const char *convoy_spec_drafter(const convoy_spec *s); /* "ngram" or "model" */
/* Proposes for n requests of distinct slots at once (a draft model runs
 * them as one batch). */
int convoy_spec_propose(convoy_spec *s, convoy_spec_req *reqs, int32_t n, char *err, size_t errlen);
/* A round of seq ended: n_draft drafts sent (0 counts too: a plain round
 * measures the fixed cost), n_accepted accepted, round_s seconds from the
 * proposal to the result. */
void convoy_spec_observe(convoy_spec *s, int32_t seq, int32_t n_draft, int32_t n_accepted, double round_s);
/* The head's timing of its windows, for their depth. convoy_spec_sent: a
 * batch went down the chain. convoy_spec_collected: the oldest came back;
 * its collect was called at t_call, returned at t_return, and waited for
 * it or not (convoy_collect_waited); sent_at is its submit time, or
 * negative when its time would not measure a window's (a prompt chunk rode
 * with it). The spec keeps from these a window's latency (submit to
 * result, when waited for) and the head's own seconds per batch outside
 * waiting (drafting, submitting, collecting), which bounds how often
 * windows go out. convoy_spec_idle: nothing is in flight and the head may
 * wait for work, which is not busy time. */
void convoy_spec_sent(convoy_spec *s);
void convoy_spec_collected(convoy_spec *s, double sent_at, double t_call, double t_return, bool waited);
void convoy_spec_idle(convoy_spec *s);
void convoy_spec_seq_free(convoy_spec *s, int32_t seq);
void convoy_spec_get_stats(const convoy_spec *s, convoy_spec_stats *out);

/* ---- generation ---- */

/* Generation of one sequence: the prompt hist[0..n_hist) (after what slot
 * seq holds already), then up to n_predict tokens, sampled with the slot's
 * sampler, speculatively when spec is not NULL. Each token is appended to
 * hist (room for n_hist + n_predict ids) and handed to on_token, which
 * returns nonzero to stop there. Allocates its batch buffers per call.
 * On a pipeline, a spec with windows > 1 keeps that many verify windows of
 * the sequence in flight (at most the context's depth): each drafted as if
 * the ones before it were accepted whole, its first row a draft of what
 * the previous window's last row samples (convoy_step's drafts across
 * batches); a window cut short makes the later ones stale, and they are
 * dropped. The tokens are plain decoding's at any number of windows. */
typedef int (*convoy_token_fn)(void *user, int32_t id);

typedef struct convoy_gen_stats {
    int32_t n_gen;             /* tokens generated */
    int32_t rounds;            /* decode steps (speculative windows verified) after the prompt */
    int32_t windows, stale;    /* windows sent; of them dropped as stale (an earlier one was cut) */
    int64_t drafted, accepted; /* drafts sent and accepted */
    double prefill_s, decode_s;
} convoy_gen_stats;

int convoy_generate(convoy_ctx *c, convoy_spec *spec, int32_t seq, int32_t *hist, int32_t n_hist, int32_t n_predict,
                    convoy_token_fn on_token, void *user, convoy_gen_stats *st, char *err, size_t errlen);

/* ---- model files: info, quantize, synth, pack, split (src/engine/files.c) ----
 * These work on GGUF files without loading a model for inference. Type
 * names are GGML's ("F32", "Q8_0", "Q4_K", ...). n_threads 0 means one
 * thread per CPU; the files written do not depend on the thread count. */

/* Writes `convoy info`'s report of a GGUF to out: the header, the
 * hyperparameters, the tokenizer, the tensor table (absolute file offsets,
 * so that tools can cut a tensor's bytes out), sizes, a shard's layers
 * and the fingerprint, one "key: value" per line. Nothing is written when the file is invalid. */
int convoy_file_report(const char *path, FILE *out, char *err, size_t errlen);

typedef struct convoy_file_stats {
    uint64_t n_tensors;
    int64_t n_params;
    uint64_t bytes;       /* the file's size */
    uint64_t fingerprint; /* the model's shape: architecture keys and tensor directory, not weights */
} convoy_file_stats;

int convoy_file_get_stats(const char *path, convoy_file_stats *st, char *err, size_t errlen);

/* What happened to one tensor of a file being written. */
typedef struct convoy_tensor_note {
    int32_t index, count; /* 0-based position in the output, and its number of tensors */
    const char *name;
    uint32_t n_dims;
    const int64_t *ne;
    const char *shape;     /* "[ne0, ne1, ...]" as `convoy info` prints it */
    const char *src_type;  /* the input's type (synth: F32, the generated values) */
    const char *want_type; /* the type asked for */
    const char *type;      /* the type written: another than want_type when the rows do not fit its blocks */
    uint64_t src_bytes, bytes;
} convoy_tensor_note;

typedef void (*convoy_tensor_note_fn)(void *user, const convoy_tensor_note *note);

/* True for a TYPE that quantize and synth take: F32 F16 BF16 Q8_0 Q4_0
 * Q4_K Q5_K Q6_K, Q4_K_S / Q5_K_S (= Q4_K / Q5_K), and llama.cpp's mixes
 * Q4_K_M / Q5_K_M; any case. */
bool convoy_quant_type_known(const char *name);
/* True for a tensor type name (quantize's output type). */
bool convoy_tensor_type_known(const char *name);

/* Converts the weight matrices of GGUF in to `type` (output.weight to
 * output_type; NULL: as `type` says) into a new file out; norms and other
 * 1-D tensors are copied. note (may be NULL) hears of every tensor. */
int convoy_quantize_file(const char *in, const char *out, const char *type, const char *output_type,
                         int32_t n_threads, convoy_tensor_note_fn note, void *user, char *err, size_t errlen);

/* Sizes of a packed GGUF (codec/pack.h): the GGUF's bytes, the packed
 * file's, and its segments (of at most 1 MiB of the GGUF each). */
typedef struct convoy_pack_stats {
    uint64_t file_bytes, packed_bytes, n_segments;
} convoy_pack_stats;

/* Writes GGUF in as a packed file out: every tensor's data losslessly
 * coded (convoy's rANS over byte planes and scale/quant streams), the
 * other bytes as they are. st may be NULL. */
int convoy_pack_file(const char *in, const char *out, convoy_pack_stats *st, char *err, size_t errlen);
/* Gives back the packed file in's GGUF, byte for byte, as out; a malformed
 * packed file is refused (and out removed). st may be NULL. */
int convoy_unpack_file(const char *in, const char *out, convoy_pack_stats *st, char *err, size_t errlen);

/* A deterministic pseudo-random Llama model (see model/synth.h): the same
 * bytes on every machine for the same parameters. */
typedef struct convoy_synth_params {
    const char *name; /* general.name; NULL: "convoy-synth" */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab;
    int64_t n_ctx;
    float rope_theta;
    float output_scale; /* the output matrix's scale against the others' */
    bool tied;          /* no output.weight: the output reuses token_embd */
    bool chatml;        /* a ChatML model: <|im_start|> and <|im_end|> (the EOS) control tokens, ChatML template */
    bool fim;           /* fill-in-the-middle tokens <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> */
    bool tool_marker;   /* Mistral's tool-call marker [TOOL_CALLS] as a control token */
    int64_t n_swa;      /* a Gemma's or gpt-oss's sliding window (> 0; shapes gemma2-mini, gemma3-mini,
                         * gpt-oss-mini); else 0 */
    const char *arch;   /* general.architecture: NULL or "llama", "gemma2", "gemma3", "phi3",
                         * "qwen2moe", "qwen3moe", "gpt-oss" */
    int64_t head_dim;   /* attention heads' size; 0: n_embd / n_head */
    int64_t n_expert, n_expert_used; /* a mixture of experts when n_expert > 0 (see model/synth.h) */
    int64_t n_ff_exp, n_ff_shexp;    /* an expert's hidden size (qwen*moe; Mixtral's is n_ff), the shared one's */
    int64_t n_ctx_orig; /* a phi3's or gpt-oss's original context, 1..n_ctx (shape phi3-mini: 256); others: 0 */
    uint64_t seed;
    const char *type;   /* the matrices' TYPE, as quantize takes it */
    int32_t n_threads;
} convoy_synth_params;

/* ctx 2048, rope theta 10000, output scale 1, untied, seed 1234, F32, one
 * thread per CPU; dims 0 (set them, or a shape's with convoy_synth_set_shape). */
convoy_synth_params convoy_synth_default_params(void);
/* Sets the dims, ctx, rope theta, output scale, arch and window of a named shape. */
int convoy_synth_set_shape(convoy_synth_params *p, const char *shape, char *err, size_t errlen);
/* Name of shape i, NULL past the last. */
const char *convoy_synth_shape_name(int32_t i);
/* Checks the parameters and writes the model to out; note (may be NULL)
 * hears of every tensor once it is generated. */
int convoy_synth_file(const convoy_synth_params *p, const char *out, convoy_tensor_note_fn note, void *user,
                      char *err, size_t errlen);

/* What convoy_split_file tells of each shard it wrote: shard k (from 0)
 * of n, its path, its layers [first, last), tensors and bytes. */
typedef void (*convoy_shard_note_fn)(void *user, int32_t k, int32_t n, const char *path, int32_t first, int32_t last,
                                     uint64_t n_tensors, uint64_t bytes);

/* Cuts the whole model at `in` into n per-stage files in dir (see
 * src/model/shard.h): shard k holds layers counts[k] (each >= 1, in order,
 * summing to the model's layers), or, with counts NULL, n shares as equal
 * as they go (the first ones one layer more). Each carries the whole
 * model's key/values and metadata hash and its layer range; `convoy stage
 * -m SHARD` serves from one. note (may be NULL) hears of every shard. */
int convoy_split_file(const char *in, const char *dir, int32_t n, const int32_t *counts, convoy_shard_note_fn note,
                      void *user, char *err, size_t errlen);

#endif
