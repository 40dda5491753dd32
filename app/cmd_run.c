/* cmd_run.c: `convoy run`: one prompt, streamed to stdout; load time and
 * prefill / decode speed to stderr. The prompt goes through the model in
 * chunks of --batch tokens, then each sampled token is fed back until -n
 * tokens or an end-of-generation token. Sampling happens inside the step,
 * at the last stage (the one holding the output matrix). With --draft, each step is a
 * speculative round: the newest token and its drafts in one batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "commands.h"
#include "hub.h"
#include "convoy.h"
#include "core/clock.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: convoy run (-m MODEL | -hf OWNER/REPO[:QUANT]) -p PROMPT [-n N] [-t THREADS] [--temp T]\n"
            "                  [--top-k K] [--top-p P]\n"
            "                  [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--frequency-penalty F]\n"
            "                  [--presence-penalty P] [--seed S] [--ctx N] [--batch N] [--kv-type f32|f16]\n"
            "                  [--ignore-eos] [--ids] [--mem BYTES] [--draft ngram|PATH [--spec-k K] "
            "[--spec-k-max K] [--spec-windows D]]\n"
            "                  [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0] [--prefill-chunk N]\n"
            "                   [--peer-timeout MS] [--standby HOST:PORT,...] [--failover-wait MS] [--key FILE] [--insecure]\n"
            "                   [--no-rebalance]]\n"
            "  -hf OWNER/REPO[:QUANT]: the model from the Hugging Face hub (`convoy pull` says how)\n"
            "  -n N  tokens to generate (default 128); --temp 0 is greedy; default seed: random (printed)\n"
            "  --ids: print the generated token ids (one JSON list) instead of the text\n"
            "  --nodes: run the layers on `convoy stage` nodes (a pipeline in this order); this machine\n"
            "  keeps the embeddings, the last node samples; a first node \"local\" (--nodes local,HOST:PORT)\n"
            "  makes this machine the first stage. --wire f16/q8_0 are lossy (results change).\n"
            "  --prefill-chunk N: the prompt goes down the pipeline in chunks of N tokens, one per stage at\n"
            "  once (default 0: a quarter of a stage's share of what is left; -1: --batch tokens at a time).\n"
            "  A node silent for --peer-timeout (default 5000 ms) or gone is replaced by a --standby node,\n"
            "  itself when back, or the others (tried for --failover-wait, default 15000 ms); generation\n"
            "  goes on with the same tokens. Without --split the layers move when a node slows down (as\n"
            "  `convoy serve`); --no-rebalance keeps the first plan.\n"
            "  --key FILE: the cluster key (`convoy keygen FILE`) that the nodes hold too: every link is\n"
            "  authenticated and encrypted; without it, a node not on loopback is refused unless --insecure.\n"
            "  --draft: speculative decoding with prompt lookup (ngram) or a draft model with the same\n"
            "  vocabulary; --spec-k fixes the drafts per round (default: chosen from acceptance and timing).\n"
            "  --spec-windows D: on a pipeline, D verify windows in flight at once, each drafted as if the\n"
            "  ones before were accepted (default 0: chosen from the round trip, the stages' speed and the\n"
            "  acceptance; at most 16).\n"
            "  The output is the same as without it (the same tokens for the same seed).\n");
}

typedef struct run_opts {
    const char *model_path, *hf, *prompt;
    char pulled[4096]; /* -hf's file */
    int32_t n_predict;
    bool ignore_eos, print_ids, seed_given;
    convoy_ctx_params cp;
    convoy_sampling_params sp;
    arg_spec spec;
} run_opts;

/* What a run holds from the model load to the end. */
typedef struct run_state {
    convoy_model *model;
    convoy_model_info info;
    convoy_ctx *ctx;
    convoy_spec *spec; /* NULL without --draft */
    convoy_detok *detok;
    int32_t *tokens;   /* [n_ctx]: the prompt, then the generated ids */
    int32_t n_prompt;
    int32_t n_predict; /* -n, cut to the room the context leaves */
    double load_s;
} run_state;

static int parse_options(run_opts *o, int argc, char **argv)
{
    *o = (run_opts){.n_predict = 128, .cp = convoy_ctx_default_params(), .sp = convoy_sampling_default_params(),
                    .spec = arg_spec_init()};
    convoy_sampling_params *sp = &o->sp;
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &o->model_path, .env = "CONVOY_MODEL"},
        {"hf-repo", 0, ARG_STR, .dst = &o->hf, .word = "hf", .env = "CONVOY_HF_REPO"},
        {"prompt", 'p', ARG_STR, .dst = &o->prompt, .required = true},
        {NULL, 'n', ARG_INT, .dst = &o->n_predict, .lo = 0, .hi = 1 << 24},
        {"ignore-eos", 0, ARG_FLAG, .dst = &o->ignore_eos},
        {"ids", 0, ARG_FLAG, .dst = &o->print_ids},
        {"temp", 0, ARG_FLOAT, .dst = &sp->temp},
        {"top-k", 0, ARG_INT, .dst = &sp->top_k, .lo = 0, .hi = 1 << 30},
        {"top-p", 0, ARG_FLOAT, .dst = &sp->top_p},
        {"min-p", 0, ARG_FLOAT, .dst = &sp->min_p},
        {"repeat-penalty", 0, ARG_FLOAT, .dst = &sp->repeat_penalty},
        {"repeat-last-n", 0, ARG_INT, .dst = &sp->penalty_last_n, .lo = -1, .hi = 1 << 24},
        {"frequency-penalty", 0, ARG_FLOAT, .dst = &sp->freq_penalty},
        {"presence-penalty", 0, ARG_FLOAT, .dst = &sp->presence_penalty},
        {"seed", 0, ARG_U64, .dst = &sp->seed, .given = &o->seed_given},
        {0},
    };
    const arg_cmd cmd = {.name = "run", .usage = usage, .opts = opts, .engine = &o->cp, .spec = &o->spec};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (!o->seed_given) /* random, and printed so that the run can be repeated */
        sp->seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    const int pulled = hub_model_option("run", o->hf, &o->model_path, o->pulled, sizeof o->pulled);
    return pulled ? pulled : ARG_GO;
}

/* Loads the model and creates the context (and the drafter); the time this
 * takes is the load time reported. */
static int open_engine(run_opts *o, run_state *s)
{
    char err[CONVOY_ERR_MAX];
    const double t0 = cv_now_s();
    if (!(s->model = convoy_model_load(o->model_path, err, sizeof err)) ||
        !(s->ctx = convoy_ctx_create(s->model, &o->cp, err, sizeof err))) {
        fprintf(stderr, "convoy: %s\n", err);
        return -1;
    }
    convoy_model_get_info(s->model, &s->info);
    if (arg_spec_open(&o->spec, "run", s->ctx, s->model, o->cp.n_threads, &s->spec))
        return -1;
    s->load_s = cv_now_s() - t0;
    return 0;
}

/* Sets the sampler and tokenizes the prompt, which must leave room for a
 * token when there is one to generate. */
static int prepare_prompt(const run_opts *o, run_state *s)
{
    char err[CONVOY_ERR_MAX];
    const int32_t n_ctx = convoy_ctx_n_ctx(s->ctx);
    s->tokens = malloc(sizeof(int32_t) * (size_t)n_ctx);
    s->detok = convoy_detok_create(s->model);
    if (!s->tokens || !s->detok) {
        fprintf(stderr, "convoy: out of memory\n");
        return -1;
    }
    if (convoy_set_sampler(s->ctx, 0, &o->sp, err, sizeof err)) {
        fprintf(stderr, "convoy: %s\n", err);
        return -1;
    }
    const int n = convoy_tokenize(s->model, o->prompt, strlen(o->prompt), true, false, s->tokens, n_ctx);
    if (n < 0 || n + (o->n_predict > 0 ? 1 : 0) > n_ctx) {
        fprintf(stderr, "convoy: prompt of %d tokens does not fit the context of %d\n", n < 0 ? -n : n, n_ctx);
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "convoy: empty prompt and the model adds no BOS token\n");
        return -1;
    }
    s->n_prompt = n;
    s->n_predict = o->n_predict > n_ctx - n ? n_ctx - n : o->n_predict;
    return 0;
}

/* The load line on stderr; the prompt (or the opening of the id list) on stdout. */
static void announce(const run_opts *o, const run_state *s)
{
    fprintf(stderr, "convoy: loaded %s in %.2f s (%s, %d layers, vocab %d, %d threads, seed %llu)\n", o->model_path,
            s->load_s, s->info.arch, s->info.n_layer, s->info.n_vocab, o->cp.n_threads, (unsigned long long)o->sp.seed);
    if (o->print_ids)
        putchar('[');
    else
        fputs(o->prompt, stdout);
    fflush(stdout);
}

/* Prints each generated token as it comes (text or ids); stops at an
 * end-of-generation token unless told to ignore it. */
typedef struct run_printer {
    const convoy_model *model;
    convoy_detok *detok;
    bool ignore_eos, print_ids, failed;
    int32_t n_printed;
} run_printer;

static int print_token(void *user, int32_t id)
{
    run_printer *pr = user;
    static char text[16384];
    if (!pr->ignore_eos && convoy_token_is_eog(pr->model, id))
        return 1;
    int k = pr->print_ids ? snprintf(text, sizeof text, pr->n_printed ? ", %d" : "%d", id)
                          : convoy_detok_push(pr->detok, id, text, sizeof text);
    if (k < 0) {
        fprintf(stderr, "\nconvoy: token %d has a piece too long to print (%d bytes)\n", id, -k);
        pr->failed = true;
        return 1;
    }
    fwrite(text, 1, (size_t)k, stdout);
    fflush(stdout);
    pr->n_printed++;
    return 0;
}

/* Generates and prints the tokens, then the text the detokenizer still holds. */
static int generate(const run_opts *o, run_state *s, convoy_gen_stats *st)
{
    char err[CONVOY_ERR_MAX];
    run_printer pr = {.model = s->model, .detok = s->detok, .ignore_eos = o->ignore_eos, .print_ids = o->print_ids};
    if (convoy_generate(s->ctx, s->spec, 0, s->tokens, s->n_prompt, s->n_predict, print_token, &pr, st, err,
                        sizeof err)) {
        fprintf(stderr, "\nconvoy: %s\n", err);
        return -1;
    }
    if (pr.failed)
        return -1;
    char text[64];
    const int k = o->print_ids ? 0 : convoy_detok_flush(s->detok, text, sizeof text);
    if (k > 0)
        fwrite(text, 1, (size_t)k, stdout);
    fputs(o->print_ids ? "]\n" : "\n", stdout);
    return 0;
}

/* Prefill and decode speeds, and how the speculation went. */
static void report(const run_state *s, const convoy_gen_stats *st)
{
    fprintf(stderr, "convoy: prefill %d tokens in %.3f s (%.2f tok/s), decode %d tokens in %.3f s (%.2f tok/s)\n",
            s->n_prompt, st->prefill_s, s->n_prompt / st->prefill_s, st->n_gen, st->decode_s,
            st->n_gen > 0 ? st->n_gen / st->decode_s : 0.0);
    if (s->spec)
        fprintf(stderr, "convoy: speculation (%s): %d rounds, %.2f tokens per round, %lld of %lld drafts accepted "
                        "(%.1f%%); %d windows sent, %d dropped as stale\n",
                convoy_spec_drafter(s->spec), st->rounds, st->rounds ? (double)(st->n_gen - 1) / st->rounds : 0.0,
                (long long)st->accepted, (long long)st->drafted,
                st->drafted ? 100.0 * st->accepted / st->drafted : 0.0, st->windows, st->stale);
}

static void close_engine(run_state *s)
{
    convoy_spec_free(s->spec);
    convoy_detok_free(s->detok);
    free(s->tokens);
    convoy_ctx_free(s->ctx);
    convoy_model_free(s->model);
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    run_state s = {0};
    convoy_gen_stats st;
    int rc = 1;
    if (!open_engine(&o, &s) && !prepare_prompt(&o, &s)) {
        announce(&o, &s);
        if (!generate(&o, &s, &st)) {
            report(&s, &st);
            rc = 0;
        }
    }
    close_engine(&s);
    return rc;
}
