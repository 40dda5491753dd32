/* sched_admit.c: the scheduler's admission and its prompt cache (see
 * sched.c's design comment for the phases): B moves queued requests into
 * free slots, fairly across clients, each into the slot whose kept tokens
 * it reuses most; C sets the admitted slots up. They are apart from the
 * step loop because they choose and reuse KV for a new request, and the
 * loop only runs what they chose. /slots reads and erases what a slot
 * keeps here too.
 *
 * The prompt cache: a slot whose request ended keeps its KV and the tokens
 * at its positions (s->kept: cv_sched_end_slot_locked copies the tokens
 * the request published, A cuts the slot back to them instead of emptying
 * it: the engine's length may hold accepted drafts past the last published
 * token).
 * B gives a queued request the free slot whose kept tokens share the
 * longest prefix with its prompt (ties, and no match: the least recently
 * used) and C cuts that slot back to the reused prefix (reuse_len: one
 * prompt token at least is left to run, and, for a request with
 * penalties, its whole penalty window, so that the sampler's history is a
 * cold slot's). Kernels are batch- and chunk-invariant, so the prefix's KV
 * holds the bits a cold prefill writes: a request's tokens and logprobs do
 * not depend on what its slot held. A failed request's slot is emptied; on
 * a pipeline the engine's journal holds the kept tokens too, so a failover
 * rebuilds them on the new chain.
 * The context's slots past n_slot are the cache beyond the slots: no
 * request runs in them; they keep prefixes (kept too). When C cuts a slot
 * back, the tokens it would lose go to a cache slot first (stash: one
 * that holds a prefix of them, else the least recently used, unless one
 * holds them already; never one that a slot admitted with it has yet to
 * copy from), and B may take a request's prefix from a cache
 * slot, or another free slot, that holds more of it than the slot it gets
 * (cv_slot.source): C then copies it (convoy_seq_copy: the same KV bits),
 * before it cuts back any slot admitted with it. So the n choices of one
 * request, admitted together after one of them ran the prompt, each run
 * only its last token. */
#include "serve/sched_impl.h"

#include <string.h>

#include "core/err.h"
#include "serve/log.h"

enum { STASH_MIN_TOKENS = 16 }; /* fewer tokens are not worth a cache slot */

/* Requests of client c running now. */
int32_t cv_sched_running_of_locked(const cv_sched *s, uint64_t c)
{
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_slot; i++)
        n += s->active[i] && s->active[i]->client == c;
    return n;
}

/* The queued request that gets the next free slot: of the clients under
 * their share, the one running the fewest requests, its oldest; NULL when
 * every queued client runs its share. */
static cv_request *next_admitted_locked(const cv_sched *s)
{
    cv_request *best = NULL;
    int32_t best_n = s->client_slots;
    for (int32_t i = 0; i < s->q_len && best_n > 0; i++) {
        cv_request *r = s->queue[(s->q_head + i) % s->q_ring];
        if (r->pin && s->slots[r->slot_wanted].state != SLOT_FREE)
            continue;
        const int32_t n = cv_sched_running_of_locked(s, r->client);
        if (n < best_n) {
            best = r;
            best_n = n;
        }
    }
    return best;
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    const int32_t n = min_i32(na, nb);
    int32_t p = 0;
    while (p < n && a[p] == b[p])
        p++;
    return p;
}

/* The tokens kept in slot i that r's prompt starts with (0 for a cold request). */
static int32_t prompt_prefix(const cv_sched *s, int32_t i, const cv_request *r)
{
    return r->cold ? 0 : common_prefix(s->kept[i].tok, s->kept[i].n, r->prompt, r->n_prompt);
}

/* The free slot for r: its pinned one, else the longest common prefix
 * (*prefix), then the least recently used; -1 when every slot is held. */
static int32_t best_free_slot(const cv_sched *s, const cv_request *r, int32_t *prefix)
{
    if (r->pin) {
        *prefix = prompt_prefix(s, r->slot_wanted, r);
        return s->slots[r->slot_wanted].state == SLOT_FREE ? r->slot_wanted : -1;
    }
    int32_t best = -1;
    for (int32_t i = 0; i < s->n_slot; i++) {
        if (s->slots[i].state != SLOT_FREE)
            continue;
        const int32_t p = prompt_prefix(s, i, r);
        if (best < 0 || p > *prefix || (p == *prefix && s->kept[i].used < s->kept[best].used)) {
            best = i;
            *prefix = p;
        }
    }
    return best;
}

/* Whether slot j's KV holds its kept tokens until this admission's
 * slots are set up: a cache slot, a free slot, or one admitted now that
 * keeps its own prefix (cv_sched_start_admitted copies out of it before
 * cutting it back). */
static bool holds_kept(const cv_sched *s, int32_t j)
{
    if (j >= s->n_slot)
        return true;
    const cv_slot *sl = &s->slots[j];
    return sl->state == SLOT_FREE || (sl->state == SLOT_STARTING && sl->source == j);
}

/* Whether a slot admitted and not yet set up takes its prefix from slot
 * i (another slot, or a cache slot). */
static bool copied_from(const cv_sched *s, int32_t i)
{
    for (int32_t j = 0; j < s->n_slot; j++)
        if (j != i && s->slots[j].state == SLOT_STARTING && s->slots[j].source == i)
            return true;
    return false;
}

/* Another slot than i (a cache slot, or a free one: the n choices of one
 * request share their prompt so) that holds more of r's prompt than
 * *prefix (which it then sets), the most; -1 when none does. */
static int32_t best_source_slot(const cv_sched *s, const cv_request *r, int32_t i, int32_t *prefix)
{
    int32_t best = -1;
    for (int32_t c = 0; c < s->n_slot + s->n_cache; c++) {
        if (c == i || !holds_kept(s, c))
            continue;
        const int32_t p = prompt_prefix(s, c, r);
        if (p > *prefix) {
            best = c;
            *prefix = p;
        }
    }
    return best;
}

/* The prompt tokens r takes from a common prefix of `prefix`: one token at
 * least is left to run, so that the first output has fresh logits, and
 * with penalties the penalty window too, so that the sampler sees every
 * id a cold slot's would. */
static int32_t reuse_len(const cv_request *r, int32_t prefix)
{
    const convoy_sampling_params *p = &r->sampler;
    const int32_t window = p->penalty_last_n < 0 ? r->n_prompt : p->penalty_last_n; /* -1: the whole history */
    const bool penalties =
        window > 0 && (p->repeat_penalty != 1.0f || p->freq_penalty != 0.0f || p->presence_penalty != 0.0f);
    int32_t n = min_i32(prefix, r->n_prompt - 1);
    if (penalties)
        n = min_i32(n, r->n_prompt - window);
    return n > 0 ? n : 0;
}

/* B: moves queued requests into free slots, fairly across clients, each
 * into the slot that holds the most of its prompt. */
void cv_sched_admit_locked(cv_sched *s)
{
    while (s->q_len > 0) {
        cv_request *r = next_admitted_locked(s);
        int32_t prefix = 0;
        const int32_t i = r ? best_free_slot(s, r, &prefix) : -1;
        if (i < 0)
            return;
        /* a slot that an earlier admission copies from keeps its own prefix */
        const int32_t c = copied_from(s, i) ? -1 : best_source_slot(s, r, i, &prefix);
        const int32_t source = c >= 0 ? c : i;
        cv_sched_queue_remove_locked(s, r);
        r->state = RQ_ACTIVE;
        r->slot = i;
        r->n_cached = reuse_len(r, prefix);
        s->kept[i].used = s->kept[source].used = ++s->use_clock;
        s->active[i] = r;
        s->slots[i] = (cv_slot){.state = SLOT_STARTING, .req = r, .source = source, .n_fed = r->n_cached};
        s->stats.prompt_tokens_cached += (uint64_t)r->n_cached;
        s->n_held++;
        s->n_running++;
    }
}

/* The cache slot that takes slot i's kept tokens: one holding a prefix of
 * them (an empty one first), else the least recently used; never one that
 * a slot admitted with i has yet to copy from (its KV must hold its kept
 * tokens until then). -1 when one holds them all already, or none may. */
static int32_t stash_target(const cv_sched *s, int32_t i)
{
    const cv_kept *k = &s->kept[i];
    int32_t lru = -1;
    for (int32_t c = s->n_slot; c < s->n_slot + s->n_cache; c++) {
        if (copied_from(s, c))
            continue;
        const int32_t p = common_prefix(s->kept[c].tok, s->kept[c].n, k->tok, k->n);
        if (p == k->n)
            return -1;
        if (p == s->kept[c].n)
            return c;
        if (lru < 0 || s->kept[c].used < s->kept[lru].used)
            lru = c;
    }
    return lru;
}

/* C: slot i is about to keep only `keep` of its kept tokens: the rest go
 * to a cache slot first (see the design comment), unless they are few. */
static void stash(cv_sched *s, int32_t i, int32_t keep)
{
    if (s->kept[i].n - keep < STASH_MIN_TOKENS)
        return;
    const int32_t c = stash_target(s, i);
    if (c < 0)
        return;
    char err[CV_ERRLEN];
    const int rc = convoy_seq_copy(s->ctx, i, c, s->kept[i].n, err, sizeof err);
    if (rc)
        cv_log(CV_LOG_WARN, "the prompt cache drops slot %d: %s", c, err);
    pthread_mutex_lock(&s->mu);
    s->kept[c].n = rc ? 0 : s->kept[i].n;
    memcpy(s->kept[c].tok, s->kept[i].tok, sizeof(int32_t) * (size_t)s->kept[c].n);
    s->kept[c].used = s->kept[i].used;
    pthread_mutex_unlock(&s->mu);
}

/* C: slot i gets the n prompt tokens its request reuses from `source` (cut
 * back to them, a copy of a cache slot's, or an empty slot when none),
 * what it held past them stashed first. */
static int slot_reuse(cv_sched *s, int32_t i, int32_t source, int32_t n, char *err, size_t errlen)
{
    stash(s, i, source == i ? n : 0);
    pthread_mutex_lock(&s->mu);
    s->kept[i].n = 0; /* the request's tokens replace them */
    pthread_mutex_unlock(&s->mu);
    if (source != i)
        return convoy_seq_copy(s->ctx, source, i, n, err, errlen);
    if (n == 0)
        return cv_sched_slot_free_engine(s, i, err, errlen);
    return convoy_seq_truncate(s->ctx, i, n, err, errlen);
}

/* C: sets up each admitted slot: cut back to its reused prefix, then its
 * sampler (it allocates, so it is done here, out of the step loop); a
 * slot the engine refuses ends its request. The slots that copy another's
 * prefix go first, before a slot they copy is cut back. */
void cv_sched_start_admitted(cv_sched *s)
{
    char err[CV_ERRLEN];
    for (int32_t k = 0; k < 2 * s->n_slot; k++) {
        const int32_t i = k % s->n_slot;
        cv_slot *sl = &s->slots[i];
        if (sl->state != SLOT_STARTING || (k < s->n_slot) == (sl->source == i))
            continue;
        const cv_request *r = sl->req;
        if (slot_reuse(s, i, sl->source, r->n_cached, err, sizeof err) ||
            convoy_set_sampler(s->ctx, i, &r->sampler, err, sizeof err) ||
            (r->grammar && convoy_set_grammar(s->ctx, i, r->grammar, r->grammar_len, r->n_prompt, err, sizeof err))) {
            pthread_mutex_lock(&s->mu);
            cv_sched_end_slot_locked(s, sl, CV_FINISH_ERROR, err);
            cv_sched_note_down_locked(s, err);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        sl->state = SLOT_PREFILL;
    }
}

void cv_sched_set_prompt_cache(cv_sched *s, bool on)
{
    pthread_mutex_lock(&s->mu);
    s->prompt_cache = on;
    pthread_mutex_unlock(&s->mu);
}

int32_t cv_sched_get_slots(cv_sched *s, cv_slot_info *out)
{
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < s->n_slot; i++) {
        const cv_request *r = s->active[i];
        out[i] = (cv_slot_info){.id = i, .n_ctx = s->n_ctx, .processing = r != NULL,
                                .n_tokens = r ? r->n_prompt + r->n_out : s->kept[i].n};
    }
    pthread_mutex_unlock(&s->mu);
    return s->n_slot;
}

/* Slot id, idle: its kept tokens (NULL: none, and err says why); the caller holds mu. */
static const cv_kept *idle_slot_locked(const cv_sched *s, int32_t id, char *err, size_t errlen)
{
    if (id < 0 || id >= s->n_slot) {
        cv_errf(err, errlen, "slot %d does not exist: the slots are 0 to %d", id, s->n_slot - 1);
        return NULL;
    }
    if (s->slots[id].state != SLOT_FREE || s->active[id]) {
        cv_errf(err, errlen, "slot %d is running a request", id);
        return NULL;
    }
    return &s->kept[id];
}

int32_t cv_sched_slot_tokens(cv_sched *s, int32_t id, int32_t *out, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    const cv_kept *k = idle_slot_locked(s, id, err, errlen);
    const int32_t n = k ? k->n : -1;
    if (k)
        memcpy(out, k->tok, sizeof(int32_t) * (size_t)n);
    pthread_mutex_unlock(&s->mu);
    return n;
}

int32_t cv_sched_slot_erase(cv_sched *s, int32_t id, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->mu);
    cv_kept *k = (cv_kept *)idle_slot_locked(s, id, err, errlen);
    const int32_t n = k ? k->n : -1;
    if (k)
        k->n = 0; /* its KV stays until the next request, which reuses none of it */
    pthread_mutex_unlock(&s->mu);
    return n;
}
