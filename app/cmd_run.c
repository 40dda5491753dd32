/* cmd_run.c: `convoy run`: one prompt, streamed to stdout; load time and
 * prefill / decode speed to stderr. The prompt goes through the model in
 * chunks of --batch tokens, then each sampled token is fed back until -n
 * tokens or an end-of-generation token. Sampling happens inside the step,
 * at the stage that holds the output head. With --draft, each step is a
 * speculative round: the newest token and its drafts in one batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "core/alloc.h"
#include "core/clock.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: convoy run -m MODEL -p PROMPT [-n N] [-t THREADS] [--temp T] [--top-k K] [--top-p P]\n"
            "                  [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--frequency-penalty F]\n"
            "                  [--presence-penalty P] [--seed S] [--ctx N] [--batch N] [--kv-type f32|f16]\n"
            "                  [--ignore-eos] [--ids] [--mem BYTES] [--draft ngram|PATH [--spec-k K] [--spec-k-max K]]\n"
            "                  [--nodes HOST:PORT,... [--split A,B,...] [--wire f32|f16|q8_0] [--timeout MS]]\n"
            "  -n N  tokens to generate (default 128); --temp 0 is greedy; default seed: random (printed)\n"
            "  --ids: print the generated token ids (one JSON list) instead of the text\n"
            "  --nodes: run the layers on `convoy stage` nodes (a pipeline in this order); this machine\n"
            "  keeps the embeddings, the last node samples; a first node \"local\" (--nodes local,HOST:PORT)\n"
            "  makes this machine the first stage. --wire f16/q8_0 are lossy (results change).\n"
            "  --draft: speculative decoding with prompt lookup (ngram) or a draft model with the same\n"
            "  vocabulary; --spec-k fixes the drafts per round (default: chosen from acceptance and timing).\n"
            "  The output is the same as without it (the same tokens for the same seed).\n");
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

int cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *v;
    int32_t n_predict = 128;
    bool ignore_eos = false, seed_given = false, print_ids = false;
    convoy_ctx_params cp = convoy_ctx_default_params();
    convoy_sampling_params sp = convoy_sampling_default_params();
    arg_spec spec_args = arg_spec_init();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
            continue;
        } else if (!strcmp(a, "--ids")) {
            print_ids = true;
            continue;
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
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "-n"))
            bad = arg_int(a, v, 0, 1 << 24, &n_predict);
        else if (!strcmp(a, "--temp"))
            bad = arg_float(a, v, &sp.temp);
        else if (!strcmp(a, "--top-k"))
            bad = arg_int(a, v, 0, 1 << 30, &sp.top_k);
        else if (!strcmp(a, "--top-p"))
            bad = arg_float(a, v, &sp.top_p);
        else if (!strcmp(a, "--min-p"))
            bad = arg_float(a, v, &sp.min_p);
        else if (!strcmp(a, "--repeat-penalty"))
            bad = arg_float(a, v, &sp.repeat_penalty);
        else if (!strcmp(a, "--repeat-last-n"))
            bad = arg_int(a, v, 0, 1 << 24, &sp.penalty_last_n);
        else if (!strcmp(a, "--frequency-penalty"))
            bad = arg_float(a, v, &sp.freq_penalty);
        else if (!strcmp(a, "--presence-penalty"))
            bad = arg_float(a, v, &sp.presence_penalty);
        else if (!strcmp(a, "--seed"))
            bad = arg_u64(a, v, &sp.seed), seed_given = true;
        else {
            fprintf(stderr, "convoy run: unknown option '%s'\n", a);
            usage();
            return 2;
        }
        if (bad)
            return 2;
    }
    if (!model_path || !prompt) {
        usage();
        return 2;
    }
    if (!seed_given)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);

    char err[512];
    double t0 = cv_now_s();
    convoy_model *model = convoy_model_load(model_path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    convoy_model_info info;
    convoy_model_get_info(model, &info);
    convoy_ctx *ctx = convoy_ctx_create(model, &cp, err, sizeof err);
    if (!ctx) {
        fprintf(stderr, "convoy: %s\n", err);
        convoy_model_free(model);
        return 1;
    }
    const int32_t n_ctx = convoy_ctx_n_ctx(ctx);
    int rc = 1;
    convoy_spec *spec;
    if (arg_spec_open(&spec_args, "run", ctx, model, cp.n_threads, &spec)) {
        convoy_ctx_free(ctx);
        convoy_model_free(model);
        return 1;
    }
    double t_load = cv_now_s() - t0;

    int32_t *tokens = cv_malloc(sizeof(int32_t) * (size_t)n_ctx);
    convoy_detok *detok = convoy_detok_create(model);
    if (!tokens || !detok) {
        fprintf(stderr, "convoy: out of memory\n");
        goto done;
    }
    if (convoy_set_sampler(ctx, 0, &sp, err, sizeof err)) {
        fprintf(stderr, "convoy: %s\n", err);
        goto done;
    }
    int n_prompt = convoy_tokenize(model, prompt, strlen(prompt), true, false, tokens, n_ctx);
    if (n_prompt < 0 || n_prompt + (n_predict > 0 ? 1 : 0) > n_ctx) {
        fprintf(stderr, "convoy: prompt of %d tokens does not fit the context of %d\n",
                n_prompt < 0 ? -n_prompt : n_prompt, n_ctx);
        goto done;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "convoy: empty prompt and the model adds no BOS token\n");
        goto done;
    }
    if (n_predict > n_ctx - n_prompt)
        n_predict = n_ctx - n_prompt;
    fprintf(stderr, "convoy: loaded %s in %.2f s (%d layers, vocab %d, %d threads, seed %llu)\n", model_path, t_load,
            info.n_layer, info.n_vocab, cp.n_threads, (unsigned long long)sp.seed);
    if (print_ids)
        putchar('[');
    else
        fputs(prompt, stdout);
    fflush(stdout);

    run_printer pr = {.model = model, .detok = detok, .ignore_eos = ignore_eos, .print_ids = print_ids};
    convoy_gen_stats st;
    if (convoy_generate(ctx, spec, 0, tokens, n_prompt, n_predict, print_token, &pr, &st, err, sizeof err)) {
        fprintf(stderr, "\nconvoy: %s\n", err);
        goto done;
    }
    if (pr.failed)
        goto done;
    static char text[64];
    int k = print_ids ? 0 : convoy_detok_flush(detok, text, sizeof text);
    if (k > 0)
        fwrite(text, 1, (size_t)k, stdout);
    fputs(print_ids ? "]\n" : "\n", stdout);
    fprintf(stderr, "convoy: prefill %d tokens in %.3f s (%.2f tok/s), decode %d tokens in %.3f s (%.2f tok/s)\n",
            n_prompt, st.prefill_s, n_prompt / st.prefill_s, st.n_gen, st.decode_s,
            st.n_gen > 0 ? st.n_gen / st.decode_s : 0.0);
    if (spec)
        fprintf(stderr, "convoy: speculation (%s): %d rounds, %.2f tokens per round, %lld of %lld drafts accepted "
                        "(%.1f%%)\n",
                convoy_spec_drafter(spec), st.rounds, st.rounds ? (double)(st.n_gen - 1) / st.rounds : 0.0,
                (long long)st.accepted, (long long)st.drafted, st.drafted ? 100.0 * st.accepted / st.drafted : 0.0);
    rc = 0;
done:
    convoy_spec_free(spec);
    convoy_detok_free(detok);
    cv_free(tokens);
    convoy_ctx_free(ctx);
    convoy_model_free(model);
    return rc;
}
