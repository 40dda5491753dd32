/* http_impl.h: what the HTTP front (http.c) shares with the generation
 * it hands requests to (gen.c), private to those two: the routes, the
 * server, a request's struct conn, and the answers http.c queues (with
 * the headers every answer carries). cv_http's mu guards next_id,
 * n_gens, draining and the status counts. */
#ifndef CONVOY_SERVE_HTTP_IMPL_H
#define CONVOY_SERVE_HTTP_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "serve/buf.h"
#include "serve/deadline.h"
#include "serve/http.h"

/* A generation or an embedding waits on its request in slices of POLL_MS, looking at its socket between them. */
enum { POLL_MS = 50 };

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

/* Ollama's routes answer in its shapes, errors too (ollama.h). */
static inline bool cv_route_is_ollama(enum route rt)
{
    return (rt >= R_OLLAMA_CHAT && rt <= R_OLLAMA_EMBEDDINGS) || (rt >= R_OLLAMA_TAGS && rt <= R_OLLAMA_VERSION);
}

typedef struct status_count {
    int route, code;
    uint64_t n;
} status_count;

struct cv_http {
    struct MHD_Daemon *daemon;
    cv_sched *sched;
    const oai_server *srv;
    const cv_access *access; /* never NULL */
    cv_access no_access;     /* what access points to without opts->access */
    cv_props props;
    size_t max_body;
    int idle_timeout_s;
    bool webui;              /* the page at / */
    bool embeddings;         /* the embedding routes answer (--embeddings), else 501 */
    bool tls;
    cv_deadlines *deadlines; /* a request (headers and body) is due within twice idle_timeout_s */
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
    cv_buf body;
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

/* Queues resp with the headers every answer carries (CORS, Allow, Retry-After); notes the status. */
enum MHD_Result cv_http_queue(cv_http *h, struct MHD_Connection *c, conn *cc, int status, struct MHD_Response *resp);
/* json (taken over; NULL: out of memory, a 500) as the answer. */
enum MHD_Result cv_http_send_json(cv_http *h, struct MHD_Connection *c, conn *cc, int status, char *json);
/* e as the answer, in Ollama's shape on its routes. */
enum MHD_Result cv_http_send_error(cv_http *h, struct MHD_Connection *c, conn *cc, const oai_error *e);
/* A fresh 64-bit value per call: request ids and default seeds. */
uint64_t cv_http_fresh(cv_http *h);
/* Whether cv_http_stop has begun. */
bool cv_http_draining(cv_http *h);
/* A refused submit as an answer: a 503 with Retry-After (e says why). */
void cv_http_submit_refused(cv_http *h, conn *cc, cv_submit_result sr, const char *why, oai_error *e);
/* True when the peer has closed or reset the connection. */
bool cv_peer_gone(int fd);

#endif
