/* test_proto.c: the wire protocol of src/pipe/proto.h.
 *
 * CRC32C against its check value and a bitwise reference; the frame header
 * at its pinned offsets and each of its rejections; a round trip of every
 * message; every truncation of every message (decoded from an exact-size
 * heap copy, so AddressSanitizer sees any read past the end) and a
 * trailing byte rejected with a message naming the message; targeted
 * corruptions of each message, counts that lie included, rejected with a
 * message naming the field; encoders refusing what decoders would refuse;
 * activation conversions. `test_proto --corpus DIR` writes one encoded
 * sample of each message as seeds for tests/fuzz/fuzz_frame.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "pipe/proto.h"
#include "test.h"

typedef int (*decode_fn)(const void *payload, size_t len, char *err, size_t errlen);

static _Alignas(64) uint8_t buf[1 << 16];

static int has(const char *err, const char *needle) { return strstr(err, needle) != NULL; }

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
    }
    return ~crc;
}

static void test_crc32c(void)
{
    CHECK(cv_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(cv_crc32c(0, "", 0) == 0);
    uint8_t data[1000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof data; i++) {
        x = x * 1664525u + 1013904223u;
        data[i] = (uint8_t)(x >> 24);
    }
    for (size_t n = 0; n < sizeof data; n += 37)
        CHECKF(cv_crc32c(0, data + 1, n) == crc32c_bitwise(data + 1, n), "n=%zu", n);
    CHECK(cv_crc32c(cv_crc32c(0, data, 333), data + 333, 667) == cv_crc32c(0, data, 1000));
}

static void test_header(void)
{
    const char payload[] = "some payload bytes";
    cv_frame_header h = cv_frame_header_make(CV_MSG_FORWARD, 0xA1B2C3D4u, payload, sizeof payload);
    uint8_t raw[CV_FRAME_HEADER_SIZE];
    cv_frame_header_encode(&h, raw);
    CHECK(memcmp(raw, "CVY1", 4) == 0);
    CHECK(raw[4] == 1 && raw[5] == 0);
    CHECK(raw[6] == CV_MSG_FORWARD && raw[7] == 0);
    CHECK(raw[8] == 0 && raw[9] == 0 && raw[10] == 0 && raw[11] == 0);
    CHECK(raw[12] == 0xD4 && raw[13] == 0xC3 && raw[14] == 0xB2 && raw[15] == 0xA1);
    CHECK(raw[16] == sizeof payload && raw[17] == 0);
    uint32_t crc = cv_crc32c(0, payload, sizeof payload);
    CHECK(raw[20] == (crc & 0xff) && raw[23] == crc >> 24);

    char err[CV_ERRLEN] = "";
    cv_frame_header d;
    CHECKF(cv_frame_header_decode(raw, 1024, &d, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&d, &h, sizeof d) == 0);
    CHECKF(cv_frame_check_payload(&d, payload, err, sizeof err) == 0, "%s", err);
    char bad_payload[sizeof payload];
    memcpy(bad_payload, payload, sizeof payload);
    bad_payload[3] ^= 0x10;
    CHECK(cv_frame_check_payload(&d, bad_payload, err, sizeof err) == -1 && has(err, "checksum"));

    struct {
        int off;
        uint8_t val;
        const char *needle;
    } cases[] = {
        {0, 'X', "magic"},          {3, '2', "magic"},          {4, 2, "frame version 2"},
        {6, 0, "unknown message type 0"}, {6, CV_MSG_COUNT, "unknown message type"}, {7, 1, "unknown message type"},
        {9, 1, "frame flags"},      {19, 1, "exceeds the link's cap"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t c[CV_FRAME_HEADER_SIZE];
        memcpy(c, raw, sizeof c);
        c[cases[i].off] = cases[i].val;
        err[0] = 0;
        CHECKF(cv_frame_header_decode(c, 1024, &d, err, sizeof err) == -1 && has(err, cases[i].needle),
               "case %zu: '%s'", i, err);
    }
    CHECK(cv_frame_header_decode(raw, sizeof payload - 1, &d, err, sizeof err) == -1 && has(err, "cap"));
    for (int t = 0; t < 20; t++)
        CHECKF((strcmp(cv_msg_type_name((uint32_t)t), "unknown") != 0) == (t >= 1 && t < CV_MSG_COUNT), "type %d", t);
    CHECK(strcmp(cv_msg_type_name(CV_MSG_BYE), "BYE") == 0);
}

/* Every prefix of enc[0..n) fails with a message starting with name, and
 * one byte more fails too; each candidate lives in an exact-size heap copy. */
static void check_truncations(const uint8_t *enc, size_t n, decode_fn dec, const char *name)
{
    char err[CV_ERRLEN];
    for (size_t k = 0; k < n; k++) {
        uint8_t *copy = cv_malloc(k ? k : 1);
        memcpy(copy, enc, k);
        err[0] = 0;
        int rc = dec(k ? copy : NULL, k, err, sizeof err);
        CHECKF(rc == -1 && strncmp(err, name, strlen(name)) == 0, "%s truncated to %zu of %zu: rc %d '%s'", name, k,
               n, rc, err);
        cv_free(copy);
    }
    uint8_t *longer = cv_malloc(n + 1);
    memcpy(longer, enc, n);
    longer[n] = 0;
    err[0] = 0;
    CHECKF(dec(longer, n + 1, err, sizeof err) == -1 && has(err, name), "%s with a trailing byte: '%s'", name, err);
    cv_free(longer);
}

/* Decodes a copy of enc with byte off set to val; returns the message. */
static const char *corrupt(const uint8_t *enc, size_t n, size_t off, const uint8_t *val, size_t val_len,
                           decode_fn dec)
{
    static char err[CV_ERRLEN];
    static _Alignas(64) uint8_t copy[sizeof buf];
    memcpy(copy, enc, n);
    memcpy(copy + off, val, val_len);
    err[0] = 0;
    if (dec(copy, n, err, sizeof err) == 0)
        return "(accepted)";
    return err;
}

static const char *corrupt_u32(const uint8_t *enc, size_t n, size_t off, uint32_t v, decode_fn dec)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return corrupt(enc, n, off, b, 4, dec);
}

static const char *corrupt_u8(const uint8_t *enc, size_t n, size_t off, uint8_t v, decode_fn dec)
{
    return corrupt(enc, n, off, &v, 1, dec);
}

/* ---- HELLO ---- */

/* An assignment of layers [4, 12) with three tensor hashes (at most
 * 8 * 14 + 3 = 115). */
static const uint8_t sample_hashes[3 * CV_PROTO_HASH_BYTES] = {1, 2, 3, [40] = 0x40, [95] = 0xff};

static cv_msg_hello sample_hello(void)
{
    cv_msg_hello m = {
        .proto_version = CV_PROTO_VERSION,
        .role = CV_ROLE_HEAD,
        .act_type = CV_ACT_F32,
        .features = 0x10,
        .model_hash = {0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF, [31] = 0x5A},
        .n_hashes = 3,
        .hashes = sample_hashes,
        .l0 = 4,
        .l1 = 12,
        .n_layer = 16,
        .n_ctx = 4096,
        .n_slot = 8,
        .n_batch_max = 512,
        .n_embd = 2048,
        .max_payload = 1u << 24,
        .cluster_id = 0xFEEDFACECAFEBEEFull,
    };
    strcpy(m.next_addr, "10.77.0.3:7001");
    return m;
}

static int dec_hello(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_hello m;
    return cv_msg_hello_decode(p, n, &m, err, errlen);
}

static void test_hello(void)
{
    char err[CV_ERRLEN] = "";
    cv_msg_hello m = sample_hello(), d;
    size_t n = 0;
    CHECKF(cv_msg_hello_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == cv_msg_hello_size(&m) && n == 86 + strlen(m.next_addr) + 3 * 32);
    CHECKF(cv_msg_hello_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.hashes == buf + 86 + strlen(m.next_addr) && memcmp(d.hashes, sample_hashes, sizeof sample_hashes) == 0);
    d.hashes = m.hashes;
    CHECK(memcmp(&d, &m, sizeof d) == 0);
    CHECK(cv_msg_validate(CV_MSG_HELLO, buf, n, err, sizeof err) == 0);
    check_truncations(buf, n, dec_hello, "HELLO");

    CHECK(has(corrupt_u8(buf, n, 2, 2, dec_hello), "role"));
    CHECK(has(corrupt_u8(buf, n, 3, 3, dec_hello), "act_type 3"));
    CHECK(has(corrupt_u8(buf, n, 3, CV_ACT_F16, dec_hello), "LOSSY_ACT"));
    CHECK(has(corrupt_u32(buf, n, 12, 17, dec_hello), "layer range"));
    CHECK(has(corrupt_u32(buf, n, 8, 13, dec_hello), "layer range"));
    CHECK(has(corrupt_u32(buf, n, 16, 0, dec_hello), "n_layer"));
    CHECK(has(corrupt_u32(buf, n, 20, 0, dec_hello), "n_ctx"));
    CHECK(has(corrupt_u32(buf, n, 24, 0, dec_hello), "n_slot"));
    CHECK(has(corrupt_u32(buf, n, 28, 0, dec_hello), "n_batch_max"));
    CHECK(has(corrupt_u32(buf, n, 32, CV_PROTO_MAX_EMBD + 1, dec_hello), "n_embd"));
    CHECK(has(corrupt_u32(buf, n, 36, 100, dec_hello), "max_payload"));
    CHECK(has(corrupt_u8(buf, n, 86 + 2, 0, dec_hello), "next_addr has a NUL"));
    CHECK(has(corrupt_u8(buf, n, 86 + 2, '\n', dec_hello), "control byte"));
    /* next_addr length lies: longer than what is left, and over the limit */
    CHECK(has(corrupt_u8(buf, n, 84, 200, dec_hello), "payload ends inside"));
    CHECK(has(corrupt_u8(buf, n, 85, 1, dec_hello), "next_addr length"));
    /* the hash count: bounded by the layer range before it sizes a read,
     * then matched with the bytes present */
    const uint32_t most = 8 * CV_PROTO_HASHES_PER_LAYER + CV_PROTO_HASHES_EXTRA; /* layers [4, 12) */
    char want[64], at_most[32];
    snprintf(want, sizeof want, "%u tensor hashes, at most %u", most + 1, most);
    snprintf(at_most, sizeof at_most, "at most %u", most);
    CHECK(has(corrupt_u32(buf, n, 80, most + 1, dec_hello), want));
    CHECK(has(corrupt_u32(buf, n, 80, 0xFFFFFFFFu, dec_hello), at_most));
    CHECK(has(corrupt_u32(buf, n, 80, 4, dec_hello), "payload ends inside"));
    CHECK(has(corrupt_u32(buf, n, 80, 2, dec_hello), "trailing"));
    /* a query (no layers) carries none */
    CHECK(has(corrupt_u32(buf, n, 12, 4, dec_hello), "at most 0"));
    /* a different protocol version is refused first and reported */
    char other_version[32];
    snprintf(other_version, sizeof other_version, "protocol version %d,", CV_PROTO_VERSION + 1);
    const char *e = corrupt_u8(buf, n, 0, CV_PROTO_VERSION + 1, dec_hello);
    CHECKF(has(e, other_version), "%s", e);
    cv_msg_hello v;
    uint8_t two[2] = {7, 0};
    CHECK(cv_msg_hello_decode(two, 2, &v, err, sizeof err) == -1 && v.proto_version == 7);

    /* the lossy type is fine with the feature bit; q8_0 needs n_embd % 32 */
    cv_msg_hello lossy = sample_hello();
    lossy.act_type = CV_ACT_Q8_0;
    lossy.features |= CV_FEAT_LOSSY_ACT;
    CHECKF(cv_msg_hello_encode(&lossy, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(cv_msg_hello_decode(buf, n, &d, err, sizeof err) == 0 && d.act_type == CV_ACT_Q8_0);
    lossy.n_embd = 100;
    CHECK(cv_msg_hello_encode(&lossy, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "multiple of 32"));

    /* encoder refusals: bad fields, small buffer, control bytes */
    cv_msg_hello bad = sample_hello();
    bad.l1 = 20;
    CHECK(cv_msg_hello_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "layer range"));
    bad = sample_hello();
    bad.next_addr[0] = '\t';
    CHECK(cv_msg_hello_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "control"));
    bad = sample_hello();
    bad.role = CV_ROLE_PREV_NODE;
    CHECK(cv_msg_hello_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "at most 0"));
    bad = sample_hello();
    bad.hashes = NULL;
    CHECK(cv_msg_hello_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "no pointer"));
    bad = sample_hello();
    bad.proto_version = CV_PROTO_VERSION + 1;
    CHECK(cv_msg_hello_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "proto_version"));
    m = sample_hello();
    CHECK(cv_msg_hello_encode(&m, buf, 30, &n, err, sizeof err) == -1 && has(err, "too small"));
    /* the last stage's HELLO has an empty next_addr */
    m.next_addr[0] = 0;
    CHECK(cv_msg_hello_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0 && n == 86 + 3 * 32);
    CHECK(cv_msg_hello_decode(buf, n, &d, err, sizeof err) == 0 && d.next_addr[0] == 0);
}

/* ---- HELLO_OK ---- */

static int dec_hello_ok(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_hello_ok m;
    return cv_msg_hello_ok_decode(p, n, &m, err, errlen);
}

static void test_hello_ok(void)
{
    char err[CV_ERRLEN] = "";
    cv_msg_hello_ok m = {CV_PROTO_VERSION, 1234, 3ull << 30, 123456789012ull, 1u << 22, 2, 5, CV_HOK_RECEIVES, 3}, d;
    size_t n = 0;
    CHECKF(cv_msg_hello_ok_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_MSG_HELLO_OK_SIZE);
    CHECKF(cv_msg_hello_ok_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.proto_version == m.proto_version && d.us_per_layer_token == 1234 && d.mem_budget == m.mem_budget &&
          d.layer_bytes == m.layer_bytes && d.max_payload == m.max_payload && d.held_l0 == 2 && d.held_l1 == 5 &&
          d.flags == CV_HOK_RECEIVES && d.n_threads == 3);
    check_truncations(buf, n, dec_hello_ok, "HELLO_OK");
    char other_version[32];
    snprintf(other_version, sizeof other_version, "protocol version %d,", CV_PROTO_VERSION + 1);
    CHECK(has(corrupt_u8(buf, n, 0, CV_PROTO_VERSION + 1, dec_hello_ok), other_version));
    CHECK(has(corrupt_u8(buf, n, 2, 1, dec_hello_ok), "reserved"));
    CHECK(has(corrupt_u32(buf, n, CV_HELLO_OK_OFF_FLAGS, 2, dec_hello_ok), "unknown flags"));
    CHECK(has(corrupt_u32(buf, n, CV_HELLO_OK_OFF_HELD_L1, 2, dec_hello_ok), "held layers [2, 2)"));
    CHECK(has(corrupt_u32(buf, n, CV_HELLO_OK_OFF_HELD_L1, CV_PROTO_MAX_LAYER + 1, dec_hello_ok), "held layers"));
    CHECK(has(corrupt_u32(buf, n, 24, 5, dec_hello_ok), "max_payload"));
    m.max_payload = 0;
    CHECK(cv_msg_hello_ok_encode(&m, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "max_payload"));
}

/* ---- FETCH / SHIP ---- */

static int dec_fetch(const void *p, size_t n, char *err, size_t errlen)
{
    uint64_t have;
    return cv_msg_fetch_decode(p, n, &have, err, errlen);
}

static int dec_ship(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_ship m;
    return cv_msg_ship_decode(p, n, &m, err, errlen);
}

static void test_fetch_ship(void)
{
    char err[CV_ERRLEN] = "";
    size_t n = 0;
    uint64_t have = 0;
    CHECKF(cv_msg_fetch_encode(123456789ull, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_MSG_FETCH_SIZE && cv_msg_fetch_decode(buf, n, &have, err, sizeof err) == 0 && have == 123456789ull);
    check_truncations(buf, n, dec_fetch, "FETCH");
    CHECK(cv_msg_validate(CV_MSG_FETCH, buf, n, err, sizeof err) == 0);
    cv_msg_ship m = {.offset = 4096, .size = 1u << 20}, d;
    CHECKF(cv_msg_ship_encode_header(&m, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_SHIP_FIXED_SIZE);
    memcpy(buf + n, "\0\1\0\0\0\0\0\0\0x", 10); /* a raw segment of one byte */
    CHECKF(cv_msg_ship_decode(buf, n + 10, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.offset == 4096 && d.size == 1u << 20 && d.segment == buf + n && d.segment_len == 10);
    CHECK(cv_msg_validate(CV_MSG_SHIP, buf, n + 10, err, sizeof err) == 0);
    CHECK(dec_ship(buf, n, err, sizeof err) == -1 && has(err, "a segment of 0 bytes"));
    CHECK(dec_ship(buf, 12, err, sizeof err) == -1 && has(err, "SHIP"));
    CHECK(has(corrupt_u32(buf, n + 10, 0, 1u << 20, dec_ship), "not inside the file"));
    CHECK(dec_ship(buf, CV_SHIP_PAYLOAD_MAX + 1, err, sizeof err) == -1 && has(err, "expected 1 to"));
    m.offset = m.size;
    CHECK(cv_msg_ship_encode_header(&m, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "not inside"));
    CHECK(!strcmp(cv_msg_type_name(CV_MSG_FETCH), "FETCH") && !strcmp(cv_msg_type_name(CV_MSG_SHIP), "SHIP"));
}

/* ---- ERROR ---- */

static int dec_error(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_error m;
    return cv_msg_error_decode(p, n, &m, err, errlen);
}

static void test_error(void)
{
    char err[CV_ERRLEN] = "";
    const char *text = "node 10.77.0.2:7001: model fingerprint 0x12 differs from the head's 0x34";
    size_t n = 0;
    CHECKF(cv_msg_error_encode(CV_PERR_FINGERPRINT, text, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == cv_msg_error_size(text));
    cv_msg_error d;
    CHECKF(cv_msg_error_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.code == CV_PERR_FINGERPRINT && strcmp(d.message, text) == 0);
    CHECK(strcmp(cv_perr_name(d.code), "FINGERPRINT") == 0 && strcmp(cv_perr_name(999), "unknown") == 0);
    check_truncations(buf, n, dec_error, "ERROR");
    CHECK(has(corrupt_u32(buf, n, 0, 0, dec_error), "code 0"));
    CHECK(has(corrupt_u8(buf, n, 5, 2, dec_error), "message length"));
    CHECK(has(corrupt_u8(buf, n, 4, (uint8_t)(n - 6 + 1), dec_error), "payload ends inside message"));
    CHECK(has(corrupt_u8(buf, n, 8, 0x1b, dec_error), "control byte"));
    /* a code this build does not know is still an error with its text */
    CHECK(strcmp(corrupt_u32(buf, n, 0, 4000, dec_error), "(accepted)") == 0);

    /* control bytes are sent as '?', long messages are cut */
    CHECK(cv_msg_error_encode(CV_PERR_INTERNAL, "a\nb", buf, sizeof buf, &n, err, sizeof err) == 0);
    CHECK(cv_msg_error_decode(buf, n, &d, err, sizeof err) == 0 && strcmp(d.message, "a?b") == 0);
    char long_text[2000];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = 0;
    CHECK(cv_msg_error_encode(CV_PERR_INTERNAL, long_text, buf, sizeof buf, &n, err, sizeof err) == 0);
    CHECK(n == 6 + CV_PROTO_ERRMSG_MAX);
    CHECK(cv_msg_error_decode(buf, n, &d, err, sizeof err) == 0 && strlen(d.message) == CV_PROTO_ERRMSG_MAX);
    CHECK(cv_msg_error_encode(0, "x", buf, sizeof buf, &n, err, sizeof err) == -1);
    CHECK(cv_msg_error_encode(1, "xyz", buf, 8, &n, err, sizeof err) == -1 && has(err, "too small"));
}

/* ---- FORWARD ---- */

static int dec_forward(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_forward m;
    return cv_msg_forward_decode(p, n, &m, err, errlen);
}

static void test_forward(void)
{
    char err[CV_ERRLEN] = "";
    enum { NT = 3, NE = 64 };
    cv_fwd_token toks[NT] = {{11, 0, 5, 1, {0}}, {22, 1, 0, 1, {0}}, {33, 1, 1, CV_WANT_DRAFT, {9, 9, 9}}};
    float act[NT * NE];
    for (int i = 0; i < NT * NE; i++)
        act[i] = (float)i * 0.25f - 7.0f;
    cv_msg_forward m = {NT, NE, CV_ACT_F32, CV_FWD_HAS_HIDDEN | CV_FWD_WANT_LOGITS, toks, act, 2, {1234, 56}}, d;
    size_t n = 0;
    CHECKF(cv_msg_forward_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == 16 + 16 * NT + 4 * NT * NE + 8 && n == cv_msg_forward_size(&m));
    CHECKF(cv_msg_forward_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.n_tokens == NT && d.n_embd == NE && d.act_type == CV_ACT_F32 && d.flags == m.flags);
    CHECK((const uint8_t *)d.tokens == buf + 16 && (const uint8_t *)d.act == buf + 16 + 16 * NT);
    for (int i = 0; i < NT; i++)
        CHECK(d.tokens[i].token == toks[i].token && d.tokens[i].seq == toks[i].seq &&
              d.tokens[i].pos == toks[i].pos && d.tokens[i].want == toks[i].want && d.tokens[i].reserved[0] == 0);
    CHECK(memcmp(d.act, act, sizeof act) == 0);
    CHECK(d.n_trail == 2 && d.trail[0] == 1234 && d.trail[1] == 56);
    check_truncations(buf, n, dec_forward, "FORWARD");

    /* counts that lie */
    CHECK(has(corrupt_u32(buf, n, 0, NT + 1, dec_forward), "need"));
    CHECK(has(corrupt_u32(buf, n, 0, 0xFFFFFFFFu, dec_forward), "n_tokens 4294967295 needs"));
    CHECK(has(corrupt_u32(buf, n, 0, 0, dec_forward), "n_tokens is 0"));
    CHECK(has(corrupt_u32(buf, n, 4, NE + 1, dec_forward), "activations and 2 stage times need"));
    CHECK(has(corrupt_u32(buf, n, 4, 0xFFFFFFFFu, dec_forward), "n_embd"));
    CHECK(has(corrupt_u8(buf, n, 8, CV_ACT_F16, dec_forward), "activations and 2 stage times need"));
    CHECK(has(corrupt_u8(buf, n, 8, 7, dec_forward), "act_type 7"));
    CHECK(has(corrupt_u8(buf, n, 9, 0x80, dec_forward), "flags"));
    CHECK(has(corrupt_u8(buf, n, 9, CV_FWD_WANT_LOGITS, dec_forward), "without HAS_HIDDEN"));
    CHECK(has(corrupt_u8(buf, n, 10, 3, dec_forward), "and 3 stage times need"));
    CHECK(has(corrupt_u8(buf, n, 10, CV_TRAIL_MAX, dec_forward), "n_trail 16 leaves no room"));
    CHECK(has(corrupt_u8(buf, n, 11, 1, dec_forward), "reserved"));
    CHECK(has(corrupt_u8(buf, n, 15, 1, dec_forward), "reserved"));
    /* records */
    CHECK(has(corrupt_u32(buf, n, 16 + 16 + 0, 0x80000000u, dec_forward), "record 1: token"));
    CHECK(has(corrupt_u32(buf, n, 16 + 16 + 4, 0xFFFFFFFFu, dec_forward), "record 1: seq -1"));
    CHECK(has(corrupt_u32(buf, n, 16 + 32 + 8, 0xFFFFFFFEu, dec_forward), "record 2: pos -2"));
    CHECK(has(corrupt_u8(buf, n, 16 + 12, 5, dec_forward), "record 0: want 5 is not 0 to 4"));
    CHECK(strcmp(corrupt_u8(buf, n, 16 + 12, CV_WANT_POOL, dec_forward), "(accepted)") == 0);
    CHECK(strcmp(corrupt_u8(buf, n, 16 + 12, CV_WANT_EMBED, dec_forward), "(accepted)") == 0);
    CHECK(has(corrupt_u8(buf, n, 16 + 32 + 15, 1, dec_forward), "record 2: reserved"));

    /* a misaligned buffer is refused (decoded pointers would be misaligned) */
    static _Alignas(64) uint8_t shifted[sizeof buf + 1];
    memcpy(shifted + 1, buf, n);
    CHECK(cv_msg_forward_decode(shifted + 1, n, &d, err, sizeof err) == -1 && has(err, "aligned"));

    /* header only + activations and trail in parts of their own give the same bytes */
    static _Alignas(64) uint8_t two[sizeof buf];
    size_t header = 0;
    CHECK(cv_msg_forward_encode_header(&m, two, sizeof two, &header, err, sizeof err) == 0);
    CHECK(header == cv_msg_forward_header_size(&m) &&
          header + cv_msg_forward_act_size(&m) + cv_msg_forward_trail_size(&m) == n);
    memcpy(two + header, act, sizeof act);
    cv_msg_forward_encode_trail(&m, two + header + sizeof act);
    CHECK(memcmp(two, buf, n) == 0);

    /* a trail after activations of an odd size is read unaligned */
    cv_msg_forward odd = {NT, 63, CV_ACT_F16, CV_FWD_HAS_HIDDEN, toks, buf + 40000, 1, {77777}};
    CHECK(cv_msg_forward_encode(&odd, buf, sizeof buf, &n, err, sizeof err) == 0 && n % 4 == 2);
    CHECK(cv_msg_forward_decode(buf, n, &d, err, sizeof err) == 0 && d.n_trail == 1 && d.trail[0] == 77777);

    /* first stage: token ids only */
    cv_msg_forward ids = {NT, 0, CV_ACT_F32, 0, toks, NULL, 0, {0}};
    CHECK(cv_msg_forward_encode(&ids, buf, sizeof buf, &n, err, sizeof err) == 0 && n == 16 + 16 * NT);
    CHECK(cv_msg_forward_decode(buf, n, &d, err, sizeof err) == 0 && d.act == NULL && d.n_embd == 0);
    check_truncations(buf, n, dec_forward, "FORWARD");
    CHECK(has(corrupt_u32(buf, n, 4, 8, dec_forward), "without HAS_HIDDEN"));

    /* lossy activation layouts */
    cv_msg_forward q = {NT, NE, CV_ACT_Q8_0, CV_FWD_HAS_HIDDEN, toks, buf + 40000, 0, {0}};
    CHECK(cv_msg_forward_size(&q) == 16 + 16 * NT + NT * (NE / 32) * 34);
    CHECK(cv_msg_forward_encode(&q, buf, sizeof buf, &n, err, sizeof err) == 0);
    CHECK(cv_msg_forward_decode(buf, n, &d, err, sizeof err) == 0 && d.act_type == CV_ACT_Q8_0);
    CHECK(has(corrupt_u32(buf, n, 4, 48, dec_forward), "multiple of 32"));
    q.n_embd = 40;
    CHECK(cv_msg_forward_encode(&q, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "multiple of 32"));

    /* encoder refusals */
    cv_fwd_token neg = {1, -3, 0, 0, {0}};
    cv_msg_forward bad = {1, 0, CV_ACT_F32, 0, &neg, NULL, 0, {0}};
    CHECK(cv_msg_forward_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "seq -3"));
    bad = m;
    bad.act = NULL;
    CHECK(cv_msg_forward_encode(&bad, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "HAS_HIDDEN"));
    CHECK(cv_msg_forward_encode(&m, buf, 100, &n, err, sizeof err) == -1 && has(err, "too small"));
}

/* ---- RESULT ---- */

static int dec_result(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_result m;
    cv_result_row rows[8];
    return cv_msg_result_decode(p, n, &m, rows, 8, err, errlen);
}

/* RESULT's embedding rows: a sampled row, then an embedding row, with
 * and without logits. */
static void test_result_embd(void)
{
    char err[CV_ERRLEN] = "";
    enum { NE = 4, NV = 8 };
    cv_result_row rows[2] = {{1, 3, 6, 0, NULL, CV_ROW_SAMPLED}, {2, 9, -1, 0, NULL, CV_ROW_EMBD}};
    const float embd[NE] = {0.5f, -0.5f, 0.5f, -0.5f};
    cv_msg_result m = {2, CV_RES_HAS_EMBD, 0, rows, NULL, 1, {5}, NE, embd}, d;
    enum { R0 = 16 + 4 }; /* the first row: after the fixed part, n_embd and a trail of 1 */
    cv_result_row out[4];
    size_t n = 0;
    CHECKF(cv_msg_result_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == R0 + 2 * 16 + NE * 4 && n == cv_msg_result_size(&m));
    CHECKF(cv_msg_result_decode(buf, n, &d, out, 4, err, sizeof err) == 0, "%s", err);
    CHECK(d.flags == CV_RES_HAS_EMBD && d.n_embd == NE && d.embd && memcmp(d.embd, embd, sizeof embd) == 0);
    CHECK(out[0].kind == CV_ROW_SAMPLED && out[0].token == 6 && out[1].kind == CV_ROW_EMBD && out[1].token == -1);
    CHECK(cv_msg_validate(CV_MSG_RESULT, buf, n, err, sizeof err) == 0);
    check_truncations(buf, n, dec_result, "RESULT");
    CHECK(has(corrupt_u32(buf, n, 12, 0, dec_result), "n_embd 0 is outside"));
    CHECK(has(corrupt_u32(buf, n, 12, CV_PROTO_MAX_EMBD + 1, dec_result), "n_embd 1048577 is outside"));
    CHECK(has(corrupt_u32(buf, n, 12, NE + 1, dec_result), "1 embeddings of 5 floats need 20 bytes, 16 present"));
    CHECK(has(corrupt_u32(buf, n, 4, 0, dec_result), "RESULT: ")); /* the fields after flags shift */
    CHECK(has(corrupt_u32(buf, n, R0 + 16 + 8, 0, dec_result), "row 1: an embedding row with token 0"));
    CHECK(has(corrupt_u8(buf, n, R0 + 16 + 14, 0, dec_result), "RESULT: "));       /* no embedding row left */
    CHECK(has(corrupt_u8(buf, n, R0 + 16 + 12, 1, dec_result), "with token -1 and 1 pairs"));
    CHECK(has(corrupt_u8(buf, n, R0 + 14, 1, dec_result), "RESULT: ")); /* a sampled row with a token */

    /* the flag without an embedding row, or without the vectors, is refused */
    rows[1].kind = CV_ROW_SAMPLED;
    rows[1].token = 2;
    CHECK(cv_msg_result_encode(&m, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "without an embedding row"));
    rows[1] = (cv_result_row){2, 9, -1, 0, NULL, CV_ROW_EMBD};
    m.embd = NULL;
    CHECK(cv_msg_result_encode(&m, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "without embeddings"));
    m.embd = embd;
    m.flags = 0;
    CHECK(cv_msg_result_encode(&m, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "without HAS_EMBD"));

    /* with logits: the embeddings follow them */
    float logits[2 * NV] = {1, 2, 3};
    cv_msg_result ml = {2, CV_RES_HAS_LOGITS | CV_RES_HAS_EMBD, NV, rows, logits, 1, {5}, NE, embd};
    CHECKF(cv_msg_result_encode(&ml, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == R0 + 4 + 2 * 16 + 2 * NV * 4 + NE * 4 && n == cv_msg_result_size(&ml));
    CHECKF(cv_msg_result_decode(buf, n, &d, out, 4, err, sizeof err) == 0, "%s", err);
    CHECK(d.n_vocab == NV && d.n_embd == NE && memcmp(d.logits, logits, sizeof logits) == 0);
    CHECK(memcmp(d.embd, embd, sizeof embd) == 0);
    check_truncations(buf, n, dec_result, "RESULT");
}

static void test_result(void)
{
    char err[CV_ERRLEN] = "";
    cv_top_entry top0[3] = {{5, -0.1f}, {9, -2.5f}, {1, -INFINITY}};
    cv_result_row rows[2] = {{0, 7, 5, 3, top0, CV_ROW_SAMPLED}, {3, 0, 2, 0, NULL, CV_ROW_SAMPLED}};
    cv_msg_result m = {2, 0, 0, rows, NULL, 2, {700, 9}, 0, NULL}, d;
    enum { R0 = 12 + 8 }; /* the first row: after the fixed part and a trail of 2 */
    cv_result_row out[4];
    size_t n = 0;
    CHECKF(cv_msg_result_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == R0 + 16 + 24 + 16 && n == cv_msg_result_size(&m));
    CHECKF(cv_msg_result_decode(buf, n, &d, out, 4, err, sizeof err) == 0, "%s", err);
    CHECK(d.n_rows == 2 && d.flags == 0 && d.logits == NULL && d.rows == out);
    CHECK(d.n_trail == 2 && d.trail[0] == 700 && d.trail[1] == 9);
    CHECK(out[0].seq == 0 && out[0].pos == 7 && out[0].token == 5 && out[0].n_top == 3);
    CHECK(out[0].top[1].id == 9 && out[0].top[1].logprob == -2.5f && isinf(out[0].top[2].logprob));
    CHECK(out[1].seq == 3 && out[1].token == 2 && out[1].n_top == 0 && out[1].top == NULL);
    CHECK(cv_msg_validate(CV_MSG_RESULT, buf, n, err, sizeof err) == 0);
    check_truncations(buf, n, dec_result, "RESULT");
    CHECK(cv_msg_result_decode(buf, n, &d, out, 1, err, sizeof err) == -1 && has(err, "more than the 1"));

    CHECK(has(corrupt_u32(buf, n, 0, 5, dec_result), "n_rows 5 needs"));
    CHECK(has(corrupt_u32(buf, n, 0, 3, dec_result), "payload ends inside"));
    CHECK(has(corrupt_u32(buf, n, 4, 4, dec_result), "flags"));
    CHECK(has(corrupt_u32(buf, n, 8, 0, dec_result), "n_trail 0 is outside"));
    CHECK(has(corrupt_u32(buf, n, 8, CV_TRAIL_MAX + 1, dec_result), "n_trail 17 is outside"));
    CHECK(has(corrupt_u32(buf, n, 8, 3, dec_result), "RESULT: "));
    CHECK(has(corrupt_u8(buf, n, R0 + 12, 21, dec_result), "n_top 21 needs"));
    CHECK(has(corrupt_u8(buf, n, R0 + 13, 0xff, dec_result), "n_top 65283 exceeds"));
    CHECK(has(corrupt_u8(buf, n, R0 + 14, 1, dec_result), "row 0: an embedding row without HAS_EMBD"));
    CHECK(has(corrupt_u8(buf, n, R0 + 14, 2, dec_result), "row 0: kind 2 is unknown"));
    CHECK(has(corrupt_u32(buf, n, R0 + 0, 0xFFFFFFFFu, dec_result), "row 0: seq -1"));
    CHECK(has(corrupt_u32(buf, n, R0 + 4, 0xFFFFFFFFu, dec_result), "row 0: pos"));
    CHECK(has(corrupt_u32(buf, n, R0 + 40 + 8, 0xFFFFFFFFu, dec_result), "row 1: token"));
    CHECK(has(corrupt_u32(buf, n, R0 + 16 + 8, 0x80000001u, dec_result), "top 1: id"));
    CHECK(has(corrupt_u32(buf, n, R0 + 16 + 4, 0x7FC00000u, dec_result), "NaN"));
    /* the row after a row whose n_top lies a little */
    CHECK(has(corrupt_u8(buf, n, R0 + 12, 4, dec_result), "RESULT: "));

    /* with logits: n_vocab bounds the ids */
    enum { NV = 16 };
    float logits[2 * NV];
    for (int i = 0; i < 2 * NV; i++)
        logits[i] = (float)i - 3.5f;
    cv_msg_result ml = {2, CV_RES_HAS_LOGITS, NV, rows, logits, 1, {3}, 0, NULL};
    CHECKF(cv_msg_result_encode(&ml, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == 16 + 4 + 16 + 24 + 16 + 2 * NV * 4 && n == cv_msg_result_size(&ml));
    CHECK(cv_msg_result_decode(buf, n, &d, out, 4, err, sizeof err) == 0 && d.n_vocab == NV);
    CHECK(d.logits && memcmp(d.logits, logits, sizeof logits) == 0);
    check_truncations(buf, n, dec_result, "RESULT");
    CHECK(has(corrupt_u32(buf, n, 12, NV + 1, dec_result), "logits need"));
    CHECK(has(corrupt_u32(buf, n, 12, 0, dec_result), "n_vocab 0"));
    CHECK(has(corrupt_u32(buf, n, 12, 0xFFFFFFFFu, dec_result), "n_vocab"));
    CHECK(has(corrupt_u32(buf, n, 12, 6, dec_result), "not a vocabulary id"));
    CHECK(strcmp(corrupt_u32(buf, n, 4, 0, dec_result), "(accepted)") != 0);
    ml.n_vocab = 4;
    CHECK(cv_msg_result_encode(&ml, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "vocabulary id"));

    /* an empty RESULT (a batch with no wanted rows) is valid */
    cv_msg_result e = {0, 0, 0, NULL, NULL, 1, {0}, 0, NULL};
    CHECK(cv_msg_result_encode(&e, buf, sizeof buf, &n, err, sizeof err) == 0 && n == 16);
    CHECK(cv_msg_result_decode(buf, n, &d, NULL, 0, err, sizeof err) == 0 && d.n_rows == 0);
    cv_msg_result el = {0, CV_RES_HAS_LOGITS, 7, NULL, NULL, 1, {0}, 0, NULL};
    CHECK(cv_msg_result_encode(&el, buf, sizeof buf, &n, err, sizeof err) == 0 && n == 20);
    CHECK(cv_msg_result_decode(buf, n, &d, NULL, 0, err, sizeof err) == 0 && d.n_vocab == 7 && !d.logits);
    CHECK(cv_msg_result_encode(&m, buf, 10, &n, err, sizeof err) == -1 && has(err, "too small"));
    test_result_embd();
}

/* ---- SEQ_OP ---- */

static int dec_seq_op(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_seq_op m;
    return cv_msg_seq_op_decode(p, n, &m, err, errlen);
}

/* Field by field: the struct's padding holds whatever its initializer left. */
static bool same_sampler(const cv_sampler_params *a, const cv_sampler_params *b)
{
    return a->temp == b->temp && a->top_k == b->top_k && a->top_p == b->top_p && a->min_p == b->min_p &&
           a->repeat_penalty == b->repeat_penalty && a->penalty_last_n == b->penalty_last_n &&
           a->freq_penalty == b->freq_penalty && a->presence_penalty == b->presence_penalty && a->seed == b->seed &&
           a->n_draws == b->n_draws && a->n_bias == b->n_bias && a->bias == b->bias;
}

static void test_seq_op(void)
{
    char err[CV_ERRLEN] = "";
    cv_msg_seq_op t = {.op = CV_SEQ_TRUNCATE, .seq = 4, .len = 17}, d;
    size_t n = 0;
    CHECKF(cv_msg_seq_op_encode(&t, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_SEQ_OP_SIZE);
    CHECK(cv_msg_seq_op_decode(buf, n, &d, err, sizeof err) == 0 && d.op == CV_SEQ_TRUNCATE && d.seq == 4 &&
          d.len == 17);
    check_truncations(buf, n, dec_seq_op, "SEQ_OP");
    CHECK(has(corrupt_u8(buf, n, 0, 9, dec_seq_op), "op 9"));
    CHECK(has(corrupt_u8(buf, n, 2, 1, dec_seq_op), "reserved"));
    CHECK(has(corrupt_u32(buf, n, 4, 0xFFFFFFFFu, dec_seq_op), "seq -1"));
    CHECK(has(corrupt_u32(buf, n, 8, 0xFFFFFFFFu, dec_seq_op), "TRUNCATE at negative position"));
    CHECK(has(corrupt_u8(buf, n, 0, CV_SEQ_FREE, dec_seq_op), "len 17"));
    /* SET_SAMPLER claimed on a 12-byte payload: the parameters are missing */
    CHECK(has(corrupt_u8(buf, n, 0, CV_SEQ_SET_SAMPLER, dec_seq_op), "payload ends inside temp"));

    cv_msg_seq_op s = {.op = CV_SEQ_SET_SAMPLER, .seq = 2, .n_probs = 5};
    s.sampler = cv_sampler_default_params();
    s.sampler.seed = 0x1122334455667788ull;
    s.sampler.top_k = -1;
    s.sampler.n_draws = 0x0102030405060708ull;
    CHECKF(cv_msg_seq_op_encode(&s, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_SEQ_OP_SAMPLER_SIZE);
    CHECKF(cv_msg_seq_op_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.op == CV_SEQ_SET_SAMPLER && d.seq == 2 && d.n_probs == 5);
    CHECK(same_sampler(&d.sampler, &s.sampler));
    check_truncations(buf, n, dec_seq_op, "SEQ_OP");
    CHECK(has(corrupt_u32(buf, n, 12, 0x7F800000u, dec_seq_op), "temp is not finite"));
    CHECK(has(corrupt_u32(buf, n, 40, 0xFFC00000u, dec_seq_op), "presence_penalty"));
    CHECK(has(corrupt_u32(buf, n, 32, 0xFFFFFFFFu, dec_seq_op), "penalty_last_n"));
    CHECK(has(corrupt_u32(buf, n, 52, CV_PROTO_MAX_TOP + 1, dec_seq_op), "n_probs"));
    CHECK(has(corrupt_u8(buf, n, 0, CV_SEQ_FREE, dec_seq_op), "trailing"));
    /* the logit bias: pairs after the fixed part, read in place */
    const cv_logit_bias bias[2] = {{7, -INFINITY}, {3, 2.5f}};
    s.sampler.bias = bias;
    s.sampler.n_bias = 2;
    CHECKF(cv_msg_seq_op_encode(&s, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_SEQ_OP_SAMPLER_SIZE + 16 && n == cv_msg_seq_op_size(&s));
    CHECKF(cv_msg_seq_op_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.sampler.n_bias == 2 && !memcmp(d.sampler.bias, bias, sizeof bias));
    check_truncations(buf, n, dec_seq_op, "SEQ_OP");
    CHECK(has(corrupt_u32(buf, n, 64, 3, dec_seq_op), "payload ends inside bias"));
    CHECK(has(corrupt_u32(buf, n, 64, CV_PROTO_MAX_BIAS + 1, dec_seq_op), "n_bias"));
    CHECK(has(corrupt_u32(buf, n, 64, 1, dec_seq_op), "trailing"));
    CHECK(has(corrupt_u32(buf, n, 68, 0xFFFFFFFFu, dec_seq_op), "id -1"));
    CHECK(has(corrupt_u32(buf, n, 72, 0x7F800000u, dec_seq_op), "not finite or -inf"));
    CHECK(has(corrupt_u32(buf, n, 80, 0x7FC00000u, dec_seq_op), "not finite or -inf"));
    s.sampler.n_bias = 0;
    s.sampler.top_p = NAN;
    CHECK(cv_msg_seq_op_encode(&s, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "top_p"));
    CHECK(cv_msg_seq_op_encode(&t, buf, 11, &n, err, sizeof err) == -1 && has(err, "too small"));

    /* SET_GRAMMAR: the position in len, then the text */
    const char *gbnf = "root ::= \"yes\" | \"no\"";
    cv_msg_seq_op g = {.op = CV_SEQ_SET_GRAMMAR, .seq = 3, .len = 40, .grammar = gbnf,
                       .grammar_len = (uint32_t)strlen(gbnf)};
    CHECKF(cv_msg_seq_op_encode(&g, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_SEQ_OP_GRAMMAR_FIXED_SIZE + strlen(gbnf) && n == cv_msg_seq_op_size(&g));
    CHECKF(cv_msg_seq_op_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.op == CV_SEQ_SET_GRAMMAR && d.seq == 3 && d.len == 40 && d.grammar_len == strlen(gbnf) &&
          !memcmp(d.grammar, gbnf, d.grammar_len));
    check_truncations(buf, n, dec_seq_op, "SEQ_OP");
    CHECK(has(corrupt_u32(buf, n, 8, 0xFFFFFFFFu, dec_seq_op), "SET_GRAMMAR at negative position"));
    uint8_t empty[CV_SEQ_OP_GRAMMAR_FIXED_SIZE];
    memcpy(empty, buf, sizeof empty);
    memset(empty + 12, 0, 4);
    CHECK(dec_seq_op(empty, sizeof empty, err, sizeof err) == -1 && has(err, "text of 0 bytes"));
    CHECK(has(corrupt_u32(buf, n, 12, CV_PROTO_MAX_GRAMMAR + 1, dec_seq_op), "at most"));
    CHECK(has(corrupt_u32(buf, n, 12, (uint32_t)strlen(gbnf) + 1, dec_seq_op), "payload ends inside grammar"));
    CHECK(has(corrupt_u8(buf, n, 20, 0, dec_seq_op), "NUL"));
    g.grammar_len = CV_PROTO_MAX_GRAMMAR + 1;
    CHECK(cv_msg_seq_op_encode(&g, buf, sizeof buf, &n, err, sizeof err) == -1 && has(err, "not 1.."));

    /* COPY: the source in seq, the length in len, the destination after them */
    const cv_msg_seq_op k = {.op = CV_SEQ_COPY, .seq = 1, .len = 30, .dst = 5};
    CHECKF(cv_msg_seq_op_encode(&k, buf, sizeof buf, &n, err, sizeof err) == 0, "%s", err);
    CHECK(n == CV_SEQ_OP_COPY_SIZE && n == cv_msg_seq_op_size(&k));
    CHECKF(cv_msg_seq_op_decode(buf, n, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.op == CV_SEQ_COPY && d.seq == 1 && d.len == 30 && d.dst == 5);
    check_truncations(buf, n, dec_seq_op, "SEQ_OP");
    CHECK(has(corrupt_u32(buf, n, 8, 0xFFFFFFFFu, dec_seq_op), "COPY at negative position"));
    CHECK(has(corrupt_u32(buf, n, 12, 0xFFFFFFFFu, dec_seq_op), "into seq -1"));
    CHECK(has(corrupt_u32(buf, n, 12, 1, dec_seq_op), "COPY of seq 1 into seq 1"));
    CHECK(has(corrupt_u8(buf, n, 0, CV_SEQ_TRUNCATE, dec_seq_op), "trailing"));
}

/* ---- PING / PONG / BYE, dispatch ---- */

static int dec_ping(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_ping m;
    return cv_msg_ping_decode(p, n, &m, err, errlen);
}

static void test_ping_bye(void)
{
    char err[CV_ERRLEN] = "";
    cv_msg_ping m = {0xDEADBEEF01020304ull, 987654321ull}, d;
    size_t n = 0;
    CHECK(cv_msg_ping_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0 && n == CV_MSG_PING_SIZE);
    CHECK(cv_msg_ping_decode(buf, n, &d, err, sizeof err) == 0 && d.nonce == m.nonce && d.timestamp == m.timestamp);
    check_truncations(buf, n, dec_ping, "PING");
    CHECK(cv_msg_validate(CV_MSG_PONG, buf, n, err, sizeof err) == 0);
    CHECK(cv_msg_bye_decode(NULL, 0, err, sizeof err) == 0);
    CHECK(cv_msg_bye_decode(buf, 1, err, sizeof err) == -1 && has(err, "BYE"));
    CHECK(cv_msg_validate(CV_MSG_BYE, NULL, 0, err, sizeof err) == 0);
    CHECK(cv_msg_validate(0, buf, n, err, sizeof err) == -1 && has(err, "unknown message type"));
    CHECK(cv_msg_validate(CV_MSG_COUNT, buf, n, err, sizeof err) == -1);
    CHECK(cv_msg_ping_encode(&m, buf, 15, &n, err, sizeof err) == -1);
}

static int dec_stats(const void *p, size_t n, char *err, size_t errlen)
{
    cv_msg_stats m;
    return cv_msg_stats_decode(p, n, &m, err, errlen);
}

static void test_stats(void)
{
    char err[CV_ERRLEN] = "";
    cv_msg_stats m = {123456789012ull, 40, 41, 1ull << 40}, d;
    size_t n = 0;
    CHECK(cv_msg_stats_encode(&m, buf, sizeof buf, &n, err, sizeof err) == 0 && n == CV_MSG_STATS_OK_SIZE);
    CHECK(cv_msg_stats_decode(buf, n, &d, err, sizeof err) == 0 && memcmp(&d, &m, sizeof d) == 0);
    CHECK(cv_msg_validate(CV_MSG_STATS_OK, buf, n, err, sizeof err) == 0);
    check_truncations(buf, n, dec_stats, "STATS_OK");
    CHECK(cv_msg_stats_encode(&m, buf, 31, &n, err, sizeof err) == -1 && has(err, "too small"));
    CHECK(cv_msg_validate(CV_MSG_STATS, NULL, 0, err, sizeof err) == 0);
    CHECK(cv_msg_validate(CV_MSG_STATS, buf, 1, err, sizeof err) == -1 && has(err, "STATS"));
    CHECK(strcmp(cv_msg_type_name(CV_MSG_STATS_OK), "STATS_OK") == 0);
}

/* ---- activations ---- */

static void test_activations(void)
{
    char err[CV_ERRLEN] = "";
    enum { N = 128 };
    float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = sinf((float)i * 0.37f) * 3.0f;
    static _Alignas(64) uint8_t wire[N * 4];

    CHECK(cv_act_bytes(CV_ACT_F32, 3, 64) == 768 && cv_act_bytes(CV_ACT_F16, 3, 64) == 384);
    CHECK(cv_act_bytes(CV_ACT_Q8_0, 3, 64) == 3 * 2 * 34 && cv_act_bytes(CV_ACT_Q8_0, 1, 40) == 0);
    CHECK(cv_act_bytes(9, 1, 64) == 0);

    CHECK(cv_act_from_f32(CV_ACT_F32, x, N, wire, err, sizeof err) == 0);
    CHECK(cv_act_to_f32(CV_ACT_F32, wire, N, y, err, sizeof err) == 0 && memcmp(x, y, sizeof x) == 0);

    CHECK(cv_act_from_f32(CV_ACT_F16, x, N, wire, err, sizeof err) == 0);
    CHECK(cv_act_to_f32(CV_ACT_F16, wire, N, y, err, sizeof err) == 0);
    float max_err = 0;
    for (int i = 0; i < N; i++)
        max_err = fmaxf(max_err, fabsf(x[i] - y[i]));
    CHECKF(max_err <= 3.0f / 1024, "f16 error %g", max_err);
    for (int i = 0; i < N; i++)
        CHECK(y[i] == cv_fp16_to_fp32(cv_fp32_to_fp16(x[i])));

    CHECK(cv_act_from_f32(CV_ACT_Q8_0, x, N, wire, err, sizeof err) == 0);
    CHECK(cv_act_to_f32(CV_ACT_Q8_0, wire, N, y, err, sizeof err) == 0);
    max_err = 0;
    for (int i = 0; i < N; i++)
        max_err = fmaxf(max_err, fabsf(x[i] - y[i]));
    CHECKF(max_err <= 3.0f / 127 && max_err > 0, "q8_0 error %g", max_err);
    CHECK(cv_act_from_f32(CV_ACT_Q8_0, x, 40, wire, err, sizeof err) == -1 && has(err, "multiple of 32"));
    CHECK(cv_act_to_f32(5, wire, 32, y, err, sizeof err) == -1 && has(err, "unknown"));
}

/* ---- seed corpus for tests/fuzz/fuzz_frame.c ---- */

static void write_seed(const char *dir, const char *name, uint16_t type, const uint8_t *payload, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s-payload", dir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        uint8_t mode = (uint8_t)type;
        fwrite(&mode, 1, 1, f);
        fwrite(payload, 1, n, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/%s-frame", dir, name);
    f = fopen(path, "wb");
    if (f) {
        uint8_t hdr[1 + CV_FRAME_HEADER_SIZE] = {0};
        cv_frame_header h = cv_frame_header_make(type, 1, payload, (uint32_t)n);
        cv_frame_header_encode(&h, hdr + 1);
        fwrite(hdr, 1, sizeof hdr, f);
        fwrite(payload, 1, n, f);
        fclose(f);
    }
}

static int write_corpus(const char *dir)
{
    char err[CV_ERRLEN] = "";
    size_t n;
    int rc = 0;
    cv_msg_hello h = sample_hello();
    rc |= cv_msg_hello_encode(&h, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "hello", CV_MSG_HELLO, buf, n);
    cv_msg_hello_ok ok = {CV_PROTO_VERSION, 10, 1u << 30, 1u << 20, 1u << 24, 0, 22, 0, 2};
    rc |= cv_msg_hello_ok_encode(&ok, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "hello_ok", CV_MSG_HELLO_OK, buf, n);
    rc |= cv_msg_error_encode(CV_PERR_NO_MEMORY, "layers 0..8 need 3 GiB", buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "error", CV_MSG_ERROR, buf, n);
    cv_fwd_token toks[2] = {{1, 0, 0, 0, {0}}, {2, 0, 1, 1, {0}}};
    float act[2 * 32] = {1.0f, -2.0f};
    cv_msg_forward fw = {2, 32, CV_ACT_F32, CV_FWD_HAS_HIDDEN, toks, act, 1, {250}};
    rc |= cv_msg_forward_encode(&fw, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "forward", CV_MSG_FORWARD, buf, n);
    cv_msg_forward ids = {2, 0, CV_ACT_F32, CV_FWD_WANT_LOGITS, toks, NULL, 0, {0}};
    rc |= cv_msg_forward_encode(&ids, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "forward_ids", CV_MSG_FORWARD, buf, n);
    cv_top_entry top[2] = {{3, -0.5f}, {1, -1.5f}};
    cv_result_row rows[2] = {{0, 1, 3, 2, top, CV_ROW_SAMPLED}, {1, 4, 0, 0, NULL, CV_ROW_SAMPLED}};
    cv_msg_result r = {2, 0, 0, rows, NULL, 2, {150, 80}, 0, NULL};
    rc |= cv_msg_result_encode(&r, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "result", CV_MSG_RESULT, buf, n);
    float logits[2 * 4] = {0.5f, 1.5f, -1.0f, 2.0f, 0, 0, 1, 0};
    cv_msg_result rl = {2, CV_RES_HAS_LOGITS, 4, rows, logits, 1, {400}, 0, NULL};
    rc |= cv_msg_result_encode(&rl, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "result_logits", CV_MSG_RESULT, buf, n);
    cv_result_row erows[2] = {{0, 1, 3, 2, top, CV_ROW_SAMPLED}, {1, 4, -1, 0, NULL, CV_ROW_EMBD}};
    const float embd[4] = {0.5f, 0.5f, -0.5f, 0.5f};
    cv_msg_result re = {2, CV_RES_HAS_EMBD, 0, erows, NULL, 1, {90}, 4, embd};
    rc |= cv_msg_result_encode(&re, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "result_embd", CV_MSG_RESULT, buf, n);
    cv_msg_seq_op t = {.op = CV_SEQ_TRUNCATE, .seq = 1, .len = 5};
    rc |= cv_msg_seq_op_encode(&t, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "seq_truncate", CV_MSG_SEQ_OP, buf, n);
    cv_msg_seq_op sp = {.op = CV_SEQ_SET_SAMPLER, .seq = 0, .sampler = cv_sampler_default_params(), .n_probs = 2};
    rc |= cv_msg_seq_op_encode(&sp, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "seq_sampler", CV_MSG_SEQ_OP, buf, n);
    const cv_logit_bias bias[1] = {{5, -3.0f}};
    sp.sampler.bias = bias;
    sp.sampler.n_bias = 1;
    rc |= cv_msg_seq_op_encode(&sp, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "seq_sampler_bias", CV_MSG_SEQ_OP, buf, n);
    cv_msg_ping p = {1, 2};
    rc |= cv_msg_ping_encode(&p, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "ping", CV_MSG_PING, buf, n);
    write_seed(dir, "pong", CV_MSG_PONG, buf, n);
    write_seed(dir, "bye", CV_MSG_BYE, buf, 0);
    write_seed(dir, "stats", CV_MSG_STATS, buf, 0);
    cv_msg_stats st = {1000, 2, 3, 4096};
    rc |= cv_msg_stats_encode(&st, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "stats_ok", CV_MSG_STATS_OK, buf, n);
    rc |= cv_msg_fetch_encode(1u << 20, buf, sizeof buf, &n, err, sizeof err);
    write_seed(dir, "fetch", CV_MSG_FETCH, buf, n);
    const cv_msg_ship ship = {.offset = 0, .size = 64};
    rc |= cv_msg_ship_encode_header(&ship, buf, sizeof buf, &n, err, sizeof err);
    memcpy(buf + n, "\0\4\0\0\0\0\0\0\0GGUF", 13);
    write_seed(dir, "ship", CV_MSG_SHIP, buf, n + 13);
    if (rc)
        fprintf(stderr, "corpus: %s\n", err);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    cv_kernels_init(0);
    if (argc == 3 && strcmp(argv[1], "--corpus") == 0)
        return write_corpus(argv[2]);
    TEST_RUN(test_crc32c);
    TEST_RUN(test_header);
    TEST_RUN(test_hello);
    TEST_RUN(test_hello_ok);
    TEST_RUN(test_fetch_ship);
    TEST_RUN(test_error);
    TEST_RUN(test_forward);
    TEST_RUN(test_result);
    TEST_RUN(test_seq_op);
    TEST_RUN(test_ping_bye);
    TEST_RUN(test_stats);
    TEST_RUN(test_activations);
    return test_summary();
}
