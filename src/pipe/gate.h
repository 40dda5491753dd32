/* gate.h: the accepting side of a node: connections prove themselves
 * before the serving thread sees them.
 *
 * Contract:
 * - A gate listens on host:port. cv_gate_next accepts every connection
 *   that arrives into a bounded set of pending ones (max_pending) and
 *   advances them all at once, without blocking on any: with a key, each
 *   runs the server's key handshake (seal.h section 2) and is read no
 *   further than the handshake's bytes until its proof verifies; without
 *   one, each must send the first bytes of a frame header ("CVY1"...).
 *   The first connection that does so is returned as a link (opts as
 *   given, sealed with the session's keys when keyed), the others stay
 *   pending for the next call.
 * - A pending connection has deadline_ms from its accept to prove itself
 *   (counted while some thread is in cv_gate_next; an expired one is dropped
 *   at the next call). When the set is full, the oldest is dropped to make
 *   room, so idle sockets cannot keep a real peer out.
 * - A connection dropped or refused is closed without an answer (a peer
 *   without the key learns nothing), and logged on stderr as
 *   "<log_prefix>: refused peer ADDR:PORT: <why>", for example
 *   "convoy stage: refused peer 10.0.0.5:41234: key proof did not verify".
 * - One thread at a time uses a gate. Functions return 0 or -1 with a
 *   message in err; cv_gate_next returns CV_LINK_TIMEOUT (link.h) when
 *   timeout_ms passed without a proven connection. */
#ifndef CONVOY_PIPE_GATE_H
#define CONVOY_PIPE_GATE_H

#include <stddef.h>

#include "pipe/link.h"
#include "pipe/seal.h"

#define CV_GATE_MAX_PENDING 32

typedef struct cv_gate cv_gate;

typedef struct cv_gate_opts {
    const cv_seal_key *key; /* NULL: plaintext */
    int deadline_ms;        /* for a pending connection to prove itself; > 0 */
    int max_pending;        /* 1..CV_GATE_MAX_PENDING; 0: CV_GATE_MAX_PENDING */
    const char *log_prefix; /* "convoy stage" */
} cv_gate_opts;

int cv_gate_open(const char *host, int port, const cv_gate_opts *o, cv_gate **out, char *err, size_t errlen);
int cv_gate_port(const cv_gate *g);
/* The next proven connection within timeout_ms (< 0: no limit). */
int cv_gate_next(cv_gate *g, int timeout_ms, const cv_link_opts *opts, cv_link **out, char *err, size_t errlen);
/* Closes the listener and every pending connection. NULL is fine. */
void cv_gate_close(cv_gate *g);

#endif
