/* wire.c: the FORWARD sender, the HELLO question and the ERROR text that
 * the head and the nodes share (see wire.h). */
#include "pipe/wire.h"

#include "core/alloc.h"
#include "core/err.h"

int cv_fwd_out_alloc(cv_fwd_out *f, size_t n_batch, size_t n_embd, char *err, size_t errlen)
{
    *f = (cv_fwd_out){.n_batch = n_batch};
    f->hidden = cv_aligned_alloc(sizeof(float) * n_batch * n_embd);
    f->header = cv_aligned_alloc(CV_FWD_FIXED_SIZE + sizeof(cv_fwd_token) * n_batch);
    /* F16 is the widest lossy type (Q8_0 takes 34 bytes per 32 values) */
    f->act = cv_aligned_alloc(cv_act_bytes(CV_ACT_F16, n_batch, n_embd));
    if (!f->hidden || !f->header || !f->act)
        return cv_errf(err, errlen, "out of memory for buffers of %zu tokens", n_batch);
    return 0;
}

void cv_fwd_out_free(cv_fwd_out *f)
{
    cv_free_aligned(f->hidden);
    cv_free_aligned(f->header);
    cv_free_aligned(f->act);
    *f = (cv_fwd_out){0};
}

int cv_fwd_out_reclaim(cv_fwd_out *f, cv_link *l, char *err, size_t errlen)
{
    if (!f->ticket_live)
        return 0;
    f->ticket_live = false;
    return cv_link_wait_sent(l, f->ticket, err, errlen);
}

int cv_fwd_out_send(cv_fwd_out *f, cv_link *l, uint32_t id, const cv_msg_forward *in, uint64_t *bytes, char *err,
                    size_t errlen)
{
    if (in->n_tokens > f->n_batch)
        return cv_errf(err, errlen, "%s: FORWARD of %u tokens, the buffers hold %zu", cv_link_name(l), in->n_tokens,
                       f->n_batch);
    cv_msg_forward m = *in;
    m.flags |= CV_FWD_HAS_HIDDEN;
    m.act = f->hidden;
    if (m.act_type != CV_ACT_F32) {
        if (cv_act_from_f32(m.act_type, f->hidden, (uint64_t)m.n_tokens * m.n_embd, f->act, err, errlen))
            return -1;
        m.act = f->act;
    }
    size_t header_len;
    if (cv_msg_forward_encode_header(&m, f->header, CV_FWD_FIXED_SIZE + sizeof(cv_fwd_token) * f->n_batch, &header_len,
                                   err, errlen))
        return -1;
    const size_t act_len = (size_t)cv_msg_forward_act_size(&m), trail_len = (size_t)cv_msg_forward_trail_size(&m);
    cv_msg_forward_encode_trail(&m, f->trail);
    const struct iovec parts[3] = {{f->header, header_len}, {(void *)m.act, act_len}, {f->trail, trail_len}};
    if (cv_link_sendv(l, CV_MSG_FORWARD, id, parts, 3, &f->ticket, err, errlen))
        return -1;
    f->ticket_live = true;
    if (bytes)
        *bytes = CV_FRAME_HEADER_SIZE + header_len + act_len + trail_len;
    return 0;
}

int cv_hello_send(cv_link *l, const cv_msg_hello *h, char *err, size_t errlen)
{
    /* an assignment's tensor hashes make it kilobytes (megabytes at most) */
    const size_t cap = cv_msg_hello_size(h);
    uint8_t *buf = cv_malloc(cap);
    size_t len;
    if (!buf)
        return cv_errf(err, errlen, "out of memory for a HELLO of %zu bytes", cap);
    const int failed = cv_msg_hello_encode(h, buf, cap, &len, err, errlen) ||
                       cv_link_send(l, CV_MSG_HELLO, 0, buf, len, err, errlen);
    cv_free(buf);
    return failed ? -1 : 0;
}

int cv_hello_answer(cv_link *l, int timeout_ms, cv_msg_hello_ok *ok, uint64_t *fetch, char *err, size_t errlen)
{
    cv_frame f;
    char why[CV_ERRLEN];
    int rc = cv_link_recv(l, timeout_ms, &f, err, errlen);
    if (rc == CV_LINK_TIMEOUT)
        return cv_errf(err, errlen, "%s: no answer to HELLO within %d ms", cv_link_name(l), timeout_ms);
    if (rc)
        return -1;
    if (f.h.type == CV_MSG_HELLO_OK)
        rc = cv_msg_hello_ok_decode(f.payload, f.h.payload_len, ok, why, sizeof why)
                 ? cv_errf(err, errlen, "%s: %s", cv_link_name(l), why)
                 : 0;
    else if (f.h.type == CV_MSG_FETCH && fetch)
        rc = cv_msg_fetch_decode(f.payload, f.h.payload_len, fetch, why, sizeof why)
                 ? cv_errf(err, errlen, "%s: %s", cv_link_name(l), why)
                 : CV_HELLO_FETCH;
    else if (f.h.type == CV_MSG_ERROR)
        rc = cv_error_frame_text(l, &f, err, errlen);
    else
        rc = cv_errf(err, errlen, "%s: answered HELLO with %s", cv_link_name(l), cv_msg_type_name(f.h.type));
    cv_link_release(l, &f);
    return rc;
}

int cv_hello_ask(cv_link *l, const cv_msg_hello *h, int timeout_ms, cv_msg_hello_ok *ok, char *err, size_t errlen)
{
    return cv_hello_send(l, h, err, errlen) || cv_hello_answer(l, timeout_ms, ok, NULL, err, errlen) ? -1 : 0;
}

int cv_error_frame_text(const cv_link *l, const cv_frame *f, char *err, size_t errlen)
{
    cv_msg_error e;
    char why[CV_ERRLEN];
    if (cv_msg_error_decode(f->payload, f->h.payload_len, &e, why, sizeof why))
        return cv_errf(err, errlen, "%s: %s", cv_link_name(l), why);
    return cv_errf(err, errlen, "%s: %s (%s)", cv_link_name(l), e.message, cv_perr_name(e.code));
}
