/* cmd_serve.c: `convoy serve`: the OpenAI-compatible HTTP server. Loads
 * the model, creates the engine context (local, or a pipeline over
 * --nodes) with one sequence slot per concurrent request, hands it to the
 * scheduler (serve/sched.h), with --draft a convoy_spec that makes every
 * decoding request speculate, and serves HTTP (serve/http.h) until SIGINT
 * or SIGTERM. The signals are blocked in every thread and taken by the
 * main thread with sigwait, so shutdown runs in plain code: the server
 * stops, running requests fail with a message, then everything is freed. */
#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "serve/http.h"
#include "serve/render.h"
#include "serve/sched.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: convoy serve -m MODEL [--host ADDR] [--port N] [--slots N] [--ctx N] [--batch N] [-t N]\n"
            "                    [--queue N] [--alias NAME] [--chat-template NAME] [--max-body BYTES]\n"
            "                    [--kv-type f32|f16] [--mem BYTES] [--draft ngram|PATH [--spec-k K] [--spec-k-max K]]\n"
            "                    [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0]\n"
            "                     [--peer-timeout MS] [--standby HOST:PORT,...] [--failover-wait MS] [--key FILE] [--insecure]]\n"
            "  --host 127.0.0.1, --port 8080 (0: any free port, printed); --slots 4 requests run at once,\n"
            "  --queue 64 more may wait (then 503); --ctx: tokens per slot (default: the model's, at most 4096);\n"
            "  --batch 512: tokens per engine step (decode tokens first, then prompt chunks);\n"
            "  --alias: the model name clients use (default: the file name without .gguf);\n"
            "  --chat-template NAME: llama2, llama3, llama3.1, chatml, qwen2.5, qwen3, mistral, gemma, phi3\n"
            "  (default: recognized from the model's tokenizer.chat_template; ChatML when it has none);\n"
            "  --max-body: largest request body (default 1MiB);\n"
            "  --nodes: a pipeline of `convoy stage` nodes; a first node \"local\" makes this machine the\n"
            "  first stage (--nodes local,HOST:PORT: two machines, two stages); a node silent for\n"
            "  --peer-timeout (default 5000 ms; a working node pulses) or gone is replaced by a --standby\n"
            "  node, itself when back, or the others: requests pause and go on with the same text (tried\n"
            "  for --failover-wait, default 15000 ms, then requests fail with 503 until it is back);\n"
            "  --key FILE: the cluster key (`convoy keygen FILE`) that the stages hold too: every link is\n"
            "  authenticated and encrypted; without it, a node not on loopback is refused unless --insecure.\n"
            "  --draft: speculative decoding for every request, with prompt lookup (ngram) or a draft model\n"
            "  with the same vocabulary (run here); --spec-k fixes the drafts per round (default: chosen per\n"
            "  request from acceptance and timing), --spec-k-max caps them (default 16); drafts share the\n"
            "  batch with the other requests. Outputs are the same as without (the same tokens per seed).\n");
}

typedef struct serve_opts {
    const char *model_path, *host, *alias, *chat_template;
    int32_t queue, port;
    uint64_t max_body;
    convoy_ctx_params cp;
    arg_spec spec;
} serve_opts;

/* What the server holds from the model load to the end. */
typedef struct serve_state {
    convoy_model *model;
    convoy_ctx *ctx;
    convoy_spec *spec; /* NULL without --draft */
    sv_sched *sched;
    sv_chat chat;
} serve_state;

static int parse_options(serve_opts *o, int argc, char **argv)
{
    *o = (serve_opts){.host = "127.0.0.1", .queue = 64, .port = 8080, .max_body = 1u << 20,
                      .cp = convoy_ctx_default_params(), .spec = arg_spec_init()};
    o->cp.n_slot = 4;
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &o->model_path, .required = true},
        {"host", 0, ARG_STR, .dst = &o->host},
        {"port", 0, ARG_INT, .dst = &o->port, .lo = 0, .hi = 65535},
        {"slots", 0, ARG_INT, .dst = &o->cp.n_slot, .lo = 1, .hi = 4096},
        {"queue", 0, ARG_INT, .dst = &o->queue, .lo = 0, .hi = 1 << 20},
        {"alias", 0, ARG_STR, .dst = &o->alias},
        {"chat-template", 0, ARG_STR, .dst = &o->chat_template},
        {"max-body", 0, ARG_BYTES, .dst = &o->max_body},
        {0},
    };
    const arg_cmd cmd = {.name = "serve", .usage = usage, .opts = opts, .engine = &o->cp, .spec = &o->spec};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (o->max_body < 1024 || o->max_body > (1u << 30)) {
        fprintf(stderr, "convoy serve: --max-body must be between 1KiB and 1GiB\n");
        return 2;
    }
    if (o->cp.n_batch < o->cp.n_slot) {
        fprintf(stderr, "convoy serve: --batch (%d) must be at least --slots (%d): every slot's next token "
                        "goes into one batch\n", o->cp.n_batch, o->cp.n_slot);
        return 2;
    }
    return ARG_GO;
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

/* Loads the model, recognizes its chat template, creates the context (the
 * slots get the model's context, at most 4096, unless --ctx says) and the
 * scheduler. Returns 0, or the exit status: 2 for an unknown template. */
static int open_engine(serve_opts *o, serve_state *s)
{
    char err[512];
    if (!(s->model = convoy_model_load(o->model_path, err, sizeof err))) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    if (sv_chat_setup(s->model, o->chat_template, &s->chat, err, sizeof err)) {
        fprintf(stderr, "convoy serve: %s\n", err);
        return 2;
    }
    convoy_model_info info;
    convoy_model_get_info(s->model, &info);
    if (o->cp.n_ctx == 0)
        o->cp.n_ctx = info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;
    if (!(s->ctx = convoy_ctx_create(s->model, &o->cp, err, sizeof err))) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    if (arg_spec_open(&o->spec, "serve", s->ctx, s->model, o->cp.n_threads, &s->spec))
        return 1;
    s->sched = sv_sched_create(s->ctx, s->model, o->cp.n_slot, o->queue, err, sizeof err);
    if (!s->sched || sv_sched_set_spec(s->sched, s->spec, err, sizeof err)) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
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

/* Serves HTTP until one of stop_signals comes. */
static int serve_until_signal(const serve_opts *o, const serve_state *s, const sigset_t *stop_signals)
{
    char err[512], id[256];
    model_id_of(o->model_path, id, sizeof id);
    const sv_http_opts ho = {.host = o->host, .port = o->port, .max_body = (size_t)o->max_body};
    const oai_server srv = {.model = s->model, .model_id = o->alias ? o->alias : id,
                            .n_ctx = convoy_ctx_n_ctx(s->ctx), .chat = &s->chat};
    sv_http *http;
    if (sv_http_start(&http, &ho, s->sched, &srv, err, sizeof err)) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    fprintf(stderr, "convoy serve: listening on http://%s:%d/v1 (model '%s', chat template %s, %d slots of %d "
                    "tokens, batch %d, %d threads%s%s%s%s)\n",
            ho.host, sv_http_port(http), srv.model_id, sv_chat_name(&s->chat), o->cp.n_slot, srv.n_ctx,
            convoy_ctx_n_batch(s->ctx), o->cp.n_threads, s->spec ? ", drafts from " : "",
            s->spec ? convoy_spec_drafter(s->spec) : "", o->cp.nodes ? ", nodes " : "",
            o->cp.nodes ? o->cp.nodes : "");
    fflush(stderr);
    int sig = 0;
    sigwait(stop_signals, &sig);
    fprintf(stderr, "convoy serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    sv_http_stop(http);
    return 0;
}

static void close_engine(serve_state *s)
{
    sv_sched_free(s->sched);
    convoy_spec_free(s->spec);
    convoy_ctx_free(s->ctx);
    convoy_model_free(s->model);
}

int cmd_serve(int argc, char **argv)
{
    serve_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    sigset_t stop_signals;
    block_signals(&stop_signals);
    serve_state s = {0};
    int rc = open_engine(&o, &s);
    if (rc == 0)
        rc = serve_until_signal(&o, &s, &stop_signals);
    close_engine(&s);
    return rc;
}
