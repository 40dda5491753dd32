/* node_impl.h: the state of `convoy stage` (node.h), shared by the files
 * that serve it (private to src/pipe).
 *
 * Contract: a node is served by one thread, which owns everything here;
 * the pulse thread reads `working` and sends on the head's link (any
 * thread may send on a link: link.h). The files, by job:
 * - node.c: the session (its end, its buffers), the compute path (FORWARD,
 *   SEQ_OP, STATS) and the serving loop with its pulse; cv_node_serve.
 * - handshake.c: the head's handshake (HELLO queries, then an assignment:
 *   checked, bound, the next node connected, the previous one accepted).
 * - gate.c: admission beyond the gate's proof: connections parked while a
 *   head holds the node, node.h's takeover rule, the HELLO rate.
 * - ship.c: a receiving node's layers (FETCH, SHIP, its cache).
 * Words: the head is the process that drives a chain; `head_link` is the
 * head's link, the node's connection to it. The last stage holds the
 * output matrix, samples, and answers RESULT (cv_node_is_last_stage).
 * Functions return 0 or -1 with a message in err; *code, where a function
 * has one, is the ERROR (proto.h) the head is owed, 0 once it was told. */
#ifndef CONVOY_PIPE_NODE_IMPL_H
#define CONVOY_PIPE_NODE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "infer/span.h"
#include "model/fingerprint.h"
#include "pipe/gate.h"
#include "pipe/inbox.h"
#include "pipe/link.h"
#include "pipe/node.h"
#include "pipe/proto.h"
#include "pipe/wire.h"

/* How often a node that waits on a link looks at its gate. */
#define GATE_POLL_MS 20
/* Proven connections parked while a head holds the node (gate.c). */
#define PARKED_MAX 4
/* Source addresses whose HELLOs are counted (gate.c's rate). */
#define RATE_ADDRS 64
#define RATE_KEY_BYTES 9 /* the family (4 or 6), then 4 or 8 bytes of the address */

typedef struct rate_entry {
    uint8_t key[RATE_KEY_BYTES];
    double tokens;
    int64_t t_ms; /* when tokens was counted; 0: a free entry */
    bool logged;  /* its refusals since it ran dry were logged once */
} rate_entry;

/* A proven connection that arrived while a head held the node. */
typedef struct parked {
    cv_link *link;  /* NULL: a free place */
    int64_t since;  /* when the gate handed it over */
    bool has_first; /* first: its first frame, read */
    cv_frame first;
} parked;

typedef struct node {
    const cv_node_opts *o;
    /* the model: --model's, or with --cache the last shard received (none
     * before the first: has_model false) */
    char model_path[4096];
    bool has_model;
    cv_llama meta; /* hyperparameters and tensor directory, no layers bound */
    cv_model_hashes hashes; /* of the model's content, compared with the head's */
    cv_gate *gate;
    parked park[PARKED_MAX]; /* outlive sessions: the next head may be one */
    const cv_seal_key *key; /* NULL: plaintext links */
    uint64_t budget;        /* --mem, else MemAvailable at start; 0 (neither known): no limit */
    uint64_t process_bytes; /* this process at start (core/procmem.h), counted in every session */
    rate_entry rate[RATE_ADDRS]; /* heads' HELLOs by address, across sessions */
    bool hushed;                /* the handshake's failure is one of a flood's, logged before */
    uint32_t speed_us;          /* the last speed probe (cv_span_speed_probe), 0: none yet */
    int64_t speed_ms;           /* when it ran */

    /* session */
    cv_msg_hello hello;
    uint8_t *hashes_asked; /* a receiving node's copy of the assignment's tensor hashes (hello.hashes) */
    cv_span span;
    bool span_open;
    uint64_t range_bytes; /* what the assignment takes here, as counted (plan.h) */
    cv_link *head_link, *prev, *next; /* the head's link, the previous and next nodes' */
    cv_frame first;      /* the head's first frame when it came parked (has_first) */
    bool has_first;
    int64_t heard;       /* when the head or the previous node last spoke (queries do not count) */
    cv_inbox inbox;
    int32_t *tok, *pos, *seq;
    uint8_t *want;
    float *in_f32;           /* [n_batch][n_embd] activations converted from a lossy type */
    cv_fwd_out out[2];       /* span output and its FORWARD, alternating */
    int cur;
    int32_t *out_tokens;     /* [n_batch] */
    cv_result_row *rows;     /* [n_batch] */
    cv_top_entry *top;       /* [n_batch][CV_PROTO_MAX_TOP] */
    uint32_t *n_probs;       /* [n_slot] log-probabilities per row, as SET_SAMPLER counts them */
    uint8_t *res_buf;
    size_t res_cap;
    cv_msg_stats stats; /* compute time, steps and rows of this session */
    int64_t served_ms;  /* when the session began serving (0: it did not) */
    uint32_t data_cap;  /* receive cap of the link FORWARDs arrive by (cv_plan_forward_cap) */

    /* the pulse: see pulse_main */
    pthread_t pulse;
    pthread_mutex_t pulse_mu;
    pthread_cond_t pulse_cv;
    bool pulse_stop;    /* under pulse_mu */
    atomic_bool working; /* a FORWARD is being computed */
} node;

static inline bool cv_node_is_last_stage(const node *n) { return n->hello.l1 == n->hello.n_layer; }

/* node.c */
/* Sends ERROR code msg on l; when the link cannot carry it, quiet says
 * the peer may have left (its link failed): nothing is logged then. */
int cv_node_send_error_q(cv_link *l, uint32_t id, uint32_t code, const char *msg, bool quiet);
int cv_node_send_error(cv_link *l, uint32_t id, uint32_t code, const char *msg);
/* The options of every link of a session: keyed when the node is. */
cv_link_opts cv_node_link_opts(const node *n);
/* Makes the file at path this node's model: its metadata and the content
 * hashes of its tensors (from the cache beside it when they match). */
int cv_node_load_model(node *n, const char *path, char *err, size_t errlen);
void cv_node_unload_model(node *n);

/* handshake.c */
/* The head's handshake: a few queries, then one assignment. 0: the session
 * runs; -1: it ended (the head has been told why when it can be). */
int cv_node_handshake(node *n, char *err, size_t errlen);
/* The receive cap of a handshake: a HELLO of the model's layers (the
 * head's count of them until a receiving node has a model). */
uint32_t cv_node_hello_cap(const node *n);
/* Compares the head's model (n->hello) with this node's: the metadata
 * hash, then, for an assignment, the hashes of the tensors its layers
 * will read. */
int cv_node_check_model(const node *n, char *err, size_t errlen);
/* The head's next handshake frame, unless a parked head takes the node
 * meanwhile (*code: BAD_FRAME, TIMEOUT, or 0 when the head was told). */
int cv_node_head_frame(node *n, cv_frame *f, uint32_t *code, char *err, size_t errlen);

/* gate.c */
/* Parks the gate's next proven connection (waiting up to wait_ms for one)
 * and reads the first frame of those parked that have sent it. */
void cv_node_park_poll(node *n, int wait_ms);
/* Sorts the parked connections that spoke: a head waits, this chain's
 * previous node is returned when want_prev, anything else is refused. */
cv_link *cv_node_park_sort(node *n, bool want_prev);
/* Closes a parked connection; with why, it is told (ERROR code). */
void cv_node_unpark(parked *p, uint32_t code, const char *why);
/* Makes the oldest parked connection the head's link of the next session. */
bool cv_node_unpark_head(node *n);
/* node.h's takeover rule: whether a parked head takes the node now. */
bool cv_node_takeover_due(node *n);
/* Ends the session for a parked head (cv_node_takeover_due): -1, the
 * head told why. */
int cv_node_yield(node *n, char *err, size_t errlen);
/* node.h's rate: refuses (RATE) a HELLO beyond its address's share. */
int cv_node_rate_refuses(node *n, uint32_t *code, char *err, size_t errlen);

/* ship.c */
/* A receiving node's layers for the assignment in n->hello: its shard
 * from the cache, else fetched from the head (FETCH, SHIP). */
int cv_node_receive_layers(node *n, uint32_t id, uint32_t *code, char *err, size_t errlen);
/* Removes the .part files of transfers left unfinished long ago. */
void cv_node_sweep_parts(const node *n);

#endif
