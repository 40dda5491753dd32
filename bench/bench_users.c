/* bench_users.c: many users at once, through the server's scheduler, on
 * one machine and on a pipeline, measured side by side in one run.
 *
 * A load generator in process (the scheduler of `convoy serve` without
 * its HTTP layer): U threads each submit one request with its own prompt
 * and wait for max_tokens greedy tokens (EOS ignored). For U = 1 on the
 * unsplit model (the baseline) and then U in --users on each target, it
 * prints per-user decode tokens/s (after the first token), aggregate
 * tokens/s (all generated tokens / wall time of the run), time to first
 * token (p50, p95), and the ratios of the aggregate to the baseline. Each
 * run is timed after an untimed one with other prompts (drive, run). This
 * machine's speed drifts from minute to minute, so every measurement is
 * repeated --repeat times (default 5), each right after a run of the
 * baseline, and the table shows medians: of the figures and of the ratios
 * of each pair (with the smallest and largest ratio beside it). The
 * targets are the unsplit model here (-t threads) and, with --nodes, a
 * pipeline of `convoy stage` nodes. With --draft, every target also runs
 * with speculative decoding (docs/DESIGN.md §13: reported both ways), and its
 * aggregate is also divided by the unsplit model's for 1 user with the same
 * speculation. Appends one JSON line per run to bench/out/users.jsonl.
 *
 * usage: bench_users -m MODEL [-t THREADS] [-n TOKENS] [--users 1,2,4,8] [--repeat R]
 *                    [--nodes HOST:PORT,... [--insecure]] [--label TEXT] [--draft ngram|PATH [--spec-k K]]
 * --insecure: plaintext links to nodes off loopback (users.sh's test hosts). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_raw.h"
#include "convoy.h"
#include "core/clock.h"
#include "kernels/kernels.h"
#include "serve/sched.h"

#define MAX_USERS 16
#define MAX_REPEAT 15

static bool insecure;

/* The fewest users of a run's untimed pass. With one user's, the
 * baseline's timed run went on reading the experts its pass had not
 * chosen (33 of the 512 of the qwen3moe-30b-a3b shape's 4 layers in 64
 * tokens), which the 8 users' runs had read before theirs (none). */
#define WARM_USERS 8

typedef struct user {
    cv_sched *sched;
    int id, n_tokens, n_vocab;
    int salt; /* varies the prompt: the warm-up's differ from the timed run's */
    double t_start, t_first, t_end;
    int32_t got;
} user;

static void *user_main(void *arg)
{
    user *u = arg;
    int32_t prompt[12];
    prompt[0] = 1;
    for (int i = 1; i < 12; i++)
        prompt[i] = 3 + ((u->id + u->salt) * 977 + i * 131) % (u->n_vocab - 3);
    convoy_sampling_params sp = convoy_sampling_default_params();
    sp.temp = 0;
    const cv_request_params p = {.prompt = prompt, .n_prompt = 12, .max_tokens = u->n_tokens, .sampler = sp,
                                 .ignore_eos = true, .top_logprobs = -1};
    char err[512];
    cv_request *r;
    u->t_start = cv_now_s();
    if (cv_sched_submit(u->sched, &p, &r, err, sizeof err) != CV_SUBMIT_OK) {
        fprintf(stderr, "bench_users: %s\n", err);
        return NULL;
    }
    cv_finish fin = CV_RUNNING;
    int32_t n = 0;
    while (fin == CV_RUNNING) {
        int32_t m = cv_request_wait(r, n, 1000, &fin);
        if (n == 0 && m > 0)
            u->t_first = cv_now_s();
        n = m;
    }
    u->t_end = cv_now_s();
    u->got = n;
    if (fin == CV_FINISH_ERROR)
        fprintf(stderr, "bench_users: %s\n", cv_request_error(r));
    cv_request_release(r);
    return NULL;
}

typedef struct result {
    double per_user, aggregate, ttft_p50, ttft_p95;
} result;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[n] and returns its median. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* n_users users at once, each with the prompt of its id and salt; their
 * figures into *res. Returns the tokens they got. */
static int64_t drive(cv_sched *s, const convoy_model_info *info, int n_users, int n_tokens, int salt, result *res)
{
    user users[MAX_USERS];
    pthread_t th[MAX_USERS];
    const double t0 = cv_now_s();
    for (int i = 0; i < n_users; i++) {
        users[i] = (user){.sched = s, .id = i, .n_tokens = n_tokens, .n_vocab = info->n_vocab, .salt = salt};
        pthread_create(&th[i], NULL, user_main, &users[i]);
    }
    for (int i = 0; i < n_users; i++)
        pthread_join(th[i], NULL);
    double t_end = t0, ttft[MAX_USERS], per_user = 0;
    int64_t total = 0;
    for (int i = 0; i < n_users; i++) {
        t_end = users[i].t_end > t_end ? users[i].t_end : t_end;
        ttft[i] = users[i].t_first - users[i].t_start;
        per_user += (users[i].got - 1) / (users[i].t_end - users[i].t_first);
        total += users[i].got;
    }
    qsort(ttft, (size_t)n_users, sizeof ttft[0], cmp_double);
    res->per_user = per_user / n_users;
    res->aggregate = (double)total / (t_end - t0);
    res->ttft_p50 = ttft[(n_users - 1) / 2];
    res->ttft_p95 = ttft[(int)(0.95 * (n_users - 1) + 0.5)];
    return total;
}

/* Speculation of a run: a drafter (NULL: none) and K (0: automatic). */
typedef struct spec_setting {
    const char *draft;
    int k;
} spec_setting;

static int run(convoy_model *m, const char *nodes, const spec_setting *sp, int threads, int n_users, int n_tokens,
               result *res)
{
    char err[512];
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_threads = threads;
    cp.n_slot = n_users;
    cp.n_ctx = 12 + n_tokens + 8;
    cp.n_batch = 64;
    cp.nodes = nodes;
    cp.insecure = insecure;
    convoy_ctx *ctx = convoy_ctx_create(m, &cp, err, sizeof err);
    if (!ctx) {
        fprintf(stderr, "bench_users: %s\n", err);
        return -1;
    }
    convoy_spec *spec = NULL;
    if (sp->draft) {
        convoy_spec_params spp = convoy_spec_default_params();
        spp.draft = sp->draft;
        spp.k = sp->k;
        spp.k_max = sp->k > spp.k_max ? sp->k : spp.k_max;
        spp.n_threads = threads;
        spec = convoy_spec_create(ctx, m, &spp, err, sizeof err);
    }
    const int n_warm = n_users > WARM_USERS ? n_users : WARM_USERS;
    cv_sched *s = !sp->draft || spec ? cv_sched_create(ctx, m, n_users, n_warm, err, sizeof err) : NULL;
    if (!s || cv_sched_set_spec(s, spec, err, sizeof err)) {
        fprintf(stderr, "bench_users: %s\n", err);
        cv_sched_free(s);
        convoy_spec_free(spec);
        convoy_ctx_free(ctx);
        return -1;
    }
    /* an untimed pass first, with other prompts, as llama-bench warms up:
     * the drafter's statistics settle, and a mixture's experts, read when
     * first chosen (llama.cpp's load maps them all), are all read: the
     * pass has at least WARM_USERS users (queued when the slots are
     * fewer), as many choices of experts as the most users a run has */
    result warm;
    drive(s, &info, n_warm, n_tokens, 1000, &warm);
    const int64_t total = drive(s, &info, n_users, n_tokens, 0, res);
    cv_sched_free(s);
    convoy_spec_free(spec);
    convoy_ctx_free(ctx);
    return total == (int64_t)n_users * n_tokens ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *nodes = NULL, *label = "";
    int threads = 1, n_tokens = 128, users[8] = {1, 2, 4, 8}, n_u = 4, repeat = 5;
    spec_setting spec = {NULL, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model_path = argv[++i];
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nodes") && i + 1 < argc)
            nodes = argv[++i];
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--insecure"))
            insecure = true;
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            label = argv[++i];
        else if (!strcmp(argv[i], "--draft") && i + 1 < argc)
            spec.draft = argv[++i];
        else if (!strcmp(argv[i], "--spec-k") && i + 1 < argc)
            spec.k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--users") && i + 1 < argc) {
            n_u = 0;
            for (char *t = strtok(argv[++i], ","); t && n_u < 8; t = strtok(NULL, ","))
                users[n_u++] = atoi(t);
        } else {
            fprintf(stderr, "usage: bench_users -m MODEL [-t THREADS] [-n TOKENS] [--users 1,2,4,8] [--repeat R] "
                            "[--nodes HOST:PORT,... [--insecure]] [--label TEXT] [--draft ngram|PATH [--spec-k K]]\n");
            return 2;
        }
    }
    for (int k = 0; k < n_u; k++)
        if (users[k] < 1 || users[k] > MAX_USERS) {
            fprintf(stderr, "bench_users: 1 to %d users\n", MAX_USERS);
            return 2;
        }
    if (!model_path || n_tokens < 2 || repeat < 1 || repeat > MAX_REPEAT) {
        fprintf(stderr, "bench_users: -m MODEL is required, -n >= 2, --repeat 1..%d\n", MAX_REPEAT);
        return 2;
    }
    cv_kernels_init(0);
    char err[512];
    convoy_model *m = convoy_model_load(model_path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench_users: %s\n", err);
        return 1;
    }
    const spec_setting plain = {NULL, 0};
    printf("%s %s, %d generated tokens per user, greedy, EOS ignored; baseline: unsplit, 1 user, %d thread(s)%s%s%s; "
           "medians of %d runs, each paired with a baseline run; kernels: %s\n\n",
           label, model_path, n_tokens, threads, spec.draft ? "; speculation: draft " : "", spec.draft ? spec.draft : "",
           spec.draft ? (spec.k ? ", K fixed" : ", K automatic") : "", repeat, cv_kernels_name());
    printf("| target | speculation | users | per-user tok/s | aggregate tok/s | TTFT p50 (s) | TTFT p95 (s) | "
           "baseline tok/s | aggregate / baseline (min-max) | aggregate / baseline with the same speculation |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    FILE *raw = bench_raw_open("bench/out/users.jsonl");
    const char *targets[2] = {NULL, nodes};
    for (int tgt = 0; tgt < (nodes ? 2 : 1); tgt++)
        for (int with = 0; with < (spec.draft ? 2 : 1); with++)
            for (int k = 0; k < n_u; k++) {
                double per_user[MAX_REPEAT], agg[MAX_REPEAT], p50[MAX_REPEAT], p95[MAX_REPEAT], base[MAX_REPEAT],
                    ratio[MAX_REPEAT], ratio_same[MAX_REPEAT];
                int n = 0;
                for (int rep = 0; rep < repeat; rep++) {
                    result b, bs, r;
                    if (run(m, NULL, &plain, threads, 1, n_tokens, &b) ||
                        (with && run(m, NULL, &spec, threads, 1, n_tokens, &bs)) ||
                        run(m, targets[tgt], with ? &spec : &plain, threads, users[k], n_tokens, &r)) {
                        fprintf(stderr, "bench_users: a run failed (above): no medians over fewer runs\n");
                        bench_raw_close(raw);
                        convoy_model_free(m);
                        return 1;
                    }
                    per_user[n] = r.per_user;
                    agg[n] = r.aggregate;
                    p50[n] = r.ttft_p50;
                    p95[n] = r.ttft_p95;
                    base[n] = b.aggregate;
                    ratio[n] = r.aggregate / b.aggregate;
                    ratio_same[n] = r.aggregate / (with ? bs.aggregate : b.aggregate);
                    bench_raw_append(raw, json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:i}",
                                                    "bench", "users", "label", label, "model", model_path, "target",
                                                    tgt ? nodes : "unsplit", "speculation", with ? spec.draft : "none",
                                                    "users", users[k], "threads", threads, "tokens", n_tokens,
                                                    "per_user_tok_s", r.per_user, "aggregate_tok_s", r.aggregate,
                                                    "ttft_p50", r.ttft_p50, "ttft_p95", r.ttft_p95, "baseline_tok_s",
                                                    b.aggregate, "baseline_same_spec_tok_s",
                                                    with ? bs.aggregate : b.aggregate, "time", (int)time(NULL)));
                    n++;
                }
                const double r_med = median(ratio, n); /* sorts ratio: [0] and [n - 1] are its extremes */
                printf("| %s | %s | %d | %.2f | %.2f | %.3f | %.3f | %.2f | %.2fx (%.2f-%.2f) | %.2fx |\n",
                       tgt ? "pipeline" : "unsplit", with ? spec.draft : "none", users[k], median(per_user, n),
                       median(agg, n), median(p50, n), median(p95, n), median(base, n), r_med, ratio[0],
                       ratio[n - 1], median(ratio_same, n));
                fflush(stdout);
            }
    bench_raw_close(raw);
    convoy_model_free(m);
    return 0;
}
