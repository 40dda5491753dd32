/* handshake.c: the node's side of the head's handshake (node_impl.h): a
 * few HELLO queries, each answered with this node's budget and speed, then
 * one assignment, whose sizes, model and memory are checked before the
 * layers are bound, the next node connected and the previous one awaited.
 * (Not the key handshake of a keyed link, which is seal.h's and comes
 * first, at the gate.) */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "pipe/node_impl.h"
#include "pipe/plan.h"

/* HELLO's hashes are model/fingerprint.h's, of model/llama.h's span tensors. */
static_assert(CV_PROTO_HASH_BYTES == CV_HASH_BYTES, "HELLO hash size");
static_assert(CV_PROTO_HASHES_PER_LAYER == CV_LLAMA_LAYER_TENSORS_MAX &&
                  CV_PROTO_HASHES_EXTRA == CV_LLAMA_SPAN_EXTRA_MAX,
              "HELLO hash count bound");

/* A chain's head sends one query per connection: a few more are slack, an
 * endless stream of them is a peer holding the node. */
#define HANDSHAKE_QUERIES_MAX 4
/* Connecting to the next node (TCP, key handshake, HELLO) takes three
 * round trips to a node that waits for it: a silent address must not hold
 * this one for the handshake timeout. */
#define NEXT_NODE_MS 1000

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
uint32_t cv_node_hello_cap(const node *n)
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
    if (cv_node_is_last_stage(n)) {
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
    if (cv_node_is_last_stage(n) && cv_link_reserve(n->head_link, n->res_cap, err, errlen))
        return -1;
    for (int i = 0; i < 2 && !cv_node_is_last_stage(n); i++)
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
                          .max_payload = n->span_open ? n->data_cap : cv_node_hello_cap(n),
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

/* node.h's rule for a plaintext stage's next address: a head that is not
 * on this machine may not name one that reaches its loopback (a peer from
 * elsewhere would reach this machine's private ports through it); a head
 * on this machine reaches them itself. Checked on the name before any
 * connection, and with next, on the address connected to (a name that
 * resolved otherwise the second time): refused, next is closed. */
static int next_unsafe(node *n, const char *host, cv_link *next, char *err, size_t errlen)
{
    if (n->key || cv_link_peer_is_loopback(n->head_link) ||
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
    const cv_link_opts lo = cv_node_link_opts(n);
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
 * parked like any proven connection, see cv_node_park_sort), within the
 * handshake's timeout, unless a parked head takes the node meanwhile. */
static int accept_prev(node *n, char *err, size_t errlen)
{
    const int64_t deadline = cv_now_ms() + n->o->handshake_timeout_ms;
    while (cv_now_ms() < deadline) {
        cv_node_park_poll(n, GATE_POLL_MS);
        if ((n->prev = cv_node_park_sort(n, true)) != NULL) {
            n->heard = cv_now_ms();
            return answer_hello(n, n->prev, 0, 0, 0, err, errlen);
        }
        if (cv_node_takeover_due(n))
            return cv_node_yield(n, err, errlen);
    }
    cv_errf(err, errlen, "the previous node did not connect within %d ms", n->o->handshake_timeout_ms);
    cv_node_send_error(n->head_link, 0, CV_PERR_BAD_STATE, err);
    return -1;
}

/* The head's next handshake frame: the one it came parked with, else the
 * next within the handshake's timeout, unless a parked head takes the node
 * meanwhile (node.h). On failure *code is the ERROR the head is owed: a
 * frame its link refused (BAD_FRAME: header, checksum, size) or silence
 * (TIMEOUT); 0 when it has been told (a takeover). */
int cv_node_head_frame(node *n, cv_frame *f, uint32_t *code, char *err, size_t errlen)
{
    *code = 0;
    if (n->has_first) {
        *f = n->first;
        n->has_first = false;
        return 0;
    }
    const int64_t deadline = cv_now_ms() + n->o->handshake_timeout_ms;
    for (int64_t left; (left = deadline - cv_now_ms()) > 0;) {
        cv_node_park_poll(n, 0);
        cv_node_park_sort(n, false);
        if (cv_node_takeover_due(n))
            return cv_node_yield(n, err, errlen);
        const int rc = cv_link_recv(n->head_link, left < GATE_POLL_MS ? (int)left : GATE_POLL_MS, f, err, errlen);
        if (rc != CV_LINK_TIMEOUT) {
            *code = rc ? CV_PERR_BAD_FRAME : 0;
            return rc;
        }
    }
    *code = CV_PERR_TIMEOUT;
    return cv_errf(err, errlen, "%s: no handshake within %d ms", cv_link_name(n->head_link),
                   n->o->handshake_timeout_ms);
}

/* Compares the head's model (n->hello) with this node's: the metadata
 * hash, then, for an assignment, the hashes of the tensors its layers will
 * read, in order. The message goes to the head: it names the first tensor
 * that differs, never this node's path or hashes. */
int cv_node_check_model(const node *n, char *err, size_t errlen)
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
    cv_link_set_max_payload(n->prev ? n->prev : n->head_link, n->data_cap);
    if (n->prev)
        cv_link_set_max_payload(n->head_link, CV_PROTO_MIN_MAX_PAYLOAD);
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
    if (cv_node_head_frame(n, &f, &failed, err, errlen)) {
        if (failed) /* a head that left hears nothing: no complaint */
            cv_node_send_error_q(n->head_link, 0, failed, err, true);
        return -1;
    }
    if (f.h.type == CV_MSG_BYE) {
        cv_link_release(n->head_link, &f);
        return cv_errf(err, errlen, "%s said BYE during the handshake", cv_link_name(n->head_link));
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
    else if (rc == 0 && (rc = cv_node_check_model(n, err, errlen)) != 0)
        code = CV_PERR_FINGERPRINT;
    else if (rc && f.h.type == CV_MSG_HELLO && f.h.payload_len >= 2 && n->hello.proto_version != CV_PROTO_VERSION)
        code = CV_PERR_VERSION; /* the decoder read the version, and stopped there */
    cv_link_release(n->head_link, &f);
    if (!n->hashes_asked) { /* they were in the frame */
        n->hello.hashes = NULL;
        n->hello.n_hashes = 0;
    }
    if (rc)
        cv_node_send_error(n->head_link, *id, code, err);
    return rc ? -1 : 0;
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
int cv_node_handshake(node *n, char *err, size_t errlen)
{
    /* no frame of a handshake is larger, so a stranger's cannot make this
     * node hold more than its budget counts */
    cv_link_set_max_payload(n->head_link, cv_node_hello_cap(n));
    n->heard = cv_now_ms();
    for (int queries = 0;; queries++) {
        uint32_t id = 0, code = CV_PERR_BAD_STATE;
        if (next_hello(n, &id, err, errlen))
            return -1;
        const bool query = n->hello.l0 == n->hello.l1;
        uint32_t us_per_layer_token = 0;
        uint64_t layer_bytes = 0;
        if (cv_node_rate_refuses(n, &code, err, errlen) ||
            (query && queries == HANDSHAKE_QUERIES_MAX &&
             cv_errf(err, errlen, "%d queries and no assignment: the handshake ends", queries)) ||
            check_sizes(n, &code, err, errlen) ||
            (!query && n->o->cache_dir && cv_node_receive_layers(n, id, &code, err, errlen)) ||
            (!query && (assign(n, &code, &layer_bytes, err, errlen) ||
                        (n->hello.next_addr[0] && (code = CV_PERR_NEXT_NODE, connect_next(n, err, errlen)))))) {
            if (code) /* 0: the head was told (a takeover) */
                cv_node_send_error(n->head_link, id, code, err);
            return -1;
        }
        if (query && n->o->cache_dir) /* the head counts the rest from its model */
            layer_bytes = n->process_bytes;
        else if (query) {
            us_per_layer_token = speed(n);
            layer_bytes = own_bytes(n);
        }
        if (answer_hello(n, n->head_link, id, us_per_layer_token, layer_bytes, err, errlen))
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
