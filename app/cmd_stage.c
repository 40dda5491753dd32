/* cmd_stage.c: `convoy stage`: a pipeline node. Serves heads one after
 * another until SIGINT or SIGTERM. */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "pipe/node.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy stage --listen HOST:PORT (-m MODEL | --cache DIR) [--mem BYTES] [-t THREADS]\n"
               "                    [--batch N] [--timeout MS] [--key FILE] [--insecure] [--mlock] [--no-mmap]\n"
               "  serves the layers a head assigns, from this machine's copy of MODEL (a whole model or\n"
               "  a shard of `convoy split`; its tensors' hashes checked against the head's, cached in\n"
               "  MODEL.convoy-hashes), or, with --cache DIR and no model, from the shard of those layers\n"
               "  that the head ships (coded losslessly, checked by hash, kept in DIR for the next start,\n"
               "  resumed when a transfer was cut); --mem caps its\n"
               "  resident memory, touched weight pages included (e.g. 1.5G; default: MemAvailable\n"
               "  when it starts); a session whose head sends nothing for --timeout MS (default 30000) ends;\n"
               "  --batch N: the most tokens one step of a head may carry (default 512, a head's default):\n"
               "  a head that asks for more is refused, so no peer sets the size of this stage's work;\n"
               "  --key FILE: the cluster key (`convoy keygen FILE`, the same on the head and every stage):\n"
               "  only peers that prove it are served, and every link is encrypted; refusals are logged.\n"
               "  Without --key, listening on an address that is not loopback needs --insecure.\n"
               "  --mlock: the layers' weights locked in memory (never swapped out; `ulimit -l` must allow it);\n"
               "  --no-mmap is accepted: the layers' matrices are always read into private memory.\n");
}

int cmd_stage(int argc, char **argv)
{
    /* threads: the engine's default, the physical cores */
    bool no_mmap = false; /* what convoy always does (see usage) */
    cv_node_opts o = {.n_threads = convoy_ctx_default_params().n_threads, .handshake_timeout_ms = 10000, .io_timeout_ms = 30000, .stop = &stop_requested};
    const arg_opt opts[] = {
        {"listen", 0, ARG_STR, .dst = &o.listen, .required = true, .env = "CONVOY_LISTEN"},
        {"model", 'm', ARG_STR, .dst = &o.model_path, .env = "CONVOY_MODEL"},
        {"cache", 0, ARG_STR, .dst = &o.cache_dir, .env = "CONVOY_CACHE"},
        {"mem", 0, ARG_BYTES, .dst = &o.mem_budget, .env = "CONVOY_MEM"},
        {"threads", 't', ARG_INT, .dst = &o.n_threads, .lo = 1, .hi = 256, .env = "CONVOY_THREADS"},
        {"batch", 0, ARG_INT, .dst = &o.n_batch_max, .lo = 1, .hi = CV_NODE_BATCH_MAX},
        {"timeout", 0, ARG_INT, .dst = &o.io_timeout_ms, .lo = 1, .hi = 1 << 30},
        {"key", 0, ARG_STR, .dst = &o.key_file, .env = "CONVOY_KEY_FILE"},
        {"insecure", 0, ARG_FLAG, .dst = &o.insecure, .env = "CONVOY_INSECURE"},
        {"mlock", 0, ARG_FLAG, .dst = &o.mlock},
        {"no-mmap", 0, ARG_FLAG, .dst = &no_mmap},
        {0},
    };
    const arg_cmd cmd = {.name = "stage", .usage = usage, .opts = opts};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    char err[CONVOY_ERR_MAX];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* the node's memory count (pipe/plan.h) holds for this process: every
     * thread's stack is CV_PLAN_THREAD_STACK, and a large block goes back
     * to the system when freed (a fixed threshold: glibc's adaptive one
     * would keep an ended session's freed buffers on the heap) */
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_setstacksize(&attr, CV_PLAN_THREAD_STACK);
        pthread_setattr_default_np(&attr);
        pthread_attr_destroy(&attr);
    }
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    if (cv_node_serve(&o, err, sizeof err)) {
        fprintf(stderr, "convoy stage: %s\n", err);
        return 1;
    }
    return 0;
}
