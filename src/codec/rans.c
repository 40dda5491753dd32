/* rans.c: the rANS stream of rans.h: a static model per stream, lanes
 * interleaved byte by byte, 32-bit states renormalized by 16-bit words.
 * Decoding reads the stream here and runs its rounds with the loop of
 * rans_impl.h that suits the CPU (rans_avx2.c) or the scalar one below,
 * which also finishes every stream. */
#include "codec/rans.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "codec/rans_impl.h"
#include "core/err.h"
#include "kernels/kernels.h"

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void count_bytes(const uint8_t *src, uint64_t n, uint64_t cnt[256])
{
    memset(cnt, 0, 256 * sizeof cnt[0]);
    for (uint64_t i = 0; i < n; i++)
        cnt[src[i]]++;
}

/* The present symbol with the largest frequency (above 1 when `shrink`:
 * one that can give a cell away). */
static int largest(const uint32_t freq[256], int shrink)
{
    int best = -1;
    for (int s = 0; s < 256; s++)
        if (freq[s] > (shrink ? 1u : 0u) && (best < 0 || freq[s] > freq[best]))
            best = s;
    return best;
}

/* Frequencies proportional to the counts (n > 0), every present symbol at
 * least 1, summing to CV_RANS_SCALE: the rounding is settled on the largest
 * symbols, where a cell more or less costs the fewest bits. */
static void normalize(const uint64_t cnt[256], uint64_t n, uint32_t freq[256])
{
    uint32_t sum = 0;
    for (int s = 0; s < 256; s++) {
        freq[s] = cnt[s] ? (uint32_t)((double)cnt[s] * CV_RANS_SCALE / (double)n) : 0;
        if (cnt[s] && freq[s] == 0)
            freq[s] = 1;
        sum += freq[s];
    }
    if (sum < CV_RANS_SCALE)
        freq[largest(freq, 0)] += CV_RANS_SCALE - sum;
    for (; sum > CV_RANS_SCALE; sum--) /* at most 256 rounded-up ones */
        freq[largest(freq, 1)]--;
}

/* Bits the coded symbols will take under freq (an estimate: exact up to
 * the states' flush). */
static double coded_bits(const uint64_t cnt[256], const uint32_t freq[256])
{
    double bits = 0;
    for (int s = 0; s < 256; s++)
        if (cnt[s])
            bits += (double)cnt[s] * (CV_RANS_SCALE_BITS - log2((double)freq[s]));
    return bits;
}

/* Writes the model (bitmap and frequencies) at p; returns its size. */
static size_t put_model(uint8_t *p, const uint32_t freq[256])
{
    size_t k = 0;
    memset(p, 0, CV_RANS_BITMAP_BYTES);
    for (int s = 0; s < 256; s++) {
        if (!freq[s])
            continue;
        p[s >> 3] |= (uint8_t)(1u << (s & 7));
        put_le(p + CV_RANS_BITMAP_BYTES + 2 * k++, freq[s], 2);
    }
    return CV_RANS_BITMAP_BYTES + 2 * k;
}

/* Runs the encoder backwards over src, writing words downwards from hi (not
 * below lo); x[] gets the final states. Returns where the words begin, or
 * NULL when they do not fit (coding does not pay). */
static uint8_t *encode_words(const uint8_t *src, uint64_t n, int lanes, const uint32_t freq[256],
                             const uint32_t start[256], uint8_t *lo, uint8_t *hi, uint32_t *x)
{
    for (int l = 0; l < lanes; l++)
        x[l] = CV_RANS_L;
    uint8_t *p = hi;
    int l = n ? (int)((n - 1) % (uint64_t)lanes) : 0;
    for (uint64_t i = n; i-- > 0;) {
        const uint32_t s = src[i], f = freq[s];
        uint32_t v = x[l];
        if ((uint64_t)v >= ((uint64_t)f << (32 - CV_RANS_SCALE_BITS))) {
            if (p - lo < 2)
                return NULL;
            p -= 2;
            p[0] = (uint8_t)v;
            p[1] = (uint8_t)(v >> 8);
            v >>= 16;
        }
        x[l] = ((v / f) << CV_RANS_SCALE_BITS) + v % f + start[s];
        l = l ? l - 1 : lanes - 1;
    }
    return p;
}

/* Codes src after the 9-byte header at dst; returns the stream's size, or 0
 * when coding does not beat storing. */
static uint64_t encode_coded(const uint8_t *src, uint64_t n, int lanes, uint8_t *dst)
{
    uint64_t cnt[256];
    uint32_t freq[256], start[256], x[CV_RANS_MAX_LANES];
    count_bytes(src, n, cnt);
    normalize(cnt, n, freq);
    const uint64_t stored = cv_rans_bound(n);
    uint64_t fixed = CV_RANS_HEADER_BYTES + 1 + CV_RANS_BITMAP_BYTES + 8 + 4 * (uint64_t)lanes;
    for (int s = 0; s < 256; s++)
        fixed += freq[s] ? 2 : 0;
    if (coded_bits(cnt, freq) / 8 + fixed >= (double)stored)
        return 0;
    for (int s = 0, at = 0; s < 256; at += (int)freq[s], s++)
        start[s] = (uint32_t)at;
    uint8_t *p = dst + CV_RANS_HEADER_BYTES;
    *p++ = (uint8_t)lanes;
    p += put_model(p, freq);
    uint8_t *words_at = p + 8 + 4 * (size_t)lanes;
    uint8_t *first = encode_words(src, n, lanes, freq, start, words_at, dst + stored, x);
    if (!first)
        return 0;
    const uint64_t n_words = (uint64_t)(dst + stored - first) / 2;
    put_le(p, n_words, 8);
    for (int l = 0; l < lanes; l++)
        put_le(p + 8 + 4 * l, x[l], 4);
    memmove(words_at, first, 2 * n_words);
    return (uint64_t)(words_at - dst) + 2 * n_words;
}

int cv_rans_encode(const uint8_t *src, uint64_t n, int lanes, uint8_t *dst, uint64_t cap, uint64_t *len,
                   char *err, size_t errlen)
{
    if (lanes < 1 || lanes > CV_RANS_MAX_LANES)
        return cv_errf(err, errlen, "rans: %d lanes (1..%d)", lanes, CV_RANS_MAX_LANES);
    if (cap < cv_rans_bound(n))
        return cv_errf(err, errlen, "rans: %" PRIu64 " bytes of room for a stream of up to %" PRIu64, cap,
                       cv_rans_bound(n));
    put_le(dst + 1, n, 8);
    *len = n ? encode_coded(src, n, lanes, dst) : 0;
    dst[0] = *len ? CV_RANS_CODED : CV_RANS_STORED;
    if (!*len) {
        if (n)
            memcpy(dst + CV_RANS_HEADER_BYTES, src, n);
        *len = cv_rans_bound(n);
    }
    return 0;
}

/* Reads the model into a cell table: entry = symbol | (freq - 1) << 8 |
 * (c - start) << 20 for cell c, so that one load gives all a decoding step needs. */
static int read_model(cv_cursor *c, uint32_t tab[CV_RANS_SCALE], char *err, size_t errlen)
{
    const uint8_t *bits = cv_cursor_bytes(c, CV_RANS_BITMAP_BYTES, "symbol bitmap");
    uint32_t at = 0;
    for (int s = 0; bits && s < 256; s++) {
        if (!(bits[s >> 3] >> (s & 7) & 1))
            continue;
        const uint32_t f = cv_cursor_u16(c, "frequency");
        if (c->failed)
            break;
        if (f == 0 || f > CV_RANS_SCALE - at)
            return cv_errf(err, errlen, "rans: symbol %d has frequency %" PRIu32 " (%" PRIu32 " cells left of %u)",
                           s, f, CV_RANS_SCALE - at, CV_RANS_SCALE);
        for (uint32_t j = 0; j < f; j++)
            tab[at + j] = (uint32_t)s | (f - 1) << 8 | j << 20;
        at += f;
    }
    if (c->failed)
        return cv_errf(err, errlen, "rans: stream truncated in its %s at byte %zu", c->fail_what, c->fail_off);
    if (at != CV_RANS_SCALE)
        return cv_errf(err, errlen, "rans: frequencies sum to %" PRIu32 ", not %u", at, CV_RANS_SCALE);
    return 0;
}

/* One decoding step of a state: its byte into *out, the state before
 * renormalization returned. */
static inline uint32_t step(const uint32_t *tab, uint32_t v, uint8_t *out)
{
    const uint32_t e = tab[v & (CV_RANS_SCALE - 1)];
    *out = (uint8_t)e;
    return (((e >> 8) & (CV_RANS_SCALE - 1)) + 1) * (v >> CV_RANS_SCALE_BITS) + (e >> 20);
}

/* rans_impl.h's rounds in scalar C, for CV_RANS_LANES lanes: a fixed lane
 * count keeps the states in registers and the rounds free of bounds
 * checks. */
static uint64_t rounds_ref(const uint32_t *tab, uint32_t *x, int lanes, const uint8_t **w, const uint8_t *end,
                           uint8_t *dst, uint64_t n)
{
    uint32_t v[CV_RANS_LANES];
    const uint8_t *p = *w;
    uint64_t i = 0;
    if (lanes != CV_RANS_LANES)
        return 0;
    memcpy(v, x, sizeof v);
    for (; i + CV_RANS_LANES <= n && end - p >= 2 * CV_RANS_LANES; i += CV_RANS_LANES) {
        /* Unrolled, so that the states live in registers. */
#pragma GCC unroll 8
        for (int l = 0; l < CV_RANS_LANES; l++) {
            /* Branch-free renormalization: whether a state takes a word is
             * a coin toss the branch predictor would lose (and compilers
             * turn a plain `take ? a : b` into that branch). */
            const uint32_t s = step(tab, v[l], dst + i + l), take = s < CV_RANS_L;
            const uint32_t word = p[0] | (uint32_t)p[1] << 8;
            v[l] = s ^ ((s ^ (s << 16 | word)) & (0u - take));
            p += 2 * take;
        }
    }
    memcpy(x, v, sizeof v);
    *w = p;
    return i;
}

/* The decoding loop of rans.h over n bytes, its rounds by `rounds` and the
 * rest here; -1 when the words run out. */
static int decode_bytes(rans_rounds_fn rounds, const uint32_t *tab, uint32_t *x, int lanes, const uint8_t *w,
                        const uint8_t *end, uint8_t *dst, uint64_t n, const uint8_t **w_end)
{
    int l = 0;
    for (uint64_t i = rounds(tab, x, lanes, &w, end, dst, n); i < n; i++) {
        uint32_t v = step(tab, x[l], dst + i);
        if (v < CV_RANS_L) {
            if (end - w < 2)
                return -1;
            v = v << 16 | w[0] | (uint32_t)w[1] << 8;
            w += 2;
        }
        x[l] = v;
        l = l + 1 == lanes ? 0 : l + 1;
    }
    *w_end = w;
    return 0;
}

static int decode_coded(rans_rounds_fn rounds, cv_cursor *c, uint8_t *dst, uint64_t n, char *err, size_t errlen)
{
    static _Thread_local uint32_t tab[CV_RANS_SCALE];
    uint32_t x[CV_RANS_MAX_LANES];
    const int lanes = cv_cursor_u8(c, "lane count");
    if (!c->failed && (lanes < 1 || lanes > CV_RANS_MAX_LANES))
        return cv_errf(err, errlen, "rans: %d lanes (1..%d)", lanes, CV_RANS_MAX_LANES);
    if (read_model(c, tab, err, errlen))
        return -1;
    const uint64_t n_words = cv_cursor_u64(c, "word count");
    for (int l = 0; l < lanes; l++)
        x[l] = cv_cursor_u32(c, "lane state");
    if (!c->failed && n_words > cv_cursor_left(c) / 2)
        return cv_errf(err, errlen, "rans: %" PRIu64 " words but %zu bytes left", n_words, cv_cursor_left(c));
    const uint8_t *w = cv_cursor_bytes(c, 2 * n_words, "words"), *w_end = NULL;
    if (c->failed)
        return cv_errf(err, errlen, "rans: stream truncated in its %s at byte %zu", c->fail_what, c->fail_off);
    for (int l = 0; l < lanes; l++)
        if (x[l] < CV_RANS_L)
            return cv_errf(err, errlen, "rans: lane %d starts at state %" PRIu32 ", below 2^16", l, x[l]);
    if (decode_bytes(rounds, tab, x, lanes, w, w + 2 * n_words, dst, n, &w_end) || w_end != w + 2 * n_words)
        return cv_errf(err, errlen, "rans: the stream's %" PRIu64 " words do not decode %" PRIu64 " bytes exactly",
                       n_words, n);
    for (int l = 0; l < lanes; l++)
        if (x[l] != CV_RANS_L)
            return cv_errf(err, errlen, "rans: lane %d ends at state %" PRIu32 ", not 2^16: corrupt stream", l, x[l]);
    return 0;
}

static int decode(rans_rounds_fn rounds, cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, char *err,
                  size_t errlen)
{
    const uint8_t method = cv_cursor_u8(c, "method");
    *n = cv_cursor_u64(c, "length");
    if (c->failed)
        return cv_errf(err, errlen, "rans: stream truncated in its %s at byte %zu", c->fail_what, c->fail_off);
    if (*n > cap)
        return cv_errf(err, errlen, "rans: a stream of %" PRIu64 " bytes where %" PRIu64 " fit", *n, cap);
    if (method == CV_RANS_CODED)
        return decode_coded(rounds, c, dst, *n, err, errlen);
    if (method != CV_RANS_STORED)
        return cv_errf(err, errlen, "rans: unknown method %u", method);
    const uint8_t *data = cv_cursor_bytes(c, *n, "stored bytes");
    if (c->failed)
        return cv_errf(err, errlen, "rans: stored stream of %" PRIu64 " bytes truncated at byte %zu", *n, c->fail_off);
    if (*n)
        memcpy(dst, data, *n);
    return 0;
}

int cv_rans_decode_ref(cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, char *err, size_t errlen)
{
    return decode(rounds_ref, c, dst, cap, n, err, errlen);
}

/* The rounds for this CPU: the kernels' choice (kernels.h), so that
 * CONVOY_KERNELS=ref also gives the scalar decoder. */
static rans_rounds_fn best_rounds(void)
{
#if defined(__x86_64__)
    if (cv_kernels_avx2())
        return cv_rans_rounds_avx2;
#endif
    return rounds_ref;
}

int cv_rans_decode(cv_cursor *c, uint8_t *dst, uint64_t cap, uint64_t *n, char *err, size_t errlen)
{
    return decode(best_rounds(), c, dst, cap, n, err, errlen);
}
