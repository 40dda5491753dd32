/* link.c: TCP links of link.h (addresses and listeners are listener.c's).
 *
 * A link owns its socket (non-blocking; every wait is a poll with a
 * deadline), a wake pipe, and one thread, the writer. One mutex guards the
 * shared state; three condition variables (monotonic clock) signal it:
 *   send queue  ring of CV_LINK_SEND_QUEUE entries {ticket, header,
 *               iovecs, bytes sent}; callers push (waiting on sq_space),
 *               the writer takes the head, sends it outside the lock, then
 *               pops it and publishes sent_ticket (sq_done). The entry
 *               keeps pointers only: payload bytes are the caller's. A
 *               caller that finds the queue empty sends its frame itself,
 *               as far as the socket takes it without waiting (the head
 *               entry is marked caller_owns meanwhile, and the writer
 *               leaves it alone), and hands any rest to the writer: a
 *               frame that fits the socket buffer costs no thread switch.
 *   buffer pool up to LINK_POOL free payload buffers, handed back by
 *               cv_link_release and reused for received payloads.
 * Receiving has no thread: cv_link_recv reads the socket itself, as far
 * as its bytes go, into the frame being received (`rx`, the receiving
 * caller's alone), and keeps a partial frame for the next call. So no
 * thread sleeps on the socket while a consumer spins on it, and a sender
 * on this machine or the peer's never pays for waking one (on virtual
 * machines that costs tens of microseconds per frame: an interrupt to a
 * halted core, then a thread switch to hand the frame over); until it is
 * read, a frame waits in the kernel's socket buffer, and TCP pushes back
 * on the peer when that is full.
 * Each side records its first failure as a message and stops; the other
 * side keeps going (a node may still send ERROR after a garbage frame).
 * Messages are built without the link's name and prefixed with it under
 * the mutex when recorded, so cv_link_set_name is safe at any time; every
 * other read of the name also holds the mutex.
 * cv_link_close sets `closing`, broadcasts, and writes a byte to the wake
 * pipe that the writer polls next to the socket, then joins it.
 * A sealed link (seal.h) seals the head entry of the send queue when it is
 * first written, into the link's scratch buffer: only the head entry is
 * ever being written, by the caller that owns it or by the writer (handed
 * over under mu), so one buffer and one counter serve, and frames take
 * their counters in queue order. The receiver reads a sealed frame's tag
 * after its payload and opens the payload in place. */
#include "pipe/link.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"

#define LINK_POOL 8
#define LINK_BUF_ROUND 4096

typedef struct send_entry {
    uint64_t ticket;
    uint16_t type;
    uint32_t id;
    bool encoded; /* hdr is written: whoever sends the frame first computes its checksum */
    uint8_t hdr[CV_FRAME_HEADER_SIZE];
    int n_iov;    /* hdr, then the payload parts */
    struct iovec iov[1 + CV_LINK_MAX_PARTS];
    size_t size; /* header and payload */
    size_t done; /* bytes of it sent */
    bool caller_owns; /* the sending caller is writing it: not the writer's yet */
} send_entry;

typedef struct pool_buf {
    uint8_t *p;
    size_t cap;
} pool_buf;

struct cv_link {
    int fd;
    int wake_r, wake_w;
    char name[CV_LINK_NAME_MAX];
    int read_timeout_ms;
    int send_timeout_ms;
    _Atomic uint32_t max_payload;

    pthread_mutex_t mu;
    pthread_cond_t sq_space, sq_work, sq_done;
    bool closing;

    send_entry sq[CV_LINK_SEND_QUEUE];
    int sq_head, sq_count;
    uint64_t next_ticket, sent_ticket;
    bool writer_done; /* the writer stopped: failed or closing */
    char wfail[CV_LINK_NAME_MAX + 2 + CV_ERRLEN];

    /* The frame being received: its header bytes, then its payload. */
    struct {
        uint8_t raw[CV_FRAME_HEADER_SIZE];
        uint8_t tag[CV_SEAL_TAG_BYTES]; /* a sealed frame's, after its payload */
        size_t got;       /* bytes of header, payload and tag read */
        cv_frame f;       /* header decoded, payload buffer taken, once got >= the header's size */
        int64_t deadline; /* its last byte is due (set by its first byte) */
    } rx;
    char rfail[CV_LINK_NAME_MAX + 2 + CV_ERRLEN]; /* the receiving side failed: why */

    bool sealed;          /* frames are sealed with seal's keys */
    cv_seal_session seal; /* tx: the head entry's writer's; rx: the receiving caller's */
    uint8_t *scratch;     /* the sealed frame being sent: header, ciphertext, tag */
    size_t scratch_cap;

    pool_buf pool[LINK_POOL];
    int n_pool;

    _Atomic uint64_t bytes_sent, bytes_recv, frames_sent, frames_recv;

    pthread_t writer;
};


/* Milliseconds left until deadline (-1 = none), for poll. */
static int left_ms(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - cv_now_ms();
    return left < 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
}

cv_link_opts cv_link_default_opts(void)
{
    cv_link_opts o = {
        .name = NULL,
        .read_timeout_ms = 10000,
        .send_timeout_ms = 10000,
        .max_payload = CV_PROTO_DEFAULT_MAX_PAYLOAD,
    };
    return o;
}

cv_link_opts cv_link_io_opts(int io_timeout_ms)
{
    cv_link_opts o = cv_link_default_opts();
    o.read_timeout_ms = io_timeout_ms;
    o.send_timeout_ms = io_timeout_ms;
    return o;
}

static void set_socket_options(int fd)
{
    int one = 1, idle = 5, intvl = 2, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* ---- buffers ---- */

/* A payload buffer of at least len bytes: the smallest pooled one that
 * fits, else a new one (dropping a pooled one that does not fit). */
static uint8_t *take_buffer(cv_link *l, size_t len, size_t *cap)
{
    uint8_t *stale = NULL;
    uint8_t *p = NULL;
    pthread_mutex_lock(&l->mu);
    int best = -1;
    for (int i = 0; i < l->n_pool; i++)
        if (l->pool[i].cap >= len && (best < 0 || l->pool[i].cap < l->pool[best].cap))
            best = i;
    if (best >= 0) {
        p = l->pool[best].p;
        *cap = l->pool[best].cap;
        l->pool[best] = l->pool[--l->n_pool];
    } else if (l->n_pool > 0) {
        stale = l->pool[--l->n_pool].p;
    }
    pthread_mutex_unlock(&l->mu);
    if (stale)
        cv_free_aligned(stale);
    if (p)
        return p;
    *cap = (len + LINK_BUF_ROUND - 1) / LINK_BUF_ROUND * LINK_BUF_ROUND;
    return cv_aligned_alloc(*cap);
}

/* Gives a buffer back to the pool; the caller holds l->mu. Returns the
 * buffer to free (outside the lock) when the pool is full. */
static uint8_t *pool_put_locked(cv_link *l, uint8_t *p, size_t cap)
{
    if (!p)
        return NULL;
    if (l->n_pool < LINK_POOL) {
        l->pool[l->n_pool++] = (pool_buf){p, cap};
        return NULL;
    }
    return p;
}

void cv_link_release(cv_link *l, cv_frame *f)
{
    pthread_mutex_lock(&l->mu);
    uint8_t *extra = pool_put_locked(l, f->payload, f->buf_cap);
    pthread_mutex_unlock(&l->mu);
    if (extra)
        cv_free_aligned(extra);
    f->payload = NULL;
    f->buf_cap = 0;
}

/* ---- writer ---- */

/* Waits for the socket to take bytes (0), the link closing (1), or no
 * room for send_timeout_ms (-1, message in msg). */
static int wait_writable(cv_link *l, char *msg, size_t msglen)
{
    struct pollfd p[2] = {{.fd = l->fd, .events = POLLOUT}, {.fd = l->wake_r, .events = POLLIN}};
    for (;;) {
        int rc = poll(p, 2, l->send_timeout_ms);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0)
            return cv_errf(msg, msglen, "poll failed while sending: %s", strerror(errno));
        if (rc == 0)
            return cv_errf(msg, msglen, "send stalled: the peer took no data for %d ms", l->send_timeout_ms);
        if (p[1].revents)
            return 1;
        return 0;
    }
}

/* Makes the scratch buffer hold a sealed frame of `need` bytes. */
static int grow_scratch(cv_link *l, size_t need)
{
    if (need <= l->scratch_cap)
        return 0;
    cv_free_aligned(l->scratch);
    l->scratch_cap = (need + LINK_BUF_ROUND - 1) / LINK_BUF_ROUND * LINK_BUF_ROUND;
    if (!(l->scratch = cv_aligned_alloc(l->scratch_cap))) {
        l->scratch_cap = 0;
        return -1;
    }
    return 0;
}

int cv_link_reserve(cv_link *l, size_t payload, char *err, size_t errlen)
{
    if (!l->sealed)
        return 0;
    pthread_mutex_lock(&l->mu);
    const int rc = grow_scratch(l, CV_FRAME_HEADER_SIZE + payload + CV_SEAL_TAG_BYTES);
    pthread_mutex_unlock(&l->mu);
    return rc ? cv_errf(err, errlen, "%s: out of memory to seal frames of %zu bytes", l->name, payload) : 0;
}

/* Copies a frame (its header encoded) into the scratch buffer and seals
 * it there, header, ciphertext and tag becoming the entry's only part. */
static int seal_entry(cv_link *l, send_entry *e, char *msg, size_t msglen)
{
    const size_t need = e->size + CV_SEAL_TAG_BYTES;
    if (grow_scratch(l, need))
        return cv_errf(msg, msglen, "out of memory to seal a %zu-byte %s frame", need, cv_msg_type_name(e->type));
    size_t at = 0;
    for (int i = 0; i < e->n_iov; i++) {
        memcpy(l->scratch + at, e->iov[i].iov_base, e->iov[i].iov_len);
        at += e->iov[i].iov_len;
    }
    if (cv_seal_frame(&l->seal.tx, e->hdr, l->scratch + CV_FRAME_HEADER_SIZE, e->size - CV_FRAME_HEADER_SIZE,
                      l->scratch + e->size, msg, msglen))
        return -1;
    e->iov[0] = (struct iovec){l->scratch, need};
    e->n_iov = 1;
    e->size = need;
    return 0;
}

/* Writes the entry's header, with the payload's checksum on a plaintext
 * link; a sealed link's tag covers the payload instead (checksum 0) and
 * the frame is sealed. A failure leaves the entry as it was. */
static int encode_entry(cv_link *l, send_entry *e, char *msg, size_t msglen)
{
    uint32_t crc = 0;
    for (int i = 1; i < e->n_iov && !l->sealed; i++)
        crc = cv_crc32c(crc, e->iov[i].iov_base, e->iov[i].iov_len);
    const cv_frame_header h = {.magic = CV_FRAME_MAGIC, .version = CV_FRAME_VERSION, .type = e->type, .id = e->id,
                               .payload_len = (uint32_t)(e->size - CV_FRAME_HEADER_SIZE), .checksum = crc};
    cv_frame_header_encode(&h, e->hdr);
    if (l->sealed && seal_entry(l, e, msg, msglen))
        return -1;
    e->encoded = true;
    return 0;
}

/* Sends the rest of a frame (from e->done) in gather writes, waiting for
 * room when may_wait. 0 (sent), 1 (closing), 2 (the socket is full and
 * may_wait is false) or -1 with a message. */
static int write_frame(cv_link *l, send_entry *e, bool may_wait, char *msg, size_t msglen)
{
    if (!e->encoded && encode_entry(l, e, msg, msglen))
        return -1;
    while (e->done < e->size) {
        struct iovec iov[1 + CV_LINK_MAX_PARTS];
        int n_iov = 0;
        size_t skip = e->done;
        for (int i = 0; i < e->n_iov; i++) {
            if (skip >= e->iov[i].iov_len) {
                skip -= e->iov[i].iov_len;
                continue;
            }
            iov[n_iov++] = (struct iovec){(uint8_t *)e->iov[i].iov_base + skip, e->iov[i].iov_len - skip};
            skip = 0;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!may_wait)
                    return 2;
                int rc = wait_writable(l, msg, msglen);
                if (rc)
                    return rc;
                continue;
            }
            return cv_errf(msg, msglen, "sending %s frame failed: %s", cv_msg_type_name(e->type),
                           errno == EPIPE || errno == ECONNRESET ? "connection closed by peer" : strerror(errno));
        }
        atomic_fetch_add(&l->bytes_sent, (uint64_t)n);
        e->done += (size_t)n;
    }
    atomic_fetch_add(&l->frames_sent, 1);
    return 0;
}

/* Pops the oldest sent entry and tells the waiting callers; holds mu. */
static void pop_sent_locked(cv_link *l)
{
    l->sent_ticket = l->sq[l->sq_head].ticket;
    l->sq_head = (l->sq_head + 1) % CV_LINK_SEND_QUEUE;
    l->sq_count--;
    pthread_cond_broadcast(&l->sq_done);
    pthread_cond_signal(&l->sq_space);
}

static void *writer_main(void *arg)
{
    cv_link *l = arg;
    char msg[CV_ERRLEN];
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while ((l->sq_count == 0 || l->sq[l->sq_head].caller_owns) && !l->closing)
            pthread_cond_wait(&l->sq_work, &l->mu);
        if (l->closing)
            break;
        send_entry *e = &l->sq[l->sq_head]; /* stays in place until popped */
        pthread_mutex_unlock(&l->mu);
        int rc = write_frame(l, e, true, msg, sizeof msg);
        pthread_mutex_lock(&l->mu);
        if (rc != 0) {
            if (rc < 0)
                snprintf(l->wfail, sizeof l->wfail, "%s: %s", l->name, msg);
            break;
        }
        pop_sent_locked(l);
    }
    /* Nothing queued is referenced any more. */
    l->sq_count = 0;
    l->writer_done = true;
    if (!l->wfail[0])
        snprintf(l->wfail, sizeof l->wfail, "%s: link closed", l->name);
    pthread_cond_broadcast(&l->sq_done);
    pthread_cond_broadcast(&l->sq_space);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int cv_link_sendv(cv_link *l, uint16_t type, uint32_t id, const struct iovec *parts, int n_parts, uint64_t *ticket,
                  char *err, size_t errlen)
{
    char why[96] = "";
    uint64_t total = 0;
    for (int i = 0; i < n_parts && i < CV_LINK_MAX_PARTS; i++)
        total += parts[i].iov_len;
    if (n_parts < 0 || n_parts > CV_LINK_MAX_PARTS)
        snprintf(why, sizeof why, "%d payload parts (at most %d)", n_parts, CV_LINK_MAX_PARTS);
    else if (total > UINT32_MAX)
        snprintf(why, sizeof why, "%s payload of %" PRIu64 " bytes does not fit a frame", cv_msg_type_name(type),
                 total);
    else if (type == 0 || type >= CV_MSG_COUNT)
        snprintf(why, sizeof why, "cannot send message type %u", type);
    pthread_mutex_lock(&l->mu);
    if (why[0]) {
        cv_errf(err, errlen, "%s: %s", l->name, why);
        pthread_mutex_unlock(&l->mu);
        return -1;
    }
    while (l->sq_count == CV_LINK_SEND_QUEUE && !l->writer_done)
        pthread_cond_wait(&l->sq_space, &l->mu);
    if (l->writer_done) {
        cv_errf(err, errlen, "%s", l->wfail);
        pthread_mutex_unlock(&l->mu);
        return -1;
    }
    send_entry *e = &l->sq[(l->sq_head + l->sq_count) % CV_LINK_SEND_QUEUE];
    e->ticket = ++l->next_ticket;
    e->type = type;
    e->id = id;
    e->encoded = false;
    e->iov[0] = (struct iovec){e->hdr, sizeof e->hdr};
    for (int i = 0; i < n_parts; i++)
        e->iov[1 + i] = parts[i];
    e->n_iov = 1 + n_parts;
    e->size = CV_FRAME_HEADER_SIZE + (size_t)total;
    e->done = 0;
    e->caller_owns = ++l->sq_count == 1; /* the writer is idle: send it here */
    if (ticket)
        *ticket = e->ticket;
    if (!e->caller_owns) {
        pthread_cond_signal(&l->sq_work);
        pthread_mutex_unlock(&l->mu);
        return 0;
    }
    pthread_mutex_unlock(&l->mu);
    char msg[CV_ERRLEN];
    const int rc = write_frame(l, e, false, msg, sizeof msg); /* a failure is the writer's to meet and report */
    pthread_mutex_lock(&l->mu);
    e->caller_owns = false;
    if (rc == 0)
        pop_sent_locked(l);
    if (l->sq_count > 0)
        pthread_cond_signal(&l->sq_work);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

int cv_link_wait_sent(cv_link *l, uint64_t ticket, char *err, size_t errlen)
{
    pthread_mutex_lock(&l->mu);
    while (l->sent_ticket < ticket && !l->writer_done)
        pthread_cond_wait(&l->sq_done, &l->mu);
    int rc = 0;
    if (l->sent_ticket < ticket)
        rc = cv_errf(err, errlen, "%s", l->wfail);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int cv_link_send(cv_link *l, uint16_t type, uint32_t id, const void *payload, size_t len, char *err, size_t errlen)
{
    struct iovec part = {(void *)payload, len};
    uint64_t ticket;
    if (cv_link_sendv(l, type, id, &part, len ? 1 : 0, &ticket, err, errlen))
        return -1;
    return cv_link_wait_sent(l, ticket, err, errlen);
}

/* ---- receiving ---- */

enum { RX_HEADER, RX_PAYLOAD, RX_TAG };

/* The part of the frame being received that is still coming (its header,
 * its payload, then a sealed frame's tag): *got of its *want bytes have
 * arrived. Returns which part. */
static int rx_part(const cv_link *l, size_t *got, size_t *want)
{
    if (l->rx.got < CV_FRAME_HEADER_SIZE) {
        *got = l->rx.got;
        *want = CV_FRAME_HEADER_SIZE;
        return RX_HEADER;
    }
    const size_t len = l->rx.f.h.payload_len;
    *got = l->rx.got - CV_FRAME_HEADER_SIZE;
    *want = len;
    if (*got < len || !l->sealed)
        return RX_PAYLOAD;
    *got -= len;
    *want = CV_SEAL_TAG_BYTES;
    return RX_TAG;
}

/* Writes "<event> while reading <part> (got G of W bytes)" into msg. */
static int rx_errf(const cv_link *l, const char *event, char *msg, size_t msglen)
{
    size_t got, want;
    const int part = rx_part(l, &got, &want);
    return cv_errf(msg, msglen, "%s while reading %s%s (got %zu of %zu bytes)", event,
                   part == RX_HEADER ? "frame header" : cv_msg_type_name(l->rx.f.h.type),
                   part == RX_HEADER ? "" : part == RX_PAYLOAD ? " payload" : " tag", got, want);
}

/* Decodes the header just read and takes a buffer for its payload. */
static int rx_begin_payload(cv_link *l, char *msg, size_t msglen)
{
    char why[CV_ERRLEN];
    cv_frame *f = &l->rx.f;
    if (cv_frame_header_decode(l->rx.raw, atomic_load(&l->max_payload), &f->h, why, sizeof why))
        return cv_errf(msg, msglen, "%s", why);
    if (f->h.payload_len) {
        f->payload = take_buffer(l, f->h.payload_len, &f->buf_cap);
        if (!f->payload)
            return cv_errf(msg, msglen, "out of memory for a %" PRIu32 "-byte %s payload", f->h.payload_len,
                           cv_msg_type_name(f->h.type));
    } else if (f->h.checksum != 0) {
        return cv_errf(msg, msglen, "empty %s frame with checksum 0x%08" PRIx32 " (must be 0)",
                       cv_msg_type_name(f->h.type), f->h.checksum);
    }
    return 0;
}

/* A complete frame: its checksum, or a sealed frame's tag (the payload is
 * then decrypted in place). */
static int rx_finish(cv_link *l, char *msg, size_t msglen)
{
    char why[CV_ERRLEN];
    const cv_frame *f = &l->rx.f;
    if (l->sealed ? cv_seal_open(&l->seal.rx, l->rx.raw, f->payload, f->h.payload_len, l->rx.tag, why, sizeof why)
                  : f->h.payload_len && cv_frame_check_payload(&f->h, f->payload, why, sizeof why))
        return cv_errf(msg, msglen, "%s", why);
    atomic_fetch_add(&l->frames_recv, 1);
    return 0;
}

/* Reads what the socket holds of the frame being received, up to its end:
 * 0 (the frame is complete in l->rx), 2 (the socket has no more of it yet)
 * or -1 with a message (end of stream, socket error, bad header, checksum
 * or tag, no memory). */
static int rx_advance(cv_link *l, char *msg, size_t msglen)
{
    size_t got, want;
    for (;;) {
        const int part = rx_part(l, &got, &want);
        if (part != RX_HEADER && got == want && (part == RX_TAG || !l->sealed))
            return rx_finish(l, msg, msglen);
        uint8_t *dst = part == RX_HEADER ? l->rx.raw + got : part == RX_TAG ? l->rx.tag + got : l->rx.f.payload + got;
        const ssize_t r = recv(l->fd, dst, want - got, MSG_DONTWAIT);
        if (r == 0) {
            if (l->rx.got == 0)
                return cv_errf(msg, msglen, "connection closed by peer");
            return rx_errf(l, "connection closed", msg, msglen);
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 2;
            return rx_errf(l, errno == ECONNRESET ? "connection reset by peer" : strerror(errno), msg, msglen);
        }
        if (l->rx.got == 0)
            l->rx.deadline = cv_now_ms() + l->read_timeout_ms;
        l->rx.got += (size_t)r;
        atomic_fetch_add(&l->bytes_recv, (uint64_t)r);
        if (l->rx.got == CV_FRAME_HEADER_SIZE && rx_begin_payload(l, msg, msglen))
            return -1;
    }
}

int cv_link_poll_fd(const cv_link *l) { return l->fd; }

int cv_link_recv(cv_link *l, int timeout_ms, cv_frame *f, char *err, size_t errlen)
{
    const int64_t deadline = timeout_ms < 0 ? -1 : cv_now_ms() + timeout_ms;
    char msg[CV_ERRLEN];
    while (!l->rfail[0]) {
        const int rc = rx_advance(l, msg, sizeof msg);
        if (rc == 0) {
            *f = l->rx.f;
            memset(&l->rx, 0, sizeof l->rx);
            return 0;
        }
        if (rc == 2) { /* wait for more: until the caller's deadline, or a begun frame's if sooner */
            const bool begun = l->rx.got > 0;
            const int64_t until = begun && (deadline < 0 || l->rx.deadline < deadline) ? l->rx.deadline : deadline;
            const int64_t now = cv_now_ms();
            if (until >= 0 && now >= until) {
                if (!begun || now < l->rx.deadline) {
                    pthread_mutex_lock(&l->mu);
                    cv_errf(err, errlen, "%s: no frame within %d ms", l->name, timeout_ms);
                    pthread_mutex_unlock(&l->mu);
                    return CV_LINK_TIMEOUT;
                }
                char event[48];
                snprintf(event, sizeof event, "timed out after %d ms", l->read_timeout_ms);
                rx_errf(l, event, msg, sizeof msg);
            } else {
                struct pollfd p = {.fd = l->fd, .events = POLLIN};
                if (poll(&p, 1, until < 0 ? -1 : (int)(until - now)) >= 0 || errno == EINTR)
                    continue;
                cv_errf(msg, sizeof msg, "poll failed while receiving: %s", strerror(errno));
            }
        }
        pthread_mutex_lock(&l->mu);
        snprintf(l->rfail, sizeof l->rfail, "%s: %s", l->name, msg);
        pthread_mutex_unlock(&l->mu);
    }
    return cv_errf(err, errlen, "%s", l->rfail);
}

/* ---- setup and teardown ---- */

static int link_start(int fd, const char *default_name, const cv_link_opts *opts, const cv_seal_session *session,
                      cv_link **out, char *err, size_t errlen)
{
    cv_link_opts o = opts ? *opts : cv_link_default_opts();
    cv_link *l = cv_calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return cv_errf(err, errlen, "%s: out of memory", default_name);
    }
    l->fd = fd;
    snprintf(l->name, sizeof l->name, "%s", o.name ? o.name : default_name);
    l->read_timeout_ms = o.read_timeout_ms > 0 ? o.read_timeout_ms : 10000;
    l->send_timeout_ms = o.send_timeout_ms > 0 ? o.send_timeout_ms : 10000;
    atomic_init(&l->max_payload, o.max_payload ? o.max_payload : CV_PROTO_DEFAULT_MAX_PAYLOAD);
    if (session) {
        l->sealed = true;
        l->seal = *session;
    }
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        cv_free(l);
        return cv_errf(err, errlen, "%s: pipe: %s", default_name, strerror(e));
    }
    l->wake_r = pipefd[0];
    l->wake_w = pipefd[1];
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->sq_space, &ca);
    pthread_cond_init(&l->sq_work, &ca);
    pthread_cond_init(&l->sq_done, &ca);
    pthread_condattr_destroy(&ca);
    set_socket_options(fd);

    const int rc = pthread_create(&l->writer, NULL, writer_main, l);
    if (rc != 0) {
        close(l->wake_r);
        close(l->wake_w);
        close(fd);
        cv_free(l);
        return cv_errf(err, errlen, "%s: cannot start the link's writer thread: %s", default_name, strerror(rc));
    }
    *out = l;
    return 0;
}

void cv_link_close(cv_link *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->closing = true;
    pthread_cond_broadcast(&l->sq_work);
    pthread_cond_broadcast(&l->sq_space);
    pthread_mutex_unlock(&l->mu);
    ssize_t w;
    do
        w = write(l->wake_w, "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(l->writer, NULL);
    cv_free_aligned(l->rx.f.payload);
    cv_free_aligned(l->scratch);
    for (int i = 0; i < l->n_pool; i++)
        cv_free_aligned(l->pool[i].p);
    close(l->fd);
    close(l->wake_r);
    close(l->wake_w);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->sq_space);
    pthread_cond_destroy(&l->sq_work);
    pthread_cond_destroy(&l->sq_done);
    cv_seal_session_wipe(&l->seal); /* keys outlive no link */
    cv_free(l);
}

const char *cv_link_name(const cv_link *l) { return l->name; }

void cv_link_set_name(cv_link *l, const char *name)
{
    pthread_mutex_lock(&l->mu);
    snprintf(l->name, sizeof l->name, "%s", name);
    pthread_mutex_unlock(&l->mu);
}

void cv_link_set_max_payload(cv_link *l, uint32_t max_payload) { atomic_store(&l->max_payload, max_payload); }

void cv_link_get_stats(cv_link *l, cv_link_stats *s)
{
    s->bytes_sent = atomic_load(&l->bytes_sent);
    s->bytes_recv = atomic_load(&l->bytes_recv);
    s->frames_sent = atomic_load(&l->frames_sent);
    s->frames_recv = atomic_load(&l->frames_recv);
}

/* A lost SYN costs TCP a 1 s wait before it sends another, which on a
 * lossy link would make many connects slow and some fail their deadline:
 * when an attempt has not completed after CONNECT_RACE_MS, another starts
 * beside it (up to CONNECT_RACE_MAX), and the first to complete wins. */
enum { CONNECT_RACE_MS = 400, CONNECT_RACE_MAX = 3 };

/* Starts a non-blocking connect: the socket (connected or in progress), or
 * -1 with errno set. */
static int start_connect(const struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS)
        return fd;
    const int e = errno;
    close(fd);
    errno = e;
    return -1;
}

/* Whether attempt fd is done: 1 connected, 0 still going, -1 failed
 * (errno set). */
static int connect_done(int fd, short revents)
{
    if (!revents)
        return 0;
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
        return 1;
    errno = soerr ? soerr : EIO;
    return -1;
}

/* Connects to one address within the deadline, racing attempts (above):
 * the socket, or -1 with errno set (ETIMEDOUT when the deadline passed). */
static int connect_one(const struct addrinfo *ai, int64_t deadline)
{
    struct pollfd p[CONNECT_RACE_MAX];
    int n = 0, fd = -1, e = ETIMEDOUT;
    for (int64_t next = cv_now_ms(); fd < 0 && e == ETIMEDOUT;) {
        if (n < CONNECT_RACE_MAX && cv_now_ms() >= next) {
            const int c = start_connect(ai);
            if (c < 0) {
                e = errno;
                break;
            }
            p[n++] = (struct pollfd){.fd = c, .events = POLLOUT};
            next = cv_now_ms() + CONNECT_RACE_MS;
        }
        int wait = left_ms(deadline);
        if (n < CONNECT_RACE_MAX && (wait < 0 || wait > left_ms(next)))
            wait = left_ms(next);
        const int rc = poll(p, (nfds_t)n, wait);
        if (rc < 0 && errno != EINTR)
            e = errno;
        else if (rc == 0 && left_ms(deadline) == 0)
            break;
        for (int i = 0; rc > 0 && i < n && fd < 0 && e == ETIMEDOUT; i++) {
            const int done = connect_done(p[i].fd, p[i].revents);
            fd = done > 0 ? p[i].fd : -1;
            e = done < 0 ? errno : e;
        }
    }
    for (int i = 0; i < n; i++)
        if (p[i].fd != fd)
            close(p[i].fd);
    errno = e;
    return fd;
}

/* Sends (to_send) or receives n bytes by the deadline on a non-blocking
 * socket: 0, or -1 with a message. */
static int io_exact(int fd, bool to_send, uint8_t *buf, size_t n, int64_t deadline, char *msg, size_t msglen)
{
    for (size_t done = 0; done < n;) {
        const ssize_t r = to_send ? send(fd, buf + done, n - done, MSG_NOSIGNAL) : recv(fd, buf + done, n - done, 0);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r == 0)
            return cv_errf(msg, msglen, "connection closed by the node");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return cv_errf(msg, msglen, "%s", errno == ECONNRESET || errno == EPIPE ? "connection reset by the node"
                                                                                   : strerror(errno));
        struct pollfd p = {.fd = fd, .events = to_send ? POLLOUT : POLLIN};
        const int rc = poll(&p, 1, left_ms(deadline));
        if (rc == 0)
            return cv_errf(msg, msglen, "no answer");
        if (rc < 0 && errno != EINTR)
            return cv_errf(msg, msglen, "poll: %s", strerror(errno));
    }
    return 0;
}

/* The client's key handshake (seal.h section 2) by the deadline. */
static int client_handshake(int fd, const cv_seal_key *key, int64_t deadline, cv_seal_session *session, char *msg,
                            size_t msglen)
{
    cv_seal_hs hs;
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    char why[CV_ERRLEN];
    int rc = cv_seal_client_hello(&hs, hello, msg, msglen);
    if (rc == 0 && (io_exact(fd, true, hello, sizeof hello, deadline, why, sizeof why) ||
                    io_exact(fd, false, reply, sizeof reply, deadline, why, sizeof why)))
        rc = cv_errf(msg, msglen, "key handshake: %s (does the node run with the same --key?)", why);
    if (rc == 0 && (rc = cv_seal_client_finish(&hs, key, reply, proof, msg, msglen)) == 0 &&
        io_exact(fd, true, proof, sizeof proof, deadline, why, sizeof why))
        rc = cv_errf(msg, msglen, "key handshake: %s", why);
    if (rc == 0)
        *session = hs.session;
    cv_seal_hs_wipe(&hs);
    return rc;
}

int cv_link_connect(const char *host, int port, int timeout_ms, const cv_link_opts *opts, cv_link **out, char *err,
                    size_t errlen)
{
    char name[CV_LINK_NAME_MAX];
    snprintf(name, sizeof name, strchr(host, ':') ? "node [%s]:%d" : "node %s:%d", host, port);
    const char *label = opts && opts->name ? opts->name : name;
    if (port <= 0 || port > 65535)
        return cv_errf(err, errlen, "%s: port %d is not in 1..65535", label, port);
    int64_t deadline = timeout_ms < 0 ? -1 : cv_now_ms() + timeout_ms;
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, serv, &hints, &res);
    if (gai != 0)
        return cv_errf(err, errlen, "%s: cannot resolve host: %s", label, gai_strerror(gai));
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = connect_one(ai, deadline);
        if (fd < 0)
            last_errno = errno;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (last_errno == ETIMEDOUT)
            return cv_errf(err, errlen, "%s: connect timed out after %d ms", label, timeout_ms);
        return cv_errf(err, errlen, "%s: connect failed: %s", label, strerror(last_errno));
    }
    if (!opts || !opts->key)
        return link_start(fd, name, opts, NULL, out, err, errlen);
    set_socket_options(fd); /* no Nagle delay between the handshake's last bytes and the first frame */
    cv_seal_session session;
    char msg[CV_ERRLEN];
    if (client_handshake(fd, opts->key, deadline, &session, msg, sizeof msg)) {
        close(fd);
        return cv_errf(err, errlen, "%s: %s", label, msg);
    }
    const int rc = link_start(fd, name, opts, &session, out, err, errlen);
    cv_seal_session_wipe(&session);
    return rc;
}

int cv_link_adopt(int fd, const char *peer, const cv_link_opts *opts, const cv_seal_session *session, cv_link **out,
                  char *err, size_t errlen)
{
    char name[CV_LINK_NAME_MAX];
    snprintf(name, sizeof name, "peer %s", peer);
    return link_start(fd, name, opts, session, out, err, errlen);
}

int cv_listener_accept(cv_listener *l, int timeout_ms, const cv_link_opts *opts, cv_link **out, char *err,
                       size_t errlen)
{
    if (opts && opts->key)
        return cv_errf(err, errlen, "listener %s: keyed links are accepted through a gate", cv_listener_addr(l));
    int64_t deadline = timeout_ms < 0 ? -1 : cv_now_ms() + timeout_ms;
    struct pollfd p = {.fd = cv_listener_fd(l), .events = POLLIN};
    for (;;) {
        int fd;
        char addr[CV_LINK_NAME_MAX - 8];
        const int taken = cv_listener_take(l, &fd, addr, sizeof addr, err, errlen);
        if (taken == 0)
            return cv_link_adopt(fd, addr, opts, NULL, out, err, errlen);
        if (taken < 0)
            return -1;
        int rc = poll(&p, 1, left_ms(deadline));
        if (rc < 0 && errno != EINTR)
            return cv_errf(err, errlen, "listener %s: poll failed: %s", cv_listener_addr(l), strerror(errno));
        if (rc == 0) {
            cv_errf(err, errlen, "listener %s: no connection within %d ms", cv_listener_addr(l), timeout_ms);
            return CV_LINK_TIMEOUT;
        }
    }
}
