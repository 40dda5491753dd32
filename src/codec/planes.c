/* planes.c: the tensor codec of planes.h: gathers a tensor's blocks into
 * streams by its type's layout, codes each with rans.h. */
#include "codec/planes.h"

#include <inttypes.h>
#include <string.h>

#include "codec/rans.h"
#include "core/alloc.h"
#include "core/err.h"
#include "kernels/types.h"

typedef struct run {
    uint16_t len;
    uint8_t stream;
} run;

typedef struct layout {
    uint32_t type; /* GGML type id */
    uint16_t block;
    uint8_t n_streams, n_runs;
    run runs[8];
} layout;

/* planes.h's table, runs in the order of the block structs' fields (an
 * fp16 scale is two runs: its low byte, then its high byte). */
#define FIELD(T, f) ((uint16_t)sizeof(((T *)0)->f))
static const layout layouts[] = {
    {CV_TYPE_F32, sizeof(float), 4, 4, {{1, 0}, {1, 1}, {1, 2}, {1, 3}}},
    {CV_TYPE_F16, sizeof(cv_fp16), 2, 2, {{1, 0}, {1, 1}}},
    {CV_TYPE_BF16, sizeof(cv_bf16), 2, 2, {{1, 0}, {1, 1}}},
    {CV_TYPE_Q4_0, sizeof(block_q4_0), 3, 3, {{1, 0}, {1, 1}, {FIELD(block_q4_0, qs), 2}}},
    {CV_TYPE_Q8_0, sizeof(block_q8_0), 3, 3, {{1, 0}, {1, 1}, {FIELD(block_q8_0, qs), 2}}},
    {CV_TYPE_Q4_K, sizeof(block_q4_K), 4, 6,
     {{1, 0}, {1, 1}, {1, 0}, {1, 1}, {FIELD(block_q4_K, scales), 2}, {FIELD(block_q4_K, qs), 3}}},
    {CV_TYPE_Q5_K, sizeof(block_q5_K), 5, 7,
     {{1, 0}, {1, 1}, {1, 0}, {1, 1}, {FIELD(block_q5_K, scales), 2}, {FIELD(block_q5_K, qh), 3},
      {FIELD(block_q5_K, qs), 4}}},
    {CV_TYPE_Q6_K, sizeof(block_q6_K), 5, 5,
     {{FIELD(block_q6_K, ql), 0}, {FIELD(block_q6_K, qh), 1}, {FIELD(block_q6_K, scales), 2}, {1, 3}, {1, 4}}},
};
/* the runs above follow the fields with no gap */
static_assert(offsetof(block_q4_0, qs) == 2 && offsetof(block_q8_0, qs) == 2, "Q4_0/Q8_0: d, then qs");
static_assert(offsetof(block_q4_K, scales) == 4 && offsetof(block_q5_K, qh) == 4 + K_SCALE_SIZE,
              "K-quants: d, dmin, scales, ...");
static_assert(offsetof(block_q6_K, d) == sizeof(block_q6_K) - 2, "Q6_K: ql, qh, scales, then d");

static const layout whole = {0, 1, 1, 1, {{1, 0}}};

/* Where a stream's bytes of every block go: per_block[s] bytes of stream s
 * in each block, at run_at[r] within them for run r. */
typedef struct cut {
    const layout *l;
    uint64_t blocks;
    uint32_t per_block[CV_PLANES_MAX_STREAMS];
    uint32_t run_at[8];
    uint64_t stream_off[CV_PLANES_MAX_STREAMS]; /* offset of stream s in the gathered bytes */
} cut;

/* type's layout, `whole` when it has none. */
static const layout *layout_for(uint32_t type)
{
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i].type == type)
            return &layouts[i];
    return &whole;
}

/* The layout a tensor of n bytes is cut by: not a whole number of blocks
 * is one stream. */
static const layout *layout_of(uint32_t type, uint64_t n)
{
    const layout *l = layout_for(type);
    return n % l->block ? &whole : l;
}

static cut cut_of(uint32_t type, uint64_t n)
{
    cut k = {.l = layout_of(type, n)};
    k.blocks = n / k.l->block;
    for (int r = 0; r < k.l->n_runs; r++) {
        k.run_at[r] = k.per_block[k.l->runs[r].stream];
        k.per_block[k.l->runs[r].stream] += k.l->runs[r].len;
    }
    for (int s = 1; s < k.l->n_streams; s++)
        k.stream_off[s] = k.stream_off[s - 1] + k.blocks * k.per_block[s - 1];
    return k;
}

uint64_t cv_planes_block(uint32_t type)
{
    return layout_for(type)->block;
}

int cv_planes_streams(uint32_t type, uint64_t n)
{
    return layout_of(type, n)->n_streams;
}

uint64_t cv_planes_bound(uint32_t type, uint64_t n)
{
    return n + (uint64_t)cv_planes_streams(type, n) * cv_rans_bound(0);
}

/* Moves bytes between a tensor and its gathered streams: gather when
 * `to_streams`, else scatter. */
static void shuffle(const cut *k, uint8_t *tensor, uint8_t *streams, int to_streams)
{
    const layout *l = k->l;
    for (uint64_t b = 0; b < k->blocks; b++) {
        uint8_t *p = tensor + b * l->block;
        for (int r = 0; r < l->n_runs; r++) {
            const int s = l->runs[r].stream;
            uint8_t *q = streams + k->stream_off[s] + b * k->per_block[s] + k->run_at[r];
            if (l->runs[r].len == 1)
                *(to_streams ? q : p) = *(to_streams ? p : q);
            else
                memcpy(to_streams ? q : p, to_streams ? p : q, l->runs[r].len);
            p += l->runs[r].len;
        }
    }
}

static int encode_streams(const cut *k, const uint8_t *streams, uint8_t *dst, uint64_t cap, uint64_t *len,
                          char *err, size_t errlen)
{
    *len = 0;
    for (int s = 0; s < k->l->n_streams; s++) {
        uint64_t one;
        if (cv_rans_encode(streams + k->stream_off[s], k->blocks * k->per_block[s], CV_RANS_LANES, dst + *len,
                           cap - *len, &one, err, errlen))
            return -1;
        *len += one;
    }
    return 0;
}

int cv_planes_encode(uint32_t type, const uint8_t *src, uint64_t n, uint8_t *dst, uint64_t cap, uint64_t *len,
                     char *err, size_t errlen)
{
    const cut k = cut_of(type, n);
    if (cap < cv_planes_bound(type, n))
        return cv_errf(err, errlen, "planes: %" PRIu64 " bytes of room for a tensor of %" PRIu64, cap, n);
    if (k.l->n_streams == 1)
        return encode_streams(&k, src, dst, cap, len, err, errlen);
    uint8_t *streams = cv_malloc(n);
    if (!streams)
        return cv_errf(err, errlen, "planes: out of memory for %" PRIu64 " bytes", n);
    shuffle(&k, (uint8_t *)src, streams, 1);
    const int rc = encode_streams(&k, streams, dst, cap, len, err, errlen);
    cv_free(streams);
    return rc;
}

static int decode_streams(const cut *k, cv_cursor *c, uint8_t *streams, char *err, size_t errlen)
{
    for (int s = 0; s < k->l->n_streams; s++) {
        const uint64_t want = k->blocks * k->per_block[s];
        uint64_t got;
        if (cv_rans_decode(c, streams + k->stream_off[s], want, &got, err, errlen))
            return -1;
        if (got != want)
            return cv_errf(err, errlen, "planes: stream %d holds %" PRIu64 " bytes, not %" PRIu64, s, got, want);
    }
    return 0;
}

int cv_planes_decode(uint32_t type, cv_cursor *c, uint8_t *dst, uint64_t n, char *err, size_t errlen)
{
    const cut k = cut_of(type, n);
    if (k.l->n_streams == 1)
        return decode_streams(&k, c, dst, err, errlen);
    uint8_t *streams = cv_malloc(n);
    if (!streams)
        return cv_errf(err, errlen, "planes: out of memory for %" PRIu64 " bytes", n);
    const int rc = decode_streams(&k, c, streams, err, errlen);
    if (!rc)
        shuffle(&k, dst, streams, 0);
    cv_free(streams);
    return rc;
}
