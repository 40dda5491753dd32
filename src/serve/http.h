/* http.h: the HTTP front of `convoy serve` (libmicrohttpd).
 *
 * Contract: cv_http_start listens on host:port (port 0: any free port,
 * see cv_http_port) and serves, one thread per connection:
 *   POST /v1/completions, POST /v1/chat/completions  (JSON, or server-sent
 *        events with "stream": true, ending in "data: [DONE]")
 *   POST /v1/responses (stateless: JSON, or with "stream": true the
 *        Responses API's typed events, resp.h)
 *   POST /tokenize, POST /detokenize (llama-server's shapes, extra.h)
 *   POST /v1/embeddings (also /embeddings), POST /api/embed and
 *        /api/embeddings (Ollama's), embed.h: with opts->embeddings, else
 *        501 naming --embeddings, as llama-server answers
 *   POST /slots/ID?action=save|restore|erase (slots.h: slot files in
 *        slot_save_path)
 *   GET  /v1/models, GET /v1/models/ID, GET /health (also /v1/health),
 *   GET  /metrics, GET /props, GET /slots
 * HEAD is answered wherever GET is, OPTIONS everywhere (a 204 with Allow,
 * and for a browser the CORS preflight), another method with 405 and
 * Allow. Connections are kept alive between requests.
 *
 * Access (access.h): with API keys every request but /health and OPTIONS
 * needs "Authorization: Bearer KEY", else 401 (code invalid_api_key). A
 * request from a web page (it carries Origin) needs an origin the CORS
 * policy allows (else 403, code origin_not_allowed) and, when it has a
 * body, Content-Type application/json (else 415): such a request cannot
 * be sent without the browser asking first (a preflight), so a page the
 * policy does not allow never runs a generation. Allowed origins get the
 * CORS headers on every answer.
 *
 * Limits: bodies are capped at max_body bytes, checked while they arrive
 * (413); a peer address holds at most client_connections connections (more
 * are closed at once) and all peers max_connections; a connection silent
 * for idle_timeout_s while its request or body arrives, or between
 * requests, is closed, and so is one whose request (headers and body) is
 * not all in within twice that, however it trickles it (deadline.h); a stream waiting for its next event (a long prompt,
 * a queue) sends an SSE comment (": keep-alive") every idle_timeout_s / 3,
 * which clients skip, so that it is not. Every error is an OpenAI-shaped JSON body with a 4xx
 * or 5xx status; a 503 (a full queue, a pipeline down, shutting down)
 * carries Retry-After. A generation is submitted to the scheduler as its
 * peer address's request (sched.h: clients share slots fairly), which
 * stays the only user of the engine; the connection's thread turns the
 * tokens into text (stop strings included) and checks the socket while it
 * waits: a client that disconnects cancels its request, which frees its
 * slot.
 *
 * Log (log.h): one line per request once it is answered: method, path
 * (escaped), status, peer, prompt and generated tokens, time to the first
 * token, total time; /health and /metrics at DEBUG.
 *
 * cv_http_stop drains: it stops accepting (new connections are refused),
 * answers new requests on open connections with 503, stops the scheduler,
 * which ends every request with "the server is shutting down" (a stream
 * gets it as an error event, then "data: [DONE]"), waits up to 5 s for
 * those answers to go out, then closes every connection and joins their
 * threads. */
#ifndef CONVOY_SERVE_HTTP_H
#define CONVOY_SERVE_HTTP_H

#include <stddef.h>

#include "serve/access.h"
#include "serve/extra.h"
#include "serve/oai.h"
#include "serve/sched.h"

typedef struct cv_http cv_http;

typedef struct cv_http_opts {
    const char *host;          /* numeric or resolvable; default 127.0.0.1 */
    int port;                  /* 0 = any free port */
    size_t max_body;           /* bytes; default 1 MiB */
    int max_connections;       /* default 512 */
    int client_connections;    /* per peer address; default 128 */
    int idle_timeout_s;        /* default 10 */
    const cv_access *access;   /* NULL: no keys, no web page may use it */
    const cv_props *props;     /* /props, and the seed of requests without one */
    const char *slot_save_path; /* the directory of slot files; NULL: save and restore are refused */
    const char *tls_key_pem;    /* with tls_cert_pem: HTTPS with this key and certificate (chain), PEM texts; */
    const char *tls_cert_pem;   /* NULL: plain HTTP */
    bool no_webui;              /* no chat page at / (--no-webui) */
    bool embeddings;            /* the embedding routes answer (--embeddings); else 501 */
} cv_http_opts;

/* sched, srv, access and props must outlive the server. */
int cv_http_start(cv_http **out, const cv_http_opts *o, cv_sched *sched, const oai_server *srv, char *err,
                  size_t errlen);
int cv_http_port(const cv_http *h);
void cv_http_stop(cv_http *h);

#endif
