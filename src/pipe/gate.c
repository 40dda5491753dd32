/* gate.c: admission to a node: the gate of gate.h, then what the node
 * admits past it (node_impl.h).
 *
 * The gate's pending set is a fixed array of places (fd -1: free), each with its
 * accept order, deadline and the bytes of the handshake step it is in.
 * cv_gate_next polls the listener and every pending socket; a keyed
 * connection's socket is read exactly as far as the handshake's bytes (so
 * a frame the head sends right after its proof stays in the socket for the
 * link), a plaintext one is only peeked at. A plaintext peer that sent part
 * of the magic stays readable without progress, so its place is looked at
 * again every RECHECK_MS instead of being polled for input.
 *
 * Past the gate, a proven connection that arrives while a head holds the
 * node is parked (a few places, each with its first frame once read): a
 * head's HELLO waits for node.h's takeover rule, the previous node of the
 * chain is handed to the handshake, anything else is refused. HELLOs are
 * counted per source address in a token bucket (node.h's rate). */
#include "pipe/gate.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "pipe/node_impl.h"

#define RECHECK_MS 10
#define PEER_MAX 80

enum { STEP_HELLO, STEP_PROOF };
enum { ADV_WAIT, ADV_PROVEN, ADV_REFUSED };

typedef struct pending {
    int fd; /* -1: a free place */
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
    pending place[CV_GATE_MAX_PENDING];
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
        g->place[i].fd = -1;
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
        if (g->place[i].fd >= 0) {
            close(g->place[i].fd);
            cv_seal_hs_wipe(&g->place[i].hs);
        }
    cv_listener_close(g->listener);
    cv_seal_key_wipe(&g->key);
    cv_free(g);
}

/* A free place, dropping the oldest pending connection when none is. */
static pending *free_place(cv_gate *g)
{
    pending *oldest = NULL;
    for (int i = 0; i < g->o.max_pending; i++) {
        if (g->place[i].fd < 0)
            return &g->place[i];
        if (!oldest || g->place[i].order < oldest->order)
            oldest = &g->place[i];
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
        pending *p = free_place(g);
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

/* Hands a proven connection over as a link; its place is free again. */
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
        pending *p = &g->place[i];
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
        if (g->place[i].fd >= 0) {
            idx[n] = i;
            pfd[n++] = (struct pollfd){.fd = g->place[i].fd, .events = g->place[i].recheck ? 0 : POLLIN};
        }
    if (poll(pfd, (nfds_t)n, wait_ms) < 0 && errno != EINTR)
        return cv_errf(err, errlen, "gate: poll failed: %s", strerror(errno));
    for (int k = 1; k < n; k++) {
        pending *p = &g->place[idx[k]];
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

/* ---- the node's admission (node_impl.h): parked connections, takeover, the HELLO rate ---- */

/* node.h's takeover: how long a head may be silent before a proven head
 * that waits takes the stage. */
#define TAKEOVER_MS 1000
/* How long a parked connection may take to send its first frame (a real
 * peer sends it with its proof). */
#define FIRST_FRAME_MS 2000

/* node.h's rate of HELLOs per source address: a bucket of HELLO_BURST
 * that refills HELLO_PER_S a second. A head sends two per stage as its
 * chain opens (a query, an assignment), and heads of one host may share
 * its address: the bucket holds 16 openings at once and 8 a second after,
 * while a peer that reconnects to ask again and again (a thousand times a
 * second on loopback) gets ERROR RATE, which costs no probe and no plan. */
#define HELLO_BURST 32
#define HELLO_PER_S 16

/* Closes a parked connection; with why, it is told (ERROR code) and the
 * refusal logged. */
void cv_node_unpark(parked *p, uint32_t code, const char *why)
{
    if (why) {
        fprintf(stderr, "convoy stage: refused %s: %s\n", cv_link_name(p->link), why);
        cv_node_send_error(p->link, p->has_first ? p->first.h.id : 0, code, why);
    }
    if (p->has_first)
        cv_link_release(p->link, &p->first);
    cv_link_close(p->link);
    *p = (parked){0};
}

/* Parks the next proven connection of the gate, waiting up to wait_ms for
 * one when a place is free (else just waits: parked ones leave within
 * FIRST_FRAME_MS or TAKEOVER_MS), and reads the first frame of those that
 * have sent it. Never waits on a parked peer. */
void cv_node_park_poll(node *n, int wait_ms)
{
    int free_i = -1;
    for (int i = PARKED_MAX - 1; i >= 0; i--)
        free_i = n->park[i].link ? free_i : i;
    char err[CV_ERRLEN];
    cv_link *l = NULL;
    const cv_link_opts lo = cv_node_link_opts(n);
    if (free_i < 0) {
        const struct timespec ts = {.tv_nsec = (long)wait_ms * 1000000L};
        nanosleep(&ts, NULL);
    } else if (cv_gate_next(n->gate, wait_ms, &lo, &l, err, sizeof err) == 0) {
        cv_link_set_max_payload(l, cv_node_hello_cap(n)); /* a HELLO at most, as in the handshake */
        n->park[free_i] = (parked){.link = l, .since = cv_now_ms()};
    }
    for (int i = 0; i < PARKED_MAX; i++) {
        parked *p = &n->park[i];
        if (!p->link || p->has_first)
            continue;
        const int rc = cv_link_recv(p->link, 0, &p->first, err, sizeof err);
        if (rc == 0)
            p->has_first = true;
        else if (rc < 0 || cv_now_ms() - p->since > FIRST_FRAME_MS)
            cv_node_unpark(p, rc < 0 ? CV_PERR_BAD_FRAME : CV_PERR_TIMEOUT,
                           rc < 0 ? err : "no HELLO after the key handshake");
    }
}

/* Whether parked p's first frame is a HELLO of role `role`, into *h. */
static bool parked_hello(const parked *p, uint8_t role, cv_msg_hello *h)
{
    char why[CV_ERRLEN];
    return p->has_first && p->first.h.type == CV_MSG_HELLO &&
           cv_msg_hello_decode(p->first.payload, p->first.h.payload_len, h, why, sizeof why) == 0 && h->role == role;
}

/* Whether h is the previous node of this node's chain. */
static bool is_prev(const node *n, const cv_msg_hello *h)
{
    return h->role == CV_ROLE_PREV_NODE && h->cluster_id == n->hello.cluster_id &&
           !memcmp(h->model_hash, n->hashes.meta, CV_HASH_BYTES);
}

/* Sorts the parked connections that spoke: a head's HELLO waits (node.h's
 * takeover), this chain's previous node is returned when want_prev (its
 * place freed, its HELLO read), anything else is refused. */
cv_link *cv_node_park_sort(node *n, bool want_prev)
{
    for (int i = 0; i < PARKED_MAX; i++) {
        parked *p = &n->park[i];
        cv_msg_hello h;
        if (!p->has_first || parked_hello(p, CV_ROLE_HEAD, &h))
            continue;
        if (!parked_hello(p, CV_ROLE_PREV_NODE, &h))
            cv_node_unpark(p, CV_PERR_BAD_STATE, "expected HELLO");
        else if (!want_prev || !is_prev(n, &h))
            cv_node_unpark(p, CV_PERR_CLUSTER, "not the previous node of the chain this node serves");
        else {
            cv_link *l = p->link;
            cv_link_release(l, &p->first);
            *p = (parked){0};
            return l;
        }
    }
    return NULL;
}

/* The oldest parked head (its HELLO read), or NULL. */
static parked *contender(node *n)
{
    parked *c = NULL;
    cv_msg_hello h;
    for (int i = 0; i < PARKED_MAX; i++)
        if (parked_hello(&n->park[i], CV_ROLE_HEAD, &h) && (!c || n->park[i].since < c->since))
            c = &n->park[i];
    return c;
}

/* node.h's takeover rule: a parked head takes the node once the session's
 * head has been silent for TAKEOVER_MS (true: the session must end, see
 * cv_node_yield); one parked before the head last spoke is refused. */
bool cv_node_takeover_due(node *n)
{
    parked *c = contender(n);
    if (!c || cv_now_ms() - n->heard >= TAKEOVER_MS)
        return c != NULL;
    if (n->heard > c->since)
        cv_node_unpark(c, CV_PERR_BAD_STATE, "this node serves another head, which is active");
    return false;
}

/* Ends the session for a parked head (cv_node_takeover_due): the head is told why. */
int cv_node_yield(node *n, char *err, size_t errlen)
{
    cv_errf(err, errlen, "%s was silent for %lld ms and %s asks for this node: the session ends",
            cv_link_name(n->head_link), (long long)(cv_now_ms() - n->heard), cv_link_name(contender(n)->link));
    cv_node_send_error(n->head_link, 0, CV_PERR_TIMEOUT, err);
    return -1;
}

/* Makes the oldest parked connection (a head that took over, or any, when
 * none is a head) the head of the next session; false when none is parked. */
bool cv_node_unpark_head(node *n)
{
    parked *p = contender(n);
    if (!p)
        for (int i = 0; i < PARKED_MAX; i++)
            if (n->park[i].link && (!p || n->park[i].since < p->since))
                p = &n->park[i];
    if (!p)
        return false;
    n->head_link = p->link;
    n->first = p->first;
    n->has_first = p->has_first;
    *p = (parked){0};
    return true;
}

/* The peer's address as a rate key: IPv4 (an IPv4-mapped IPv6 address
 * too), or the /64 of IPv6, which one host holds whole. false: unknown. */
static bool rate_key(const cv_link *l, uint8_t key[RATE_KEY_BYTES])
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    memset(key, 0, RATE_KEY_BYTES);
    if (getpeername(cv_link_poll_fd(l), (struct sockaddr *)&ss, &sl))
        return false;
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
    if (ss.ss_family == AF_INET)
        memcpy(key + 1, &((const struct sockaddr_in *)&ss)->sin_addr, 4);
    else if (ss.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(a6))
        memcpy(key + 1, a6->s6_addr + 12, 4);
    else if (ss.ss_family == AF_INET6)
        memcpy(key + 1, a6->s6_addr, 8);
    else
        return false;
    key[0] = ss.ss_family == AF_INET || IN6_IS_ADDR_V4MAPPED(a6) ? 4 : 6;
    return true;
}

/* node.h's rate: takes one of the head's address's HELLOs from its bucket
 * (a new address, or one forgotten, starts full); refuses (RATE) when the
 * bucket is empty. The table forgets the address heard from longest ago. */
int cv_node_rate_refuses(node *n, uint32_t *code, char *err, size_t errlen)
{
    uint8_t key[RATE_KEY_BYTES];
    if (!rate_key(n->head_link, key))
        return 0;
    const int64_t now = cv_now_ms();
    rate_entry *s = NULL, *oldest = &n->rate[0];
    for (int i = 0; i < RATE_ADDRS && !s; i++) {
        if (!memcmp(n->rate[i].key, key, sizeof key))
            s = &n->rate[i];
        else if (n->rate[i].t_ms < oldest->t_ms)
            oldest = &n->rate[i];
    }
    if (!s) {
        s = oldest;
        *s = (rate_entry){.tokens = HELLO_BURST, .t_ms = now};
        memcpy(s->key, key, sizeof key);
    }
    s->tokens += (double)(now - s->t_ms) * HELLO_PER_S / 1000.0;
    s->tokens = s->tokens < HELLO_BURST ? s->tokens : HELLO_BURST;
    s->t_ms = now;
    if (s->tokens < 1) {
        *code = CV_PERR_RATE;
        n->hushed = s->logged; /* a flood is logged once each time it runs the bucket dry */
        s->logged = true;
        return cv_errf(err, errlen, "%s: its address sent over %d HELLOs, %d a second: refused until it sends fewer",
                       cv_link_name(n->head_link), HELLO_BURST, HELLO_PER_S);
    }
    s->tokens -= 1;
    s->logged = false;
    return 0;
}
