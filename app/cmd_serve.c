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

static void usage(void)
{
    fprintf(stderr,
            "usage: convoy serve -m MODEL [--host ADDR] [--port N] [--slots N] [--ctx N] [--batch N] [-t N]\n"
            "                    [--queue N] [--alias NAME] [--chat-template NAME] [--max-body BYTES]\n"
            "                    [--kv-type f32|f16] [--mem BYTES] [--draft ngram|PATH [--spec-k K] [--spec-k-max K]]\n"
            "                    [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0] [--timeout MS]]\n"
            "  --host 127.0.0.1, --port 8080 (0: any free port, printed); --slots 4 requests run at once,\n"
            "  --queue 64 more may wait (then 503); --ctx: tokens per slot (default: the model's, at most 4096);\n"
            "  --batch 512: tokens per engine step (decode tokens first, then prompt chunks);\n"
            "  --alias: the model name clients use (default: the file name without .gguf);\n"
            "  --chat-template NAME: llama2, llama3, llama3.1, chatml, qwen2.5, qwen3, mistral, gemma, phi3\n"
            "  (default: recognized from the model's tokenizer.chat_template; ChatML when it has none);\n"
            "  --max-body: largest request body (default 1MiB);\n"
            "  --nodes: a pipeline of `convoy stage` nodes; a first node \"local\" makes this machine the\n"
            "  first stage (--nodes local,HOST:PORT: two machines, two stages);\n"
            "  --draft: speculative decoding for every request, with prompt lookup (ngram) or a draft model\n"
            "  with the same vocabulary (run here); --spec-k fixes the drafts per round (default: chosen per\n"
            "  request from acceptance and timing), --spec-k-max caps them (default 16); drafts share the\n"
            "  batch with the other requests. Outputs are the same as without (the same tokens per seed).\n");
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

int cmd_serve(int argc, char **argv)
{
    const char *model_path = NULL, *alias = NULL, *chat_template = NULL, *v;
    sv_http_opts ho = {.host = "127.0.0.1", .port = 8080};
    int32_t queue = 64, port = 8080;
    uint64_t max_body = 1u << 20;
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_slot = 4;
    arg_spec spec_args = arg_spec_init();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return 2;
        const int known = arg_engine_or_spec(a, v, &cp, &spec_args);
        if (known < 0)
            return 2;
        if (known == 0)
            continue;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            model_path = v;
        else if (!strcmp(a, "--host"))
            ho.host = v;
        else if (!strcmp(a, "--port"))
            bad = arg_int(a, v, 0, 65535, &port);
        else if (!strcmp(a, "--slots"))
            bad = arg_int(a, v, 1, 4096, &cp.n_slot);
        else if (!strcmp(a, "--queue"))
            bad = arg_int(a, v, 0, 1 << 20, &queue);
        else if (!strcmp(a, "--alias"))
            alias = v;
        else if (!strcmp(a, "--chat-template"))
            chat_template = v;
        else if (!strcmp(a, "--max-body"))
            bad = arg_bytes(a, v, &max_body);
        else {
            fprintf(stderr, "convoy serve: unknown option '%s'\n", a);
            usage();
            return 2;
        }
        if (bad)
            return 2;
    }
    if (!model_path) {
        usage();
        return 2;
    }
    if (max_body < 1024 || max_body > (1u << 30)) {
        fprintf(stderr, "convoy serve: --max-body must be between 1KiB and 1GiB\n");
        return 2;
    }
    if (cp.n_batch < cp.n_slot) {
        fprintf(stderr, "convoy serve: --batch (%d) must be at least --slots (%d): every slot's next token "
                        "goes into one batch\n", cp.n_batch, cp.n_slot);
        return 2;
    }
    ho.port = port;
    ho.max_body = (size_t)max_body;

#ifdef __GLIBC__
    /* One connection, one thread: without a cap glibc gives each thread its
     * own malloc arena, and resident memory grows with the connections seen. */
    mallopt(M_ARENA_MAX, 2);
#endif
    /* Every thread started from here on inherits the blocked signals. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512], id[256];
    int rc = 1;
    convoy_ctx *ctx = NULL;
    convoy_spec *spec = NULL;
    sv_sched *sched = NULL;
    convoy_model *model = convoy_model_load(model_path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    convoy_model_info info;
    convoy_model_get_info(model, &info);
    sv_chat chat;
    if (sv_chat_setup(model, chat_template, &chat, err, sizeof err)) {
        fprintf(stderr, "convoy serve: %s\n", err);
        rc = 2;
        goto done;
    }
    if (cp.n_ctx == 0)
        cp.n_ctx = info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;
    if (!(ctx = convoy_ctx_create(model, &cp, err, sizeof err))) {
        fprintf(stderr, "convoy: %s\n", err);
        goto done;
    }
    if (arg_spec_open(&spec_args, "serve", ctx, model, cp.n_threads, &spec))
        goto done;
    sched = sv_sched_create(ctx, model, cp.n_slot, queue, err, sizeof err);
    if (!sched || sv_sched_set_spec(sched, spec, err, sizeof err)) {
        fprintf(stderr, "convoy: %s\n", err);
        goto done;
    }
    model_id_of(model_path, id, sizeof id);
    const oai_server srv = {.model = model, .model_id = alias ? alias : id, .n_ctx = convoy_ctx_n_ctx(ctx),
                            .has_logprobs = sv_sched_has_logprobs(sched), .chat = &chat};
    sv_http *http;
    if (sv_http_start(&http, &ho, sched, &srv, err, sizeof err)) {
        fprintf(stderr, "convoy: %s\n", err);
        goto done;
    }
    fprintf(stderr, "convoy serve: listening on http://%s:%d/v1 (model '%s', chat template %s, %d slots of %d "
                    "tokens, batch %d, %d threads%s%s%s%s)\n",
            ho.host, sv_http_port(http), srv.model_id, sv_chat_name(&chat), cp.n_slot, srv.n_ctx,
            convoy_ctx_n_batch(ctx), cp.n_threads, spec ? ", drafts from " : "", spec ? convoy_spec_drafter(spec) : "",
            cp.nodes ? ", nodes " : "", cp.nodes ? cp.nodes : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "convoy serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    sv_http_stop(http);
    rc = 0;
done:
    sv_sched_free(sched);
    convoy_spec_free(spec);
    convoy_ctx_free(ctx);
    convoy_model_free(model);
    return rc;
}
