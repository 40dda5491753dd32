/* args.c: see args.h. */
#include "args.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* The most options a command has, its own and the shared ones together. */
#define ARG_MAX 64
/* getopt_long's answer for table entry i is ARG_LONG + i (above every letter). */
#define ARG_LONG 256
/* getopt_long's answer for --version (below every letter). */
#define ARG_VERSION 1

const char *arg_version(void) { return "convoy " CONVOY_VERSION; }

int arg_int(const char *flag, const char *s, long lo, long hi, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "convoy: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

char *arg_read_file(const char *cmd, const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "convoy %s: %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        char *grown = realloc(buf, cap * 2);
        if (!grown)
            free(buf);
        buf = grown;
        cap *= 2;
    }
    const bool bad = !buf || ferror(f);
    if (f != stdin)
        fclose(f);
    if (bad) {
        fprintf(stderr, "convoy %s: cannot read %s\n", cmd, path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int arg_dims(const char *s, convoy_synth_params *p)
{
    int64_t *dims[] = {&p->n_embd, &p->n_layer, &p->n_head, &p->n_head_kv, &p->n_ff, &p->n_vocab};
    size_t n_dims = sizeof(dims) / sizeof(dims[0]), i = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    for (; tok && i < n_dims; tok = strtok_r(NULL, ",", &save), i++) {
        int32_t v;
        if (arg_int("--dims", tok, 1, INT32_MAX, &v))
            return -1;
        *dims[i] = v;
    }
    if (i == n_dims && !tok)
        return 0;
    fprintf(stderr, "convoy: --dims wants 6 integers N_EMBD,N_LAYER,N_HEAD,N_HEAD_KV,N_FF,N_VOCAB, not '%s'\n", s);
    return -1;
}

static int parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') {
        fprintf(stderr, "convoy: %s expects a non-negative integer, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "convoy: %s expects a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* A byte count with an optional K, M, G or T suffix (powers of 1000, with
 * a decimal point allowed, as "1.5G"; KiB, MiB, GiB, TiB powers of 1024). */
static int parse_bytes(const char *flag, const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1},         {"K", 1e3},          {"M", 1e6},          {"G", 1e9},          {"T", 1e12},
                 {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    for (size_t i = 0; !errno && end != s && v >= 0 && isfinite(v) && i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix) && v * units[i].scale < 1.8e19) {
            *out = (uint64_t)(v * units[i].scale);
            return 0;
        }
    fprintf(stderr, "convoy: %s expects a size such as 1500000000, 1.5G or 1.4GiB, got '%s'\n", flag, s);
    return -1;
}

static int parse_kv_type(const char *flag, const char *s, bool *f16)
{
    if (strcmp(s, "f32") && strcmp(s, "f16")) {
        fprintf(stderr, "convoy: %s must be f32 or f16, got '%s'\n", flag, s);
        return -1;
    }
    *f16 = !strcmp(s, "f16");
    return 0;
}

static int set_value(const arg_opt *o, const char *flag, const char *v)
{
    switch (o->kind) {
    case ARG_FLAG: *(bool *)o->dst = true; return 0;
    case ARG_NO_FLAG: *(bool *)o->dst = false; return 0;
    case ARG_STR: *(const char **)o->dst = v; return 0;
    case ARG_INT: return arg_int(flag, v, o->lo, o->hi, o->dst);
    case ARG_U64: return parse_u64(flag, v, o->dst);
    case ARG_FLOAT: return parse_float(flag, v, o->dst);
    case ARG_BYTES: return parse_bytes(flag, v, o->dst);
    case ARG_KV_TYPE: return parse_kv_type(flag, v, o->dst);
    }
    return -1;
}

/* Appends n_opts options to all[0..n); returns the new count. */
static int append(arg_opt *all, int n, const arg_opt *opts, size_t n_opts)
{
    assert(n + n_opts <= ARG_MAX);
    memcpy(all + n, opts, n_opts * sizeof *opts);
    return n + (int)n_opts;
}

/* llama.cpp's --no-mmap, accepted: what convoy always does (below). */
static bool no_mmap;

static int append_engine(arg_opt *all, int n, convoy_ctx_params *cp)
{
    const arg_opt engine[] = {
        {"threads", 't', ARG_INT, .dst = &cp->n_threads, .lo = 1, .hi = 256, .env = "CONVOY_THREADS"},
        {"ctx", 0, ARG_INT, .dst = &cp->n_ctx, .lo = 2, .hi = 1 << 24, .env = "CONVOY_CTX"},
        {"batch", 0, ARG_INT, .dst = &cp->n_batch, .lo = 1, .hi = 1 << 16},
        {"prefill-chunk", 0, ARG_INT, .dst = &cp->prefill_chunk, .lo = -1, .hi = 1 << 16},
        {"mem", 0, ARG_BYTES, .dst = &cp->mem_budget, .env = "CONVOY_MEM"},
        {"peer-timeout", 0, ARG_INT, .dst = &cp->timeout_ms, .lo = 1, .hi = 1 << 30},
        {"standby", 0, ARG_STR, .dst = &cp->standby, .env = "CONVOY_STANDBY"},
        {"failover-wait", 0, ARG_INT, .dst = &cp->failover_wait_ms, .lo = 0, .hi = 1 << 30},
        {"kv-type", 0, ARG_KV_TYPE, .dst = &cp->kv_f16},
        {"mlock", 0, ARG_FLAG, .dst = &cp->mlock},
        /* llama.cpp's --no-mmap: the layers' matrices are read into private
         * memory always; the embedding table and experts are read as used */
        {"no-mmap", 0, ARG_FLAG, .dst = &no_mmap},
        /* llama.cpp's spellings: K and V are one type here, the last given */
        {"cache-type-k", 0, ARG_KV_TYPE, .dst = &cp->kv_f16, .word = "ctk"},
        {"cache-type-v", 0, ARG_KV_TYPE, .dst = &cp->kv_f16, .word = "ctv"},
        {"nodes", 0, ARG_STR, .dst = &cp->nodes, .env = "CONVOY_NODES"},
        {"split", 0, ARG_STR, .dst = &cp->split, .env = "CONVOY_SPLIT"},
        {"wire", 0, ARG_STR, .dst = &cp->wire},
        {"key", 0, ARG_STR, .dst = &cp->key_file, .env = "CONVOY_KEY_FILE"},
        {"insecure", 0, ARG_FLAG, .dst = &cp->insecure, .env = "CONVOY_INSECURE"},
        {"no-rebalance", 0, ARG_NO_FLAG, .dst = &cp->rebalance},
    };
    return append(all, n, engine, sizeof engine / sizeof engine[0]);
}

static int append_spec(arg_opt *all, int n, arg_spec *s)
{
    const arg_opt spec[] = {
        {"draft", 0, ARG_STR, .dst = &s->p.draft},
        {"spec-k", 0, ARG_INT, .dst = &s->p.k, .lo = 1, .hi = CONVOY_SPEC_K_LIMIT, .given = &s->k_given},
        {"spec-k-max", 0, ARG_INT, .dst = &s->p.k_max, .lo = 1, .hi = CONVOY_SPEC_K_LIMIT,
         .given = &s->k_max_given},
        {"spec-windows", 0, ARG_INT, .dst = &s->p.windows, .lo = 0, .hi = CONVOY_SPEC_WINDOWS_MAX},
    };
    return append(all, n, spec, sizeof spec / sizeof spec[0]);
}

/* The command's options, then the shared ones it takes, into all[]. */
static int collect(const arg_cmd *cmd, arg_opt *all)
{
    int n = 0;
    for (const arg_opt *o = cmd->opts; o->name || o->letter; o++)
        n = append(all, n, o, 1);
    if (cmd->engine)
        n = append_engine(all, n, cmd->engine);
    if (cmd->spec)
        n = append_spec(all, n, cmd->spec);
    return n;
}

/* getopt_long's tables for the n options: ":" first (a missing value
 * answers ':', not '?'), then the letters; -h/--help for every command. */
static void getopt_tables(const arg_opt *all, int n, struct option *longs, char *letters)
{
    int k = 0, j = 0;
    letters[j++] = ':';
    for (int i = 0; i < n; i++) {
        const int has_arg = all[i].kind == ARG_FLAG || all[i].kind == ARG_NO_FLAG ? no_argument : required_argument;
        if (all[i].name)
            longs[k++] = (struct option){all[i].name, has_arg, NULL, ARG_LONG + i};
        if (all[i].letter) {
            letters[j++] = all[i].letter;
            if (has_arg == required_argument)
                letters[j++] = ':';
        }
    }
    longs[k++] = (struct option){"help", no_argument, NULL, 'h'};
    longs[k++] = (struct option){"version", no_argument, NULL, ARG_VERSION};
    longs[k] = (struct option){0};
    letters[j++] = 'h';
    letters[j] = 0;
}

/* The table entry of getopt_long's answer c, or -1. */
static int entry_of(const arg_opt *all, int n, int c)
{
    if (c >= ARG_LONG)
        return c - ARG_LONG;
    for (int i = 0; i < n; i++)
        if (all[i].letter == c)
            return i;
    return -1;
}

/* The option as the user wrote it: "-m" for a letter, "--model" for a name. */
static void spelled(const arg_opt *o, int c, char *out, size_t n)
{
    if (c >= ARG_LONG)
        snprintf(out, n, "--%s", o->name);
    else
        snprintf(out, n, "-%c", c);
}

/* "-m/--model", "--tokens" or "-o": every name of an option. */
static void all_names(const arg_opt *o, char *out, size_t n)
{
    if (o->letter && o->name)
        snprintf(out, n, "-%c/--%s", o->letter, o->name);
    else if (o->letter)
        snprintf(out, n, "-%c", o->letter);
    else
        snprintf(out, n, "--%s", o->name);
}

/* Says what getopt_long's '?' or ':' was about: optopt is 0 for an
 * unknown long option, the letter for an unknown one, else the option's. */
static void report_error(const arg_cmd *cmd, const arg_opt *all, int n, int c, char **argv)
{
    if (c == '?' && optopt == 0) {
        fprintf(stderr, "convoy %s: unknown option '%s'\n", cmd->name, argv[optind - 1]);
        return;
    }
    const int i = entry_of(all, n, optopt);
    if (i < 0) {
        fprintf(stderr, "convoy %s: unknown option '-%c'\n", cmd->name, optopt);
        return;
    }
    char flag[80];
    spelled(&all[i], optopt, flag, sizeof flag);
    fprintf(stderr, "convoy %s: option '%s' %s\n", cmd->name, flag, c == ':' ? "needs a value" : "takes no value");
}

/* After the options: the positional arguments and the required options. */
static int check_rest(const arg_cmd *cmd, const arg_opt *all, int n, const bool *seen, int argc, char **argv)
{
    const int n_args = argc - optind;
    if (n_args != cmd->n_args) {
        if (cmd->n_args == 0)
            fprintf(stderr, "convoy %s: unexpected argument '%s'\n", cmd->name, argv[optind]);
        else
            fprintf(stderr, "convoy %s: expects %d argument%s, got %d\n", cmd->name, cmd->n_args,
                    cmd->n_args == 1 ? "" : "s", n_args);
        return -1;
    }
    for (int i = 0; i < n_args; i++)
        cmd->args[i] = argv[optind + i];
    for (int i = 0; i < n; i++)
        if (all[i].required && !seen[i]) {
            char names[80];
            all_names(&all[i], names, sizeof names);
            fprintf(stderr, "convoy %s: %s is required\n", cmd->name, names);
            return -1;
        }
    return 0;
}

/* argv with each single-dash word ("-np") spelled as its long option
 * ("--parallel"), up to a "--": a malloc'd copy of the pointers, the
 * spellings after them; NULL when out of memory. */
static char **spell_words(const arg_opt *all, int n, int argc, char **argv)
{
    enum { SPELLED = 80 };
    char **av = malloc(sizeof *av * (size_t)(argc + 1) + (size_t)argc * SPELLED);
    if (!av)
        return NULL;
    char *spellings = (char *)(av + argc + 1);
    bool after_options = false;
    for (int i = 0; i < argc; i++) {
        av[i] = argv[i];
        after_options |= !strcmp(argv[i], "--");
        for (int k = 0; i > 0 && !after_options && argv[i][0] == '-' && k < n; k++)
            if (all[k].word && !strcmp(argv[i] + 1, all[k].word)) {
                av[i] = spellings + (size_t)i * SPELLED;
                snprintf(av[i], SPELLED, "--%s", all[k].name);
            }
    }
    av[argc] = NULL;
    return av;
}

static bool takes_value(const arg_opt *o) { return o->kind != ARG_FLAG && o->kind != ARG_NO_FLAG; }

/* The first single-dash argument of several letters that is no word and
 * whose first letter takes no value (getopt would read "-hf" as -h -f and
 * print the help), or NULL: such a spelling is refused by name, as
 * llama.cpp refuses it. Values of options (argv words spelled) are skipped. */
static const char *flag_cluster(const arg_opt *all, int n, int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        const char *a = argv[i];
        int k = -1;
        if (a[0] != '-' || !a[1])
            continue;
        if (a[1] == '-') { /* "--name VALUE" skips VALUE; "--name=VALUE" holds it */
            for (int j = 0; j < n && k < 0 && !strchr(a, '='); j++)
                k = all[j].name && !strcmp(a + 2, all[j].name) ? j : -1;
            i += k >= 0 && takes_value(&all[k]);
            continue;
        }
        k = entry_of(all, n, (unsigned char)a[1]);
        if (k >= 0 && takes_value(&all[k]))
            i += !a[2]; /* "-m FILE"; "-mFILE" holds it */
        else if (a[2])
            return a;
    }
    return NULL;
}

/* A flag's value in the environment: 1 set, 0 not, -1 neither. */
static int env_flag(const char *v)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i]))
            return 1;
        if (!strcasecmp(v, no[i]))
            return 0;
    }
    return -1;
}

/* The options the command line did not give, from their environment
 * variables; -1 after a message naming a bad value's variable. */
static int from_env(const arg_cmd *cmd, const arg_opt *all, int n, bool *seen)
{
    for (int i = 0; i < n; i++) {
        const char *v = all[i].env && !seen[i] ? getenv(all[i].env) : NULL;
        if (!v || !*v)
            continue;
        const int flag = takes_value(&all[i]) ? 1 : env_flag(v);
        if (flag < 0) {
            fprintf(stderr, "convoy %s: %s is 1, true, yes, on, 0, false, no or off, not '%s'\n", cmd->name,
                    all[i].env, v);
            return -1;
        }
        if (flag == 0)
            continue;
        if (set_value(&all[i], all[i].env, v))
            return -1;
        seen[i] = true;
        if (all[i].given)
            *all[i].given = true;
    }
    return 0;
}

/* --help's last lines: the options' environment variables. */
static void print_env(const arg_opt *all, int n, FILE *f)
{
    bool listed = false;
    for (int i = 0; i < n; i++) {
        if (!all[i].env)
            continue;
        char names[80];
        all_names(&all[i], names, sizeof names);
        if (!listed)
            fprintf(f, "  environment variables, for options the command line does not give:\n");
        fprintf(f, "    %-22s %s\n", all[i].env, names);
        listed = true;
    }
}

/* The loop of arg_parse over argv (words spelled). */
static int parse_all(const arg_cmd *cmd, const arg_opt *all, int n, int argc, char **argv)
{
    struct option longs[ARG_MAX + 3];
    char letters[2 * ARG_MAX + 3];
    bool seen[ARG_MAX] = {0};
    getopt_tables(all, n, longs, letters);
    const char *cluster = flag_cluster(all, n, argc, argv);
    if (cluster) {
        fprintf(stderr, "convoy %s: unknown option '%s'\n", cmd->name, cluster);
        cmd->usage(stderr);
        return 2;
    }
    opterr = 0;  /* the messages below name the command */
    optind = 0;  /* glibc: start afresh */
    for (int c; (c = getopt_long(argc, argv, letters, longs, NULL)) != -1;) {
        if (c == 'h' || c == ARG_VERSION) {
            if (c == 'h') {
                cmd->usage(stdout);
                print_env(all, n, stdout);
            }
            else
                printf("%s\n", arg_version());
            return 0;
        }
        if (c == '?' || c == ':') {
            report_error(cmd, all, n, c, argv);
            cmd->usage(stderr);
            return 2;
        }
        const int i = entry_of(all, n, c);
        char flag[80];
        spelled(&all[i], c, flag, sizeof flag);
        if (set_value(&all[i], flag, optarg))
            return 2;
        seen[i] = true;
        if (all[i].given)
            *all[i].given = true;
    }
    if (from_env(cmd, all, n, seen))
        return 2;
    if (check_rest(cmd, all, n, seen, argc, argv)) {
        cmd->usage(stderr);
        return 2;
    }
    if (cmd->spec && arg_spec_check(cmd->spec, cmd->name))
        return 2;
    if (cmd->spec && cmd->engine && cmd->engine->nodes && cmd->spec->p.draft) /* a batch in flight per window */
        cmd->engine->depth = cmd->spec->p.windows ? cmd->spec->p.windows : CONVOY_SPEC_WINDOWS_MAX;
    return ARG_GO;
}

int arg_parse(const arg_cmd *cmd, int argc, char **argv)
{
    arg_opt all[ARG_MAX];
    const int n = collect(cmd, all);
    char **av = spell_words(all, n, argc, argv);
    if (!av) {
        fprintf(stderr, "convoy %s: out of memory\n", cmd->name);
        return 1;
    }
    const int status = parse_all(cmd, all, n, argc, av);
    free(av);
    return status;
}

arg_spec arg_spec_init(void)
{
    arg_spec s = {.p = convoy_spec_default_params()};
    s.p.draft = NULL;
    return s;
}

int arg_spec_check(const arg_spec *s, const char *cmd)
{
    const char *d = s->p.draft;
    if (!d || !*d || strspn(d, "0123456789") != strlen(d) || access(d, F_OK) == 0)
        return 0;
    fprintf(stderr, "convoy %s: --draft takes 'ngram' or the path of a draft model (a GGUF), not a number "
                    "('%s'); the drafts per round are --spec-k %s\n", cmd, d, d);
    return -1;
}

int arg_spec_open(arg_spec *s, const char *cmd, convoy_ctx *ctx, const convoy_model *m, int32_t n_threads,
                  convoy_spec **out)
{
    *out = NULL;
    if (!s->p.draft) {
        if (!s->k_given && !s->k_max_given)
            return 0;
        fprintf(stderr, "convoy %s: --spec-k and --spec-k-max need --draft\n", cmd);
        return -1;
    }
    if (s->p.k > s->p.k_max && !s->k_max_given)
        s->p.k_max = s->p.k;
    s->p.n_threads = n_threads;
    char err[CONVOY_ERR_MAX];
    if (!(*out = convoy_spec_create(ctx, m, &s->p, err, sizeof err))) {
        fprintf(stderr, "convoy %s: %s\n", cmd, err);
        return -1;
    }
    return 0;
}
