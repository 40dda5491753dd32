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

int cmd_stage(int argc, char **argv)
{
    cv_node_opts o = {.n_threads = 1, .handshake_timeout_ms = 10000, .io_timeout_ms = 30000, .stop = &stop_requested};
    const arg_opt opts[] = {
        {"listen", 0, ARG_STR, .dst = &o.listen, .required = true},
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
    char err[512];
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
