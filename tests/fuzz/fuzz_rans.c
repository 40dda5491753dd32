/* fuzz_rans.c: libFuzzer target for convoy's lossless coder.
 *
 * The first byte picks what the rest is: (0) a rANS stream to decode, (1)
 * a coded tensor of a type and length taken from the next bytes, (2) a
 * packed file, (3) one packed segment with a room taken from the next
 * bytes, each of which must decode or be refused with a message, never
 * touching memory outside the input and the output (AddressSanitizer),
 * a rANS stream decoded alike by cv_rans_decode (SIMD where the CPU has
 * it) and cv_rans_decode_ref: verdict, message, length, cursor and bytes;
 * (4) bytes to encode with a lane count from the next byte, which must
 * decode to themselves with both decoders, and, with one byte the input
 * picks corrupted, decode alike with both; or (5) a file's layout (tensors of sizes up to a
 * few MiB), whose segments must cover the file exactly, agree with
 * cv_pack_boundary and ask the bytes callback for one tensor or gap at a
 * time, and one of which, picked by the input, must code and decode to its
 * bytes. Every decode holds at most 1 MiB (a pack segment's most), so no
 * input asks for more memory than the fuzzer allows. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/pack.h"
#include "codec/planes.h"
#include "codec/rans.h"
#include "core/err.h"

#define CAP (1u << 20)

static uint8_t out[CAP], out_ref[CAP], coded[CV_PACK_SEGMENT_BOUND];

static const uint32_t types[] = {0, 1, 30, 2, 8, 12, 13, 14, 15};
#define N_TYPES (sizeof types / sizeof types[0])

static int has_prefix(const char *err, const char *prefix)
{
    return strncmp(err, prefix, strlen(prefix)) == 0;
}

/* A refusal must say what is wrong, from one of the codec's layers. */
static void must_fail_cleanly(int rc, const char *err)
{
    if (rc && !has_prefix(err, "rans: ") && !has_prefix(err, "planes: ") && !has_prefix(err, "pack: ") &&
        !has_prefix(err, "unpack: "))
        abort();
}

/* Decodes d[0..n) with both rANS decoders (room: CAP); aborts unless they
 * agree in everything, bytes written before a refusal included. Returns
 * cv_rans_decode's result. */
static int decode_both(const uint8_t *d, size_t n)
{
    cv_cursor c, c_ref;
    uint64_t got = 0, got_ref = 0, claim = 0;
    char err[CV_ERRLEN] = "", err_ref[CV_ERRLEN] = "";
    for (int i = 0; n >= CV_RANS_HEADER_BYTES && i < 8; i++)
        claim |= (uint64_t)d[1 + i] << (8 * i);
    /* a stream writes at most its length, when that fits */
    claim = claim <= CAP ? claim : 0;
    memset(out, 0, claim);
    memset(out_ref, 0, claim);
    cv_cursor_init(&c, d, n);
    cv_cursor_init(&c_ref, d, n);
    const int rc = cv_rans_decode(&c, out, CAP, &got, err, sizeof err);
    const int rc_ref = cv_rans_decode_ref(&c_ref, out_ref, CAP, &got_ref, err_ref, sizeof err_ref);
    must_fail_cleanly(rc, err);
    if (rc != rc_ref || got != got_ref || c.off != c_ref.off || c.failed != c_ref.failed || strcmp(err, err_ref) ||
        memcmp(out, out_ref, claim))
        abort();
    return rc;
}

static void decode_stream(const uint8_t *d, size_t n)
{
    decode_both(d, n);
}

static void decode_tensor(const uint8_t *d, size_t n)
{
    if (n < 3)
        return;
    const uint32_t type = types[d[0] % N_TYPES];
    const uint64_t len = (uint64_t)d[1] << 8 | d[2];
    cv_cursor c;
    char err[CV_ERRLEN] = "";
    cv_cursor_init(&c, d + 3, n - 3);
    must_fail_cleanly(cv_planes_decode(type, &c, out, len * 16, err, sizeof err), err);
}

static void decode_pack(const uint8_t *d, size_t n)
{
    static FILE *sink;
    uint64_t size, n_segments;
    char err[CV_ERRLEN] = "";
    if (!sink)
        sink = fopen("/dev/null", "wb");
    must_fail_cleanly(cv_pack_read(d, n, sink, &size, &n_segments, err, sizeof err), err);
}

/* Room: all of out when the first byte is even, else the next two bytes. */
static void decode_segment(const uint8_t *d, size_t n)
{
    if (n < 3)
        return;
    const uint64_t cap = d[0] & 1 ? (uint64_t)d[1] << 8 | d[2] : CAP;
    cv_cursor c;
    uint64_t got = 0;
    uint8_t kind = 0;
    uint32_t type = 0;
    char err[CV_ERRLEN] = "";
    cv_cursor_init(&c, d + 3, n - 3);
    const int rc = cv_pack_segment_decode(&c, out, cap, &got, &kind, &type, err, sizeof err);
    must_fail_cleanly(rc, err);
    if (!rc && (got == 0 || got > cap || got > CV_PACK_SEGMENT_MAX || (kind != CV_PACK_RAW && kind != CV_PACK_TENSOR)))
        abort();
}

static void round_trip(const uint8_t *d, size_t n)
{
    if (n < 1 || n - 1 > CAP)
        return;
    const int lanes = d[0] % CV_RANS_MAX_LANES + 1;
    uint64_t len, got;
    cv_cursor c;
    if (cv_rans_encode(d + 1, n - 1, lanes, coded, sizeof coded, &len, NULL, 0))
        abort();
    cv_cursor_init(&c, coded, len);
    if (cv_rans_decode(&c, out, CAP, &got, NULL, 0) || got != n - 1 || memcmp(out, d + 1, n - 1) ||
        cv_cursor_left(&c) || decode_both(coded, len))
        abort();
    coded[(d[0] * 257u + n) % len] ^= (uint8_t)(d[n - 1] | 1);
    decode_both(coded, len);
}

#define MAX_TENSORS 6

/* A file of pattern bytes: byte i is pattern[i % CAP]. */
static uint8_t pattern[2 * CAP];

/* The bytes callback: aborts on a range across a tensor's edge. */
static const uint8_t *pattern_bytes(const void *user, uint64_t off, uint64_t n)
{
    const cv_pack_src *s = user;
    for (size_t i = 0; i < s->n_tensors; i++) {
        const uint64_t start = s->tensors[i].offset, end = start + s->tensors[i].size;
        if ((off < start && off + n > start) || (off < end && off + n > end))
            abort();
    }
    if (n > CAP)
        abort();
    return pattern + off % CAP;
}

/* Reads the layout: per tensor 5 bytes (type, its top bit: size in units
 * of 67 bytes; u16 gap in units of 61; u16 size), then a u16 trailing gap
 * and the u24 offset of the segment to code, *pick. */
static int read_layout(const uint8_t *d, size_t n, cv_pack_src *s, cv_pack_tensor *t, uint64_t *pick)
{
    const size_t k = n ? d[0] % (MAX_TENSORS + 1) : 0;
    if (n < 1 + 5 * k + 5)
        return -1;
    uint64_t at = 0;
    for (size_t i = 0; i < k; i++, d += 5) {
        const uint8_t *r = d + 1;
        t[i].type = types[r[0] % N_TYPES];
        t[i].offset = at + (uint64_t)(r[1] | r[2] << 8) * 61;
        t[i].size = (uint64_t)(r[3] | r[4] << 8) * (r[0] & 0x80 ? 67 : 1) + 1;
        at = t[i].offset + t[i].size;
    }
    d++;
    *s = (cv_pack_src){at + (uint64_t)(d[0] | d[1] << 8) * 61, t, k, pattern_bytes, s};
    *pick = (uint64_t)d[2] | (uint64_t)d[3] << 8 | (uint64_t)d[4] << 16;
    return 0;
}

/* The whole cut is consistent; the segment holding pick round trips when
 * it is at most 64 KiB (bigger ones take the fuzzer's time, to code the
 * same way). */
static void check_layout(const uint8_t *d, size_t n)
{
    cv_pack_tensor t[MAX_TENSORS];
    cv_pack_src s;
    cv_pack_segment seg;
    uint64_t pick, count = 0, len, got;
    static int patterned;
    for (size_t i = 0; !patterned && i < sizeof pattern; i++)
        pattern[i] = (uint8_t)((i * i) >> 9 & 0x1F);
    patterned = 1;
    if (read_layout(d, n, &s, t, &pick) || cv_pack_src_check(&s, NULL, 0) || s.size == 0)
        return;
    for (uint64_t at = 0; at < s.size; at += seg.len, count++) {
        cv_pack_segment_at(&s, at, &seg);
        if (seg.len == 0 || seg.len > CV_PACK_SEGMENT_MAX || cv_pack_boundary(&s, at) != at ||
            cv_pack_boundary(&s, at + seg.len - 1) != at)
            abort();
    }
    if (count != cv_pack_count(&s) || cv_pack_boundary(&s, s.size) != s.size)
        abort();
    cv_pack_segment_at(&s, cv_pack_boundary(&s, pick % s.size), &seg);
    if (seg.len > 1u << 16)
        return;
    cv_cursor c;
    uint8_t kind;
    uint32_t type;
    if (cv_pack_segment_encode(&s, &seg, coded, sizeof coded, &len, NULL, 0))
        abort();
    cv_cursor_init(&c, coded, len);
    if (cv_pack_segment_decode(&c, out, CAP, &got, &kind, &type, NULL, 0) || got != seg.len || kind != seg.kind ||
        type != seg.type || cv_cursor_left(&c) || memcmp(out, pattern + seg.offset % CAP, got))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    switch (data[0] % 6) {
    case 0: decode_stream(data + 1, size - 1); break;
    case 1: decode_tensor(data + 1, size - 1); break;
    case 2: decode_pack(data + 1, size - 1); break;
    case 3: decode_segment(data + 1, size - 1); break;
    case 4: round_trip(data + 1, size - 1); break;
    default: check_layout(data + 1, size - 1); break;
    }
    return 0;
}
