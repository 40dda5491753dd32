/* kv.c: allocation and length bookkeeping of the KV cache (see kv.h). The
 * forward pass writes and reads the storage through cv_kv_at. */
#include "infer/kv.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

/* Bytes of K (and of V). */
static size_t kv_bytes(const cv_kv *kv)
{
    return (size_t)(kv->l1 - kv->l0) * (size_t)kv->n_slot * (size_t)kv->n_ctx * (size_t)kv->kv_dim * kv->elt_size;
}

int cv_kv_create(cv_kv *kv, cv_type type, int32_t n_slot, int32_t n_ctx, int32_t l0, int32_t l1, int32_t kv_dim,
                 char *err, size_t errlen)
{
    memset(kv, 0, sizeof *kv);
    if (type != CV_TYPE_F32 && type != CV_TYPE_F16)
        return cv_errf(err, errlen, "KV cache type must be F32 or F16");
    if (n_slot < 1 || n_ctx < 1 || l1 < l0 || kv_dim < 1)
        return cv_errf(err, errlen, "bad KV cache size (%d slots, context %d)", n_slot, n_ctx);
    kv->type = type;
    kv->n_slot = n_slot;
    kv->n_ctx = n_ctx;
    kv->l0 = l0;
    kv->l1 = l1;
    kv->kv_dim = kv_dim;
    kv->elt_size = type == CV_TYPE_F32 ? 4 : 2;
    const size_t bytes = kv_bytes(kv);
    /* in 2 MiB pages: attention reads a KV head's rows kv_dim apart, and on
     * 4 KiB pages every other row missed the TLB (1B Q4_K decode at 4096
     * positions: 10.3 -> 18.3 tok/s) */
    kv->k = cv_huge_alloc(bytes);
    kv->v = cv_huge_alloc(bytes);
    kv->len = cv_calloc((size_t)n_slot, sizeof *kv->len);
    if (!kv->k || !kv->v || !kv->len) {
        cv_kv_free(kv);
        return cv_errf(err, errlen, "out of memory for the KV cache (%zu bytes for K and V each)", bytes);
    }
    return 0;
}

void cv_kv_free(cv_kv *kv)
{
    cv_huge_free(kv->k, kv_bytes(kv));
    cv_huge_free(kv->v, kv_bytes(kv));
    cv_free(kv->len);
    memset(kv, 0, sizeof *kv);
}

void cv_kv_seq_truncate(cv_kv *kv, int32_t slot, int32_t len)
{
    if (len < kv->len[slot])
        kv->len[slot] = len < 0 ? 0 : len;
}

void cv_kv_seq_free(cv_kv *kv, int32_t slot) { kv->len[slot] = 0; }

void cv_kv_seq_copy(cv_kv *kv, int32_t src, int32_t dst, int32_t len)
{
    if (len > kv->len[src])
        len = kv->len[src];
    if (len < 0)
        len = 0;
    const size_t bytes = (size_t)len * (size_t)kv->kv_dim * kv->elt_size;
    for (int32_t l = kv->l0; l < kv->l1 && bytes; l++) {
        memcpy(cv_kv_at(kv, kv->k, l, dst, 0), cv_kv_at(kv, kv->k, l, src, 0), bytes);
        memcpy(cv_kv_at(kv, kv->v, l, dst, 0), cv_kv_at(kv, kv->v, l, src, 0), bytes);
    }
    kv->len[dst] = len;
}
