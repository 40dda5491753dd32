/* bench_spec.c: single-user speculative decoding through pipelines, against
 * the same pipeline without speculation and against the unsplit model with
 * the same speculation, measured side by side in one run.
 *
 * Each --chain LABEL=HOST:PORT,... names the `convoy stage` nodes of one
 * pipeline (started beforehand, e.g. by bench/spec.sh on test hosts behind
 * link emulators); the unsplit model runs in this process. For every
 * pipeline, and for the unsplit model: plain decoding; each drafter (--draft
 * NAME=ngram|PATH, several allowed) with K chosen automatically and one
 * verify window at a time; the first drafter with each K of --k-list; and
 * the first drafter, K automatic, with each number of windows in flight of
 * --windows-list (0: chosen). Each configuration generates -n
 * greedy tokens (EOS ignored) after each of the --prompts prompts, and the
 * tokens are checked equal to plain decoding's; a pipeline's
 * configurations run in alternating rounds until each has decoded for
 * --min-seconds (1), and tok/s is over all their runs. Prints a table (tok/s,
 * acceptance, tokens per traversal, ratio to the same pipeline without
 * speculation, to its first drafter's one-window run and to the unsplit
 * model with the same speculation) and
 * appends one JSON line per configuration to bench/out/spec.jsonl.
 *
 * usage: bench_spec -m MODEL [-n TOKENS] [--prompts N] [--min-seconds S] --draft NAME=SPEC ...
 *                   [--k-list 1,2,...] [--windows-list 1,2,4,8,0] [--insecure] [--chain LABEL=NODES ...]
 *        bench_spec --print-prompts   (the prompts, one a line, in the order --prompts takes them) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_raw.h"
#include "convoy.h"
#include "kernels/kernels.h"

#define MAX_ITEMS 16
#define MAX_TOKENS 4096
#define MAX_K 64 /* entries of --k-list */
/* plain, each drafter with K automatic, the first drafter with each K and
 * with each number of windows */
#define MAX_CONFIGS (1 + MAX_ITEMS + 2 * MAX_K)

static const char *const prompt_texts[] = {
    "Once upon a time", "Lily and Ben went to the park", "The little dog was sad because", "One day, a big bird",
};
enum { N_PROMPT_TEXTS = sizeof prompt_texts / sizeof *prompt_texts };

typedef struct config {
    int drafter; /* -1: plain */
    int k;       /* 0: automatic */
    int windows; /* in flight; 0: chosen */
} config;

typedef struct result { /* sums over a configuration's runs */
    double gen_s;
    int64_t n_gen, rounds, drafted, accepted;
    int runs;
    bool equal;
} result;

static const char *model_path;
static convoy_model *model;
static int n_tokens = 128, n_prompts = 2;
static double min_seconds = 1.0;
static const char *draft_name[MAX_ITEMS], *draft_spec[MAX_ITEMS];
static int n_drafts, k_list[MAX_K], n_k, windows_list[MAX_K], n_windows;
static bool insecure;
static int32_t plain_tokens[N_PROMPT_TEXTS][MAX_TOKENS + 64];

static int ignore(void *user, int32_t id)
{
    (void)user;
    (void)id;
    return 0;
}

/* A pipeline's context (nodes NULL: unsplit), with a batch in flight per
 * window (a plain run keeps one). One serves every round of every
 * configuration: a node refuses a head that sends it more than 16 HELLOs a
 * second, and gives itself to another head after 1 s of silence, so a
 * context per run, or one per kind of run, would not measure the chain it
 * names. */
static convoy_ctx *open_pipeline(const char *nodes)
{
    char err[512];
    convoy_ctx_params cp = convoy_ctx_default_params();
    cp.n_ctx = n_tokens + 64;
    cp.nodes = nodes;
    cp.depth = nodes ? CONVOY_SPEC_WINDOWS_MAX : 0;
    cp.insecure = insecure;
    convoy_ctx *c = convoy_ctx_create(model, &cp, err, sizeof err);
    if (!c)
        fprintf(stderr, "bench_spec: %s\n", err);
    return c;
}

/* Runs one configuration on c (of a pipeline: nodes, NULL unsplit); adds
 * to r. */
static int run_config(convoy_ctx *c, const char *nodes, const config *cf, result *r)
{
    char err[512];
    convoy_spec *spec = NULL;
    if (cf->drafter >= 0) {
        convoy_spec_params sp = convoy_spec_default_params();
        sp.draft = draft_spec[cf->drafter];
        sp.k = cf->k;
        sp.windows = cf->windows;
        if (sp.k > sp.k_max)
            sp.k_max = sp.k;
        if (!(spec = convoy_spec_create(c, model, &sp, err, sizeof err))) {
            fprintf(stderr, "bench_spec: %s\n", err);
            return -1;
        }
    }
    for (int p = 0; p < n_prompts; p++) {
        static int32_t hist[MAX_TOKENS + 64];
        const char *text = prompt_texts[p % N_PROMPT_TEXTS];
        const int n_prompt = convoy_tokenize(model, text, strlen(text), true, false, hist, 64);
        convoy_gen_stats st;
        if (convoy_generate(c, spec, 0, hist, n_prompt, n_tokens, ignore, NULL, &st, err, sizeof err)) {
            fprintf(stderr, "bench_spec: %s\n", err);
            convoy_spec_free(spec);
            return -1;
        }
        if (cf->drafter < 0 && !nodes)
            memcpy(plain_tokens[p], hist, sizeof(int32_t) * (size_t)(n_prompt + n_tokens));
        else if (memcmp(plain_tokens[p], hist, sizeof(int32_t) * (size_t)(n_prompt + n_tokens)))
            r->equal = false;
        r->gen_s += st.decode_s;
        r->n_gen += st.n_gen - 1; /* the first token comes from the prompt's step */
        r->rounds += st.rounds;
        r->drafted += st.drafted;
        r->accepted += st.accepted;
        convoy_seq_free(c, 0, err, sizeof err);
        if (spec)
            convoy_spec_seq_free(spec, 0);
    }
    r->runs++;
    convoy_spec_free(spec);
    return 0;
}

static double tok_s(const result *r) { return r->gen_s > 0 ? (double)r->n_gen / r->gen_s : 0.0; }
static double accept_rate(const result *r) { return r->drafted ? (double)r->accepted / (double)r->drafted : 0.0; }
static double per_round(const result *r) { return r->rounds ? (double)r->n_gen / (double)r->rounds : 0.0; }

#define MAX_RUNS 20

/* Runs every configuration on one pipeline (nodes NULL: unsplit) in
 * rounds that alternate them, until each has decoded for min_seconds (over
 * a fast link a run lasts a tenth of a second: one run is noise), at most
 * MAX_RUNS rounds. */
static int measure(const char *nodes, const config *cfs, int n_cf, result *res)
{
    convoy_ctx *c = open_pipeline(nodes);
    int rc = c ? 0 : -1;
    for (int i = 0; i < n_cf; i++)
        res[i] = (result){.equal = true};
    for (int run = 0; rc == 0 && run < MAX_RUNS; run++) {
        bool enough = true;
        for (int i = 0; i < n_cf; i++)
            enough = enough && res[i].gen_s >= min_seconds;
        if (enough)
            break;
        for (int i = 0; rc == 0 && i < n_cf; i++)
            rc = run_config(c, nodes, &cfs[i], &res[i]);
    }
    convoy_ctx_free(c);
    return rc;
}

static void config_name(const config *cf, char *buf, size_t n)
{
    char k[16] = "auto", d[32] = "";
    if (cf->k)
        snprintf(k, sizeof k, "%d", cf->k);
    if (cf->windows == 0)
        snprintf(d, sizeof d, ", D auto");
    else if (cf->windows > 1)
        snprintf(d, sizeof d, ", D %d", cf->windows);
    if (cf->drafter < 0)
        snprintf(buf, n, "none");
    else
        snprintf(buf, n, "%s, K %s%s", draft_name[cf->drafter], k, d);
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    for (const char *p = s; *p && n < max;) {
        out[n++] = atoi(p);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *chain_label[MAX_ITEMS], *chain_nodes[MAX_ITEMS];
    static char chain_buf[MAX_ITEMS][1024], draft_buf[MAX_ITEMS][1024];
    int n_chains = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--insecure")) { /* plaintext links to nodes not on loopback (test hosts) */
            insecure = true;
            continue;
        }
        if (!strcmp(a, "--print-prompts")) { /* for a yardstick run on the same prompts */
            for (int p = 0; p < N_PROMPT_TEXTS; p++)
                printf("%s\n", prompt_texts[p]);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "bench_spec: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "-n"))
            n_tokens = atoi(v);
        else if (!strcmp(a, "--prompts"))
            n_prompts = atoi(v);
        else if (!strcmp(a, "--min-seconds"))
            min_seconds = atof(v);
        else if (!strcmp(a, "--k-list"))
            n_k = parse_list(v, k_list, MAX_K);
        else if (!strcmp(a, "--windows-list"))
            n_windows = parse_list(v, windows_list, MAX_K);
        else if ((!strcmp(a, "--chain") || !strcmp(a, "--draft")) && strchr(v, '=')) {
            const bool chain = !strcmp(a, "--chain");
            int *n = chain ? &n_chains : &n_drafts;
            if (*n == MAX_ITEMS)
                return 2;
            char *buf = chain ? chain_buf[*n] : draft_buf[*n];
            snprintf(buf, 1024, "%s", v);
            char *eq = strchr(buf, '=');
            *eq = 0;
            (chain ? chain_label : draft_name)[*n] = buf;
            (chain ? chain_nodes : draft_spec)[*n] = eq + 1;
            (*n)++;
        } else {
            fprintf(stderr, "usage: bench_spec -m MODEL [-n TOKENS] [--prompts N] [--min-seconds S] --draft NAME=ngram|PATH ... "
                            "[--k-list 1,2,...] [--windows-list 1,2,4,8,0] [--insecure] [--chain LABEL=HOST:PORT,... ...]\n");
            return 2;
        }
    }
    if (!model_path || n_tokens < 1 || n_tokens > MAX_TOKENS || n_prompts < 1 || n_prompts > N_PROMPT_TEXTS) {
        fprintf(stderr, "bench_spec: -m MODEL is required; -n 1..%d; --prompts 1..%d\n", MAX_TOKENS, N_PROMPT_TEXTS);
        return 2;
    }
    cv_kernels_init(0);
    char err[512];
    if (!(model = convoy_model_load(model_path, err, sizeof err))) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return 1;
    }
    config cfs[MAX_CONFIGS];
    int n_cf = 0;
    cfs[n_cf++] = (config){-1, 0, 1};
    for (int d = 0; d < n_drafts; d++)
        cfs[n_cf++] = (config){d, 0, 1};
    for (int i = 0; i < n_k && n_drafts; i++)
        cfs[n_cf++] = (config){0, k_list[i], 1};
    for (int i = 0; i < n_windows && n_drafts; i++)
        if (windows_list[i] != 1) /* one window is the drafter's row above */
            cfs[n_cf++] = (config){0, 0, windows_list[i]};

    /* the unsplit model first: plain decoding gives the reference tokens */
    static result unsplit[MAX_CONFIGS];
    if (measure(NULL, cfs, n_cf, unsplit))
        return 1;
    printf("model %s, 1 thread per stage, %d prompt(s) x %d greedy tokens, EOS ignored\n\n", model_path, n_prompts,
           n_tokens);
    printf("| pipeline | speculation | tok/s | accepted | tokens per window | vs same pipeline, no speculation | "
           "vs one window | vs unsplit, same speculation | runs | tokens equal |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    FILE *raw = bench_raw_open("bench/out/spec.jsonl");
    for (int ch = -1; ch < n_chains; ch++) {
        static result res[MAX_CONFIGS];
        if (ch < 0)
            memcpy(res, unsplit, sizeof res);
        else if (measure(chain_nodes[ch], cfs, n_cf, res))
            return 1;
        for (int i = 0; i < n_cf; i++) {
            char name[128];
            config_name(&cfs[i], name, sizeof name);
            const char *label = ch < 0 ? "unsplit" : chain_label[ch];
            /* the unsplit plain run is the reference the others are compared with */
            const char *equal = ch < 0 && i == 0 ? "ref" : res[i].equal ? "yes" : "NO";
            const double one_window = n_drafts ? tok_s(&res[i]) / tok_s(&res[1]) : 0.0; /* res[1]: drafter 0, D 1 */
            printf("| %s | %s | %.2f | %.1f%% | %.2f | %.2f | %.2f | %.2f | %d | %s |\n", label, name, tok_s(&res[i]),
                   100.0 * accept_rate(&res[i]), per_round(&res[i]), tok_s(&res[i]) / tok_s(&res[0]), one_window,
                   tok_s(&res[i]) / tok_s(&unsplit[i]), res[i].runs, equal);
            fflush(stdout);
            bench_raw_append(raw, json_pack("{s:s,s:s,s:s,s:s,s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:b,s:i}", "bench", "spec",
                                            "pipeline", label, "model", model_path, "speculation", name, "prompts",
                                            n_prompts, "tokens", n_tokens, "runs", res[i].runs, "tok_s", tok_s(&res[i]),
                                            "accepted", accept_rate(&res[i]), "tokens_per_traversal", per_round(&res[i]),
                                            "plain_tok_s", tok_s(&res[0]), "unsplit_same_spec_tok_s", tok_s(&unsplit[i]),
                                            "tokens_equal", res[i].equal, "time", (int)time(NULL)));
        }
    }
    bench_raw_close(raw);
    convoy_model_free(model);
    return 0;
}
