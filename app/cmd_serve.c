/* cmd_serve.c: `convoy serve`: the OpenAI-compatible HTTP server. Reads
 * the API keys and the CORS policy, loads the model, creates the engine
 * context (local, or a pipeline over --nodes) with one sequence slot per
 * concurrent request, hands it to the scheduler (serve/sched.h), with
 * --draft a convoy_spec that makes every decoding request speculate, and
 * serves HTTP (serve/http.h) until SIGINT or SIGTERM. The signals are
 * blocked in every thread and taken by the main thread with sigwait, so
 * shutdown runs in plain code: the server drains (streams end with an
 * error event and [DONE]), then everything is freed. llama-server's
 * common options mean here what they mean there (-c is the context of all
 * slots together, -np the slots, -s the seed of requests without one); its
 * -f (a prompt file) is llama-cli's, which llama-server refuses too. Lines
 * after the options go through serve/log.h (timestamps, levels). */
#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"
#include "commands.h"
#include "hub.h"
#include "convoy.h"
#include "chat/template.h"
#include "serve/access.h"
#include "serve/http.h"
#include "serve/log.h"
#include "serve/render.h"
#include "serve/sched.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: convoy serve (-m MODEL | -hf OWNER/REPO[:QUANT]) [--host ADDR] [--port N]\n"
            "                    [-np|--parallel|--slots N] [-c|--ctx-size N | --ctx N] [-b|--batch-size N] [-t N]\n"
            "                    [-s|--seed N] [--queue N]\n"
            "                    [-a|--alias NAME] [--strict-model] [--api-key KEY[,KEY...]] [--api-key-file FILE]\n"
            "                    [--ssl-key-file FILE --ssl-cert-file FILE] [--no-webui] [--embeddings]\n"
            "                    [--pooling mean|cls|last]\n"
            "                    [--cors ORIGINS|*|none] [--client-slots N] [--client-connections N]\n"
            "                    [--chat-template NAME] [--reasoning-format none|deepseek] [--max-body BYTES]\n"
            "                    [--no-cache-prompt] [--cache-ram BYTES]\n"
            "                    [--slot-save-path DIR] [--timeout SECONDS] [--template-mem BYTES]\n"
            "                    [-v|--verbose] [--version] [--kv-type|-ctk|-ctv f32|f16] [--mem BYTES] [--mlock]\n"
            "                    [--draft ngram|PATH [--spec-k K] [--spec-k-max K] [--spec-windows D]]\n"
            "                    [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0] [--prefill-chunk N]\n"
            "                     [--peer-timeout MS] [--standby HOST:PORT,...] [--failover-wait MS] [--key FILE] [--insecure]\n"
            "                     [--no-rebalance]]\n"
            "  --host 127.0.0.1, --port 8080 (0: any free port, printed); -np/--parallel/--slots 4 requests run at\n"
            "  once (--slots is this count, not llama-server's /slots switch), --queue 64 more may wait (then 503);\n"
            "  -c/--ctx-size N: the context of all slots together, each gets N / slots tokens (as llama-server);\n"
            "  --ctx N: tokens per slot (default: the model's, at most 4096); -b/--batch-size 512: tokens per engine\n"
            "  step (decode tokens first, then prompt chunks); -s/--seed: the seed of requests that give none\n"
            "  (default: a fresh one each); -ngl/--n-gpu-layers is accepted and ignored: this build has no GPU;\n"
            "  -hf OWNER/REPO[:QUANT]: the model from the Hugging Face hub (`convoy pull` says how)\n"
            "  a chat page at / (--no-webui: none); --jinja and --metrics are accepted: the model's Jinja template\n"
            "  and /metrics are always on; --mlock: this machine's layers' weights locked in memory (`ulimit -l` must\n"
            "  allow it); --no-mmap is accepted: the layers' matrices are always read into private memory\n"
            "  --embeddings: POST /v1/embeddings (and /embeddings, OpenAI's shape) and Ollama's /api/embed and\n"
            "  /api/embeddings answer (without it they answer 501, as llama-server's); each input runs in a slot\n"
            "  as a prompt, its final hidden states pooled and L2-normalized, the same bits on one machine and on a\n"
            "  pipeline; --pooling mean|cls|last: how (default: the model's pooling_type, mean when it has none)\n"
            "  -a/--alias: the model's name (default: the file name without .gguf); any name a request gives is\n"
            "  served as this one, unless --strict-model (then another name is a 404, as OpenAI answers);\n"
            "  --api-key / --api-key-file (one key per line, mode 0600): requests need 'Authorization: Bearer KEY'\n"
            "  --ssl-key-file FILE --ssl-cert-file FILE: HTTPS with this PEM key and certificate (chain)\n"
            "  (all but /health); --cors: the web origins (https://host:port,...) whose pages may use the server,\n"
            "  '*' any, 'none' no page (default: '*' when listening on loopback, else none);\n"
            "  --client-slots N: the most slots one client address runs at once (default: all but one, so that\n"
            "  another client always finds one); --client-connections 128: connections per client address\n"
            "  (behind a reverse proxy every request is the proxy's: raise both);\n"
            "  --chat-template NAME|FILE: a built-in family (llama2, llama3, llama3.1, chatml, qwen2.5, qwen3,\n"
            "  mistral, gemma, phi3) or a Jinja template file (default: the model's own tokenizer.chat_template,\n"
            "  or the built-in family it is recognized as when the Jinja engine refuses it; ChatML when it has none);\n"
            "  --reasoning-format deepseek (or auto, the default): a chat answer's opening <think> block becomes\n"
            "  its message's reasoning_content (streamed as its own deltas); none: it stays in content (a\n"
            "  request's \"reasoning_format\" says it for itself); POST /apply-template shows a chat's prompt;\n"
            "  --max-body: largest request body (default 1MiB); -v/--verbose: debug lines too; --timeout 10:\n"
            "  seconds a connection may stay silent (a stream waiting for its first token sends a comment every\n"
            "  third of it), and twice it a request (headers and body) may take to arrive; --template-mem 256MiB:\n"
            "  the memory the chat template's renders share beyond 1 MiB each (a GGUF's template is untrusted:\n"
            "  one render may take 256 MiB, so requests rendering at once are bounded together; a render that\n"
            "  finds it spent fails with a 400 naming it; 16 hostile renders at once held about 1.8 times it);\n"
            "  --no-cache-prompt: a slot forgets its tokens when its request ends (default: it keeps them, and a\n"
            "  request whose prompt starts with them runs only the rest; a request's \"cache_prompt\": false does\n"
            "  that for itself); GET /slots shows what each slot holds; --cache-ram BYTES: the KV memory (on\n"
            "  every node of a pipeline, for its layers) of prompts kept beyond the slots, whole slots' worth of\n"
            "  it (default: as many as --slots, within an eighth of --mem when it is given; 0: none);\n"
            "  --slot-save-path DIR: where POST /slots/ID?action=save|restore keeps slot files (a slot's tokens;\n"
            "  restore runs them again); without it those actions are refused;\n"
            "  --nodes: a pipeline of `convoy stage` nodes; a first node \"local\" makes this machine the\n"
            "  first stage (--nodes local,HOST:PORT: two machines, two stages); a node silent for\n"
            "  --peer-timeout (default 5000 ms; a working node pulses) or gone is replaced by a --standby\n"
            "  node, itself when back, or the others: requests pause and go on with the same text (tried\n"
            "  for --failover-wait, default 15000 ms, then requests fail with 503 until it is back);\n"
            "  --key FILE: the cluster key (`convoy keygen FILE`) that the nodes hold too: every link is\n"
            "  authenticated and encrypted; without it, a node not on loopback is refused unless --insecure.\n"
            "  Without --split the layers move while serving when a node slows down (each stage times every\n"
            "  batch; a plan predicted 15%% faster for 5 s is moved to as a failover would, and undone if it\n"
            "  measures slower); --no-rebalance keeps the first plan.\n"
            "  --prefill-chunk N: a prompt goes down the pipeline in chunks of N tokens, one per stage at once\n"
            "  (default 0: a quarter of a stage's share of what is left; -1: --batch-size tokens at a time).\n"
            "  --draft: speculative decoding for every request, with prompt lookup (ngram) or a draft model\n"
            "  with the same vocabulary (run here); --spec-k fixes the drafts per round (default: chosen per\n"
            "  request from acceptance and timing), --spec-k-max caps them (default 16); drafts share the\n"
            "  batch with the other requests; --spec-windows D: on a pipeline, D verify windows of a request\n"
            "  in flight at once, each drafted as if the ones before were accepted (default 0: chosen per\n"
            "  request from the round trip, the stages' speed and the acceptance; at most 16).\n"
            "  Outputs are the same as without (the same tokens per seed).\n");
}

enum { MAX_SLOTS = 4096 }; /* the context's slots, the cache's included: what a node takes */

typedef struct serve_opts {
    const char *model_path, *hf, *host, *alias, *chat_template, *reasoning_format;
    char pulled[4096]; /* -hf's file */
    const char *api_key, *api_key_file, *cors, *seed, *gpu_layers, *slot_save_path, *ssl_key_file, *ssl_cert_file;
    int32_t queue, port, ctx_size, client_slots, client_connections, timeout_s;
    bool ctx_size_given, client_slots_given, strict_model, verbose, no_cache_prompt, cache_ram_given;
    bool no_webui, always_on; /* --no-webui; --jinja and --metrics (what convoy always does) */
    bool embeddings;          /* --embeddings */
    const char *pooling;      /* --pooling */
    uint64_t cache_ram; /* --cache-ram */
    uint64_t template_mem; /* --template-mem */
    int64_t seed_value; /* -1: a fresh seed per request */
    uint64_t max_body;
    convoy_ctx_params cp;
    arg_spec spec;
} serve_opts;

/* What the server holds from the model load to the end. */
typedef struct serve_state {
    cv_access access;
    char *tls_key, *tls_cert; /* --ssl-key-file's and --ssl-cert-file's PEM texts, or NULL */
    convoy_model *model;
    convoy_ctx *ctx;
    convoy_spec *spec; /* NULL without --draft */
    cv_template_pool *template_pool;
    cv_sched *sched;
    cv_serve_chat chat;
} serve_state;

/* -s/--seed: a seed, or -1 (llama-server's "random"). */
static int parse_seed(serve_opts *o)
{
    o->seed_value = -1;
    if (!o->seed || !strcmp(o->seed, "-1"))
        return 0;
    char *end;
    errno = 0;
    const long long v = strtoll(o->seed, &end, 10);
    if (errno || end == o->seed || *end || v < 0) {
        fprintf(stderr, "convoy serve: -s/--seed expects a non-negative integer or -1, got '%s'\n", o->seed);
        return -1;
    }
    o->seed_value = v;
    return 0;
}

/* The checks that need several options: sizes, -c against --ctx and the
 * slots, the batch against the slots, the seed. */
/* --pooling into the context's parameters. */
static int parse_pooling(serve_opts *o)
{
    static const char *const names[] = {"mean", "cls", "last"};
    static const int values[] = {CONVOY_POOLING_MEAN, CONVOY_POOLING_CLS, CONVOY_POOLING_LAST};
    for (int i = 0; o->pooling && i < 3; i++)
        if (!strcmp(o->pooling, names[i]))
            o->cp.pooling = values[i];
    if (o->pooling && !o->cp.pooling) {
        fprintf(stderr, "convoy serve: --pooling is mean, cls or last, not '%s'\n", o->pooling);
        return 2;
    }
    return 0;
}

static int check_options(serve_opts *o)
{
    if (o->max_body < 1024 || o->max_body > (1u << 30)) {
        fprintf(stderr, "convoy serve: --max-body must be between 1KiB and 1GiB\n");
        return 2;
    }
    struct stat st;
    if (o->slot_save_path && (stat(o->slot_save_path, &st) || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "convoy serve: --slot-save-path %s is not a directory\n", o->slot_save_path);
        return 2;
    }
    if (o->ctx_size_given && o->cp.n_ctx) {
        fprintf(stderr, "convoy serve: give -c/--ctx-size (all slots together, as llama-server) or --ctx (per "
                        "slot), not both\n");
        return 2;
    }
    if (o->ctx_size_given && o->ctx_size > 0 && (o->cp.n_ctx = o->ctx_size / o->cp.n_slot) < 2) {
        fprintf(stderr, "convoy serve: -c/--ctx-size %d gives each of the %d slots %d tokens: too few\n",
                o->ctx_size, o->cp.n_slot, o->cp.n_ctx);
        return 2;
    }
    if (o->cp.n_batch < o->cp.n_slot) {
        fprintf(stderr, "convoy serve: --batch (%d) must be at least --slots (%d): every slot's next token "
                        "goes into one batch\n", o->cp.n_batch, o->cp.n_slot);
        return 2;
    }
    if (o->reasoning_format && strcmp(o->reasoning_format, "none") && strcmp(o->reasoning_format, "deepseek") &&
        strcmp(o->reasoning_format, "auto")) {
        fprintf(stderr, "convoy serve: --reasoning-format is none, deepseek or auto, not '%s'\n", o->reasoning_format);
        return 2;
    }
    if (!o->client_slots_given)
        o->client_slots = o->cp.n_slot > 1 ? o->cp.n_slot - 1 : 1;
    if (parse_pooling(o) || parse_seed(o))
        return 2;
    if (!o->ssl_key_file != !o->ssl_cert_file) {
        fprintf(stderr, "convoy serve: HTTPS needs both --ssl-key-file and --ssl-cert-file\n");
        return 2;
    }
    const int pulled = hub_model_option("serve", o->hf, &o->model_path, o->pulled, sizeof o->pulled);
    return pulled ? pulled : ARG_GO;
}

static int parse_options(serve_opts *o, int argc, char **argv)
{
    *o = (serve_opts){.host = "127.0.0.1", .queue = 64, .port = 8080, .max_body = 1u << 20, .timeout_s = 10,
                      .template_mem = 256u << 20,
                      .client_connections = 128, .cp = convoy_ctx_default_params(), .spec = arg_spec_init()};
    o->cp.n_slot = 4;
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &o->model_path, .env = "CONVOY_MODEL"},
        {"hf-repo", 0, ARG_STR, .dst = &o->hf, .word = "hf", .env = "CONVOY_HF_REPO"},
        {"host", 0, ARG_STR, .dst = &o->host, .env = "CONVOY_HOST"},
        {"port", 0, ARG_INT, .dst = &o->port, .lo = 0, .hi = 65535, .env = "CONVOY_PORT"},
        {"slots", 0, ARG_INT, .dst = &o->cp.n_slot, .lo = 1, .hi = MAX_SLOTS},
        {"parallel", 0, ARG_INT, .dst = &o->cp.n_slot, .lo = 1, .hi = MAX_SLOTS, .word = "np",
         .env = "CONVOY_PARALLEL"},
        {"ctx-size", 'c', ARG_INT, .dst = &o->ctx_size, .lo = 0, .hi = 1 << 30, .given = &o->ctx_size_given,
         .env = "CONVOY_CTX_SIZE"},
        {"batch-size", 'b', ARG_INT, .dst = &o->cp.n_batch, .lo = 1, .hi = 1 << 16},
        {"seed", 's', ARG_STR, .dst = &o->seed},
        {"queue", 0, ARG_INT, .dst = &o->queue, .lo = 0, .hi = 1 << 20},
        {"alias", 'a', ARG_STR, .dst = &o->alias, .env = "CONVOY_ALIAS"},
        {"strict-model", 0, ARG_FLAG, .dst = &o->strict_model},
        {"chat-template", 0, ARG_STR, .dst = &o->chat_template},
        {"reasoning-format", 0, ARG_STR, .dst = &o->reasoning_format},
        {"max-body", 0, ARG_BYTES, .dst = &o->max_body},
        {"api-key", 0, ARG_STR, .dst = &o->api_key, .env = "CONVOY_API_KEY"},
        {"api-key-file", 0, ARG_STR, .dst = &o->api_key_file, .env = "CONVOY_API_KEY_FILE"},
        {"ssl-key-file", 0, ARG_STR, .dst = &o->ssl_key_file, .env = "CONVOY_SSL_KEY_FILE"},
        {"ssl-cert-file", 0, ARG_STR, .dst = &o->ssl_cert_file, .env = "CONVOY_SSL_CERT_FILE"},
        {"cors", 0, ARG_STR, .dst = &o->cors},
        {"client-slots", 0, ARG_INT, .dst = &o->client_slots, .lo = 1, .hi = 4096, .given = &o->client_slots_given},
        {"client-connections", 0, ARG_INT, .dst = &o->client_connections, .lo = 1, .hi = 1 << 16},
        {"n-gpu-layers", 0, ARG_STR, .dst = &o->gpu_layers, .word = "ngl"},
        {"gpu-layers", 0, ARG_STR, .dst = &o->gpu_layers},
        {"verbose", 'v', ARG_FLAG, .dst = &o->verbose},
        {"no-webui", 0, ARG_FLAG, .dst = &o->no_webui, .env = "CONVOY_NO_WEBUI"},
        {"embeddings", 0, ARG_FLAG, .dst = &o->embeddings, .env = "CONVOY_EMBEDDINGS"},
        {"pooling", 0, ARG_STR, .dst = &o->pooling, .env = "CONVOY_POOLING"},
        {"jinja", 0, ARG_FLAG, .dst = &o->always_on},
        {"metrics", 0, ARG_FLAG, .dst = &o->always_on},
        {"no-cache-prompt", 0, ARG_FLAG, .dst = &o->no_cache_prompt},
        {"cache-ram", 0, ARG_BYTES, .dst = &o->cache_ram, .given = &o->cache_ram_given},
        {"slot-save-path", 0, ARG_STR, .dst = &o->slot_save_path},
        {"timeout", 0, ARG_INT, .dst = &o->timeout_s, .lo = 1, .hi = 86400},
        {"template-mem", 0, ARG_BYTES, .dst = &o->template_mem},
        {0},
    };
    const arg_cmd cmd = {.name = "serve", .usage = usage, .opts = opts, .engine = &o->cp, .spec = &o->spec};
    const int status = arg_parse(&cmd, argc, argv);
    return status != ARG_GO ? status : check_options(o);
}

/* Blocks SIGINT and SIGTERM (for sigwait) in this thread and so in every
 * thread started from here on. */
static void block_signals(sigset_t *stop_signals)
{
#ifdef __GLIBC__
    /* One connection, one thread: without a cap glibc gives each thread its
     * own malloc arena, and resident memory grows with the connections seen. */
    mallopt(M_ARENA_MAX, 2);
#endif
    sigemptyset(stop_signals);
    sigaddset(stop_signals, SIGINT);
    sigaddset(stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* The keys, the CORS policy ('*' on loopback unless --cors says) and the
 * TLS key and certificate, with a warning for a server that others reach
 * without a key. */
static int open_access(const serve_opts *o, serve_state *s)
{
    char err[CONVOY_ERR_MAX];
    const bool loopback = cv_is_loopback_host(o->host);
    const char *cors = o->cors ? o->cors : loopback ? "*" : "none";
    if (cv_access_init(&s->access, o->api_key, o->api_key_file, cors, err, sizeof err)) {
        cv_log(CV_LOG_ERROR, "%s", err);
        return 2;
    }
    size_t len;
    if (o->ssl_key_file && (!(s->tls_key = arg_read_file("serve", o->ssl_key_file, &len)) ||
                            !(s->tls_cert = arg_read_file("serve", o->ssl_cert_file, &len))))
        return 2;
    if (!loopback && !cv_access_has_keys(&s->access))
        cv_log(CV_LOG_WARN, "listening on %s without an API key: anyone who reaches this port may use the server "
                            "(--api-key KEY or --api-key-file FILE)", o->host);
    if (o->gpu_layers)
        cv_log(CV_LOG_WARN, "-ngl/--n-gpu-layers %s: this build has no GPU; every layer runs on the CPU",
               o->gpu_layers);
    return 0;
}

/* The context's slots beyond the requests' that hold the prompt cache:
 * --cache-ram's bytes in whole slots of KV (the model's, on one machine or
 * spread over a chain's nodes), by default as many as the slots, within an
 * eighth of --mem when it is given; logged. */
static int32_t cache_slots(const serve_opts *o, const convoy_model_info *info)
{
    const uint64_t slot_bytes = (uint64_t)o->cp.n_ctx * (uint64_t)info->n_layer * 2u * (uint64_t)info->n_embd_kv *
                                (o->cp.kv_f16 ? 2u : 4u);
    uint64_t n = (uint64_t)o->cp.n_slot;
    if (o->no_cache_prompt)
        n = 0;
    else if (o->cache_ram_given)
        n = o->cache_ram / slot_bytes;
    else if (o->cp.mem_budget && n > o->cp.mem_budget / 8 / slot_bytes)
        n = o->cp.mem_budget / 8 / slot_bytes;
    if (n > (uint64_t)(MAX_SLOTS - o->cp.n_slot))
        n = (uint64_t)(MAX_SLOTS - o->cp.n_slot);
    cv_log(CV_LOG_INFO, "prompt cache: room for %llu prompts beyond the %d slots (%.1f MiB of KV each)",
           (unsigned long long)n, o->cp.n_slot, (double)slot_bytes / (1 << 20));
    return (int32_t)n;
}

/* Loads the model, recognizes its chat template, creates the context (the
 * slots get the model's context, at most 4096, unless -c or --ctx says) and
 * the scheduler. Returns 0, or the exit status: 2 for an unknown template. */
static int open_engine(serve_opts *o, serve_state *s)
{
    char err[CONVOY_ERR_MAX];
    if (!(s->model = convoy_model_load(o->model_path, err, sizeof err))) {
        cv_log(CV_LOG_ERROR, "%s", err);
        return 1;
    }
    if (cv_serve_chat_setup(s->model, o->chat_template, &s->chat, err, sizeof err)) {
        cv_log(CV_LOG_ERROR, "%s", err);
        return 2;
    }
    if (!(s->chat.pool = s->template_pool = cv_template_pool_create(o->template_mem))) {
        cv_log(CV_LOG_ERROR, "out of memory");
        return 1;
    }
    char missing[256];
    if (cv_serve_chat_missing_tokens(&s->chat, missing, sizeof missing) > 0)
        cv_log(CV_LOG_WARN, "the chat template %s writes %s, which this model's vocabulary does not have as tokens: "
                            "the model reads them as plain text",
               cv_serve_chat_name(&s->chat), missing);
    convoy_model_info info;
    convoy_model_get_info(s->model, &info);
    cv_log(CV_LOG_INFO, "model %s: %s, %d layers, %d tokens of vocabulary, %s", o->model_path, info.arch,
           info.n_layer, info.n_vocab, o->cp.nodes ? "on a pipeline (its plan follows)" : "every layer here");
    if (o->cp.n_ctx == 0)
        o->cp.n_ctx = info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;
    o->cp.log = cv_log_engine;
    const int32_t n_slot = o->cp.n_slot;
    o->cp.n_slot += cache_slots(o, &info);
    s->ctx = convoy_ctx_create(s->model, &o->cp, err, sizeof err);
    o->cp.n_slot = n_slot;
    if (!s->ctx) {
        cv_log(CV_LOG_ERROR, "%s", err);
        return 1;
    }
    const int32_t pooling = convoy_ctx_pooling(s->ctx);
    if (o->embeddings && (pooling < CONVOY_POOLING_MEAN || pooling > CONVOY_POOLING_LAST)) {
        cv_log(CV_LOG_ERROR, "--embeddings: the model's pooling type is %d (%s), which convoy does not serve: give "
                             "--pooling mean|cls|last", pooling, pooling == CONVOY_POOLING_NONE ? "none: a vector "
                             "per token" : "unknown");
        return 2;
    }
    if (arg_spec_open(&o->spec, "serve", s->ctx, s->model, o->cp.n_threads, &s->spec))
        return 1;
    s->sched = cv_sched_create(s->ctx, s->model, n_slot, o->queue, err, sizeof err);
    if (!s->sched || cv_sched_set_spec(s->sched, s->spec, err, sizeof err)) {
        cv_log(CV_LOG_ERROR, "%s", err);
        return 1;
    }
    cv_sched_set_client_slots(s->sched, o->client_slots);
    cv_sched_set_prompt_cache(s->sched, !o->no_cache_prompt);
    return 0;
}

/* The model id: the file name without directories and ".gguf". */
static void model_id_of(const char *path, char *out, size_t n)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out, n, "%s", base);
    const size_t len = strlen(out);
    if (len > 5 && !strcmp(out + len - 5, ".gguf"))
        out[len - 5] = 0;
}

static void log_listening(const serve_opts *o, const serve_state *s, const oai_server *srv, int port)
{
    cv_log(CV_LOG_INFO, "listening on %s://%s:%d/v1 (model '%s', chat template: %s, %d slots of %d tokens, at most "
                        "%d per client, batch %d, %d threads%s%s%s%s)",
           s->tls_key ? "https" : "http", o->host, port, srv->model_id, cv_serve_chat_name(&s->chat), o->cp.n_slot,
           srv->n_ctx, o->client_slots, convoy_ctx_n_batch(s->ctx), o->cp.n_threads, s->spec ? ", drafts from " : "",
           s->spec ? convoy_spec_drafter(s->spec) : "", o->cp.nodes ? ", nodes " : "", o->cp.nodes ? o->cp.nodes : "");
    cv_log(CV_LOG_INFO, "API key %s; web pages: %s; requests without a seed: %s",
           cv_access_has_keys(&s->access) ? "required (all but /health)" : "not required",
           s->access.any_origin ? "from any origin" : s->access.n_origins ? "from the --cors origins" : "none",
           o->seed_value >= 0 ? "the -s seed" : "a fresh seed each");
}

/* Serves HTTP until one of stop_signals comes. */
static int serve_until_signal(const serve_opts *o, const serve_state *s, const sigset_t *stop_signals)
{
    char err[CONVOY_ERR_MAX], id[256];
    model_id_of(o->model_path, id, sizeof id);
    const cv_props props = {.n_slot = o->cp.n_slot, .model_path = o->model_path, .build_info = arg_version(),
                            .version = CONVOY_VERSION, .seed = o->seed_value};
    const cv_http_opts ho = {.host = o->host, .port = o->port, .max_body = (size_t)o->max_body,
                             .client_connections = o->client_connections, .access = &s->access, .props = &props,
                             .slot_save_path = o->slot_save_path, .idle_timeout_s = o->timeout_s,
                             .tls_key_pem = s->tls_key, .tls_cert_pem = s->tls_cert, .no_webui = o->no_webui,
                             .embeddings = o->embeddings};
    const oai_server srv = {.model = s->model, .model_id = o->alias ? o->alias : id,
                            .n_ctx = convoy_ctx_n_ctx(s->ctx), .chat = &s->chat, .strict_model = o->strict_model,
                            .split_reasoning = !o->reasoning_format || strcmp(o->reasoning_format, "none")};
    cv_http *http;
    if (cv_http_start(&http, &ho, s->sched, &srv, err, sizeof err)) {
        cv_log(CV_LOG_ERROR, "%s", err);
        return 1;
    }
    log_listening(o, s, &srv, cv_http_port(http));
    int sig = 0;
    sigwait(stop_signals, &sig);
    cv_log(CV_LOG_INFO, "%s: draining (no new connections; running requests end with an error)",
           sig == SIGINT ? "SIGINT" : "SIGTERM");
    cv_http_stop(http);
    cv_log(CV_LOG_INFO, "stopped");
    return 0;
}

static void close_engine(serve_state *s)
{
    cv_sched_free(s->sched);
    convoy_spec_free(s->spec);
    convoy_ctx_free(s->ctx);
    cv_serve_chat_free(&s->chat);
    cv_template_pool_free(s->template_pool);
    convoy_model_free(s->model);
    cv_access_free(&s->access);
    free(s->tls_key);
    free(s->tls_cert);
}

int cmd_serve(int argc, char **argv)
{
    serve_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    cv_log_set_verbose(o.verbose);
    sigset_t stop_signals;
    block_signals(&stop_signals);
    serve_state s = {0};
    int rc = open_access(&o, &s);
    if (rc == 0)
        rc = open_engine(&o, &s);
    if (rc == 0)
        rc = serve_until_signal(&o, &s, &stop_signals);
    close_engine(&s);
    return rc;
}
