/* http.c: the HTTP routes of `convoy serve` on libmicrohttpd (see http.h).
 *
 * Design: the daemon runs one thread per connection, so a connection's
 * thread may block while its request is generated. A body is gathered in
 * the connection's context up to the cap; a body that grows past it is
 * dropped as it arrives and refused (413) when it ends, or at once when the
 * client declared its size and waits for "100 Continue", and the
 * connection is closed once a body passes 16 times the cap. A generation (struct gen) owns the
 * parsed request, the scheduler's request handle and the text state; it
 * waits on the request in slices of POLL_MS and between them looks at the
 * socket (a hang-up or EOF means the client left: the request is
 * released, which cancels it). Non-streaming answers wait in the access
 * handler and then send one JSON body; streaming answers are a callback
 * response whose reader waits the same way and returns server-sent events,
 * one chunk per batch of new text. The reader never returns 0 bytes (with
 * a thread per connection that would spin). The gen is freed by the
 * response's free callback, or by the handler for non-streaming answers. */
#include "serve/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/splitmix.h"
#include "serve/buf.h"
#include "serve/text.h"

enum { POLL_MS = 50, SSE_BLOCK = 16 * 1024 };

enum route { R_COMPLETIONS, R_CHAT, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_OTHER, N_ROUTES };
static const char *const route_names[N_ROUTES] = {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                                   "/v1/models/{id}", "/health", "/metrics", "other"};

typedef struct status_count {
    int route, code;
    uint64_t n;
} status_count;

struct sv_http {
    struct MHD_Daemon *daemon;
    sv_sched *sched;
    const oai_server *srv;
    size_t max_body;
    long long started;
    pthread_mutex_t mu;
    uint64_t next_id;
    status_count counts[64];
    int n_counts;
};

typedef struct conn {
    sv_buf body;
    size_t received;
    bool too_large;
} conn;

typedef struct gen {
    sv_http *h;
    oai_request req;
    sv_request *r;
    sv_text text;
    int fd;
    char id[48];
    long long created;
    int32_t n_seen;     /* tokens turned into text */
    int32_t lp_next;    /* first token whose logprobs are not yet sent */
    sv_buf out;         /* text not yet sent */
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

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *type, const char *body,
                                 size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    const enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_json(sv_http *h, struct MHD_Connection *c, enum route rt, int status, char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}";
    if (!json)
        status = 500;
    count_status(h, rt, status);
    const enum MHD_Result rc = json ? send_body(c, status, "application/json", json, strlen(json))
                                    : send_body(c, 500, "application/json", oom, sizeof oom - 1);
    free(json);
    return rc;
}

static enum MHD_Result send_error(sv_http *h, struct MHD_Connection *c, enum route rt, const oai_error *e)
{
    return send_json(h, c, rt, e->status, oai_error_json(e));
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
    sv_request_release(g->r);
    sv_text_free(&g->text);
    oai_request_free(&g->req);
    sv_buf_free(&g->out);
    sv_buf_free(&g->sse);
    cv_free(g);
}

/* Turns the tokens that arrived into text. Returns 1 once the generation
 * is over (g->finish or g->error set), 0 while it runs. */
static int gen_poll(gen *g, int timeout_ms)
{
    sv_finish f;
    const int32_t n = sv_request_wait(g->r, g->n_seen, timeout_ms, &f);
    const int32_t *toks = sv_request_tokens(g->r);
    while (g->n_seen < n && !g->finish) {
        const int rc = sv_text_push(&g->text, toks[g->n_seen++], &g->out);
        if (rc < 0)
            return oai_fail(&g->error, 500, "server_error", NULL, NULL, "out of memory"), 1;
        if (rc == 1) {
            g->finish = "stop";
            sv_request_cancel(g->r);
        }
    }
    if (g->finish)
        return 1;
    if (f == SV_RUNNING)
        return 0;
    if (f == SV_FINISH_ERROR || f == SV_FINISH_CANCELLED) {
        oai_fail(&g->error, 500, "server_error", NULL, NULL, "the generation failed: %s",
                 f == SV_FINISH_ERROR ? sv_request_error(g->r) : "cancelled");
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
    return (oai_usage){.prompt_tokens = g->req.params.n_prompt, .completion_tokens = g->n_seen};
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

static int sse_event(gen *g, char *json)
{
    if (!json)
        return -1;
    const int rc = sv_buf_puts(&g->sse, "data: ") || sv_buf_puts(&g->sse, json) || sv_buf_puts(&g->sse, "\n\n");
    free(json);
    return rc ? -1 : 0;
}

/* Appends the events for what gen_poll produced: a text chunk, and when
 * the generation is over the final chunk, the usage chunk and [DONE]. */
static int sse_fill(gen *g, bool over)
{
    const oai_server *srv = g->h->srv;
    const oai_usage usage = gen_usage(g);
    if (g->error.status) {
        if (sse_event(g, oai_error_json(&g->error)))
            return -1;
    } else {
        const bool has_text = g->out.n > 0 || (g->req.params.top_logprobs >= 0 && g->lp_next < g->n_seen);
        if (has_text || (g->req.kind == OAI_CHAT && !g->role_sent)) {
            const oai_chunk ch = {.text = g->out.p ? g->out.p : "", .text_len = g->out.n,
                                  .first = g->req.kind == OAI_CHAT && !g->role_sent, .logprobs = gen_logprobs(g),
                                  .include_usage = g->req.include_usage};
            if (sse_event(g, oai_chunk_json(srv, g->req.kind, g->id, g->created, &ch)))
                return -1;
            g->role_sent = true;
            g->text_sent += g->out.n;
            sv_buf_consume(&g->out, g->out.n);
        }
        if (over) {
            const oai_chunk fin = {.text = "", .finish = g->finish, .include_usage = g->req.include_usage,
                                   .usage = g->req.include_usage ? NULL : &usage};
            if (sse_event(g, oai_chunk_json(srv, g->req.kind, g->id, g->created, &fin)))
                return -1;
            const oai_chunk u = {.usage_only = true, .usage = &usage};
            if (g->req.include_usage && sse_event(g, oai_chunk_json(srv, g->req.kind, g->id, g->created, &u)))
                return -1;
        }
    }
    if (over && sv_buf_puts(&g->sse, "data: [DONE]\n\n"))
        return -1;
    g->over = over;
    return 0;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gen *g = cls;
    for (;;) {
        if (g->sse_off < g->sse.n) {
            size_t k = g->sse.n - g->sse_off;
            if (k > max)
                k = max;
            memcpy(buf, g->sse.p + g->sse_off, k);
            g->sse_off += k;
            if (g->sse_off == g->sse.n) {
                sv_buf_consume(&g->sse, g->sse.n);
                g->sse_off = 0;
            }
            return (ssize_t)k;
        }
        if (g->over)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(g->fd))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        const bool over = g->role_sent || g->req.kind != OAI_CHAT ? gen_poll(g, POLL_MS) : false;
        if (sse_fill(g, over))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static enum MHD_Result generate(sv_http *h, struct MHD_Connection *c, enum route rt, const conn *cc)
{
    const oai_kind kind = rt == R_CHAT ? OAI_CHAT : OAI_COMPLETIONS;
    oai_error e = {0};
    gen *g = cv_calloc(1, sizeof *g);
    if (!g) {
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return send_error(h, c, rt, &e);
    }
    g->h = h;
    const uint64_t seed = fresh(h);
    if (oai_parse_request(h->srv, kind, cc->body.p ? cc->body.p : "", cc->body.n, seed, &g->req, &e)) {
        cv_free(g);
        return send_error(h, c, rt, &e);
    }
    if (sv_text_init(&g->text, h->srv->model, (const char *const *)g->req.stop, g->req.n_stop)) {
        gen_free(g);
        oai_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        return send_error(h, c, rt, &e);
    }
    char err[CV_ERRLEN];
    const sv_submit_result sr = sv_sched_submit(h->sched, &g->req.params, &g->r, err, sizeof err);
    if (sr != SV_SUBMIT_OK) {
        gen_free(g);
        if (sr == SV_SUBMIT_FULL)
            oai_fail(&e, 503, "server_error", "queue_full", NULL, "%s", err);
        else if (sr == SV_SUBMIT_DOWN)
            oai_fail(&e, 503, "server_error", "pipeline_down", NULL, "%s", err);
        else
            oai_fail(&e, 503, "server_error", NULL, NULL, "%s", err);
        return send_error(h, c, rt, &e);
    }
    snprintf(g->id, sizeof g->id, "%s-%016llx", kind == OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)fresh(h));
    g->created = (long long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;

    if (g->req.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_reader, g,
                                                                      gen_free);
        if (!resp) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        count_status(h, rt, 200);
        const enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    while (!gen_poll(g, POLL_MS))
        if (peer_gone(g->fd)) {
            gen_free(g);
            return MHD_NO;
        }
    if (g->error.status) {
        const enum MHD_Result rc = send_error(h, c, rt, &g->error);
        gen_free(g);
        return rc;
    }
    const oai_usage usage = gen_usage(g);
    char *json = oai_response_json(h->srv, kind, g->id, g->created, g->out.p ? g->out.p : "", g->out.n, g->finish,
                                   gen_logprobs(g), &usage);
    gen_free(g);
    return send_json(h, c, rt, 200, json);
}

static void metric(sv_buf *b, const char *name, const char *type, const char *help, double v)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    sv_buf_puts(b, line);
}

static enum MHD_Result send_metrics(sv_http *h, struct MHD_Connection *c)
{
    sv_sched_stats st;
    sv_sched_get_stats(h->sched, &st);
    sv_buf b = {0};
    char line[256];
    sv_buf_puts(&b, "# HELP convoy_requests_total HTTP requests answered, by route and status code.\n"
                    "# TYPE convoy_requests_total counter\n");
    count_status(h, R_METRICS, 200);
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n_counts; i++) {
        snprintf(line, sizeof line, "convoy_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                 route_names[h->counts[i].route], h->counts[i].code, (unsigned long long)h->counts[i].n);
        sv_buf_puts(&b, line);
    }
    pthread_mutex_unlock(&h->mu);
    static const char *const reasons[] = {"", "stop", "length", "cancelled", "error"};
    sv_buf_puts(&b, "# HELP convoy_generations_total Generations ended, by reason.\n"
                    "# TYPE convoy_generations_total counter\n");
    for (int i = 1; i < 5; i++) {
        snprintf(line, sizeof line, "convoy_generations_total{reason=\"%s\"} %llu\n", reasons[i],
                 (unsigned long long)st.requests_finished[i]);
        sv_buf_puts(&b, line);
    }
    metric(&b, "convoy_prompt_tokens_total", "counter", "Prompt tokens run through the model.",
           (double)st.prompt_tokens);
    metric(&b, "convoy_generated_tokens_total", "counter", "Tokens sampled.", (double)st.generated_tokens);
    metric(&b, "convoy_tokens_per_second", "gauge", "Tokens sampled per second over the last 10 seconds.",
           st.tokens_per_second);
    metric(&b, "convoy_queue_length", "gauge", "Requests waiting for a slot.", st.queued);
    metric(&b, "convoy_queue_capacity", "gauge", "Requests that may wait beyond the free slots.", st.queue_cap);
    metric(&b, "convoy_active_slots", "gauge", "Sequence slots running a request.", st.active);
    metric(&b, "convoy_slots", "gauge", "Sequence slots.", st.n_slot);
    metric(&b, "convoy_steps_total", "counter", "Engine steps (batches) run.", (double)st.steps);
    metric(&b, "convoy_steps_shared_total", "counter", "Engine steps that carried tokens of two or more requests.",
           (double)st.steps_shared);
    metric(&b, "convoy_batch_tokens_total", "counter", "Tokens over all batches.", (double)st.batch_tokens);
    metric(&b, "convoy_step_seconds_total", "counter", "Time spent in engine steps.", st.step_seconds);
    metric(&b, "convoy_pipeline_down", "gauge", "1 while the pipeline is down and reconnects are tried.", st.down);
    metric(&b, "convoy_pipeline_reconnects_total", "counter", "Times the pipeline came back after going down.",
           (double)st.reconnects);
    metric(&b, "convoy_failovers_total", "counter", "Failed nodes replaced, every sequence replayed.",
           (double)st.failovers);
    metric(&b, "convoy_failover_pause_seconds_total", "counter",
           "Time requests waited for failovers: a new chain planned, sequences replayed.", st.failover_seconds);
    if (st.speculating) {
        metric(&b, "convoy_spec_rounds_total", "counter", "Decode rounds that drafts were asked for.",
               (double)st.spec_rounds);
        metric(&b, "convoy_spec_drafted_total", "counter", "Drafts sent for verification.", (double)st.spec_drafted);
        metric(&b, "convoy_spec_accepted_total", "counter", "Drafts accepted.", (double)st.spec_accepted);
    }
    sv_buf_puts(&b, "# HELP convoy_time_to_first_token_seconds From submission to the first sampled token.\n"
                    "# TYPE convoy_time_to_first_token_seconds summary\n");
    snprintf(line, sizeof line,
             "convoy_time_to_first_token_seconds_sum %.9g\nconvoy_time_to_first_token_seconds_count %llu\n",
             st.ttft_seconds, (unsigned long long)st.ttft_count);
    sv_buf_puts(&b, line);
    const enum MHD_Result rc =
        b.p ? send_body(c, 200, "text/plain; version=0.0.4", b.p, b.n) : send_body(c, 500, "text/plain", "", 0);
    sv_buf_free(&b);
    return rc;
}

/* 200 {"status":"ok"}, or 503 with the engine's error while its last
 * step failed (a pipeline whose node died stays failed). */
static enum MHD_Result send_health(sv_http *h, struct MHD_Connection *c)
{
    sv_sched_stats st;
    sv_sched_get_stats(h->sched, &st);
    if (!st.failing)
        return send_json(h, c, R_HEALTH, 200, oai_health_json(NULL));
    return send_json(h, c, R_HEALTH, 503, oai_health_json(st.last_error));
}

static enum route route_of(const char *url)
{
    if (!strcmp(url, "/v1/completions"))
        return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions"))
        return R_CHAT;
    if (!strcmp(url, "/v1/models"))
        return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11))
        return R_MODEL;
    if (!strcmp(url, "/health"))
        return R_HEALTH;
    if (!strcmp(url, "/metrics"))
        return R_METRICS;
    return R_OTHER;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    sv_http *h = cls;
    const enum route rt = route_of(url);
    const bool post = rt == R_COMPLETIONS || rt == R_CHAT;
    oai_error e = {0};
    conn *cc = *con_cls;
    if (!cc) {
        if (!(cc = cv_calloc(1, sizeof *cc)))
            return MHD_NO;
        *con_cls = cc;
        if (rt == R_OTHER) {
            oai_fail(&e, 404, "invalid_request_error", "unknown_url", NULL, "no route %.100s %.300s", method, url);
            return send_error(h, c, rt, &e);
        }
        if (strcmp(method, post ? "POST" : "GET")) {
            oai_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s takes %s, not %.20s", url,
                     post ? "POST" : "GET", method);
            return send_error(h, c, rt, &e);
        }
        /* A declared body past the cap is refused before it is read when
         * the client waits for "100 Continue" or the body is huge; else it
         * is read and dropped, so that the client, still sending, sees the
         * answer rather than a reset. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        const unsigned long long declared = post && cl ? strtoull(cl, NULL, 10) : 0;
        if (declared > h->max_body && (expect || declared / 16 > h->max_body)) {
            oai_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                     "the request body has %llu bytes; the limit is %zu", declared, h->max_body);
            return send_error(h, c, rt, &e);
        }
        if (post)
            return MHD_YES;
    }
    if (*upload_size) {
        /* Past the cap the body is dropped as it comes (the daemon cannot
         * answer in the middle of an upload); a client that keeps sending
         * far past it is cut off. */
        cc->received += *upload_size;
        if (!cc->too_large && cc->received > h->max_body) {
            cc->too_large = true;
            sv_buf_free(&cc->body);
        }
        if (cc->too_large && cc->received / 16 > h->max_body)
            return MHD_NO;
        if (!cc->too_large && sv_buf_append(&cc->body, upload, *upload_size))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->too_large) {
        oai_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                 "the request body is larger than the limit of %zu bytes", h->max_body);
        return send_error(h, c, rt, &e);
    }
    switch (rt) {
    case R_COMPLETIONS:
    case R_CHAT:
        return generate(h, c, rt, cc);
    case R_MODELS:
        return send_json(h, c, rt, 200, oai_models_json(h->srv, h->started));
    case R_MODEL:
        if (strcmp(url + 11, h->srv->model_id)) {
            oai_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "the model '%.200s' does not exist: this server serves '%.200s'", url + 11, h->srv->model_id);
            return send_error(h, c, rt, &e);
        }
        return send_json(h, c, rt, 200, oai_model_json(h->srv, h->started));
    case R_HEALTH:
        return send_health(h, c);
    case R_METRICS:
        return send_metrics(h, c);
    default:
        return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    conn *cc = *con_cls;
    if (cc) {
        sv_buf_free(&cc->body);
        cv_free(cc);
        *con_cls = NULL;
    }
}

int sv_http_start(sv_http **out, const sv_http_opts *o, sv_sched *sched, const oai_server *srv, char *err,
                  size_t errlen)
{
    *out = NULL;
    const char *host = o->host ? o->host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535)
        return cv_errf(err, errlen, "port %d is not in [0, 65535]", o->port);
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
    h->max_body = o->max_body ? o->max_body : 1u << 20;
    h->started = (long long)time(NULL);
    pthread_mutex_init(&h->mu, NULL);
    /* No MHD_USE_ERROR_LOG: it would print a line for every client that
     * hangs up, which is normal here. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                                 ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                                 MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)(o->max_connections > 0 ? o->max_connections : 512),
                                 MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        pthread_mutex_destroy(&h->mu);
        cv_free(h);
        return cv_errf(err, errlen, "cannot listen on %s port %d (in use, or not an address of this machine)", host,
                       o->port);
    }
    *out = h;
    return 0;
}

int sv_http_port(const sv_http *h)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}

void sv_http_stop(sv_http *h)
{
    if (!h)
        return;
    sv_sched_stop(h->sched);
    MHD_stop_daemon(h->daemon);
    pthread_mutex_destroy(&h->mu);
    cv_free(h);
}
