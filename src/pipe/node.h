/* node.h: `convoy stage`, a node of a pipeline.
 *
 * Contract: cv_node_serve listens on host:port and serves heads one after
 * another until *stop becomes non-zero. A session: the head's HELLO (a query
 * with an empty layer range is answered with the node's memory budget and a
 * speed probe; an assignment makes the node check the model (metadata hash,
 * then the content hash of every tensor its layers will read, against the
 * head's: the first that differs is named), shape and its memory budget,
 * bind only the tensors of its layers, connect
 * to the next node when there is one, and answer HELLO_OK); then the node
 * runs every FORWARD it receives (from the head, or from the previous node
 * when the handshake says so) and passes the hidden states on, or, as the
 * last stage, samples and returns RESULT to the head. SEQ_OPs travel the
 * same way. Any failure is answered with ERROR naming the problem and, if
 * the session cannot go on, ends it; the node then waits for the next head.
 * Only the inference thread touches the stage.
 * Limits: before it allocates anything for a HELLO the node checks its
 * sizes against the protocol's limits and its memory count against its
 * budget (pipe/plan.h: the count its answers to queries give); a FORWARD
 * larger than n_batch_max rows of the agreed activation type, or of
 * another type, is refused before any compute, and each link receives no
 * larger frame than the session carries on it (proto.h). The rows a
 * FORWARD may have are the stage's to bound, since they are its compute
 * time, during which no other head is served: a HELLO whose n_batch_max
 * exceeds n_batch_max here (CV_NODE_BATCH_DEFAULT, the heads' default
 * batch, when 0) is refused (TOO_LARGE), so a larger FORWARD is refused
 * at its header. HELLOs are counted by the source address of the head
 * (an IPv6 one by its /64): a few at once, then a few a second (gate.c),
 * beyond which they are refused (RATE) before any work; heads on other
 * addresses are not affected, and one on the same address is served
 * again within a second of the flood's end. A refusal is answered with
 * the ERROR proto.h gives it: a frame the link refuses (header, checksum,
 * size) BAD_FRAME, in the handshake too; a payload that does not decode
 * BAD_FRAME; a valid message out of place BAD_STATE. The session
 * timeout: a session in which no frame arrives (from the head, or the
 * previous node) for io_timeout_ms is ended with ERROR TIMEOUT, so a head
 * that went silent frees the node for the next one; a live head is never
 * silent that long (its scheduler pings an idle pipeline every 0.5 s). The
 * process (cmd_stage.c) makes every thread's stack CV_PLAN_THREAD_STACK,
 * as the count has it.
 * Connections come through a gate (gate.h): only a connection that proved
 * the cluster key (key_file) or, without one, began with a frame reaches
 * the session, as the head when the node is idle or as the previous node
 * when the session waits for it; anything else is refused and logged, so
 * idle or hostile sockets cannot hold the node.
 * Takeover: while a head holds the node (handshake or session), proven
 * connections that arrive are parked (a few at a time) and their first
 * frame read. A head's HELLO there takes the node once the current head
 * has been silent for 1 s: no frame from it or the previous node since
 * its assignment (queries do not count, computing is not silence); the
 * current head is told so (ERROR TIMEOUT) and the newcomer is served. A
 * parked head is refused (ERROR BAD_STATE) as soon as the current head
 * speaks, so two working heads do not take a node from each other; an
 * idle head keeps its nodes only by sending a frame (PING) more often than
 * every second. A handshake takes at most 4 queries, and the next node
 * (TCP, key handshake, HELLO) must answer within 1 s. Without a key, listening
 * on, or being told to connect to, an address that is not loopback is
 * refused unless insecure is set; and a head that is not on this machine
 * (possible with insecure) may not name a next address that reaches this
 * machine's loopback (127/8, ::1, or the any-address 0.0.0.0 or ::, by
 * name or as resolved when connected): through a stage without a key a
 * stranger would reach ports that only this machine's processes can. A
 * head on this machine may (its chains run there; it reaches those ports
 * itself), and a keyed stage connects only to a next node that proves the
 * key, whose holders are trusted.
 * A node with cache_dir and no model receives its layers (ship.h): it
 * offers any layers (HELLO_OK's CV_HOK_RECEIVES, its own bytes counted by
 * the head from the model's, plan.h), and for an assignment uses the shard
 * of those layers of the head's model in cache_dir when one is there and
 * checks, else FETCHes it from the head (resuming a .part), writes it to
 * cache_dir and checks it like any model (a resumed file that fails is
 * fetched again whole), then serves as a node with that file would. A
 * shard whose claimed size exceeds the budget or the free disk is refused
 * (NO_MEMORY) before a byte is written, the cache uses only files it made
 * (ship.h: no symbolic link, no other user's file), and .part files left
 * unfinished for 30 minutes are removed at start and whenever a transfer
 * is left (ship.c's PART_KEEP_S). */
#ifndef CONVOY_PIPE_NODE_H
#define CONVOY_PIPE_NODE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipe/plan.h"

/* The most rows of a FORWARD a node takes by default: the heads' default
 * batch (convoy serve/run --batch). */
#define CV_NODE_BATCH_DEFAULT 512
/* The most --batch may give: the protocol's limit (CV_PROTO_MAX_BATCH). */
#define CV_NODE_BATCH_MAX (1 << 16)

typedef struct cv_node_opts {
    const char *listen;       /* "HOST:PORT" or "[V6]:PORT" to listen on */
    const char *model_path;   /* the model file; or NULL with cache_dir */
    const char *cache_dir;    /* no model: layers shipped by the head are kept here (ship.h) */
    uint64_t mem_budget;      /* resident bytes (pipe/plan.h); 0 = MemAvailable at start */
    int32_t n_threads;
    int handshake_timeout_ms; /* per handshake step */
    int32_t io_timeout_ms;    /* a frame, once begun, must arrive within this; and the session timeout */
    volatile sig_atomic_t *stop;
    int max_sessions;         /* 0 = serve until stopped */
    const char *key_file;     /* the cluster key (pipe/seal.h): every link is keyed; NULL: plaintext */
    bool insecure;            /* plaintext beyond loopback allowed */
    int32_t n_batch_max;      /* rows of a FORWARD taken at most; 0 = CV_NODE_BATCH_DEFAULT */
    bool mlock;               /* the session's layers' weights locked in memory */
} cv_node_opts;

int cv_node_serve(const cv_node_opts *o, char *err, size_t errlen);

#endif
