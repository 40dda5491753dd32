/* listener.c: the addresses links are made from and the listening side
 * of link.h: "host:port" parsed, which addresses are this machine's
 * loopback (a plaintext link stays on it), and the listener whose
 * connections a gate (gate.h) or cv_listener_accept turn into links. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/err.h"
#include "pipe/link.h"

struct cv_listener {
    int fd;
    int port;
    char addr[CV_LINK_NAME_MAX];
};

int cv_parse_addr(const char *addr, char *host, size_t host_len, int *port, char *err, size_t errlen)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return cv_errf(err, errlen, "address '%s' is not host:port", addr);
    const char *h = addr;
    size_t n = (size_t)(colon - addr);
    if (h[0] == '[') {
        if (n < 2 || h[n - 1] != ']')
            return cv_errf(err, errlen, "address '%s': unbalanced brackets", addr);
        h++;
        n -= 2;
    }
    if (n == 0 || n >= host_len)
        return cv_errf(err, errlen, "address '%s': host is empty or too long", addr);
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno || p <= 0 || p > 65535)
        return cv_errf(err, errlen, "address '%s': port is not a number in 1..65535", addr);
    memcpy(host, h, n);
    host[n] = '\0';
    *port = (int)p;
    return 0;
}

/* "ADDR:PORT" of a socket address. */
static void format_sockaddr(const struct sockaddr *sa, socklen_t len, char *out, size_t outlen)
{
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, outlen, "?");
        return;
    }
    snprintf(out, outlen, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

/* Whether a is a loopback address (127/8, ::1, IPv4-mapped 127/8) or,
 * with unspecified, the any-address (0.0.0.0, ::, mapped 0.0.0.0), which a
 * connect reaches this machine by. */
static bool addr_is_loopback(const struct sockaddr *sa, bool unspecified)
{
    if (sa->sa_family == AF_INET) {
        const uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
        return (a >> 24) == 127 || (unspecified && a == 0);
    }
    if (sa->sa_family != AF_INET6)
        return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    const bool mapped = IN6_IS_ADDR_V4MAPPED(a);
    return IN6_IS_ADDR_LOOPBACK(a) || (mapped && a->s6_addr[12] == 127) ||
           (unspecified && (IN6_IS_ADDR_UNSPECIFIED(a) || (mapped && !memcmp(a->s6_addr + 12, "\0\0\0\0", 4))));
}

/* Whether every address host resolves to (all) or any of them (!all) is
 * loopback, the any-address counting with unspecified. */
static bool host_loopback(const char *host, bool all, bool unspecified)
{
    if (!host || !host[0])
        return false;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    bool found = all ? res != NULL : false;
    for (const struct addrinfo *ai = res; ai && found == all; ai = ai->ai_next)
        found = addr_is_loopback(ai->ai_addr, unspecified);
    freeaddrinfo(res);
    return found;
}

bool cv_host_is_loopback(const char *host) { return host_loopback(host, true, false); }

bool cv_host_reaches_loopback(const char *host) { return host_loopback(host, false, true); }

bool cv_link_peer_is_loopback(const cv_link *l)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    return getpeername(cv_link_poll_fd(l), (struct sockaddr *)&ss, &sl) == 0 &&
           addr_is_loopback((struct sockaddr *)&ss, true);
}

int cv_listener_open(const char *host, int port, cv_listener **out, char *err, size_t errlen)
{
    const char *h = host && host[0] ? host : NULL;
    char shown[CV_LINK_NAME_MAX];
    snprintf(shown, sizeof shown, "%s:%d", h ? h : "*", port);
    if (port < 0 || port > 65535)
        return cv_errf(err, errlen, "listen %s: port is not in 0..65535", shown);
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints = {.ai_family = h ? AF_UNSPEC : AF_INET,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(h, serv, &hints, &res);
    if (gai != 0)
        return cv_errf(err, errlen, "listen %s: cannot resolve: %s", shown, gai_strerror(gai));
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return cv_errf(err, errlen, "listen %s: %s", shown, strerror(last_errno));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        int e = errno;
        close(fd);
        return cv_errf(err, errlen, "listen %s: getsockname: %s", shown, strerror(e));
    }
    cv_listener *l = cv_calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return cv_errf(err, errlen, "listen %s: out of memory", shown);
    }
    l->fd = fd;
    l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    format_sockaddr((struct sockaddr *)&ss, sl, l->addr, sizeof l->addr);
    *out = l;
    return 0;
}

int cv_listener_port(const cv_listener *l) { return l->port; }

int cv_listener_fd(const cv_listener *l) { return l->fd; }

const char *cv_listener_addr(const cv_listener *l) { return l->addr; }

int cv_listener_take(cv_listener *l, int *fd, char *peer, size_t peerlen, char *err, size_t errlen)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        *fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (*fd >= 0) {
            format_sockaddr((struct sockaddr *)&ss, sl, peer, peerlen);
            return 0;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return CV_LINK_TIMEOUT;
        if (errno != EINTR && errno != ECONNABORTED)
            return cv_errf(err, errlen, "listener %s: accept failed: %s", l->addr, strerror(errno));
    }
}

void cv_listener_close(cv_listener *l)
{
    if (!l)
        return;
    close(l->fd);
    cv_free(l);
}
