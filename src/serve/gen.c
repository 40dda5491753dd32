/* gen.c: a generation, from a request's body to its answer (see gen.h).
 *
 * A generation (struct gen) owns the parsed request, the scheduler's
 * request handle and the text state; it waits on the request in slices of
 * POLL_MS and between them looks at the socket (a hang-up or EOF means the
 * client left: the request is released, which cancels it). Non-streaming
 * answers wait in the handler and then send one JSON body; streaming
 * answers are a callback response whose reader waits the same way and
 * returns server-sent events, one chunk per batch of new text. The reader
 * never returns 0 bytes (with a thread per connection that would spin).
 * The gen is freed by the response's free callback, or by the handler for
 * non-streaming answers; h->n_gens counts those not yet freed, for the
 * drain. The request's struct conn outlives its gen (it is freed when the
 * request completes), so the gen writes the log's counts into it. */
#include "serve/gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "serve/llamacpp.h"
#include "serve/log.h"
#include "serve/ollama.h"
#include "serve/resp.h"
#include "serve/think.h"
#include "serve/text.h"

enum { SSE_BLOCK = 16 * 1024 };

typedef struct gen {
    cv_http *h;
    conn *cc;
    oai_request req;
    cv_request *r;
    cv_text text;
    int fd;
    char id[48];
    long long created;
    int32_t n_seen;     /* tokens turned into text */
    int32_t lp_next;    /* first token whose logprobs are not yet sent */
    int choice;         /* its index among the request's n choices */
    bool in_choices;    /* one of n > 1 choices: choices_fill ends the stream, not its own events */
    bool ollama;        /* answered in Ollama's shapes (ollama.h), as kind says */
    bool llamacpp;      /* answered in llama-server's /completion shapes (llamacpp.h) */
    ollama_kind okind;
    cv_buf out;         /* text not yet sent */
    bool thinking;      /* a chat whose <think> block goes apart (req.split_reasoning) */
    cv_think think;     /* the split of its text so far */
    cv_buf reasoning, content; /* a streamed fill's split, kept for the next fill's */
    cv_buf all;         /* a streamed response's whole text, for its .done events; with tools, a chat's */
    resp_ids resp;      /* a response's ids and event count */
    char msg_id[48];
    size_t text_sent;   /* bytes of text sent before out */
    const char *finish; /* "stop" / "length" once over */
    oai_error error;    /* status != 0: failed */
    /* streaming */
    cv_buf sse;
    size_t sse_off;
    bool role_sent, over;
} gen;

static void gen_free(void *cls)
{
    gen *g = cls;
    cv_http *h = g->h;
    cv_request_release(g->r);
    cv_text_free(&g->text);
    cv_oai_request_free(&g->req);
    cv_buf_free(&g->out);
    cv_buf_free(&g->all);
    cv_buf_free(&g->sse);
    cv_think_free(&g->think);
    cv_buf_free(&g->reasoning);
    cv_buf_free(&g->content);
    cv_free(g);
    pthread_mutex_lock(&h->mu);
    h->n_gens--;
    pthread_cond_broadcast(&h->gens_done);
    pthread_mutex_unlock(&h->mu);
}

/* Why a generation ended without its text: 503 while the server shuts down. */
static void gen_failed(gen *g, cv_finish f)
{
    if (cv_http_draining(g->h)) {
        g->cc->retry_after = 5;
        cv_oai_fail(&g->error, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return;
    }
    cv_oai_fail(&g->error, 500, "server_error", NULL, NULL, "the generation failed: %s",
             f == CV_FINISH_ERROR ? cv_request_error(g->r) : "cancelled");
}

/* Turns the tokens that arrived into text. Returns 1 once the generation
 * is over (g->finish or g->error set), 0 while it runs. */
static int gen_poll(gen *g, int timeout_ms)
{
    cv_finish f;
    const int32_t n = cv_request_wait(g->r, g->n_seen, timeout_ms, &f);
    const int32_t *toks = cv_request_tokens(g->r);
    if (n > 0 && g->cc->ttft < 0)
        g->cc->ttft = cv_now_s() - g->cc->t0;
    while (g->n_seen < n && !g->finish) {
        const int rc = cv_text_push(&g->text, toks[g->n_seen++], &g->out);
        if (rc < 0)
            return cv_oai_fail(&g->error, 500, "server_error", NULL, NULL, "out of memory"), 1;
        if (rc == 1) {
            g->finish = "stop";
            cv_request_cancel(g->r);
        }
    }
    g->cc->n_gen = g->n_seen;
    if (g->finish)
        return 1;
    if (f == CV_RUNNING)
        return 0;
    if (f == CV_FINISH_ERROR || f == CV_FINISH_CANCELLED) {
        gen_failed(g, f);
        return 1;
    }
    const int rc = cv_text_finish(&g->text, &g->out);
    if (rc < 0)
        return cv_oai_fail(&g->error, 500, "server_error", NULL, NULL, "out of memory"), 1;
    g->finish = rc == 1 || f == CV_FINISH_STOP ? "stop" : "length";
    return 1;
}

static oai_usage gen_usage(const gen *g)
{
    return (oai_usage){.prompt_tokens = g->req.params.n_prompt, .cached_tokens = cv_request_cached(g->r),
                       .completion_tokens = g->n_seen};
}

/* The logprobs of the tokens since the last call (NULL if not asked for). */
static json_t *gen_logprobs(gen *g)
{
    if (g->req.params.top_logprobs < 0)
        return NULL;
    json_t *lp = cv_oai_logprobs(g->h->srv->model, g->req.kind, g->r, g->lp_next, g->n_seen - g->lp_next,
                              g->req.params.top_logprobs, g->text_sent);
    g->lp_next = g->n_seen;
    return lp;
}

/* An event: a server-sent event, or for Ollama a line of JSON. */
static int sse_event(gen *g, char *json)
{
    if (!json)
        return -1;
    const int rc = g->ollama ? cv_buf_puts(&g->sse, json) || cv_buf_puts(&g->sse, "\n")
                             : cv_buf_puts(&g->sse, "data: ") || cv_buf_puts(&g->sse, json) ||
                                   cv_buf_puts(&g->sse, "\n\n");
    free(json);
    return rc ? -1 : 0;
}

/* Ollama's figures of the generation so far. */
static ollama_stats gen_ollama_stats(const gen *g)
{
    const double total = cv_now_s() - g->cc->t0;
    return (ollama_stats){.prompt_tokens = g->req.params.n_prompt - cv_request_cached(g->r),
                          .cached_tokens = cv_request_cached(g->r),
                          .eval_tokens = g->n_seen, .total_s = total,
                          .prompt_s = g->cc->ttft >= 0 ? g->cc->ttft : total, .stop_hit = g->text.stop_hit};
}

/* A chunk as an event in the request's shapes (Ollama's have none for
 * some chunks). */
static int send_chunk(gen *g, const oai_chunk *ch)
{
    if (g->llamacpp) {
        bool none;
        const ollama_stats st = ch->finish ? gen_ollama_stats(g) : (ollama_stats){0};
        char *json = cv_llamacpp_chunk_json(g->h->srv, ch, &st, &none);
        return none ? 0 : sse_event(g, json);
    }
    if (!g->ollama) {
        oai_chunk indexed = *ch;
        indexed.index = g->choice;
        return sse_event(g, cv_oai_chunk_json(g->h->srv, g->req.kind, g->id, g->created, &indexed));
    }
    bool none;
    const ollama_stats st = ch->finish ? gen_ollama_stats(g) : (ollama_stats){0}; /* the last line's */
    char *json = cv_ollama_chunk_json(g->h->srv, g->okind, ch, &st, &none);
    json_decref(ch->logprobs);
    return none ? 0 : sse_event(g, json);
}

/* An OpenAI chat's first chunk carries the role, before any token. */
static bool opens_with_role(const gen *g) { return g->req.kind == OAI_CHAT && !g->ollama; }

/* sse_fill for /v1/responses: the opening events first, then a delta per
 * batch of text (with tools, as far as cv_tools_safe lets it), then the
 * closing events with the calls read out of the text (no [DONE]: OpenAI
 * sends none). */
static int resp_fill(gen *g, bool over)
{
    const oai_usage usage = gen_usage(g);
    if (!g->role_sent && cv_resp_sse_start(g->h->srv, &g->resp, &g->sse))
        return -1;
    g->role_sent = true;
    if (g->error.status) {
        snprintf(g->cc->failure, sizeof g->cc->failure, "%.150s", g->error.message);
        g->over = over;
        return cv_resp_sse_error(&g->resp, &g->error, &g->sse);
    }
    if (cv_buf_append(&g->all, g->out.p, g->out.n))
        return -1;
    cv_buf_consume(&g->out, g->out.n);
    const char *all = g->all.p ? g->all.p : "";
    cv_tool_calls calls = {0};
    if (over && g->req.tools != CV_TOOLS_NONE &&
        cv_tools_parse(g->req.tools, all, g->all.n, cv_http_fresh(g->h), &calls))
        return -1;
    /* the content begins with every byte already sent (tools.h) */
    const size_t safe = over ? (g->req.tools != CV_TOOLS_NONE ? calls.content.n : g->all.n)
                             : cv_tools_safe(g->req.tools, all, g->all.n);
    int rc = 0;
    if (safe > g->text_sent)
        rc = cv_resp_sse_delta(&g->resp, all + g->text_sent, safe - g->text_sent, &g->sse);
    g->text_sent = safe > g->text_sent ? safe : g->text_sent;
    if (over && rc == 0)
        rc = cv_resp_sse_done(g->h->srv, &g->resp, all, g->all.n, g->finish, &calls, &usage, &g->sse);
    cv_tool_calls_free(&calls);
    g->over = over;
    return rc;
}

/* Sends a text chunk of the n bytes at p when there is text, logprobs or
 * (chat) the role to send. */
static int text_chunk(gen *g, const char *p, size_t n)
{
    const bool lp = g->req.params.top_logprobs >= 0 && g->lp_next < g->n_seen;
    if (!n && !lp && (!opens_with_role(g) || g->role_sent))
        return 0;
    const oai_chunk ch = {.text = p, .text_len = n, .first = opens_with_role(g) && !g->role_sent,
                          .logprobs = gen_logprobs(g), .include_usage = g->req.include_usage};
    if (send_chunk(g, &ch))
        return -1;
    g->role_sent = true;
    g->text_sent += n;
    return 0;
}

/* A thinking chat: the new text's reasoning goes out as its own deltas
 * (with the role in the first), its content stays in g->out. */
static int split_reasoning(gen *g, bool over)
{
    cv_buf_consume(&g->reasoning, g->reasoning.n);
    cv_buf_consume(&g->content, g->content.n);
    int rc = cv_think_push(&g->think, g->out.p, g->out.n, over, &g->reasoning, &g->content);
    if (rc == 0 && g->reasoning.n) {
        const oai_chunk ch = {.reasoning = g->reasoning.p, .reasoning_len = g->reasoning.n,
                              .first = !g->role_sent, .include_usage = g->req.include_usage};
        rc = send_chunk(g, &ch);
        g->role_sent = true;
    }
    const cv_buf pushed = g->out; /* its buffer is the next fill's content */
    g->out = g->content;
    g->content = pushed;
    return rc;
}

/* A chat with tools: the text so far gathers in g->all and goes out only
 * as far as cv_tools_safe lets it (the rest may be a call); when over, the
 * rest of the content, then each call's opening (id and name) and
 * arguments chunks, and *finish becomes "tool_calls" when there are calls. */
static int tools_fill(gen *g, bool over, const char **finish)
{
    if (cv_buf_append(&g->all, g->out.p, g->out.n))
        return -1;
    const char *all = g->all.p ? g->all.p : "";
    if (!over) {
        const size_t safe = cv_tools_safe(g->req.tools, all, g->all.n);
        return text_chunk(g, all + g->text_sent, safe > g->text_sent ? safe - g->text_sent : 0);
    }
    cv_tool_calls calls = {0};
    if (cv_tools_parse(g->req.tools, all, g->all.n, cv_http_fresh(g->h), &calls))
        return -1;
    /* the content begins with every byte already sent (tools.h) */
    const char *content = calls.content.p ? calls.content.p : "";
    int rc = text_chunk(g, content + g->text_sent, calls.content.n > g->text_sent ? calls.content.n - g->text_sent : 0);
    for (int i = 0; i < calls.n && !rc; i++) {
        const oai_chunk opening = {.call = &calls.calls[i], .call_index = i, .include_usage = g->req.include_usage};
        const oai_chunk args = {.call = &calls.calls[i], .call_index = i, .call_args = true,
                                .include_usage = g->req.include_usage};
        rc = send_chunk(g, &opening) || send_chunk(g, &args);
    }
    if (calls.n)
        *finish = "tool_calls";
    cv_tool_calls_free(&calls);
    return rc ? -1 : 0;
}

/* Appends the events for what gen_poll produced: a text chunk, and when
 * the generation is over the final chunk, the usage chunk and [DONE]. */
static int sse_fill(gen *g, bool over)
{
    if (g->req.kind == OAI_RESPONSES)
        return resp_fill(g, over);
    const oai_usage usage = gen_usage(g);
    if (g->error.status) {
        snprintf(g->cc->failure, sizeof g->cc->failure, "%.150s", g->error.message);
        if (sse_event(g, g->ollama ? cv_ollama_error_json(&g->error) : cv_oai_error_json(&g->error)))
            return -1;
    } else {
        const char *finish = g->finish;
        if ((g->thinking && split_reasoning(g, over)) ||
            (g->req.tools != CV_TOOLS_NONE ? tools_fill(g, over, &finish)
                                           : text_chunk(g, g->out.p ? g->out.p : "", g->out.n)))
            return -1;
        cv_buf_consume(&g->out, g->out.n);
        if (over) { /* the usage goes with the end, but n choices' with the last one's (choices_fill) */
            const bool alone = !g->in_choices;
            const oai_chunk fin = {.text = "", .finish = finish, .include_usage = g->req.include_usage,
                                   .usage = g->req.include_usage || !alone ? NULL : &usage};
            const oai_chunk u = {.usage_only = true, .usage = &usage};
            if (send_chunk(g, &fin) || (alone && g->req.include_usage && send_chunk(g, &u)))
                return -1;
        }
    }
    if (over && !g->ollama && !g->llamacpp && !g->in_choices && cv_buf_puts(&g->sse, "data: [DONE]\n\n"))
        return -1;
    g->over = over;
    return 0;
}

/* A stream waiting longer than this for its next event (a long prompt, a
 * queue) gets an SSE comment, which clients skip: a connection that sends
 * nothing for idle_timeout_s is closed, and a first token may take
 * minutes on a CPU. */
static double keepalive_s(const cv_http *h) { return h->idle_timeout_s / 3.0; }

/* A stream's next events: what arrived within timeout_ms (an OpenAI chat
 * sends its opening role chunk first, at once). */
static int gen_step(gen *g, int timeout_ms)
{
    const bool polls = g->role_sent || g->req.kind == OAI_COMPLETIONS || g->ollama; /* no opening to send */
    const bool over = polls ? gen_poll(g, timeout_ms) : false;
    return sse_fill(g, over);
}

/* Copies up to max bytes of the events not yet read (*off of sse is). */
static ssize_t take_events(cv_buf *sse, size_t *off, char *buf, size_t max)
{
    size_t k = sse->n - *off;
    if (k > max)
        k = max;
    memcpy(buf, sse->p + *off, k);
    *off += k;
    if (*off == sse->n) {
        cv_buf_consume(sse, sse->n);
        *off = 0;
    }
    return (ssize_t)k;
}

/* Whether a stream with nothing to send for keepalive_s is due a comment. */
static bool keepalive_due(const cv_http *h, double *waiting_since)
{
    if (cv_now_s() - *waiting_since < keepalive_s(h))
        return false;
    *waiting_since = cv_now_s();
    return true;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gen *g = cls;
    double waiting_since = cv_now_s();
    for (;;) {
        if (g->sse_off == g->sse.n && !g->over && keepalive_due(g->h, &waiting_since)) {
            const oai_chunk empty = {.text = ""}; /* NDJSON has no comments: an empty line of text */
            if (g->ollama ? send_chunk(g, &empty) : cv_buf_puts(&g->sse, ": keep-alive\n\n"))
                return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (g->sse_off < g->sse.n)
            return take_events(&g->sse, &g->sse_off, buf, max);
        if (g->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (cv_peer_gone(g->fd))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (gen_step(g, POLL_MS))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* A chat template's render stops when its client left. */
static bool gen_client_gone(void *user) { return cv_peer_gone(((const gen *)user)->fd); }

/* Parses the request of body (cc's, or what an Ollama body means) into a
 * new gen for choice `choice` (its seed the request's plus choice); NULL
 * with e filled when refused. */
static gen *gen_parse(cv_http *h, struct MHD_Connection *c, conn *cc, oai_kind kind, const char *body, size_t len,
                      int choice, oai_error *e)
{
    gen *g = cv_calloc(1, sizeof *g);
    if (!g)
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    g->h = h;
    g->cc = cc;
    pthread_mutex_lock(&h->mu);
    h->n_gens++;
    pthread_mutex_unlock(&h->mu);
    const uint64_t seed = h->props.seed >= 0 ? (uint64_t)h->props.seed : cv_http_fresh(h);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    const cv_serve_render_watch watch = {gen_client_gone, g};
    g->ollama = cv_route_is_ollama(cc->rt);
    g->llamacpp = cc->rt == R_LLAMACPP_COMPLETION || cc->rt == R_INFILL;
    g->okind = cc->rt == R_OLLAMA_CHAT ? OLLAMA_CHAT : OLLAMA_GENERATE;
    if (cv_oai_parse_request(h->srv, kind, body, len, seed, &watch, &g->req, e)) {
        gen_free(g);
        return NULL;
    }
    cc->n_prompt = g->req.params.n_prompt;
    g->choice = choice;
    g->req.params.sampler.seed += (uint64_t)choice;
    if (g->req.echo.n && cv_buf_append(&g->out, g->req.echo.p, g->req.echo.n)) {
        gen_free(g);
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    g->req.params.client = cc->client_id;
    g->thinking = kind == OAI_CHAT && g->req.split_reasoning;
    cv_think_init(&g->think, g->req.think_open);
    int rc = cv_text_init(&g->text, h->srv->model, (const char *const *)g->req.stop, g->req.n_stop);
    for (const char *const *marker = cv_tools_markers(g->req.tools); !rc && *marker; marker++)
        rc = cv_text_show(&g->text, *marker);
    if (rc) {
        gen_free(g);
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    return g;
}

/* Names a submitted gen (choices after the first take the first's id and
 * time, `first`). */
static void gen_name(gen *g, const gen *first)
{
    cv_http *h = g->h;
    conn *cc = g->cc;
    const oai_kind kind = g->req.kind;
    const unsigned long long serial = first ? 0 : (unsigned long long)cv_http_fresh(h);
    if (kind == OAI_RESPONSES) { /* OpenAI's ids: resp_ for the response, msg_ for its message */
        snprintf(g->id, sizeof g->id, "resp_%016llx", serial);
        snprintf(g->msg_id, sizeof g->msg_id, "msg_%016llx", serial);
    } else if (first) {
        snprintf(g->id, sizeof g->id, "%s", first->id);
    } else {
        snprintf(g->id, sizeof g->id, "%s-%016llx", kind == OAI_CHAT ? "chatcmpl" : "cmpl", serial);
    }
    cv_log(CV_LOG_DEBUG, "%s from %s: %s queued: %d prompt tokens, max_tokens %d, seed %llu%s", cc->path, cc->client,
           g->id, g->req.params.n_prompt, g->req.params.max_tokens,
           (unsigned long long)g->req.params.sampler.seed, g->req.stream ? ", streamed" : "");
    g->created = first ? first->created : (long long)time(NULL);
    g->resp = (resp_ids){.id = g->id, .msg_id = g->msg_id, .created = g->created};
}

/* Submits g's request and names it; when refused, frees g (e says why). */
static int gen_submit(gen *g, oai_error *e)
{
    char err[CV_ERRLEN];
    const cv_submit_result sr = cv_sched_submit(g->h->sched, &g->req.params, &g->r, err, sizeof err);
    if (sr != CV_SUBMIT_OK) {
        cv_http_submit_refused(g->h, g->cc, sr, err, e);
        gen_free(g);
        return -1;
    }
    gen_name(g, NULL);
    return 0;
}

/* What an answer's text holds apart: a thinking chat's reasoning, a chat
 * with tools its calls; the buffers an oai_answer points into. */
typedef struct answer_parts {
    cv_buf reasoning, content;
    cv_tool_calls calls;
    oai_usage usage;
} answer_parts;

static void answer_parts_free(answer_parts *p)
{
    cv_tool_calls_free(&p->calls);
    cv_buf_free(&p->reasoning);
    cv_buf_free(&p->content);
}

/* A whole chat or completion answer of g into a (pointing into p); -1
 * when out of memory. */
static int answer_of(gen *g, answer_parts *p, oai_answer *a)
{
    const char *text = g->out.p ? g->out.p : "";
    p->usage = gen_usage(g);
    if (g->thinking && cv_think_push(&g->think, text, g->out.n, true, &p->reasoning, &p->content))
        return -1;
    const cv_buf *answer = g->thinking ? &p->content : &g->out;
    text = answer->p ? answer->p : "";
    const bool tools = g->req.tools != CV_TOOLS_NONE;
    if (tools && cv_tools_parse(g->req.tools, text, answer->n, cv_http_fresh(g->h), &p->calls))
        return -1;
    *a = (oai_answer){.text = text, .text_len = answer->n, .reasoning = p->reasoning.n ? p->reasoning.p : NULL,
                      .reasoning_len = p->reasoning.n, .finish = g->finish, .calls = tools ? &p->calls : NULL,
                      .logprobs = gen_logprobs(g), .usage = &p->usage};
    return 0;
}

/* A whole /v1/responses answer: its text and the calls read out of it. */
static char *resp_answer_json(gen *g)
{
    const oai_usage usage = gen_usage(g);
    const char *text = g->out.p ? g->out.p : "";
    cv_tool_calls calls = {0};
    char *json = NULL;
    if (g->req.tools == CV_TOOLS_NONE || cv_tools_parse(g->req.tools, text, g->out.n, cv_http_fresh(g->h), &calls) == 0)
        json = cv_resp_object_json(g->h->srv, &g->resp, text, g->out.n, g->finish, &calls, &usage);
    cv_tool_calls_free(&calls);
    return json;
}

/* A whole answer's body (NULL when out of memory). */
static char *answer_json(gen *g)
{
    if (g->req.kind == OAI_RESPONSES) /* the calls are items of the response's output */
        return resp_answer_json(g);
    answer_parts p = {0};
    oai_answer a;
    char *json = NULL;
    if (answer_of(g, &p, &a) == 0) {
        const ollama_stats st = gen_ollama_stats(g);
        json = g->ollama     ? cv_ollama_answer_json(g->h->srv, g->okind, &a, &st)
               : g->llamacpp ? cv_llamacpp_answer_json(g->h->srv, &a, &st)
                             : cv_oai_response_json(g->h->srv, g->req.kind, g->id, g->created, &a);
    }
    answer_parts_free(&p);
    return json;
}

/* The OpenAI body of an Ollama request into *body (NULL: e says why, or
 * it only loads the model: *loaded is the answer). */
static void ollama_request(cv_http *h, conn *cc, oai_kind *kind, char **body, char **loaded, oai_error *e)
{
    const ollama_kind k = cc->rt == R_OLLAMA_CHAT ? OLLAMA_CHAT : OLLAMA_GENERATE;
    bool load_only;
    *loaded = NULL;
    *body = cv_ollama_to_openai(k, cc->body.p ? cc->body.p : "", cc->body.n, kind, &load_only, e);
    if (load_only && !(*loaded = cv_ollama_loaded_json(h->srv, k)))
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* A request's n > 1 choices: a gen each, their events merged into one
 * stream, which ends once all have. */
typedef struct choices {
    cv_http *h;
    gen *g[OAI_MAX_CHOICES];
    int n;
    cv_buf sse;
    size_t sse_off;
    bool over;
} choices;

static void choices_free(void *cls)
{
    choices *ch = cls;
    for (int i = 0; i < ch->n; i++)
        if (ch->g[i])
            gen_free(ch->g[i]);
    cv_buf_free(&ch->sse);
    cv_free(ch);
}

/* The prompt alone, once, before the choices: a one-token request whose
 * slot keeps the prompt, from which each choice's slot copies it (sched.h),
 * so the n choices run it once. Its failure only costs them that. */
static void run_prompt_alone(gen *g)
{
    cv_request_params p = g->req.params;
    p.max_tokens = 1;
    p.sampler = convoy_sampling_default_params();
    p.sampler.temp = 0.0f;
    p.top_logprobs = -1;
    p.grammar = NULL;
    cv_request *r;
    char err[CV_ERRLEN];
    if (p.cold || cv_sched_submit(g->h->sched, &p, &r, err, sizeof err) != CV_SUBMIT_OK)
        return;
    cv_finish f = CV_RUNNING;
    while (f == CV_RUNNING && !cv_peer_gone(g->fd))
        cv_request_wait(r, 0, POLL_MS, &f);
    cv_request_cancel(r);
    cv_request_release(r);
}

/* Parses the choices after the first (`first`, parsed) and submits them
 * together; NULL with e filled when refused (then none runs). */
static choices *choices_start(cv_http *h, struct MHD_Connection *c, gen *first, const char *body, size_t len,
                              oai_error *e)
{
    choices *ch = cv_calloc(1, sizeof *ch);
    if (!ch) {
        gen_free(first);
        return cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    ch->h = h;
    ch->n = first->req.n_choices;
    ch->g[0] = first;
    run_prompt_alone(first);
    for (int i = 1; i < ch->n; i++)
        if (!(ch->g[i] = gen_parse(h, c, first->cc, first->req.kind, body, len, i, e)))
            goto fail;
    cv_request_params params[OAI_MAX_CHOICES];
    cv_request *r[OAI_MAX_CHOICES];
    for (int i = 0; i < ch->n; i++)
        params[i] = ch->g[i]->req.params;
    char err[CV_ERRLEN];
    const cv_submit_result sr = cv_sched_submit_all(h->sched, params, ch->n, r, err, sizeof err);
    if (sr != CV_SUBMIT_OK) {
        cv_http_submit_refused(h, first->cc, sr, err, e);
        goto fail;
    }
    for (int i = 0; i < ch->n; i++) {
        ch->g[i]->r = r[i];
        ch->g[i]->in_choices = true;
        gen_name(ch->g[i], i ? ch->g[0] : NULL);
    }
    return ch;
fail:
    choices_free(ch);
    return NULL;
}

static oai_usage choices_usage(const choices *ch)
{
    oai_usage u = gen_usage(ch->g[0]);
    for (int i = 1; i < ch->n; i++) {
        const oai_usage ui = gen_usage(ch->g[i]);
        u.completion_tokens += ui.completion_tokens;
        if (ui.cached_tokens < u.cached_tokens) /* the prompt counts once: what its coldest run took */
            u.cached_tokens = ui.cached_tokens;
    }
    return u;
}

/* Each choice's next events into the merged stream; once all are over,
 * the usage (when asked for) and [DONE]. */
static int choices_fill(choices *ch)
{
    bool all_over = true;
    for (int i = 0; i < ch->n; i++) {
        gen *g = ch->g[i];
        if (!g->over && gen_step(g, POLL_MS / ch->n))
            return -1;
        if (cv_buf_append(&ch->sse, g->sse.p, g->sse.n))
            return -1;
        cv_buf_consume(&g->sse, g->sse.n);
        all_over &= g->over;
    }
    if (!all_over)
        return 0;
    const oai_usage usage = choices_usage(ch);
    gen *g0 = ch->g[0];
    const oai_chunk u = {.usage_only = true, .usage = &usage};
    if ((g0->req.include_usage && send_chunk(g0, &u)) || cv_buf_append(&ch->sse, g0->sse.p, g0->sse.n) ||
        cv_buf_puts(&ch->sse, "data: [DONE]\n\n"))
        return -1;
    ch->over = true;
    return 0;
}

static ssize_t choices_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    choices *ch = cls;
    double waiting_since = cv_now_s();
    for (;;) {
        if (ch->sse_off == ch->sse.n && !ch->over && keepalive_due(ch->h, &waiting_since) &&
            cv_buf_puts(&ch->sse, ": keep-alive\n\n"))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ch->sse_off < ch->sse.n)
            return take_events(&ch->sse, &ch->sse_off, buf, max);
        if (ch->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (cv_peer_gone(ch->g[0]->fd) || choices_fill(ch))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* The whole answer of n choices (NULL when out of memory); a choice that
 * failed makes the request's error. */
static char *choices_json(choices *ch, oai_error *e)
{
    for (int i = 0; i < ch->n; i++)
        if (ch->g[i]->error.status) {
            *e = ch->g[i]->error;
            return NULL;
        }
    answer_parts p[OAI_MAX_CHOICES] = {0};
    oai_answer a[OAI_MAX_CHOICES];
    int n_ready = 0;
    while (n_ready < ch->n && answer_of(ch->g[n_ready], &p[n_ready], &a[n_ready]) == 0)
        n_ready++;
    const oai_usage usage = choices_usage(ch);
    gen *g0 = ch->g[0];
    char *json = n_ready == ch->n ? cv_oai_choices_json(g0->h->srv, g0->req.kind, g0->id, g0->created, a, ch->n, &usage)
                                  : NULL;
    for (int i = 0; i < ch->n; i++)
        answer_parts_free(&p[i]);
    if (!json)
        cv_oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return json;
}

/* n > 1 choices of the request first holds (body: to parse each). */
static enum MHD_Result generate_choices(cv_http *h, struct MHD_Connection *c, conn *cc, gen *first,
                                        const char *body, size_t len)
{
    oai_error e = {0};
    const bool stream = first->req.stream;
    choices *ch = choices_start(h, c, first, body, len, &e);
    if (!ch)
        return cv_http_send_error(h, c, cc, &e);
    if (stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, choices_reader,
                                                                      ch, choices_free);
        if (!resp) {
            choices_free(ch);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        return cv_http_queue(h, c, cc, 200, resp);
    }
    for (int i = 0; i < ch->n; i++)
        while (!gen_poll(ch->g[i], POLL_MS))
            if (cv_peer_gone(ch->g[i]->fd)) {
                choices_free(ch);
                return MHD_NO;
            }
    char *json = choices_json(ch, &e);
    choices_free(ch);
    return json ? cv_http_send_json(h, c, cc, 200, json) : cv_http_send_error(h, c, cc, &e);
}

enum MHD_Result cv_gen_answer(cv_http *h, struct MHD_Connection *c, conn *cc)
{
    oai_kind kind = cc->rt == R_CHAT ? OAI_CHAT : cc->rt == R_RESPONSES ? OAI_RESPONSES : OAI_COMPLETIONS;
    oai_error e = {0};
    char *translated = NULL /* an Ollama or llama.cpp route's body as OpenAI's */, *loaded = NULL;
    if (cv_route_is_ollama(cc->rt)) {
        ollama_request(h, cc, &kind, &translated, &loaded, &e);
        if (!translated)
            return loaded ? cv_http_send_json(h, c, cc, 200, loaded) : cv_http_send_error(h, c, cc, &e);
    } else if (cc->rt == R_LLAMACPP_COMPLETION || cc->rt == R_INFILL) {
        if (!(translated = cv_llamacpp_to_openai(h->srv, cc->rt == R_INFILL, cc->body.p ? cc->body.p : "", cc->body.n,
                                             &e)))
            return cv_http_send_error(h, c, cc, &e);
    }
    const char *body = translated ? translated : cc->body.p ? cc->body.p : "";
    const size_t len = translated ? strlen(translated) : cc->body.n;
    gen *g = gen_parse(h, c, cc, kind, body, len, 0, &e);
    if (g && g->req.n_choices > 1) {
        const enum MHD_Result rc = generate_choices(h, c, cc, g, body, len);
        free(translated);
        return rc;
    }
    free(translated);
    if (!g || gen_submit(g, &e))
        return cv_http_send_error(h, c, cc, &e);
    if (g->req.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_reader, g,
                                                                      gen_free);
        if (!resp) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", g->ollama ? "application/x-ndjson" : "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        return cv_http_queue(h, c, cc, 200, resp);
    }
    while (!gen_poll(g, POLL_MS))
        if (cv_peer_gone(g->fd)) {
            gen_free(g);
            return MHD_NO;
        }
    if (g->error.status) {
        const enum MHD_Result rc = cv_http_send_error(h, c, cc, &g->error);
        gen_free(g);
        return rc;
    }
    char *json = answer_json(g);
    gen_free(g);
    return cv_http_send_json(h, c, cc, 200, json);
}
