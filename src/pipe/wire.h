/* wire.h: what both ends of a link, the head (chain.c, chain_open.c) and
 * a node (node.c, handshake.c), send and ask the same way.
 *
 * Contract:
 * - A cv_fwd_out holds the buffers of one outgoing FORWARD, allocated once
 *   for a batch size and reused batch after batch. The stage writes its
 *   hidden states into `hidden`; cv_fwd_out_send converts them to the
 *   wire's activation type when that is lossy, encodes the fixed part and
 *   the records into `header`, and queues both on the link as one frame
 *   without copying the activations. The link reads the buffers until the
 *   frame is sent, so cv_fwd_out_reclaim waits for that before a batch
 *   writes them again.
 * - cv_hello_ask sends a HELLO and waits for its answer: HELLO_OK, or an
 *   ERROR, whose text becomes the message (or a FETCH, to a head that
 *   ships layers: cv_hello_answer).
 * - cv_error_frame_text writes a received ERROR frame as a message.
 * Messages name the link. */
#ifndef CONVOY_PIPE_WIRE_H
#define CONVOY_PIPE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipe/link.h"
#include "pipe/proto.h"

typedef struct cv_fwd_out {
    float *hidden;     /* [n_batch][n_embd] the stage's output */
    uint8_t *header;   /* FORWARD fixed part, then n_batch records */
    uint8_t *act;      /* [n_batch][n_embd] in a lossy activation type */
    uint8_t trail[sizeof(uint32_t) * CV_TRAIL_MAX]; /* the stage times as sent */
    size_t n_batch;    /* records the buffers hold */
    uint64_t ticket;   /* the send that reads these buffers */
    bool ticket_live;
} cv_fwd_out;

int cv_fwd_out_alloc(cv_fwd_out *f, size_t n_batch, size_t n_embd, char *err, size_t errlen);
void cv_fwd_out_free(cv_fwd_out *f);
/* The records inside `header`, for a sender that builds them in place. */
static inline cv_fwd_token *cv_fwd_out_records(const cv_fwd_out *f)
{
    return (cv_fwd_token *)(f->header + CV_FWD_FIXED_SIZE);
}
/* Waits until the last send of f's buffers (on link l) is done. */
int cv_fwd_out_reclaim(cv_fwd_out *f, cv_link *l, char *err, size_t errlen);
/* Queues FORWARD `id` on l: m's n_tokens, n_embd, act_type, flags (plus
 * CV_FWD_HAS_HIDDEN), records and trail, with f->hidden as its activations
 * (m->act is not read). *bytes (may be NULL) receives the frame's size. */
int cv_fwd_out_send(cv_fwd_out *f, cv_link *l, uint32_t id, const cv_msg_forward *m, uint64_t *bytes, char *err,
                    size_t errlen);

int cv_hello_ask(cv_link *l, const cv_msg_hello *h, int timeout_ms, cv_msg_hello_ok *ok, char *err, size_t errlen);
/* The two halves of cv_hello_ask. An answer may also be a FETCH (a
 * receiving node asks for its layers, ship.h) when fetch is given:
 * CV_HELLO_FETCH, with what the node holds in *fetch. */
#define CV_HELLO_FETCH 1
int cv_hello_send(cv_link *l, const cv_msg_hello *h, char *err, size_t errlen);
int cv_hello_answer(cv_link *l, int timeout_ms, cv_msg_hello_ok *ok, uint64_t *fetch, char *err, size_t errlen);
/* "LINK: MESSAGE (CODE)", or what is wrong with the frame; returns -1. */
int cv_error_frame_text(const cv_link *l, const cv_frame *f, char *err, size_t errlen);

#endif
