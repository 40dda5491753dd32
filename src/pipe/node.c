/* node.c: `convoy stage`, one node of a pipeline (see node.h).
 *
 * The serving thread owns everything: the gate, the session's links,
 * the span of its layers. It reads the head's and the previous node's links itself,
 * through an inbox, so it waits on both at once.
 * Hidden states go to the next node straight from the span's output
 * buffer (two buffers alternate, so one can be on the wire while the next
 * batch is computed); the last stage answers the head with RESULT. All
 * buffers are allocated at assignment for the session's batch size; a
 * step allocates nothing (only the first RESULT that carries full logits,
 * a test mode, grows the result buffer once). */
#include "pipe/node.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/fmap.h"
#include "core/procmem.h"
#include "infer/logprobs.h"
#include "infer/span.h"
#include "model/fingerprint.h"
#include "pipe/gate.h"
#include "pipe/inbox.h"
#include "pipe/link.h"
#include "pipe/plan.h"
#include "pipe/proto.h"
#include "pipe/ship.h"
#include "pipe/wire.h"

static_assert(CV_NODE_BATCH_MAX == CV_PROTO_MAX_BATCH, "node.h states the protocol's batch limit");

/* HELLO's hashes are model/fingerprint.h's, of model/llama.h's span tensors. */
static_assert(CV_PROTO_HASH_BYTES == CV_HASH_BYTES, "HELLO hash size");
static_assert(CV_PROTO_HASHES_PER_LAYER == CV_LLAMA_LAYER_TENSORS_MAX && CV_PROTO_HASHES_EXTRA == CV_LLAMA_SPAN_EXTRA_MAX,
              "HELLO hash count bound");

enum { SRC_HEAD = 0, SRC_PREV = 1 };

/* The most a connection may take to prove itself at the gate: a real head
 * needs one round trip, and a pending stranger holds a slot meanwhile. */
#define GATE_DEADLINE_MS 5000
/* node.h's takeover: how long a head may be silent before a proven head
 * that waits takes the stage, and how often a busy node looks at its gate. */
#define TAKEOVER_MS 1000
#define GATE_POLL_MS 20
/* A chain's head sends one query per connection: a few more are slack, an
 * endless stream of them is a peer holding the node. */
#define HANDSHAKE_QUERIES_MAX 4
/* Proven connections parked while a head holds the node, and how long one
 * may take to send its first frame (a real peer sends it with its proof). */
#define PARKED_MAX 4
#define FIRST_FRAME_MS 2000
/* A .part not written for PART_KEEP_S was left: a head whose transfer was
 * cut comes back within seconds (its chain reopens), so half an hour
 * keeps every resume worth having, while transfers left by peers that
 * invent models (each claim fits the free disk, ship.h) go. The cache is
 * swept at start and whenever a transfer is left unfinished. */
#define PART_KEEP_S (30 * 60)
#define HEX4 "[0-9a-f][0-9a-f][0-9a-f][0-9a-f]"
#define PART_PATTERN HEX4 HEX4 HEX4 HEX4 ".layers-[0-9]*-[0-9]*.gguf.part"
/* Connecting to the next node (TCP, key handshake, HELLO) takes three
 * round trips to a node that waits for it: a silent address must not hold
 * this one for the handshake timeout. */
#define NEXT_NODE_MS 1000

/* node.h's rate of HELLOs per source address: a bucket of HELLO_BURST
 * that refills HELLO_PER_S a second. A head sends two per stage as its
 * chain opens (a query, an assignment), and heads of one host may share
 * its address: the bucket holds 16 openings at once and 8 a second after,
 * while a peer that reconnects to ask again and again (a thousand times a
 * second on loopback) gets ERROR RATE, which costs no probe and no plan. */
#define HELLO_BURST 32
#define HELLO_PER_S 16
#define RATE_ADDRS 64
#define RATE_KEY_BYTES 9 /* the family (4 or 6), then 4 or 8 bytes of the address */

typedef struct rate_slot {
    uint8_t key[RATE_KEY_BYTES];
    double tokens;
    int64_t t_ms; /* when tokens was counted; 0: a free slot */
    bool logged;  /* its refusals since it ran dry were logged once */
} rate_slot;

/* A proven connection that arrived while a head held the node. */
typedef struct parked {
    cv_link *link;  /* NULL: a free slot */
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
    rate_slot rate[RATE_ADDRS]; /* heads' HELLOs by address, across sessions */
    bool hushed;                /* the handshake's failure is one of a flood's, logged before */
    uint32_t speed_us;          /* the last speed probe (cv_span_speed_probe), 0: none yet */
    int64_t speed_ms;           /* when it ran */

    /* session */
    cv_msg_hello hello;
    uint8_t *hashes_asked; /* a receiving node's copy of the assignment's tensor hashes (hello.hashes) */
    cv_span span;
    bool span_open;
    uint64_t range_bytes; /* what the assignment takes here, as counted (plan.h) */
    cv_link *head, *prev, *next;
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

/* Sends ERROR code msg on l; when the link cannot carry it, quiet says
 * the peer may have left (its link failed): nothing is logged then. */
static int send_error_q(cv_link *l, uint32_t id, uint32_t code, const char *msg, bool quiet)
{
    uint8_t buf[CV_PROTO_ERRMSG_MAX + 16];
    size_t len;
    char err[CV_ERRLEN];
    if (cv_msg_error_encode(code, msg, buf, sizeof buf, &len, err, sizeof err) ||
        cv_link_send(l, CV_MSG_ERROR, id, buf, len, err, sizeof err)) {
        if (!quiet)
            fprintf(stderr, "convoy stage: could not report an error to %s: %s\n", cv_link_name(l), err);
        return -1;
    }
    return 0;
}

static int send_error(cv_link *l, uint32_t id, uint32_t code, const char *msg)
{
    return send_error_q(l, id, code, msg, false);
}

static void session_free_buffers(node *n)
{
    cv_free(n->tok);
    cv_free(n->pos);
    cv_free(n->seq);
    cv_free(n->want);
    cv_free_aligned(n->in_f32);
    for (int i = 0; i < 2; i++)
        cv_fwd_out_free(&n->out[i]);
    cv_free(n->out_tokens);
    cv_free(n->rows);
    cv_free(n->top);
    cv_free(n->n_probs);
    cv_free_aligned(n->res_buf);
    cv_free(n->hashes_asked);
}

/* How the session holds a mixture of experts' experts, for the log: ",
 * every expert in memory (128 slots of 14 KB)" or ", experts paged: 24
 * slots of 14 KB for 128"; nothing for a dense model. */
static void describe_experts(const node *n, char *buf, size_t len)
{
    buf[0] = 0;
    if (!n->span.experts)
        return;
    const int32_t slots = cv_experts_n_slot(n->span.experts);
    const int32_t all = cv_experts_all_slots(&n->span.model, (int32_t)n->hello.l0, (int32_t)n->hello.l1);
    const unsigned long long kb = (cv_llama_expert_slot_bytes(&n->meta) + 1023) >> 10;
    if (slots >= all)
        snprintf(buf, len, ", every expert in memory (%d slots of %llu KB)", slots, kb);
    else
        snprintf(buf, len, ", experts paged: %d slots of %llu KB for %d", slots, kb, all);
}

/* What a session did, for the log: its share of the time in compute, and
 * how often a mixture of experts read its experts from the file. */
static void report_session(const node *n)
{
    if (!n->served_ms)
        return;
    const double wall = (cv_now_ms() - n->served_ms) / 1e3, compute = n->stats.compute_ns / 1e9;
    char experts[128] = "";
    if (n->span.experts) {
        cv_experts_counts c;
        cv_experts_get_counts(n->span.experts, &c);
        snprintf(experts, sizeof experts, "; experts: %llu read from the file, %llu evicted, %llu uses from memory",
                 (unsigned long long)c.reads, (unsigned long long)c.evicted, (unsigned long long)c.hits);
    }
    fprintf(stderr, "convoy stage: layers [%u, %u): %llu steps, %llu tokens, %.3f s of compute in %.3f s (%.0f%%)%s\n",
            n->hello.l0, n->hello.l1, (unsigned long long)n->stats.steps, (unsigned long long)n->stats.tokens,
            compute, wall, wall > 0 ? 100.0 * compute / wall : 0.0, experts);
}

static void session_end(node *n)
{
    report_session(n);
    if (n->next) {
        char err[CV_ERRLEN];
        cv_link_send(n->next, CV_MSG_BYE, 0, NULL, 0, err, sizeof err);
    }
    if (n->has_first)
        cv_link_release(n->head, &n->first);
    cv_link_close(n->prev);
    cv_link_close(n->next);
    cv_link_close(n->head);
    n->prev = n->next = n->head = NULL;
    if (n->span_open)
        cv_span_close(&n->span);
    n->span_open = false;
    session_free_buffers(n);
    node keep = *n;
    memset(n, 0, sizeof *n);
    n->o = keep.o;
    memcpy(n->model_path, keep.model_path, sizeof n->model_path);
    n->has_model = keep.has_model;
    n->meta = keep.meta;
    n->hashes = keep.hashes;
    n->gate = keep.gate;
    memcpy(n->park, keep.park, sizeof n->park);
    n->key = keep.key;
    n->budget = keep.budget;
    n->process_bytes = keep.process_bytes;
    memcpy(n->rate, keep.rate, sizeof n->rate);
    n->speed_us = keep.speed_us;
    n->speed_ms = keep.speed_ms;
}

static bool has_head(const node *n) { return n->hello.l1 == n->hello.n_layer; }

static cv_plan_session session_of(const cv_msg_hello *h)
{
    return (cv_plan_session){.n_ctx = (int32_t)h->n_ctx, .n_slot = (int32_t)h->n_slot,
                             .n_batch = (int32_t)h->n_batch_max, .kv_f16 = (h->features & CV_FEAT_KV_F16) != 0,
                             .act_type = h->act_type};
}

/* What this node holds for the session asked besides its layers (plan.h):
 * the answer to a query, and part of the count an assignment is checked by. */
static uint64_t own_bytes(const node *n)
{
    const cv_plan_session s = session_of(&n->hello);
    if (n->o->cache_dir) /* counted as the head counted it (plan.h) */
        return cv_plan_received_bytes(&n->meta, &s, n->o->n_threads, n->process_bytes, false);
    return cv_plan_own_bytes(&n->meta, &s, CV_PLAN_NODE, n->o->n_threads, n->process_bytes);
}

/* The receive cap of a handshake: a HELLO of the model's layers (the
 * head's count of them until a receiving node has a model). */
static uint32_t hello_cap(const node *n)
{
    return cv_plan_hello_cap(n->has_model ? n->meta.hp.n_layer : (int32_t)n->hello.n_layer);
}

/* Refuses, before anything is sized by them, a HELLO's sizes beyond the
 * protocol's limits or a batch whose FORWARD would not fit a frame
 * (TOO_LARGE), and an activation type this node does not take. */
static int check_sizes(const node *n, uint32_t *code, char *err, size_t errlen)
{
    const cv_msg_hello *h = &n->hello;
    *code = CV_PERR_ACT_TYPE;
    if (h->act_type != CV_ACT_F32 && (h->act_type >= CV_ACT_COUNT || !(h->features & CV_FEAT_LOSSY_ACT)))
        return cv_errf(err, errlen, "activation type %u is not supported", h->act_type);
    *code = CV_PERR_TOO_LARGE;
    if (h->n_slot > CV_PROTO_MAX_SLOT)
        return cv_errf(err, errlen, "n_slot %u exceeds the limit of %d", h->n_slot, CV_PROTO_MAX_SLOT);
    if (h->n_ctx < 1 || h->n_ctx > CV_PROTO_MAX_CTX)
        return cv_errf(err, errlen, "n_ctx %u is outside [1, %d]", h->n_ctx, CV_PROTO_MAX_CTX);
    if (h->n_batch_max > CV_PROTO_MAX_BATCH)
        return cv_errf(err, errlen, "n_batch_max %u exceeds the limit of %d", h->n_batch_max, CV_PROTO_MAX_BATCH);
    const uint32_t rows = n->o->n_batch_max > 0 ? (uint32_t)n->o->n_batch_max : CV_NODE_BATCH_DEFAULT;
    if (h->n_batch_max > rows) /* a FORWARD's compute is the stage's to bound (node.h) */
        return cv_errf(err, errlen, "n_batch_max %u exceeds this stage's limit of %u rows a FORWARD: give the head "
                                    "a smaller --batch",
                       h->n_batch_max, rows);
    const cv_plan_session s = session_of(h);
    const uint64_t fwd = cv_plan_forward_cap(&s, (int32_t)h->n_embd); /* assign() checks n_embd */
    if (fwd > CV_PROTO_DEFAULT_MAX_PAYLOAD)
        return cv_errf(err, errlen, "n_batch_max %u exceeds the frame cap: a FORWARD of %u rows of width %u (%s) "
                                    "takes %llu bytes, at most %u",
                       h->n_batch_max, h->n_batch_max, h->n_embd, cv_act_type_name(h->act_type),
                       (unsigned long long)fwd, CV_PROTO_DEFAULT_MAX_PAYLOAD);
    return 0;
}

/* Counts what layers [l0, l1) take here as the planner counted them from
 * this node's answer (plan.h), into *bytes, and the expert cache's slots
 * within them; refuses over the budget. */
static int check_budget(const node *n, uint32_t *code, uint64_t *bytes, int32_t *expert_slots, char *err,
                        size_t errlen)
{
    const cv_msg_hello *h = &n->hello;
    *code = CV_PERR_INTERNAL;
    uint64_t *layer_bytes = cv_malloc(sizeof(uint64_t) * (size_t)n->meta.hp.n_layer);
    if (!layer_bytes)
        return cv_errf(err, errlen, "out of memory");
    const cv_plan_session s = session_of(h);
    cv_plan_model pm;
    cv_plan_model_of(&n->meta, &s, layer_bytes, &pm);
    const cv_plan_node self = {.mem_budget = n->budget, .own_bytes = own_bytes(n)};
    *bytes = cv_plan_range_bytes(&pm, &self, (int32_t)h->l0, (int32_t)h->l1);
    *expert_slots = cv_plan_expert_slots(&pm, &self, (int32_t)h->l0, (int32_t)h->l1);
    cv_free(layer_bytes);
    *code = CV_PERR_NO_MEMORY;
    if (n->budget && *bytes > n->budget)
        return cv_errf(err, errlen, "layers [%u, %u) with %u slots of %u positions need %.2f GB, the budget is %.2f GB",
                       h->l0, h->l1, h->n_slot, h->n_ctx, *bytes / 1e9, n->budget / 1e9);
    return 0;
}

/* Checks an assignment against this node's model and budget, binds the
 * layers and allocates the session's buffers (plan.c's node_bytes and
 * result_bytes count them: keep them in step). On failure the message is
 * for the head and *code says which ERROR. */
static int assign(node *n, uint32_t *code, uint64_t *bytes, char *err, size_t errlen)
{
    const cv_msg_hello *h = &n->hello;
    const cv_llama_hparams *hp = &n->meta.hp;
    *code = CV_PERR_BAD_RANGE;
    if (h->n_layer != (uint32_t)hp->n_layer || h->n_embd != (uint32_t)hp->n_embd || h->l0 >= h->l1)
        return cv_errf(err, errlen, "the head's model has %u layers of width %u and asks for layers [%u, %u); this "
                                    "node's has %d of width %d",
                       h->n_layer, h->n_embd, h->l0, h->l1, hp->n_layer, hp->n_embd);
    if (h->l0 < (uint32_t)n->meta.held_l0 || h->l1 > (uint32_t)n->meta.held_l1)
        return cv_errf(err, errlen, "this node's model file is a shard of layers [%d, %d): it cannot serve layers "
                                    "[%u, %u)",
                       n->meta.held_l0, n->meta.held_l1, h->l0, h->l1);
    int32_t expert_slots = 0;
    if (check_budget(n, code, bytes, &expert_slots, err, errlen))
        return -1;
    n->range_bytes = *bytes;
    const cv_span_params p = {.l0 = (int32_t)h->l0, .l1 = (int32_t)h->l1, .n_threads = n->o->n_threads,
                               .n_ctx = (int32_t)h->n_ctx, .n_slot = (int32_t)h->n_slot,
                               .n_batch = (int32_t)h->n_batch_max, .kv_f16 = (h->features & CV_FEAT_KV_F16) != 0,
                               .from_hidden = true, .mlock = n->o->mlock, .expert_slots = expert_slots,
                               .pooling = (int32_t)((h->features & CV_FEAT_POOLING_MASK) >> CV_FEAT_POOLING_SHIFT)};
    const cv_plan_session s = session_of(h);
    n->data_cap = (uint32_t)cv_plan_forward_cap(&s, hp->n_embd);
    *code = CV_PERR_INTERNAL;
    if (cv_span_open(&n->span, n->model_path, &p, err, errlen))
        return -1;
    n->span_open = true;
    const size_t nb = h->n_batch_max, ne = (size_t)hp->n_embd;
    n->tok = cv_malloc(sizeof(int32_t) * nb);
    n->pos = cv_malloc(sizeof(int32_t) * nb);
    n->seq = cv_malloc(sizeof(int32_t) * nb);
    n->want = cv_malloc(nb);
    n->in_f32 = cv_aligned_alloc(sizeof(float) * nb * ne);
    bool ok = n->tok && n->pos && n->seq && n->want && n->in_f32;
    if (has_head(n)) {
        n->out_tokens = cv_malloc(sizeof(int32_t) * nb);
        n->rows = cv_calloc(nb, sizeof *n->rows);
        n->top = cv_malloc(sizeof(cv_top_entry) * nb * CV_PROTO_MAX_TOP);
        n->n_probs = cv_calloc(h->n_slot, sizeof *n->n_probs);
        n->res_cap = 16 + sizeof(uint32_t) * CV_TRAIL_MAX + nb * (16 + sizeof(cv_top_entry) * CV_PROTO_MAX_TOP) +
                     nb * ne * sizeof(float); /* a row's embedding, when it is one, has no pairs */
        n->res_buf = cv_aligned_alloc(n->res_cap);
        ok = ok && n->out_tokens && n->rows && n->top && n->n_probs && n->res_buf;
    }
    if (!ok)
        return cv_errf(err, errlen, "out of memory for buffers of %u tokens", h->n_batch_max);
    if (has_head(n) && cv_link_reserve(n->head, n->res_cap, err, errlen))
        return -1;
    for (int i = 0; i < 2 && !has_head(n); i++)
        if (cv_fwd_out_alloc(&n->out[i], nb, ne, err, errlen))
            return -1;
    return 0;
}

/* Answers a HELLO with HELLO_OK: this node's budget, with its speed and
 * own bytes for the session asked (a query) or the bytes of the layers
 * asked (an assignment), and the receive cap it applies. */
static int answer_hello(node *n, cv_link *l, uint32_t id, uint32_t us_per_layer_token, uint64_t layer_bytes,
                        char *err, size_t errlen)
{
    cv_msg_hello_ok ok = {.proto_version = CV_PROTO_VERSION, .us_per_layer_token = us_per_layer_token,
                          .mem_budget = n->budget, .layer_bytes = layer_bytes,
                          .max_payload = n->span_open ? n->data_cap : hello_cap(n),
                          .held_l0 = (uint32_t)n->meta.held_l0, .held_l1 = (uint32_t)n->meta.held_l1,
                          .n_threads = (uint32_t)n->o->n_threads};
    if (n->o->cache_dir) /* any layers of the head's model */
        ok = (cv_msg_hello_ok){.proto_version = CV_PROTO_VERSION, .mem_budget = n->budget, .layer_bytes = layer_bytes,
                               .max_payload = ok.max_payload, .held_l0 = 0, .held_l1 = n->hello.n_layer,
                               .flags = CV_HOK_RECEIVES, .n_threads = ok.n_threads};
    uint8_t buf[CV_MSG_HELLO_OK_SIZE];
    size_t len;
    return cv_msg_hello_ok_encode(&ok, buf, sizeof buf, &len, err, errlen) ||
                   cv_link_send(l, CV_MSG_HELLO_OK, id, buf, len, err, errlen)
               ? -1
               : 0;
}

/* The options of every link of a session: keyed when the node is. */
static cv_link_opts link_opts(const node *n)
{
    cv_link_opts lo = cv_link_io_opts(n->o->io_timeout_ms);
    lo.key = n->key;
    return lo;
}

/* Closes a parked connection; with why, it is told (ERROR code) and the
 * refusal logged. */
static void unpark(parked *p, uint32_t code, const char *why)
{
    if (why) {
        fprintf(stderr, "convoy stage: refused %s: %s\n", cv_link_name(p->link), why);
        send_error(p->link, p->has_first ? p->first.h.id : 0, code, why);
    }
    if (p->has_first)
        cv_link_release(p->link, &p->first);
    cv_link_close(p->link);
    *p = (parked){0};
}

/* Parks the next proven connection of the gate, waiting up to wait_ms for
 * one when a slot is free (else just waits: parked ones leave within
 * FIRST_FRAME_MS or TAKEOVER_MS), and reads the first frame of those that
 * have sent it. Never waits on a parked peer. */
static void park_poll(node *n, int wait_ms)
{
    int free_slot = -1;
    for (int i = PARKED_MAX - 1; i >= 0; i--)
        free_slot = n->park[i].link ? free_slot : i;
    char err[CV_ERRLEN];
    cv_link *l = NULL;
    const cv_link_opts lo = link_opts(n);
    if (free_slot < 0) {
        const struct timespec ts = {.tv_nsec = (long)wait_ms * 1000000L};
        nanosleep(&ts, NULL);
    } else if (cv_gate_next(n->gate, wait_ms, &lo, &l, err, sizeof err) == 0) {
        cv_link_set_max_payload(l, hello_cap(n)); /* a HELLO at most, as handshake() */
        n->park[free_slot] = (parked){.link = l, .since = cv_now_ms()};
    }
    for (int i = 0; i < PARKED_MAX; i++) {
        parked *p = &n->park[i];
        if (!p->link || p->has_first)
            continue;
        const int rc = cv_link_recv(p->link, 0, &p->first, err, sizeof err);
        if (rc == 0)
            p->has_first = true;
        else if (rc < 0 || cv_now_ms() - p->since > FIRST_FRAME_MS)
            unpark(p, rc < 0 ? CV_PERR_BAD_FRAME : CV_PERR_TIMEOUT, rc < 0 ? err : "no HELLO after the key handshake");
    }
}

/* Whether parked p's first frame is a HELLO of role `role`, into *h. */
static bool parked_hello(const parked *p, uint8_t role, cv_msg_hello *h)
{
    char why[CV_ERRLEN];
    return p->has_first && p->first.h.type == CV_MSG_HELLO &&
           cv_msg_hello_decode(p->first.payload, p->first.h.payload_len, h, why, sizeof why) == 0 && h->role == role;
}

/* Whether h is the previous node of this node's chain. */
static bool is_prev(const node *n, const cv_msg_hello *h)
{
    return h->role == CV_ROLE_PREV_NODE && h->cluster_id == n->hello.cluster_id &&
           !memcmp(h->model_hash, n->hashes.meta, CV_HASH_BYTES);
}

/* Sorts the parked connections that spoke: a head's HELLO waits (node.h's
 * takeover), this chain's previous node is returned when want_prev (its
 * slot freed, its HELLO read), anything else is refused. */
static cv_link *park_sort(node *n, bool want_prev)
{
    for (int i = 0; i < PARKED_MAX; i++) {
        parked *p = &n->park[i];
        cv_msg_hello h;
        if (!p->has_first || parked_hello(p, CV_ROLE_HEAD, &h))
            continue;
        if (!parked_hello(p, CV_ROLE_PREV_NODE, &h))
            unpark(p, CV_PERR_BAD_STATE, "expected HELLO");
        else if (!want_prev || !is_prev(n, &h))
            unpark(p, CV_PERR_CLUSTER, "not the previous node of the chain this node serves");
        else {
            cv_link *l = p->link;
            cv_link_release(l, &p->first);
            *p = (parked){0};
            return l;
        }
    }
    return NULL;
}

/* The oldest parked head (its HELLO read), or NULL. */
static parked *contender(node *n)
{
    parked *c = NULL;
    cv_msg_hello h;
    for (int i = 0; i < PARKED_MAX; i++)
        if (parked_hello(&n->park[i], CV_ROLE_HEAD, &h) && (!c || n->park[i].since < c->since))
            c = &n->park[i];
    return c;
}

/* node.h's takeover rule: a parked head takes the node once the session's
 * head has been silent for TAKEOVER_MS (true: the session must end, see
 * yield_node); one parked before the head last spoke is refused. */
static bool takeover_due(node *n)
{
    parked *c = contender(n);
    if (!c || cv_now_ms() - n->heard >= TAKEOVER_MS)
        return c != NULL;
    if (n->heard > c->since)
        unpark(c, CV_PERR_BAD_STATE, "this node serves another head, which is active");
    return false;
}

/* Ends the session for a parked head (takeover_due): the head is told why. */
static int yield_node(node *n, char *err, size_t errlen)
{
    cv_errf(err, errlen, "%s was silent for %lld ms and %s asks for this node: the session ends",
            cv_link_name(n->head), (long long)(cv_now_ms() - n->heard), cv_link_name(contender(n)->link));
    send_error(n->head, 0, CV_PERR_TIMEOUT, err);
    return -1;
}

/* Makes the oldest parked connection (a head that took over, or any, when
 * none is a head) the head of the next session; false when none is parked. */
static bool unpark_head(node *n)
{
    parked *p = contender(n);
    if (!p)
        for (int i = 0; i < PARKED_MAX; i++)
            if (n->park[i].link && (!p || n->park[i].since < p->since))
                p = &n->park[i];
    if (!p)
        return false;
    n->head = p->link;
    n->first = p->first;
    n->has_first = p->has_first;
    *p = (parked){0};
    return true;
}

/* node.h's rule for a plaintext stage's next address: a head that is not
 * on this machine may not name one that reaches its loopback (a peer from
 * elsewhere would reach this machine's private ports through it); a head
 * on this machine reaches them itself. Checked on the name before any
 * connection, and with next, on the address connected to (a name that
 * resolved otherwise the second time): refused, next is closed. */
static int next_unsafe(node *n, const char *host, cv_link *next, char *err, size_t errlen)
{
    if (n->key || cv_link_peer_is_loopback(n->head) ||
        !(next ? cv_link_peer_is_loopback(next) : cv_host_reaches_loopback(host)))
        return 0;
    if (next) {
        cv_link_close(next);
        n->next = NULL;
    }
    return cv_errf(err, errlen, "the next node %s is on this machine's loopback, and the head is not on this "
                                "machine: a stage without --key connects there only for a head on this machine",
                   n->hello.next_addr);
}

/* Opens the link to the next node and introduces this node to it. */
static int connect_next(node *n, char *err, size_t errlen)
{
    char host[256];
    int port;
    const cv_link_opts lo = link_opts(n);
    if (cv_parse_addr(n->hello.next_addr, host, sizeof host, &port, err, errlen))
        return -1;
    if (!n->key && !n->o->insecure && !cv_host_is_loopback(host))
        return cv_errf(err, errlen, "the next node %s is not on this machine and this stage has no --key: give every "
                                    "stage and the head --key FILE, or --insecure",
                       n->hello.next_addr);
    if (next_unsafe(n, host, NULL, err, errlen))
        return -1;
    const int64_t t0 = cv_now_ms();
    const int limit = n->o->handshake_timeout_ms < NEXT_NODE_MS ? n->o->handshake_timeout_ms : NEXT_NODE_MS;
    if (cv_link_connect(host, port, limit, &lo, &n->next, err, errlen) || next_unsafe(n, host, n->next, err, errlen))
        return -1;
    cv_msg_hello h = n->hello;
    h.role = CV_ROLE_PREV_NODE;
    h.next_addr[0] = 0;
    h.hashes = NULL; /* an assignment's: a receiving node keeps them (keep_hashes) */
    h.n_hashes = 0;
    h.features &= ~(uint32_t)CV_FEAT_FROM_PREV;
    cv_msg_hello_ok ok;
    const int64_t left = limit - (cv_now_ms() - t0);
    return cv_hello_ask(n->next, &h, left > 0 ? (int)left : 1, &ok, err, errlen) ||
                   cv_link_reserve(n->next, n->data_cap, err, errlen)
               ? -1
               : 0;
}

/* The previous node connects after the handshake with the head (it is
 * parked like any proven connection, see park_sort), within the
 * handshake's timeout, unless a parked head takes the node meanwhile. */
static int accept_prev(node *n, char *err, size_t errlen)
{
    const int64_t deadline = cv_now_ms() + n->o->handshake_timeout_ms;
    while (cv_now_ms() < deadline) {
        park_poll(n, GATE_POLL_MS);
        if ((n->prev = park_sort(n, true)) != NULL) {
            n->heard = cv_now_ms();
            return answer_hello(n, n->prev, 0, 0, 0, err, errlen);
        }
        if (takeover_due(n))
            return yield_node(n, err, errlen);
    }
    cv_errf(err, errlen, "the previous node did not connect within %d ms", n->o->handshake_timeout_ms);
    send_error(n->head, 0, CV_PERR_BAD_STATE, err);
    return -1;
}

/* The head's next handshake frame: the one it came parked with, else the
 * next within the handshake's timeout, unless a parked head takes the node
 * meanwhile (node.h). On failure *code is the ERROR the head is owed: a
 * frame its link refused (BAD_FRAME: header, checksum, size) or silence
 * (TIMEOUT); 0 when it has been told (a takeover). */
static int head_frame(node *n, cv_frame *f, uint32_t *code, char *err, size_t errlen)
{
    *code = 0;
    if (n->has_first) {
        *f = n->first;
        n->has_first = false;
        return 0;
    }
    const int64_t deadline = cv_now_ms() + n->o->handshake_timeout_ms;
    for (int64_t left; (left = deadline - cv_now_ms()) > 0;) {
        park_poll(n, 0);
        park_sort(n, false);
        if (takeover_due(n))
            return yield_node(n, err, errlen);
        const int rc = cv_link_recv(n->head, left < GATE_POLL_MS ? (int)left : GATE_POLL_MS, f, err, errlen);
        if (rc != CV_LINK_TIMEOUT) {
            *code = rc ? CV_PERR_BAD_FRAME : 0;
            return rc;
        }
    }
    *code = CV_PERR_TIMEOUT;
    return cv_errf(err, errlen, "%s: no handshake within %d ms", cv_link_name(n->head), n->o->handshake_timeout_ms);
}

/* Compares the head's model (n->hello) with this node's: the metadata
 * hash, then, for an assignment, the hashes of the tensors its layers will
 * read, in order. The message goes to the head: it names the first tensor
 * that differs, never this node's path or hashes. */
static int check_model(const node *n, char *err, size_t errlen)
{
    const cv_msg_hello *h = &n->hello;
    if (memcmp(h->model_hash, n->hashes.meta, CV_HASH_BYTES))
        return cv_errf(err, errlen, "model fingerprint differs: the head's model is not this node's (tokenizer, "
                                    "hyperparameters or tensor directory)");
    if (h->l0 >= h->l1 || h->l1 > (uint32_t)n->meta.hp.n_layer || h->l0 < (uint32_t)n->meta.held_l0 ||
        h->l1 > (uint32_t)n->meta.held_l1) /* a query; a range assign() refuses */
        return 0;
    uint64_t *idx = cv_malloc(sizeof *idx * cv_llama_span_tensors_max(h->l1 - h->l0));
    if (!idx)
        return cv_errf(err, errlen, "out of memory");
    const size_t k = cv_llama_span_tensors(&n->meta, (int32_t)h->l0, (int32_t)h->l1, idx);
    int rc = k == h->n_hashes ? 0
                              : cv_errf(err, errlen, "the head sent %u tensor hashes for layers [%u, %u), this node "
                                                     "reads %zu tensors there",
                                        h->n_hashes, h->l0, h->l1, k);
    for (size_t i = 0; i < k && rc == 0; i++)
        if (memcmp(h->hashes + i * CV_HASH_BYTES, n->hashes.tensor[idx[i]], CV_HASH_BYTES)) {
            const gguf_str name = n->meta.gguf.tensors[idx[i]].name;
            rc = cv_errf(err, errlen, "tensor %.*s differs from the head's (different weights)", (int)name.len,
                         name.ptr);
        }
    cv_free(idx);
    return rc;
}

/* Once assigned, a link's receive cap is the largest frame the session
 * carries on it (proto.h): FORWARDs on the one they arrive by, control
 * frames on the head's when they come from the previous node; so no peer
 * makes this node hold a larger buffer than its budget counts. */
static void limit_links(node *n)
{
    cv_link_set_max_payload(n->prev ? n->prev : n->head, n->data_cap);
    if (n->prev)
        cv_link_set_max_payload(n->head, CV_PROTO_MIN_MAX_PAYLOAD);
}

/* A receiving node keeps the assignment's tensor hashes (in the frame
 * until then) for the layers it gets. */
static int keep_hashes(node *n, char *err, size_t errlen)
{
    cv_free(n->hashes_asked);
    n->hashes_asked = cv_malloc((size_t)n->hello.n_hashes * CV_HASH_BYTES + 1);
    if (!n->hashes_asked)
        return cv_errf(err, errlen, "out of memory");
    if (n->hello.n_hashes) /* a query has none (and no pointer) */
        memcpy(n->hashes_asked, n->hello.hashes, (size_t)n->hello.n_hashes * CV_HASH_BYTES);
    n->hello.hashes = n->hashes_asked;
    return 0;
}

/* Reads the head's next HELLO into n->hello: one of a head, of this
 * node's model. 0, or -1 (the head has been told why when it can be). */
static int next_hello(node *n, uint32_t *id, char *err, size_t errlen)
{
    cv_frame f;
    uint32_t failed;
    if (head_frame(n, &f, &failed, err, errlen)) {
        if (failed) /* a head that left hears nothing: no complaint */
            send_error_q(n->head, 0, failed, err, true);
        return -1;
    }
    if (f.h.type == CV_MSG_BYE) {
        cv_link_release(n->head, &f);
        return cv_errf(err, errlen, "%s said BYE during the handshake", cv_link_name(n->head));
    }
    uint32_t code = CV_PERR_BAD_STATE;
    int rc = f.h.type == CV_MSG_HELLO ? cv_msg_hello_decode(f.payload, f.h.payload_len, &n->hello, err, errlen)
                                      : cv_errf(err, errlen, "expected HELLO, got %s", cv_msg_type_name(f.h.type));
    *id = f.h.id;
    if (rc && f.h.type == CV_MSG_HELLO)
        code = CV_PERR_BAD_FRAME;
    if (rc == 0 && n->hello.role != CV_ROLE_HEAD)
        rc = cv_errf(err, errlen, "a previous node connected, but no head has set up a chain here");
    if (rc == 0 && n->o->cache_dir)
        rc = keep_hashes(n, err, errlen); /* checked once the layers are here */
    else if (rc == 0 && (rc = check_model(n, err, errlen)) != 0)
        code = CV_PERR_FINGERPRINT;
    else if (rc && f.h.type == CV_MSG_HELLO && f.h.payload_len >= 2 && n->hello.proto_version != CV_PROTO_VERSION)
        code = CV_PERR_VERSION; /* the decoder read the version, and stopped there */
    cv_link_release(n->head, &f);
    if (!n->hashes_asked) { /* they were in the frame */
        n->hello.hashes = NULL;
        n->hello.n_hashes = 0;
    }
    if (rc)
        send_error(n->head, *id, code, err);
    return rc ? -1 : 0;
}

/* ---- a receiving node's layers (ship.h) ---- */

static void unload_model(node *n)
{
    if (n->has_model) {
        cv_model_hashes_free(&n->hashes);
        cv_llama_free(&n->meta);
    }
    n->has_model = false;
}

/* Makes the file at path this node's model: its metadata and the content
 * hashes of its tensors (from the cache beside it when they match). */
static int load_model(node *n, const char *path, char *err, size_t errlen)
{
    unload_model(n);
    bool cached;
    char note[CV_ERRLEN * 2];
    if (cv_llama_load(&n->meta, path, 0, 0, err, errlen))
        return -1;
    if (cv_model_hashes_load(&n->meta.gguf, path, n->o->n_threads, &n->hashes, &cached, note, sizeof note, err,
                             errlen)) {
        cv_llama_free(&n->meta);
        return -1;
    }
    fprintf(stderr, "convoy stage: %s\n", note);
    snprintf(n->model_path, sizeof n->model_path, "%s", path);
    n->has_model = true;
    return 0;
}

/* Loads the shard at path and checks it against the assignment; a file
 * that fails is removed (with its hashes' cache). */
static int take_shard(node *n, const char *path, char *err, size_t errlen)
{
    if (load_model(n, path, err, errlen) == 0 && check_model(n, err, errlen) == 0)
        return 0;
    char hashes[sizeof n->model_path + 16];
    snprintf(hashes, sizeof hashes, "%s.convoy-hashes", path);
    unload_model(n);
    unlink(path);
    unlink(hashes);
    return -1;
}

static void note_receiving(void *user, const cv_ship_progress *p)
{
    const node *n = user;
    char line[256];
    cv_ship_describe(p, line, sizeof line);
    fprintf(stderr, "convoy stage: %s layers [%u, %u): %s\n", p->finished ? "received" : "receiving", n->hello.l0,
            n->hello.l1, line);
}

/* FETCH: asks the head for the shard from what rx's .part holds. */
static int ask_shard(node *n, uint32_t id, const cv_ship_rx *rx, char *err, size_t errlen)
{
    uint8_t buf[CV_MSG_FETCH_SIZE];
    size_t len;
    if (rx->have)
        fprintf(stderr, "convoy stage: resuming layers [%u, %u) after byte %llu of %s\n", n->hello.l0, n->hello.l1,
                (unsigned long long)rx->have, rx->part);
    const uint32_t cap = hello_cap(n);
    cv_link_set_max_payload(n->head, CV_SHIP_PAYLOAD_MAX > cap ? CV_SHIP_PAYLOAD_MAX : cap);
    return cv_msg_fetch_encode(rx->have, buf, sizeof buf, &len, err, errlen) ||
                   cv_link_send(n->head, CV_MSG_FETCH, id, buf, len, err, errlen)
               ? -1
               : 0;
}

/* Takes SHIP frames until the shard is complete, telling its progress;
 * on failure *code is the ERROR the head is owed (0: it was told). */
static int take_ships(node *n, cv_ship_rx *rx, uint32_t *code, char *err, size_t errlen)
{
    int64_t noted = cv_now_ms();
    for (bool done = false; !done;) {
        cv_frame f;
        if (head_frame(n, &f, code, err, errlen))
            return -1;
        const bool ship = f.h.type == CV_MSG_SHIP;
        const int rc = ship ? cv_ship_rx_take(rx, f.payload, f.h.payload_len, &done, err, errlen)
                            : cv_errf(err, errlen, "expected SHIP, got %s", cv_msg_type_name(f.h.type));
        *code = ship ? rx->code : CV_PERR_BAD_STATE;
        cv_link_release(n->head, &f);
        n->heard = cv_now_ms();
        if (rc)
            return -1;
        if (done || n->heard - noted >= 1000) {
            note_receiving(n, &rx->progress);
            noted = n->heard;
        }
    }
    return 0;
}

/* Removes the .part files of transfers left unfinished PART_KEEP_S ago. */
static void sweep_parts(const node *n) { cv_ship_sweep(n->o->cache_dir, PART_PATTERN, PART_KEEP_S); }

/* Receives the shard into path (*code: the ERROR owed on failure). The
 * stage's budget bounds the size it believes (ship.h); a transfer left
 * unfinished sweeps the cache of older ones. */
static int fetch_shard(node *n, uint32_t id, const char *path, uint32_t *code, char *err, size_t errlen)
{
    cv_ship_rx rx;
    *code = CV_PERR_INTERNAL;
    const int rc = cv_ship_rx_open(&rx, path, n->budget, err, errlen) || ask_shard(n, id, &rx, err, errlen) ||
                           take_ships(n, &rx, code, err, errlen)
                       ? -1
                       : 0;
    cv_ship_rx_close(&rx);
    cv_link_set_max_payload(n->head, hello_cap(n));
    if (rc)
        sweep_parts(n);
    return rc;
}

/* Where the shard of the assignment's layers of the head's model is kept:
 * DIR/HASH.layers-L0-L1.gguf (HASH: the model's metadata hash, 16 hex);
 * PART_PATTERN matches the .part files of such names. */
static void shard_path(const node *n, char *path, size_t len)
{
    char hex[17];
    cv_hash_hex8(n->hello.model_hash, hex);
    snprintf(path, len, "%s/%s.layers-%u-%u.gguf", n->o->cache_dir, hex, n->hello.l0, n->hello.l1);
}

/* A receiving node's layers: the shard it has when it checks, else from
 * the cache, else fetched from the head (resumed from a .part; a resumed
 * file that fails the check is fetched again, whole). */
static int receive_layers(node *n, uint32_t id, uint32_t *code, char *err, size_t errlen)
{
    char path[sizeof n->model_path], part[sizeof path + 8];
    shard_path(n, path, sizeof path);
    snprintf(part, sizeof part, "%s.part", path);
    *code = CV_PERR_FINGERPRINT;
    if (n->has_model && !strcmp(n->model_path, path) && check_model(n, err, errlen) == 0)
        return 0;
    bool present;
    *code = CV_PERR_INTERNAL;
    if (cv_ship_cache_file(path, &present, err, errlen)) /* named in the message, for the operator */
        return -1;
    if (present) {
        if (take_shard(n, path, err, errlen) == 0) {
            fprintf(stderr, "convoy stage: layers [%u, %u) from the cache: %s\n", n->hello.l0, n->hello.l1, path);
            return 0;
        }
        fprintf(stderr, "convoy stage: the cached layers do not check: %s; fetching them\n", err);
    }
    struct stat st;
    const bool resumed = lstat(part, &st) == 0 && st.st_size > 0;
    for (int attempt = 0; attempt < 1 + resumed; attempt++) {
        if (attempt > 0)
            unlink(part);
        if (fetch_shard(n, id, path, code, err, errlen))
            return -1;
        *code = CV_PERR_FINGERPRINT;
        if (take_shard(n, path, err, errlen) == 0)
            return 0;
        fprintf(stderr, "convoy stage: the layers received do not check: %s%s\n", err,
                attempt + 1 < 1 + resumed ? "; fetching them whole" : "");
    }
    return -1;
}

/* The peer's address as a rate key: IPv4 (an IPv4-mapped IPv6 address
 * too), or the /64 of IPv6, which one host holds whole. false: unknown. */
static bool rate_key(const cv_link *l, uint8_t key[RATE_KEY_BYTES])
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    memset(key, 0, RATE_KEY_BYTES);
    if (getpeername(cv_link_poll_fd(l), (struct sockaddr *)&ss, &sl))
        return false;
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
    if (ss.ss_family == AF_INET)
        memcpy(key + 1, &((const struct sockaddr_in *)&ss)->sin_addr, 4);
    else if (ss.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(a6))
        memcpy(key + 1, a6->s6_addr + 12, 4);
    else if (ss.ss_family == AF_INET6)
        memcpy(key + 1, a6->s6_addr, 8);
    else
        return false;
    key[0] = ss.ss_family == AF_INET || IN6_IS_ADDR_V4MAPPED(a6) ? 4 : 6;
    return true;
}

/* node.h's rate: takes one of the head's address's HELLOs from its bucket
 * (a new address, or one forgotten, starts full); refuses (RATE) when the
 * bucket is empty. The table forgets the address heard from longest ago. */
static int rate_refuses(node *n, uint32_t *code, char *err, size_t errlen)
{
    uint8_t key[RATE_KEY_BYTES];
    if (!rate_key(n->head, key))
        return 0;
    const int64_t now = cv_now_ms();
    rate_slot *s = NULL, *oldest = &n->rate[0];
    for (int i = 0; i < RATE_ADDRS && !s; i++) {
        if (!memcmp(n->rate[i].key, key, sizeof key))
            s = &n->rate[i];
        else if (n->rate[i].t_ms < oldest->t_ms)
            oldest = &n->rate[i];
    }
    if (!s) {
        s = oldest;
        *s = (rate_slot){.tokens = HELLO_BURST, .t_ms = now};
        memcpy(s->key, key, sizeof key);
    }
    s->tokens += (double)(now - s->t_ms) * HELLO_PER_S / 1000.0;
    s->tokens = s->tokens < HELLO_BURST ? s->tokens : HELLO_BURST;
    s->t_ms = now;
    if (s->tokens < 1) {
        *code = CV_PERR_RATE;
        n->hushed = s->logged; /* a flood is logged once each time it runs the bucket dry */
        s->logged = true;
        return cv_errf(err, errlen, "%s: its address sent over %d HELLOs, %d a second: refused until it sends fewer",
                       cv_link_name(n->head), HELLO_BURST, HELLO_PER_S);
    }
    s->tokens -= 1;
    s->logged = false;
    return 0;
}

/* This node's speed for a query: a probe takes 0.2 s, and a head asks
 * again at every chain it opens (restarts), so one probe answers for
 * SPEED_FRESH_MS, and for any time when the head says a speed from before
 * will do (CV_FEAT_ANY_SPEED: a failover). */
#define SPEED_FRESH_MS 10000

static uint32_t speed(node *n)
{
    const bool stale = cv_now_ms() - n->speed_ms > SPEED_FRESH_MS && !(n->hello.features & CV_FEAT_ANY_SPEED);
    if (!n->speed_us || stale) {
        n->speed_us = cv_span_speed_probe(&n->meta, n->o->n_threads);
        n->speed_ms = cv_now_ms();
    }
    return n->speed_us;
}

/* The head's handshake: a few queries, then one assignment. 0: the session
 * runs; -1: it ended (the head has been told why when it can be). Queries
 * are not heard (n->heard): a head that only asks is silent to a parked one. */
static int handshake(node *n, char *err, size_t errlen)
{
    /* no frame of a handshake is larger, so a stranger's cannot make this
     * node hold more than its budget counts */
    cv_link_set_max_payload(n->head, hello_cap(n));
    n->heard = cv_now_ms();
    for (int queries = 0;; queries++) {
        uint32_t id = 0, code = CV_PERR_BAD_STATE;
        if (next_hello(n, &id, err, errlen))
            return -1;
        const bool query = n->hello.l0 == n->hello.l1;
        uint32_t us_per_layer_token = 0;
        uint64_t layer_bytes = 0;
        if (rate_refuses(n, &code, err, errlen) ||
            (query && queries == HANDSHAKE_QUERIES_MAX &&
             cv_errf(err, errlen, "%d queries and no assignment: the handshake ends", queries)) ||
            check_sizes(n, &code, err, errlen) ||
            (!query && n->o->cache_dir && receive_layers(n, id, &code, err, errlen)) ||
            (!query && (assign(n, &code, &layer_bytes, err, errlen) ||
                        (n->hello.next_addr[0] && (code = CV_PERR_NEXT_NODE, connect_next(n, err, errlen)))))) {
            if (code) /* 0: the head was told (a takeover) */
                send_error(n->head, id, code, err);
            return -1;
        }
        if (query && n->o->cache_dir) /* the head counts the rest from its model */
            layer_bytes = n->process_bytes;
        else if (query) {
            us_per_layer_token = speed(n);
            layer_bytes = own_bytes(n);
        }
        if (answer_hello(n, n->head, id, us_per_layer_token, layer_bytes, err, errlen))
            return -1;
        if (query)
            continue;
        n->heard = cv_now_ms();
        if ((n->hello.features & CV_FEAT_FROM_PREV) && accept_prev(n, err, errlen))
            return -1;
        limit_links(n);
        n->served_ms = cv_now_ms();
        return 0;
    }
}

/* fw's trail with this stage's time us after it. */
static void add_to_trail(const cv_msg_forward *fw, uint64_t us, uint32_t *trail)
{
    memcpy(trail, fw->trail, sizeof(uint32_t) * fw->n_trail);
    trail[fw->n_trail] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

/* Moves output row `row`'s embedding to the k-th embedding's place (k <=
 * row: the embeddings close up in row order) and makes r an embedding row. */
static void keep_embedding(node *n, int32_t row, uint32_t k, cv_result_row *r)
{
    const size_t ne = (size_t)n->span.model.hp.n_embd;
    memmove(n->span.embd + k * ne, cv_span_embedding(&n->span, row), sizeof(float) * ne);
    r->kind = CV_ROW_EMBD;
    r->token = -1;
}

static int send_result(node *n, const cv_msg_forward *fw, uint64_t us, uint32_t id, char *err, size_t errlen)
{
    const int32_t n_vocab = n->span.model.hp.n_vocab;
    const bool with_logits = fw->flags & CV_FWD_WANT_LOGITS;
    uint32_t n_rows = 0, n_embd_rows = 0;
    for (uint32_t t = 0, row = 0; t < fw->n_tokens; t++) {
        if (!cv_want_output(n->want[t]))
            continue;
        const int32_t token = n->out_tokens[row++];
        const bool embd = cv_span_embedding(&n->span, (int32_t)row - 1) != NULL;
        if (token < 0 && !embd) /* after a rejected draft */
            continue;
        const float *logits = cv_span_logits(&n->span, (int32_t)row - 1);
        cv_result_row *r = &n->rows[n_rows];
        *r = (cv_result_row){.seq = n->seq[t], .pos = n->pos[t], .token = token};
        const uint32_t np = embd ? 0 : n->n_probs[n->seq[t]];
        if (embd)
            keep_embedding(n, (int32_t)row - 1, n_embd_rows++, r);
        if (np) { /* the sampled token's, then np - 1 alternatives */
            cv_top_entry *top = n->top + (size_t)n_rows * CV_PROTO_MAX_TOP;
            cv_logprobs_row(logits, n_vocab, token, (int32_t)np - 1, top);
            r->top = top;
            r->n_top = (uint16_t)np;
        }
        if (with_logits && row - 1 != n_rows) /* close the gaps of left-out rows */
            memmove((float *)cv_span_logits(&n->span, (int32_t)n_rows), logits, sizeof(float) * (size_t)n_vocab);
        n_rows++;
    }
    cv_msg_result m = {.n_rows = n_rows, .rows = n->rows, .n_trail = fw->n_trail + 1u};
    add_to_trail(fw, us, m.trail);
    if (with_logits) {
        m.flags = CV_RES_HAS_LOGITS;
        m.n_vocab = (uint32_t)n_vocab;
        m.logits = cv_span_logits(&n->span, 0);
    }
    if (n_embd_rows) {
        m.flags |= CV_RES_HAS_EMBD;
        m.n_embd = (uint32_t)n->span.model.hp.n_embd;
        m.embd = n->span.embd;
    }
    const uint64_t size = cv_msg_result_size(&m);
    if (size > n->res_cap) { /* only a result with full logits rows gets here */
        cv_free_aligned(n->res_buf);
        n->res_cap = size;
        if (!(n->res_buf = cv_aligned_alloc(size)))
            return cv_errf(err, errlen, "out of memory for a result of %llu bytes", (unsigned long long)size);
    }
    size_t len;
    if (cv_msg_result_encode(&m, n->res_buf, n->res_cap, &len, err, errlen))
        return -1;
    return cv_link_send(n->head, CV_MSG_RESULT, id, n->res_buf, len, err, errlen);
}

/* Sends this stage's hidden states on, from the buffers `cur`, with its
 * time us added to the trail. */
static int send_forward(node *n, const cv_msg_forward *in, uint64_t us, uint32_t id, char *err, size_t errlen)
{
    cv_msg_forward m = {.n_tokens = in->n_tokens, .n_embd = (uint32_t)n->span.model.hp.n_embd,
                        .act_type = n->hello.act_type, .flags = in->flags, .tokens = in->tokens,
                        .n_trail = (uint8_t)(in->n_trail + 1)};
    add_to_trail(in, us, m.trail);
    if (cv_fwd_out_send(&n->out[n->cur], n->next, id, &m, NULL, err, errlen))
        return -1;
    n->cur = 1 - n->cur;
    return 0;
}

/* Answers a frame that the session survives with ERROR: 0, or -1 when
 * the head cannot be told (the session ends). */
static int refuse(node *n, const cv_frame *f, uint32_t code, const char *why)
{
    return send_error(n->head, f->h.id, code, why);
}

/* Runs one FORWARD. Returns 0, or -1 when the session must end; a batch
 * the span refuses is answered with ERROR and the session goes on. */
/* Decodes a FORWARD into fw and checks it against what HELLO agreed: its
 * size first (no larger than n_batch_max rows of the agreed activation
 * type), then rows, activation type and width. 0, or the ERROR code with
 * the reason in why. */
static uint32_t check_forward(const node *n, const cv_frame *f, cv_msg_forward *fw, char *why, size_t whylen)
{
    const cv_msg_hello *h = &n->hello;
    const int32_t n_embd = n->span.model.hp.n_embd;
    if (f->h.payload_len > n->data_cap)
        return cv_errf(why, whylen, "FORWARD of %u bytes exceeds the %u that %u rows of %s take", f->h.payload_len,
                       n->data_cap, h->n_batch_max, cv_act_type_name(h->act_type)),
               CV_PERR_TOO_LARGE;
    if (cv_msg_forward_decode(f->payload, f->h.payload_len, fw, why, whylen))
        return CV_PERR_BAD_FRAME;
    if (!has_head(n) && fw->n_trail + 1 >= CV_TRAIL_MAX)
        return cv_errf(why, whylen, "FORWARD has passed %u stages: a chain has at most %d", fw->n_trail + 1u,
                       CV_TRAIL_MAX),
               CV_PERR_BAD_FRAME;
    if (fw->n_tokens > h->n_batch_max)
        return cv_errf(why, whylen, "FORWARD of %u rows exceeds n_batch_max %u", fw->n_tokens, h->n_batch_max),
               CV_PERR_TOO_LARGE;
    if ((fw->flags & CV_FWD_HAS_HIDDEN) && fw->act_type != h->act_type)
        return cv_errf(why, whylen, "FORWARD activations are %s, the session agreed on %s",
                       cv_act_type_name(fw->act_type), cv_act_type_name(h->act_type)),
               CV_PERR_ACT_TYPE;
    if (!(fw->flags & CV_FWD_HAS_HIDDEN) || fw->n_embd != (uint32_t)n_embd)
        return cv_errf(why, whylen, "FORWARD of width %u (hidden states %s) does not fit this stage (width %d)",
                       fw->n_embd, (fw->flags & CV_FWD_HAS_HIDDEN) ? "present" : "missing", n_embd),
               CV_PERR_BAD_BATCH;
    return 0;
}

static int run_forward(node *n, const cv_frame *f, char *err, size_t errlen)
{
    cv_msg_forward fw;
    char why[CV_ERRLEN];
    const uint32_t code = check_forward(n, f, &fw, why, sizeof why);
    if (code)
        return refuse(n, f, code, why); /* before any compute */
    for (uint32_t t = 0; t < fw.n_tokens; t++) {
        n->tok[t] = fw.tokens[t].token;
        n->pos[t] = fw.tokens[t].pos;
        n->seq[t] = fw.tokens[t].seq;
        n->want[t] = fw.tokens[t].want;
    }
    const float *in = fw.act;
    if (fw.act_type != CV_ACT_F32) {
        if (cv_act_to_f32(fw.act_type, fw.act, (uint64_t)fw.n_tokens * fw.n_embd, n->in_f32, why, sizeof why))
            return refuse(n, f, CV_PERR_BAD_FRAME, why);
        in = n->in_f32;
    }
    const cv_batch b = {.n_tokens = (int32_t)fw.n_tokens, .token = n->tok, .pos = n->pos, .seq = n->seq,
                        .want = n->want};
    if (!has_head(n) && cv_fwd_out_reclaim(&n->out[n->cur], n->next, err, errlen))
        return -1;
    const uint64_t t0 = cv_now_ns();
    atomic_store(&n->working, true);
    const int stepped = cv_span_step(&n->span, &b, in, has_head(n) ? NULL : n->out[n->cur].hidden, n->out_tokens, why,
                                     sizeof why);
    atomic_store(&n->working, false);
    if (stepped)
        return refuse(n, f, CV_PERR_BAD_BATCH, why);
    const uint64_t ns = cv_now_ns() - t0;
    n->stats.compute_ns += ns;
    n->stats.steps++;
    n->stats.tokens += fw.n_tokens;
    if (has_head(n))
        return send_result(n, &fw, ns / 1000, f->h.id, err, errlen);
    if (send_forward(n, &fw, ns / 1000, f->h.id, err, errlen)) {
        send_error(n->head, f->h.id, CV_PERR_NEXT_NODE, err);
        return -1;
    }
    return 0;
}

static int run_seq_op(node *n, const cv_frame *f, char *err, size_t errlen)
{
    cv_msg_seq_op op;
    char why[CV_ERRLEN];
    if (cv_msg_seq_op_decode(f->payload, f->h.payload_len, &op, why, sizeof why))
        return refuse(n, f, CV_PERR_BAD_FRAME, why);
    if (op.seq >= (int32_t)n->hello.n_slot || op.dst >= (int32_t)n->hello.n_slot) {
        snprintf(why, sizeof why, "SEQ_OP on slot %d, this chain has %u", op.seq > op.dst ? op.seq : op.dst,
                 n->hello.n_slot);
        return refuse(n, f, CV_PERR_BAD_BATCH, why);
    }
    if (op.op == CV_SEQ_SET_SAMPLER && op.sampler.penalty_last_n > (int32_t)n->hello.n_ctx) {
        /* a sampler's history is as long as this, and the budget counted a context's */
        snprintf(why, sizeof why, "SET_SAMPLER penalty_last_n %d exceeds n_ctx %u", op.sampler.penalty_last_n,
                 n->hello.n_ctx);
        return refuse(n, f, CV_PERR_TOO_LARGE, why);
    }
    if (op.op == CV_SEQ_TRUNCATE) {
        cv_span_seq_truncate(&n->span, op.seq, op.len);
    } else if (op.op == CV_SEQ_FREE) {
        cv_span_seq_free(&n->span, op.seq);
        if (has_head(n))
            n->n_probs[op.seq] = 0;
    } else if (op.op == CV_SEQ_COPY) {
        cv_span_seq_copy(&n->span, op.seq, op.dst, op.len); /* empties dst first, as FREE */
        if (has_head(n))
            n->n_probs[op.dst] = 0;
    } else if (op.op == CV_SEQ_SET_SAMPLER && has_head(n)) { /* the decoder bounds n_probs */
        if (cv_span_set_sampler(&n->span, op.seq, &op.sampler, why, sizeof why))
            return refuse(n, f, CV_PERR_INTERNAL, why);
        n->n_probs[op.seq] = op.n_probs;
    } else if (op.op == CV_SEQ_SET_GRAMMAR && has_head(n)) {
        if (cv_span_set_grammar(&n->span, op.seq, op.grammar, op.grammar_len, op.len, why, sizeof why))
            return refuse(n, f, CV_PERR_BAD_STATE, why);
    }
    if (n->next && cv_link_send(n->next, CV_MSG_SEQ_OP, f->h.id, f->payload, f->h.payload_len, err, errlen)) {
        send_error(n->head, f->h.id, CV_PERR_NEXT_NODE, err);
        return -1;
    }
    return 0;
}

static int send_stats(node *n, uint32_t id, char *err, size_t errlen)
{
    cv_link_stats ls;
    n->stats.bytes_sent = 0;
    cv_link *links[3] = {n->head, n->prev, n->next};
    for (int i = 0; i < 3; i++)
        if (links[i]) {
            cv_link_get_stats(links[i], &ls);
            n->stats.bytes_sent += ls.bytes_sent;
        }
    uint8_t buf[CV_MSG_STATS_OK_SIZE];
    size_t len;
    return cv_msg_stats_encode(&n->stats, buf, sizeof buf, &len, err, errlen) ||
                   cv_link_send(n->head, CV_MSG_STATS_OK, id, buf, len, err, errlen)
               ? -1
               : 0;
}

/* A link's receiving side failed (closed, timed out, a bad frame or one
 * over its cap): the head is told why while its link can still send, and
 * quietly, since a head that left hears nothing. */
static void link_failed(node *n, const cv_inbox_event *ev)
{
    char msg[CV_ERRLEN];
    snprintf(msg, sizeof msg, "%s%s", ev->source == SRC_PREV ? "lost the previous node: " : "", ev->err);
    send_error_q(n->head, 0, ev->source == SRC_PREV ? CV_PERR_NEXT_NODE : CV_PERR_BAD_FRAME, msg, true);
    fprintf(stderr, "convoy stage: session ends: %s\n", ev->err);
}

/* Whether the session ends before its next frame: its head was silent for
 * the session timeout, or a parked head takes the node (node.h); the head
 * is told why. The gate is looked at every GATE_POLL_MS. */
static bool session_over(node *n, int64_t *polled)
{
    char err[CV_ERRLEN];
    if (cv_now_ms() - n->heard > n->o->io_timeout_ms) {
        snprintf(err, sizeof err, "no frame from the head for %d ms: the session ends", n->o->io_timeout_ms);
        send_error(n->head, 0, CV_PERR_TIMEOUT, err);
        fprintf(stderr, "convoy stage: session ends: %s\n", err);
        return true;
    }
    if (cv_now_ms() - *polled < GATE_POLL_MS)
        return false;
    *polled = cv_now_ms();
    park_poll(n, 0);
    park_sort(n, false);
    if (!takeover_due(n))
        return false;
    yield_node(n, err, sizeof err);
    fprintf(stderr, "convoy stage: session ends: %s\n", err);
    return true;
}

/* Handles one frame of the session: 0, or -1 when the session ends (err
 * says why). */
static int handle_frame(node *n, const cv_inbox_event *ev, char *err, size_t errlen)
{
    cv_link *src = ev->source == SRC_HEAD ? n->head : n->prev;
    const uint16_t type = ev->frame.h.type;
    const bool data = ev->source == (n->prev ? SRC_PREV : SRC_HEAD);
    char why[CV_ERRLEN];
    if (type != CV_MSG_FORWARD && type != CV_MSG_SEQ_OP && /* their runs decode them, sizes first */
        cv_msg_validate(type, ev->frame.payload, ev->frame.h.payload_len, why, sizeof why))
        return refuse(n, &ev->frame, CV_PERR_BAD_FRAME, why);
    if (type == CV_MSG_FORWARD && data)
        return run_forward(n, &ev->frame, err, errlen);
    if (type == CV_MSG_SEQ_OP && data)
        return run_seq_op(n, &ev->frame, err, errlen);
    if (type == CV_MSG_STATS && ev->source == SRC_HEAD)
        return send_stats(n, ev->frame.h.id, err, errlen);
    if (type == CV_MSG_PING && ev->source == SRC_HEAD)
        return cv_link_send(n->head, CV_MSG_PONG, ev->frame.h.id, ev->frame.payload, ev->frame.h.payload_len, err,
                            errlen);
    if (type == CV_MSG_BYE)
        return cv_errf(err, errlen, "%s said BYE", cv_link_name(src));
    snprintf(err, errlen, "unexpected %s from %s", cv_msg_type_name(type), cv_link_name(src));
    send_error(n->head, ev->frame.h.id, CV_PERR_BAD_STATE, err);
    return 0;
}

/* The session's main loop: until the head leaves, a link fails, the head
 * falls silent for the session timeout or a parked head takes over. */
static void serve_frames(node *n)
{
    char err[CV_ERRLEN];
    cv_inbox_init(&n->inbox);
    if (cv_inbox_add(&n->inbox, n->head, SRC_HEAD, err, sizeof err) ||
        (n->prev && cv_inbox_add(&n->inbox, n->prev, SRC_PREV, err, sizeof err))) {
        fprintf(stderr, "convoy stage: %s\n", err);
        return;
    }
    char experts[128];
    describe_experts(n, experts, sizeof experts);
    fprintf(stderr, "convoy stage: serving layers [%u, %u) of %u%s: %llu KB%s\n", n->hello.l0, n->hello.l1,
            n->hello.n_layer, has_head(n) ? " and the output head" : "", (unsigned long long)(n->range_bytes >> 10),
            experts);
    n->heard = cv_now_ms(); /* when the last frame was handled: computing is not silence */
    int64_t polled = 0;
    while (!*n->o->stop && !session_over(n, &polled)) {
        cv_inbox_event ev;
        if (cv_inbox_next(&n->inbox, GATE_POLL_MS, &ev) == CV_LINK_TIMEOUT)
            continue;
        if (!ev.ok) {
            link_failed(n, &ev);
            return;
        }
        const int rc = handle_frame(n, &ev, err, sizeof err);
        cv_link_release(ev.source == SRC_HEAD ? n->head : n->prev, &ev.frame);
        if (rc) {
            fprintf(stderr, "convoy stage: session ends: %s\n", err);
            return;
        }
        n->heard = cv_now_ms();
    }
}

/* While a FORWARD is computed, a pulse (an unasked PONG, id 0) goes to the
 * head every CV_PULSE_MS, so that the head's timeout measures silence, not
 * work: a long prefill on a slow node is not taken for a dead one, and a
 * stopped node still falls silent. Steps shorter than that send nothing. */
static void *pulse_main(void *arg)
{
    node *n = arg;
    char err[CV_ERRLEN];
    uint8_t buf[CV_MSG_PING_SIZE];
    size_t len;
    pthread_mutex_lock(&n->pulse_mu);
    while (!n->pulse_stop) {
        const struct timespec until = cv_deadline_ms(CV_PULSE_MS);
        pthread_cond_timedwait(&n->pulse_cv, &n->pulse_mu, &until);
        if (n->pulse_stop || !atomic_load(&n->working))
            continue;
        pthread_mutex_unlock(&n->pulse_mu);
        /* a dead link is the session's to see */
        const cv_msg_ping pulse = {.nonce = 0, .timestamp = (uint64_t)cv_now_ns()};
        if (cv_msg_ping_encode(&pulse, buf, sizeof buf, &len, err, sizeof err) == 0)
            cv_link_send(n->head, CV_MSG_PONG, 0, buf, len, err, sizeof err);
        pthread_mutex_lock(&n->pulse_mu);
    }
    pthread_mutex_unlock(&n->pulse_mu);
    return NULL;
}

/* The session: the pulse beside the loop over frames. */
static void serve_session(node *n)
{
    n->pulse_stop = false;
    atomic_store(&n->working, false);
    const bool pulsing = pthread_create(&n->pulse, NULL, pulse_main, n) == 0;
    serve_frames(n);
    if (pulsing) {
        pthread_mutex_lock(&n->pulse_mu);
        n->pulse_stop = true;
        pthread_cond_signal(&n->pulse_cv);
        pthread_mutex_unlock(&n->pulse_mu);
        pthread_join(n->pulse, NULL);
    }
}

/* Loads the key into *key (with key_file), refuses plaintext beyond
 * loopback without insecure, and listens through a gate whose pending
 * connections have the handshake timeout, GATE_DEADLINE_MS at most. */
static int open_gate(node *n, const char *host, int port, cv_seal_key *key, char *err, size_t errlen)
{
    const cv_node_opts *o = n->o;
    if (o->key_file && cv_seal_key_load(o->key_file, key, err, errlen))
        return -1;
    n->key = o->key_file ? key : NULL;
    if (!n->key && !o->insecure && !cv_host_is_loopback(host))
        return cv_errf(err, errlen, "listening on %s without --key would serve any host that reaches it: give "
                                    "--key FILE (made by `convoy keygen FILE`, the same on every stage and head), "
                                    "or --insecure on a network you trust",
                       o->listen);
    const cv_gate_opts go = {.key = n->key, .log_prefix = "convoy stage",
                             .deadline_ms = o->handshake_timeout_ms < GATE_DEADLINE_MS ? o->handshake_timeout_ms
                                                                                       : GATE_DEADLINE_MS};
    return cv_gate_open(host, port, &go, &n->gate, err, errlen);
}

/* The node's model at start: --model's (its hashes from their cache or
 * read now), or none with --cache (the directory made if need be). */
static int open_model(node *n, char *err, size_t errlen)
{
    const cv_node_opts *o = n->o;
    if (!o->cache_dir) {
        if (load_model(n, o->model_path, err, errlen))
            return -1;
        char hex[17];
        cv_hash_hex8(n->hashes.meta, hex);
        fprintf(stderr, "convoy stage: %s (model hash %s)\n", o->model_path, hex);
        return 0;
    }
    char why[CV_ERRLEN];
    if (cv_make_dirs(o->cache_dir, why, sizeof why))
        return cv_errf(err, errlen, "--cache %s", why);
    sweep_parts(n);
    fprintf(stderr, "convoy stage: no model: the head ships the layers it assigns, kept in %s\n", o->cache_dir);
    return 0;
}

int cv_node_serve(const cv_node_opts *o, char *err, size_t errlen)
{
    node n;
    memset(&n, 0, sizeof n);
    n.o = o;
    pthread_mutex_init(&n.pulse_mu, NULL);
    pthread_cond_init(&n.pulse_cv, NULL);
    char host[CV_PROTO_ADDR_MAX + 1];
    int port;
    cv_seal_key key;
    if (cv_parse_addr(o->listen, host, sizeof host, &port, err, errlen))
        return -1;
    if (!o->model_path == !o->cache_dir)
        return cv_errf(err, errlen, "a stage serves from a model file (--model) or receives its layers (--cache), "
                                    "one of the two");
    if (open_model(&n, err, errlen) || open_gate(&n, host, port, &key, err, errlen)) {
        cv_seal_key_wipe(&key);
        unload_model(&n);
        return -1;
    }
    /* ready: what the process holds now is what every session adds to */
    n.budget = o->mem_budget ? o->mem_budget : cv_mem_available();
    n.process_bytes = cv_proc_baseline(o->model_path ? o->model_path : "");
    fprintf(stderr, "convoy stage: on port %d, budget %.2f GB (%s), %.1f MB of it this process's own\n",
            cv_gate_port(n.gate), n.budget / 1e9,
            o->mem_budget ? "--mem" : n.budget ? "MemAvailable" : "unknown: no limit", n.process_bytes / 1e6);
    for (int sessions = 0; !*o->stop && (o->max_sessions == 0 || sessions < o->max_sessions);) {
        const cv_link_opts lo = link_opts(&n);
        int rc = unpark_head(&n) ? 0 : cv_gate_next(n.gate, 200, &lo, &n.head, err, errlen);
        if (rc == CV_LINK_TIMEOUT)
            continue;
        if (rc) {
            fprintf(stderr, "convoy stage: %s\n", err);
            continue;
        }
        sessions++;
        if (handshake(&n, err, errlen) == 0)
            serve_session(&n);
        else if (!n.hushed)
            fprintf(stderr, "convoy stage: handshake failed: %s\n", err);
        session_end(&n);
    }
    for (int i = 0; i < PARKED_MAX; i++)
        if (n.park[i].link)
            unpark(&n.park[i], CV_PERR_SHUTDOWN, "the node is stopping");
    cv_gate_close(n.gate);
    cv_seal_key_wipe(&key);
    unload_model(&n);
    return 0;
}
