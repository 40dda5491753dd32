/* fuzz_frame.c: libFuzzer target for the wire protocol decoders (proto.h).
 *
 * The first input byte picks the path: 0 decodes the rest as a frame (the
 * 24-byte header, then its payload, checksum checked but the payload
 * decoded even when it does not match, so the fuzzer reaches the payload
 * decoders); 1 .. CV_MSG_COUNT-1 decodes the rest directly as the payload
 * of that message type. Payloads are copied into an exact-size heap buffer, so
 * AddressSanitizer reports any read past them. A rejection must come with
 * a message that starts with the message's name. An accepted payload must
 * have every decoded pointer inside it (touched at both ends) and must
 * encode back to exactly the same bytes: every encoding is canonical.
 * Seed corpus: `test_proto --corpus DIR`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "pipe/proto.h"

#define MAX_ROWS 4096

static volatile uint64_t sink;
static cv_result_row rows[MAX_ROWS];
static _Alignas(64) uint8_t out[1 << 20];

static void check_prefix(uint16_t type, const char *err)
{
    const char *name = type == CV_MSG_PONG ? "PING" : cv_msg_type_name(type);
    if (strncmp(err, name, strlen(name)) != 0)
        abort();
}

static void touch(const void *base, size_t len, const void *p, size_t n)
{
    const uint8_t *b = base, *q = p;
    if (n == 0)
        return;
    if (q < b || q + n > b + len)
        abort();
    sink += q[0] + q[n - 1];
}

static void same_bytes(int rc, const uint8_t *payload, size_t len, size_t out_len)
{
    if (rc != 0 || out_len != len || memcmp(out, payload, len) != 0)
        abort();
}

static void decode_payload(uint16_t type, const uint8_t *payload, size_t len)
{
    char err[CV_ERRLEN] = "";
    size_t n = 0;
    switch (type) {
    case CV_MSG_HELLO: {
        cv_msg_hello m;
        if (cv_msg_hello_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        if (cv_msg_hello_size(&m) <= sizeof out)
            same_bytes(cv_msg_hello_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_HELLO_OK: {
        cv_msg_hello_ok m;
        if (cv_msg_hello_ok_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        same_bytes(cv_msg_hello_ok_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_ERROR: {
        cv_msg_error m;
        if (cv_msg_error_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        same_bytes(cv_msg_error_encode(m.code, m.message, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_FORWARD: {
        cv_msg_forward m;
        if (cv_msg_forward_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        touch(payload, len, m.tokens, (size_t)m.n_tokens * sizeof(cv_fwd_token));
        touch(payload, len, m.act, (size_t)cv_msg_forward_act_size(&m));
        if (cv_msg_forward_size(&m) <= sizeof out)
            same_bytes(cv_msg_forward_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_RESULT: {
        cv_msg_result m;
        int rc = cv_msg_result_decode(payload, len, &m, rows, MAX_ROWS, err, sizeof err);
        if (cv_msg_validate(type, payload, len, err, sizeof err) != rc && m.n_rows <= MAX_ROWS)
            abort();
        if (rc)
            return check_prefix(type, err);
        for (uint32_t i = 0; i < m.n_rows; i++)
            touch(payload, len, rows[i].top, rows[i].n_top * sizeof(cv_top_entry));
        touch(payload, len, m.logits, (size_t)m.n_rows * m.n_vocab * sizeof(float));
        uint32_t n_embd_rows = 0;
        for (uint32_t i = 0; i < m.n_rows; i++)
            n_embd_rows += rows[i].kind == CV_ROW_EMBD;
        touch(payload, len, m.embd, (size_t)n_embd_rows * m.n_embd * sizeof(float));
        if (cv_msg_result_size(&m) <= sizeof out)
            same_bytes(cv_msg_result_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_SEQ_OP: {
        cv_msg_seq_op m;
        if (cv_msg_seq_op_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        same_bytes(cv_msg_seq_op_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_PING:
    case CV_MSG_PONG: {
        cv_msg_ping m;
        if (cv_msg_ping_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        same_bytes(cv_msg_ping_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_BYE:
        if (cv_msg_bye_decode(payload, len, err, sizeof err))
            return check_prefix(type, err);
        if (len != 0)
            abort();
        return;
    case CV_MSG_STATS:
        if (cv_msg_validate(type, payload, len, err, sizeof err))
            return check_prefix(type, err);
        if (len != 0)
            abort();
        return;
    case CV_MSG_STATS_OK: {
        cv_msg_stats m;
        if (cv_msg_stats_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        same_bytes(cv_msg_stats_encode(&m, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_FETCH: {
        uint64_t have;
        if (cv_msg_fetch_decode(payload, len, &have, err, sizeof err))
            return check_prefix(type, err);
        same_bytes(cv_msg_fetch_encode(have, out, sizeof out, &n, err, sizeof err), payload, len, n);
        return;
    }
    case CV_MSG_SHIP: {
        cv_msg_ship m;
        if (cv_msg_ship_decode(payload, len, &m, err, sizeof err))
            return check_prefix(type, err);
        touch(payload, len, m.segment, m.segment_len);
        if (cv_msg_ship_encode_header(&m, out, sizeof out, &n, err, sizeof err) || memcmp(out, payload, n))
            abort();
        return;
    }
    default:
        if (cv_msg_validate(type, payload, len, err, sizeof err) == 0)
            abort();
        return;
    }
}

/* Decodes payload bytes from an exact-size heap copy. */
static void decode_copy(uint16_t type, const uint8_t *data, size_t len)
{
    uint8_t *copy = cv_malloc(len ? len : 1);
    if (!copy)
        return;
    memcpy(copy, data, len);
    decode_payload(type, len ? copy : NULL, len);
    cv_free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    if (mode >= 1 && mode < CV_MSG_COUNT) {
        decode_copy(mode, data, size);
        return 0;
    }
    if (mode != 0 || size < CV_FRAME_HEADER_SIZE)
        return 0;
    cv_frame_header h;
    char err[CV_ERRLEN] = "";
    if (cv_frame_header_decode(data, (uint32_t)(size - CV_FRAME_HEADER_SIZE), &h, err, sizeof err))
        return 0;
    if (h.type == 0 || h.type >= CV_MSG_COUNT || h.payload_len > size - CV_FRAME_HEADER_SIZE)
        abort();
    uint8_t re[CV_FRAME_HEADER_SIZE];
    cv_frame_header_encode(&h, re);
    if (memcmp(re, data, CV_FRAME_HEADER_SIZE) != 0)
        abort();
    const uint8_t *payload = data + CV_FRAME_HEADER_SIZE;
    sink += (uint64_t)cv_frame_check_payload(&h, payload, err, sizeof err);
    decode_copy(h.type, payload, h.payload_len);
    return 0;
}
