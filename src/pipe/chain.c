/* chain.c: the head's side of a pipeline (see chain.h).
 *
 * The head holds a stage with the embeddings and, when the first node is
 * "local", the first layers too (this machine then serves a stage like the
 * others, without a hop to reach it); a link to every remote node and an
 * inbox that gathers their frames. A step runs the local stage, sends one
 * FORWARD to the first remote node and takes one RESULT back from the
 * last; meanwhile an ERROR or a closed link from any node ends the step
 * with that node's name. Buffers are sized at open for the batch, so a
 * step allocates nothing; that includes the log-probabilities of the last
 * RESULT, kept per wanted row until the next one. */
#include "pipe/chain.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "infer/span.h"
#include "model/fingerprint.h"
#include "pipe/costs.h"
#include "pipe/inbox.h"
#include "pipe/plan.h"
#include "pipe/proto.h"
#include "pipe/ship.h"
#include "pipe/wire.h"

struct cv_chain {
    cv_chain_opts o;
    cv_span local;                 /* token embeddings and the local layers [0, n_local) */
    bool local_open;
    bool local_node;               /* node 0 is this machine (no link) */
    int32_t n_local;               /* layers node 0 runs here (0 without a local node) */
    const cv_model_hashes *hashes; /* the model's content hashes: opts->hashes or own_hashes */
    cv_model_hashes own_hashes;
    uint64_t cluster_id;           /* the same in every HELLO of this chain */
    int n_nodes;                   /* nodes given */
    cv_link *link[CV_CHAIN_MAX_NODES];
    char addr[CV_CHAIN_MAX_NODES][CV_PROTO_ADDR_MAX + 1];
    cv_plan_result plan;           /* each node's layers [first, last), and the plan's predicted times */
    uint64_t *layer_bytes;         /* [n_layer] pm's */
    cv_plan_model pm;              /* the model as the plan counts it, kept to plan again (cv_chain_replan) */
    cv_plan_node plan_node[CV_CHAIN_MAX_NODES]; /* each node as planned: budget, probed speed, own bytes */
    double work[CV_TRAIL_MAX];     /* each stage's work per token (cv_plan_stage_work) */
    cv_costs costs;                /* measured, per stage */
    int32_t expert_slots[CV_CHAIN_MAX_NODES]; /* a mixture of experts' cache slots on each node (plan.h) */
    cv_msg_hello_ok offer[CV_CHAIN_MAX_NODES]; /* each node's answer: memory budget and speed */
    int active[CV_CHAIN_MAX_NODES]; /* indices of the nodes that serve layers, in order */
    int n_active;
    cv_inbox inbox;
    bool broken;
    bool result_waited; /* the last collect's result had not come when it was asked for */
    int suspect;                   /* the node a failure is blamed on, or -1 */
    uint32_t next_id;
    /* batches in flight, oldest first in a ring of `depth` */
    int depth;
    int oldest, in_flight;
    struct flight {
        uint32_t id;
        int64_t sent_ns;
        bool alone;                /* no other batch was in flight when it was sent */
        uint32_t local_us;         /* the local layers' time, the trail's first */
        int32_t n_tokens;
        int32_t n_want;
        cv_fwd_out out;            /* the local layers' output and its FORWARD */
    } flight[CV_CHAIN_MAX_NODES];
    cv_result_row *rows;           /* [n_batch] */
    float *logits;                 /* [n_batch][n_vocab] with want_logits */
    float *embd;                   /* [n_batch][n_embd] the embeddings of the last collect's rows */
    uint8_t *row_embd;             /* [n_batch] whether wanted row i of the last collect is an embedding */
    int32_t n_want;                /* wanted rows of the last collect */
    cv_logprob *logprobs;          /* [n_batch][CV_PROTO_MAX_TOP] its wanted rows' log-probabilities */
    uint16_t *n_logprobs;          /* [n_batch] entries of each, 0 for none */
    uint64_t forward_bytes;        /* FORWARD frames sent by the head */
    uint64_t result_bytes;         /* RESULT frames received */
};

cv_chain_opts cv_chain_default_opts(void)
{
    return (cv_chain_opts){.n_threads = 1, .n_slot = 1, .n_batch = 512, .act_type = CV_ACT_F32,
                           .connect_timeout_ms = 5000, .io_timeout_ms = 30000};
}

/* Marks the chain unusable after a failure whose message is in err. */
static int broken(cv_chain *c)
{
    c->broken = true;
    return -1;
}

/* The same, blaming node i. */
static int broken_by(cv_chain *c, int i)
{
    c->suspect = i;
    return broken(c);
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
    cv_msg_hello h = (cv_msg_hello){.proto_version = CV_PROTO_VERSION, .role = CV_ROLE_HEAD, .act_type = (uint8_t)c->o.act_type,
                          .features = (c->o.act_type != CV_ACT_F32 ? CV_FEAT_LOSSY_ACT : 0) |
                                      (c->o.kv_f16 ? CV_FEAT_KV_F16 : 0) | (c->o.any_speed ? CV_FEAT_ANY_SPEED : 0) |
                                      pooling_bits(c->o.pooling),
                          .n_layer = (uint32_t)hp->n_layer,
                          .n_ctx = (uint32_t)c->local.kv.n_ctx, .n_slot = (uint32_t)c->o.n_slot,
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

/* The node that runs stage s (the local one first when it has layers). */
static int stage_node(const cv_chain *c, int s)
{
    const bool local = c->local_node && c->plan.last[0] > 0;
    return local && s == 0 ? 0 : c->active[s - (local ? 1 : 0)];
}

/* Each stage's work, by which its measured times are divided (costs.h). */
static void measure_stages(cv_chain *c)
{
    cv_costs_init(&c->costs, cv_chain_stages(c));
    for (int s = 0; s < c->costs.n_stages; s++) {
        const int i = stage_node(c, s);
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
static void chain_log(const cv_chain *c, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->o.log)
        c->o.log(c->o.log_user, line);
    else
        fprintf(stderr, "convoy: %s\n", line);
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

static cv_link *first_link(const cv_chain *c) { return c->link[c->active[0]]; }

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
    return cv_link_reserve(first_link(c), cv_msg_forward_size(&largest), err, errlen);
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


/* After node `reporter` reported a failure, looks briefly for a link that
 * died: a node that lost its neighbour reports it at once, but the
 * neighbour that died is the cause and is named first. A node that
 * reported an error may end its session after it, so the end of its own
 * link is not the cause. Returns the node to blame. */
static int blame_dead_link(cv_chain *c, int reporter, char *err, size_t errlen)
{
    char first[CV_ERRLEN];
    snprintf(first, sizeof first, "%s", err);
    bool reported[CV_CHAIN_MAX_NODES] = {false};
    reported[reporter] = true;
    cv_inbox_event ev;
    while (cv_inbox_next(&c->inbox, 300, &ev) == 0) {
        if (!ev.ok && !reported[ev.source]) {
            snprintf(err, errlen, "%s (then %s)", ev.err, first);
            return ev.source;
        }
        if (ev.ok) {
            reported[ev.source] |= ev.frame.h.type == CV_MSG_ERROR;
            cv_link_release(c->link[ev.source], &ev.frame);
        }
    }
    return reporter;
}

/* Keeps RESULT row r (its token, logits row and log-probabilities, or
 * its embedding, the k-th of the RESULT: *k counts them) as wanted row i. */
static int keep_row(cv_chain *c, const cv_msg_result *m, uint32_t r, int32_t i, uint32_t *k, int32_t *tokens,
                    char *err, size_t errlen)
{
    const cv_result_row *row = &c->rows[r];
    c->row_embd[i] = row->kind == CV_ROW_EMBD;
    if (row->kind == CV_ROW_EMBD) {
        const size_t ne = (size_t)c->local.model.hp.n_embd;
        if (m->n_embd != ne)
            return cv_errf(err, errlen, "an embedding of %u floats, the model's width is %zu", m->n_embd, ne);
        memcpy(c->embd + (size_t)i * ne, m->embd + (size_t)(*k)++ * ne, sizeof(float) * ne);
    }
    if (row->n_top && row->top[0].id != row->token)
        return cv_errf(err, errlen, "the log-probabilities of slot %d position %d begin with id %d, not its token %d",
                       row->seq, row->pos, row->top[0].id, row->token);
    if (c->o.want_logits)
        memcpy(c->logits + (size_t)i * m->n_vocab, m->logits + (size_t)r * m->n_vocab, sizeof(float) * m->n_vocab);
    if (row->n_top)
        memcpy(c->logprobs + (size_t)i * CV_PROTO_MAX_TOP, row->top, sizeof *c->logprobs * row->n_top);
    c->n_logprobs[i] = row->n_top;
    tokens[i] = row->token;
    return 0;
}

/* Whether a batch sent after the oldest in flight holds slot seq (a
 * window in flight behind it). */
static bool later_flight_has(const cv_chain *c, int32_t seq)
{
    for (int k = 1; k < c->in_flight; k++) {
        const struct flight *f = &c->flight[(c->oldest + k) % c->depth];
        const cv_fwd_token *rec = cv_fwd_out_records(&f->out);
        for (int32_t t = 0; t < f->n_tokens; t++)
            if (rec[t].seq == seq)
                return true;
    }
    return false;
}

/* Spreads the RESULT rows (and their logits rows and log-probabilities)
 * over the flight's wanted records: a record whose row was left out (after
 * a rejected draft, or of a stale window) gets -1, zero logits (as on one
 * machine) and no log-probabilities, and its slot is cut back here after
 * the last emitted row, as every node cuts it back when the next FORWARD
 * comes; not when a later batch in flight holds the slot, whose rows here
 * are newer than the cut. */
static int spread_rows(cv_chain *c, const struct flight *f, const cv_msg_result *m, int32_t *tokens, char *err,
                       size_t errlen)
{
    const cv_fwd_token *rec = cv_fwd_out_records(&f->out);
    uint32_t r = 0, k = 0;
    int32_t i = 0;
    for (int32_t t = 0; t < f->n_tokens; t++) {
        if (!cv_want_output(rec[t].want))
            continue;
        if (r < m->n_rows && c->rows[r].seq == rec[t].seq && c->rows[r].pos == rec[t].pos &&
            (c->rows[r].kind == CV_ROW_EMBD) == (rec[t].want == CV_WANT_EMBED)) {
            if (keep_row(c, m, r++, i++, &k, tokens, err, errlen))
                return -1;
            continue;
        }
        if (rec[t].want != CV_WANT_DRAFT)
            return cv_errf(err, errlen, "result has no row for slot %d position %d", rec[t].seq, rec[t].pos);
        if (c->o.want_logits)
            memset(c->logits + (size_t)i * m->n_vocab, 0, sizeof(float) * m->n_vocab);
        c->n_logprobs[i] = 0;
        c->row_embd[i] = 0;
        tokens[i++] = -1;
        if (!later_flight_has(c, rec[t].seq))
            cv_span_seq_truncate(&c->local, rec[t].seq, rec[t].pos);
    }
    if (r != m->n_rows)
        return cv_errf(err, errlen, "result of %u rows does not match the %d wanted tokens", m->n_rows, i);
    c->n_want = i;
    return 0;
}

enum { SILENCE_PROBE_MS = 500 };
static int ping_all(cv_chain *c, int wait_ms, char *err, size_t errlen);

/* Waits for the RESULT of flight fl. The timeout counts silence, not
 * work: any frame from a node, a working node's pulse included (proto.h),
 * starts it again; when the chain falls silent, the node that does not
 * answer a PING is named, or else the node whose pulse came last (it
 * stopped while working), or the last node. */
static int await_result(cv_chain *c, const struct flight *fl, int32_t *tokens, char *err, size_t errlen)
{
    const uint32_t id = fl->id;
    const int last = c->active[c->n_active - 1];
    int64_t heard = cv_now_ms();
    int pulsed = -1;
    bool first_look = true; /* a look without waiting tells whether the result is here already */
    for (;;) {
        const int64_t silent = cv_now_ms() - heard;
        if (silent >= c->o.io_timeout_ms) {
            /* the nodes around a stopped one are idle and answer at once */
            char why[CV_ERRLEN];
            if (ping_all(c, SILENCE_PROBE_MS, why, sizeof why) == 0)
                c->suspect = pulsed >= 0 ? pulsed : last;
            cv_errf(err, errlen, "node %s: no result and no sign of work for %d ms", c->addr[c->suspect],
                    c->o.io_timeout_ms);
            return broken(c);
        }
        cv_inbox_event ev;
        const int got = cv_inbox_next(&c->inbox, first_look ? 0 : (int)(c->o.io_timeout_ms - silent), &ev);
        if (first_look)
            c->result_waited = got == CV_LINK_TIMEOUT;
        first_look = false;
        if (got == CV_LINK_TIMEOUT)
            continue;
        heard = cv_now_ms();
        if (ev.ok && ev.frame.h.type == CV_MSG_PONG && ev.frame.h.id == 0)
            pulsed = ev.source;
        if (!ev.ok) {
            snprintf(err, errlen, "%s", ev.err);
            return broken_by(c, ev.source);
        }
        cv_link *l = c->link[ev.source];
        const cv_frame *f = &ev.frame;
        int rc = 1; /* 1: keep waiting */
        char why[CV_ERRLEN];
        if (f->h.type == CV_MSG_ERROR) {
            cv_error_frame_text(l, f, err, errlen);
            cv_link_release(l, &ev.frame);
            return broken_by(c, blame_dead_link(c, ev.source, err, errlen));
        }
        if (f->h.type == CV_MSG_RESULT && ev.source == last && f->h.id == id) {
            cv_msg_result m;
            if (cv_msg_result_decode(f->payload, f->h.payload_len, &m, c->rows, (uint32_t)c->o.n_batch, err, errlen)) {
                rc = -1;
            } else if (c->o.want_logits &&
                       (!(m.flags & CV_RES_HAS_LOGITS) || m.n_vocab != (uint32_t)c->local.model.hp.n_vocab)) {
                rc = cv_errf(err, errlen, "%s: result without the logits rows of %d ids asked for", cv_link_name(l),
                             c->local.model.hp.n_vocab);
            } else if (spread_rows(c, fl, &m, tokens, why, sizeof why)) {
                rc = cv_errf(err, errlen, "%s: %s", cv_link_name(l), why);
            } else if (m.n_trail != (uint32_t)c->costs.n_stages) {
                rc = cv_errf(err, errlen, "%s: result with the times of %u stages, the chain has %d", cv_link_name(l),
                             m.n_trail, c->costs.n_stages);
            } else {
                c->result_bytes += CV_FRAME_HEADER_SIZE + f->h.payload_len;
                const int64_t now = (int64_t)cv_now_ns();
                cv_costs_add(&c->costs, m.trail, c->work, fl->n_tokens, fl->alone ? now - fl->sent_ns : -1,
                             c->n_active + 1, now);
                rc = 0;
            }
        } else if (f->h.type != CV_MSG_PONG) {
            rc = cv_errf(err, errlen, "%s: unexpected %s", cv_link_name(l), cv_msg_type_name(f->h.type));
        }
        cv_link_release(l, &ev.frame);
        if (rc < 0)
            return broken_by(c, ev.source);
        if (rc == 0)
            return 0;
    }
}

int cv_chain_depth(const cv_chain *c) { return c->depth; }

int cv_chain_stages(const cv_chain *c) { return c->n_active + (c->n_local > 0); }

bool cv_chain_result_waited(const cv_chain *c) { return c->result_waited; }

uint32_t cv_chain_stage_us(const cv_chain *c)
{
    uint64_t most = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        const uint64_t us = (uint64_t)c->offer[i].us_per_layer_token * (uint64_t)(c->plan.last[i] - c->plan.first[i]);
        most = us > most ? us : most;
    }
    return most > UINT32_MAX ? UINT32_MAX : (uint32_t)most;
}
uint32_t cv_chain_local_speed(const cv_chain *c) { return c->local_node ? c->offer[0].us_per_layer_token : 0; }
bool cv_chain_is_broken(const cv_chain *c) { return c->broken; }
const char *cv_chain_suspect(const cv_chain *c) { return c->broken && c->suspect >= 0 ? c->addr[c->suspect] : NULL; }

/* " (experts: all 96 in memory)" or " (experts paged: 40 slots for 96)"
 * for node i of a mixture of experts, else nothing. */
static void describe_experts(const cv_chain *c, int i, char *buf, size_t len)
{
    const int32_t all = (c->plan.last[i] - c->plan.first[i]) * c->local.model.hp.n_expert;
    buf[0] = 0;
    if (all > 0 && c->expert_slots[i] >= all)
        snprintf(buf, len, " (experts: all %d in memory)", all);
    else if (all > 0)
        snprintf(buf, len, " (experts paged: %d slots for %d)", c->expert_slots[i], all);
}

/* "; a token in 2.10 ms predicted (4.30 ms sharing by speed alone); left
 * out: 10.0.0.3:7000" as far as the plan tells. */
static void describe_forecast(const cv_chain *c, char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = 0;
    if (c->plan.us_token > 0)
        at += (size_t)snprintf(buf, len, "; a token in %.2f ms predicted", c->plan.us_token / 1e3);
    if (c->plan.us_shared > c->plan.us_token && at < len)
        at += (size_t)snprintf(buf + at, len - at, " (%.2f ms sharing by speed alone)", c->plan.us_shared / 1e3);
    for (int i = c->local_node ? 1 : 0, n = 0; i < c->n_nodes && at < len; i++)
        if (c->plan.last[i] == c->plan.first[i])
            at += (size_t)snprintf(buf + at, len - at, "%s%s", n++ ? ", " : "; left out: ", c->addr[i]);
}

void cv_chain_describe(const cv_chain *c, char *buf, size_t len)
{
    size_t at = 0;
    char experts[64];
    buf[0] = 0;
    if (c->n_local) {
        describe_experts(c, 0, experts, sizeof experts);
        at = (size_t)snprintf(buf, len, "layers [0, %d) here%s", c->n_local, experts);
    }
    for (int k = 0; k < c->n_active && at < len; k++) {
        const int i = c->active[k];
        describe_experts(c, i, experts, sizeof experts);
        at += (size_t)snprintf(buf + at, len - at, "%s[%d, %d) on %s%s", at ? ", " : "layers ", c->plan.first[i],
                               c->plan.last[i], c->addr[i], experts);
    }
    describe_forecast(c, buf + at, at < len ? len - at : 0);
}
void cv_chain_describe_nodes(const cv_chain *c, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n_nodes && at < len; i++) {
        const cv_msg_hello_ok *o = &c->offer[i];
        char speed[64] = "speed not measured", budget[64] = "no memory limit";
        if (o->us_per_layer_token)
            snprintf(speed, sizeof speed, "%u us per layer and token", o->us_per_layer_token);
        if (o->mem_budget)
            snprintf(budget, sizeof budget, "budget %.2f GB", o->mem_budget / 1e9);
        at += (size_t)snprintf(buf + at, len - at, "%s%s: %s, %s%s", at ? "; " : "",
                               i == 0 && c->local_node ? "here" : c->addr[i], budget, speed,
                               o->flags & CV_HOK_RECEIVES ? ", receives its layers" : "");
    }
}

int cv_chain_in_flight(const cv_chain *c) { return c->in_flight; }

int cv_chain_submit(cv_chain *c, const cv_batch *b, char *err, size_t errlen)
{
    if (c->broken)
        return cv_errf(err, errlen, "the chain failed earlier and must be reopened");
    if (c->in_flight == c->depth)
        return cv_errf(err, errlen, "%d batches are in flight already, the chain's depth", c->depth);
    struct flight *f = &c->flight[(c->oldest + c->in_flight) % c->depth];
    if (cv_fwd_out_reclaim(&f->out, first_link(c), err, errlen)) /* its buffers may still be on their way out */
        return broken_by(c, c->active[0]);
    const uint64_t t0 = cv_now_ns();
    if (cv_span_step(&c->local, b, NULL, f->out.hidden, NULL, err, errlen))
        return -1;
    f->local_us = (uint32_t)((cv_now_ns() - t0) / 1000);
    cv_fwd_token *rec = cv_fwd_out_records(&f->out);
    f->n_want = 0;
    f->n_tokens = b->n_tokens;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        rec[t] = (cv_fwd_token){.token = b->token[t], .seq = b->seq[t], .pos = b->pos[t], .want = b->want[t]};
        f->n_want += cv_want_output(rec[t].want);
    }
    cv_msg_forward m = {.n_tokens = (uint32_t)b->n_tokens, .n_embd = (uint32_t)c->local.model.hp.n_embd,
                        .act_type = (uint8_t)c->o.act_type, .flags = c->o.want_logits ? CV_FWD_WANT_LOGITS : 0,
                        .tokens = rec, .n_trail = c->n_local > 0, .trail = {f->local_us}};
    uint64_t bytes;
    f->id = ++c->next_id;
    f->sent_ns = (int64_t)cv_now_ns();
    f->alone = c->in_flight == 0;
    if (cv_fwd_out_send(&f->out, first_link(c), f->id, &m, &bytes, err, errlen))
        return broken_by(c, c->active[0]); /* the local layers have taken the batch */
    c->forward_bytes += bytes;
    c->in_flight++;
    return 0;
}

int cv_chain_collect(cv_chain *c, int32_t *tokens, int32_t *n_tokens, char *err, size_t errlen)
{
    if (c->in_flight == 0)
        return cv_errf(err, errlen, "no batch in flight");
    struct flight *f = &c->flight[c->oldest];
    if (await_result(c, f, tokens, err, errlen))
        return -1;
    *n_tokens = f->n_want;
    c->oldest = (c->oldest + 1) % c->depth;
    c->in_flight--;
    return 0;
}

int cv_chain_step(cv_chain *c, const cv_batch *b, int32_t *tokens, char *err, size_t errlen)
{
    int32_t n;
    if (c->in_flight)
        return cv_errf(err, errlen, "a step needs the chain idle, %d batches are in flight", c->in_flight);
    return cv_chain_submit(c, b, err, errlen) || cv_chain_collect(c, tokens, &n, err, errlen) ? -1 : 0;
}

const float *cv_chain_logits(const cv_chain *c, int32_t i)
{
    return c->logits ? c->logits + (size_t)i * (size_t)c->local.model.hp.n_vocab : NULL;
}

const float *cv_chain_embedding(const cv_chain *c, int32_t i)
{
    if (i < 0 || i >= c->n_want || !c->row_embd[i])
        return NULL;
    return c->embd + (size_t)i * (size_t)c->local.model.hp.n_embd;
}

static int seq_op(cv_chain *c, const cv_msg_seq_op *op, char *err, size_t errlen)
{
    if (c->broken)
        return cv_errf(err, errlen, "the chain failed earlier and must be reopened");
    if (op->seq < 0 || op->seq >= c->o.n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", op->seq, c->o.n_slot);
    uint8_t small[CV_SEQ_OP_SAMPLER_SIZE]; /* a grammar's op is larger: allocated (request setup) */
    const size_t size = cv_msg_seq_op_size(op);
    uint8_t *buf = size <= sizeof small ? small : cv_malloc(size);
    if (!buf)
        return cv_errf(err, errlen, "out of memory for a SEQ_OP of %zu bytes", size);
    size_t len;
    int rc = cv_msg_seq_op_encode(op, buf, size, &len, err, errlen);
    if (!rc && cv_link_send(first_link(c), CV_MSG_SEQ_OP, ++c->next_id, buf, len, err, errlen))
        rc = broken_by(c, c->active[0]);
    if (buf != small)
        cv_free(buf);
    return rc;
}

int cv_chain_set_sampler(cv_chain *c, int32_t seq, const cv_sampler_params *p, int32_t n_logprobs, char *err,
                         size_t errlen)
{
    if (n_logprobs < -1 || n_logprobs > CV_MAX_TOP_LOGPROBS)
        return cv_errf(err, errlen, "%d log-probabilities asked, at most %d", n_logprobs, CV_MAX_TOP_LOGPROBS);
    /* the wire counts the sampled token's entry too, so -1 (none) is 0 */
    const cv_msg_seq_op op = {.op = CV_SEQ_SET_SAMPLER, .seq = seq, .sampler = *p,
                              .n_probs = (uint32_t)(n_logprobs + 1)};
    return seq_op(c, &op, err, errlen);
}

int cv_chain_set_grammar(cv_chain *c, int32_t seq, const char *text, size_t len, int32_t from, char *err,
                         size_t errlen)
{
    if (len > CV_PROTO_MAX_GRAMMAR)
        return cv_errf(err, errlen, "the grammar has %zu bytes, at most %u are taken", len, CV_PROTO_MAX_GRAMMAR);
    const cv_msg_seq_op op = {.op = CV_SEQ_SET_GRAMMAR, .seq = seq, .len = from, .grammar = text,
                              .grammar_len = (uint32_t)len};
    return seq_op(c, &op, err, errlen);
}

int cv_chain_logprobs(const cv_chain *c, int32_t i, cv_logprob *out)
{
    if (i < 0 || i >= c->n_want)
        return 0;
    memcpy(out, c->logprobs + (size_t)i * CV_PROTO_MAX_TOP, sizeof *out * c->n_logprobs[i]);
    return c->n_logprobs[i];
}

int cv_chain_seq_truncate(cv_chain *c, int32_t seq, int32_t len, char *err, size_t errlen)
{
    const cv_msg_seq_op op = {.op = CV_SEQ_TRUNCATE, .seq = seq, .len = len < 0 ? 0 : len};
    if (seq_op(c, &op, err, errlen))
        return -1;
    cv_span_seq_truncate(&c->local, seq, op.len);
    return 0;
}

int cv_chain_seq_free(cv_chain *c, int32_t seq, char *err, size_t errlen)
{
    const cv_msg_seq_op op = {.op = CV_SEQ_FREE, .seq = seq};
    if (seq_op(c, &op, err, errlen))
        return -1;
    cv_span_seq_free(&c->local, seq);
    return 0;
}

int cv_chain_seq_copy(cv_chain *c, int32_t seq, int32_t dst, int32_t len, char *err, size_t errlen)
{
    if (dst < 0 || dst >= c->o.n_slot)
        return cv_errf(err, errlen, "sequence slot %d is outside [0, %d)", dst, c->o.n_slot);
    const cv_msg_seq_op op = {.op = CV_SEQ_COPY, .seq = seq, .len = len < 0 ? 0 : len, .dst = dst};
    if (seq_op(c, &op, err, errlen))
        return -1;
    cv_span_seq_copy(&c->local, seq, dst, op.len);
    return 0;
}

int32_t cv_chain_seq_len(const cv_chain *c, int32_t seq) { return c->local.kv.len[seq]; }
int32_t cv_chain_n_ctx(const cv_chain *c) { return c->local.kv.n_ctx; }

int cv_chain_ping(cv_chain *c, char *err, size_t errlen)
{
    if (c->broken)
        return cv_errf(err, errlen, "the chain failed earlier and must be reopened");
    if (c->in_flight)
        return cv_errf(err, errlen, "%d batches are in flight", c->in_flight);
    return ping_all(c, c->o.io_timeout_ms, err, errlen);
}

/* Every serving node must answer a PING within wait_ms; else -1 naming the
 * first that did not (or whose link failed), and the chain is broken.
 * Other frames are dropped. */
static int ping_all(cv_chain *c, int wait_ms, char *err, size_t errlen)
{
    uint8_t buf[CV_MSG_PING_SIZE];
    size_t len;
    const uint32_t id = ++c->next_id;
    const cv_msg_ping ping = {.nonce = id, .timestamp = cv_now_ns()};
    if (cv_msg_ping_encode(&ping, buf, sizeof buf, &len, err, errlen))
        return -1;
    bool answered[CV_CHAIN_MAX_NODES] = {0};
    for (int k = 0; k < c->n_active; k++)
        if (cv_link_send(c->link[c->active[k]], CV_MSG_PING, id, buf, len, err, errlen))
            return broken_by(c, c->active[k]);
    const int64_t t0 = cv_now_ms();
    for (int n_answered = 0; n_answered < c->n_active;) {
        const int64_t waited = cv_now_ms() - t0;
        cv_inbox_event ev;
        if (waited >= wait_ms || cv_inbox_next(&c->inbox, (int)(wait_ms - waited), &ev) == CV_LINK_TIMEOUT)
            break;
        if (!ev.ok) {
            snprintf(err, errlen, "%s", ev.err);
            return broken_by(c, ev.source);
        }
        if (ev.frame.h.type == CV_MSG_PONG && ev.frame.h.id == id && !answered[ev.source]) {
            answered[ev.source] = true;
            n_answered++;
        }
        cv_link_release(c->link[ev.source], &ev.frame);
    }
    for (int k = 0; k < c->n_active; k++)
        if (!answered[c->active[k]]) {
            cv_errf(err, errlen, "node %s: no answer to a PING within %d ms", c->addr[c->active[k]], wait_ms);
            return broken_by(c, c->active[k]);
        }
    return 0;
}

int cv_chain_node_stats(cv_chain *c, int k, cv_msg_stats *out, char *err, size_t errlen)
{
    if (c->broken || k < 0 || k >= c->n_active)
        return cv_errf(err, errlen, "no serving node %d", k);
    const int i = c->active[k];
    const uint32_t id = ++c->next_id;
    if (cv_link_send(c->link[i], CV_MSG_STATS, id, NULL, 0, err, errlen))
        return broken(c);
    for (;;) {
        cv_inbox_event ev;
        if (cv_inbox_next(&c->inbox, c->o.io_timeout_ms, &ev) == CV_LINK_TIMEOUT)
            return cv_errf(err, errlen, "%s: no STATS_OK within %d ms", cv_link_name(c->link[i]), c->o.io_timeout_ms);
        if (!ev.ok) {
            snprintf(err, errlen, "%s", ev.err);
            return broken(c);
        }
        const bool mine = ev.source == i && ev.frame.h.type == CV_MSG_STATS_OK && ev.frame.h.id == id;
        int rc = mine ? cv_msg_stats_decode(ev.frame.payload, ev.frame.h.payload_len, out, err, errlen) : 0;
        cv_link_release(c->link[ev.source], &ev.frame);
        if (mine)
            return rc;
    }
}

void cv_chain_get_stats(cv_chain *c, cv_chain_stats *s)
{
    memset(s, 0, sizeof *s);
    s->n_local = c->n_local;
    s->n_nodes = c->n_active;
    for (int k = 0; k < c->n_active; k++) {
        s->first[k] = c->plan.first[c->active[k]];
        s->last[k] = c->plan.last[c->active[k]];
    }
    s->bytes_sent = c->forward_bytes;
    s->bytes_recv = c->result_bytes;
}

void cv_chain_get_costs(const cv_chain *c, cv_chain_costs *out)
{
    *out = (cv_chain_costs){.n_nodes = c->n_nodes, .us_hop = c->costs.hop_us, .batches = c->costs.batches,
                            .us_last_round_trip = c->costs.last_round_trip_us};
    for (int i = 0; i < c->n_nodes; i++) {
        out->addr[i] = c->addr[i];
        out->first[i] = c->plan.first[i];
        out->last[i] = c->plan.last[i];
        out->us_probed[i] = c->plan_node[i].us_per_layer_token;
        out->mem_budget[i] = c->plan_node[i].mem_budget;
    }
    for (int s = 0; s < c->costs.n_stages; s++) {
        out->us_measured[stage_node(c, s)] = c->costs.us[s];
        out->us_last[stage_node(c, s)] = c->costs.last_us[s];
        out->work[stage_node(c, s)] = c->work[s];
    }
}

/* What the measured nodes' times are to their probes, weighed by their
 * work: the factor that brings a probe to a measurement (1 when none has both). */
static double measured_over_probed(const cv_chain *c, const cv_chain_costs *m)
{
    double measured = 0, probed = 0;
    for (int s = 0; s < c->costs.n_stages; s++) {
        const int i = stage_node(c, s);
        if (m->us_measured[i] > 0 && m->us_probed[i] > 0) {
            measured += m->us_measured[i] * c->work[s];
            probed += m->us_probed[i] * c->work[s];
        }
    }
    return probed > 0 ? measured / probed : 1.0;
}

int cv_chain_replan(cv_chain *c, const double *us_known, cv_plan_result *best, double *us_now, char *err,
                    size_t errlen)
{
    cv_chain_costs m;
    cv_chain_get_costs(c, &m);
    const double scale = measured_over_probed(c, &m);
    cv_plan_node nodes[CV_CHAIN_MAX_NODES];
    int32_t count[CV_CHAIN_MAX_NODES];
    for (int i = 0; i < c->n_nodes; i++) {
        nodes[i] = c->plan_node[i];
        nodes[i].us_per_layer_token = m.us_measured[i] > 0 ? m.us_measured[i]
                                      : us_known[i] > 0   ? us_known[i]
                                                          : m.us_probed[i] * scale;
        count[i] = m.last[i] - m.first[i];
    }
    cv_plan_result present;
    if (cv_plan_layers(&c->pm, c->n_nodes, nodes, count, c->o.streams, &present, err, errlen))
        return -1;
    *us_now = present.us_token;
    *best = present;
    return c->o.split ? 0 : cv_plan_layers(&c->pm, c->n_nodes, nodes, NULL, c->o.streams, best, err, errlen);
}
