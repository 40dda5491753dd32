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
 * body is read. A generation, from its request's parse to its last event,
 * is gen.c's (gen.h). */
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
#include "serve/gen.h"
#include "serve/log.h"
#include "serve/ollama.h"
#include "serve/slots.h"
#include "serve/webui.h"

enum { DRAIN_MS = 5000 };

static const char *const route_names[N_ROUTES] = {
    "/v1/completions", "/v1/chat/completions", "/v1/responses",   "/tokenize",       "/detokenize",
    "/apply-template", "/slots/{id}",          "/completion",     "/infill",         "/v1/embeddings",
    "/api/chat",       "/api/generate",        "/api/show",       "/api/embed",      "/api/embeddings",
    "/v1/models",      "/v1/models/{id}",      "/health",         "/metrics",        "/props",
    "/slots",          "/api/tags",            "/api/ps",         "/api/version",    "/",
    "other"};

/* Routes below R_MODELS take POST, the others GET and HEAD. */
static bool takes_post(enum route rt) { return rt < R_MODELS; }

static void count_status(cv_http *h, enum route rt, int code)
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
uint64_t cv_http_fresh(cv_http *h)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&h->mu);
    const uint64_t n = ++h->next_id;
    pthread_mutex_unlock(&h->mu);
    return cv_splitmix64(((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (n << 40) ^ n);
}

bool cv_http_draining(cv_http *h)
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
enum MHD_Result cv_http_queue(cv_http *h, struct MHD_Connection *c, conn *cc, int status, struct MHD_Response *resp)
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

static enum MHD_Result send_body(cv_http *h, struct MHD_Connection *c, conn *cc, int status, const char *type,
                                 const char *body, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    if (type)
        MHD_add_response_header(resp, "Content-Type", type);
    return cv_http_queue(h, c, cc, status, resp);
}

enum MHD_Result cv_http_send_json(cv_http *h, struct MHD_Connection *c, conn *cc, int status, char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":null}}";
    const enum MHD_Result rc = json ? send_body(h, c, cc, status, "application/json", json, strlen(json))
                                    : send_body(h, c, cc, 500, "application/json", oom, sizeof oom - 1);
    free(json);
    return rc;
}

enum MHD_Result cv_http_send_error(cv_http *h, struct MHD_Connection *c, conn *cc, const oai_error *e)
{
    const bool ollama = cv_route_is_ollama(cc->rt) || !strncmp(cc->path, "/api/", 5); /* its unknown routes too */
    return cv_http_send_json(h, c, cc, e->status, ollama ? cv_ollama_error_json(e) : cv_oai_error_json(e));
}

/* A refused submit as an answer: every refusal is a 503 with Retry-After. */
void cv_http_submit_refused(cv_http *h, conn *cc, cv_submit_result sr, const char *why, oai_error *e)
{
    cv_sched_stats st;
    cv_sched_get_stats(h->sched, &st);
    cc->retry_after = sr == CV_SUBMIT_DOWN ? (int)ceil(st.retry_in) + 1 : sr == CV_SUBMIT_FULL ? 1 : 5;
    const char *code = sr == CV_SUBMIT_FULL ? "queue_full" : sr == CV_SUBMIT_DOWN ? "pipeline_down" : NULL;
    cv_oai_fail(e, 503, "server_error", code, NULL, "%s", why);
}

/* True when the peer has closed or reset the connection. */
bool cv_peer_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
        return true;
    char ch;
    return (p.revents & POLLIN) && recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* An embedding's wait ends when its client left (user: the socket). */
static bool fd_gone(void *user) { return cv_peer_gone(*(const int *)user); }

static void metric(cv_buf *b, const char *name, const char *type, const char *help, double v)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    cv_buf_puts(b, line);
}

/* /metrics: the answers by route and status, the generations by reason. */
static void metrics_counts(cv_http *h, const cv_sched_stats *st, cv_buf *b)
{
    char line[256];
    cv_buf_puts(b, "# HELP convoy_requests_total HTTP requests answered, by route and status code.\n"
                   "# TYPE convoy_requests_total counter\n");
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n_counts; i++) {
        snprintf(line, sizeof line, "convoy_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                 route_names[h->counts[i].route], h->counts[i].code, (unsigned long long)h->counts[i].n);
        cv_buf_puts(b, line);
    }
    pthread_mutex_unlock(&h->mu);
    static const char *const reasons[] = {"", "stop", "length", "cancelled", "error"};
    cv_buf_puts(b, "# HELP convoy_generations_total Generations ended, by reason.\n"
                   "# TYPE convoy_generations_total counter\n");
    for (int i = 1; i < 5; i++) {
        snprintf(line, sizeof line, "convoy_generations_total{reason=\"%s\"} %llu\n", reasons[i],
                 (unsigned long long)st->requests_finished[i]);
        cv_buf_puts(b, line);
    }
}

/* A pipeline's nodes: layers, measured and probed speed; a hop's time. */
static void metrics_nodes(const convoy_node_costs *n, cv_buf *b)
{
    if (n->n_nodes == 0)
        return;
    char line[512];
    cv_buf_puts(b, "# HELP convoy_node_layers Layers each pipeline node serves (0: left out).\n"
                   "# TYPE convoy_node_layers gauge\n");
    for (int i = 0; i < n->n_nodes; i++) {
        snprintf(line, sizeof line, "convoy_node_layers{node=\"%s\"} %d\n", n->node[i].addr, n->node[i].layers);
        cv_buf_puts(b, line);
    }
    cv_buf_puts(b, "# HELP convoy_node_seconds_per_layer_token Each node's time per layer and token: measured "
                   "by its stage batch after batch (decayed mean), or its speed probe.\n"
                   "# TYPE convoy_node_seconds_per_layer_token gauge\n");
    for (int i = 0; i < n->n_nodes; i++) {
        snprintf(line, sizeof line,
                 "convoy_node_seconds_per_layer_token{node=\"%s\",source=\"measured\"} %.9g\n"
                 "convoy_node_seconds_per_layer_token{node=\"%s\",source=\"probe\"} %.9g\n",
                 n->node[i].addr, n->node[i].us_measured / 1e6, n->node[i].addr, n->node[i].us_probed / 1e6);
        cv_buf_puts(b, line);
    }
    metric(b, "convoy_hop_seconds", "gauge", "One hop's time between stages (a batch alone in flight: its round "
           "trip less the stages' times, over its hops).", n->us_hop / 1e6);
}

static void metrics_engine(const cv_sched_stats *st, cv_buf *b)
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
    cv_buf_puts(b, "# HELP convoy_time_to_first_token_seconds From submission to the first sampled token.\n"
                   "# TYPE convoy_time_to_first_token_seconds summary\n");
    snprintf(line, sizeof line,
             "convoy_time_to_first_token_seconds_sum %.9g\nconvoy_time_to_first_token_seconds_count %llu\n",
             st->ttft_seconds, (unsigned long long)st->ttft_count);
    cv_buf_puts(b, line);
}

static enum MHD_Result send_metrics(cv_http *h, struct MHD_Connection *c, conn *cc)
{
    cv_sched_stats st;
    cv_sched_get_stats(h->sched, &st);
    cv_buf b = {0};
    count_status(h, R_METRICS, 200); /* this answer counts itself */
    metrics_counts(h, &st, &b);
    metrics_engine(&st, &b);
    if (h->srv->chat && h->srv->chat->pool)
        metric(&b, "convoy_template_memory_peak_bytes", "gauge",
               "The most memory chat template renders held at once beyond their own MiB each (--template-mem).",
               (double)cv_template_pool_peak(h->srv->chat->pool));
    const enum MHD_Result rc = b.p ? send_body(h, c, cc, 200, "text/plain; version=0.0.4", b.p, b.n)
                                   : send_body(h, c, cc, 500, "text/plain", "", 0);
    cv_buf_free(&b);
    return rc;
}

/* 200 {"status":"ok"}, or 503 with the engine's error while its last
 * step failed (a pipeline whose node died stays failed). */
static enum MHD_Result send_health(cv_http *h, struct MHD_Connection *c, conn *cc)
{
    cv_sched_stats st;
    cv_sched_get_stats(h->sched, &st);
    if (!st.failing)
        return cv_http_send_json(h, c, cc, 200, cv_oai_health_json(NULL));
    cc->retry_after = (int)ceil(st.retry_in) + 1;
    return cv_http_send_json(h, c, cc, 503, cv_oai_health_json(st.last_error));
}

/* /props, with the nodes that serve the model and their layers. */
static enum MHD_Result send_props(cv_http *h, struct MHD_Connection *c, conn *cc)
{
    cv_sched_stats st;
    cv_sched_get_stats(h->sched, &st);
    return cv_http_send_json(h, c, cc, 200, cv_props_json(h->srv, &h->props, &st.nodes));
}

/* OPTIONS: 204 with Allow; for a browser's preflight the CORS answer. */
static enum MHD_Result send_options(cv_http *h, struct MHD_Connection *c, conn *cc)
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
    return cv_http_queue(h, c, cc, 204, resp);
}

/* A body answer of extra.h (NULL: e says why). */
static enum MHD_Result send_extra(cv_http *h, struct MHD_Connection *c, conn *cc, char *json, const oai_error *e)
{
    return json ? cv_http_send_json(h, c, cc, 200, json) : cv_http_send_error(h, c, cc, e);
}

/* POST /slots/ID?action=...: id is the path after "/slots/". */
static enum MHD_Result send_slot_action(cv_http *h, struct MHD_Connection *c, conn *cc, const char *id)
{
    oai_error e = {0};
    char *end;
    const long slot = strtol(id, &end, 10);
    if (end == id || *end || slot < 0 || slot > INT32_MAX) {
        cv_oai_fail(&e, 404, "invalid_request_error", "unknown_url", NULL, "no slot \"%.40s\": slots are numbers", id);
        return cv_http_send_error(h, c, cc, &e);
    }
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    return send_extra(h, c, cc,
                      cv_slot_action_json(h->sched, h->srv->model, h->slot_save_path, (int32_t)slot, action,
                                          cc->body.p, cc->body.n, &e),
                      &e);
}

/* The embedding routes (embed.h), 501 unless the server was started with
 * --embeddings (llama-server's answer). */
static enum MHD_Result send_embeddings(cv_http *h, struct MHD_Connection *c, conn *cc)
{
    oai_error e = {0};
    if (!h->embeddings) {
        cv_oai_fail(&e, 501, "not_supported_error", NULL, NULL,
                 "This server does not support embeddings. Start it with `--embeddings`");
        return cv_http_send_error(h, c, cc, &e);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    const cv_embed_run run = {.sched = h->sched, .srv = h->srv, .client = cc->client_id, .gone = fd_gone,
                              .user = &fd, .poll_ms = POLL_MS};
    const cv_embed_api api = cc->rt == R_EMBEDDINGS     ? CV_EMBED_OPENAI
                             : cc->rt == R_OLLAMA_EMBED ? CV_EMBED_OLLAMA
                                                        : CV_EMBED_OLLAMA_LEGACY;
    cv_submit_result refused;
    char *json = cv_embed_answer(&run, api, cc->body.p ? cc->body.p : "", cc->body.n, &cc->n_prompt, &refused, &e);
    if (json)
        return cv_http_send_json(h, c, cc, 200, json);
    if (!e.status) /* the client left */
        return MHD_NO;
    if (refused != CV_SUBMIT_OK)
        cv_http_submit_refused(h, cc, refused, e.message, &e);
    return cv_http_send_error(h, c, cc, &e);
}

/* The last call of a request: its refusal, or its route's answer. */
static enum MHD_Result answer(cv_http *h, struct MHD_Connection *c, conn *cc, const char *url)
{
    oai_error e = {0};
    const char *body = cc->body.p ? cc->body.p : "";
    if (cc->too_large)
        cv_oai_fail(&cc->refusal, 413, "invalid_request_error", "request_too_large", NULL,
                 "the request body is larger than the limit of %zu bytes", h->max_body);
    if (cc->refusal.status)
        return cv_http_send_error(h, c, cc, &cc->refusal);
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
        return cv_gen_answer(h, c, cc);
    case R_EMBEDDINGS:
    case R_OLLAMA_EMBED:
    case R_OLLAMA_EMBEDDINGS:
        return send_embeddings(h, c, cc);
    case R_OLLAMA_SHOW:
        return send_extra(h, c, cc, cv_ollama_show_json(h->srv, &h->props, body, cc->body.n, &e), &e);
    case R_OLLAMA_TAGS:
    case R_OLLAMA_PS:
        return cv_http_send_json(h, c, cc, 200, cv_ollama_models_json(h->srv, &h->props, cc->rt == R_OLLAMA_PS));
    case R_OLLAMA_VERSION:
        return cv_http_send_json(h, c, cc, 200, cv_ollama_version_json(&h->props));
    case R_TOKENIZE:
        return send_extra(h, c, cc, cv_tokenize_json(h->srv, body, cc->body.n, &e), &e);
    case R_DETOKENIZE:
        return send_extra(h, c, cc, cv_detokenize_json(h->srv, body, cc->body.n, &e), &e);
    case R_APPLY_TEMPLATE:
        return send_extra(h, c, cc, cv_oai_apply_template_json(h->srv, body, cc->body.n, &e), &e);
    case R_MODELS:
        return cv_http_send_json(h, c, cc, 200, cv_oai_models_json(h->srv, h->started));
    case R_MODEL:
        if (h->srv->strict_model && strcmp(url + 11, h->srv->model_id)) {
            cv_oai_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                     "the model '%.200s' does not exist: this server serves '%.200s'", url + 11, h->srv->model_id);
            return cv_http_send_error(h, c, cc, &e);
        }
        return cv_http_send_json(h, c, cc, 200, cv_oai_model_json(h->srv, h->started));
    case R_HEALTH:
        return send_health(h, c, cc);
    case R_METRICS:
        return send_metrics(h, c, cc);
    case R_PROPS:
        return send_props(h, c, cc);
    case R_WEBUI:
        return send_body(h, c, cc, 200, "text/html; charset=utf-8", cv_webui_html, cv_webui_html_len);
    case R_SLOTS:
        return cv_http_send_json(h, c, cc, 200, cv_slots_json(h->sched));
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
static cv_deadline *deadline_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Whether a browser's Origin is this server itself (the page at /): its
 * scheme and the Host the request names. */
static bool same_origin(const cv_http *h, struct MHD_Connection *c, const char *origin)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *scheme = h->tls ? "https://" : "http://";
    const size_t n = strlen(scheme);
    return host && !strncmp(origin, scheme, n) && !strcasecmp(origin + n, host);
}

/* The request's refusal from its headers alone (none: status 0). */
static void judge(cv_http *h, struct MHD_Connection *c, conn *cc, const char *method, oai_error *e)
{
    const bool post = takes_post(cc->rt);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    char shown[160];
    if (origin && (cv_access_origin_ok(h->access, origin) || same_origin(h, c, origin)))
        cc->origin = origin;
    if (cv_http_draining(h)) {
        cc->retry_after = 5;
        cv_oai_fail(e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
    } else if (cc->rt == R_OTHER || (cc->rt == R_WEBUI && !h->webui)) {
        cv_oai_fail(e, 404, "invalid_request_error", "unknown_url", NULL, "no route %s %s%s", cc->method, cc->path,
                 cc->rt == R_WEBUI ? " (the web page is off: --no-webui)" : "");
    } else if (origin && !cc->origin) {
        cv_oai_fail(e, 403, "invalid_request_error", "origin_not_allowed", NULL,
                 "web pages from %s may not use this server (see convoy serve --cors)",
                 cv_escape(shown, sizeof shown, origin, strlen(origin)));
    } else if (cc->options) {
        return;
    } else if (post ? strcmp(method, "POST") : strcmp(method, "GET") && strcmp(method, "HEAD")) {
        cv_oai_fail(e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s takes %s, not %s", cc->path,
                 post ? "POST" : "GET or HEAD", cc->method);
    } else if (cc->rt != R_HEALTH && cc->rt != R_WEBUI && !cv_access_key_ok(h->access, auth)) {
        cv_oai_fail(e, 401, "invalid_request_error", "invalid_api_key", NULL,
                 auth ? "the API key is not valid" : "no API key: send it as 'Authorization: Bearer KEY'");
    } else if (post && origin && !cv_is_json_type(type)) {
        cv_oai_fail(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                 "a request from a web page must have Content-Type: application/json");
    }
}

/* The first call of a request: its headers are in. Answers at once only
 * what must not wait for the body (see the design comment). */
static enum MHD_Result begin(cv_http *h, struct MHD_Connection *c, const char *url, const char *method,
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
        cv_oai_fail(&cc->refusal, 413, "invalid_request_error", "request_too_large", NULL,
                 "the request body has %llu bytes; the limit is %zu", declared, h->max_body);
    if (cc->refusal.status && (expect || cc->refusal.status == 413))
        return cv_http_send_error(h, c, cc, &cc->refusal);
    return MHD_YES;
}

/* A piece of body: kept up to the cap, dropped past it or when refused;
 * a client that keeps sending far past the cap is cut off. */
static enum MHD_Result take_body(cv_http *h, conn *cc, const char *upload, size_t *upload_size)
{
    cc->received += *upload_size;
    if (!cc->too_large && cc->received > h->max_body) {
        cc->too_large = true;
        cv_buf_free(&cc->body);
    }
    if (cc->too_large && cc->received / 16 > h->max_body)
        return MHD_NO;
    if (!cc->too_large && !cc->refusal.status && takes_post(cc->rt) &&
        cv_buf_append(&cc->body, upload, *upload_size))
        return MHD_NO;
    *upload_size = 0;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    cv_http *h = cls;
    conn *cc = *con_cls;
    if (!cc)
        return begin(h, c, url, method, con_cls);
    if (*upload_size)
        return take_body(h, cc, upload, upload_size);
    cv_deadline *dl = deadline_of(c); /* the whole request is in */
    if (dl)
        cv_deadline_wait(h->deadlines, dl, false);
    return answer(h, c, cc, url);
}

/* The request's log line: a generation's with its tokens and times. */
static void log_request(const conn *cc, enum MHD_RequestTerminationCode toe)
{
    const double ms = (cv_now_s() - cc->t0) * 1e3;
    const cv_log_level level = cc->status >= 500 || cc->failure[0] ? CV_LOG_WARN
                               : (cc->rt == R_HEALTH || cc->rt == R_METRICS) ? CV_LOG_DEBUG
                                                                               : CV_LOG_INFO;
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
        cv_log(level, "%s %s %s from %s: %d prompt + %d generated tokens%s, total %.1f ms%s", cc->method, cc->path,
               cc->status ? status : "-", cc->client, cc->n_prompt, cc->n_gen, ttft, ms, ended);
    else
        cv_log(level, "%s %s %s from %s in %.1f ms%s", cc->method, cc->path, cc->status ? status : "-", cc->client,
               ms, ended);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    cv_http *h = cls;
    cv_deadline *dl = deadline_of(c);
    if (dl)
        cv_deadline_wait(h->deadlines, dl, true); /* the next request's headers */
    conn *cc = *con_cls;
    if (!cc)
        return;
    log_request(cc, toe);
    cv_buf_free(&cc->body);
    cv_free(cc);
    *con_cls = NULL;
}

/* A connection opens (its first request is due) or closes (before its socket). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    cv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        char who[64];
        peer_of(c, who, sizeof who);
        *socket_context = ci ? cv_deadline_add(h->deadlines, ci->connect_fd, who) : NULL;
    } else if (*socket_context) {
        cv_deadline_remove(h->deadlines, *socket_context);
        *socket_context = NULL;
    }
}

static struct MHD_Daemon *start_daemon(cv_http *h, const cv_http_opts *o, const struct addrinfo *ai)
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

static void http_free(cv_http *h)
{
    cv_deadlines_stop(h->deadlines);
    pthread_cond_destroy(&h->gens_done);
    pthread_mutex_destroy(&h->mu);
    cv_free(h);
}

int cv_http_start(cv_http **out, const cv_http_opts *o, cv_sched *sched, const oai_server *srv, char *err,
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
    cv_http *h = cv_calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return cv_errf(err, errlen, "out of memory");
    }
    h->sched = sched;
    h->srv = srv;
    h->access = o->access ? o->access : &h->no_access;
    h->props = o->props ? *o->props : (cv_props){.model_path = "", .build_info = "convoy", .version = "",
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
    h->deadlines = cv_deadlines_start(2.0 * h->idle_timeout_s, err, errlen);
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

int cv_http_port(const cv_http *h)
{
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}

/* Waits until every gen is freed (its answer went out), at most ms. */
static void wait_for_gens(cv_http *h, int ms)
{
    const struct timespec until = cv_deadline_ms(ms);
    pthread_mutex_lock(&h->mu);
    while (h->n_gens > 0)
        if (pthread_cond_timedwait(&h->gens_done, &h->mu, &until))
            break;
    if (h->n_gens > 0)
        cv_log(CV_LOG_WARN, "%d answers were still going out after %d ms; closing them", h->n_gens, ms);
    pthread_mutex_unlock(&h->mu);
}

void cv_http_stop(cv_http *h)
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
    cv_sched_stop(h->sched);
    wait_for_gens(h, DRAIN_MS);
    MHD_stop_daemon(h->daemon);
    if (listener != MHD_INVALID_SOCKET)
        close(listener);
    http_free(h);
}
