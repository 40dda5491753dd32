/* experts.h: the routed experts of a mixture-of-experts model, read from
 * the file when a token first chooses them.
 *
 * A MoE layer's experts are most of its bytes and a token uses a few of
 * them, so the loader leaves them in the file: cv_experts_use reads the
 * experts a batch chose into a cache of equal expert slots (expert e's gate, up
 * and down rows, with pread so that the mapping's pages are never touched,
 * interleaved as the loader interleaves resident matrices) and evicts the
 * least recently used when every slot is taken. An expert no token
 * chooses is never read; with a slot per expert each is read once. The
 * slots are allocated and faulted in whole at create (a page's first
 * touch in decode cost as much as the read), so a stage's resident memory
 * is its other weights plus n_slot slots, whatever the batches choose
 * (pipe/plan.h counts them). An expert slot holds the file's bytes: results never
 * depend on the cache.
 *
 * Contract: cv_experts_create(m, n_slot) serves the layers m binds,
 * [l0, l1), with n_slot slots (at least cv_experts_min_slots(m, n_batch)
 * for batches of n_batch tokens). cv_experts_use(x, l, ids, n, out) with n
 * distinct experts of layer l, n <= n_slot, makes them resident and sets
 * out[i] to expert ids[i]'s matrices, valid until the next call; a read
 * error names the expert and the file. One thread at a time (the forward
 * pass) calls it. */
#ifndef CONVOY_MODEL_EXPERTS_H
#define CONVOY_MODEL_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/llama.h"

/* A slot holds one expert of any layer: cv_llama_expert_slot_bytes(m). */
typedef struct cv_experts cv_experts;

/* One expert's three matrices. */
typedef struct cv_expert {
    cv_weight gate, up, down;
} cv_expert;

/* The fewest slots a batch of n_batch tokens needs: the experts one layer
 * of it may choose. */
int32_t cv_experts_min_slots(const cv_llama *m, int32_t n_batch);
/* Every expert of layers [l0, l1): slots to read each once. */
int32_t cv_experts_all_slots(const cv_llama *m, int32_t l0, int32_t l1);

/* The resident bytes a cache of n slots may take: fixed + n * per_slot
 * (pipe/plan.h counts them). */
void cv_experts_cost(const cv_llama *m, uint64_t *fixed, uint64_t *per_slot);

cv_experts *cv_experts_create(const cv_llama *m, int32_t n_slot, char *err, size_t errlen);
int cv_experts_use(cv_experts *x, int32_t l, const int32_t *ids, int32_t n, cv_expert *out, char *err,
                   size_t errlen);
int32_t cv_experts_n_slot(const cv_experts *x);

typedef struct cv_experts_counts {
    uint64_t reads;   /* experts read from the file */
    uint64_t evicted; /* of them, read into a slot another expert held */
    uint64_t hits;    /* uses served from memory */
} cv_experts_counts;
void cv_experts_get_counts(const cv_experts *x, cv_experts_counts *out);
void cv_experts_free(cv_experts *x);

#endif
