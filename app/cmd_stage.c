/* cmd_stage.c: `convoy stage`: a pipeline node. Serves heads one after
 * another until SIGINT or SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "pipe/link.h"
#include "pipe/node.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(void)
{
    fprintf(stderr, "usage: convoy stage --listen HOST:PORT -m MODEL [--mem BYTES] [-t THREADS] [--timeout MS]\n"
                    "  serves the layers a head assigns, from this machine's copy of MODEL (checked by\n"
                    "  fingerprint); --mem caps the memory it may use (e.g. 1.5G)\n");
}

int cmd_stage(int argc, char **argv)
{
    const char *listen = NULL, *v;
    cv_node_opts o = {.n_threads = 1, .handshake_timeout_ms = 10000, .io_timeout_ms = 30000, .stop = &stop_requested};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--listen"))
            listen = v;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o.model_path = v;
        else if (!strcmp(a, "--mem"))
            bad = arg_bytes(a, v, &o.mem_budget);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            bad = arg_int(a, v, 1, 256, &o.n_threads);
        else if (!strcmp(a, "--timeout"))
            bad = arg_int(a, v, 1, 1 << 30, &o.io_timeout_ms);
        else {
            fprintf(stderr, "convoy stage: unknown option '%s'\n", a);
            usage();
            return 2;
        }
        if (bad)
            return 2;
    }
    if (!listen || !o.model_path) {
        usage();
        return 2;
    }
    char host[256], err[512];
    if (cv_parse_addr(listen, host, sizeof host, &o.port, err, sizeof err)) {
        fprintf(stderr, "convoy stage: %s\n", err);
        return 2;
    }
    o.host = host;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (cv_node_serve(&o, err, sizeof err)) {
        fprintf(stderr, "convoy stage: %s\n", err);
        return 1;
    }
    return 0;
}
