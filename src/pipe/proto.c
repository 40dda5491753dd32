/* proto.c: frame header, CRC32C and message encoders/decoders of proto.h.
 *
 * Encoders validate the message with the same rule functions the decoders
 * use, check the caller's buffer size, then store fields at fixed offsets
 * with explicit little-endian stores. Decoders read the fixed fields
 * through a cv_cursor, report a short payload once at the end (the cursor
 * remembers which field ran out), compare every count with the bytes left
 * before taking a pointer, and then apply the rules; every message names
 * the message type and the field. Nothing here allocates or keeps state
 * except the CRC tables, built once. CRC32C is table-driven, eight bytes
 * per step (slicing-by-8). */
#include "pipe/proto.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/cursor.h"
#include "core/err.h"
#include "kernels/kernels.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "proto.c hands out pointers to little-endian wire records: little-endian hosts only"
#endif

/* ---- CRC32C ---- */

#define CRC32C_POLY 0x82F63B78u /* Castagnoli, reflected */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

uint32_t cv_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
              crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* ---- little-endian stores ---- */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_i32(uint8_t *p, int32_t v) { put_u32(p, (uint32_t)v); }

static void put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(p, u);
}

static int32_t cursor_i32(cv_cursor *c, const char *what) { return (int32_t)cv_cursor_u32(c, what); }

/* ---- names ---- */

const char *cv_msg_type_name(uint32_t type)
{
    static const char *const names[CV_MSG_COUNT] = {
        [CV_MSG_HELLO] = "HELLO",   [CV_MSG_HELLO_OK] = "HELLO_OK", [CV_MSG_ERROR] = "ERROR",
        [CV_MSG_FORWARD] = "FORWARD", [CV_MSG_RESULT] = "RESULT",   [CV_MSG_SEQ_OP] = "SEQ_OP",
        [CV_MSG_PING] = "PING",     [CV_MSG_PONG] = "PONG",         [CV_MSG_BYE] = "BYE",
        [CV_MSG_STATS] = "STATS",   [CV_MSG_STATS_OK] = "STATS_OK", [CV_MSG_FETCH] = "FETCH",
        [CV_MSG_SHIP] = "SHIP",
    };
    return type > 0 && type < CV_MSG_COUNT ? names[type] : "unknown";
}

const char *cv_perr_name(uint32_t code)
{
    static const char *const names[] = {
        [CV_PERR_BAD_FRAME] = "BAD_FRAME",     [CV_PERR_VERSION] = "VERSION",
        [CV_PERR_FINGERPRINT] = "FINGERPRINT", [CV_PERR_NO_MEMORY] = "NO_MEMORY",
        [CV_PERR_BAD_RANGE] = "BAD_RANGE",     [CV_PERR_BAD_BATCH] = "BAD_BATCH",
        [CV_PERR_INTERNAL] = "INTERNAL",       [CV_PERR_SHUTDOWN] = "SHUTDOWN",
        [CV_PERR_CLUSTER] = "CLUSTER",         [CV_PERR_BAD_STATE] = "BAD_STATE",
        [CV_PERR_NEXT_NODE] = "NEXT_NODE",     [CV_PERR_TOO_LARGE] = "TOO_LARGE",
        [CV_PERR_ACT_TYPE] = "ACT_TYPE",       [CV_PERR_TIMEOUT] = "TIMEOUT",
        [CV_PERR_RATE] = "RATE",
    };
    return code > 0 && code < sizeof names / sizeof names[0] ? names[code] : "unknown";
}

const char *cv_act_type_name(uint32_t act_type)
{
    switch (act_type) {
    case CV_ACT_F32: return "f32";
    case CV_ACT_F16: return "f16";
    case CV_ACT_Q8_0: return "q8_0";
    default: return "unknown";
    }
}

/* ---- shared failure messages ---- */

static int fail_short(const cv_cursor *c, const char *msg, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "%s: payload ends inside %s (offset %zu, payload is %zu bytes)", msg,
                   c->fail_what ? c->fail_what : "?", c->fail_off, c->len);
}

static int fail_trailing(const cv_cursor *c, const char *msg, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "%s: %zu trailing bytes after the message (payload is %zu bytes)", msg,
                   c->len - c->off, c->len);
}

static int fail_cap(const char *msg, size_t need, size_t cap, char *err, size_t errlen)
{
    return cv_errf(err, errlen, "%s: buffer of %zu bytes is too small for the %zu-byte payload", msg, cap, need);
}

/* Ends a decode: short payload, then trailing bytes. */
static int finish(const cv_cursor *c, const char *msg, char *err, size_t errlen)
{
    if (c->failed)
        return fail_short(c, msg, err, errlen);
    if (c->off != c->len)
        return fail_trailing(c, msg, err, errlen);
    return 0;
}

/* Index of the first NUL or control byte of s[0..n), or -1. */
static long bad_text_byte(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7f)
            return (long)i;
    return -1;
}

static int check_aligned(const void *payload, const char *msg, char *err, size_t errlen)
{
    if ((uintptr_t)payload % 4 != 0)
        return cv_errf(err, errlen, "%s: payload buffer is not 4-byte aligned (caller bug)", msg);
    return 0;
}

/* ---- frame header ---- */

cv_frame_header cv_frame_header_make(uint16_t type, uint32_t id, const void *payload, uint32_t payload_len)
{
    cv_frame_header h = {
        .magic = CV_FRAME_MAGIC,
        .version = CV_FRAME_VERSION,
        .type = type,
        .flags = 0,
        .id = id,
        .payload_len = payload_len,
        .checksum = payload_len ? cv_crc32c(0, payload, payload_len) : 0,
    };
    return h;
}

void cv_frame_header_encode(const cv_frame_header *h, uint8_t out[CV_FRAME_HEADER_SIZE])
{
    put_u32(out + CV_FRAME_OFF_MAGIC, h->magic);
    put_u16(out + CV_FRAME_OFF_VERSION, h->version);
    put_u16(out + CV_FRAME_OFF_TYPE, h->type);
    put_u32(out + CV_FRAME_OFF_FLAGS, h->flags);
    put_u32(out + CV_FRAME_OFF_ID, h->id);
    put_u32(out + CV_FRAME_OFF_PAYLOAD_LEN, h->payload_len);
    put_u32(out + CV_FRAME_OFF_CHECKSUM, h->checksum);
}

int cv_frame_header_decode(const uint8_t in[CV_FRAME_HEADER_SIZE], uint32_t max_payload, cv_frame_header *h,
                           char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, in, CV_FRAME_HEADER_SIZE);
    h->magic = cv_cursor_u32(&c, "magic");
    h->version = cv_cursor_u16(&c, "version");
    h->type = cv_cursor_u16(&c, "type");
    h->flags = cv_cursor_u32(&c, "flags");
    h->id = cv_cursor_u32(&c, "id");
    h->payload_len = cv_cursor_u32(&c, "payload_len");
    h->checksum = cv_cursor_u32(&c, "checksum");
    if (h->magic != CV_FRAME_MAGIC)
        return cv_errf(err, errlen,
                       "bad frame magic %02x %02x %02x %02x (expected \"CVY1\"; not a convoy peer, or the stream "
                       "lost its place)",
                       in[0], in[1], in[2], in[3]);
    if (h->version != CV_FRAME_VERSION)
        return cv_errf(err, errlen, "frame version %u, this build reads version %d", h->version, CV_FRAME_VERSION);
    if (h->type == 0 || h->type >= CV_MSG_COUNT)
        return cv_errf(err, errlen, "unknown message type %u", h->type);
    if (h->flags != 0)
        return cv_errf(err, errlen, "%s frame: unknown frame flags 0x%08" PRIx32, cv_msg_type_name(h->type),
                       h->flags);
    if (h->payload_len > max_payload)
        return cv_errf(err, errlen, "%s frame: payload of %" PRIu32 " bytes exceeds the link's cap of %" PRIu32,
                       cv_msg_type_name(h->type), h->payload_len, max_payload);
    return 0;
}

int cv_frame_check_payload(const cv_frame_header *h, const void *payload, char *err, size_t errlen)
{
    uint32_t crc = h->payload_len ? cv_crc32c(0, payload, h->payload_len) : 0;
    if (crc != h->checksum)
        return cv_errf(err, errlen,
                       "%s frame (id %" PRIu32 ", %" PRIu32 " bytes): payload checksum 0x%08" PRIx32
                       " does not match the header's 0x%08" PRIx32 " (corrupted in transit)",
                       cv_msg_type_name(h->type), h->id, h->payload_len, crc, h->checksum);
    return 0;
}

/* ---- activations ---- */

uint64_t cv_act_bytes(uint32_t act_type, uint64_t n_rows, uint64_t n_embd)
{
    switch (act_type) {
    case CV_ACT_F32: return n_rows * n_embd * 4;
    case CV_ACT_F16: return n_rows * n_embd * 2;
    case CV_ACT_Q8_0: return n_embd % QK8_0 ? 0 : n_rows * (n_embd / QK8_0) * sizeof(block_q8_0);
    default: return 0;
    }
}

static const cv_type_traits *act_traits(uint32_t act_type, uint64_t n, char *err, size_t errlen)
{
    cv_type t = act_type == CV_ACT_F16 ? CV_TYPE_F16 : CV_TYPE_Q8_0;
    if (act_type != CV_ACT_F16 && act_type != CV_ACT_Q8_0) {
        cv_errf(err, errlen, "activation type %u is unknown", act_type);
        return NULL;
    }
    if (act_type == CV_ACT_Q8_0 && n % QK8_0) {
        cv_errf(err, errlen, "q8_0 activations: %" PRIu64 " values is not a multiple of %d", n, QK8_0);
        return NULL;
    }
    if (n > INT64_MAX) {
        cv_errf(err, errlen, "%s activations: %" PRIu64 " values is too many", cv_act_type_name(act_type), n);
        return NULL;
    }
    const cv_type_traits *tr = cv_type_get(t);
    if (!tr) {
        cv_errf(err, errlen, "%s activations: the kernels do not support this type", cv_act_type_name(act_type));
        return NULL;
    }
    return tr;
}

int cv_act_from_f32(uint32_t act_type, const float *x, uint64_t n, void *out, char *err, size_t errlen)
{
    if (act_type == CV_ACT_F32) {
        memcpy(out, x, n * sizeof(float));
        return 0;
    }
    const cv_type_traits *tr = act_traits(act_type, n, err, errlen);
    if (!tr)
        return -1;
    tr->from_float(x, out, (int64_t)n);
    return 0;
}

int cv_act_to_f32(uint32_t act_type, const void *in, uint64_t n, float *out, char *err, size_t errlen)
{
    if (act_type == CV_ACT_F32) {
        memcpy(out, in, n * sizeof(float));
        return 0;
    }
    const cv_type_traits *tr = act_traits(act_type, n, err, errlen);
    if (!tr)
        return -1;
    tr->to_float(in, out, (int64_t)n);
    return 0;
}

/* ---- HELLO ---- */

uint64_t cv_msg_hello_max_hashes(const cv_msg_hello *m)
{
    if (m->role != CV_ROLE_HEAD || m->l0 >= m->l1 || m->l1 > CV_PROTO_MAX_LAYER)
        return 0;
    return (uint64_t)(m->l1 - m->l0) * CV_PROTO_HASHES_PER_LAYER + CV_PROTO_HASHES_EXTRA;
}

static int check_hello(const cv_msg_hello *m, char *err, size_t errlen)
{
    if (m->role != CV_ROLE_HEAD && m->role != CV_ROLE_PREV_NODE)
        return cv_errf(err, errlen, "HELLO: role %u is unknown", m->role);
    if (m->act_type >= CV_ACT_COUNT)
        return cv_errf(err, errlen, "HELLO: act_type %u is unknown", m->act_type);
    if (m->act_type != CV_ACT_F32 && !(m->features & CV_FEAT_LOSSY_ACT))
        return cv_errf(err, errlen, "HELLO: act_type %s is lossy and needs the LOSSY_ACT feature bit",
                       cv_act_type_name(m->act_type));
    if (m->n_layer == 0 || m->n_layer > CV_PROTO_MAX_LAYER)
        return cv_errf(err, errlen, "HELLO: n_layer %" PRIu32 " is outside 1..%d", m->n_layer, CV_PROTO_MAX_LAYER);
    if (m->l0 > m->l1 || m->l1 > m->n_layer)
        return cv_errf(err, errlen, "HELLO: layer range [%" PRIu32 ", %" PRIu32 ") is not inside [0, %" PRIu32 ")",
                       m->l0, m->l1, m->n_layer);
    if (m->n_ctx == 0)
        return cv_errf(err, errlen, "HELLO: n_ctx is 0");
    if (m->n_slot == 0)
        return cv_errf(err, errlen, "HELLO: n_slot is 0");
    if (m->n_batch_max == 0)
        return cv_errf(err, errlen, "HELLO: n_batch_max is 0");
    if (m->n_embd == 0 || m->n_embd > CV_PROTO_MAX_EMBD)
        return cv_errf(err, errlen, "HELLO: n_embd %" PRIu32 " is outside 1..%u", m->n_embd, CV_PROTO_MAX_EMBD);
    if (m->act_type == CV_ACT_Q8_0 && m->n_embd % QK8_0)
        return cv_errf(err, errlen, "HELLO: n_embd %" PRIu32 " is not a multiple of %d, as q8_0 activations need",
                       m->n_embd, QK8_0);
    if (m->max_payload < CV_PROTO_MIN_MAX_PAYLOAD)
        return cv_errf(err, errlen, "HELLO: max_payload %" PRIu32 " is below the minimum %u", m->max_payload,
                       CV_PROTO_MIN_MAX_PAYLOAD);
    if (m->n_hashes > cv_msg_hello_max_hashes(m))
        return cv_errf(err, errlen, "HELLO: %" PRIu32 " tensor hashes, at most %" PRIu64 " for this HELLO",
                       m->n_hashes, cv_msg_hello_max_hashes(m));
    return 0;
}

size_t cv_msg_hello_size(const cv_msg_hello *m)
{
    return CV_HELLO_FIXED_SIZE + strnlen(m->next_addr, sizeof m->next_addr) + (size_t)m->n_hashes * CV_PROTO_HASH_BYTES;
}

int cv_msg_hello_encode(const cv_msg_hello *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (m->proto_version != CV_PROTO_VERSION)
        return cv_errf(err, errlen, "HELLO: proto_version %u, this build speaks %d", m->proto_version,
                       CV_PROTO_VERSION);
    size_t addr_len = strnlen(m->next_addr, sizeof m->next_addr);
    if (addr_len > CV_PROTO_ADDR_MAX)
        return cv_errf(err, errlen, "HELLO: next_addr is not NUL-terminated within %d bytes", CV_PROTO_ADDR_MAX);
    long bad = bad_text_byte((const uint8_t *)m->next_addr, addr_len);
    if (bad >= 0)
        return cv_errf(err, errlen, "HELLO: next_addr has a control byte at %ld", bad);
    if (check_hello(m, err, errlen))
        return -1;
    if (m->n_hashes && !m->hashes)
        return cv_errf(err, errlen, "HELLO: %" PRIu32 " tensor hashes and no pointer to them", m->n_hashes);
    const size_t need = cv_msg_hello_size(m), hashes_len = (size_t)m->n_hashes * CV_PROTO_HASH_BYTES;
    if (cap < need)
        return fail_cap("HELLO", need, cap, err, errlen);
    uint8_t *p = buf;
    put_u16(p + 0, m->proto_version);
    p[2] = m->role;
    p[3] = m->act_type;
    put_u32(p + 4, m->features);
    const uint32_t u32s[8] = {m->l0, m->l1, m->n_layer, m->n_ctx, m->n_slot, m->n_batch_max, m->n_embd, m->max_payload};
    for (int i = 0; i < 8; i++)
        put_u32(p + CV_HELLO_OFF_L0 + 4 * i, u32s[i]);
    put_u64(p + CV_HELLO_OFF_CLUSTER_ID, m->cluster_id);
    memcpy(p + CV_HELLO_OFF_MODEL_HASH, m->model_hash, CV_PROTO_HASH_BYTES);
    put_u32(p + CV_HELLO_OFF_N_HASHES, m->n_hashes);
    put_u16(p + CV_HELLO_OFF_ADDR_LEN, (uint16_t)addr_len);
    memcpy(p + CV_HELLO_FIXED_SIZE, m->next_addr, addr_len);
    if (hashes_len)
        memcpy(p + CV_HELLO_FIXED_SIZE + addr_len, m->hashes, hashes_len);
    *len = need;
    return 0;
}

int cv_msg_hello_decode(const void *payload, size_t len, cv_msg_hello *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    memset(m, 0, sizeof *m);
    m->proto_version = cv_cursor_u16(&c, "proto_version");
    if (!c.failed && m->proto_version != CV_PROTO_VERSION)
        return cv_errf(err, errlen, "HELLO: protocol version %u, this build speaks %d", m->proto_version,
                       CV_PROTO_VERSION);
    m->role = cv_cursor_u8(&c, "role");
    m->act_type = cv_cursor_u8(&c, "act_type");
    m->features = cv_cursor_u32(&c, "features");
    m->l0 = cv_cursor_u32(&c, "l0");
    m->l1 = cv_cursor_u32(&c, "l1");
    m->n_layer = cv_cursor_u32(&c, "n_layer");
    m->n_ctx = cv_cursor_u32(&c, "n_ctx");
    m->n_slot = cv_cursor_u32(&c, "n_slot");
    m->n_batch_max = cv_cursor_u32(&c, "n_batch_max");
    m->n_embd = cv_cursor_u32(&c, "n_embd");
    m->max_payload = cv_cursor_u32(&c, "max_payload");
    m->cluster_id = cv_cursor_u64(&c, "cluster_id");
    const uint8_t *model_hash = cv_cursor_bytes(&c, CV_PROTO_HASH_BYTES, "model_hash");
    m->n_hashes = cv_cursor_u32(&c, "n_hashes");
    uint16_t addr_len = cv_cursor_u16(&c, "next_addr length");
    /* the rules, the hash count's bound by the layer range among them,
     * before the count sizes a read */
    if (!c.failed && check_hello(m, err, errlen))
        return -1;
    if (addr_len > CV_PROTO_ADDR_MAX)
        return cv_errf(err, errlen, "HELLO: next_addr length %u exceeds %d", addr_len, CV_PROTO_ADDR_MAX);
    const uint8_t *addr = cv_cursor_bytes(&c, addr_len, "next_addr");
    m->hashes = cv_cursor_bytes(&c, (uint64_t)m->n_hashes * CV_PROTO_HASH_BYTES, "tensor hashes");
    if (finish(&c, "HELLO", err, errlen))
        return -1;
    long bad = bad_text_byte(addr, addr_len);
    if (bad >= 0)
        return cv_errf(err, errlen, "HELLO: next_addr has a NUL or control byte at %ld", bad);
    memcpy(m->model_hash, model_hash, CV_PROTO_HASH_BYTES);
    memcpy(m->next_addr, addr, addr_len);
    m->next_addr[addr_len] = '\0';
    if (m->n_hashes == 0)
        m->hashes = NULL;
    return 0;
}

/* ---- HELLO_OK ---- */

static int check_hello_ok(const cv_msg_hello_ok *m, char *err, size_t errlen)
{
    if (m->proto_version != CV_PROTO_VERSION)
        return cv_errf(err, errlen, "HELLO_OK: protocol version %u, this build speaks %d", m->proto_version,
                       CV_PROTO_VERSION);
    if (m->max_payload < CV_PROTO_MIN_MAX_PAYLOAD)
        return cv_errf(err, errlen, "HELLO_OK: max_payload %" PRIu32 " is below the minimum %u", m->max_payload,
                       CV_PROTO_MIN_MAX_PAYLOAD);
    if (m->held_l0 >= m->held_l1 || m->held_l1 > CV_PROTO_MAX_LAYER)
        return cv_errf(err, errlen, "HELLO_OK: held layers [%" PRIu32 ", %" PRIu32 ") are not a range inside [0, %d]",
                       m->held_l0, m->held_l1, CV_PROTO_MAX_LAYER);
    if (m->flags & ~(uint32_t)CV_HOK_RECEIVES)
        return cv_errf(err, errlen, "HELLO_OK: unknown flags 0x%08" PRIx32, m->flags);
    return 0;
}

int cv_msg_hello_ok_encode(const cv_msg_hello_ok *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (check_hello_ok(m, err, errlen))
        return -1;
    if (cap < CV_MSG_HELLO_OK_SIZE)
        return fail_cap("HELLO_OK", CV_MSG_HELLO_OK_SIZE, cap, err, errlen);
    uint8_t *p = buf;
    memset(p, 0, CV_MSG_HELLO_OK_SIZE);
    put_u16(p + 0, m->proto_version);
    put_u32(p + 4, m->us_per_layer_token);
    put_u64(p + 8, m->mem_budget);
    put_u64(p + 16, m->layer_bytes);
    put_u32(p + CV_HELLO_OK_OFF_MAX_PAYLOAD, m->max_payload);
    put_u32(p + CV_HELLO_OK_OFF_HELD_L0, m->held_l0);
    put_u32(p + CV_HELLO_OK_OFF_HELD_L1, m->held_l1);
    put_u32(p + CV_HELLO_OK_OFF_FLAGS, m->flags);
    put_u32(p + CV_HELLO_OK_OFF_N_THREADS, m->n_threads);
    *len = CV_MSG_HELLO_OK_SIZE;
    return 0;
}

int cv_msg_hello_ok_decode(const void *payload, size_t len, cv_msg_hello_ok *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    memset(m, 0, sizeof *m);
    m->proto_version = cv_cursor_u16(&c, "proto_version");
    uint16_t reserved0 = cv_cursor_u16(&c, "reserved");
    m->us_per_layer_token = cv_cursor_u32(&c, "us_per_layer_token");
    m->mem_budget = cv_cursor_u64(&c, "mem_budget");
    m->layer_bytes = cv_cursor_u64(&c, "layer_bytes");
    m->max_payload = cv_cursor_u32(&c, "max_payload");
    m->held_l0 = cv_cursor_u32(&c, "held_l0");
    m->held_l1 = cv_cursor_u32(&c, "held_l1");
    m->flags = cv_cursor_u32(&c, "flags");
    m->n_threads = cv_cursor_u32(&c, "n_threads");
    if (finish(&c, "HELLO_OK", err, errlen))
        return -1;
    if (reserved0)
        return cv_errf(err, errlen, "HELLO_OK: reserved bytes are not zero");
    return check_hello_ok(m, err, errlen);
}

/* ---- ERROR ---- */

size_t cv_msg_error_size(const char *message)
{
    return 6 + strnlen(message, CV_PROTO_ERRMSG_MAX);
}

int cv_msg_error_encode(uint32_t code, const char *message, void *buf, size_t cap, size_t *len, char *err,
                        size_t errlen)
{
    if (code == 0)
        return cv_errf(err, errlen, "ERROR: code 0 is not an error code");
    size_t n = strnlen(message, CV_PROTO_ERRMSG_MAX);
    if (cap < 6 + n)
        return fail_cap("ERROR", 6 + n, cap, err, errlen);
    uint8_t *p = buf;
    put_u32(p, code);
    put_u16(p + 4, (uint16_t)n);
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)message[i];
        p[6 + i] = b < 0x20 || b == 0x7f ? '?' : b;
    }
    *len = 6 + n;
    return 0;
}

int cv_msg_error_decode(const void *payload, size_t len, cv_msg_error *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    memset(m, 0, sizeof *m);
    m->code = cv_cursor_u32(&c, "code");
    uint16_t n = cv_cursor_u16(&c, "message length");
    if (n > CV_PROTO_ERRMSG_MAX)
        return cv_errf(err, errlen, "ERROR: message length %u exceeds %d", n, CV_PROTO_ERRMSG_MAX);
    const uint8_t *text = cv_cursor_bytes(&c, n, "message");
    if (finish(&c, "ERROR", err, errlen))
        return -1;
    if (m->code == 0)
        return cv_errf(err, errlen, "ERROR: code 0 is not an error code");
    long bad = bad_text_byte(text, n);
    if (bad >= 0)
        return cv_errf(err, errlen, "ERROR: message has a NUL or control byte at %ld", bad);
    memcpy(m->message, text, n);
    m->message[n] = '\0';
    return 0;
}

/* ---- FORWARD ---- */

uint64_t cv_msg_forward_act_size(const cv_msg_forward *m)
{
    return m->flags & CV_FWD_HAS_HIDDEN ? cv_act_bytes(m->act_type, m->n_tokens, m->n_embd) : 0;
}

uint64_t cv_msg_forward_head_size(const cv_msg_forward *m)
{
    return CV_FWD_FIXED_SIZE + (uint64_t)m->n_tokens * sizeof(cv_fwd_token);
}

uint64_t cv_msg_forward_trail_size(const cv_msg_forward *m) { return (uint64_t)m->n_trail * sizeof(uint32_t); }

uint64_t cv_msg_forward_size(const cv_msg_forward *m)
{
    return cv_msg_forward_head_size(m) + cv_msg_forward_act_size(m) + cv_msg_forward_trail_size(m);
}

void cv_msg_forward_encode_trail(const cv_msg_forward *m, void *buf)
{
    for (uint8_t i = 0; i < m->n_trail; i++)
        put_u32((uint8_t *)buf + 4 * i, m->trail[i]);
}

/* Rules on the fixed fields. */
static int check_forward_fixed(const cv_msg_forward *m, char *err, size_t errlen)
{
    if (m->flags & ~(CV_FWD_WANT_LOGITS | CV_FWD_HAS_HIDDEN))
        return cv_errf(err, errlen, "FORWARD: unknown flags 0x%02x", m->flags);
    if (m->n_tokens == 0)
        return cv_errf(err, errlen, "FORWARD: n_tokens is 0");
    if (m->n_trail >= CV_TRAIL_MAX)
        return cv_errf(err, errlen, "FORWARD: n_trail %u leaves no room for the next stage's time (at most %d)",
                       m->n_trail, CV_TRAIL_MAX - 1);
    if (!(m->flags & CV_FWD_HAS_HIDDEN)) {
        if (m->n_embd != 0 || m->act_type != CV_ACT_F32)
            return cv_errf(err, errlen, "FORWARD: n_embd %" PRIu32 " / act_type %u set without HAS_HIDDEN",
                           m->n_embd, m->act_type);
        return 0;
    }
    if (m->act_type >= CV_ACT_COUNT)
        return cv_errf(err, errlen, "FORWARD: act_type %u is unknown", m->act_type);
    if (m->n_embd == 0 || m->n_embd > CV_PROTO_MAX_EMBD)
        return cv_errf(err, errlen, "FORWARD: n_embd %" PRIu32 " is outside 1..%u", m->n_embd, CV_PROTO_MAX_EMBD);
    if (m->act_type == CV_ACT_Q8_0 && m->n_embd % QK8_0)
        return cv_errf(err, errlen, "FORWARD: n_embd %" PRIu32 " is not a multiple of %d for q8_0 activations",
                       m->n_embd, QK8_0);
    return 0;
}

/* Rules on each record; reserved bytes are checked only on received ones
 * (the encoder writes zeros whatever the caller's struct holds). */
static int check_forward_tokens(const cv_fwd_token *t, uint32_t n, bool check_reserved, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < n; i++) {
        if (t[i].token < 0)
            return cv_errf(err, errlen, "FORWARD: record %" PRIu32 ": token %" PRId32 " is negative", i, t[i].token);
        if (t[i].seq < 0)
            return cv_errf(err, errlen, "FORWARD: record %" PRIu32 ": seq %" PRId32 " is negative", i, t[i].seq);
        if (t[i].pos < 0)
            return cv_errf(err, errlen, "FORWARD: record %" PRIu32 ": pos %" PRId32 " is negative", i, t[i].pos);
        if (t[i].want > CV_WANT_MAX)
            return cv_errf(err, errlen, "FORWARD: record %" PRIu32 ": want %u is not 0 to %d", i, t[i].want,
                           CV_WANT_MAX);
        if (check_reserved && (t[i].reserved[0] | t[i].reserved[1] | t[i].reserved[2]))
            return cv_errf(err, errlen, "FORWARD: record %" PRIu32 ": reserved bytes are not zero", i);
    }
    return 0;
}

int cv_msg_forward_encode_head(const cv_msg_forward *m, void *buf, size_t cap, size_t *len, char *err,
                               size_t errlen)
{
    if (check_forward_fixed(m, err, errlen))
        return -1;
    if (!m->tokens)
        return cv_errf(err, errlen, "FORWARD: no token records given");
    if ((m->flags & CV_FWD_HAS_HIDDEN) && !m->act)
        return cv_errf(err, errlen, "FORWARD: HAS_HIDDEN without activations");
    if (check_forward_tokens(m->tokens, m->n_tokens, false, err, errlen))
        return -1;
    uint64_t need = cv_msg_forward_head_size(m);
    if (cap < need)
        return fail_cap("FORWARD", (size_t)need, cap, err, errlen);
    uint8_t *p = buf;
    memset(p, 0, CV_FWD_FIXED_SIZE);
    put_u32(p + 0, m->n_tokens);
    put_u32(p + 4, m->n_embd);
    p[8] = m->act_type;
    p[9] = m->flags;
    p[10] = m->n_trail;
    for (uint32_t i = 0; i < m->n_tokens; i++) {
        uint8_t *r = p + CV_FWD_FIXED_SIZE + (size_t)i * sizeof(cv_fwd_token);
        put_i32(r + 0, m->tokens[i].token);
        put_i32(r + 4, m->tokens[i].seq);
        put_i32(r + 8, m->tokens[i].pos);
        r[12] = m->tokens[i].want;
        r[13] = r[14] = r[15] = 0;
    }
    *len = (size_t)need;
    return 0;
}

int cv_msg_forward_encode(const cv_msg_forward *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (check_forward_fixed(m, err, errlen))
        return -1;
    uint64_t need = cv_msg_forward_size(m);
    if (cap < need)
        return fail_cap("FORWARD", (size_t)need, cap, err, errlen);
    size_t head;
    if (cv_msg_forward_encode_head(m, buf, cap, &head, err, errlen))
        return -1;
    uint64_t act = cv_msg_forward_act_size(m);
    if (act)
        memcpy((uint8_t *)buf + head, m->act, (size_t)act);
    cv_msg_forward_encode_trail(m, (uint8_t *)buf + head + act);
    *len = (size_t)need;
    return 0;
}

int cv_msg_forward_decode(const void *payload, size_t len, cv_msg_forward *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (check_aligned(payload, "FORWARD", err, errlen))
        return -1;
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    m->n_tokens = cv_cursor_u32(&c, "n_tokens");
    m->n_embd = cv_cursor_u32(&c, "n_embd");
    m->act_type = cv_cursor_u8(&c, "act_type");
    m->flags = cv_cursor_u8(&c, "flags");
    m->n_trail = cv_cursor_u8(&c, "n_trail");
    uint8_t reserved0 = cv_cursor_u8(&c, "reserved");
    uint32_t reserved1 = cv_cursor_u32(&c, "reserved");
    if (c.failed)
        return fail_short(&c, "FORWARD", err, errlen);
    if (reserved0 || reserved1)
        return cv_errf(err, errlen, "FORWARD: reserved bytes are not zero");
    if (check_forward_fixed(m, err, errlen))
        return -1;
    uint64_t rec_bytes = (uint64_t)m->n_tokens * sizeof(cv_fwd_token);
    if (rec_bytes > cv_cursor_left(&c))
        return cv_errf(err, errlen, "FORWARD: n_tokens %" PRIu32 " needs %" PRIu64 " bytes of records, %zu present",
                       m->n_tokens, rec_bytes, cv_cursor_left(&c));
    m->tokens = (const cv_fwd_token *)cv_cursor_bytes(&c, rec_bytes, "token records");
    uint64_t act_bytes = cv_msg_forward_act_size(m);
    if (act_bytes + cv_msg_forward_trail_size(m) != cv_cursor_left(&c))
        return cv_errf(err, errlen,
                       "FORWARD: %" PRIu32 " x %" PRIu32 " %s activations and %u stage times need %" PRIu64
                       " bytes, %zu present",
                       m->n_tokens, m->n_embd, cv_act_type_name(m->act_type), m->n_trail,
                       act_bytes + cv_msg_forward_trail_size(m), cv_cursor_left(&c));
    m->act = act_bytes ? cv_cursor_bytes(&c, act_bytes, "activations") : NULL;
    for (uint8_t i = 0; i < m->n_trail; i++)
        m->trail[i] = cv_cursor_u32(&c, "trail");
    if (finish(&c, "FORWARD", err, errlen))
        return -1;
    return check_forward_tokens(m->tokens, m->n_tokens, true, err, errlen);
}

/* ---- RESULT ---- */

#define RESULT_ROW_FIXED 16

/* The embedding rows of m's rows[0 .. n). */
static uint32_t embd_rows(const cv_result_row *rows, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        k += rows[i].kind == CV_ROW_EMBD;
    return k;
}

uint64_t cv_msg_result_size(const cv_msg_result *m)
{
    const bool with_embd = m->flags & CV_RES_HAS_EMBD;
    uint64_t n = 12 + (m->flags & CV_RES_HAS_LOGITS ? 4 : 0) + (with_embd ? 4 : 0) +
                 (uint64_t)m->n_trail * sizeof(uint32_t);
    for (uint32_t i = 0; i < m->n_rows; i++)
        n += RESULT_ROW_FIXED + (uint64_t)m->rows[i].n_top * sizeof(cv_top_entry);
    if (m->flags & CV_RES_HAS_LOGITS)
        n += (uint64_t)m->n_rows * m->n_vocab * sizeof(float);
    if (with_embd)
        n += (uint64_t)embd_rows(m->rows, m->n_rows) * m->n_embd * sizeof(float);
    return n;
}

static int check_result_fixed(const cv_msg_result *m, char *err, size_t errlen)
{
    if (m->flags & ~(uint32_t)(CV_RES_HAS_LOGITS | CV_RES_HAS_EMBD))
        return cv_errf(err, errlen, "RESULT: unknown flags 0x%08" PRIx32, m->flags);
    if ((m->flags & CV_RES_HAS_LOGITS) && (m->n_vocab == 0 || m->n_vocab > CV_PROTO_MAX_VOCAB))
        return cv_errf(err, errlen, "RESULT: n_vocab %" PRIu32 " is outside 1..%u", m->n_vocab, CV_PROTO_MAX_VOCAB);
    if ((m->flags & CV_RES_HAS_EMBD) && (m->n_embd == 0 || m->n_embd > CV_PROTO_MAX_EMBD))
        return cv_errf(err, errlen, "RESULT: n_embd %" PRIu32 " is outside 1..%u", m->n_embd, CV_PROTO_MAX_EMBD);
    if (m->n_trail == 0 || m->n_trail > CV_TRAIL_MAX)
        return cv_errf(err, errlen, "RESULT: n_trail %" PRIu32 " is outside 1..%d", m->n_trail, CV_TRAIL_MAX);
    return 0;
}

/* Rules on an embedding row: only with HAS_EMBD, no token, no pairs. */
static int check_embd_row(const cv_result_row *r, uint32_t i, uint32_t flags, char *err, size_t errlen)
{
    if (!(flags & CV_RES_HAS_EMBD))
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": an embedding row without HAS_EMBD", i);
    if (r->token != -1 || r->n_top)
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": an embedding row with token %" PRId32 " and %u pairs",
                       i, r->token, r->n_top);
    return 0;
}

/* Rules on one row (its top entries included); n_vocab 0 = unknown. */
static int check_result_row(const cv_result_row *r, const cv_top_entry *top, uint32_t i, uint32_t n_vocab,
                            uint32_t flags, char *err, size_t errlen)
{
    if (r->seq < 0)
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": seq %" PRId32 " is negative", i, r->seq);
    if (r->pos < 0)
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": pos %" PRId32 " is negative", i, r->pos);
    if (r->kind > CV_ROW_EMBD)
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": kind %u is unknown", i, r->kind);
    if (r->kind == CV_ROW_EMBD)
        return check_embd_row(r, i, flags, err, errlen);
    if (r->token < 0 || (n_vocab && (uint32_t)r->token >= n_vocab))
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": token %" PRId32 " is not a vocabulary id", i, r->token);
    if (r->n_top > CV_PROTO_MAX_TOP)
        return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": n_top %u exceeds %d", i, r->n_top, CV_PROTO_MAX_TOP);
    for (uint16_t k = 0; k < r->n_top; k++) {
        if (top[k].id < 0 || (n_vocab && (uint32_t)top[k].id >= n_vocab))
            return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": top %u: id %" PRId32 " is not a vocabulary id", i,
                           k, top[k].id);
        if (isnan(top[k].logprob))
            return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": top %u: logprob is NaN", i, k);
    }
    return 0;
}

int cv_msg_result_encode(const cv_msg_result *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (check_result_fixed(m, err, errlen))
        return -1;
    if (m->n_rows && !m->rows)
        return cv_errf(err, errlen, "RESULT: no rows given");
    if ((m->flags & CV_RES_HAS_LOGITS) && m->n_rows && !m->logits)
        return cv_errf(err, errlen, "RESULT: HAS_LOGITS without logits");
    for (uint32_t i = 0; i < m->n_rows; i++) {
        const cv_result_row *r = &m->rows[i];
        if (r->n_top && !r->top)
            return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": n_top %u without entries", i, r->n_top);
        if (check_result_row(r, r->top, i, m->flags & CV_RES_HAS_LOGITS ? m->n_vocab : 0, m->flags, err, errlen))
            return -1;
    }
    const uint32_t n_embd_rows = m->n_rows ? embd_rows(m->rows, m->n_rows) : 0;
    if ((m->flags & CV_RES_HAS_EMBD) && (!n_embd_rows || !m->embd))
        return cv_errf(err, errlen, "RESULT: HAS_EMBD without %s", n_embd_rows ? "embeddings" : "an embedding row");
    uint64_t need = cv_msg_result_size(m);
    if (cap < need)
        return fail_cap("RESULT", (size_t)need, cap, err, errlen);
    uint8_t *p = buf;
    put_u32(p, m->n_rows);
    put_u32(p + 4, m->flags);
    put_u32(p + 8, m->n_trail);
    p += 12;
    if (m->flags & CV_RES_HAS_LOGITS) {
        put_u32(p, m->n_vocab);
        p += 4;
    }
    if (m->flags & CV_RES_HAS_EMBD) {
        put_u32(p, m->n_embd);
        p += 4;
    }
    for (uint32_t i = 0; i < m->n_trail; i++, p += 4)
        put_u32(p, m->trail[i]);
    for (uint32_t i = 0; i < m->n_rows; i++) {
        const cv_result_row *r = &m->rows[i];
        put_i32(p + 0, r->seq);
        put_i32(p + 4, r->pos);
        put_i32(p + 8, r->token);
        put_u16(p + 12, r->n_top);
        put_u16(p + 14, r->kind);
        p += RESULT_ROW_FIXED;
        for (uint16_t k = 0; k < r->n_top; k++) {
            put_i32(p, r->top[k].id);
            put_f32(p + 4, r->top[k].logprob);
            p += sizeof(cv_top_entry);
        }
    }
    if ((m->flags & CV_RES_HAS_LOGITS) && m->n_rows) {
        memcpy(p, m->logits, (size_t)m->n_rows * m->n_vocab * sizeof(float));
        p += (size_t)m->n_rows * m->n_vocab * sizeof(float);
    }
    if (m->flags & CV_RES_HAS_EMBD)
        memcpy(p, m->embd, (size_t)n_embd_rows * m->n_embd * sizeof(float));
    *len = (size_t)need;
    return 0;
}

/* Decodes and validates; rows NULL validates only (no row limit, m->rows
 * stays NULL). */
static int result_parse(const void *payload, size_t len, cv_msg_result *m, cv_result_row *rows, uint32_t max_rows,
                        char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (check_aligned(payload, "RESULT", err, errlen))
        return -1;
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    m->n_rows = cv_cursor_u32(&c, "n_rows");
    m->flags = cv_cursor_u32(&c, "flags");
    m->n_trail = cv_cursor_u32(&c, "n_trail");
    if (!c.failed && (m->flags & CV_RES_HAS_LOGITS))
        m->n_vocab = cv_cursor_u32(&c, "n_vocab");
    if (!c.failed && (m->flags & CV_RES_HAS_EMBD))
        m->n_embd = cv_cursor_u32(&c, "n_embd");
    if (c.failed)
        return fail_short(&c, "RESULT", err, errlen);
    if (check_result_fixed(m, err, errlen))
        return -1;
    for (uint32_t i = 0; i < m->n_trail; i++)
        m->trail[i] = cv_cursor_u32(&c, "trail");
    if (c.failed)
        return fail_short(&c, "RESULT", err, errlen);
    if ((uint64_t)m->n_rows * RESULT_ROW_FIXED > cv_cursor_left(&c))
        return cv_errf(err, errlen, "RESULT: n_rows %" PRIu32 " needs at least %" PRIu64 " bytes, %zu present",
                       m->n_rows, (uint64_t)m->n_rows * RESULT_ROW_FIXED, cv_cursor_left(&c));
    if (rows && m->n_rows > max_rows)
        return cv_errf(err, errlen, "RESULT: %" PRIu32 " rows, more than the %" PRIu32 " expected", m->n_rows,
                       max_rows);
    uint32_t n_embd_rows = 0;
    for (uint32_t i = 0; i < m->n_rows; i++) {
        cv_result_row r;
        r.seq = cursor_i32(&c, "row seq");
        r.pos = cursor_i32(&c, "row pos");
        r.token = cursor_i32(&c, "row token");
        r.n_top = cv_cursor_u16(&c, "row n_top");
        r.kind = cv_cursor_u16(&c, "row kind");
        if (c.failed)
            return fail_short(&c, "RESULT", err, errlen);
        n_embd_rows += r.kind == CV_ROW_EMBD;
        if (r.n_top > CV_PROTO_MAX_TOP)
            return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": n_top %u exceeds %d", i, r.n_top,
                           CV_PROTO_MAX_TOP);
        uint64_t top_bytes = (uint64_t)r.n_top * sizeof(cv_top_entry);
        if (top_bytes > cv_cursor_left(&c))
            return cv_errf(err, errlen, "RESULT: row %" PRIu32 ": n_top %u needs %" PRIu64 " bytes, %zu present", i,
                           r.n_top, top_bytes, cv_cursor_left(&c));
        r.top = r.n_top ? (const cv_top_entry *)cv_cursor_bytes(&c, top_bytes, "row top entries") : NULL;
        if (check_result_row(&r, r.top, i, m->n_vocab, m->flags, err, errlen))
            return -1;
        if (rows)
            rows[i] = r;
    }
    if ((m->flags & CV_RES_HAS_EMBD) && !n_embd_rows)
        return cv_errf(err, errlen, "RESULT: HAS_EMBD without an embedding row");
    if (m->flags & CV_RES_HAS_LOGITS) {
        uint64_t logit_bytes = (uint64_t)m->n_rows * m->n_vocab * sizeof(float);
        if (logit_bytes > cv_cursor_left(&c)) /* and finish or the embeddings' check refuse bytes after them */
            return cv_errf(err, errlen,
                           "RESULT: %" PRIu32 " x %" PRIu32 " logits need %" PRIu64 " bytes, %zu present",
                           m->n_rows, m->n_vocab, logit_bytes, cv_cursor_left(&c));
        m->logits = logit_bytes ? (const float *)cv_cursor_bytes(&c, logit_bytes, "logits") : NULL;
    }
    if (m->flags & CV_RES_HAS_EMBD) {
        const uint64_t embd_bytes = (uint64_t)n_embd_rows * m->n_embd * sizeof(float);
        if (embd_bytes != cv_cursor_left(&c))
            return cv_errf(err, errlen,
                           "RESULT: %" PRIu32 " embeddings of %" PRIu32 " floats need %" PRIu64 " bytes, %zu present",
                           n_embd_rows, m->n_embd, embd_bytes, cv_cursor_left(&c));
        m->embd = (const float *)cv_cursor_bytes(&c, embd_bytes, "embeddings");
    }
    if (finish(&c, "RESULT", err, errlen))
        return -1;
    m->rows = rows;
    return 0;
}

int cv_msg_result_decode(const void *payload, size_t len, cv_msg_result *m, cv_result_row *rows, uint32_t max_rows,
                         char *err, size_t errlen)
{
    if (!rows)
        max_rows = 0;
    cv_result_row none;
    if (result_parse(payload, len, m, rows ? rows : &none, max_rows, err, errlen))
        return -1;
    m->rows = rows;
    return 0;
}

/* ---- SEQ_OP ---- */

static int check_finite(float x, const char *what, char *err, size_t errlen)
{
    if (!isfinite(x))
        return cv_errf(err, errlen, "SEQ_OP: SET_SAMPLER %s is not finite", what);
    return 0;
}

static int check_seq_op(const cv_msg_seq_op *m, char *err, size_t errlen)
{
    if (m->op < CV_SEQ_TRUNCATE || m->op > CV_SEQ_COPY)
        return cv_errf(err, errlen, "SEQ_OP: op %u is unknown", m->op);
    if (m->seq < 0)
        return cv_errf(err, errlen, "SEQ_OP: seq %" PRId32 " is negative", m->seq);
    static const char *const names[] = {[CV_SEQ_TRUNCATE] = "TRUNCATE", [CV_SEQ_FREE] = "FREE",
                                        [CV_SEQ_SET_SAMPLER] = "SET_SAMPLER", [CV_SEQ_SET_GRAMMAR] = "SET_GRAMMAR",
                                        [CV_SEQ_COPY] = "COPY"};
    const bool has_len = m->op == CV_SEQ_TRUNCATE || m->op == CV_SEQ_SET_GRAMMAR || m->op == CV_SEQ_COPY;
    if (has_len && m->len < 0)
        return cv_errf(err, errlen, "SEQ_OP: %s at negative position %" PRId32, names[m->op], m->len);
    if (m->op == CV_SEQ_COPY && (m->dst < 0 || m->dst == m->seq))
        return cv_errf(err, errlen, "SEQ_OP: COPY of seq %" PRId32 " into seq %" PRId32, m->seq, m->dst);
    if (!has_len && m->len != 0)
        return cv_errf(err, errlen, "SEQ_OP: len %" PRId32 " given for an op without a length", m->len);
    if (m->op == CV_SEQ_SET_GRAMMAR) {
        if (m->grammar_len < 1 || m->grammar_len > CV_PROTO_MAX_GRAMMAR)
            return cv_errf(err, errlen, "SEQ_OP: SET_GRAMMAR text of %" PRIu32 " bytes, not 1..%u", m->grammar_len,
                           CV_PROTO_MAX_GRAMMAR);
        if (memchr(m->grammar, 0, m->grammar_len))
            return cv_errf(err, errlen, "SEQ_OP: SET_GRAMMAR text holds a NUL byte");
        return 0;
    }
    if (m->op != CV_SEQ_SET_SAMPLER)
        return 0;
    const cv_sampler_params *s = &m->sampler;
    if (check_finite(s->temp, "temp", err, errlen) || check_finite(s->top_p, "top_p", err, errlen) ||
        check_finite(s->min_p, "min_p", err, errlen) ||
        check_finite(s->repeat_penalty, "repeat_penalty", err, errlen) ||
        check_finite(s->freq_penalty, "freq_penalty", err, errlen) ||
        check_finite(s->presence_penalty, "presence_penalty", err, errlen))
        return -1;
    if (s->penalty_last_n < 0)
        return cv_errf(err, errlen, "SEQ_OP: SET_SAMPLER penalty_last_n %" PRId32 " is negative", s->penalty_last_n);
    if (m->n_probs > CV_PROTO_MAX_TOP)
        return cv_errf(err, errlen, "SEQ_OP: SET_SAMPLER n_probs %" PRIu32 " exceeds %d", m->n_probs,
                       CV_PROTO_MAX_TOP);
    if (s->n_bias < 0 || s->n_bias > CV_PROTO_MAX_BIAS)
        return cv_errf(err, errlen, "SEQ_OP: SET_SAMPLER n_bias %" PRId32 " is not 0..%d", s->n_bias,
                       CV_PROTO_MAX_BIAS);
    char why[128];
    if (cv_logit_bias_check(s->bias, s->n_bias, INT32_MAX, why, sizeof why))
        return cv_errf(err, errlen, "SEQ_OP: SET_SAMPLER %s", why);
    return 0;
}

size_t cv_msg_seq_op_size(const cv_msg_seq_op *m)
{
    if (m->op == CV_SEQ_SET_SAMPLER)
        return CV_SEQ_OP_SAMPLER_SIZE + CV_SEQ_OP_BIAS_PAIR_SIZE * (size_t)m->sampler.n_bias;
    if (m->op == CV_SEQ_COPY)
        return CV_SEQ_OP_COPY_SIZE;
    return m->op == CV_SEQ_SET_GRAMMAR ? CV_SEQ_OP_GRAMMAR_FIXED_SIZE + (size_t)m->grammar_len : CV_SEQ_OP_SIZE;
}

int cv_msg_seq_op_encode(const cv_msg_seq_op *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (check_seq_op(m, err, errlen))
        return -1;
    const size_t need = cv_msg_seq_op_size(m);
    if (cap < need)
        return fail_cap("SEQ_OP", need, cap, err, errlen);
    uint8_t *p = buf;
    memset(p, 0, need);
    p[0] = m->op;
    put_i32(p + 4, m->seq);
    put_i32(p + 8, m->len);
    if (m->op == CV_SEQ_SET_SAMPLER) {
        const cv_sampler_params *s = &m->sampler;
        put_f32(p + 12, s->temp);
        put_i32(p + 16, s->top_k);
        put_f32(p + 20, s->top_p);
        put_f32(p + 24, s->min_p);
        put_f32(p + 28, s->repeat_penalty);
        put_i32(p + 32, s->penalty_last_n);
        put_f32(p + 36, s->freq_penalty);
        put_f32(p + 40, s->presence_penalty);
        put_u64(p + 44, s->seed);
        put_u32(p + 52, m->n_probs);
        put_u64(p + 56, s->n_draws);
        put_u32(p + 64, (uint32_t)s->n_bias);
        for (int32_t i = 0; i < s->n_bias; i++) {
            put_i32(p + CV_SEQ_OP_SAMPLER_SIZE + 8 * i, s->bias[i].id);
            put_f32(p + CV_SEQ_OP_SAMPLER_SIZE + 8 * i + 4, s->bias[i].bias);
        }
    } else if (m->op == CV_SEQ_COPY) {
        put_i32(p + 12, m->dst);
    } else if (m->op == CV_SEQ_SET_GRAMMAR) {
        put_u32(p + 12, m->grammar_len);
        memcpy(p + CV_SEQ_OP_GRAMMAR_FIXED_SIZE, m->grammar, m->grammar_len);
    }
    *len = need;
    return 0;
}

int cv_msg_seq_op_decode(const void *payload, size_t len, cv_msg_seq_op *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    memset(m, 0, sizeof *m);
    m->op = cv_cursor_u8(&c, "op");
    const uint8_t *reserved = cv_cursor_bytes(&c, 3, "reserved");
    m->seq = cursor_i32(&c, "seq");
    m->len = cursor_i32(&c, "len");
    if (!c.failed && m->op == CV_SEQ_SET_SAMPLER) {
        cv_sampler_params *s = &m->sampler;
        s->temp = cv_cursor_f32(&c, "temp");
        s->top_k = cursor_i32(&c, "top_k");
        s->top_p = cv_cursor_f32(&c, "top_p");
        s->min_p = cv_cursor_f32(&c, "min_p");
        s->repeat_penalty = cv_cursor_f32(&c, "repeat_penalty");
        s->penalty_last_n = cursor_i32(&c, "penalty_last_n");
        s->freq_penalty = cv_cursor_f32(&c, "freq_penalty");
        s->presence_penalty = cv_cursor_f32(&c, "presence_penalty");
        s->seed = cv_cursor_u64(&c, "seed");
        m->n_probs = cv_cursor_u32(&c, "n_probs");
        s->n_draws = cv_cursor_u64(&c, "n_draws");
        const uint32_t n_bias = cv_cursor_u32(&c, "n_bias");
        if (n_bias > CV_PROTO_MAX_BIAS)
            return cv_errf(err, errlen, "SEQ_OP: SET_SAMPLER n_bias %" PRIu32 " exceeds %d", n_bias,
                           CV_PROTO_MAX_BIAS);
        s->n_bias = (int32_t)n_bias;
        const uint8_t *pairs = cv_cursor_bytes(&c, CV_SEQ_OP_BIAS_PAIR_SIZE * (size_t)n_bias, "bias");
        s->bias = n_bias ? (const cv_logit_bias *)pairs : NULL;
    } else if (!c.failed && m->op == CV_SEQ_COPY) {
        m->dst = cursor_i32(&c, "dst");
    } else if (!c.failed && m->op == CV_SEQ_SET_GRAMMAR) {
        m->grammar_len = cv_cursor_u32(&c, "text_len");
        if (m->grammar_len > CV_PROTO_MAX_GRAMMAR)
            return cv_errf(err, errlen, "SEQ_OP: SET_GRAMMAR text of %" PRIu32 " bytes, at most %u", m->grammar_len,
                           CV_PROTO_MAX_GRAMMAR);
        m->grammar = (const char *)cv_cursor_bytes(&c, m->grammar_len, "grammar");
    }
    if (finish(&c, "SEQ_OP", err, errlen))
        return -1;
    if (reserved[0] | reserved[1] | reserved[2])
        return cv_errf(err, errlen, "SEQ_OP: reserved bytes are not zero");
    return check_seq_op(m, err, errlen);
}

/* ---- PING / PONG / BYE ---- */

int cv_msg_ping_encode(const cv_msg_ping *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (cap < CV_MSG_PING_SIZE)
        return fail_cap("PING", CV_MSG_PING_SIZE, cap, err, errlen);
    put_u64(buf, m->nonce);
    put_u64((uint8_t *)buf + 8, m->timestamp);
    *len = CV_MSG_PING_SIZE;
    return 0;
}

int cv_msg_ping_decode(const void *payload, size_t len, cv_msg_ping *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    m->nonce = cv_cursor_u64(&c, "nonce");
    m->timestamp = cv_cursor_u64(&c, "timestamp");
    return finish(&c, "PING/PONG", err, errlen);
}

int cv_msg_bye_decode(const void *payload, size_t len, char *err, size_t errlen)
{
    (void)payload;
    if (len)
        return cv_errf(err, errlen, "BYE: %zu payload bytes, expected none", len);
    return 0;
}

/* ---- STATS / STATS_OK ---- */

int cv_msg_stats_encode(const cv_msg_stats *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (cap < CV_MSG_STATS_OK_SIZE)
        return fail_cap("STATS_OK", CV_MSG_STATS_OK_SIZE, cap, err, errlen);
    put_u64(buf, m->compute_ns);
    put_u64((uint8_t *)buf + 8, m->steps);
    put_u64((uint8_t *)buf + 16, m->tokens);
    put_u64((uint8_t *)buf + 24, m->bytes_sent);
    *len = CV_MSG_STATS_OK_SIZE;
    return 0;
}

int cv_msg_stats_decode(const void *payload, size_t len, cv_msg_stats *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    m->compute_ns = cv_cursor_u64(&c, "compute_ns");
    m->steps = cv_cursor_u64(&c, "steps");
    m->tokens = cv_cursor_u64(&c, "tokens");
    m->bytes_sent = cv_cursor_u64(&c, "bytes_sent");
    return finish(&c, "STATS_OK", err, errlen);
}

/* ---- FETCH / SHIP ---- */

int cv_msg_fetch_encode(uint64_t have, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (cap < CV_MSG_FETCH_SIZE)
        return fail_cap("FETCH", CV_MSG_FETCH_SIZE, cap, err, errlen);
    put_u64(buf, have);
    *len = CV_MSG_FETCH_SIZE;
    return 0;
}

int cv_msg_fetch_decode(const void *payload, size_t len, uint64_t *have, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    *have = cv_cursor_u64(&c, "have");
    return finish(&c, "FETCH", err, errlen);
}

int cv_msg_ship_encode_head(const cv_msg_ship *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    if (m->offset >= m->size)
        return cv_errf(err, errlen, "SHIP: offset %" PRIu64 " is not inside the file's %" PRIu64 " bytes", m->offset,
                       m->size);
    if (cap < CV_SHIP_FIXED_SIZE)
        return fail_cap("SHIP", CV_SHIP_FIXED_SIZE, cap, err, errlen);
    put_u64(buf, m->offset);
    put_u64((uint8_t *)buf + 8, m->size);
    *len = CV_SHIP_FIXED_SIZE;
    return 0;
}

int cv_msg_ship_decode(const void *payload, size_t len, cv_msg_ship *m, char *err, size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, payload, len);
    m->offset = cv_cursor_u64(&c, "offset");
    m->size = cv_cursor_u64(&c, "size");
    if (c.failed)
        return fail_short(&c, "SHIP", err, errlen);
    if (m->offset >= m->size)
        return cv_errf(err, errlen, "SHIP: offset %" PRIu64 " is not inside the file's %" PRIu64 " bytes", m->offset,
                       m->size);
    if (len == CV_SHIP_FIXED_SIZE || len > CV_SHIP_PAYLOAD_MAX)
        return cv_errf(err, errlen, "SHIP: a segment of %zu bytes, expected 1 to %u", len - CV_SHIP_FIXED_SIZE,
                       (unsigned)CV_PACK_SEGMENT_BOUND);
    m->segment = (const uint8_t *)payload + CV_SHIP_FIXED_SIZE;
    m->segment_len = len - CV_SHIP_FIXED_SIZE;
    return 0;
}

int cv_msg_validate(uint16_t type, const void *payload, size_t len, char *err, size_t errlen)
{
    switch (type) {
    case CV_MSG_HELLO: {
        cv_msg_hello m;
        return cv_msg_hello_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_HELLO_OK: {
        cv_msg_hello_ok m;
        return cv_msg_hello_ok_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_ERROR: {
        cv_msg_error m;
        return cv_msg_error_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_FORWARD: {
        cv_msg_forward m;
        return cv_msg_forward_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_RESULT: {
        cv_msg_result m;
        return result_parse(payload, len, &m, NULL, 0, err, errlen);
    }
    case CV_MSG_SEQ_OP: {
        cv_msg_seq_op m;
        return cv_msg_seq_op_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_PING:
    case CV_MSG_PONG: {
        cv_msg_ping m;
        return cv_msg_ping_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_BYE: return cv_msg_bye_decode(payload, len, err, errlen);
    case CV_MSG_STATS:
        if (len)
            return cv_errf(err, errlen, "STATS: %zu payload bytes, expected none", len);
        return 0;
    case CV_MSG_STATS_OK: {
        cv_msg_stats m;
        return cv_msg_stats_decode(payload, len, &m, err, errlen);
    }
    case CV_MSG_FETCH: {
        uint64_t have;
        return cv_msg_fetch_decode(payload, len, &have, err, errlen);
    }
    case CV_MSG_SHIP: {
        cv_msg_ship m;
        return cv_msg_ship_decode(payload, len, &m, err, errlen);
    }
    default: return cv_errf(err, errlen, "unknown message type %u", type);
    }
}
