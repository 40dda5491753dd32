/* node.c: `convoy stage`, one node of a pipeline (see node.h).
 *
 * The serving thread owns everything: the listener, the session's links,
 * the span of its layers. It reads the head's and the previous node's links itself,
 * through an inbox, so it waits on both at once.
 * Hidden states go to the next node straight from the span's output
 * buffer (two buffers alternate, so one can be on the wire while the next
 * batch is computed); the last stage answers the head with RESULT. All
 * buffers are allocated at assignment for the session's batch size; a
 * step allocates nothing (only the first RESULT that carries full logits,
 * a test mode, grows the result buffer once). */
#include "pipe/node.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "infer/logprobs.h"
#include "infer/span.h"
#include "model/fingerprint.h"
#include "pipe/inbox.h"
#include "pipe/link.h"
#include "pipe/proto.h"
#include "pipe/wire.h"

enum { SRC_HEAD = 0, SRC_PREV = 1 };

typedef struct node {
    const cv_node_opts *o;
    cv_llama meta; /* hyperparameters and tensor directory, no layers bound */
    uint64_t fingerprint;
    cv_listener *listener;

    /* session */
    cv_msg_hello hello;
    cv_span span;
    bool span_open;
    cv_link *head, *prev, *next;
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

    /* the pulse: see pulse_main */
    pthread_t pulse;
    pthread_mutex_t pulse_mu;
    pthread_cond_t pulse_cv;
    bool pulse_stop;    /* under pulse_mu */
    atomic_bool working; /* a FORWARD is being computed */
} node;

static int send_error(cv_link *l, uint32_t id, uint32_t code, const char *msg)
{
    uint8_t buf[CV_PROTO_ERRMSG_MAX + 16];
    size_t len;
    char err[CV_ERRLEN];
    if (cv_msg_error_encode(code, msg, buf, sizeof buf, &len, err, sizeof err) ||
        cv_link_send(l, CV_MSG_ERROR, id, buf, len, err, sizeof err)) {
        fprintf(stderr, "convoy stage: could not report an error to %s: %s\n", cv_link_name(l), err);
        return -1;
    }
    return 0;
}

/* Waits for one frame of one link (handshake steps), up to timeout_ms. */
static int recv_frame(cv_link *l, int timeout_ms, cv_frame *f, char *err, size_t errlen)
{
    int rc = cv_link_recv(l, timeout_ms, f, err, errlen);
    if (rc == CV_LINK_TIMEOUT)
        return cv_errf(err, errlen, "%s: no handshake within %d ms", cv_link_name(l), timeout_ms);
    return rc;
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
}

static void session_end(node *n)
{
    if (n->next) {
        char err[CV_ERRLEN];
        cv_link_send(n->next, CV_MSG_BYE, 0, NULL, 0, err, sizeof err);
    }
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
    n->meta = keep.meta;
    n->fingerprint = keep.fingerprint;
    n->listener = keep.listener;
}

static bool has_head(const node *n) { return n->hello.l1 == n->hello.n_layer; }

/* Checks an assignment against this node's model and budget, binds the
 * layers and allocates the session's buffers. On failure the message is
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
    if (h->act_type != CV_ACT_F32 && (h->act_type >= CV_ACT_COUNT || !(h->features & CV_FEAT_LOSSY_ACT)))
        return cv_errf(err, errlen, "activation type %u is not supported", h->act_type);
    const cv_span_params p = {.l0 = (int32_t)h->l0, .l1 = (int32_t)h->l1, .n_threads = n->o->n_threads,
                               .n_ctx = (int32_t)h->n_ctx, .n_slot = (int32_t)h->n_slot,
                               .n_batch = (int32_t)h->n_batch_max, .kv_f16 = (h->features & CV_FEAT_KV_F16) != 0,
                               .from_hidden = true};
    *bytes = cv_span_bytes_needed(&n->meta, &p);
    if (n->o->mem_budget && *bytes > n->o->mem_budget) {
        *code = CV_PERR_NO_MEMORY;
        return cv_errf(err, errlen, "layers [%u, %u) with %u slots of %u positions need %.2f GB, the budget is %.2f GB",
                       h->l0, h->l1, h->n_slot, h->n_ctx, *bytes / 1e9, n->o->mem_budget / 1e9);
    }
    *code = CV_PERR_INTERNAL;
    if (cv_span_open(&n->span, n->o->model_path, &p, err, errlen))
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
        n->res_cap = 12 + nb * (16 + sizeof(cv_top_entry) * CV_PROTO_MAX_TOP);
        n->res_buf = cv_aligned_alloc(n->res_cap);
        ok = ok && n->out_tokens && n->rows && n->top && n->n_probs && n->res_buf;
    }
    if (!ok)
        return cv_errf(err, errlen, "out of memory for buffers of %u tokens", h->n_batch_max);
    for (int i = 0; i < 2 && !has_head(n); i++)
        if (cv_fwd_out_alloc(&n->out[i], nb, ne, err, errlen))
            return -1;
    return 0;
}

/* Answers a HELLO with HELLO_OK: this node's budget, with its speed (a
 * query) or the bytes of the layers asked (an assignment). */
static int answer_hello(node *n, cv_link *l, uint32_t id, uint32_t us_per_layer_token, uint64_t layer_bytes,
                        char *err, size_t errlen)
{
    const cv_msg_hello_ok ok = {.proto_version = CV_PROTO_VERSION, .us_per_layer_token = us_per_layer_token,
                                .mem_budget = n->o->mem_budget, .layer_bytes = layer_bytes,
                                .max_payload = CV_PROTO_DEFAULT_MAX_PAYLOAD};
    uint8_t buf[CV_MSG_HELLO_OK_SIZE];
    size_t len;
    return cv_msg_hello_ok_encode(&ok, buf, sizeof buf, &len, err, errlen) ||
                   cv_link_send(l, CV_MSG_HELLO_OK, id, buf, len, err, errlen)
               ? -1
               : 0;
}

/* Opens the link to the next node and introduces this node to it. */
static int connect_next(node *n, char *err, size_t errlen)
{
    char host[256];
    int port;
    const cv_link_opts lo = cv_link_io_opts(n->o->io_timeout_ms);
    if (cv_parse_addr(n->hello.next_addr, host, sizeof host, &port, err, errlen) ||
        cv_link_connect(host, port, n->o->handshake_timeout_ms, &lo, &n->next, err, errlen))
        return -1;
    cv_msg_hello h = n->hello;
    h.role = CV_ROLE_PREV_NODE;
    h.next_addr[0] = 0;
    h.features &= ~(uint32_t)CV_FEAT_FROM_PREV;
    cv_msg_hello_ok ok;
    return cv_hello_ask(n->next, &h, n->o->handshake_timeout_ms, &ok, err, errlen);
}

/* The previous node connects after the handshake with the head. */
static int accept_prev(node *n, char *err, size_t errlen)
{
    const cv_link_opts lo = cv_link_io_opts(n->o->io_timeout_ms);
    int rc = cv_listener_accept(n->listener, n->o->handshake_timeout_ms, &lo, &n->prev, err, errlen);
    if (rc == CV_LINK_TIMEOUT)
        return cv_errf(err, errlen, "the previous node did not connect within %d ms", n->o->handshake_timeout_ms);
    cv_frame f;
    if (rc || recv_frame(n->prev, n->o->handshake_timeout_ms, &f, err, errlen))
        return -1;
    cv_msg_hello h;
    rc = 0;
    if (f.h.type != CV_MSG_HELLO || cv_msg_hello_decode(f.payload, f.h.payload_len, &h, err, errlen))
        rc = f.h.type != CV_MSG_HELLO ? cv_errf(err, errlen, "%s sent %s instead of HELLO", cv_link_name(n->prev),
                                                cv_msg_type_name(f.h.type))
                                      : -1;
    else if (h.role != CV_ROLE_PREV_NODE || h.cluster_id != n->hello.cluster_id || h.fingerprint != n->fingerprint)
        rc = cv_errf(err, errlen, "%s is not the previous node of this chain", cv_link_name(n->prev));
    cv_link_release(n->prev, &f);
    if (rc) {
        send_error(n->prev, 0, CV_PERR_CLUSTER, err);
        return -1;
    }
    return answer_hello(n, n->prev, 0, 0, 0, err, errlen);
}

/* The head's handshake: queries, then one assignment. 0: the session runs;
 * -1: it ended (the head has been told why when it can be). */
static int handshake(node *n, char *err, size_t errlen)
{
    for (;;) {
        cv_frame f;
        if (recv_frame(n->head, n->o->handshake_timeout_ms, &f, err, errlen))
            return -1;
        if (f.h.type == CV_MSG_BYE) {
            cv_link_release(n->head, &f);
            return cv_errf(err, errlen, "%s said BYE during the handshake", cv_link_name(n->head));
        }
        uint32_t code = CV_PERR_BAD_STATE;
        int rc = f.h.type == CV_MSG_HELLO ? cv_msg_hello_decode(f.payload, f.h.payload_len, &n->hello, err, errlen)
                                          : cv_errf(err, errlen, "expected HELLO, got %s", cv_msg_type_name(f.h.type));
        const uint32_t id = f.h.id;
        cv_link_release(n->head, &f);
        if (rc == 0 && n->hello.role != CV_ROLE_HEAD)
            rc = cv_errf(err, errlen, "a previous node connected, but no head has set up a chain here");
        if (rc == 0 && n->hello.fingerprint != n->fingerprint) {
            code = CV_PERR_FINGERPRINT;
            rc = cv_errf(err, errlen, "model fingerprint %016llx differs from this node's %016llx (%s)",
                         (unsigned long long)n->hello.fingerprint, (unsigned long long)n->fingerprint,
                         n->o->model_path);
        } else if (rc && n->hello.proto_version != CV_PROTO_VERSION) {
            code = CV_PERR_VERSION;
        }
        if (rc) {
            send_error(n->head, id, code, err);
            return -1;
        }
        const bool query = n->hello.l0 == n->hello.l1;
        uint32_t us_per_layer_token = 0;
        uint64_t layer_bytes = 0;
        if (query) {
            us_per_layer_token = cv_span_speed_probe(&n->meta, n->o->n_threads);
        } else if (assign(n, &code, &layer_bytes, err, errlen) ||
                   (n->hello.next_addr[0] && (code = CV_PERR_NEXT_NODE, connect_next(n, err, errlen)))) {
            send_error(n->head, id, code, err);
            return -1;
        }
        if (answer_hello(n, n->head, id, us_per_layer_token, layer_bytes, err, errlen))
            return -1;
        if (query)
            continue;
        if ((n->hello.features & CV_FEAT_FROM_PREV) && accept_prev(n, err, errlen)) {
            send_error(n->head, 0, CV_PERR_BAD_STATE, err);
            return -1;
        }
        return 0;
    }
}

static int send_result(node *n, const cv_msg_forward *fw, uint32_t id, char *err, size_t errlen)
{
    const int32_t n_vocab = n->span.model.hp.n_vocab;
    const bool with_logits = fw->flags & CV_FWD_WANT_LOGITS;
    uint32_t n_rows = 0;
    for (uint32_t t = 0, row = 0; t < fw->n_tokens; t++) {
        if (!n->want[t])
            continue;
        const int32_t token = n->out_tokens[row++];
        if (token < 0) /* after a rejected draft */
            continue;
        const float *logits = cv_span_logits(&n->span, (int32_t)row - 1);
        cv_result_row *r = &n->rows[n_rows];
        *r = (cv_result_row){.seq = n->seq[t], .pos = n->pos[t], .token = token};
        const uint32_t np = n->n_probs[n->seq[t]];
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
    cv_msg_result m = {.n_rows = n_rows, .rows = n->rows};
    if (with_logits) {
        m.flags = CV_RES_HAS_LOGITS;
        m.n_vocab = (uint32_t)n_vocab;
        m.logits = cv_span_logits(&n->span, 0);
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

/* Sends this stage's hidden states on, from the buffers `cur`. */
static int send_forward(node *n, const cv_msg_forward *in, uint32_t id, char *err, size_t errlen)
{
    const cv_msg_forward m = {.n_tokens = in->n_tokens, .n_embd = (uint32_t)n->span.model.hp.n_embd,
                              .act_type = n->hello.act_type, .flags = in->flags, .tokens = in->tokens};
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
static int run_forward(node *n, const cv_frame *f, char *err, size_t errlen)
{
    cv_msg_forward fw;
    char why[CV_ERRLEN];
    if (cv_msg_forward_decode(f->payload, f->h.payload_len, &fw, why, sizeof why))
        return refuse(n, f, CV_PERR_BAD_FRAME, why);
    const cv_llama_hparams *hp = &n->span.model.hp;
    if (fw.n_tokens > n->hello.n_batch_max || !(fw.flags & CV_FWD_HAS_HIDDEN) || fw.n_embd != (uint32_t)hp->n_embd) {
        snprintf(why, sizeof why, "FORWARD of %u tokens of width %u (hidden states %s) does not fit this stage "
                                  "(batch %u, width %d)",
                 fw.n_tokens, fw.n_embd, (fw.flags & CV_FWD_HAS_HIDDEN) ? "present" : "missing",
                 n->hello.n_batch_max, hp->n_embd);
        return refuse(n, f, CV_PERR_BAD_BATCH, why);
    }
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
    n->stats.compute_ns += cv_now_ns() - t0;
    n->stats.steps++;
    n->stats.tokens += fw.n_tokens;
    if (has_head(n))
        return send_result(n, &fw, f->h.id, err, errlen);
    if (send_forward(n, &fw, f->h.id, err, errlen)) {
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
    if (op.seq >= (int32_t)n->hello.n_slot) {
        snprintf(why, sizeof why, "SEQ_OP on slot %d, this chain has %u", op.seq, n->hello.n_slot);
        return refuse(n, f, CV_PERR_BAD_BATCH, why);
    }
    if (op.op == CV_SEQ_TRUNCATE) {
        cv_span_seq_truncate(&n->span, op.seq, op.len);
    } else if (op.op == CV_SEQ_FREE) {
        cv_span_seq_free(&n->span, op.seq);
        if (has_head(n))
            n->n_probs[op.seq] = 0;
    } else if (op.op == CV_SEQ_SET_SAMPLER && has_head(n)) { /* the decoder bounds n_probs */
        if (cv_span_set_sampler(&n->span, op.seq, &op.sampler, why, sizeof why))
            return refuse(n, f, CV_PERR_INTERNAL, why);
        n->n_probs[op.seq] = op.n_probs;
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

/* The session's main loop: until the head leaves or a link fails. */
static void serve_frames(node *n)
{
    char err[CV_ERRLEN];
    cv_inbox_init(&n->inbox);
    if (cv_inbox_add(&n->inbox, n->head, SRC_HEAD, err, sizeof err) ||
        (n->prev && cv_inbox_add(&n->inbox, n->prev, SRC_PREV, err, sizeof err))) {
        fprintf(stderr, "convoy stage: %s\n", err);
        return;
    }
    fprintf(stderr, "convoy stage: serving layers [%u, %u) of %u%s\n", n->hello.l0, n->hello.l1, n->hello.n_layer,
            has_head(n) ? " and the output head" : "");
    while (!*n->o->stop) {
        cv_inbox_event ev;
        if (cv_inbox_next(&n->inbox, 200, &ev) == CV_LINK_TIMEOUT)
            continue;
        cv_link *src = ev.source == SRC_HEAD ? n->head : n->prev;
        if (!ev.ok) {
            if (ev.source == SRC_PREV) {
                snprintf(err, sizeof err, "lost the previous node: %s", ev.err);
                send_error(n->head, 0, CV_PERR_NEXT_NODE, err);
            }
            fprintf(stderr, "convoy stage: session ends: %s\n", ev.err);
            return;
        }
        const uint16_t type = ev.frame.h.type;
        const bool data = ev.source == (n->prev ? SRC_PREV : SRC_HEAD);
        int rc = 0;
        if (type == CV_MSG_FORWARD && data)
            rc = run_forward(n, &ev.frame, err, sizeof err);
        else if (type == CV_MSG_SEQ_OP && data)
            rc = run_seq_op(n, &ev.frame, err, sizeof err);
        else if (type == CV_MSG_STATS && ev.source == SRC_HEAD)
            rc = send_stats(n, ev.frame.h.id, err, sizeof err);
        else if (type == CV_MSG_PING && ev.source == SRC_HEAD)
            rc = cv_link_send(n->head, CV_MSG_PONG, ev.frame.h.id, ev.frame.payload, ev.frame.h.payload_len, err,
                              sizeof err);
        else if (type == CV_MSG_BYE)
            rc = -1, snprintf(err, sizeof err, "%s said BYE", cv_link_name(src));
        else {
            snprintf(err, sizeof err, "unexpected %s from %s", cv_msg_type_name(type), cv_link_name(src));
            send_error(n->head, ev.frame.h.id, CV_PERR_BAD_STATE, err);
        }
        cv_link_release(src, &ev.frame);
        if (rc) {
            fprintf(stderr, "convoy stage: session ends: %s\n", err);
            return;
        }
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

int cv_node_serve(const cv_node_opts *o, char *err, size_t errlen)
{
    node n;
    memset(&n, 0, sizeof n);
    n.o = o;
    pthread_mutex_init(&n.pulse_mu, NULL);
    pthread_cond_init(&n.pulse_cv, NULL);
    char host[CV_PROTO_ADDR_MAX + 1];
    int port;
    if (cv_parse_addr(o->listen, host, sizeof host, &port, err, errlen))
        return -1;
    if (cv_llama_load(&n.meta, o->model_path, 0, 0, err, errlen))
        return -1;
    n.fingerprint = cv_model_fingerprint(&n.meta.gguf);
    if (cv_listener_open(host, port, &n.listener, err, errlen)) {
        cv_llama_free(&n.meta);
        return -1;
    }
    fprintf(stderr, "convoy stage: %s (fingerprint %016llx) on port %d, budget %s\n", o->model_path,
            (unsigned long long)n.fingerprint, cv_listener_port(n.listener),
            o->mem_budget ? "set" : "unlimited");
    for (int sessions = 0; !*o->stop && (o->max_sessions == 0 || sessions < o->max_sessions);) {
        const cv_link_opts lo = cv_link_io_opts(o->io_timeout_ms);
        int rc = cv_listener_accept(n.listener, 200, &lo, &n.head, err, errlen);
        if (rc == CV_LINK_TIMEOUT)
            continue;
        if (rc) {
            fprintf(stderr, "convoy stage: %s\n", err);
            continue;
        }
        sessions++;
        if (handshake(&n, err, errlen) == 0)
            serve_session(&n);
        else
            fprintf(stderr, "convoy stage: handshake failed: %s\n", err);
        session_end(&n);
    }
    cv_listener_close(n.listener);
    cv_llama_free(&n.meta);
    return 0;
}
