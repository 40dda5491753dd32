/* bench_pipeline.c: single-user decode through pipelines against the
 * unsplit model, measured side by side in one run.
 *
 * The unsplit model runs in this process; each --chain names the `convoy
 * stage` nodes of one pipeline (started beforehand, e.g. by
 * bench/pipeline.sh on test hosts or on loopback). For each configuration:
 * a prompt of P tokens, then T greedy tokens decoded one at a time; decode
 * tokens/s and its ratio to the unsplit model; the time per token split
 * into each stage's compute (the nodes' own counters, asked with STATS)
 * and the rest (transfer, queueing, the head's embedding lookup); and the
 * bytes on the wire per token (every hop's FORWARD plus the RESULT). Prints
 * a table and appends one JSON line per configuration to
 * bench/out/pipeline.jsonl.
 *
 * usage: bench_pipeline -m MODEL [-t THREADS] [-p PROMPT_TOKENS] [-n TOKENS]
 *                       [--label TEXT] --chain HOST:PORT,... [--split A,B,...] ... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_raw.h"
#include "core/clock.h"
#include "infer/span.h"
#include "kernels/kernels.h"
#include "pipe/chain.h"

#define MAX_CHAINS 8

typedef struct run {
    double tok_s;
    double ms_per_token;
    double compute_ms[CV_CHAIN_MAX_NODES]; /* per stage, per token */
    int n_stages;
    double wire_bytes_per_token;
    int32_t tokens[4096];
} run;

static int32_t prompt_ids[4096]; /* set by bench_unsplit */

/* The tokens of the prompt: BOS then fixed ids. */
static void prompt_tokens(int32_t *ids, int n, int32_t n_vocab)
{
    ids[0] = 1;
    for (int i = 1; i < n; i++)
        ids[i] = 3 + (i * 7919) % (n_vocab - 3);
}

static int bench_unsplit(const char *model, int threads, int p, int n, run *r)
{
    char err[512];
    cv_span s;
    const cv_span_params sp = {.l0 = 0, .l1 = -1, .n_threads = threads, .n_ctx = p + n + 1, .n_slot = 1,
                                .n_batch = p};
    if (cv_span_open(&s, model, &sp, err, sizeof err)) {
        fprintf(stderr, "bench_pipeline: %s\n", err);
        return -1;
    }
    int32_t pos[4096], seq[4096] = {0};
    uint8_t want[4096] = {0};
    prompt_tokens(prompt_ids, p, s.model.hp.n_vocab);
    for (int i = 0; i < p; i++)
        pos[i] = i;
    want[p - 1] = 1;
    cv_batch b = {.n_tokens = p, .token = prompt_ids, .pos = pos, .seq = seq, .want = want};
    int32_t tok;
    int rc = cv_span_step(&s, &b, NULL, NULL, &tok, err, sizeof err);
    double t0 = cv_now_s();
    for (int i = 0; rc == 0 && i < n; i++) {
        r->tokens[i] = tok;
        int32_t ps = p + i;
        uint8_t w = 1;
        cv_batch one = {.n_tokens = 1, .token = &r->tokens[i], .pos = &ps, .seq = seq, .want = &w};
        rc = cv_span_step(&s, &one, NULL, NULL, &tok, err, sizeof err);
    }
    double dt = cv_now_s() - t0;
    if (rc)
        fprintf(stderr, "bench_pipeline: %s\n", err);
    r->tok_s = n / dt;
    r->ms_per_token = 1e3 * dt / n;
    r->n_stages = 1;
    r->compute_ms[0] = r->ms_per_token;
    cv_span_close(&s);
    return rc;
}

static int bench_chain(const char *model, int threads, int p, int n, char *nodes_csv, const char *split_csv, run *r,
                       cv_chain_stats *plan)
{
    char err[512];
    const char *nodes[CV_CHAIN_MAX_NODES];
    int32_t split[CV_CHAIN_MAX_NODES];
    int n_nodes = 0;
    for (char *tok = strtok(nodes_csv, ","); tok && n_nodes < CV_CHAIN_MAX_NODES; tok = strtok(NULL, ","))
        nodes[n_nodes++] = tok;
    cv_chain_opts o = cv_chain_default_opts();
    o.nodes = nodes;
    o.n_nodes = n_nodes;
    o.n_threads = threads;
    o.insecure = true; /* pipeline.sh's test hosts are a trusted, private network */
    o.n_ctx = p + n + 1;
    o.n_batch = p;
    if (split_csv) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", split_csv);
        int k = 0;
        for (char *tok = strtok(buf, ","); tok && k < CV_CHAIN_MAX_NODES; tok = strtok(NULL, ","))
            split[k++] = atoi(tok);
        o.split = split;
    }
    cv_chain *c;
    if (cv_chain_open(&c, model, &o, err, sizeof err)) {
        fprintf(stderr, "bench_pipeline: %s\n", err);
        return -1;
    }
    cv_chain_get_stats(c, plan);
    int32_t pos[4096], seq[4096] = {0};
    uint8_t want[4096] = {0};
    for (int i = 0; i < p; i++)
        pos[i] = i;
    want[p - 1] = 1;
    cv_batch b = {.n_tokens = p, .token = prompt_ids, .pos = pos, .seq = seq, .want = want};
    int32_t tok;
    int rc = cv_chain_step(c, &b, &tok, err, sizeof err);
    cv_msg_stats before[CV_CHAIN_MAX_NODES], after[CV_CHAIN_MAX_NODES];
    cv_chain_stats s0, s1;
    for (int k = 0; rc == 0 && k < plan->n_nodes; k++)
        rc = cv_chain_node_stats(c, k, &before[k], err, sizeof err);
    cv_chain_get_stats(c, &s0);
    double t0 = cv_now_s();
    for (int i = 0; rc == 0 && i < n; i++) {
        r->tokens[i] = tok;
        int32_t ps = p + i;
        uint8_t w = 1;
        cv_batch one = {.n_tokens = 1, .token = &r->tokens[i], .pos = &ps, .seq = seq, .want = &w};
        rc = cv_chain_step(c, &one, &tok, err, sizeof err);
    }
    double dt = cv_now_s() - t0;
    cv_chain_get_stats(c, &s1);
    for (int k = 0; rc == 0 && k < plan->n_nodes; k++)
        rc = cv_chain_node_stats(c, k, &after[k], err, sizeof err);
    if (rc)
        fprintf(stderr, "bench_pipeline: %s\n", err);
    r->tok_s = n / dt;
    r->ms_per_token = 1e3 * dt / n;
    r->n_stages = plan->n_nodes;
    for (int k = 0; rc == 0 && k < plan->n_nodes; k++)
        r->compute_ms[k] = 1e-6 * (double)(after[k].compute_ns - before[k].compute_ns) / n;
    /* every hop carries a FORWARD the size of the head's; the last returns RESULT */
    r->wire_bytes_per_token =
        ((double)(s1.bytes_sent - s0.bytes_sent) * plan->n_nodes + (double)(s1.bytes_recv - s0.bytes_recv)) / n;
    cv_chain_close(c);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *label = "";
    int threads = 1, p = 16, n = 64, n_chains = 0;
    char *chains[MAX_CHAINS];
    const char *splits[MAX_CHAINS] = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p") && i + 1 < argc)
            p = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            label = argv[++i];
        else if (!strcmp(argv[i], "--chain") && i + 1 < argc && n_chains < MAX_CHAINS)
            chains[n_chains++] = argv[++i];
        else if (!strcmp(argv[i], "--split") && i + 1 < argc && n_chains > 0)
            splits[n_chains - 1] = argv[++i];
        else {
            fprintf(stderr, "usage: bench_pipeline -m MODEL [-t THREADS] [-p PROMPT_TOKENS] [-n TOKENS] "
                            "[--label TEXT] --chain HOST:PORT,... [--split A,B,...] ...\n");
            return 2;
        }
    }
    if (!model || p < 1 || n < 1 || n > 4096 || p > 4096) {
        fprintf(stderr, "bench_pipeline: -m MODEL is required; 1 <= -p, -n <= 4096\n");
        return 2;
    }
    for (int k = 0; k < n_chains; k++) {
        /* the whole first item only: "localhost:7000" is a remote stage */
        const size_t n_local = strlen(CV_CHAIN_LOCAL);
        if (!strncmp(chains[k], CV_CHAIN_LOCAL, n_local) && (chains[k][n_local] == ',' || !chains[k][n_local])) {
            /* its compute would land in "rest: transfer etc." */
            fprintf(stderr, "bench_pipeline: times remote stages only; a local first stage is measured by "
                            "bench_users\n");
            return 2;
        }
    }
    cv_kernels_init(0);
    static run base, r;
    if (bench_unsplit(model, threads, p, n, &base))
        return 1;
    printf("%s model %s, %d thread(s) per stage, prompt %d, %d decoded tokens, greedy\n\n", label, model, threads, p,
           n);
    printf("| configuration | layers per stage | tok/s | ratio to unsplit | ms/token | compute per stage (ms) | "
           "rest: transfer etc. (ms) | wire bytes/token | tokens equal |\n");
    printf("|---|---|---:|---:|---:|---|---:|---:|---|\n");
    printf("| unsplit | all | %.2f | 1.00 | %.2f | %.2f | 0 | 0 | - |\n", base.tok_s, base.ms_per_token,
           base.ms_per_token);
    FILE *raw = bench_raw_open("bench/out/pipeline.jsonl");
    for (int k = 0; k < n_chains; k++) {
        cv_chain_stats plan;
        char nodes_copy[1024];
        snprintf(nodes_copy, sizeof nodes_copy, "%s", chains[k]);
        memset(&r, 0, sizeof r);
        if (bench_chain(model, threads, p, n, nodes_copy, splits[k], &r, &plan))
            continue;
        char layers[256] = "", compute[256] = "";
        double sum = 0;
        for (int s = 0; s < r.n_stages; s++) {
            char one[32];
            snprintf(one, sizeof one, "%s%d", s ? "/" : "", plan.last[s] - plan.first[s]);
            strcat(layers, one);
            snprintf(one, sizeof one, "%s%.2f", s ? " + " : "", r.compute_ms[s]);
            strcat(compute, one);
            sum += r.compute_ms[s];
        }
        const int same = memcmp(base.tokens, r.tokens, sizeof(int32_t) * (size_t)n) == 0;
        printf("| %d stages | %s | %.2f | %.2f | %.2f | %s | %.2f | %.0f | %s |\n", r.n_stages, layers, r.tok_s,
               r.tok_s / base.tok_s, r.ms_per_token, compute, r.ms_per_token - sum, r.wire_bytes_per_token,
               same ? "yes" : "NO");
        fflush(stdout);
        bench_raw_append(raw, json_pack("{s:s,s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:b,s:i}", "bench",
                                        "pipeline", "label", label, "model", model, "layers", layers, "stages",
                                        r.n_stages, "threads", threads, "prompt", p, "tokens", n, "tok_s", r.tok_s,
                                        "unsplit_tok_s", base.tok_s, "compute_ms_sum", sum, "wire_bytes_per_token",
                                        r.wire_bytes_per_token, "tokens_equal", same, "time", (int)time(NULL)));
    }
    bench_raw_close(raw);
    return 0;
}
