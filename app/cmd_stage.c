/* cmd_stage.c: `convoy stage`: a pipeline node. Serves heads one after
 * another until SIGINT or SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "pipe/node.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy stage --listen HOST:PORT -m MODEL [--mem BYTES] [-t THREADS] [--timeout MS]\n"
               "  serves the layers a head assigns, from this machine's copy of MODEL (checked by\n"
               "  fingerprint); --mem caps the memory it may use (e.g. 1.5G)\n");
}

/* Splits "HOST:PORT" (an IPv6 host in brackets) at its last colon. */
static int split_listen(const char *listen, char *host, size_t host_len, int *port)
{
    const char *colon = strrchr(listen, ':'), *h = listen;
    size_t n = colon ? (size_t)(colon - listen) : 0;
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    int32_t p;
    if (n == 0 || n >= host_len) {
        fprintf(stderr, "convoy stage: --listen expects HOST:PORT, got '%s'\n", listen);
        return -1;
    }
    if (arg_int("--listen's port", colon + 1, 1, 65535, &p))
        return -1;
    memcpy(host, h, n);
    host[n] = 0;
    *port = p;
    return 0;
}

int cmd_stage(int argc, char **argv)
{
    const char *listen = NULL;
    cv_node_opts o = {.n_threads = 1, .handshake_timeout_ms = 10000, .io_timeout_ms = 30000, .stop = &stop_requested};
    const arg_opt opts[] = {
        {"listen", 0, ARG_STR, .dst = &listen, .required = true},
        {"model", 'm', ARG_STR, .dst = &o.model_path, .required = true},
        {"mem", 0, ARG_BYTES, .dst = &o.mem_budget},
        {"threads", 't', ARG_INT, .dst = &o.n_threads, .lo = 1, .hi = 256},
        {"timeout", 0, ARG_INT, .dst = &o.io_timeout_ms, .lo = 1, .hi = 1 << 30},
        {0},
    };
    const arg_cmd cmd = {.name = "stage", .usage = usage, .opts = opts};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    char host[256], err[512];
    if (split_listen(listen, host, sizeof host, &o.port))
        return 2;
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
