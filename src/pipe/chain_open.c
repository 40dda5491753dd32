/* chain_open.c: a chain's opening and closing (chain.h). Opening asks
 * every node for its offer (HELLO queries, spares in place of nodes that
 * cannot be reached), plans the layers over the offers, binds the local
 * layers, and assigns each node its layers from the last to the first
 * (each connects to the next, which must be ready), shipping them to a
 * node that receives them; then it sizes the buffers of the batches in
 * flight. Running the chain is chain.c's. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "pipe/chain_impl.h"
#include "pipe/ship.h"

cv_chain_opts cv_chain_default_opts(void)
{
    return (cv_chain_opts){.n_threads = 1, .n_slot = 1, .n_batch = 512, .act_type = CV_ACT_F32,
                           .connect_timeout_ms = 5000, .io_timeout_ms = 30000};
}

/* HELLO's pooling type (proto.h); a type the wire cannot name is none. */
static uint32_t pooling_bits(int32_t pooling)
{
    const uint32_t p = pooling >= CV_POOL_NONE && pooling <= CV_POOL_LAST ? (uint32_t)pooling : CV_POOL_NONE;
    return p << CV_FEAT_POOLING_SHIFT;
}

static cv_msg_hello base_hello(const cv_chain *c)
{
    const cv_llama_hparams *hp = &c->local.model.hp;
    cv_msg_hello h = (cv_msg_hello){
        .proto_version = CV_PROTO_VERSION, .role = CV_ROLE_HEAD, .act_type = (uint8_t)c->o.act_type,
        .features = (c->o.act_type != CV_ACT_F32 ? CV_FEAT_LOSSY_ACT : 0) | (c->o.kv_f16 ? CV_FEAT_KV_F16 : 0) |
                    (c->o.any_speed ? CV_FEAT_ANY_SPEED : 0) | pooling_bits(c->o.pooling),
        .n_layer = (uint32_t)hp->n_layer, .n_ctx = (uint32_t)c->local.kv.n_ctx, .n_slot = (uint32_t)c->o.n_slot,
        .n_batch_max = (uint32_t)c->o.n_batch, .n_embd = (uint32_t)hp->n_embd,
        .max_payload = CV_PROTO_DEFAULT_MAX_PAYLOAD, .cluster_id = c->cluster_id};
    memcpy(h.model_hash, c->hashes->meta, CV_HASH_BYTES);
    return h;
}

/* Node i's HELLO exchange; an assignment may bind layers and reach the
 * next node before it answers. */
static int hello(cv_chain *c, int i, const cv_msg_hello *h, cv_msg_hello_ok *ok, char *err, size_t errlen)
{
    return cv_hello_ask(c->link[i], h, c->o.connect_timeout_ms + c->o.io_timeout_ms, ok, err, errlen);
}

/* Binds the embeddings (a span of no layers) and names the chain: the
 * content hashes of the model (loaded here unless opts has them) and a
 * cluster id for this chain's HELLOs. */
static int bind_embeddings(cv_chain *c, const char *model_path, char *err, size_t errlen)
{
    const cv_chain_opts *o = &c->o;
    const cv_span_params sp = {.l0 = 0, .l1 = 0, .n_threads = o->n_threads, .n_ctx = o->n_ctx, .n_slot = o->n_slot,
                                .n_batch = o->n_batch};
    if (cv_span_open(&c->local, model_path, &sp, err, errlen))
        return -1;
    c->local_open = true;
    bool cached;
    char note[2 * CV_ERRLEN];
    if (!o->hashes && cv_model_hashes_load(&c->local.model.gguf, model_path, o->n_threads, &c->own_hashes, &cached,
                                           note, sizeof note, err, errlen))
        return -1;
    c->hashes = o->hashes ? o->hashes : &c->own_hashes;
    uint64_t model_id;
    memcpy(&model_id, c->hashes->meta, sizeof model_id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->cluster_id = model_id ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    return 0;
}

/* The buffers a RESULT is taken into: rows, logits rows, log-probabilities. */
static int alloc_results(cv_chain *c, char *err, size_t errlen)
{
    const size_t nb = (size_t)c->o.n_batch;
    c->rows = cv_calloc(nb, sizeof *c->rows);
    c->logits = c->o.want_logits ? cv_aligned_alloc(sizeof(float) * nb * (size_t)c->local.model.hp.n_vocab) : NULL;
    c->logprobs = cv_malloc(sizeof *c->logprobs * nb * CV_PROTO_MAX_TOP);
    c->n_logprobs = cv_calloc(nb, sizeof *c->n_logprobs);
    c->embd = cv_malloc(sizeof(float) * nb * (size_t)c->local.model.hp.n_embd);
    c->row_embd = cv_calloc(nb, 1);
    if (!c->rows || (c->o.want_logits && !c->logits) || !c->logprobs || !c->n_logprobs || !c->embd || !c->row_embd)
        return cv_errf(err, errlen, "out of memory for buffers of %d tokens", c->o.n_batch);
    return 0;
}

/* Connects to node i and asks for its memory budget and speed (a HELLO
 * with no layers). */
static int ask_node(cv_chain *c, int i, cv_msg_hello_ok *offer, char *err, size_t errlen)
{
    char host[256];
    int port;
    cv_link_opts lo = cv_link_io_opts(c->o.io_timeout_ms);
    lo.key = c->o.key;
    if (cv_parse_addr(c->addr[i], host, sizeof host, &port, err, errlen))
        return -1;
    if (!c->o.key && !c->o.insecure && !cv_host_is_loopback(host))
        return cv_errf(err, errlen, "node %s is not on this machine and the head has no --key: give the head and "
                                    "every stage --key FILE (made by `convoy keygen FILE`), or --insecure",
                       c->addr[i]);
    if (cv_link_connect(host, port, c->o.connect_timeout_ms, &lo, &c->link[i], err, errlen))
        return -1;
    const cv_msg_hello query = base_hello(c);
    if (hello(c, i, &query, offer, err, errlen) == 0)
        return 0;
    if (!c->o.key) { /* a keyed stage drops a plaintext HELLO without a word */
        const size_t n = strlen(err);
        snprintf(err + n, errlen - n, " (if the stage has --key, give the head the same key)");
    }
    return -1;
}

/* Asks node addr as node k, or else the next spares in turn (used up in
 * order): 0 when one answered, -1 (err names the last asked) when none. */
static int ask_node_or_spare(cv_chain *c, int k, const char *addr, int *next_spare, cv_msg_hello_ok *offer,
                             char *err, size_t errlen)
{
    for (;;) {
        snprintf(c->addr[k], sizeof c->addr[k], "%s", addr);
        if (c->o.avoid && !strcmp(addr, c->o.avoid))
            cv_errf(err, errlen, "node %s failed just before", addr);
        else if (ask_node(c, k, offer, err, errlen) == 0)
            return 0;
        cv_link_close(c->link[k]);
        c->link[k] = NULL;
        if (*next_spare >= c->o.n_spares)
            return -1;
        addr = c->o.spares[(*next_spare)++];
    }
}

/* Connects to the nodes and asks each for its memory budget and speed
 * (spares replace the unreachable, which may be dropped, see chain.h);
 * a first node "local" is this machine, which measures its own. */
static int connect_and_ask(cv_chain *c, cv_msg_hello_ok *offer, char *err, size_t errlen)
{
    int next_spare = 0;
    for (int i = 0; i < c->o.n_nodes; i++) {
        const int k = c->n_nodes;
        if (strcmp(c->o.nodes[i], CV_CHAIN_LOCAL)) {
            if (ask_node_or_spare(c, k, c->o.nodes[i], &next_spare, &offer[k], err, errlen) == 0)
                c->n_nodes++;
            else if (!c->o.drop_unreachable || c->o.split)
                return -1;
            continue;
        }
        if (i > 0)
            return cv_errf(err, errlen, "\"%s\" can only be the first node of a chain", CV_CHAIN_LOCAL);
        snprintf(c->addr[k], sizeof c->addr[k], "%s", CV_CHAIN_LOCAL);
        c->local_node = true;
        const bool known = c->o.any_speed && c->o.local_speed_us;
        offer[k] = (cv_msg_hello_ok){.mem_budget = c->o.local_mem_budget,
                                     .us_per_layer_token = known ? c->o.local_speed_us
                                                                 : cv_span_speed_probe(&c->local.model, c->o.n_threads),
                                     .held_l0 = 0, .held_l1 = (uint32_t)c->local.model.hp.n_layer};
        c->n_nodes++;
    }
    return 0;
}

/* A node's own bytes as it answered (a receiving node's counted from this
 * model, plan.h); this machine's as it counts them. */
static uint64_t own_bytes(const cv_llama *m, const cv_plan_session *s, bool remote, const cv_msg_hello_ok *offer,
                          int32_t n_threads)
{
    if (!remote)
        return cv_plan_own_bytes(m, s, CV_PLAN_LOCAL, n_threads, 0);
    if (offer->flags & CV_HOK_RECEIVES)
        return cv_plan_received_bytes(m, s, (int32_t)offer->n_threads, offer->layer_bytes, true);
    return offer->layer_bytes;
}

/* Each stage's work, by which its measured times are divided (costs.h). */
static void measure_stages(cv_chain *c)
{
    cv_costs_init(&c->costs, cv_chain_stages(c));
    for (int s = 0; s < c->costs.n_stages; s++) {
        const int i = cv_chain_stage_node(c, s);
        c->work[s] = cv_plan_stage_work(&c->pm, c->plan.first[i], c->plan.last[i]);
    }
}

/* Plans the layers over the nodes' offers (opts->split overrides) and
 * lists the nodes that serve some. */
static int plan(cv_chain *c, const cv_msg_hello_ok *offer, char *err, size_t errlen)
{
    const cv_llama *m = &c->local.model;
    c->layer_bytes = cv_malloc(sizeof(uint64_t) * (size_t)m->hp.n_layer);
    if (!c->layer_bytes)
        return cv_errf(err, errlen, "out of memory");
    const cv_plan_session s = {.n_ctx = c->local.kv.n_ctx, .n_slot = c->o.n_slot, .n_batch = c->o.n_batch,
                               .kv_f16 = c->o.kv_f16, .act_type = (uint32_t)c->o.act_type};
    cv_plan_model_of(m, &s, c->layer_bytes, &c->pm);
    cv_plan_node *nodes = c->plan_node;
    for (int i = 0; i < c->n_nodes; i++)
        nodes[i] = (cv_plan_node){.name = c->link[i] ? c->addr[i] : "this machine",
                                  .mem_budget = offer[i].mem_budget ? offer[i].mem_budget : UINT64_MAX,
                                  .us_per_layer_token = offer[i].us_per_layer_token,
                                  .own_bytes = own_bytes(m, &s, c->link[i] != NULL, &offer[i], c->o.n_threads),
                                  .held_l0 = (int32_t)offer[i].held_l0, .held_l1 = (int32_t)offer[i].held_l1,
                                  .local = c->link[i] == NULL};
    if (cv_plan_layers(&c->pm, c->n_nodes, nodes, c->o.split, c->o.streams, &c->plan, err, errlen))
        return -1;
    for (int i = 0; i < c->n_nodes; i++)
        c->expert_slots[i] = cv_plan_expert_slots(&c->pm, &nodes[i], c->plan.first[i], c->plan.last[i]);
    c->n_active = 0;
    for (int i = c->local_node ? 1 : 0; i < c->n_nodes; i++)
        if (c->plan.last[i] > c->plan.first[i])
            c->active[c->n_active++] = i;
    if (c->n_active == 0)
        return cv_errf(err, errlen, "the plan leaves every layer to this machine: run without remote nodes");
    return 0;
}

/* Binds the local node's layers [0, n_local) in place of the embeddings'
 * span (the plan kept them within its budget, counting the embeddings). */
static int bind_local_span(cv_chain *c, const char *model_path, char *err, size_t errlen)
{
    const cv_chain_opts *o = &c->o;
    c->n_local = c->local_node ? c->plan.last[0] : 0;
    if (c->n_local == 0)
        return 0;
    cv_span_close(&c->local);
    c->local_open = false;
    const cv_span_params lp = {.l0 = 0, .l1 = c->n_local, .n_threads = o->n_threads, .n_ctx = o->n_ctx,
                                .n_slot = o->n_slot, .n_batch = o->n_batch, .kv_f16 = o->kv_f16,
                                .mlock = o->mlock, .expert_slots = c->expert_slots[0]};
    if (cv_span_open(&c->local, model_path, &lp, err, errlen))
        return -1;
    c->local_open = true;
    return 0;
}

/* Puts into h the content hashes of the tensors its layers [l0, l1) read,
 * in HELLO's order, from *buf (cv_malloc'ed; the caller frees it). */
static int span_hashes(const cv_chain *c, cv_msg_hello *h, uint8_t **buf, char *err, size_t errlen)
{
    uint64_t *idx = cv_malloc(sizeof *idx * cv_llama_span_tensors_max(h->l1 - h->l0));
    const size_t n = idx ? cv_llama_span_tensors(&c->local.model, (int32_t)h->l0, (int32_t)h->l1, idx) : 0;
    *buf = idx ? cv_malloc(n ? n * CV_HASH_BYTES : 1) : NULL;
    if (!*buf) {
        cv_free(idx);
        return cv_errf(err, errlen, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        memcpy(*buf + i * CV_HASH_BYTES, c->hashes->tensor[idx[i]], CV_HASH_BYTES);
    cv_free(idx);
    h->n_hashes = (uint32_t)n;
    h->hashes = *buf;
    return 0;
}

static void chain_log(const cv_chain *c, const char *fmt, ...) CV_PRINTF(2, 3);
void cv_chain_vlog(void (*log)(void *user, const char *line), void *user, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    if (log)
        log(user, line);
    else
        fprintf(stderr, "convoy: %s\n", line);
}

static void chain_log(const cv_chain *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cv_chain_vlog(c->o.log, c->o.log_user, fmt, ap);
    va_end(ap);
}

/* What a shipment's progress note needs. */
typedef struct shipment {
    const cv_chain *c;
    const char *addr;
    uint32_t l0, l1;
} shipment;

static void note_shipping(void *user, const cv_ship_progress *p)
{
    const shipment *s = user;
    char line[256];
    cv_ship_describe(p, line, sizeof line);
    chain_log(s->c, "%s layers [%u, %u) to node %s: %s", p->finished ? "shipped" : "shipping", s->l0, s->l1, s->addr,
              line);
}

/* Node i's assignment h: it answers HELLO_OK, or, a receiving node that
 * lacks the layers, FETCH, and the head ships them (ship.h) before it
 * answers again. */
static int assign_node(cv_chain *c, int i, const cv_msg_hello *h, char *err, size_t errlen)
{
    const int timeout = c->o.connect_timeout_ms + c->o.io_timeout_ms;
    cv_msg_hello_ok ok;
    uint64_t have;
    int rc = cv_hello_send(c->link[i], h, err, errlen);
    for (int fetches = 0; rc == 0; fetches++) {
        rc = cv_hello_answer(c->link[i], timeout, &ok, &have, err, errlen);
        if (rc != CV_HELLO_FETCH)
            break;
        shipment s = {.c = c, .addr = c->addr[i], .l0 = h->l0, .l1 = h->l1};
        rc = fetches < 2 ? cv_ship_send(c->link[i], 0, &c->local.model, (int32_t)h->l0, (int32_t)h->l1, have,
                                        note_shipping, &s, err, errlen)
                         : cv_errf(err, errlen, "node %s: asked for layers [%u, %u) a third time", c->addr[i],
                                   h->l0, h->l1);
    }
    return rc;
}

/* Assigns the serving nodes their layers from the last to the first, so
 * each node finds its successor ready when it connects to it; then lets
 * the nodes the plan left out go. */
static int assign_from_last(cv_chain *c, char *err, size_t errlen)
{
    for (int k = c->n_active - 1; k >= 0; k--) {
        const int i = c->active[k];
        cv_msg_hello h = base_hello(c);
        h.l0 = (uint32_t)c->plan.first[i];
        h.l1 = (uint32_t)c->plan.last[i];
        if (k + 1 < c->n_active)
            snprintf(h.next_addr, sizeof h.next_addr, "%s", c->addr[c->active[k + 1]]);
        if (k > 0)
            h.features |= CV_FEAT_FROM_PREV;
        uint8_t *hashes;
        if (span_hashes(c, &h, &hashes, err, errlen))
            return -1;
        const int rc = assign_node(c, i, &h, err, errlen);
        cv_free(hashes);
        if (rc)
            return -1;
    }
    for (int i = 0; i < c->n_nodes; i++)
        if (c->link[i] && c->plan.last[i] == c->plan.first[i]) {
            cv_link_send(c->link[i], CV_MSG_BYE, 0, NULL, 0, err, errlen);
            cv_link_close(c->link[i]);
            c->link[i] = NULL;
        }
    return 0;
}

/* One set of FORWARD buffers per batch that can be in flight: one per
 * stage, local included. */
static int alloc_flights(cv_chain *c, char *err, size_t errlen)
{
    c->depth = cv_chain_stages(c);
    if (c->o.min_depth > c->depth)
        c->depth = c->o.min_depth < CV_CHAIN_MAX_NODES ? c->o.min_depth : CV_CHAIN_MAX_NODES;
    for (int k = 0; k < c->depth; k++)
        if (cv_fwd_out_alloc(&c->flight[k].out, (size_t)c->o.n_batch, (size_t)c->local.model.hp.n_embd, err,
                             errlen))
            return -1;
    const cv_msg_forward largest = {.n_tokens = (uint32_t)c->o.n_batch, .n_embd = (uint32_t)c->local.model.hp.n_embd,
                                    .act_type = (uint8_t)c->o.act_type, .flags = CV_FWD_HAS_HIDDEN};
    return cv_link_reserve(cv_chain_first_link(c), cv_msg_forward_size(&largest), err, errlen);
}

/* The inbox that gathers the serving nodes' frames. */
static int gather_frames(cv_chain *c, char *err, size_t errlen)
{
    cv_inbox_init(&c->inbox);
    for (int k = 0; k < c->n_active; k++)
        if (cv_inbox_add(&c->inbox, c->link[c->active[k]], c->active[k], err, errlen))
            return -1;
    return 0;
}

int cv_chain_open(cv_chain **out, const char *model_path, const cv_chain_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    if (o->n_nodes < 1 || o->n_nodes > CV_CHAIN_MAX_NODES)
        return cv_errf(err, errlen, "a chain has 1 to %d nodes, not %d", CV_CHAIN_MAX_NODES, o->n_nodes);
    cv_chain *c = cv_calloc(1, sizeof *c);
    if (!c)
        return cv_errf(err, errlen, "out of memory");
    c->o = *o;
    c->suspect = -1;
    cv_msg_hello_ok *offer = c->offer;
    if (bind_embeddings(c, model_path, err, errlen) || alloc_results(c, err, errlen) ||
        connect_and_ask(c, offer, err, errlen) || plan(c, offer, err, errlen) ||
        bind_local_span(c, model_path, err, errlen) || assign_from_last(c, err, errlen) ||
        alloc_flights(c, err, errlen) || gather_frames(c, err, errlen)) {
        cv_chain_close(c);
        return -1;
    }
    measure_stages(c);
    *out = c;
    return 0;
}

void cv_chain_close(cv_chain *c)
{
    if (!c)
        return;
    char err[CV_ERRLEN];
    for (int i = 0; i < c->n_nodes; i++)
        if (c->link[i]) {
            if (!c->broken)
                cv_link_send(c->link[i], CV_MSG_BYE, 0, NULL, 0, err, sizeof err);
            cv_link_close(c->link[i]);
        }
    if (c->local_open)
        cv_span_close(&c->local);
    for (int k = 0; k < c->depth; k++)
        cv_fwd_out_free(&c->flight[k].out);
    cv_free(c->rows);
    cv_free_aligned(c->logits);
    cv_free(c->embd);
    cv_free(c->row_embd);
    cv_free(c->logprobs);
    cv_free(c->n_logprobs);
    cv_model_hashes_free(&c->own_hashes);
    cv_free(c->layer_bytes);
    cv_free(c);
}
