/* proto_step.c: the encoders and decoders of proto.h's messages of a
 * running session: FORWARD, RESULT and SEQ_OP, step after step, and PING,
 * PONG, BYE, STATS and STATS_OK beside them. The messages that open a
 * session (HELLO, HELLO_OK, FETCH, SHIP), ERROR, the frame header and
 * CRC32C are proto.c's; both follow proto.c's rules for encoders and
 * decoders. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/cursor.h"
#include "core/err.h"
#include "pipe/proto.h"
#include "pipe/proto_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "proto_step.c hands out pointers to little-endian wire records: little-endian hosts only"
#endif

/* ---- FORWARD ---- */

uint64_t cv_msg_forward_act_size(const cv_msg_forward *m)
{
    return m->flags & CV_FWD_HAS_HIDDEN ? cv_act_bytes(m->act_type, m->n_tokens, m->n_embd) : 0;
}

uint64_t cv_msg_forward_header_size(const cv_msg_forward *m)
{
    return CV_FWD_FIXED_SIZE + (uint64_t)m->n_tokens * sizeof(cv_fwd_token);
}

uint64_t cv_msg_forward_trail_size(const cv_msg_forward *m) { return (uint64_t)m->n_trail * sizeof(uint32_t); }

uint64_t cv_msg_forward_size(const cv_msg_forward *m)
{
    return cv_msg_forward_header_size(m) + cv_msg_forward_act_size(m) + cv_msg_forward_trail_size(m);
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

int cv_msg_forward_encode_header(const cv_msg_forward *m, void *buf, size_t cap, size_t *len, char *err,
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
    uint64_t need = cv_msg_forward_header_size(m);
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
    size_t header;
    if (cv_msg_forward_encode_header(m, buf, cap, &header, err, errlen))
        return -1;
    uint64_t act = cv_msg_forward_act_size(m);
    if (act)
        memcpy((uint8_t *)buf + header, m->act, (size_t)act);
    cv_msg_forward_encode_trail(m, (uint8_t *)buf + header + act);
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

int cv_msg_result_parse(const void *payload, size_t len, cv_msg_result *m, cv_result_row *rows, uint32_t max_rows,
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
    if (cv_msg_result_parse(payload, len, m, rows ? rows : &none, max_rows, err, errlen))
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

