/* http.c: the HTTP routes of `convoy serve` on libmicrohttpd (see http.h).
 *
 * Design: the daemon runs one thread per connection, so a connection's
 * thread may block while its request is generated. The access handler is
 * called once when a request's headers are in (begin: the route, the
 * method, the key, the origin and the body's type are judged there and a
 * refusal is kept in the request's struct conn), then once per piece of
 * body (take_body: gathered up to the cap, dropped past it or when the
 * request is refused), then once more (answer). Answers go out in that
 * last call, never in the first: a response queued before the daemon has
 * read the whole request makes it close the connection, and a client
 * still sending its body would see a reset instead of the answer. The
 * exceptions close on purpose: a declared body far past the cap, or any
 * refusal when the client waits for "100 Continue", is answered before the
 * body is read.
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
#include "serve/http.h"

#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/splitmix.h"
#include "core/utf8.h"
#include "serve/buf.h"
#include "serve/deadline.h"
#include "serve/embed.h"
#include "serve/log.h"
#include "serve/llamacpp.h"
#include "serve/ollama.h"
#include "serve/resp.h"
#include "serve/slots.h"
#include "serve/think.h"
#include "serve/text.h"
#include "serve/webui.h"

enum { POLL_MS = 50, SSE_BLOCK = 16 * 1024, DRAIN_MS = 5000 };

enum route {
    R_COMPLETIONS,
    R_CHAT,
    R_RESPONSES,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_APPLY_TEMPLATE,
    R_SLOT_ACTION,
    R_LLAMACPP_COMPLETION,
    R_INFILL,
    R_EMBEDDINGS,
    R_OLLAMA_CHAT,
    R_OLLAMA_GENERATE,
    R_OLLAMA_SHOW,
    R_OLLAMA_EMBED,
    R_OLLAMA_EMBEDDINGS,
    R_MODELS,
    R_MODEL,
    R_HEALTH,
    R_METRICS,
    R_PROPS,
    R_SLOTS,
    R_OLLAMA_TAGS,
    R_OLLAMA_PS,
    R_OLLAMA_VERSION,
    R_WEBUI,
    R_OTHER,
    N_ROUTES
};
static const char *const route_names[N_ROUTES] = {
    "/v1/completions", "/v1/chat/completions", "/v1/responses",   "/tokenize",       "/detokenize",
    "/apply-template", "/slots/{id}",          "/completion",     "/infill",         "/v1/embeddings",
    "/api/chat",       "/api/generate",        "/api/show",       "/api/embed",      "/api/embeddings",
    "/v1/models",      "/v1/models/{id}",      "/health",         "/metrics",        "/props",
    "/slots",          "/api/tags",            "/api/ps",         "/api/version",    "/",
    "other"};

/* Ollama's routes answer in its shapes, errors too (ollama.h). */
static bool is_ollama(enum route rt)
{
    return (rt >= R_OLLAMA_CHAT && rt <= R_OLLAMA_EMBEDDINGS) || (rt >= R_OLLAMA_TAGS && rt <= R_OLLAMA_VERSION);
}

/* Routes below R_MODELS take POST, the others GET and HEAD. */
static bool takes_post(enum route rt) { return rt < R_MODELS; }

typedef struct status_count {
    int route, code;
    uint64_t n;
} status_count;

struct sv_http {
    struct MHD_Daemon *daemon;
    sv_sched *sched;
    const oai_server *srv;
    const sv_access *access; /* never NULL */
    sv_access no_access;     /* what access points to without opts->access */
    sv_props props;
    size_t max_body;
    int idle_timeout_s;
    bool webui;              /* the page at / */
    bool embeddings;         /* the embedding routes answer (--embeddings), else 501 */
    bool tls;
    sv_deadlines *deadlines; /* a request (headers and body) is due within twice idle_timeout_s */
    const char *slot_save_path;
    long long started;
    pthread_mutex_t mu;
    pthread_cond_t gens_done; /* signalled when n_gens drops */
    int n_gens;               /* gens not yet freed */
    bool draining;
    uint64_t next_id;
    status_count counts[64];
    int n_counts;
};

/* One request, from its headers to its end. */
typedef struct conn {
    enum route rt;
    bool options;           /* an OPTIONS request */
    const char *origin;     /* an allowed Origin (the daemon's copy), or NULL */
    oai_error refusal;      /* status != 0: answered with it once the body is in */
    int retry_after;        /* seconds, for a 503 */
    sv_buf body;
    size_t received;
    bool too_large;
    /* for the log line */
    double t0, ttft;        /* headers in; seconds to the first token (< 0: none) */
    int status;
    char failure[160];      /* a stream that ended with an error event: its message */
    int32_t n_prompt, n_gen;
    uint64_t client_id;
    char client[64];
    char method[24];
    char path[200];
} conn;

typedef struct gen {
    sv_http *h;
    conn *cc;
    oai_request req;
    sv_request *r;
    sv_text text;
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
    sv_buf out;         /* text not yet sent */
    bool thinking;      /* a chat whose <think> block goes apart (req.split_reasoning) */
    sv_think think;     /* the split of its text so far */
    sv_buf reasoning, content; /* a streamed fill's split, kept for the next fill's */
    sv_buf all;         /* a streamed response's whole text, for its .done events; with tools, a chat's */
    resp_ids resp;      /* a response's ids and event count */
    char msg_id[48];
    size_t text_sent;   /* bytes of text sent before out */
    const char *finish; /* "stop" / "length" once over */
    oai_error error;    /* status != 0: failed */
    /* streaming */
    sv_buf sse;
    size_t sse_off;
    bool role_sent, over;
} gen;

static void count_status(sv_http *h, enum route rt, int code)
{
    pthread_mutex_lock(&h->mu);
    int i = 0;
    while (i < h->n_counts && !(h->counts[i].route == (int)rt && h->counts[i].code == code))
        i++;
    if (i == h->n_counts && h->n_counts < (int)(sizeof h->counts / sizeof h->counts[0]))
        h->counts[h->n_counts++] = (status_count){.route = (int)rt, .code = code};
    if (i < h->n_counts)
        h->counts[i].n++;
    pthread_mutex_unlock(&h->mu);
}

/* A fresh 64-bit value per call: request ids and default seeds. */
static uint64_t fresh(sv_http *h)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&h->mu);
    const uint64_t n = ++h->next_id;
    pthread_mutex_unlock(&h->mu);
    return cv_splitmix64(((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (n << 40) ^ n);
}

static bool draining(sv_http *h)
{
    pthread_mutex_lock(&h->mu);
    const bool d = h->draining;
    pthread_mutex_unlock(&h->mu);
    return d;
}

/* Queues resp with the headers every answer carries: CORS for an allowed
 * origin, Allow on 405, Retry-After on 503; notes the status. Where web
 * pages may come, the CORS header depends on the request's Origin (sent
 * or not, listed or not), so every answer says Vary: Origin, else a cache
 * could give one origin's answer to another. */
static enum MHD_Result queue(sv_http *h, struct MHD_Connection *c, conn *cc, int status, struct MHD_Response *resp)
{
    const bool any = h->access->any_origin;
    if (any || h->access->n_origins > 0)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
    if (cc->origin)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, any ? "*" : cc->origin);
    if (status == 405 || cc->options)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                                takes_post(cc->rt) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    if (status == 503) {
        char s[16];
        snprintf(s, sizeof s, "%d", cc->retry_after > 0 ? cc->retry_after : 1);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, s);
    }
    if (status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    cc->status = status;
    count_status(h, cc->rt, status);
    const enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_body(sv_http *h, struct MHD_Connection *c, conn *cc, int status, const char *type,
                                 const char *body, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    if (type)
        MHD_add_response_header(resp, "Content-Type", type);
    return queue(h, c, cc, status, resp);
}

static enum MHD_Result send_json(sv_http *h, struct MHD_Connection *c, conn *cc, int status, char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}";
    const enum MHD_Result rc = json ? send_body(h, c, cc, status, "application/json", json, strlen(json))
                                    : send_body(h, c, cc, 500, "application/json", oom, sizeof oom - 1);
    free(json);
    return rc;
}

static enum MHD_Result send_error(sv_http *h, struct MHD_Connection *c, conn *cc, const oai_error *e)
{
    const bool ollama = is_ollama(cc->rt) || !strncmp(cc->path, "/api/", 5); /* its unknown routes too */
    return send_json(h, c, cc, e->status, ollama ? ollama_error_json(e) : oai_error_json(e));
}

/* True when the peer has closed or reset the connection. */
static bool peer_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
        return true;
    char ch;
    return (p.revents & POLLIN) && recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void gen_free(void *cls)
{
    gen *g = cls;
    sv_http *h = g->h;
    sv_request_release(g->r);
    sv_text_free(&g->text);
    oai_request_free(&g->req);
    sv_buf_free(&g->out);
    sv_buf_free(&g->all);
    sv_buf_free(&g->sse);
    sv_think_free(&g->think);
    sv_buf_free(&g->reasoning);
    sv_buf_free(&g->content);
    cv_free(g);
    pthread_mutex_lock(&h->mu);
    h->n_gens--;
    pthread_cond_broadcast(&h->gens_done);
    pthread_mutex_unlock(&h->mu);
}

/* Why a generation ended without its text: 503 while the server shuts down. */
static void gen_failed(gen *g, sv_finish f)
{
    if (draining(g->h)) {
        g->cc->retry_after = 5;
        oai_fail(&g->error, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return;
    }
    oai_fail(&g->error, 500, "server_error", NULL, NULL, "the generation failed: %s",
             f == SV_FINISH_ERROR ? sv_request_error(g->r) : "cancelled");
}

/* Turns the tokens that arrived into text. Returns 1 once the generation
 * is over (g->finish or g->error set), 0 while it runs. */
static int gen_poll(gen *g, int timeout_ms)
{
    sv_finish f;
    const int32_t n = sv_request_wait(g->r, g->n_seen, timeout_ms, &f);
    const int32_t *toks = sv_request_tokens(g->r);
    if (n > 0 && g->cc->ttft < 0)
        g->cc->ttft = cv_now_s() - g->cc->t0;
    while (g->n_seen < n && !g->finish) {
        const int rc = sv_text_push(&g->text, toks[g->n_seen++], &g->out);
        if (rc < 0)
            return oai_fail(&g->error, 500, "server_error", NULL, NULL, "out of memory"), 1;
        if (rc == 1) {
            g->finish = "stop";
            sv_request_cancel(g->r);
        }
    }
    g->cc->n_gen = g->n_seen;
    if (g->finish)
        return 1;
    if (f == SV_RUNNING)
        return 0;
    if (f == SV_FINISH_ERROR || f == SV_FINISH_CANCELLED) {
        gen_failed(g, f);
        return 1;
    }
    const int rc = sv_text_finish(&g->text, &g->out);
    if (rc < 0)
        return oai_fail(&g->error, 500, "server_error", NULL, NULL, "out of memory"), 1;
    g->finish = rc == 1 || f == SV_FINISH_STOP ? "stop" : "length";
    return 1;
}

static oai_usage gen_usage(const gen *g)
{
    return (oai_usage){.prompt_tokens = g->req.params.n_prompt, .cached_tokens = sv_request_cached(g->r),
                       .completion_tokens = g->n_seen};
}

/* The logprobs of the tokens since the last call (NULL if not asked for). */
static json_t *gen_logprobs(gen *g)
{
    if (g->req.params.top_logprobs < 0)
        return NULL;
    json_t *lp = oai_logprobs(g->h->srv->model, g->req.kind, g->r, g->lp_next, g->n_seen - g->lp_next,
                              g->req.params.top_logprobs, g->text_sent);
    g->lp_next = g->n_seen;
    return lp;
}

/* An event: a server-sent event, or for Ollama a line of JSON. */
static int sse_event(gen *g, char *json)
{
    if (!json)
        return -1;
    const int rc = g->ollama ? sv_buf_puts(&g->sse, json) || sv_buf_puts(&g->sse, "\n")
                             : sv_buf_puts(&g->sse, "data: ") || sv_buf_puts(&g->sse, json) ||
                                   sv_buf_puts(&g->sse, "\n\n");
    free(json);
    return rc ? -1 : 0;
}

/* Ollama's figures of the generation so far. */
static ollama_stats gen_ollama_stats(const gen *g)
{
    const double total = cv_now_s() - g->cc->t0;
    return (ollama_stats){.prompt_tokens = g->req.params.n_prompt - sv_request_cached(g->r),
                          .cached_tokens = sv_request_cached(g->r),
                          .eval_tokens = g->n_seen, .total_s = total,
                          .prompt_s = g->cc->ttft >= 0 ? g->cc->ttft : total};
}

/* A chunk as an event in the request's shapes (Ollama's have none for
 * some chunks). */
static int send_chunk(gen *g, const oai_chunk *ch)
{
    if (g->llamacpp) {
        bool none;
        const ollama_stats st = ch->finish ? gen_ollama_stats(g) : (ollama_stats){0};
        char *json = llamacpp_chunk_json(g->h->srv, ch, &st, &none);
        return none ? 0 : sse_event(g, json);
    }
    if (!g->ollama) {
        oai_chunk indexed = *ch;
        indexed.index = g->choice;
        return sse_event(g, oai_chunk_json(g->h->srv, g->req.kind, g->id, g->created, &indexed));
    }
    bool none;
    const ollama_stats st = ch->finish ? gen_ollama_stats(g) : (ollama_stats){0}; /* the last line's */
    char *json = ollama_chunk_json(g->h->srv, g->okind, ch, &st, &none);
    json_decref(ch->logprobs);
    return none ? 0 : sse_event(g, json);
}

/* An OpenAI chat's first chunk carries the role, before any token. */
static bool opens_with_role(const gen *g) { return g->req.kind == OAI_CHAT && !g->ollama; }

/* sse_fill for /v1/responses: the opening events first, then a delta per
 * batch of text (with tools, as far as sv_tools_safe lets it), then the
 * closing events with the calls read out of the text (no [DONE]: OpenAI
 * sends none). */
static int resp_fill(gen *g, bool over)
{
    const oai_usage usage = gen_usage(g);
    if (!g->role_sent && resp_sse_start(g->h->srv, &g->resp, &g->sse))
        return -1;
    g->role_sent = true;
    if (g->error.status) {
        snprintf(g->cc->failure, sizeof g->cc->failure, "%.150s", g->error.message);
        g->over = over;
        return resp_sse_error(&g->resp, &g->error, &g->sse);
    }
    if (sv_buf_append(&g->all, g->out.p, g->out.n))
        return -1;
    sv_buf_consume(&g->out, g->out.n);
    const char *all = g->all.p ? g->all.p : "";
    sv_tool_calls calls = {0};
    if (over && g->req.tools != SV_TOOLS_NONE && sv_tools_parse(g->req.tools, all, g->all.n, fresh(g->h), &calls))
        return -1;
    /* the content begins with every byte already sent (tools.h) */
    const size_t safe = over ? (g->req.tools != SV_TOOLS_NONE ? calls.content.n : g->all.n)
                             : sv_tools_safe(g->req.tools, all, g->all.n);
    int rc = 0;
    if (safe > g->text_sent)
        rc = resp_sse_delta(&g->resp, all + g->text_sent, safe - g->text_sent, &g->sse);
    g->text_sent = safe > g->text_sent ? safe : g->text_sent;
    if (over && rc == 0)
        rc = resp_sse_done(g->h->srv, &g->resp, all, g->all.n, g->finish, &calls, &usage, &g->sse);
    sv_tool_calls_free(&calls);
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
    sv_buf_consume(&g->reasoning, g->reasoning.n);
    sv_buf_consume(&g->content, g->content.n);
    int rc = sv_think_push(&g->think, g->out.p, g->out.n, over, &g->reasoning, &g->content);
    if (rc == 0 && g->reasoning.n) {
        const oai_chunk ch = {.reasoning = g->reasoning.p, .reasoning_len = g->reasoning.n,
                              .first = !g->role_sent, .include_usage = g->req.include_usage};
        rc = send_chunk(g, &ch);
        g->role_sent = true;
    }
    const sv_buf pushed = g->out; /* its buffer is the next fill's content */
    g->out = g->content;
    g->content = pushed;
    return rc;
}

/* A chat with tools: the text so far gathers in g->all and goes out only
 * as far as sv_tools_safe lets it (the rest may be a call); when over, the
 * rest of the content, then each call's head and arguments chunks, and
 * *finish becomes "tool_calls" when there are calls. */
static int tools_fill(gen *g, bool over, const char **finish)
{
    if (sv_buf_append(&g->all, g->out.p, g->out.n))
        return -1;
    const char *all = g->all.p ? g->all.p : "";
    if (!over) {
        const size_t safe = sv_tools_safe(g->req.tools, all, g->all.n);
        return text_chunk(g, all + g->text_sent, safe > g->text_sent ? safe - g->text_sent : 0);
    }
    sv_tool_calls calls = {0};
    if (sv_tools_parse(g->req.tools, all, g->all.n, fresh(g->h), &calls))
        return -1;
    /* the content begins with every byte already sent (tools.h) */
    const char *content = calls.content.p ? calls.content.p : "";
    int rc = text_chunk(g, content + g->text_sent, calls.content.n > g->text_sent ? calls.content.n - g->text_sent : 0);
    for (int i = 0; i < calls.n && !rc; i++) {
        const oai_chunk head = {.call = &calls.calls[i], .call_index = i, .include_usage = g->req.include_usage};
        const oai_chunk args = {.call = &calls.calls[i], .call_index = i, .call_args = true,
                                .include_usage = g->req.include_usage};
        rc = send_chunk(g, &head) || send_chunk(g, &args);
    }
    if (calls.n)
        *finish = "tool_calls";
    sv_tool_calls_free(&calls);
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
        if (sse_event(g, g->ollama ? ollama_error_json(&g->error) : oai_error_json(&g->error)))
            return -1;
    } else {
        const char *finish = g->finish;
        if ((g->thinking && split_reasoning(g, over)) ||
            (g->req.tools != SV_TOOLS_NONE ? tools_fill(g, over, &finish)
                                           : text_chunk(g, g->out.p ? g->out.p : "", g->out.n)))
            return -1;
        sv_buf_consume(&g->out, g->out.n);
        if (over) { /* the usage goes with the end, but n choices' with the last one's (choices_fill) */
            const bool alone = !g->in_choices;
            const oai_chunk fin = {.text = "", .finish = finish, .include_usage = g->req.include_usage,
                                   .usage = g->req.include_usage || !alone ? NULL : &usage};
            const oai_chunk u = {.usage_only = true, .usage = &usage};
            if (send_chunk(g, &fin) || (alone && g->req.include_usage && send_chunk(g, &u)))
                return -1;
        }
    }
    if (over && !g->ollama && !g->llamacpp && !g->in_choices && sv_buf_puts(&g->sse, "data: [DONE]\n\n"))
        return -1;
    g->over = over;
    return 0;
}

/* A stream waiting longer than this for its next event (a long prompt, a
 * queue) gets an SSE comment, which clients skip: a connection that sends
 * nothing for idle_timeout_s is closed, and a first token may take
 * minutes on a CPU. */
static double keepalive_s(const sv_http *h) { return h->idle_timeout_s / 3.0; }

/* A stream's next events: what arrived within timeout_ms (an OpenAI chat
 * sends its opening role chunk first, at once). */
static int gen_step(gen *g, int timeout_ms)
{
    const bool polls = g->role_sent || g->req.kind == OAI_COMPLETIONS || g->ollama; /* no opening to send */
    const bool over = polls ? gen_poll(g, timeout_ms) : false;
    return sse_fill(g, over);
}

/* Copies up to max bytes of the events not yet read (*off of sse is). */
static ssize_t take_events(sv_buf *sse, size_t *off, char *buf, size_t max)
{
    size_t k = sse->n - *off;
    if (k > max)
        k = max;
    memcpy(buf, sse->p + *off, k);
    *off += k;
    if (*off == sse->n) {
        sv_buf_consume(sse, sse->n);
        *off = 0;
    }
    return (ssize_t)k;
}

/* Whether a stream with nothing to send for keepalive_s is due a comment. */
static bool keepalive_due(const sv_http *h, double *waiting_since)
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
            if (g->ollama ? send_chunk(g, &empty) : sv_buf_puts(&g->sse, ": keep-alive\n\n"))
                return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (g->sse_off < g->sse.n)
            return take_events(&g->sse, &g->sse_off, buf, max);
        if (g->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(g->fd))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (gen_step(g, POLL_MS))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* A refused submit as an answer: every refusal is a 503 with Retry-After. */
static void submit_refused(sv_http *h, conn *cc, sv_submit_result sr, const char *why, oai_error *e)
{
    sv_sched_stats st;
    sv_sched_get_stats(h->sched, &st);
    cc->retry_after = sr == SV_SUBMIT_DOWN ? (int)ceil(st.retry_in) + 1 : sr == SV_SUBMIT_FULL ? 1 : 5;
    const char *code = sr == SV_SUBMIT_FULL ? "queue_full" : sr == SV_SUBMIT_DOWN ? "pipeline_down" : NULL;
    oai_fail(e, 503, "server_error", code, NULL, "%s", why);
}

/* An embedding's wait ends when its client left (user: the socket). */
static bool fd_gone(void *user) { return peer_gone(*(const int *)user); }

/* A chat template's render stops when its client left. */
static bool gen_client_gone(void *user) { return peer_gone(((const gen *)user)->fd); }

/* Parses the request of body (cc's, or what an Ollama body means) into a
 * new gen for choice `choice` (its seed the request's plus choice); NULL
 * with e filled when refused. */
static gen *gen_parse(sv_http *h, struct MHD_Connection *c, conn *cc, oai_kind kind, const char *body, size_t len,
                      int choice, oai_error *e)
{
    gen *g = cv_calloc(1, sizeof *g);
    if (!g)
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    g->h = h;
    g->cc = cc;
    pthread_mutex_lock(&h->mu);
    h->n_gens++;
    pthread_mutex_unlock(&h->mu);
    const uint64_t seed = h->props.seed >= 0 ? (uint64_t)h->props.seed : fresh(h);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    const sv_render_watch watch = {gen_client_gone, g};
    g->ollama = is_ollama(cc->rt);
    g->llamacpp = cc->rt == R_LLAMACPP_COMPLETION || cc->rt == R_INFILL;
    g->okind = cc->rt == R_OLLAMA_CHAT ? OLLAMA_CHAT : OLLAMA_GENERATE;
    if (oai_parse_request(h->srv, kind, body, len, seed, &watch, &g->req, e)) {
        gen_free(g);
        return NULL;
    }
    cc->n_prompt = g->req.params.n_prompt;
    g->choice = choice;
    g->req.params.sampler.seed += (uint64_t)choice;
    if (g->req.echo.n && sv_buf_append(&g->out, g->req.echo.p, g->req.echo.n)) {
        gen_free(g);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    g->req.params.client = cc->client_id;
    g->thinking = kind == OAI_CHAT && g->req.split_reasoning;
    sv_think_init(&g->think, g->req.think_open);
    if (sv_text_init(&g->text, h->srv->model, (const char *const *)g->req.stop, g->req.n_stop)) {
        gen_free(g);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    return g;
}

/* Names a submitted gen (choices after the first take the first's id and
 * time, `first`). */
static void gen_name(gen *g, const gen *first)
{
    sv_http *h = g->h;
    conn *cc = g->cc;
    const oai_kind kind = g->req.kind;
    const unsigned long long serial = first ? 0 : (unsigned long long)fresh(h);
    if (kind == OAI_RESPONSES) { /* OpenAI's ids: resp_ for the response, msg_ for its message */
        snprintf(g->id, sizeof g->id, "resp_%016llx", serial);
        snprintf(g->msg_id, sizeof g->msg_id, "msg_%016llx", serial);
    } else if (first) {
        snprintf(g->id, sizeof g->id, "%s", first->id);
    } else {
        snprintf(g->id, sizeof g->id, "%s-%016llx", kind == OAI_CHAT ? "chatcmpl" : "cmpl", serial);
    }
    sv_log(SV_LOG_DEBUG, "%s from %s: %s queued: %d prompt tokens, max_tokens %d, seed %llu%s", cc->path, cc->client,
           g->id, g->req.params.n_prompt, g->req.params.max_tokens,
           (unsigned long long)g->req.params.sampler.seed, g->req.stream ? ", streamed" : "");
    g->created = first ? first->created : (long long)time(NULL);
    g->resp = (resp_ids){.id = g->id, .msg_id = g->msg_id, .created = g->created};
}

/* Submits g's request and names it; when refused, frees g (e says why). */
static int gen_submit(gen *g, oai_error *e)
{
    char err[CV_ERRLEN];
    const sv_submit_result sr = sv_sched_submit(g->h->sched, &g->req.params, &g->r, err, sizeof err);
    if (sr != SV_SUBMIT_OK) {
        submit_refused(g->h, g->cc, sr, err, e);
        gen_free(g);
        return -1;
    }
    gen_name(g, NULL);
    return 0;
}

/* What an answer's text holds apart: a thinking chat's reasoning, a chat
 * with tools its calls; the buffers an oai_answer points into. */
typedef struct answer_parts {
    sv_buf reasoning, content;
    sv_tool_calls calls;
    oai_usage usage;
} answer_parts;

static void answer_parts_free(answer_parts *p)
{
    sv_tool_calls_free(&p->calls);
    sv_buf_free(&p->reasoning);
    sv_buf_free(&p->content);
}

/* A whole chat or completion answer of g into a (pointing into p); -1
 * when out of memory. */
static int answer_of(gen *g, answer_parts *p, oai_answer *a)
{
    const char *text = g->out.p ? g->out.p : "";
    p->usage = gen_usage(g);
    if (g->thinking && sv_think_push(&g->think, text, g->out.n, true, &p->reasoning, &p->content))
        return -1;
    const sv_buf *answer = g->thinking ? &p->content : &g->out;
    text = answer->p ? answer->p : "";
    const bool tools = g->req.tools != SV_TOOLS_NONE;
    if (tools && sv_tools_parse(g->req.tools, text, answer->n, fresh(g->h), &p->calls))
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
    sv_tool_calls calls = {0};
    char *json = NULL;
    if (g->req.tools == SV_TOOLS_NONE || sv_tools_parse(g->req.tools, text, g->out.n, fresh(g->h), &calls) == 0)
        json = resp_object_json(g->h->srv, &g->resp, text, g->out.n, g->finish, &calls, &usage);
    sv_tool_calls_free(&calls);
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
        json = g->ollama     ? ollama_answer_json(g->h->srv, g->okind, &a, &st)
               : g->llamacpp ? llamacpp_answer_json(g->h->srv, &a, &st)
                             : oai_response_json(g->h->srv, g->req.kind, g->id, g->created, &a);
    }
    answer_parts_free(&p);
    return json;
}

/* The OpenAI body of an Ollama request into *body (NULL: e says why, or
 * it only loads the model: *loaded is the answer). */
static void ollama_request(sv_http *h, conn *cc, oai_kind *kind, char **body, char **loaded, oai_error *e)
{
    const ollama_kind k = cc->rt == R_OLLAMA_CHAT ? OLLAMA_CHAT : OLLAMA_GENERATE;
    bool load_only;
    *loaded = NULL;
    *body = ollama_to_openai(k, cc->body.p ? cc->body.p : "", cc->body.n, kind, &load_only, e);
    if (load_only && !(*loaded = ollama_loaded_json(h->srv, k)))
        oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* A request's n > 1 choices: a gen each, their events merged into one
 * stream, which ends once all have. */
typedef struct choices {
    sv_http *h;
    gen *g[OAI_MAX_CHOICES];
    int n;
    sv_buf sse;
    size_t sse_off;
    bool over;
} choices;

static void choices_free(void *cls)
{
    choices *ch = cls;
    for (int i = 0; i < ch->n; i++)
        if (ch->g[i])
            gen_free(ch->g[i]);
    sv_buf_free(&ch->sse);
    cv_free(ch);
}

/* The prompt alone, once, before the choices: a one-token request whose
 * slot keeps the prompt, from which each choice's slot copies it (sched.h),
 * so the n choices run it once. Its failure only costs them that. */
static void run_prompt_alone(gen *g)
{
    sv_request_params p = g->req.params;
    p.max_tokens = 1;
    p.sampler = convoy_sampling_default_params();
    p.sampler.temp = 0.0f;
    p.top_logprobs = -1;
    p.grammar = NULL;
    sv_request *r;
    char err[CV_ERRLEN];
    if (p.cold || sv_sched_submit(g->h->sched, &p, &r, err, sizeof err) != SV_SUBMIT_OK)
        return;
    sv_finish f = SV_RUNNING;
    while (f == SV_RUNNING && !peer_gone(g->fd))
        sv_request_wait(r, 0, POLL_MS, &f);
    sv_request_cancel(r);
    sv_request_release(r);
}

/* Parses the choices after the first (`first`, parsed) and submits them
 * together; NULL with e filled when refused (then none runs). */
static choices *choices_start(sv_http *h, struct MHD_Connection *c, gen *first, const char *body, size_t len,
                              oai_error *e)
{
    choices *ch = cv_calloc(1, sizeof *ch);
    if (!ch) {
        gen_free(first);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    ch->h = h;
    ch->n = first->req.n_choices;
    ch->g[0] = first;
    run_prompt_alone(first);
    for (int i = 1; i < ch->n; i++)
        if (!(ch->g[i] = gen_parse(h, c, first->cc, first->req.kind, body, len, i, e)))
            goto fail;
    sv_request_params params[OAI_MAX_CHOICES];
    sv_request *r[OAI_MAX_CHOICES];
    for (int i = 0; i < ch->n; i++)
        params[i] = ch->g[i]->req.params;
    char err[CV_ERRLEN];
    const sv_submit_result sr = sv_sched_submit_all(h->sched, params, ch->n, r, err, sizeof err);
    if (sr != SV_SUBMIT_OK) {
        submit_refused(h, first->cc, sr, err, e);
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
        if (sv_buf_append(&ch->sse, g->sse.p, g->sse.n))
            return -1;
        sv_buf_consume(&g->sse, g->sse.n);
        all_over &= g->over;
    }
    if (!all_over)
        return 0;
    const oai_usage usage = choices_usage(ch);
    gen *g0 = ch->g[0];
    const oai_chunk u = {.usage_only = true, .usage = &usage};
    if ((g0->req.include_usage && send_chunk(g0, &u)) || sv_buf_append(&ch->sse, g0->sse.p, g0->sse.n) ||
        sv_buf_puts(&ch->sse, "data: [DONE]\n\n"))
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
            sv_buf_puts(&ch->sse, ": keep-alive\n\n"))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ch->sse_off < ch->sse.n)
            return take_events(&ch->sse, &ch->sse_off, buf, max);
        if (ch->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(ch->g[0]->fd) || choices_fill(ch))
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
    char *json = n_ready == ch->n ? oai_choices_json(g0->h->srv, g0->req.kind, g0->id, g0->created, a, ch->n, &usage)
                                  : NULL;
    for (int i = 0; i < ch->n; i++)
        answer_parts_free(&p[i]);
    if (!json)
        oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return json;
}

/* n > 1 choices of the request first holds (body: to parse each). */
static enum MHD_Result generate_choices(sv_http *h, struct MHD_Connection *c, conn *cc, gen *first,
                                        const char *body, size_t len)
{
    oai_error e = {0};
    const bool stream = first->req.stream;
    choices *ch = choices_start(h, c, first, body, len, &e);
    if (!ch)
        return send_error(h, c, cc, &e);
    if (stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, choices_reader,
                                                                      ch, choices_free);
        if (!resp) {
            choices_free(ch);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        return queue(h, c, cc, 200, resp);
    }
    for (int i = 0; i < ch->n; i++)
        while (!gen_poll(ch->g[i], POLL_MS))
            if (peer_gone(ch->g[i]->fd)) {
                choices_free(ch);
                return MHD_NO;
            }
    char *json = choices_json(ch, &e);
    choices_free(ch);
    return json ? send_json(h, c, cc, 200, json) : send_error(h, c, cc, &e);
}

static enum MHD_Result generate(sv_http *h, struct MHD_Connection *c, conn *cc)
{
    oai_kind kind = cc->rt == R_CHAT ? OAI_CHAT : cc->rt == R_RESPONSES ? OAI_RESPONSES : OAI_COMPLETIONS;
    oai_error e = {0};
    char *translated = NULL /* an Ollama or llama.cpp route's body as OpenAI's */, *loaded = NULL;
    if (is_ollama(cc->rt)) {
        ollama_request(h, cc, &kind, &translated, &loaded, &e);
        if (!translated)
            return loaded ? send_json(h, c, cc, 200, loaded) : send_error(h, c, cc, &e);
    } else if (cc->rt == R_LLAMACPP_COMPLETION || cc->rt == R_INFILL) {
        if (!(translated = llamacpp_to_openai(h->srv, cc->rt == R_INFILL, cc->body.p ? cc->body.p : "", cc->body.n,
                                             &e)))
            return send_error(h, c, cc, &e);
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
        return send_error(h, c, cc, &e);
    if (g->req.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_reader, g,
                                                                      gen_free);
        if (!resp) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", g->ollama ? "application/x-ndjson" : "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        return queue(h, c, cc, 200, resp);
    }
    while (!gen_poll(g, POLL_MS))
        if (peer_gone(g->fd)) {
            gen_free(g);
            return MHD_NO;
        }
    if (g->error.status) {
        const enum MHD_Result rc = send_error(h, c, cc, &g->error);
        gen_free(g);
        return rc;
    }
    char *json = answer_json(g);
    gen_free(g);
    return send_json(h, c, cc, 200, json);
}

static void metric(sv_buf *b, const char *name, const char *type, const char *help, double v)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    sv_buf_puts(b, line);
}

/* /metrics: the answers by route and status, the generations by reason. */
static void metrics_counts(sv_http *h, const sv_sched_stats *st, sv_buf *b)
{
    char line[256];
    sv_buf_puts(b, "# HELP convoy_requests_total HTTP requests answered, by route and status code.\n"
                   "# TYPE convoy_requests_total counter\n");
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n_counts; i++) {
        snprintf(line, sizeof line, "convoy_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                 route_names[h->counts[i].route], h->counts[i].code, (unsigned long long)h->counts[i].n);
        sv_buf_puts(b, line);
    }
    pthread_mutex_unlock(&h->mu);
    static const char *const reasons[] = {"", "stop", "length", "cancelled", "error"};
    sv_buf_puts(b, "# HELP convoy_generations_total Generations ended, by reason.\n"
                   "# TYPE convoy_generations_total counter\n");
    for (int i = 1; i < 5; i++) {
        snprintf(line, sizeof line, "convoy_generations_total{reason=\"%s\"} %llu\n", reasons[i],
                 (unsigned long long)st->requests_finished[i]);
        sv_buf_puts(b, line);
    }
}

/* A pipeline's nodes: layers, measured and probed speed; a hop's time. */
static void metrics_nodes(const convoy_node_costs *n, sv_buf *b)
{
    if (n->n_nodes == 0)
        return;
    char line[512];
    sv_buf_puts(b, "# HELP convoy_node_layers Layers each pipeline node serves (0: left out).\n"
                   "# TYPE convoy_node_layers gauge\n");
    for (int i = 0; i < n->n_nodes; i++) {
        snprintf(line, sizeof line, "convoy_node_layers{node=\"%s\"} %d\n", n->node[i].addr, n->node[i].layers);
        sv_buf_puts(b, line);
    }
    sv_buf_puts(b, "# HELP convoy_node_seconds_per_layer_token Each node's time per layer and token: measured "
                   "by its stage batch after batch (decayed mean), or its speed probe.\n"
                   "# TYPE convoy_node_seconds_per_layer_token gauge\n");
    for (int i = 0; i < n->n_nodes; i++) {
        snprintf(line, sizeof line,
                 "convoy_node_seconds_per_layer_token{node=\"%s\",source=\"measured\"} %.9g\n"
                 "convoy_node_seconds_per_layer_token{node=\"%s\",source=\"probe\"} %.9g\n",
                 n->node[i].addr, n->node[i].us_measured / 1e6, n->node[i].addr, n->node[i].us_probed / 1e6);
        sv_buf_puts(b, line);
    }
    metric(b, "convoy_hop_seconds", "gauge", "One hop's time between stages (a batch alone in flight: its round "
           "trip less the stages' times, over its hops).", n->us_hop / 1e6);
}

static void metrics_engine(const sv_sched_stats *st, sv_buf *b)
{
    metric(b, "convoy_prompt_tokens_total", "counter", "Prompt tokens run through the model.",
           (double)st->prompt_tokens);
    metric(b, "convoy_prompt_tokens_cached_total", "counter",
           "Prompt tokens taken from the slots' cache instead of run through the model.",
           (double)st->prompt_tokens_cached);
    metric(b, "convoy_generated_tokens_total", "counter", "Tokens sampled.", (double)st->generated_tokens);
    metric(b, "convoy_tokens_per_second", "gauge", "Tokens sampled per second over the last 10 seconds.",
           st->tokens_per_second);
    metric(b, "convoy_queue_length", "gauge", "Requests waiting for a slot.", st->queued);
    metric(b, "convoy_queue_capacity", "gauge", "Requests that may wait beyond the free slots.", st->queue_cap);
    metric(b, "convoy_active_slots", "gauge", "Sequence slots running a request.", st->active);
    metric(b, "convoy_slots", "gauge", "Sequence slots.", st->n_slot);
    metric(b, "convoy_steps_total", "counter", "Engine steps (batches) run.", (double)st->steps);
    metric(b, "convoy_steps_shared_total", "counter", "Engine steps that carried tokens of two or more requests.",
           (double)st->steps_shared);
    metric(b, "convoy_batch_tokens_total", "counter", "Tokens over all batches.", (double)st->batch_tokens);
    metric(b, "convoy_step_seconds_total", "counter", "Time spent in engine steps.", st->step_seconds);
    metric(b, "convoy_pipeline_down", "gauge", "1 while the pipeline is down and reconnects are tried.", st->down);
    metric(b, "convoy_pipeline_reconnects_total", "counter", "Times the pipeline came back after going down.",
           (double)st->reconnects);
    metric(b, "convoy_failovers_total", "counter", "Failed nodes replaced, every sequence replayed.",
           (double)st->failovers);
    metric(b, "convoy_failover_pause_seconds_total", "counter",
           "Time requests waited for failovers: a new chain planned, sequences replayed.", st->failover_seconds);
    metric(b, "convoy_rebalances_total", "counter", "Layers moved while serving because measured costs drifted.",
           (double)st->rebalances);
    metric(b, "convoy_rebalances_undone_total", "counter", "Moves back after a move that measured slower.",
           (double)st->rebalances_undone);
    metric(b, "convoy_rebalance_pause_seconds_total", "counter",
           "Time requests waited for moves: a new chain opened, sequences replayed.", st->rebalance_seconds);
    metrics_nodes(&st->nodes, b);
    if (st->speculating) {
        metric(b, "convoy_spec_rounds_total", "counter", "Decode rounds that drafts were asked for.",
               (double)st->spec_rounds);
        metric(b, "convoy_spec_drafted_total", "counter", "Drafts sent for verification.", (double)st->spec_drafted);
        metric(b, "convoy_spec_accepted_total", "counter", "Drafts accepted.", (double)st->spec_accepted);
        metric(b, "convoy_spec_windows_total", "counter",
               "Verify windows collected (a sequence's newest token and drafts, or drafts sent behind its "
               "windows in flight).",
               (double)st->windows_sent);
        metric(b, "convoy_spec_windows_cancelled_total", "counter",
               "Windows dropped because an earlier window of their sequence was cut short.",
               (double)st->windows_stale);
        metric(b, "convoy_spec_windows_accepted_total", "counter", "Windows whose every draft was accepted.",
               (double)st->windows_whole);
    }
    char line[256];
    sv_buf_puts(b, "# HELP convoy_time_to_first_token_seconds From submission to the first sampled token.\n"
                   "# TYPE convoy_time_to_first_token_seconds summary\n");
    snprintf(line, sizeof line,
             "convoy_time_to_first_token_seconds_sum %.9g\nconvoy_time_to_first_token_seconds_count %llu\n",
             st->ttft_seconds, (unsigned long long)st->ttft_count);
    sv_buf_puts(b, line);
}

static enum MHD_Result send_metrics(sv_http *h, struct MHD_Connection *c, conn *cc)
{
    sv_sched_stats st;
    sv_sched_get_stats(h->sched, &st);
    sv_buf b = {0};
    count_status(h, R_METRICS, 200); /* this answer counts itself */
    metrics_counts(h, &st, &b);
    metrics_engine(&st, &b);
    if (h->srv->chat && h->srv->chat->pool)
        metric(&b, "convoy_template_memory_peak_bytes", "gauge",
               "The most memory chat template renders held at once beyond their own MiB each (--template-mem).",
               (double)cv_template_pool_peak(h->srv->chat->pool));
    const enum MHD_Result rc = b.p ? send_body(h, c, cc, 200, "text/plain; version=0.0.4", b.p, b.n)
                                   : send_body(h, c, cc, 500, "text/plain", "", 0);
    sv_buf_free(&b);
    return rc;
}

/* 200 {"status":"ok"}, or 503 with the engine's error while its last
 * step failed (a pipeline whose node died stays failed). */
static enum MHD_Result send_health(sv_http *h, struct MHD_Connection *c, conn *cc)
{
    sv_sched_stats st;
    sv_sched_get_stats(h->sched, &st);
    if (!st.failing)
        return send_json(h, c, cc, 200, oai_health_json(NULL));
    cc->retry_after = (int)ceil(st.retry_in) + 1;
    return send_json(h, c, cc, 503, oai_health_json(st.last_error));
}

/* /props, with the nodes that serve the model and their layers. */
static enum MHD_Result send_props(sv_http *h, struct MHD_Connection *c, conn *cc)
{
    sv_sched_stats st;
    sv_sched_get_stats(h->sched, &st);
    return send_json(h, c, cc, 200, sv_props_json(h->srv, &h->props, &st.nodes));
}

/* OPTIONS: 204 with Allow; for a browser's preflight the CORS answer. */
static enum MHD_Result send_options(sv_http *h, struct MHD_Connection *c, conn *cc)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    if (cc->origin) {
        const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_ACCESS_CONTROL_REQUEST_HEADERS);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_METHODS, "GET, HEAD, POST, OPTIONS");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_HEADERS,
                                want && strlen(want) < 1024 ? want : "Authorization, Content-Type");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_MAX_AGE, "600");
    }
    return queue(h, c, cc, 204, resp);
}

/* A body answer of extra.h (NULL: e says why). */
static enum MHD_Result send_extra(sv_http *h, struct MHD_Connection *c, conn *cc, char *json, const oai_error *e)
{
    return json ? send_json(h, c, cc, 200, json) : send_error(h, c, cc, e);
}

/* POST /slots/ID?action=...: id is the path after "/slots/". */
static enum MHD_Result send_slot_action(sv_http *h, struct MHD_Connection *c, conn *cc, const char *id)
{
    oai_error e = {0};
    char *end;
    const long slot = strtol(id, &end, 10);
    if (end == id || *end || slot < 0 || slot > INT32_MAX) {
        oai_fail(&e, 404, "invalid_request_error", "unknown_url", NULL, "no slot \"%.40s\": slots are numbers", id);
        return send_error(h, c, cc, &e);
    }
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    return send_extra(h, c, cc,
                      sv_slot_action_json(h->sched, h->srv->model, h->slot_save_path, (int32_t)slot, action,
                                          cc->body.p, cc->body.n, &e),
                      &e);
}

/* The embedding routes (embed.h), 501 unless the server was started with
 * --embeddings (llama-server's answer). */
static enum MHD_Result send_embeddings(sv_http *h, struct MHD_Connection *c, conn *cc)
{
    oai_error e = {0};
    if (!h->embeddings) {
        oai_fail(&e, 501, "not_supported_error", NULL, NULL,
                 "This server does not support embeddings. Start it with `--embeddings`");
        return send_error(h, c, cc, &e);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    const sv_embed_run run = {.sched = h->sched, .srv = h->srv, .client = cc->client_id, .gone = fd_gone,
                              .user = &fd, .poll_ms = POLL_MS};
    const sv_embed_api api = cc->rt == R_EMBEDDINGS     ? SV_EMBED_OPENAI
                             : cc->rt == R_OLLAMA_EMBED ? SV_EMBED_OLLAMA
                                                        : SV_EMBED_OLLAMA_LEGACY;
    sv_submit_result refused;
    char *json = sv_embed_answer(&run, api, cc->body.p ? cc->body.p : "", cc->body.n, &cc->n_prompt, &refused, &e);
    if (json)
        return send_json(h, c, cc, 200, json);
    if (!e.status) /* the client left */
        return MHD_NO;
    if (refused != SV_SUBMIT_OK)
        submit_refused(h, cc, refused, e.message, &e);
    return send_error(h, c, cc, &e);
}

/* The last call of a request: its refusal, or its route's answer. */
static enum MHD_Result answer(sv_http *h, struct MHD_Connection *c, conn *cc, const char *url)
{
    oai_error e = {0};
    const char *body = cc->body.p ? cc->body.p : "";
    if (cc->too_large)
        oai_fail(&cc->refusal, 413, "invalid_request_error", "request_too_large", NULL,
                 "the request body is larger than the limit of %zu bytes", h->max_body);
    if (cc->refusal.status)
        return send_error(h, c, cc, &cc->refusal);
    if (cc->options)
        return send_options(h, c, cc);
    switch (cc->rt) {
    case R_COMPLETIONS:
    case R_CHAT:
    case R_RESPONSES:
    case R_LLAMACPP_COMPLETION:
    case R_INFILL:
    case R_OLLAMA_CHAT:
    case R_OLLAMA_GENERATE:
        return generate(h, c, cc);
    case R_EMBEDDINGS:
    case R_OLLAMA_EMBED:
    case R_OLLAMA_EMBEDDINGS:
        return send_embeddings(h, c, cc);
    case R_OLLAMA_SHOW:
        return send_extra(h, c, cc, ollama_show_json(h->srv, &h->props, body, cc->body.n, &e), &e);
    case R_OLLAMA_TAGS:
    case R_OLLAMA_PS:
        return send_json(h, c, cc, 200, ollama_models_json(h->srv, &h->props, cc->rt == R_OLLAMA_PS));
    case R_OLLAMA_VERSION:
        return send_json(h, c, cc, 200, ollama_version_json(&h->props));
    case R_TOKENIZE:
        return send_extra(h, c, cc, sv_tokenize_json(h->srv, body, cc->body.n, &e), &e);
    case R_DETOKENIZE:
        return send_extra(h, c, cc, sv_detokenize_json(h->srv, body, cc->body.n, &e), &e);
    case R_APPLY_TEMPLATE:
        return send_extra(h, c, cc, oai_apply_template_json(h->srv, body, cc->body.n, &e), &e);
    case R_MODELS:
        return send_json(h, c, cc, 200, oai_models_json(h->srv, h->started));
    case R_MODEL:
        if (h->srv->strict_model && strcmp(url + 11, h->srv->model_id)) {
            oai_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "the model '%.200s' does not exist: this server serves '%.200s'", url + 11, h->srv->model_id);
            return send_error(h, c, cc, &e);
        }
        return send_json(h, c, cc, 200, oai_model_json(h->srv, h->started));
    case R_HEALTH:
        return send_health(h, c, cc);
    case R_METRICS:
        return send_metrics(h, c, cc);
    case R_PROPS:
        return send_props(h, c, cc);
    case R_WEBUI:
        return send_body(h, c, cc, 200, "text/html; charset=utf-8", sv_webui_html, sv_webui_html_len);
    case R_SLOTS:
        return send_json(h, c, cc, 200, sv_slots_json(h->sched));
    case R_SLOT_ACTION:
        return send_slot_action(h, c, cc, url + 7);
    default:
        return MHD_NO;
    }
}

static enum route route_of(const char *url)
{
    static const struct {
        const char *path;
        enum route rt;
    } exact[] = {{"/v1/completions", R_COMPLETIONS}, {"/v1/chat/completions", R_CHAT},
                 {"/v1/responses", R_RESPONSES},     {"/tokenize", R_TOKENIZE},
                 {"/detokenize", R_DETOKENIZE},      {"/apply-template", R_APPLY_TEMPLATE},
                 {"/v1/models", R_MODELS},           {"/health", R_HEALTH},
                 {"/v1/health", R_HEALTH},           {"/metrics", R_METRICS},
                 {"/props", R_PROPS},                {"/slots", R_SLOTS},
                 {"/api/chat", R_OLLAMA_CHAT},       {"/api/generate", R_OLLAMA_GENERATE},
                 {"/api/show", R_OLLAMA_SHOW},       {"/api/tags", R_OLLAMA_TAGS},
                 {"/api/ps", R_OLLAMA_PS},           {"/api/version", R_OLLAMA_VERSION},
                 {"/completion", R_LLAMACPP_COMPLETION}, {"/completions", R_LLAMACPP_COMPLETION},
                 {"/infill", R_INFILL},
                 {"/v1/embeddings", R_EMBEDDINGS},   {"/embeddings", R_EMBEDDINGS},
                 {"/api/embed", R_OLLAMA_EMBED},     {"/api/embeddings", R_OLLAMA_EMBEDDINGS},
                 {"/", R_WEBUI},                     {"/index.html", R_WEBUI}};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (!strcmp(url, exact[i].path))
            return exact[i].rt;
    if (!strncmp(url, "/slots/", 7))
        return R_SLOT_ACTION;
    return strncmp(url, "/v1/models/", 11) ? R_OTHER : R_MODEL;
}

/* The peer's address as text (for the log) and as the scheduler's client. */
static uint64_t peer_of(struct MHD_Connection *c, char *text, size_t n)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    snprintf(text, n, "?");
    if (sa && sa->sa_family == AF_INET) {
        const struct in_addr *a = &((const struct sockaddr_in *)sa)->sin_addr;
        inet_ntop(AF_INET, a, text, (socklen_t)n);
        return cv_splitmix64(4 ^ (uint64_t)ntohl(a->s_addr) << 8);
    }
    if (sa && sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        inet_ntop(AF_INET6, a, text, (socklen_t)n);
        uint64_t hi, lo;
        memcpy(&hi, a->s6_addr, 8);
        memcpy(&lo, a->s6_addr + 8, 8);
        return cv_splitmix64(cv_splitmix64(6 ^ hi) ^ lo);
    }
    return 0;
}

/* The connection's entry in h->deadlines, or NULL. */
static sv_deadline *deadline_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Whether a browser's Origin is this server itself (the page at /): its
 * scheme and the Host the request names. */
static bool same_origin(const sv_http *h, struct MHD_Connection *c, const char *origin)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *scheme = h->tls ? "https://" : "http://";
    const size_t n = strlen(scheme);
    return host && !strncmp(origin, scheme, n) && !strcasecmp(origin + n, host);
}

/* The request's refusal from its headers alone (none: status 0). */
static void judge(sv_http *h, struct MHD_Connection *c, conn *cc, const char *method, oai_error *e)
{
    const bool post = takes_post(cc->rt);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    char shown[160];
    if (origin && (sv_access_origin_ok(h->access, origin) || same_origin(h, c, origin)))
        cc->origin = origin;
    if (draining(h)) {
        cc->retry_after = 5;
        oai_fail(e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    } else if (cc->rt == R_OTHER || (cc->rt == R_WEBUI && !h->webui)) {
        oai_fail(e, 404, "invalid_request_error", "unknown_url", NULL, "no route %s %s%s", cc->method, cc->path,
                 cc->rt == R_WEBUI ? " (the web page is off: --no-webui)" : "");
    } else if (origin && !cc->origin) {
        oai_fail(e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                 "web pages from %s may not use this server (see convoy serve --cors)",
                 cv_escape(shown, sizeof shown, origin, strlen(origin)));
    } else if (cc->options) {
        return;
    } else if (post ? strcmp(method, "POST") : strcmp(method, "GET") && strcmp(method, "HEAD")) {
        oai_fail(e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s takes %s, not %s", cc->path,
                 post ? "POST" : "GET or HEAD", cc->method);
    } else if (cc->rt != R_HEALTH && cc->rt != R_WEBUI && !sv_access_key_ok(h->access, auth)) {
        oai_fail(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                 auth ? "the API key is not valid" : "no API key: send it as 'Authorization: Bearer KEY'");
    } else if (post && origin && !sv_is_json_type(type)) {
        oai_fail(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                 "a request from a web page must have Content-Type: application/json");
    }
}

/* The first call of a request: its headers are in. Answers at once only
 * what must not wait for the body (see the design comment). */
static enum MHD_Result begin(sv_http *h, struct MHD_Connection *c, const char *url, const char *method,
                             void **con_cls)
{
    conn *cc = cv_calloc(1, sizeof *cc);
    if (!cc)
        return MHD_NO;
    *con_cls = cc;
    cc->t0 = cv_now_s();
    cc->ttft = -1;
    cc->rt = route_of(url);
    cc->options = !strcmp(method, "OPTIONS");
    cv_escape(cc->method, sizeof cc->method, method, strlen(method));
    cv_escape(cc->path, sizeof cc->path, url, strlen(url));
    cc->client_id = peer_of(c, cc->client, sizeof cc->client);
    judge(h, c, cc, method, &cc->refusal);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    const unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    if (!cc->refusal.status && declared > h->max_body && (expect || declared / 16 > h->max_body))
        oai_fail(&cc->refusal, 413, "invalid_request_error", "request_too_large", NULL,
                 "the request body has %llu bytes; the limit is %zu", declared, h->max_body);
    if (cc->refusal.status && (expect || cc->refusal.status == 413))
        return send_error(h, c, cc, &cc->refusal);
    return MHD_YES;
}

/* A piece of body: kept up to the cap, dropped past it or when refused;
 * a client that keeps sending far past the cap is cut off. */
static enum MHD_Result take_body(sv_http *h, conn *cc, const char *upload, size_t *upload_size)
{
    cc->received += *upload_size;
    if (!cc->too_large && cc->received > h->max_body) {
        cc->too_large = true;
        sv_buf_free(&cc->body);
    }
    if (cc->too_large && cc->received / 16 > h->max_body)
        return MHD_NO;
    if (!cc->too_large && !cc->refusal.status && takes_post(cc->rt) &&
        sv_buf_append(&cc->body, upload, *upload_size))
        return MHD_NO;
    *upload_size = 0;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    sv_http *h = cls;
    conn *cc = *con_cls;
    if (!cc)
        return begin(h, c, url, method, con_cls);
    if (*upload_size)
        return take_body(h, cc, upload, upload_size);
    sv_deadline *dl = deadline_of(c); /* the whole request is in */
    if (dl)
        sv_deadline_wait(h->deadlines, dl, false);
    return answer(h, c, cc, url);
}

/* The request's log line: a generation's with its tokens and times. */
static void log_request(const conn *cc, enum MHD_RequestTerminationCode toe)
{
    const double ms = (cv_now_s() - cc->t0) * 1e3;
    const sv_log_level level = cc->status >= 500 || cc->failure[0] ? SV_LOG_WARN
                               : (cc->rt == R_HEALTH || cc->rt == R_METRICS) ? SV_LOG_DEBUG
                                                                               : SV_LOG_INFO;
    char status[16], ttft[48] = "";
    snprintf(status, sizeof status, "%d", cc->status);
    if (cc->ttft >= 0)
        snprintf(ttft, sizeof ttft, ", first token %.1f ms", cc->ttft * 1e3);
    char ended[200] = "";
    if (cc->failure[0])
        snprintf(ended, sizeof ended, " (the stream ended with an error: %.150s)", cc->failure);
    else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        snprintf(ended, sizeof ended, "%s", cc->status ? " (the client left before the end)" : " (the client left)");
    if (cc->n_prompt > 0)
        sv_log(level, "%s %s %s from %s: %d prompt + %d generated tokens%s, total %.1f ms%s", cc->method, cc->path,
               cc->status ? status : "-", cc->client, cc->n_prompt, cc->n_gen, ttft, ms, ended);
    else
        sv_log(level, "%s %s %s from %s in %.1f ms%s", cc->method, cc->path, cc->status ? status : "-", cc->client,
               ms, ended);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    sv_http *h = cls;
    sv_deadline *dl = deadline_of(c);
    if (dl)
        sv_deadline_wait(h->deadlines, dl, true); /* the next request's headers */
    conn *cc = *con_cls;
    if (!cc)
        return;
    log_request(cc, toe);
    sv_buf_free(&cc->body);
    cv_free(cc);
    *con_cls = NULL;
}

/* A connection opens (its first request is due) or closes (before its socket). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    sv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        char who[64];
        peer_of(c, who, sizeof who);
        *socket_context = ci ? sv_deadline_add(h->deadlines, ci->connect_fd, who) : NULL;
    } else if (*socket_context) {
        sv_deadline_remove(h->deadlines, *socket_context);
        *socket_context = NULL;
    }
}

static struct MHD_Daemon *start_daemon(sv_http *h, const sv_http_opts *o, const struct addrinfo *ai)
{
    /* No MHD_USE_ERROR_LOG: it would print a line for every client that
     * hangs up, which is normal here. MHD_USE_ITC: for MHD_quiesce_daemon. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_OptionItem tls[] = {{MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)o->tls_key_pem},
                                   {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)o->tls_cert_pem},
                                   {MHD_OPTION_END, 0, NULL}};
    if (o->tls_key_pem)
        flags |= MHD_USE_TLS;
    /* the array from tls (HTTPS) or from its END alone (plain HTTP) */
    return MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(o->max_connections > 0 ? o->max_connections : 512), MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)(o->client_connections > 0 ? o->client_connections : 128), MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)h->idle_timeout_s, MHD_OPTION_ARRAY, o->tls_key_pem ? tls : tls + 2, MHD_OPTION_END);
}

static void http_free(sv_http *h)
{
    sv_deadlines_stop(h->deadlines);
    pthread_cond_destroy(&h->gens_done);
    pthread_mutex_destroy(&h->mu);
    cv_free(h);
}

int sv_http_start(sv_http **out, const sv_http_opts *o, sv_sched *sched, const oai_server *srv, char *err,
                  size_t errlen)
{
    *out = NULL;
    const char *host = o->host ? o->host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535)
        return cv_errf(err, errlen, "port %d is not in [0, 65535]", o->port);
    if (!o->tls_key_pem != !o->tls_cert_pem)
        return cv_errf(err, errlen, "HTTPS needs both a key and a certificate");
    if (o->tls_key_pem && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return cv_errf(err, errlen, "this build's libmicrohttpd has no TLS: HTTPS cannot be served");
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", o->port);
    const int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai)
        return cv_errf(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(gai));
    sv_http *h = cv_calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return cv_errf(err, errlen, "out of memory");
    }
    h->sched = sched;
    h->srv = srv;
    h->access = o->access ? o->access : &h->no_access;
    h->props = o->props ? *o->props : (sv_props){.model_path = "", .build_info = "convoy", .version = "",
                                                 .seed = -1};
    h->max_body = o->max_body ? o->max_body : 1u << 20;
    h->slot_save_path = o->slot_save_path;
    h->idle_timeout_s = o->idle_timeout_s > 0 ? o->idle_timeout_s : 10;
    h->webui = !o->no_webui;
    h->embeddings = o->embeddings;
    h->tls = o->tls_key_pem != NULL;
    h->started = (long long)time(NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->gens_done, NULL);
    /* Twice the idle timeout: a keep-alive connection idle for less than it
     * still has time to send its next request's headers. */
    h->deadlines = sv_deadlines_start(2.0 * h->idle_timeout_s, err, errlen);
    h->daemon = h->deadlines ? start_daemon(h, o, ai) : NULL;
    freeaddrinfo(ai);
    if (!h->deadlines) {
        http_free(h);
        return -1;
    }
    if (!h->daemon) {
        http_free(h);
        return cv_errf(err, errlen, "cannot listen on %s port %d (in use, or not an address of this machine%s)", host,
                       o->port, o->tls_key_pem ? "; or the TLS key and certificate are not a valid PEM pair" : "");
    }
    *out = h;
    return 0;
}

int sv_http_port(const sv_http *h)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}

/* Waits until every gen is freed (its answer went out), at most ms. */
static void wait_for_gens(sv_http *h, int ms)
{
    const struct timespec until = cv_deadline_ms(ms);
    pthread_mutex_lock(&h->mu);
    while (h->n_gens > 0)
        if (pthread_cond_timedwait(&h->gens_done, &h->mu, &until))
            break;
    if (h->n_gens > 0)
        sv_log(SV_LOG_WARN, "%d answers were still going out after %d ms; closing them", h->n_gens, ms);
    pthread_mutex_unlock(&h->mu);
}

void sv_http_stop(sv_http *h)
{
    if (!h)
        return;
    /* the listening socket stays open until the daemon stops (its threads
     * may still hold it), but shut down: connecting is refused from now */
    const MHD_socket listener = MHD_quiesce_daemon(h->daemon);
    if (listener != MHD_INVALID_SOCKET)
        shutdown(listener, SHUT_RDWR);
    pthread_mutex_lock(&h->mu);
    h->draining = true;
    pthread_mutex_unlock(&h->mu);
    sv_sched_stop(h->sched);
    wait_for_gens(h, DRAIN_MS);
    MHD_stop_daemon(h->daemon);
    if (listener != MHD_INVALID_SOCKET)
        close(listener);
    http_free(h);
}
