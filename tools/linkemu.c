/* linkemu.c: a TCP relay that delays traffic like a long link.
 *
 *   linkemu --listen HOST:PORT --to HOST:PORT --delay-ms D [--jitter-ms J] [--seed S]
 *
 * Every connection accepted on --listen gets its own connection to --to,
 * and bytes are relayed both ways. Each chunk read from one side is
 * queued with a release time of arrival + D + a uniform draw in [0, J]
 * milliseconds (seeded xorshift, so runs repeat), raised if needed to the
 * previous chunk's release time so bytes in one direction never reorder,
 * and written to the other side when that time comes. All queued chunks
 * of all connections wait in their per-direction FIFOs at once (a timer
 * queue: the loop sleeps in ppoll until the earliest release), so several
 * chunks are in flight as on a real long link, rather than one sleep per
 * chunk. A direction stops reading while it holds MAX_QUEUED bytes. End of
 * stream is passed on (shutdown of the write side) after the queued bytes;
 * an error on either socket closes both. TCP_NODELAY on every socket.
 * Single-threaded; the process owns everything it allocates. It prints
 * "linkemu: listening on ADDR:PORT" on stderr once it accepts connections,
 * which scripts wait for. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "pipe/link.h"

#define MAX_CONNS 256
#define READ_CHUNK (256 * 1024)
#define MAX_QUEUED (16u << 20)

typedef struct chunk {
    struct chunk *next;
    int64_t release_ns;
    size_t len, off;
    uint8_t data[];
} chunk;

/* One direction of a connection: bytes read from src, written to dst. */
typedef struct direction {
    int src, dst;
    chunk *head, *tail;
    size_t queued;
    int64_t last_release_ns;
    bool src_eof;  /* src sent end of stream */
    bool shut;     /* end of stream passed on to dst */
    bool blocked;  /* dst refused bytes: wait for POLLOUT */
} direction;

typedef struct conn {
    int client, server;
    bool connecting; /* server connect still in progress */
    direction up, down; /* client -> server, server -> client */
} conn;

static conn *conns[MAX_CONNS];
static int64_t delay_ns, jitter_ns;
static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void usage(void)
{
    fprintf(stderr, "usage: linkemu --listen HOST:PORT --to HOST:PORT --delay-ms D [--jitter-ms J] [--seed S]\n");
    exit(2);
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static struct addrinfo *resolve(const char *addr, bool passive)
{
    char host[256], err[CV_ERRLEN];
    int port;
    if (cv_parse_addr(addr, host, sizeof host, &port, err, sizeof err)) {
        fprintf(stderr, "linkemu: %s\n", err);
        exit(2);
    }
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, serv, &hints, &res);
    if (gai) {
        fprintf(stderr, "linkemu: %s: %s\n", addr, gai_strerror(gai));
        exit(2);
    }
    return res;
}

static void free_chunks(direction *d)
{
    while (d->head) {
        chunk *c = d->head;
        d->head = c->next;
        cv_free(c);
    }
    d->tail = NULL;
    d->queued = 0;
}

static void close_conn(int i)
{
    conn *c = conns[i];
    close(c->client);
    close(c->server);
    free_chunks(&c->up);
    free_chunks(&c->down);
    cv_free(c);
    conns[i] = NULL;
}

static void accept_one(int lfd, const struct addrinfo *to)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    int slot = -1;
    for (int i = 0; i < MAX_CONNS && slot < 0; i++)
        if (!conns[i])
            slot = i;
    int sfd = slot < 0 ? -1 : socket(to->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (sfd < 0 || (connect(sfd, to->ai_addr, to->ai_addrlen) != 0 && errno != EINPROGRESS)) {
        fprintf(stderr, "linkemu: cannot relay a connection: %s\n", slot < 0 ? "too many" : strerror(errno));
        if (sfd >= 0)
            close(sfd);
        close(fd);
        return;
    }
    set_nodelay(fd);
    set_nodelay(sfd);
    conn *c = cv_calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        close(sfd);
        return;
    }
    c->client = fd;
    c->server = sfd;
    c->connecting = true;
    c->up = (direction){.src = fd, .dst = sfd};
    c->down = (direction){.src = sfd, .dst = fd};
    conns[slot] = c;
}

/* Reads what src has into a new chunk. Returns -1 on a socket error. */
static int pump_in(direction *d, int64_t now)
{
    static uint8_t buf[READ_CHUNK];
    ssize_t n = recv(d->src, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
        d->src_eof = true;
        return 0;
    }
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    chunk *c = cv_malloc(sizeof *c + (size_t)n);
    if (!c)
        return -1;
    memcpy(c->data, buf, (size_t)n);
    c->len = (size_t)n;
    c->off = 0;
    c->next = NULL;
    int64_t jitter = jitter_ns ? (int64_t)(rng_next() % (uint64_t)(jitter_ns + 1)) : 0;
    c->release_ns = now + delay_ns + jitter;
    if (c->release_ns < d->last_release_ns)
        c->release_ns = d->last_release_ns;
    d->last_release_ns = c->release_ns;
    if (d->tail)
        d->tail->next = c;
    else
        d->head = c;
    d->tail = c;
    d->queued += (size_t)n;
    return 0;
}

/* Writes every chunk due by now. Returns -1 on a socket error. */
static int pump_out(direction *d, int64_t now)
{
    d->blocked = false;
    while (d->head && d->head->release_ns <= now) {
        chunk *c = d->head;
        ssize_t n = send(d->dst, c->data + c->off, c->len - c->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                d->blocked = true;
                return 0;
            }
            if (errno == EINTR)
                continue;
            return -1;
        }
        c->off += (size_t)n;
        d->queued -= (size_t)n;
        if (c->off < c->len)
            continue;
        d->head = c->next;
        if (!d->head)
            d->tail = NULL;
        cv_free(c);
    }
    if (!d->head && d->src_eof && !d->shut) {
        shutdown(d->dst, SHUT_WR);
        d->shut = true;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *listen_addr = NULL, *to_addr = NULL;
    long delay_ms = -1, jitter_ms = 0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc)
            usage();
        const char *v = argv[i + 1];
        char *end;
        if (!strcmp(argv[i], "--listen"))
            listen_addr = v;
        else if (!strcmp(argv[i], "--to"))
            to_addr = v;
        else if (!strcmp(argv[i], "--delay-ms") && (delay_ms = strtol(v, &end, 10)) >= 0 && !*end)
            ;
        else if (!strcmp(argv[i], "--jitter-ms") && (jitter_ms = strtol(v, &end, 10)) >= 0 && !*end)
            ;
        else if (!strcmp(argv[i], "--seed") && ((seed = strtoull(v, &end, 10)), !*end))
            ;
        else
            usage();
    }
    if (!listen_addr || !to_addr || delay_ms < 0)
        usage();
    delay_ns = (int64_t)delay_ms * 1000000;
    jitter_ns = (int64_t)jitter_ms * 1000000;
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    signal(SIGPIPE, SIG_IGN);

    struct addrinfo *to = resolve(to_addr, false);
    struct addrinfo *la = resolve(listen_addr, true);
    int lfd = socket(la->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(lfd, la->ai_addr, la->ai_addrlen) || listen(lfd, 64)) {
        fprintf(stderr, "linkemu: listen %s: %s\n", listen_addr, strerror(errno));
        return 1;
    }
    freeaddrinfo(la);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(lfd, (struct sockaddr *)&ss, &sl);
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
    fprintf(stderr, "linkemu: listening on %s:%s, relaying to %s with %ld ms delay, %ld ms jitter\n", host, serv,
            to_addr, delay_ms, jitter_ms);

    struct pollfd pfd[1 + 2 * MAX_CONNS];
    int owner[1 + 2 * MAX_CONNS];
    for (;;) {
        int64_t now = (int64_t)cv_now_ns();
        int64_t next = -1;
        int n = 0;
        pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
        owner[n++] = -1;
        for (int i = 0; i < MAX_CONNS; i++) {
            conn *c = conns[i];
            if (!c)
                continue;
            direction *dirs[2] = {&c->up, &c->down};
            short ev[2] = {0, 0}; /* on client, on server */
            for (int k = 0; k < 2; k++) {
                direction *d = dirs[k];
                int src_side = k == 0 ? 0 : 1;
                if (!d->src_eof && d->queued < MAX_QUEUED && !(k == 1 && c->connecting))
                    ev[src_side] |= POLLIN;
                if (d->head && (d->blocked || (k == 0 && c->connecting)))
                    ev[1 - src_side] |= POLLOUT;
                else if (d->head && (next < 0 || d->head->release_ns < next))
                    next = d->head->release_ns;
            }
            if (c->connecting)
                ev[1] |= POLLOUT;
            pfd[n] = (struct pollfd){.fd = c->client, .events = ev[0]};
            owner[n++] = i;
            pfd[n] = (struct pollfd){.fd = c->server, .events = ev[1]};
            owner[n++] = i;
        }
        struct timespec ts, *tsp = NULL;
        if (next >= 0) {
            int64_t wait = next > now ? next - now : 0;
            ts.tv_sec = wait / 1000000000;
            ts.tv_nsec = wait % 1000000000;
            tsp = &ts;
        }
        if (ppoll(pfd, (nfds_t)n, tsp, NULL) < 0 && errno != EINTR) {
            fprintf(stderr, "linkemu: poll: %s\n", strerror(errno));
            return 1;
        }
        now = (int64_t)cv_now_ns();
        if (pfd[0].revents & POLLIN)
            accept_one(lfd, to);
        for (int j = 1; j < n; j += 2) {
            int i = owner[j];
            conn *c = conns[i];
            if (c->connecting && pfd[j + 1].revents) {
                int soerr = 0;
                socklen_t len = sizeof soerr;
                getsockopt(c->server, SOL_SOCKET, SO_ERROR, &soerr, &len);
                if (soerr) {
                    fprintf(stderr, "linkemu: connect %s: %s\n", to_addr, strerror(soerr));
                    close_conn(i);
                    continue;
                }
                c->connecting = false;
            }
            int bad = 0;
            if (pfd[j].revents & (POLLIN | POLLHUP | POLLERR))
                bad |= pump_in(&c->up, now);
            if (!c->connecting && (pfd[j + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                bad |= pump_in(&c->down, now);
            if (!c->connecting)
                bad |= pump_out(&c->up, now);
            bad |= pump_out(&c->down, now);
            if (bad || (c->up.shut && c->down.shut))
                close_conn(i);
        }
    }
}
