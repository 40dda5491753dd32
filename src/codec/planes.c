/* planes.c: the tensor codec of planes.h: gathers a tensor's blocks into
 * streams by its type's layout, codes each with rans.h. */
#include "codec/planes.h"

#include <inttypes.h>
#include <string.h>

#include "codec/rans.h"
#include "core/alloc.h"
#include "core/err.h"

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

/* planes.h's table. */
static const layout layouts[] = {
    {0, 4, 4, 4, {{1, 0}, {1, 1}, {1, 2}, {1, 3}}},                              /* F32 */
    {1, 2, 2, 2, {{1, 0}, {1, 1}}},                                              /* F16 */
    {30, 2, 2, 2, {{1, 0}, {1, 1}}},                                             /* BF16 */
    {2, 18, 3, 3, {{1, 0}, {1, 1}, {16, 2}}},                                    /* Q4_0 */
    {8, 34, 3, 3, {{1, 0}, {1, 1}, {32, 2}}},                                    /* Q8_0 */
    {12, 144, 4, 6, {{1, 0}, {1, 1}, {1, 0}, {1, 1}, {12, 2}, {128, 3}}},          /* Q4_K */
    {13, 176, 5, 7, {{1, 0}, {1, 1}, {1, 0}, {1, 1}, {12, 2}, {32, 3}, {128, 4}}}, /* Q5_K */
    {14, 210, 5, 5, {{128, 0}, {64, 1}, {16, 2}, {1, 3}, {1, 4}}},                /* Q6_K */
};

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

static const layout *layout_of(uint32_t type, uint64_t n)
{
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i].type == type)
            return n % layouts[i].block ? &whole : &layouts[i];
    return &whole;
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
