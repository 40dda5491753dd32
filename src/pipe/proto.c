/* proto.c: proto.h's frame header and CRC32C, its activation types, the
 * messages that open a session (HELLO, HELLO_OK, FETCH, SHIP) and ERROR,
 * and cv_msg_validate over every type. The messages of a running session
 * are proto_step.c's.
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
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/cursor.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "pipe/proto_impl.h"

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

int cv_msg_ship_encode_header(const cv_msg_ship *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen)
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
        return cv_msg_result_parse(payload, len, &m, NULL, 0, err, errlen);
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
