/* node.c: `convoy stage`, one node of a pipeline (see node.h): the
 * session, its compute path and its serving loop. The handshake that
 * opens a session is handshake.c's, the admission of connections past the
 * gate gate.c's, and a receiving node's layers ship.c's (node_impl.h).
 *
 * The serving thread owns everything: the gate, the session's links,
 * the span of its layers. It reads the head's link and the previous
 * node's itself, through an inbox, so it waits on both at once.
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
#include "core/fmap.h"
#include "core/procmem.h"
#include "infer/logprobs.h"
#include "pipe/node_impl.h"
#include "pipe/plan.h"

static_assert(CV_NODE_BATCH_MAX == CV_PROTO_MAX_BATCH, "node.h states the protocol's batch limit");

enum { SRC_HEAD = 0, SRC_PREV = 1 };

/* The most a connection may take to prove itself at the gate: a real head
 * needs one round trip, and a pending stranger holds a slot meanwhile. */
#define GATE_DEADLINE_MS 5000

/* ---- the session ---- */

/* Sends ERROR code msg on l; when the link cannot carry it, quiet says
 * the peer may have left (its link failed): nothing is logged then. */
int cv_node_send_error_q(cv_link *l, uint32_t id, uint32_t code, const char *msg, bool quiet)
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

int cv_node_send_error(cv_link *l, uint32_t id, uint32_t code, const char *msg)
{
    return cv_node_send_error_q(l, id, code, msg, false);
}

/* The options of every link of a session: keyed when the node is. */
cv_link_opts cv_node_link_opts(const node *n)
{
    cv_link_opts lo = cv_link_io_opts(n->o->io_timeout_ms);
    lo.key = n->key;
    return lo;
}

void cv_node_unload_model(node *n)
{
    if (n->has_model) {
        cv_model_hashes_free(&n->hashes);
        cv_llama_free(&n->meta);
    }
    n->has_model = false;
}

/* Makes the file at path this node's model: its metadata and the content
 * hashes of its tensors (from the cache beside it when they match). */
int cv_node_load_model(node *n, const char *path, char *err, size_t errlen)
{
    cv_node_unload_model(n);
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

/* How the session holds a mixture of experts' experts in expert slots,
 * for the log: ", every expert in memory (128 slots of 14 KB)" or ",
 * experts paged: 24 slots of 14 KB for 128"; nothing for a dense model. */
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
        cv_link_release(n->head_link, &n->first);
    cv_link_close(n->prev);
    cv_link_close(n->next);
    cv_link_close(n->head_link);
    n->prev = n->next = n->head_link = NULL;
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

/* ---- the compute path ---- */

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
    return cv_link_send(n->head_link, CV_MSG_RESULT, id, n->res_buf, len, err, errlen);
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
    return cv_node_send_error(n->head_link, f->h.id, code, why);
}

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
    if (!cv_node_is_last_stage(n) && fw->n_trail + 1 >= CV_TRAIL_MAX)
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

/* Runs one FORWARD. Returns 0, or -1 when the session must end; a batch
 * the span refuses is answered with ERROR and the session goes on. */
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
    if (!cv_node_is_last_stage(n) && cv_fwd_out_reclaim(&n->out[n->cur], n->next, err, errlen))
        return -1;
    float *out = cv_node_is_last_stage(n) ? NULL : n->out[n->cur].hidden;
    const uint64_t t0 = cv_now_ns();
    atomic_store(&n->working, true);
    const int stepped = cv_span_step(&n->span, &b, in, out, n->out_tokens, why, sizeof why);
    atomic_store(&n->working, false);
    if (stepped)
        return refuse(n, f, CV_PERR_BAD_BATCH, why);
    const uint64_t ns = cv_now_ns() - t0;
    n->stats.compute_ns += ns;
    n->stats.steps++;
    n->stats.tokens += fw.n_tokens;
    if (cv_node_is_last_stage(n))
        return send_result(n, &fw, ns / 1000, f->h.id, err, errlen);
    if (send_forward(n, &fw, ns / 1000, f->h.id, err, errlen)) {
        cv_node_send_error(n->head_link, f->h.id, CV_PERR_NEXT_NODE, err);
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
        if (cv_node_is_last_stage(n))
            n->n_probs[op.seq] = 0;
    } else if (op.op == CV_SEQ_COPY) {
        cv_span_seq_copy(&n->span, op.seq, op.dst, op.len); /* empties dst first, as FREE */
        if (cv_node_is_last_stage(n))
            n->n_probs[op.dst] = 0;
    } else if (op.op == CV_SEQ_SET_SAMPLER && cv_node_is_last_stage(n)) { /* the decoder bounds n_probs */
        if (cv_span_set_sampler(&n->span, op.seq, &op.sampler, why, sizeof why))
            return refuse(n, f, CV_PERR_INTERNAL, why);
        n->n_probs[op.seq] = op.n_probs;
    } else if (op.op == CV_SEQ_SET_GRAMMAR && cv_node_is_last_stage(n)) {
        if (cv_span_set_grammar(&n->span, op.seq, op.grammar, op.grammar_len, op.len, why, sizeof why))
            return refuse(n, f, CV_PERR_BAD_STATE, why);
    }
    if (n->next && cv_link_send(n->next, CV_MSG_SEQ_OP, f->h.id, f->payload, f->h.payload_len, err, errlen)) {
        cv_node_send_error(n->head_link, f->h.id, CV_PERR_NEXT_NODE, err);
        return -1;
    }
    return 0;
}

static int send_stats(node *n, uint32_t id, char *err, size_t errlen)
{
    cv_link_stats ls;
    n->stats.bytes_sent = 0;
    cv_link *links[3] = {n->head_link, n->prev, n->next};
    for (int i = 0; i < 3; i++)
        if (links[i]) {
            cv_link_get_stats(links[i], &ls);
            n->stats.bytes_sent += ls.bytes_sent;
        }
    uint8_t buf[CV_MSG_STATS_OK_SIZE];
    size_t len;
    return cv_msg_stats_encode(&n->stats, buf, sizeof buf, &len, err, errlen) ||
                   cv_link_send(n->head_link, CV_MSG_STATS_OK, id, buf, len, err, errlen)
               ? -1
               : 0;
}

/* ---- the serving loop ---- */

/* A link's receiving side failed (closed, timed out, a bad frame or one
 * over its cap): the head is told why while its link can still send, and
 * quietly, since a head that left hears nothing. */
static void link_failed(node *n, const cv_inbox_event *ev)
{
    char msg[CV_ERRLEN];
    snprintf(msg, sizeof msg, "%s%s", ev->source == SRC_PREV ? "lost the previous node: " : "", ev->err);
    cv_node_send_error_q(n->head_link, 0, ev->source == SRC_PREV ? CV_PERR_NEXT_NODE : CV_PERR_BAD_FRAME, msg, true);
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
        cv_node_send_error(n->head_link, 0, CV_PERR_TIMEOUT, err);
        fprintf(stderr, "convoy stage: session ends: %s\n", err);
        return true;
    }
    if (cv_now_ms() - *polled < GATE_POLL_MS)
        return false;
    *polled = cv_now_ms();
    cv_node_park_poll(n, 0);
    cv_node_park_sort(n, false);
    if (!cv_node_takeover_due(n))
        return false;
    cv_node_yield(n, err, sizeof err);
    fprintf(stderr, "convoy stage: session ends: %s\n", err);
    return true;
}

/* Handles one frame of the session: 0, or -1 when the session ends (err
 * says why). */
static int handle_frame(node *n, const cv_inbox_event *ev, char *err, size_t errlen)
{
    cv_link *src = ev->source == SRC_HEAD ? n->head_link : n->prev;
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
        return cv_link_send(n->head_link, CV_MSG_PONG, ev->frame.h.id, ev->frame.payload, ev->frame.h.payload_len, err,
                            errlen);
    if (type == CV_MSG_BYE)
        return cv_errf(err, errlen, "%s said BYE", cv_link_name(src));
    snprintf(err, errlen, "unexpected %s from %s", cv_msg_type_name(type), cv_link_name(src));
    cv_node_send_error(n->head_link, ev->frame.h.id, CV_PERR_BAD_STATE, err);
    return 0;
}

/* The session's main loop: until the head leaves, a link fails, the head
 * falls silent for the session timeout or a parked head takes over. */
static void serve_frames(node *n)
{
    char err[CV_ERRLEN];
    cv_inbox_init(&n->inbox);
    if (cv_inbox_add(&n->inbox, n->head_link, SRC_HEAD, err, sizeof err) ||
        (n->prev && cv_inbox_add(&n->inbox, n->prev, SRC_PREV, err, sizeof err))) {
        fprintf(stderr, "convoy stage: %s\n", err);
        return;
    }
    char experts[128];
    describe_experts(n, experts, sizeof experts);
    fprintf(stderr, "convoy stage: serving layers [%u, %u) of %u%s: %llu KB%s\n", n->hello.l0, n->hello.l1,
            n->hello.n_layer, cv_node_is_last_stage(n) ? " and the output matrix" : "",
            (unsigned long long)(n->range_bytes >> 10),
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
        cv_link_release(ev.source == SRC_HEAD ? n->head_link : n->prev, &ev.frame);
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
            cv_link_send(n->head_link, CV_MSG_PONG, 0, buf, len, err, sizeof err);
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


/* ---- the node ---- */

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
                                    "--key FILE (made by `convoy keygen FILE`, the same on the head and every node), "
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
        if (cv_node_load_model(n, o->model_path, err, errlen))
            return -1;
        char hex[17];
        cv_hash_hex8(n->hashes.meta, hex);
        fprintf(stderr, "convoy stage: %s (model hash %s)\n", o->model_path, hex);
        return 0;
    }
    char why[CV_ERRLEN];
    if (cv_make_dirs(o->cache_dir, why, sizeof why))
        return cv_errf(err, errlen, "--cache %s", why);
    cv_node_sweep_parts(n);
    fprintf(stderr, "convoy stage: no model: the head ships the layers it assigns, kept in %s\n", o->cache_dir);
    return 0;
}

/* What the node holds once ready, which every session adds to: its
 * budget (--mem, else MemAvailable) and this process's own bytes. */
static void take_stock(node *n)
{
    const cv_node_opts *o = n->o;
    n->budget = o->mem_budget ? o->mem_budget : cv_mem_available();
    n->process_bytes = cv_proc_baseline(o->model_path ? o->model_path : "");
    fprintf(stderr, "convoy stage: on port %d, budget %.2f GB (%s), %.1f MB of it this process's own\n",
            cv_gate_port(n->gate), n->budget / 1e9,
            o->mem_budget ? "--mem" : n->budget ? "MemAvailable" : "unknown: no limit", n->process_bytes / 1e6);
}

/* Serves heads one after another until *stop (or max_sessions): a parked
 * head that took the node over first, else the gate's next connection. */
static void serve_heads(node *n, char *err, size_t errlen)
{
    const cv_node_opts *o = n->o;
    for (int sessions = 0; !*o->stop && (o->max_sessions == 0 || sessions < o->max_sessions);) {
        const cv_link_opts lo = cv_node_link_opts(n);
        int rc = cv_node_unpark_head(n) ? 0 : cv_gate_next(n->gate, 200, &lo, &n->head_link, err, errlen);
        if (rc == CV_LINK_TIMEOUT)
            continue;
        if (rc) {
            fprintf(stderr, "convoy stage: %s\n", err);
            continue;
        }
        sessions++;
        if (cv_node_handshake(n, err, errlen) == 0)
            serve_session(n);
        else if (!n->hushed)
            fprintf(stderr, "convoy stage: handshake failed: %s\n", err);
        session_end(n);
    }
}

/* Tells the parked connections the node stops, and closes everything. */
static void close_node(node *n, cv_seal_key *key)
{
    for (int i = 0; i < PARKED_MAX; i++)
        if (n->park[i].link)
            cv_node_unpark(&n->park[i], CV_PERR_SHUTDOWN, "the node is stopping");
    cv_gate_close(n->gate);
    cv_seal_key_wipe(key);
    cv_node_unload_model(n);
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
        cv_node_unload_model(&n);
        return -1;
    }
    take_stock(&n);
    serve_heads(&n, err, errlen);
    close_node(&n, &key);
    return 0;
}
