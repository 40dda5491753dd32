/* node.h: `convoy stage`, a node of a pipeline.
 *
 * Contract: cv_node_serve listens on host:port and serves heads one after
 * another until *stop becomes non-zero. A session: the head's HELLO (a query
 * with an empty layer range is answered with the node's memory budget and a
 * speed probe; an assignment makes the node check the model fingerprint,
 * shape and its memory budget, bind only the tensors of its layers, connect
 * to the next node when there is one, and answer HELLO_OK); then the node
 * runs every FORWARD it receives (from the head, or from the previous node
 * when the handshake says so) and passes the hidden states on, or, as the
 * last stage, samples and returns RESULT to the head. SEQ_OPs travel the
 * same way. Any failure is answered with ERROR naming the problem and, if
 * the session cannot go on, ends it; the node then waits for the next head.
 * Only the inference thread touches the stage. */
#ifndef CONVOY_PIPE_NODE_H
#define CONVOY_PIPE_NODE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_node_opts {
    const char *listen;       /* "HOST:PORT" or "[V6]:PORT" to listen on */
    const char *model_path;
    uint64_t mem_budget;      /* bytes; 0 = no limit */
    int32_t n_threads;
    int handshake_timeout_ms; /* per handshake step */
    int32_t io_timeout_ms;    /* a frame, once begun, must arrive within this */
    volatile sig_atomic_t *stop;
    int max_sessions;         /* 0 = serve until stopped */
} cv_node_opts;

int cv_node_serve(const cv_node_opts *o, char *err, size_t errlen);

#endif
