/* sched.c: the scheduler (see sched.h).
 *
 * Design: one mutex (s->mu) guards the queue, every request's shared state
 * (state, refs, cancelled, finish, n_out) and the statistics; each request
 * has its own condition variable that the inference thread signals when it
 * appends tokens or ends the request. The slots and the batch buffers
 * belong to the inference thread alone. Functions called with the lock
 * held end in _locked. One turn of the thread's loop (sched_main):
 *   A. empty_ended_slots: empties the slots whose request ended
 *      (convoy_seq_free), unlocked;
 *   B. take_work: under the lock, sleeps while there is nothing to do
 *      (wait_for_work_locked), ends cancelled requests
 *      (end_cancelled_locked) and moves queued requests into free slots
 *      (cv_sched_admit_locked, sched_admit.c: fairly across clients, each
 *      within its share, with the requests running in each slot in
 *      s->active);
 *   R. reconnect_when_due: while the pipeline is down (a node failed: the
 *      engine closed the chain, every running request ended and submits
 *      are refused with CV_SUBMIT_DOWN), opens it again once the wait is
 *      over, waits doubling from 0.5 s to 4 s, unlocked; check_when_idle:
 *      every 0.5 s without a step, the engine's health check (a pipeline's
 *      nodes must answer a PING), which fails a silent node over;
 *   C. cv_sched_start_admitted (sched_admit.c): sets up the new slots'
 *      samplers (convoy_set_sampler, which also asks the engine for the
 *      request's logprobs), unlocked;
 *   D. submit_batches: while fewer than the engine's depth of batches are
 *      in flight (1 on one machine, the number of stages on a pipeline,
 *      more for windows), builds the next group's batch (build_batch:
 *      choose_windows, the decoding slots that send a window; their drafts
 *      when speculating, from propose_drafts; add_windows, each newest
 *      token followed by its drafts; then add_prompt_chunks, in a rotating
 *      order) and submits it, unlocked, without allocating. Slot i belongs
 *      to group i % groups (one per stage) and a group's rows are in one
 *      batch in flight at a time, so while the last stage works on one
 *      group the first works on another (a prefilling slot whose chunks
 *      the engine pipelines sends them with any batch, up to its prefill
 *      depth in flight, so the stages read one long prompt side by side);
 *   E. collect_oldest: collects the oldest batch in flight, takes its
 *      logprobs (take_logprobs, unlocked), then under the lock appends each
 *      emitted token to its request or ends it (distribute_locked) and
 *      wakes the waiting threads; when the engine failed, it fails every
 *      running request instead (fail_running_locked).
 * A slot's wanted rows in a batch are one run (cv_run): a window, its
 * newest token then its drafts (want 2), or the last prompt token. The
 * run's outputs are the token after each row until the first rejected
 * draft, -1 from there; the engine cuts the slot back to its emitted
 * tokens itself. A request's prompt and output are one array, the history
 * the drafter reads; row positions are history indices.
 * Windows in flight (sched.h): a slot whose convoy_spec chooses D > 1
 * windows leaves its group and sends a window with any batch while fewer
 * than D of its own are in flight. Behind live windows (n_live) a window
 * holds drafts alone, written into the history past the published tokens
 * (the HTTP threads read only those) from sent_end on, its first a guess
 * of what the last live window's last row samples. A window cut short, or
 * the request's end, advances the slot's epoch: the runs in flight sent
 * under an older one are stale and dropped at collection (run_is_live);
 * a live run's row j gives the output j past the published ones. A slot
 * whose request ended waits in SLOT_ENDING until its last window is back.
 * An embedding request's prompt rows pool (want POOL, its last EMBED): its
 * last chunk's run has one wanted row, whose vector take_embeddings copies
 * into the request (unlocked) before distribute_locked ends it.
 * Logprobs come from convoy_logprobs (on a
 * pipeline the last node computes them), are written past the published
 * tokens and published by advancing n_out; a token the engine gave none
 * for ends its request with an error rather than publish garbage. A
 * request is freed when both its submitter and the scheduler have let it
 * go (refs reaches 0).
 *
 * The prompt cache (what a slot keeps after its request, and which slot
 * and prefix a new request gets) is sched_admit.c's, with B's admission
 * and C; the submitters' side of a request (submit, wait, cancel,
 * release) is sched_request.c's; the state they share, sched_impl.h. */
#include "serve/sched_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "serve/log.h"

/* Ends a request and drops the scheduler's reference; the caller holds mu. */
void cv_sched_finish_locked(cv_sched *s, cv_request *r, cv_finish why, const char *msg)
{
    if (r->state == RQ_ACTIVE) {
        s->n_running--;
        s->active[r->slot] = NULL;
    }
    r->state = RQ_DONE;
    r->finish = why;
    if (msg)
        snprintf(r->error, sizeof r->error, "%s", msg);
    s->stats.requests_finished[why]++;
    pthread_cond_broadcast(&r->cond);
    cv_request_unref_locked(r);
}

/* Ends a slot's request; the next A cuts the slot back to the tokens its
 * request published (kept, unless it failed or the cache is off) or
 * empties it. The caller holds mu. */
void cv_sched_end_slot_locked(cv_sched *s, cv_slot *sl, cv_finish why, const char *msg)
{
    const cv_request *r = sl->req;
    cv_kept *k = &s->kept[r->slot];
    k->n = why == CV_FINISH_ERROR || !s->prompt_cache ? 0 : min_i32(r->n_prompt + r->n_out, s->n_ctx);
    memcpy(k->tok, r->prompt, sizeof(int32_t) * (size_t)k->n);
    cv_sched_finish_locked(s, sl->req, why, msg);
    sl->state = SLOT_ENDING;
    sl->epoch++; /* its windows in flight are stale */
    sl->n_live = 0;
}

static cv_request *queue_pop_locked(cv_sched *s)
{
    cv_request *r = s->queue[s->q_head];
    s->q_head = (s->q_head + 1) % s->q_ring;
    s->q_len--;
    return r;
}

/* Empties slot i in the engine and the drafter; returns convoy_seq_free's
 * result. */
int cv_sched_slot_free_engine(cv_sched *s, int32_t i, char *err, size_t errlen)
{
    const int rc = convoy_seq_free(s->ctx, i, err, errlen);
    if (s->spec)
        convoy_spec_seq_free(s->spec, i);
    return rc;
}

/* Empties slot i and frees it. */
static int slot_free(cv_sched *s, int32_t i, char *err, size_t errlen)
{
    s->slots[i] = (cv_slot){.state = SLOT_FREE};
    return cv_sched_slot_free_engine(s, i, err, errlen);
}

/* A: cuts slot i, whose request ended, back to its kept tokens and frees
 * it for the next request; its cache is dropped when that fails. */
static int slot_keep(cv_sched *s, int32_t i, char *err, size_t errlen)
{
    const int32_t len = min_i32(convoy_seq_len(s->ctx, i), s->kept[i].n);
    const int rc = convoy_seq_truncate(s->ctx, i, len, err, errlen);
    pthread_mutex_lock(&s->mu);
    s->kept[i].n = rc ? 0 : len;
    pthread_mutex_unlock(&s->mu);
    s->slots[i] = (cv_slot){.state = SLOT_FREE};
    return rc;
}

/* A: frees the slots whose request ended, each keeping its cache where it
 * has one, once none of its windows is in flight; returns how many. */
static int32_t empty_ended_slots(cv_sched *s)
{
    char err[CV_ERRLEN];
    int32_t n_freed = 0;
    for (int32_t i = 0; i < s->n_slot; i++) {
        if (s->slots[i].state != SLOT_ENDING || s->slots[i].in_flight)
            continue;
        if (s->kept[i].n > 0 && slot_keep(s, i, err, sizeof err))
            cv_log(CV_LOG_WARN, "slot %d drops its cache: %s", i, err);
        if (s->kept[i].n == 0 && slot_free(s, i, err, sizeof err))
            cv_log(CV_LOG_ERROR, "freeing slot %d: %s", i, err);
        n_freed++;
    }
    return n_freed;
}

/* B: sleeps while there is nothing to do, at most until the next health
 * check (or, while the pipeline is down, the next reconnect); false when
 * the scheduler stops. */
static bool wait_for_work_locked(cv_sched *s)
{
    while (!s->stopping && s->n_held == 0 && s->q_len == 0 && s->n_flying == 0) {
        const double wait = (s->stats.down ? s->retry_at : s->check_at) - cv_now_s();
        if (wait <= 0)
            break;
        const struct timespec until = cv_deadline_ms((int64_t)(wait * 1e3) + 1);
        pthread_cond_timedwait(&s->wake, &s->mu, &until);
    }
    return !s->stopping;
}

/* B: ends the requests cancelled while their slot is out of flight (a slot
 * in flight ends when its batch is collected). */
static void end_cancelled_locked(cv_sched *s)
{
    for (int32_t i = 0; i < s->n_slot; i++) {
        cv_slot *sl = &s->slots[i];
        if ((sl->state == SLOT_PREFILL || sl->state == SLOT_DECODE) && !sl->in_flight && sl->req->cancelled)
            cv_sched_end_slot_locked(s, sl, CV_FINISH_CANCELLED, NULL);
    }
}

/* B: under the lock, counts the n_freed slots of A, waits for work, ends
 * cancelled requests and admits queued ones; false when the scheduler
 * stops. */
static bool take_work(cv_sched *s, int32_t n_freed)
{
    pthread_mutex_lock(&s->mu);
    s->n_held -= n_freed;
    const bool working = wait_for_work_locked(s);
    if (working) {
        end_cancelled_locked(s);
        cv_sched_admit_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    return working;
}

/* CHECK_MS: an idle pipeline is pinged this often, which also keeps its
 * nodes ours: a node gives itself to another head after 1 s of silence
 * (pipe/node.h). */
enum { RETRY_FIRST_MS = 500, RETRY_MAX_MS = 4000, CHECK_MS = 500 };

/* A failure took the pipeline down (the engine closed it, releasing its
 * nodes): the scheduler refuses requests and tries to reconnect, the
 * first time soon, then less often. */
void cv_sched_note_down_locked(cv_sched *s, const char *err)
{
    if (s->stats.down || !convoy_ctx_is_down(s->ctx))
        return;
    s->stats.down = true;
    s->stats.failing = true;
    snprintf(s->stats.last_error, sizeof s->stats.last_error, "the pipeline is down: %.480s", err);
    s->retry_wait = RETRY_FIRST_MS / 1e3;
    s->retry_at = cv_now_s() + s->retry_wait;
    cv_log(CV_LOG_ERROR, "the pipeline is down, reconnecting: %s", err);
}

/* R: while the pipeline is down, opens it again once its wait is over
 * (unlocked: a node's handshake may take a while); every slot is empty by
 * then, since going down ended every running request. */
static void reconnect_when_due(cv_sched *s)
{
    pthread_mutex_lock(&s->mu);
    const bool due = s->stats.down && cv_now_s() >= s->retry_at && s->n_held == 0;
    pthread_mutex_unlock(&s->mu);
    if (!due)
        return;
    char err[CV_ERRLEN];
    const int rc = convoy_ctx_reconnect(s->ctx, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    if (rc == 0) {
        s->stats.down = s->stats.failing = false;
        s->stats.reconnects++;
        cv_log(CV_LOG_INFO, "the pipeline is back");
    } else {
        snprintf(s->stats.last_error, sizeof s->stats.last_error, "the pipeline is down: %.480s", err);
        s->retry_wait = s->retry_wait * 2 < RETRY_MAX_MS / 1e3 ? s->retry_wait * 2 : RETRY_MAX_MS / 1e3;
        s->retry_at = cv_now_s() + s->retry_wait;
        cv_log(CV_LOG_WARN, "reconnecting failed, next try in %.1f s: %s", s->retry_wait, err);
    }
    pthread_mutex_unlock(&s->mu);
}

/* The engine's failovers, moves and measured costs, for the stats. */
static void note_engine_locked(cv_sched *s)
{
    convoy_ctx_stats cs;
    convoy_ctx_get_stats(s->ctx, &cs);
    s->stats.failovers = cs.failovers;
    s->stats.failover_seconds = cs.failover_seconds;
    s->stats.rebalances = cs.rebalances;
    s->stats.rebalances_undone = cs.rebalances_undone;
    s->stats.rebalance_seconds = cs.rebalance_seconds;
    convoy_ctx_get_node_costs(s->ctx, &s->stats.nodes);
}

enum { COSTS_LOG_S = 10 };

/* Every COSTS_LOG_S while serving, with -v: what the pipeline's stages measure. */
static void log_costs_locked(cv_sched *s, double now)
{
    const convoy_node_costs *n = &s->stats.nodes;
    if (n->n_nodes == 0 || now < s->costs_at)
        return;
    s->costs_at = now + COSTS_LOG_S;
    char line[2048];
    size_t at = 0;
    for (int i = 0; i < n->n_nodes && at < sizeof line; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, "%s%s: %d layers, %.1f us per layer and token measured "
                               "(%.1f probed)", i ? "; " : "", n->node[i].addr, n->node[i].layers,
                               n->node[i].us_measured, n->node[i].us_probed);
    cv_log(CV_LOG_DEBUG, "costs: %s; a hop %.0f us", line, n->us_hop);
}

/* R: an idle engine is checked every CHECK_MS (a pipeline's nodes must
 * answer a PING), so that a node that died or stopped while nobody asked
 * is replaced, or /health learns that the pipeline is down; unlocked. */
static void check_when_idle(cv_sched *s)
{
    pthread_mutex_lock(&s->mu);
    const bool due = !s->stats.down && s->n_held == 0 && s->q_len == 0 && s->n_flying == 0 &&
                     cv_now_s() >= s->check_at;
    pthread_mutex_unlock(&s->mu);
    if (!due)
        return;
    char err[CV_ERRLEN];
    const int rc = convoy_ctx_check(s->ctx, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    s->check_at = cv_now_s() + CHECK_MS / 1e3;
    note_engine_locked(s);
    if (rc)
        cv_sched_note_down_locked(s, err);
    pthread_mutex_unlock(&s->mu);
}

/* D: the windows a slot keeps in flight: one without speculation, else
 * what its convoy_spec chooses (at most the context's depth). */
static int32_t slot_windows(const cv_sched *s, int32_t i)
{
    return s->spec ? convoy_spec_windows(s->spec, i, s->stage_s, s->depth) : 1;
}

/* The history index of a decoding slot's next draft: past the live
 * windows' rows (its first row then guesses what the last of them
 * samples), else past the newest token. */
static int32_t next_draft_at(const cv_slot *sl)
{
    return sl->n_live > 0 ? sl->sent_end : sl->req->n_prompt + sl->req->n_out;
}

/* Drafts slot i's next window may carry: what its request can still emit
 * were every window in flight accepted whole, after the newest row's own
 * output (max_tokens), and rows up to the context's last position. */
static int32_t draft_room(const cv_sched *s, const cv_slot *sl)
{
    const cv_request *r = sl->req;
    const int32_t next = next_draft_at(sl), n_hist = r->n_prompt + r->n_out;
    return min_i32(r->max_tokens - r->n_out - 1 - (next - n_hist), s->n_ctx - next);
}

/* D: whether a batch that carries group g's rows is in flight. */
static bool group_in_flight(const cv_sched *s, int32_t g)
{
    for (int32_t k = 0; k < s->n_flying; k++)
        if (s->flights[(s->f_oldest + k) % s->depth].group == g)
            return true;
    return false;
}

/* D: marks the decoding slots that send a window with group g's batch (a
 * slot of one window with its group's batch, none of which is in flight;
 * a slot of more with any batch while fewer are in flight; a window that
 * would guess needs room for a draft); returns how many. */
static int32_t choose_windows(cv_sched *s, int32_t g, bool group_busy)
{
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_slot; i++) {
        cv_slot *sl = &s->slots[i];
        sl->sends = false;
        sl->asked = false;
        sl->n_draft = 0;
        if (sl->state != SLOT_DECODE)
            continue;
        const int32_t d = slot_windows(s, i);
        sl->grouped = d == 1;
        sl->sends = sl->in_flight < d && (d > 1 || (i % s->groups == g && !group_busy)) &&
                    (sl->n_live == 0 || draft_room(s, sl) > 0);
        n += sl->sends;
    }
    return n;
}

/* D: the drafts of the sending slots into s->drafts and each slot's
 * n_draft, from one proposal call (asked marks the slots asked). The
 * batch rows the newest tokens leave free are shared: each slot keeps up
 * to an equal share, then what some leave goes to the others in slot
 * order. A failed proposal leaves the round without drafts. */
static void propose_drafts(cv_sched *s)
{
    int32_t n_lead = 0, n_req = 0;
    for (int32_t i = 0; i < s->n_slot; i++) {
        const cv_slot *sl = &s->slots[i];
        if (!sl->sends)
            continue;
        n_lead += sl->n_live == 0;
        const int32_t room = draft_room(s, sl);
        if (room > 0)
            s->spec_reqs[n_req++] = (convoy_spec_req){.seq = i, .hist = sl->req->prompt, .n_hist = next_draft_at(sl),
                                                      .max_draft = room,
                                                      .drafts = s->drafts + (size_t)i * (size_t)s->k_max};
    }
    int32_t spare = s->n_batch - n_lead;
    if (n_req == 0 || spare == 0)
        return;
    char err[CV_ERRLEN];
    if (convoy_spec_propose(s->spec, s->spec_reqs, n_req, err, sizeof err)) {
        cv_log(CV_LOG_WARN, "a round without drafts: %s", err);
        return;
    }
    const int32_t share = spare / n_req;
    for (int32_t k = 0; k < n_req; k++) {
        convoy_spec_req *q = &s->spec_reqs[k];
        cv_slot *sl = &s->slots[q->seq];
        sl->n_draft = min_i32(q->n_draft, share);
        sl->asked = true;
        spare -= sl->n_draft;
    }
    for (int32_t k = 0; k < n_req && spare > 0; k++) {
        cv_slot *sl = &s->slots[s->spec_reqs[k].seq];
        const int32_t more = min_i32(s->spec_reqs[k].n_draft - sl->n_draft, spare);
        sl->n_draft += more;
        spare -= more;
    }
}

/* D: appends slot i's window to f: its newest token and its drafts, or,
 * behind live windows, its drafts alone (the first guesses what the last
 * of them samples). The drafts join the history the drafter continues,
 * past the published tokens (nobody else reads there). */
static void add_window(cv_sched *s, int32_t i, cv_flight *f)
{
    cv_slot *sl = &s->slots[i];
    cv_request *r = sl->req;
    const bool guess = sl->n_live > 0;
    const int32_t first = guess ? sl->sent_end : r->n_prompt + r->n_out - 1;
    const int32_t n_rows = sl->n_draft + !guess;
    const int32_t *drafts = s->drafts + (size_t)i * (size_t)s->k_max;
    f->runs[f->n_runs++] = (cv_run){.slot = i, .row = f->n_want, .n_want = n_rows, .n_draft = sl->n_draft,
                                    .epoch = sl->epoch, .window = true, .asked = sl->asked};
    for (int32_t j = 0; j < n_rows; j++) {
        const bool lead = j == 0 && !guess;
        if (!lead)
            r->prompt[first + j] = drafts[j - !guess];
        f->token[f->n] = r->prompt[first + j];
        f->pos[f->n] = first + j;
        f->seq[f->n] = i;
        f->want[f->n] = lead ? CONVOY_WANT_SAMPLE : CONVOY_WANT_DRAFT;
        f->n++;
    }
    f->n_want += n_rows;
    sl->in_flight++;
    sl->n_live++;
    sl->sent_end = first + n_rows;
}

/* D: appends the sending slots' windows to f (a window that would guess
 * and got no draft stays home); f carries group g's rows when a slot of
 * one window sends. */
static void add_windows(cv_sched *s, int32_t g, cv_flight *f)
{
    for (int32_t i = 0; i < s->n_slot; i++) {
        const cv_slot *sl = &s->slots[i];
        if (!sl->sends || (sl->n_live > 0 && sl->n_draft == 0))
            continue;
        if (sl->grouped)
            f->group = g;
        add_window(s, i, f);
    }
}

/* D: appends to f prompt chunks of the prefilling slots up to the batch
 * size, starting from a rotating slot so that a long prompt delays nobody
 * by more than its chunks. A slot whose chunks are pipelined (the engine's
 * prefill depth > 1: convoy_ctx_prefill_depth) sends one with any batch
 * while fewer than that depth of its own are in flight, as a slot of
 * several windows does; else one at a time, with its group's batch when
 * none of the group's is in flight. */
static void add_prompt_chunks(cv_sched *s, int32_t g, bool group_busy, cv_flight *f)
{
    for (int32_t k = 0; k < s->n_slot && f->n < s->n_batch; k++) {
        const int32_t i = (s->prefill_rr + k) % s->n_slot;
        cv_slot *sl = &s->slots[i];
        const cv_request *r = sl->req;
        if (sl->state != SLOT_PREFILL || sl->n_fed == r->n_prompt)
            continue;
        const int depth = convoy_ctx_prefill_depth(s->ctx);
        const bool grouped = depth == 1;
        const bool pipelined_room = !grouped && sl->in_flight < depth;
        const bool group_turn = grouped && i % s->groups == g && !group_busy && !sl->in_flight;
        if (!pipelined_room && !group_turn)
            continue;
        const int32_t take = min_i32(convoy_ctx_prefill_chunk(s->ctx, r->n_prompt - sl->n_fed), s->n_batch - f->n);
        const bool last = sl->n_fed + take == r->n_prompt;
        f->runs[f->n_runs++] = (cv_run){.slot = i, .row = f->n_want, .n_want = last, .epoch = sl->epoch};
        for (int32_t t = 0; t < take; t++) {
            f->token[f->n] = r->prompt[sl->n_fed];
            f->pos[f->n] = sl->n_fed;
            f->seq[f->n] = i;
            const bool end = ++sl->n_fed == r->n_prompt;
            f->want[f->n] = r->embd ? (end ? CONVOY_WANT_EMBED : CONVOY_WANT_POOL) : end;
            f->n++;
        }
        f->n_want += last;
        if (grouped)
            f->group = g;
        sl->in_flight++;
        f->n_prompt_tokens += take;
    }
    s->prefill_rr = (s->prefill_rr + 1) % s->n_slot;
}

/* D: group g's next batch into f: windows first, then prompt chunks (of
 * the group's rows, those of slots of one window and prompt chunks not
 * pipelined, one batch is in flight at a time, so that they share a
 * batch). */
static void build_batch(cv_sched *s, int32_t g, cv_flight *f)
{
    f->n = f->n_want = f->n_prompt_tokens = f->n_runs = 0;
    f->group = -1;
    f->t_propose = cv_now_s();
    const bool group_busy = group_in_flight(s, g);
    if (choose_windows(s, g, group_busy) > 0 && s->spec)
        propose_drafts(s);
    add_windows(s, g, f);
    add_prompt_chunks(s, g, group_busy, f);
}

/* Slot groups: one per stage the engine has now (a move or a failover may
 * change them), at most one per slot and per batch in flight. */
static int32_t stage_groups(const cv_sched *s)
{
    int32_t g = convoy_ctx_stages(s->ctx);
    g = g < s->n_slot ? g : s->n_slot;
    return g < s->depth ? g : s->depth;
}

/* D: builds and submits the groups' batches in turn while fewer than depth
 * are in flight, without allocating; after a batch goes out every group is
 * looked at again, so it stops when depth are in flight or no group has
 * work. Returns convoy_submit's failure. */
static int submit_batches(cv_sched *s, char *err, size_t errlen)
{
    int rc = 0;
    cv_alloc_forbid(1);
    s->groups = stage_groups(s);
    s->next_group %= s->groups;
    for (int32_t tries = 0; rc == 0 && s->n_flying < s->depth && tries < s->groups; tries++) {
        const int32_t g = s->next_group;
        s->next_group = (s->next_group + 1) % s->groups;
        cv_flight *f = &s->flights[(s->f_oldest + s->n_flying) % s->depth];
        build_batch(s, g, f);
        if (f->n == 0)
            continue;
        const convoy_batch b = {.n_tokens = f->n, .token = f->token, .pos = f->pos, .seq = f->seq, .want = f->want};
        f->t0 = cv_now_s();
        rc = convoy_submit(s->ctx, &b, err, errlen);
        s->n_flying += rc == 0;
        if (rc == 0 && s->spec)
            convoy_spec_sent(s->spec);
        tries = -1;
    }
    cv_alloc_forbid(0);
    return rc;
}

/* Whether a collected run still counts: its slot runs the request it was
 * sent for and nothing made it stale since. */
static bool run_is_live(const cv_sched *s, const cv_run *u)
{
    const cv_slot *sl = &s->slots[u->slot];
    return (sl->state == SLOT_PREFILL || sl->state == SLOT_DECODE) && u->epoch == sl->epoch;
}

/* E: the logprobs of the live runs' emitted rows, written past each
 * request's published tokens: a live run's row j gives the output j places
 * past n_out (its slot emitted everything before it), visible when
 * emit_locked advances n_out. Rows after a rejected draft (id -1) have
 * none; an emitted row the engine gives none for is marked with id -1 for
 * emit_locked. */
static void take_logprobs(cv_sched *s, const cv_flight *f)
{
    convoy_logprob row_lp[1 + CONVOY_MAX_TOP_LOGPROBS];
    for (int32_t k = 0; k < f->n_runs; k++) {
        const cv_run *u = &f->runs[k];
        if (!run_is_live(s, u) || !s->slots[u->slot].req->lp)
            continue;
        const cv_request *r = s->slots[u->slot].req;
        const int n = 1 + r->sampler.n_logprobs;
        for (int32_t j = 0; j < u->n_want && s->b_sampled[u->row + j] >= 0; j++) {
            convoy_logprob *lp = request_lp(r, r->n_out + j);
            if (convoy_logprobs(s->ctx, u->row + j, row_lp) == n)
                memcpy(lp, row_lp, sizeof(convoy_logprob) * (size_t)n);
            else
                lp->id = -1;
        }
    }
}

/* E: the vectors of the embedding requests whose last prompt row the
 * batch carried, into their requests (read once they end). */
static void take_embeddings(cv_sched *s, const cv_flight *f)
{
    for (int32_t k = 0; k < f->n_runs; k++) {
        const cv_run *u = &f->runs[k];
        cv_request *r = s->slots[u->slot].req;
        const float *e = u->n_want && run_is_live(s, u) && r->embd ? convoy_embedding(s->ctx, u->row) : NULL;
        if (e)
            memcpy(r->embd, e, sizeof(float) * (size_t)s->n_embd);
        if (e)
            r->has_embd = true;
    }
}

/* E: an embedding request's last prompt row came back: it ends with its
 * vector (take_embeddings), or with an error when the engine gave none. */
static void end_embedding_locked(cv_sched *s, cv_slot *sl, double now)
{
    cv_request *r = sl->req;
    r->got_first = true;
    s->stats.ttft_seconds += now - r->t_submit;
    s->stats.ttft_count++;
    if (r->cancelled)
        cv_sched_end_slot_locked(s, sl, CV_FINISH_CANCELLED, NULL);
    else if (!r->has_embd)
        cv_sched_end_slot_locked(s, sl, CV_FINISH_ERROR, "the engine gave no embedding");
    else
        cv_sched_end_slot_locked(s, sl, CV_FINISH_STOP, NULL);
}

/* E: appends n_emit outputs to slot sl's request in order, up to the first
 * end (the rest is dropped), or ends the request when it was cancelled. */
static void emit_locked(cv_sched *s, cv_slot *sl, const int32_t *out, int32_t n_emit, double now)
{
    cv_request *r = sl->req;
    if (r->cancelled) {
        cv_sched_end_slot_locked(s, sl, CV_FINISH_CANCELLED, NULL);
        return;
    }
    for (int32_t j = 0; j < n_emit; j++) {
        s->stats.generated_tokens++;
        if (!r->got_first) {
            r->got_first = true;
            s->stats.ttft_seconds += now - r->t_submit;
            s->stats.ttft_count++;
        }
        if (!r->ignore_eos && convoy_token_is_eog(s->model, out[j])) {
            cv_sched_end_slot_locked(s, sl, CV_FINISH_STOP, NULL);
            return;
        }
        if (r->lp && request_lp(r, r->n_out)->id != out[j]) {
            cv_sched_end_slot_locked(s, sl, CV_FINISH_ERROR, "the engine gave no logprobs for a token");
            return;
        }
        r->out[r->n_out++] = out[j];
        /* the row that gave it was at the context's last position */
        if (r->n_out == r->max_tokens || r->n_prompt + r->n_out > s->n_ctx) {
            cv_sched_end_slot_locked(s, sl, CV_FINISH_LENGTH, NULL);
            return;
        }
    }
    pthread_cond_broadcast(&r->cond);
    sl->state = SLOT_DECODE;
}

/* E: a live window's outcome: its drafts judged (reported to the
 * convoy_spec when it was asked, even for none: a plain round measures the
 * fixed cost); cut at its first -1, which makes the windows behind it
 * stale. */
static void judge_window_locked(cv_sched *s, cv_slot *sl, const cv_flight *f, const cv_run *u, int32_t n_emit,
                                double now)
{
    sl->n_live--;
    if (u->asked)
        convoy_spec_observe(s->spec, u->slot, u->n_draft, n_emit - (u->n_want - u->n_draft), now - f->t_propose);
    if (s->spec)
        s->stats.windows_whole += n_emit == u->n_want;
    if (n_emit < u->n_want) {
        sl->epoch++;
        sl->n_live = 0;
    }
}

/* E: hands each live run's emitted tokens (its leading ids) to its
 * request; a stale run is dropped. A request cancelled while its batch was
 * in flight ends here. */
static void distribute_locked(cv_sched *s, const cv_flight *f, double now)
{
    for (int32_t k = 0; k < f->n_runs; k++) {
        const cv_run *u = &f->runs[k];
        cv_slot *sl = &s->slots[u->slot];
        sl->in_flight--;
        if (u->window && s->spec)
            s->stats.windows_sent++;
        if (!run_is_live(s, u)) {
            s->stats.windows_stale += u->window && s->spec;
            continue;
        }
        if (u->n_want == 0) /* a prompt chunk before the last */
            continue;
        if (sl->req->embd) {
            end_embedding_locked(s, sl, now);
            continue;
        }
        const int32_t *out = s->b_sampled + u->row;
        int32_t n_emit = 0;
        while (n_emit < u->n_want && out[n_emit] >= 0)
            n_emit++;
        if (u->window)
            judge_window_locked(s, sl, f, u, n_emit, now);
        emit_locked(s, sl, out, n_emit, now);
    }
}

/* E: a collected batch's statistics. */
static void count_step_locked(cv_sched *s, const cv_flight *f, double t1)
{
    s->stats.steps++;
    s->stats.steps_shared += f->n_runs > 1;
    s->stats.batch_tokens += (uint64_t)f->n;
    s->stats.prompt_tokens += (uint64_t)f->n_prompt_tokens;
    s->stats.step_seconds += t1 - f->t0;
}

/* E: the engine failed (a pipeline node died, ...): every running request
 * fails with its message and no batch is in flight any more. */
static void fail_running_locked(cv_sched *s, const char *err)
{
    snprintf(s->stats.last_error, sizeof s->stats.last_error, "%s", err);
    cv_log(CV_LOG_ERROR, "step failed: %s", err);
    for (int32_t i = 0; i < s->n_slot; i++) {
        cv_slot *sl = &s->slots[i];
        sl->in_flight = 0;
        if (sl->state == SLOT_PREFILL || sl->state == SLOT_DECODE)
            cv_sched_end_slot_locked(s, sl, CV_FINISH_ERROR, err);
    }
    s->n_flying = 0;
    cv_sched_note_down_locked(s, err);
}

static void rate_sample_locked(cv_sched *s, double now)
{
    const int last = (s->rate_head + s->rate_len - 1) % RATE_RING;
    if (s->rate_len > 0 && now - s->rate_t[last] < 1.0)
        return;
    const int at = (s->rate_head + s->rate_len) % RATE_RING;
    if (s->rate_len == RATE_RING)
        s->rate_head = (s->rate_head + 1) % RATE_RING;
    else
        s->rate_len++;
    s->rate_t[at] = now;
    s->rate_n[at] = s->stats.generated_tokens;
}

/* E: collects the oldest batch in flight (unless D's submit failed: rc),
 * takes its logprobs unlocked, then under the lock hands its tokens to the
 * requests, or fails them all when the engine failed. Allocates nothing. */
static void collect_oldest(cv_sched *s, int rc, char *err, size_t errlen)
{
    const cv_flight *f = &s->flights[s->f_oldest];
    int32_t n_sampled = 0;
    const double t0 = cv_now_s();
    if (rc == 0)
        rc = convoy_collect(s->ctx, s->b_sampled, &n_sampled, err, errlen);
    const double t1 = cv_now_s();
    cv_alloc_forbid(1);
    if (rc == 0 && s->spec) /* a prompt chunk's time is not a window's */
        convoy_spec_collected(s->spec, f->n_prompt_tokens == 0 ? f->t0 : -1.0, t0, t1, convoy_collect_waited(s->ctx));
    if (rc == 0) {
        take_logprobs(s, f);
        take_embeddings(s, f);
    }
    pthread_mutex_lock(&s->mu);
    s->stats.failing = rc != 0;
    note_engine_locked(s);
    if (rc == 0) {
        s->check_at = t1 + CHECK_MS / 1e3; /* a step is a check */
        log_costs_locked(s, t1);
        count_step_locked(s, f, t1);
        distribute_locked(s, f, t1);
        s->f_oldest = (s->f_oldest + 1) % s->depth;
        if (--s->n_flying == 0 && s->spec)
            convoy_spec_idle(s->spec);
    } else {
        fail_running_locked(s, err);
    }
    rate_sample_locked(s, t1);
    pthread_mutex_unlock(&s->mu);
    cv_alloc_forbid(0);
}

/* The inference thread: the phases A to E of the design comment. */
static void *sched_main(void *arg)
{
    cv_sched *s = arg;
    char err[CV_ERRLEN];
    while (take_work(s, empty_ended_slots(s))) {
        reconnect_when_due(s);
        check_when_idle(s);
        cv_sched_start_admitted(s);
        const int rc = submit_batches(s, err, sizeof err);
        if (rc != 0 || s->n_flying > 0)
            collect_oldest(s, rc, err, sizeof err);
    }
    return NULL;
}

cv_sched *cv_sched_create(convoy_ctx *ctx, const convoy_model *model, int32_t n_slot, int32_t queue_cap,
                          char *err, size_t errlen)
{
    const int32_t n_batch = convoy_ctx_n_batch(ctx);
    if (n_slot < 1 || queue_cap < 0) {
        cv_errf(err, errlen, "the scheduler needs at least one slot and a queue of 0 or more (got %d, %d)", n_slot,
                queue_cap);
        return NULL;
    }
    if (n_slot > convoy_ctx_n_slot(ctx)) {
        cv_errf(err, errlen, "the scheduler's %d slots are more than the context's %d", n_slot,
                convoy_ctx_n_slot(ctx));
        return NULL;
    }
    if (n_batch < n_slot) {
        cv_errf(err, errlen, "the batch (%d tokens) must hold one token of each of the %d slots", n_batch, n_slot);
        return NULL;
    }
    cv_sched *s = cv_calloc(1, sizeof *s);
    if (!s) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    convoy_model_info info;
    convoy_model_get_info(model, &info);
    s->ctx = ctx;
    s->model = model;
    s->n_slot = n_slot;
    s->n_batch = n_batch;
    s->n_ctx = convoy_ctx_n_ctx(ctx);
    s->n_vocab = info.n_vocab;
    s->n_embd = info.n_embd;
    s->queue_cap = queue_cap;
    s->client_slots = n_slot;
    s->q_ring = queue_cap + n_slot;
    s->stats.n_slot = n_slot;
    s->stats.queue_cap = queue_cap;
    s->stats.n_ctx = s->n_ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    s->queue = cv_calloc((size_t)s->q_ring, sizeof *s->queue);
    s->slots = cv_calloc((size_t)n_slot, sizeof *s->slots);
    s->active = cv_calloc((size_t)n_slot, sizeof *s->active);
    s->n_cache = convoy_ctx_n_slot(ctx) > n_slot ? convoy_ctx_n_slot(ctx) - n_slot : 0;
    s->kept = cv_calloc((size_t)(n_slot + s->n_cache), sizeof *s->kept);
    s->prompt_cache = true;
    s->depth = convoy_ctx_depth(ctx);
    s->groups = stage_groups(s);
    s->stage_s = convoy_ctx_stage_seconds(ctx);
    s->flights = cv_calloc((size_t)s->depth, sizeof *s->flights);
    s->b_sampled = cv_malloc(sizeof(int32_t) * (size_t)n_batch);
    bool ok = s->queue && s->slots && s->active && s->kept && s->flights && s->b_sampled;
    for (int32_t i = 0; ok && i < n_slot + s->n_cache; i++)
        ok = (s->kept[i].tok = cv_malloc(sizeof(int32_t) * (size_t)s->n_ctx)) != NULL;
    for (int32_t k = 0; ok && k < s->depth; k++) {
        cv_flight *f = &s->flights[k];
        f->token = cv_malloc(sizeof(int32_t) * (size_t)n_batch);
        f->pos = cv_malloc(sizeof(int32_t) * (size_t)n_batch);
        f->seq = cv_malloc(sizeof(int32_t) * (size_t)n_batch);
        f->runs = cv_calloc((size_t)n_slot, sizeof *f->runs);
        f->want = cv_malloc((size_t)n_batch);
        ok = f->token && f->pos && f->seq && f->runs && f->want;
    }
    if (!ok) {
        cv_errf(err, errlen, "out of memory");
        cv_sched_free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        cv_errf(err, errlen, "cannot start the inference thread");
        cv_sched_free(s);
        return NULL;
    }
    s->thread_running = true;
    return s;
}

void cv_sched_stop(cv_sched *s)
{
    static const char *const msg = "the server is shutting down";
    pthread_mutex_lock(&s->mu);
    const bool was_running = s->thread_running;
    s->stopping = true;
    s->thread_running = false;
    while (s->q_len > 0)
        cv_sched_finish_locked(s, queue_pop_locked(s), CV_FINISH_ERROR, msg);
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    if (!was_running)
        return;
    pthread_join(s->thread, NULL);
    char err[CV_ERRLEN];
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < s->n_slot; i++) {
        cv_slot *sl = &s->slots[i];
        if (sl->state == SLOT_FREE)
            continue;
        if (sl->state != SLOT_ENDING)
            cv_sched_finish_locked(s, sl->req, CV_FINISH_ERROR, msg);
        slot_free(s, i, err, sizeof err);
    }
    s->n_held = 0;
    pthread_mutex_unlock(&s->mu);
}

void cv_sched_free(cv_sched *s)
{
    if (!s)
        return;
    cv_sched_stop(s);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->mu);
    for (int32_t k = 0; s->flights && k < s->depth; k++) {
        cv_free(s->flights[k].token);
        cv_free(s->flights[k].pos);
        cv_free(s->flights[k].seq);
        cv_free(s->flights[k].runs);
        cv_free(s->flights[k].want);
    }
    cv_free(s->flights);
    cv_free(s->b_sampled);
    cv_free(s->drafts);
    cv_free(s->spec_reqs);
    cv_free(s->slots);
    cv_free(s->active);
    for (int32_t i = 0; s->kept && i < s->n_slot + s->n_cache; i++)
        cv_free(s->kept[i].tok);
    cv_free(s->kept);
    cv_free(s->queue);
    cv_free(s);
}

int cv_sched_set_spec(cv_sched *s, convoy_spec *spec, char *err, size_t errlen)
{
    if (s->spec)
        return cv_errf(err, errlen, "the scheduler speculates already");
    if (!spec)
        return 0;
    const int32_t k_max = convoy_spec_k_max(spec);
    convoy_spec_req *reqs = cv_calloc((size_t)s->n_slot, sizeof *reqs);
    int32_t *drafts = cv_malloc(sizeof(int32_t) * (size_t)s->n_slot * (size_t)k_max);
    if (!reqs || !drafts) {
        cv_free(reqs);
        cv_free(drafts);
        return cv_errf(err, errlen, "out of memory for the drafts of %d slots", s->n_slot);
    }
    pthread_mutex_lock(&s->mu);
    s->spec_reqs = reqs;
    s->drafts = drafts;
    s->k_max = k_max;
    s->spec = spec;
    pthread_mutex_unlock(&s->mu);
    return 0;
}
