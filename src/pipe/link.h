/* link.h: a TCP link between two convoy processes, carrying proto.h frames.
 *
 * Contract:
 * - A link is one connected TCP socket (TCP_NODELAY, SO_KEEPALIVE with
 *   probes after 5 s idle, so a vanished host is noticed in about 11 s)
 *   and a writer thread of its own that drains the link's send queue.
 *   Receiving is done by the caller of cv_link_recv, on its own thread:
 *   until then a frame waits in the kernel's socket buffer (so compute,
 *   sending and receiving overlap), and no thread sleeps on the socket.
 * - Sending: cv_link_sendv queues one frame whose payload is gathered from
 *   up to CV_LINK_MAX_PARTS caller buffers and returns a ticket at once.
 *   The writer computes the checksum and sends header and parts with one
 *   gather write (sendmsg, as writev without SIGPIPE), copying nothing.
 *   The buffers stay the caller's, and the link reads them until the frame
 *   is sent: they must stay alive and unchanged until cv_link_wait_sent
 *   for that ticket (or a later one) returns, whatever it returns, or
 *   cv_link_close returns. cv_link_send is sendv + wait_sent. Frames leave
 *   in the order they were queued; any thread may send. The queue holds
 *   CV_LINK_SEND_QUEUE frames; sendv waits while it is full.
 * - The writer fails the sending side when the socket takes no byte for
 *   send_timeout_ms (peer not reading) or on any socket error; every
 *   pending and later send then fails with that message, and no caller
 *   buffer is referenced any more.
 * - Receiving: one thread at a time calls cv_link_recv, which waits up to
 *   its timeout for the next frame (an idle link is normal), but once a
 *   frame's first byte has arrived the whole frame must arrive within
 *   read_timeout_ms of it (a call that times out before keeps what it
 *   read for the next one). It checks each header (magic, version, type,
 *   flags, length against the link's cap) and the payload checksum. A
 *   frame the caller does not take stays in the socket buffer; when that
 *   is full, TCP pushes back on the peer. The first bad frame, timeout,
 *   reset or end of stream ends the receiving side: this and every later
 *   cv_link_recv fails with the reason. Payloads are not decoded here
 *   (see proto.h).
 * - Received payloads are 64-byte aligned buffers lent by the link: give
 *   each frame back with cv_link_release (buffers are reused, so a steady
 *   stream allocates nothing), and all of them before cv_link_close.
 * - Every message names the peer: "<name>: ...", the name being
 *   opts->name or by default "node HOST:PORT" (connect) or
 *   "peer ADDR:PORT" (accept), for example "node 10.77.0.2:7001:
 *   connection closed while reading frame header (got 10 of 24 bytes)".
 * - Functions return 0 on success and -1 on failure with a message in err;
 *   cv_link_recv and cv_listener_accept return CV_LINK_TIMEOUT (1) when
 *   their timeout passed with nothing to return (err says so; the link or
 *   listener is fine). A timeout_ms < 0 waits without limit.
 * - cv_link_close may not run concurrently with other calls on the link;
 *   it drops unsent frames (cv_link_send waits until its frame is sent).
 * - Keyed links (opts->key, seal.h): cv_link_connect runs the client's key
 *   handshake before the link starts; the accepting side's handshake is a
 *   gate's (gate.h), which hands the socket and session keys to
 *   cv_link_adopt. Every frame is then sealed (seal.h section 3): the
 *   writer copies a frame's header and parts into a scratch buffer of the
 *   link and encrypts it there (the caller's buffers are read, as before,
 *   until the frame is sent); the receiver checks each tag, and the first
 *   frame that fails it ends the receiving side. Plaintext links copy
 *   nothing. */
#ifndef CONVOY_PIPE_LINK_H
#define CONVOY_PIPE_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "pipe/proto.h"
#include "pipe/seal.h"

#define CV_LINK_TIMEOUT 1
#define CV_LINK_MAX_PARTS 4
#define CV_LINK_SEND_QUEUE 64
#define CV_LINK_NAME_MAX 128

typedef struct cv_link cv_link;
typedef struct cv_listener cv_listener;

typedef struct cv_link_opts {
    const char *name;     /* label in messages; NULL: the default above */
    int read_timeout_ms;  /* a frame, once begun, must arrive within this; default 10000 */
    int send_timeout_ms;  /* the socket must take a byte within this while sending; default 10000 */
    uint32_t max_payload; /* receive cap until cv_link_set_max_payload; default CV_PROTO_DEFAULT_MAX_PAYLOAD */
    const cv_seal_key *key; /* the cluster key: a keyed link; NULL: plaintext */
} cv_link_opts;

cv_link_opts cv_link_default_opts(void);
/* The defaults with both timeouts at io_timeout_ms: the options of every
 * link between the head and its nodes. */
cv_link_opts cv_link_io_opts(int io_timeout_ms);

/* A received frame; payload holds h.payload_len bytes (NULL when 0). */
typedef struct cv_frame {
    cv_frame_header h;
    uint8_t *payload;
    size_t buf_cap; /* the link's: capacity of the buffer behind payload */
} cv_frame;

typedef struct cv_link_stats {
    uint64_t bytes_sent; /* headers included */
    uint64_t bytes_recv;
    uint64_t frames_sent;
    uint64_t frames_recv;
} cv_link_stats;

/* Splits "host:port" (or "[v6addr]:port") into host and port. */
int cv_parse_addr(const char *addr, char *host, size_t host_len, int *port, char *err, size_t errlen);

/* Whether every address host resolves to is a loopback one (127.0.0.0/8,
 * ::1); false for NULL or "" (every address) and for a name that does not
 * resolve. */
bool cv_host_is_loopback(const char *host);
/* Whether any address host resolves to reaches this machine's loopback: a
 * loopback one, or the any-address (0.0.0.0, ::), which a connect sends
 * here; false for a name that does not resolve. */
bool cv_host_reaches_loopback(const char *host);
/* Whether l's peer is on this machine's loopback (false when unknown). */
bool cv_link_peer_is_loopback(const cv_link *l);

/* Connects within timeout_ms (resolution and, with opts->key, the key
 * handshake included; numeric hosts do not block) and starts the link's
 * writer thread. opts may be NULL. */
int cv_link_connect(const char *host, int port, int timeout_ms, const cv_link_opts *opts, cv_link **out, char *err,
                    size_t errlen);

/* Listens on host:port (host NULL or "" = all addresses, port 0 = any). */
int cv_listener_open(const char *host, int port, cv_listener **out, char *err, size_t errlen);
int cv_listener_port(const cv_listener *l);
/* Accepts one plaintext link (opts->key must be NULL: keyed links are
 * accepted through a gate, gate.h). */
int cv_listener_accept(cv_listener *l, int timeout_ms, const cv_link_opts *opts, cv_link **out, char *err,
                       size_t errlen);
/* The listening socket, to poll (POLLIN) for connections. */
int cv_listener_fd(const cv_listener *l);
/* Its "ADDR:PORT", as messages name it. */
const char *cv_listener_addr(const cv_listener *l);
/* Accepts one waiting connection without waiting: 0 with *fd (non-blocking,
 * the caller's) and its "ADDR:PORT" in peer, CV_LINK_TIMEOUT when none
 * waits, -1 on a listener error. */
int cv_listener_take(cv_listener *l, int *fd, char *peer, size_t peerlen, char *err, size_t errlen);
void cv_listener_close(cv_listener *l);

/* Starts a link over a socket a gate accepted (peer: its "ADDR:PORT"), keyed
 * with session (the server's, from cv_seal_server_finish) or plaintext when
 * session is NULL. The link owns fd from the call on, failure included. */
int cv_link_adopt(int fd, const char *peer, const cv_link_opts *opts, const cv_seal_session *session, cv_link **out,
                  char *err, size_t errlen);

/* The name in messages. The pointer is valid until cv_link_set_name or
 * cv_link_close. */
const char *cv_link_name(const cv_link *l);
/* Renames the link (for example once a handshake tells who the peer is:
 * an accepted link from the previous node is "peer ADDR:EPHEMERAL_PORT"
 * until then). Safe at any time; later messages use it. */
void cv_link_set_name(cv_link *l, const char *name);
/* The receive cap for frames whose header has not been read yet (links
 * between convoy processes keep the default, see proto.h). */
void cv_link_set_max_payload(cv_link *l, uint32_t max_payload);

/* Queues a frame of type and id whose payload is parts[0..n_parts)
 * (n_parts may be 0); *ticket identifies it for cv_link_wait_sent. */
int cv_link_sendv(cv_link *l, uint16_t type, uint32_t id, const struct iovec *parts, int n_parts, uint64_t *ticket,
                  char *err, size_t errlen);
/* Waits until the frame of ticket has been handed to the kernel (0) or
 * the sending side failed first (-1). Either way its buffers are free. */
int cv_link_wait_sent(cv_link *l, uint64_t ticket, char *err, size_t errlen);
/* A sealed link seals each frame in a buffer of its own, grown to the
 * largest frame sent so far: makes it hold a payload of `payload` bytes
 * now, so that a step's send allocates nothing. Plaintext links need
 * nothing. Call it while no frame is being sent. */
int cv_link_reserve(cv_link *l, size_t payload, char *err, size_t errlen);
/* Sends one payload buffer and waits until it is sent. */
int cv_link_send(cv_link *l, uint16_t type, uint32_t id, const void *payload, size_t len, char *err, size_t errlen);

/* The descriptor to poll (POLLIN) to wait on several links at once: when
 * it is readable, cv_link_recv(l, 0, ...) makes progress (a frame, part of
 * one, or the receiving side's end). The link owns it. */
int cv_link_poll_fd(const cv_link *l);

/* Takes the next received frame, waiting up to timeout_ms (0: only a look). */
int cv_link_recv(cv_link *l, int timeout_ms, cv_frame *f, char *err, size_t errlen);
/* Gives a received frame's buffer back to the link. */
void cv_link_release(cv_link *l, cv_frame *f);

void cv_link_get_stats(cv_link *l, cv_link_stats *s);
/* Stops the writer thread, closes the socket, frees everything. NULL is fine. */
void cv_link_close(cv_link *l);

#endif
