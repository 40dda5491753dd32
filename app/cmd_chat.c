/* cmd_chat.c: `convoy chat`: a conversation in the terminal with the
 * model's own chat template, here or through a pipeline (--nodes), as
 * llama-cli -cnv and `ollama run` hold one.
 *
 * A turn, in phases: read the user's message (read_message: a line, or
 * several when a line ends with a backslash; /clear and /exit are
 * commands), render the whole conversation with the template the server
 * uses (serve/render.h, its contents kept as text: a user who types
 * "<|im_start|>" gets no control token), tokenize it, keep the slot's KV
 * for the prefix it shares with what the slot holds (so a turn costs its
 * new tokens), and generate the reply, printed as it comes until an
 * end-of-generation token, a stop string of the template, -n tokens or
 * Ctrl-C, which stops the reply and not the program. The reply joins the
 * conversation as it was printed. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "hub.h"
#include "serve/buf.h"
#include "serve/render.h"
#include "serve/text.h"

#define CHAT_MAX_TURNS 4096

static void usage(FILE *f)
{
    fprintf(f,
            "usage: convoy chat (-m MODEL | -hf OWNER/REPO[:QUANT]) [--system TEXT] [-n N] [--temp T] [--top-k K]\n"
            "                   [--top-p P] [--min-p P] [--seed S] [--chat-template NAME|FILE] [-t THREADS]\n"
            "                   [--ctx N] [--nodes HOST:PORT,... [--split A,B,...] [--key FILE] [--insecure]]\n"
            "  A conversation with the model in its own chat template. Type a message and press Enter; end a\n"
            "  line with \\ to go on on the next one. /clear forgets the conversation, /exit (or Ctrl-D)\n"
            "  leaves; Ctrl-C stops a reply. -n N: the most tokens of a reply (default: until the model ends\n"
            "  its turn or the context is full); --system: a system message first. A turn runs only its new\n"
            "  tokens: the conversation before it stays in the KV cache.\n");
}

typedef struct chat_opts {
    const char *model_path, *hf, *system, *chat_template;
    char pulled[4096];
    int32_t n_predict;
    bool seed_given;
    convoy_ctx_params cp;
    convoy_sampling_params sp;
} chat_opts;

typedef struct chat_state {
    convoy_model *model;
    convoy_ctx *ctx;
    cv_serve_chat chat;
    int32_t n_ctx;
    int32_t *held;      /* [n_ctx]: the tokens slot 0 holds, then room for a turn's */
    int32_t n_held;
    char *role[CHAT_MAX_TURNS];
    cv_buf text[CHAT_MAX_TURNS];
    int n_msgs;
} chat_state;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Ctrl-C sets `interrupted`; at the prompt (restart false) it also ends
 * the read, while a reply runs the engine's reads and writes go on. */
static void catch_sigint(bool restart)
{
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = restart ? SA_RESTART : 0};
    sigaction(SIGINT, &sa, NULL);
}

static int parse_options(chat_opts *o, int argc, char **argv)
{
    *o = (chat_opts){.n_predict = -1, .cp = convoy_ctx_default_params(), .sp = convoy_sampling_default_params()};
    convoy_sampling_params *sp = &o->sp;
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &o->model_path, .env = "CONVOY_MODEL"},
        {"hf-repo", 0, ARG_STR, .dst = &o->hf, .word = "hf", .env = "CONVOY_HF_REPO"},
        {"system", 0, ARG_STR, .dst = &o->system},
        {"chat-template", 0, ARG_STR, .dst = &o->chat_template},
        {NULL, 'n', ARG_INT, .dst = &o->n_predict, .lo = -1, .hi = 1 << 24},
        {"temp", 0, ARG_FLOAT, .dst = &sp->temp},
        {"top-k", 0, ARG_INT, .dst = &sp->top_k, .lo = 0, .hi = 1 << 30},
        {"top-p", 0, ARG_FLOAT, .dst = &sp->top_p},
        {"min-p", 0, ARG_FLOAT, .dst = &sp->min_p},
        {"seed", 0, ARG_U64, .dst = &sp->seed, .given = &o->seed_given},
        {0},
    };
    const arg_cmd cmd = {.name = "chat", .usage = usage, .opts = opts, .engine = &o->cp};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (!o->seed_given)
        sp->seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    const int pulled = hub_model_option("chat", o->hf, &o->model_path, o->pulled, sizeof o->pulled);
    return pulled ? pulled : ARG_GO;
}

static int open_engine(const chat_opts *o, chat_state *s)
{
    char err[CONVOY_ERR_MAX];
    if (!(s->model = convoy_model_load(o->model_path, err, sizeof err)) ||
        !(s->ctx = convoy_ctx_create(s->model, &o->cp, err, sizeof err)) ||
        convoy_set_sampler(s->ctx, 0, &o->sp, err, sizeof err) ||
        cv_serve_chat_setup(s->model, o->chat_template, &s->chat, err, sizeof err)) {
        fprintf(stderr, "convoy chat: %s\n", err);
        return -1;
    }
    s->n_ctx = convoy_ctx_n_ctx(s->ctx);
    if (!(s->held = malloc(sizeof(int32_t) * (size_t)s->n_ctx))) {
        fprintf(stderr, "convoy chat: out of memory\n");
        return -1;
    }
    return 0;
}

/* ---- the conversation ---- */

static int add_message(chat_state *s, const char *role, const char *text, size_t len)
{
    if (s->n_msgs == CHAT_MAX_TURNS) {
        fprintf(stderr, "convoy chat: the conversation has %d messages, the most it holds: /clear\n", s->n_msgs);
        return -1;
    }
    cv_buf *b = &s->text[s->n_msgs];
    *b = (cv_buf){0};
    if (!(s->role[s->n_msgs] = strdup(role)) || cv_buf_append(b, text, len) || cv_buf_append(b, "", 0)) {
        fprintf(stderr, "convoy chat: out of memory\n");
        return -1;
    }
    s->n_msgs++;
    return 0;
}

/* Forgets the messages from the first-th on. */
static void drop_messages(chat_state *s, int first)
{
    while (s->n_msgs > first) {
        s->n_msgs--;
        free(s->role[s->n_msgs]);
        cv_buf_free(&s->text[s->n_msgs]);
    }
}

/* The conversation rendered and tokenized into s->held from the prefix
 * the slot keeps; *n_new: the tokens to run. */
static int render_turn(chat_state *s, int32_t *keep, int32_t *n_new)
{
    cv_serve_chat_msg msgs[CHAT_MAX_TURNS];
    for (int i = 0; i < s->n_msgs; i++)
        msgs[i] = (cv_serve_chat_msg){.role = s->role[i], .content = s->text[i].p ? s->text[i].p : ""};
    cv_buf prompt = {0};
    convoy_span *spans = NULL;
    int n_spans = 0, rc = -1;
    char err[CONVOY_ERR_MAX];
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)s->n_ctx);
    if (!toks ||
        cv_serve_render_chat(&s->chat, msgs, s->n_msgs, NULL, NULL, &prompt, &spans, &n_spans, err, sizeof err)) {
        fprintf(stderr, "convoy chat: %s\n", toks ? err : "out of memory");
        goto done;
    }
    const int n = convoy_tokenize_spans(s->model, prompt.p, prompt.n, true, spans, n_spans, toks, s->n_ctx);
    if (n < 0 || n >= s->n_ctx) {
        fprintf(stderr, "convoy chat: the conversation no longer fits the context of %d tokens: /clear\n",
                s->n_ctx);
        goto done;
    }
    int32_t k = 0;
    while (k < s->n_held && k < n - 1 && s->held[k] == toks[k]) /* one token at least runs */
        k++;
    memcpy(s->held + k, toks + k, sizeof(int32_t) * (size_t)(n - k));
    *keep = k;
    *n_new = n - k;
    rc = 0;
done:
    free(toks);
    free(spans);
    cv_buf_free(&prompt);
    return rc;
}

/* ---- a reply ---- */

typedef struct reply {
    const convoy_model *model;
    cv_text text;
    cv_buf shown; /* the reply as printed */
    bool failed;
} reply;

static int on_token(void *user, int32_t id)
{
    reply *r = user;
    if (interrupted || convoy_token_is_eog(r->model, id))
        return 1;
    const size_t before = r->shown.n;
    const int rc = cv_text_push(&r->text, id, &r->shown);
    if (rc < 0)
        r->failed = true;
    fwrite(r->shown.p + before, 1, r->shown.n - before, stdout);
    fflush(stdout);
    return rc != 0;
}

/* Runs the turn's new tokens after the kept prefix and prints the reply;
 * it joins the conversation. */
static int reply_turn(const chat_opts *o, chat_state *s, int32_t keep, int32_t n_new)
{
    char err[CONVOY_ERR_MAX];
    reply r = {.model = s->model};
    convoy_gen_stats st;
    const int32_t room = s->n_ctx - keep - n_new;
    const int32_t n_predict = o->n_predict >= 0 && o->n_predict < room ? o->n_predict : room;
    const char *const *stops = cv_serve_chat_stop_strings(&s->chat);
    int n_stops = 0;
    while (stops[n_stops])
        n_stops++;
    snprintf(err, sizeof err, "out of memory");
    if (cv_text_init(&r.text, s->model, stops, n_stops) || convoy_seq_truncate(s->ctx, 0, keep, err, sizeof err)) {
        fprintf(stderr, "convoy chat: %s\n", err);
        return -1;
    }
    interrupted = 0;
    catch_sigint(true);
    int rc = convoy_generate(s->ctx, NULL, 0, s->held, keep + n_new, n_predict, on_token, &r, &st, err, sizeof err);
    if (rc)
        fprintf(stderr, "\nconvoy chat: %s\n", err);
    const size_t before = r.shown.n;
    if (!rc && !r.failed && !interrupted && cv_text_finish(&r.text, &r.shown) >= 0)
        fwrite(r.shown.p + before, 1, r.shown.n - before, stdout);
    fputs(interrupted ? " [stopped]\n" : "\n", stdout);
    s->n_held = convoy_seq_len(s->ctx, 0);
    if (!rc)
        rc = add_message(s, "assistant", r.shown.p ? r.shown.p : "", r.shown.n);
    cv_text_free(&r.text);
    cv_buf_free(&r.shown);
    return rc || r.failed ? -1 : 0;
}

/* ---- the terminal ---- */

typedef enum input { INPUT_MESSAGE, INPUT_CLEAR, INPUT_EXIT } input;

/* A message (lines ending with '\' go on), or a command. Ctrl-C at the
 * prompt starts the message afresh. */
static input read_message(cv_buf *msg)
{
    char line[8192];
    cv_buf_consume(msg, msg->n);
    catch_sigint(false);
    for (bool more = true; more;) {
        fputs(msg->n ? ". " : "> ", stdout);
        fflush(stdout);
        interrupted = 0;
        if (!fgets(line, sizeof line, stdin)) {
            if (!interrupted || feof(stdin))
                return INPUT_EXIT;
            clearerr(stdin);
            fputs("\n(Ctrl-D or /exit leaves)\n", stdout);
            cv_buf_consume(msg, msg->n);
            continue;
        }
        const size_t n = strcspn(line, "\n");
        more = n > 0 && line[n - 1] == '\\';
        if (more)
            line[n - 1] = '\n';
        if (cv_buf_append(msg, line, n))
            return INPUT_EXIT;
    }
    const char *m = msg->p ? msg->p : "";
    if (!strcmp(m, "/exit") || !strcmp(m, "/quit") || !strcmp(m, "/bye"))
        return INPUT_EXIT;
    return strcmp(m, "/clear") ? INPUT_MESSAGE : INPUT_CLEAR;
}

static void close_chat(chat_state *s)
{
    drop_messages(s, 0);
    free(s->held);
    cv_serve_chat_free(&s->chat);
    convoy_ctx_free(s->ctx);
    convoy_model_free(s->model);
}

int cmd_chat(int argc, char **argv)
{
    chat_opts o;
    const int status = parse_options(&o, argc, argv);
    if (status != ARG_GO)
        return status;
    chat_state s = {0};
    catch_sigint(true);
    int rc = open_engine(&o, &s) || (o.system && add_message(&s, "system", o.system, strlen(o.system)));
    const int first = s.n_msgs; /* /clear keeps the system message */
    if (!rc)
        printf("convoy chat: %s, chat template %s. /clear forgets, /exit leaves, Ctrl-C stops a reply.\n",
               o.model_path, cv_serve_chat_name(&s.chat));
    cv_buf msg = {0};
    for (input in; !rc && (in = read_message(&msg)) != INPUT_EXIT;) {
        int32_t keep, n_new;
        if (in == INPUT_CLEAR) {
            drop_messages(&s, first);
            puts("(the conversation is forgotten)");
        } else if (msg.n > 0) {
            rc = add_message(&s, "user", msg.p, msg.n);
            if (!rc && render_turn(&s, &keep, &n_new) == 0)
                rc = reply_turn(&o, &s, keep, n_new);
            else if (!rc)
                drop_messages(&s, s.n_msgs - 1); /* the message that did not fit */
        }
    }
    cv_buf_free(&msg);
    close_chat(&s);
    return rc ? 1 : 0;
}
