/* experts.c: the expert cache (experts.h). An expert slot is found by its
 * (layer, expert) key in a table of every expert the stage serves; the
 * victim of a miss is the slot used longest ago, never one the same call
 * has handed out. */
#include "model/experts.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/kernels.h"

struct cv_experts {
    const cv_llama *m;
    int32_t n_slot;
    size_t slot_bytes;
    uint8_t *slots;      /* [n_slot][slot_bytes], huge pages (cv_huge_alloc) */
    size_t slots_bytes;  /* the reservation, for cv_huge_free */
    uint8_t *staging;    /* one matrix as the file holds it, before interleaving */
    size_t staging_bytes;
    int32_t *slot_of;    /* [(l - l0) * n_expert + e] its slot, or -1 */
    int32_t *key_of;     /* [n_slot] the key it holds, or -1 */
    uint64_t *used;      /* [n_slot] the call that last used it */
    cv_expert *held;     /* [n_slot] its matrices */
    uint64_t calls;
    cv_experts_counts counts;
};

static size_t aligned64(size_t n) { return (n + 63) / 64 * 64; }

int32_t cv_experts_min_slots(const cv_llama *m, int32_t n_batch)
{
    const int64_t chosen = (int64_t)n_batch * m->hp.n_expert_used;
    return chosen < m->hp.n_expert ? (int32_t)chosen : m->hp.n_expert;
}

int32_t cv_experts_all_slots(const cv_llama *m, int32_t l0, int32_t l1) { return (l1 - l0) * m->hp.n_expert; }

/* An allocation of n bytes in whole pages, with the allocator's header. */
static uint64_t pages(uint64_t n) { return (n + 64 + 4095) / 4096 * 4096; }

void cv_experts_cost(const cv_llama *m, uint64_t *fixed, uint64_t *per_slot)
{
    *per_slot = cv_llama_expert_slot_bytes(m) + sizeof(int32_t) + sizeof(uint64_t) + sizeof(cv_expert);
    /* the slots' last huge page, the staging buffer, the key table (for a
     * range of every layer at most), the three per-slot tables' last pages */
    *fixed = (2u << 20) + pages(cv_llama_expert_matrix_bytes(m)) +
             pages(sizeof(int32_t) * (uint64_t)m->hp.n_layer * (uint64_t)m->hp.n_expert) + 3 * pages(0) +
             pages(sizeof(struct cv_experts));
}

cv_experts *cv_experts_create(const cv_llama *m, int32_t n_slot, char *err, size_t errlen)
{
    const int32_t n_key = cv_experts_all_slots(m, m->l0, m->l1);
    if (n_slot < 1 || n_slot > n_key) {
        cv_errf(err, errlen, "%s: %d expert slots for %d experts", m->gguf.name, n_slot, n_key);
        return NULL;
    }
    cv_experts *x = cv_calloc(1, sizeof *x);
    if (!x) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    x->m = m;
    x->n_slot = n_slot;
    x->slot_bytes = cv_llama_expert_slot_bytes(m);
    x->slots_bytes = x->slot_bytes * (size_t)n_slot;
    x->staging_bytes = cv_llama_expert_matrix_bytes(m);
    x->slots = cv_huge_alloc(x->slots_bytes);
    x->staging = cv_aligned_alloc(x->staging_bytes);
    x->slot_of = cv_malloc(sizeof *x->slot_of * (size_t)n_key);
    x->key_of = cv_malloc(sizeof *x->key_of * (size_t)n_slot);
    x->used = cv_calloc((size_t)n_slot, sizeof *x->used);
    x->held = cv_calloc((size_t)n_slot, sizeof *x->held);
    if (!x->slots || !x->staging || !x->slot_of || !x->key_of || !x->used || !x->held) {
        cv_experts_free(x);
        cv_errf(err, errlen, "%s: out of memory for %d expert slots of %zu bytes", m->gguf.name, n_slot,
                x ? x->slot_bytes : 0);
        return NULL;
    }
    /* fault the slots in now: a first touch in decode (the kernel zeroing
     * each new page) took half of a 256-token decode's time */
    memset(x->slots, 0, x->slots_bytes);
    memset(x->slot_of, -1, sizeof *x->slot_of * (size_t)n_key);
    memset(x->key_of, -1, sizeof *x->key_of * (size_t)n_slot);
    return x;
}

/* A free slot, else the one used longest ago by an earlier call. */
static int32_t victim(const cv_experts *x)
{
    int32_t best = -1;
    for (int32_t s = 0; s < x->n_slot; s++) {
        if (x->key_of[s] < 0)
            return s;
        if (x->used[s] < x->calls && (best < 0 || x->used[s] < x->used[best]))
            best = s;
    }
    return best;
}

/* Reads expert e's rows of a stacked matrix into dst and describes them. */
static int read_rows(cv_experts *x, const cv_weight *stack, int32_t e, uint8_t *dst, cv_weight *out, char *err,
                     size_t errlen)
{
    const cv_weight w = cv_llama_expert(stack, x->m->hp.n_expert, e);
    return cv_llama_read_matrix(x->m, &w, x->staging, dst, out, err, errlen);
}

/* Fills slot s with layer l's expert e. */
static int fill(cv_experts *x, int32_t s, int32_t l, int32_t e, char *err, size_t errlen)
{
    const cv_llama_layer *L = &x->m->layers[l];
    uint8_t *at = x->slots + (size_t)s * x->slot_bytes;
    cv_expert *h = &x->held[s];
    if (read_rows(x, &L->gate_exps, e, at, &h->gate, err, errlen))
        return -1;
    at += aligned64(cv_weight_bytes(&h->gate));
    if (read_rows(x, &L->up_exps, e, at, &h->up, err, errlen))
        return -1;
    at += aligned64(cv_weight_bytes(&h->up));
    return read_rows(x, &L->down_exps, e, at, &h->down, err, errlen);
}

int cv_experts_use(cv_experts *x, int32_t l, const int32_t *ids, int32_t n, cv_expert *out, char *err,
                   size_t errlen)
{
    const int32_t n_expert = x->m->hp.n_expert;
    if (l < x->m->l0 || l >= x->m->l1 || n > x->n_slot)
        return cv_errf(err, errlen, "experts: layer %d, %d experts for %d slots", l, n, x->n_slot);
    x->calls++;
    for (int32_t i = 0; i < n; i++) {
        const int32_t key = (l - x->m->l0) * n_expert + ids[i];
        int32_t s = x->slot_of[key];
        if (s >= 0) {
            x->counts.hits++;
        } else {
            s = victim(x);
            if (x->key_of[s] >= 0) {
                x->slot_of[x->key_of[s]] = -1;
                x->counts.evicted++;
            }
            x->key_of[s] = -1;
            char why[CV_ERRLEN];
            if (fill(x, s, l, ids[i], why, sizeof why))
                return cv_errf(err, errlen, "expert %d of layer %d: %s", ids[i], l, why);
            x->key_of[s] = key;
            x->slot_of[key] = s;
            x->counts.reads++;
        }
        x->used[s] = x->calls;
        out[i] = x->held[s];
    }
    return 0;
}

int32_t cv_experts_n_slot(const cv_experts *x) { return x->n_slot; }

void cv_experts_get_counts(const cv_experts *x, cv_experts_counts *out) { *out = x->counts; }
void cv_experts_free(cv_experts *x)
{
    if (!x)
        return;
    cv_huge_free(x->slots, x->slots_bytes);
    cv_free_aligned(x->staging);
    cv_free(x->slot_of);
    cv_free(x->key_of);
    cv_free(x->used);
    cv_free(x->held);
    cv_free(x);
}
