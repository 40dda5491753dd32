/* gate.c: see gate.h.
 *
 * The pending set is a fixed array of slots (fd -1: free), each with its
 * accept order, deadline and the bytes of the handshake step it is in.
 * cv_gate_next polls the listener and every pending socket; a keyed
 * connection's socket is read exactly as far as the handshake's bytes (so
 * a frame the head sends right after its proof stays in the socket for the
 * link), a plaintext one is only peeked at. A plaintext peer that sent part
 * of the magic stays readable without progress, so its slot is looked at
 * again every RECHECK_MS instead of being polled for input. */
#include "pipe/gate.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"

#define RECHECK_MS 10
#define PEER_MAX 80

enum { STEP_HELLO, STEP_PROOF };
enum { ADV_WAIT, ADV_PROVEN, ADV_REFUSED };

typedef struct pending {
    int fd; /* -1: a free slot */
    char peer[PEER_MAX];
    uint64_t order; /* accept order: the smallest is the oldest */
    int64_t deadline;
    int step;
    uint8_t buf[CV_SEAL_HELLO_BYTES];
    size_t got;
    bool recheck; /* plaintext: part of the magic came, look again later */
    cv_seal_hs hs;
} pending;

struct cv_gate {
    cv_listener *listener;
    cv_gate_opts o;
    cv_seal_key key;
    pending slot[CV_GATE_MAX_PENDING];
    uint64_t accepted;
};

/* Closes a pending connection, logging why. */
static void refuse(cv_gate *g, pending *p, const char *why)
{
    fprintf(stderr, "%s: refused peer %s: %s\n", g->o.log_prefix, p->peer, why);
    close(p->fd);
    cv_seal_hs_wipe(&p->hs);
    p->fd = -1;
}

int cv_gate_open(const char *host, int port, const cv_gate_opts *o, cv_gate **out, char *err, size_t errlen)
{
    if (o->deadline_ms <= 0 || o->max_pending < 0 || o->max_pending > CV_GATE_MAX_PENDING)
        return cv_errf(err, errlen, "gate: deadline %d ms or %d pending connections out of range", o->deadline_ms,
                       o->max_pending);
    if (o->key && cv_seal_init(err, errlen))
        return -1;
    cv_gate *g = cv_calloc(1, sizeof *g);
    if (!g)
        return cv_errf(err, errlen, "gate: out of memory");
    g->o = *o;
    if (!g->o.max_pending)
        g->o.max_pending = CV_GATE_MAX_PENDING;
    if (o->key) { /* the gate keeps its own copy: the caller's may go */
        g->key = *o->key;
        g->o.key = &g->key;
    }
    for (int i = 0; i < CV_GATE_MAX_PENDING; i++)
        g->slot[i].fd = -1;
    if (cv_listener_open(host, port, &g->listener, err, errlen)) {
        cv_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

int cv_gate_port(const cv_gate *g) { return cv_listener_port(g->listener); }

void cv_gate_close(cv_gate *g)
{
    if (!g)
        return;
    for (int i = 0; i < CV_GATE_MAX_PENDING; i++)
        if (g->slot[i].fd >= 0) {
            close(g->slot[i].fd);
            cv_seal_hs_wipe(&g->slot[i].hs);
        }
    cv_listener_close(g->listener);
    cv_seal_key_wipe(&g->key);
    cv_free(g);
}

/* A free slot, dropping the oldest pending connection when none is. */
static pending *free_slot(cv_gate *g)
{
    pending *oldest = NULL;
    for (int i = 0; i < g->o.max_pending; i++) {
        if (g->slot[i].fd < 0)
            return &g->slot[i];
        if (!oldest || g->slot[i].order < oldest->order)
            oldest = &g->slot[i];
    }
    char why[96];
    snprintf(why, sizeof why, "dropped unproven to make room (%d connections pending)", g->o.max_pending);
    refuse(g, oldest, why);
    return oldest;
}

/* Takes every connection waiting on the listener into the pending set. */
static int accept_all(cv_gate *g, char *err, size_t errlen)
{
    for (;;) {
        int fd;
        char peer[PEER_MAX];
        const int rc = cv_listener_take(g->listener, &fd, peer, sizeof peer, err, errlen);
        if (rc)
            return rc == CV_LINK_TIMEOUT ? 0 : -1;
        pending *p = free_slot(g);
        memset(p, 0, sizeof *p);
        p->fd = fd;
        snprintf(p->peer, sizeof p->peer, "%s", peer);
        p->order = ++g->accepted;
        p->deadline = cv_now_ms() + g->o.deadline_ms;
        p->step = STEP_HELLO;
    }
}

/* Reads what the socket holds of the current step's `want` bytes, without
 * waiting: 1 when all are there, 0 when more are due, -1 when the peer
 * closed or failed (why says so). */
static int read_step(pending *p, size_t want, char *why, size_t whylen)
{
    while (p->got < want) {
        const ssize_t r = recv(p->fd, p->buf + p->got, want - p->got, MSG_DONTWAIT);
        if (r > 0) {
            p->got += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r < 0 && errno == EINTR)
            continue;
        snprintf(why, whylen, "%s during the key handshake (its key differs, or it is no convoy peer)",
                 r == 0 ? "closed the connection" : strerror(errno));
        return -1;
    }
    return 1;
}

/* The first 4 bytes of a keyed connection: anything but the key
 * handshake's magic is refused, a plaintext frame with a hint. */
static bool bad_magic(const pending *p, char *why, size_t whylen)
{
    const size_t n = p->got < 4 ? p->got : 4;
    if (memcmp(p->buf, CV_SEAL_MAGIC, n) == 0)
        return false;
    if (memcmp(p->buf, "CVY1", n) == 0)
        snprintf(why, whylen, "sent a plaintext frame, and this stage requires --key");
    else
        snprintf(why, whylen, "did not begin the key handshake");
    return true;
}

/* The server's handshake, as far as the peer's bytes go. */
static int advance_keyed(cv_gate *g, pending *p, char *why, size_t whylen)
{
    char err[CV_ERRLEN];
    if (p->step == STEP_HELLO) {
        const int rc = read_step(p, CV_SEAL_HELLO_BYTES, why, whylen);
        if (rc < 0 || bad_magic(p, why, whylen))
            return ADV_REFUSED;
        if (rc == 0)
            return ADV_WAIT;
        uint8_t reply[CV_SEAL_REPLY_BYTES];
        if (cv_seal_server_reply(&p->hs, g->o.key, p->buf, reply, err, sizeof err)) {
            snprintf(why, whylen, "%s", err);
            return ADV_REFUSED;
        }
        /* 64 bytes always fit a new socket's buffer: a short send is a failure */
        if (send(p->fd, reply, sizeof reply, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof reply) {
            snprintf(why, whylen, "could not send the key handshake's reply");
            return ADV_REFUSED;
        }
        p->step = STEP_PROOF;
        p->got = 0;
    }
    const int rc = read_step(p, CV_SEAL_PROOF_BYTES, why, whylen);
    if (rc <= 0)
        return rc < 0 ? ADV_REFUSED : ADV_WAIT;
    if (cv_seal_server_finish(&p->hs, p->buf, err, sizeof err)) {
        snprintf(why, whylen, "%s", err);
        return ADV_REFUSED;
    }
    return ADV_PROVEN;
}

/* Plaintext: the frame magic, peeked (the link reads the frame). */
static int advance_plain(pending *p, char *why, size_t whylen)
{
    const ssize_t r = recv(p->fd, p->buf, 4, MSG_PEEK | MSG_DONTWAIT);
    p->recheck = false;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return ADV_WAIT;
    if (r <= 0) {
        snprintf(why, whylen, "%s before its first frame", r == 0 ? "closed the connection" : strerror(errno));
        return ADV_REFUSED;
    }
    if (memcmp(p->buf, "CVY1", (size_t)r) != 0) {
        snprintf(why, whylen, "%s", memcmp(p->buf, CV_SEAL_MAGIC, (size_t)r) == 0
                                        ? "began the key handshake, and this stage has no --key"
                                        : "sent bytes that are not a convoy frame");
        return ADV_REFUSED;
    }
    p->recheck = r < 4;
    return r < 4 ? ADV_WAIT : ADV_PROVEN;
}

/* Hands a proven connection over as a link; its slot is free again. */
static int hand_over(cv_gate *g, pending *p, const cv_link_opts *opts, cv_link **out, char *err, size_t errlen)
{
    const int fd = p->fd;
    p->fd = -1;
    const int rc = cv_link_adopt(fd, p->peer, opts, g->o.key ? &p->hs.session : NULL, out, err, errlen);
    cv_seal_hs_wipe(&p->hs);
    return rc;
}

/* Drops the pending connections whose deadline passed; returns the
 * milliseconds until the next deadline (at most cap). */
static int expire(cv_gate *g, int cap)
{
    const int64_t now = cv_now_ms();
    int64_t next = cap;
    for (int i = 0; i < g->o.max_pending; i++) {
        pending *p = &g->slot[i];
        if (p->fd < 0)
            continue;
        if (now >= p->deadline) {
            char why[96];
            snprintf(why, sizeof why, "no %s within %d ms", g->o.key ? "key handshake" : "frame", g->o.deadline_ms);
            refuse(g, p, why);
        } else if (p->deadline - now < next) {
            next = p->deadline - now;
        }
        if (p->fd >= 0 && p->recheck && next > RECHECK_MS)
            next = RECHECK_MS;
    }
    return (int)next;
}

/* One round: polls the listener and the pending set for up to wait_ms,
 * advances what is ready and takes new connections. 1 with *out when a
 * connection was proven, 0 when none was, -1 on a listener error. */
static int round_once(cv_gate *g, int wait_ms, const cv_link_opts *opts, cv_link **out, char *err, size_t errlen)
{
    struct pollfd pfd[1 + CV_GATE_MAX_PENDING];
    int idx[1 + CV_GATE_MAX_PENDING], n = 1;
    pfd[0] = (struct pollfd){.fd = cv_listener_fd(g->listener), .events = POLLIN};
    for (int i = 0; i < g->o.max_pending; i++)
        if (g->slot[i].fd >= 0) {
            idx[n] = i;
            pfd[n++] = (struct pollfd){.fd = g->slot[i].fd, .events = g->slot[i].recheck ? 0 : POLLIN};
        }
    if (poll(pfd, (nfds_t)n, wait_ms) < 0 && errno != EINTR)
        return cv_errf(err, errlen, "gate: poll failed: %s", strerror(errno));
    for (int k = 1; k < n; k++) {
        pending *p = &g->slot[idx[k]];
        if (!pfd[k].revents && !p->recheck)
            continue;
        char why[CV_ERRLEN];
        const int rc = g->o.key ? advance_keyed(g, p, why, sizeof why) : advance_plain(p, why, sizeof why);
        if (rc == ADV_REFUSED)
            refuse(g, p, why);
        else if (rc == ADV_PROVEN)
            return hand_over(g, p, opts, out, err, errlen) ? -1 : 1;
    }
    return pfd[0].revents && accept_all(g, err, errlen) ? -1 : 0;
}

int cv_gate_next(cv_gate *g, int timeout_ms, const cv_link_opts *opts, cv_link **out, char *err, size_t errlen)
{
    const int64_t deadline = timeout_ms < 0 ? -1 : cv_now_ms() + timeout_ms;
    for (;;) {
        const int64_t left = deadline < 0 ? 1000 : deadline - cv_now_ms();
        const int rc = round_once(g, expire(g, left < 0 ? 0 : left > 1000 ? 1000 : (int)left), opts, out, err,
                                  errlen);
        if (rc)
            return rc < 0 ? -1 : 0;
        if (deadline >= 0 && cv_now_ms() >= deadline) {
            cv_errf(err, errlen, "no proven connection within %d ms", timeout_ms);
            return CV_LINK_TIMEOUT;
        }
    }
}
