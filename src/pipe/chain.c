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
 * RESULT, kept per wanted row until the next one. Opening and closing a
 * chain are chain_open.c's (chain_impl.h). */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "pipe/chain_impl.h"

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
 * (expert slots) for node i of a mixture of experts, else nothing. */
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
    /* its buffers may still be on their way out */
    if (cv_fwd_out_reclaim(&f->out, cv_chain_first_link(c), err, errlen))
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
    if (cv_fwd_out_send(&f->out, cv_chain_first_link(c), f->id, &m, &bytes, err, errlen))
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
    if (!rc && cv_link_send(cv_chain_first_link(c), CV_MSG_SEQ_OP, ++c->next_id, buf, len, err, errlen))
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
        out->us_measured[cv_chain_stage_node(c, s)] = c->costs.us[s];
        out->us_last[cv_chain_stage_node(c, s)] = c->costs.last_us[s];
        out->work[cv_chain_stage_node(c, s)] = c->work[s];
    }
}

/* What the measured nodes' times are to their probes, weighed by their
 * work: the factor that brings a probe to a measurement (1 when none has both). */
static double measured_over_probed(const cv_chain *c, const cv_chain_costs *m)
{
    double measured = 0, probed = 0;
    for (int s = 0; s < c->costs.n_stages; s++) {
        const int i = cv_chain_stage_node(c, s);
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
