/* http.h: the HTTP front of `convoy serve` (libmicrohttpd).
 *
 * Contract: sv_http_start listens on host:port (port 0: any free port,
 * see sv_http_port) and serves, one thread per connection:
 *   POST /v1/completions, POST /v1/chat/completions  (JSON, or server-sent
 *        events with "stream": true, ending in "data: [DONE]")
 *   GET  /v1/models, GET /v1/models/ID, GET /health, GET /metrics
 * Bodies are capped at max_body bytes, checked while they arrive (413).
 * Every error is an OpenAI-shaped JSON body with a 4xx or 5xx status; a
 * full scheduler queue answers 503. A generation is submitted to the
 * scheduler, which stays the only user of the engine; the connection's
 * thread turns the tokens into text (stop strings included) and checks
 * the socket while it waits: a client that disconnects cancels its request,
 * which frees its slot. sv_http_stop stops accepting, fails what is still
 * running (through sv_sched_stop) and joins every connection thread. */
#ifndef CONVOY_SERVE_HTTP_H
#define CONVOY_SERVE_HTTP_H

#include <stddef.h>

#include "serve/oai.h"
#include "serve/sched.h"

typedef struct sv_http sv_http;

typedef struct sv_http_opts {
    const char *host;    /* numeric or resolvable; default 127.0.0.1 */
    int port;            /* 0 = any free port */
    size_t max_body;     /* bytes; default 1 MiB */
    int max_connections; /* default 512 */
} sv_http_opts;

/* sched and srv must outlive the server. */
int sv_http_start(sv_http **out, const sv_http_opts *o, sv_sched *sched, const oai_server *srv, char *err,
                  size_t errlen);
int sv_http_port(const sv_http *h);
void sv_http_stop(sv_http *h);

#endif
