/* kv.h: the key/value cache, preallocated per sequence slot.
 *
 * Contract: cv_kv_create allocates, once, K and V storage for n_slot slots
 * of n_ctx positions for layers [l0, l1) (kv_dim = n_head_kv * head_dim
 * values per position and layer), in F32 or F16. Nothing is allocated
 * afterwards. Writing position p of a slot stores in place; len[slot] is
 * the number of valid positions. Rolling back (speculation) or reusing a
 * prefix is cv_kv_seq_truncate (moving the length, no copy); cv_kv_seq_free
 * empties a slot; cv_kv_seq_copy makes one slot hold another's first
 * positions (their rows copied: the same bits, at the same positions).
 * Layout: [layer][slot][pos][kv_dim], so one slot's keys for one layer are
 * contiguous. */
#ifndef CONVOY_INFER_KV_H
#define CONVOY_INFER_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/types.h"

typedef struct cv_kv {
    cv_type type;     /* CV_TYPE_F32 or CV_TYPE_F16 */
    int32_t n_slot;
    int32_t n_ctx;
    int32_t l0, l1;
    int32_t kv_dim;
    size_t elt_size;
    void *k;          /* [l1-l0][n_slot][n_ctx][kv_dim] */
    void *v;
    int32_t *len;     /* [n_slot] */
} cv_kv;

int cv_kv_create(cv_kv *kv, cv_type type, int32_t n_slot, int32_t n_ctx, int32_t l0, int32_t l1, int32_t kv_dim,
                 char *err, size_t errlen);
void cv_kv_free(cv_kv *kv);

void cv_kv_seq_truncate(cv_kv *kv, int32_t slot, int32_t len);
void cv_kv_seq_free(cv_kv *kv, int32_t slot);
/* Slot dst holds src's first len positions (at most src's length). */
void cv_kv_seq_copy(cv_kv *kv, int32_t src, int32_t dst, int32_t len);

/* Start of the kv_dim values of (layer, slot, pos) in K or V. */
static inline void *cv_kv_at(const cv_kv *kv, void *base, int32_t layer, int32_t slot, int32_t pos)
{
    size_t idx = (((size_t)(layer - kv->l0) * (size_t)kv->n_slot + (size_t)slot) * (size_t)kv->n_ctx + (size_t)pos) *
                 (size_t)kv->kv_dim;
    return (char *)base + idx * kv->elt_size;
}

#endif
