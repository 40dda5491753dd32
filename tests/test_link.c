/* test_link.c: TCP links of src/pipe/link.h over loopback.
 *
 * Two links exchange frames both ways (order, ids, gathered parts, byte
 * counts), one thread waiting on two links by polling them, a 24 MiB
 * payload, a payload over the receiver's cap; then raw
 * sockets play peers: one that sends a frame in pieces (looks between
 * them keep what arrived), a process killed by SIGKILL in the middle of
 * a frame, garbage bytes, a bad checksum, a silent peer (recv timeout), a
 * peer that stalls inside a frame (read timeout), a peer that never reads
 * (send timeout), a peer that is gone (send fails), a refused connect.
 * Every failure must come back as a message naming the peer, within its
 * timeout plus a loose margin. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "pipe/link.h"
#include "pipe/proto.h"
#include "test.h"
#include "link_test.h"

#define MARGIN_MS 1500 /* scheduling slack on a loaded machine */

static int has(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

/* A link accepted from a raw socket, which the test then drives by hand. */
static int make_raw_pair(const cv_link_opts *o, int *raw, cv_link **l)
{
    char err[CV_ERRLEN];
    cv_listener *ls = NULL;
    if (cv_listener_open("127.0.0.1", 0, &ls, err, sizeof err))
        return -1;
    *raw = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cv_listener_port(ls))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int rc = connect(*raw, (struct sockaddr *)&sa, sizeof sa);
    if (rc == 0)
        rc = cv_listener_accept(ls, 2000, o, l, err, sizeof err);
    if (rc)
        fprintf(stderr, "raw pair: %s\n", err);
    cv_listener_close(ls);
    return rc;
}

static void write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w <= 0)
            return;
        b += w;
        n -= (size_t)w;
    }
}

static void test_frames_both_ways(void)
{
    cv_link *a, *b;
    cv_link_opts oa = cv_link_default_opts();
    oa.name = "node A";
    if (test_link_pair(&oa, NULL, &a, &b))
        SKIP("no loopback TCP");
    CHECK(strcmp(cv_link_name(a), "node A") == 0);
    CHECK(strncmp(cv_link_name(b), "peer 127.0.0.1:", 15) == 0);
    char err[CV_ERRLEN];

    /* a -> b: a HELLO, then PINGs with ids; b -> a: PONGs answering them */
    cv_msg_hello h = {.proto_version = CV_PROTO_VERSION, .l1 = 2, .n_layer = 2, .n_ctx = 64, .n_slot = 1,
                      .n_batch_max = 8, .n_embd = 16, .max_payload = 1 << 20, .cluster_id = 7};
    strcpy(h.next_addr, "10.77.0.3:7001");
    uint8_t hb[512];
    size_t hn;
    CHECK(cv_msg_hello_encode(&h, hb, sizeof hb, &hn, err, sizeof err) == 0);
    CHECKF(cv_link_send(a, CV_MSG_HELLO, 1, hb, hn, err, sizeof err) == 0, "%s", err);
    enum { NPING = 50 };
    cv_msg_ping pings[NPING];
    uint8_t pb[NPING][CV_MSG_PING_SIZE];
    for (int i = 0; i < NPING; i++) {
        pings[i] = (cv_msg_ping){.nonce = 1000u + (uint64_t)i, .timestamp = (uint64_t)cv_now_ms()};
        size_t n;
        cv_msg_ping_encode(&pings[i], pb[i], sizeof pb[i], &n, err, sizeof err);
        struct iovec part = {pb[i], n};
        CHECK(cv_link_sendv(a, CV_MSG_PING, 100u + (uint32_t)i, &part, 1, NULL, err, sizeof err) == 0);
    }
    CHECK(cv_link_send(a, CV_MSG_BYE, 999, NULL, 0, err, sizeof err) == 0);

    cv_frame f;
    CHECKF(cv_link_recv(b, 2000, &f, err, sizeof err) == 0, "%s", err);
    CHECK(f.h.type == CV_MSG_HELLO && f.h.id == 1 && f.h.payload_len == hn);
    CHECK(((uintptr_t)f.payload % 64) == 0);
    cv_msg_hello hd;
    CHECK(cv_msg_hello_decode(f.payload, f.h.payload_len, &hd, err, sizeof err) == 0);
    CHECK(strcmp(hd.next_addr, "10.77.0.3:7001") == 0 && hd.cluster_id == 7);
    cv_link_release(b, &f);
    for (int i = 0; i < NPING; i++) {
        CHECKF(cv_link_recv(b, 2000, &f, err, sizeof err) == 0, "%s", err);
        cv_msg_ping pd = {0};
        CHECK(f.h.type == CV_MSG_PING && f.h.id == 100u + (uint32_t)i);
        CHECK(cv_msg_ping_decode(f.payload, f.h.payload_len, &pd, err, sizeof err) == 0 && pd.nonce == pings[i].nonce);
        CHECK(cv_link_send(b, CV_MSG_PONG, f.h.id, f.payload, f.h.payload_len, err, sizeof err) == 0);
        cv_link_release(b, &f);
    }
    CHECKF(cv_link_recv(b, 2000, &f, err, sizeof err) == 0, "%s", err);
    CHECK(f.h.type == CV_MSG_BYE && f.h.id == 999 && f.h.payload_len == 0 && f.payload == NULL);
    cv_link_release(b, &f);
    for (int i = 0; i < NPING; i++) {
        CHECKF(cv_link_recv(a, 2000, &f, err, sizeof err) == 0, "%s", err);
        cv_msg_ping pd = {0};
        CHECK(f.h.type == CV_MSG_PONG && f.h.id == 100u + (uint32_t)i);
        CHECK(cv_msg_ping_decode(f.payload, f.h.payload_len, &pd, err, sizeof err) == 0 && pd.nonce == pings[i].nonce);
        cv_link_release(a, &f);
    }

    /* nothing more: a timeout, and the link is still fine */
    int64_t t0 = cv_now_ms();
    CHECK(cv_link_recv(a, 150, &f, err, sizeof err) == CV_LINK_TIMEOUT && has(err, "node A: no frame within 150"));
    CHECK(cv_now_ms() - t0 >= 140);
    CHECK(cv_link_send(a, CV_MSG_PING, 5, pb[0], CV_MSG_PING_SIZE, err, sizeof err) == 0);
    CHECK(cv_link_recv(b, 2000, &f, err, sizeof err) == 0 && f.h.id == 5);
    cv_link_release(b, &f);

    cv_link_stats sa, sb;
    cv_link_get_stats(a, &sa);
    cv_link_get_stats(b, &sb);
    uint64_t a_to_b = (24 + hn) + NPING * (24 + CV_MSG_PING_SIZE) + 24 + (24 + CV_MSG_PING_SIZE);
    CHECKF(sa.bytes_sent == a_to_b && sb.bytes_recv == a_to_b, "%llu %llu %llu", (unsigned long long)sa.bytes_sent,
           (unsigned long long)sb.bytes_recv, (unsigned long long)a_to_b);
    CHECK(sa.frames_sent == NPING + 3 && sb.frames_recv == NPING + 3);
    CHECK(sb.bytes_sent == sa.bytes_recv && sb.frames_sent == NPING);

    /* renamed while its threads run; b closes: a's recv fails with the new name */
    cv_link_set_name(a, "node A (10.77.0.2:7000)");
    CHECK(strcmp(cv_link_name(a), "node A (10.77.0.2:7000)") == 0);
    cv_link_close(b);
    CHECK(cv_link_recv(a, 3000, &f, err, sizeof err) == -1);
    CHECKF(strcmp(err, "node A (10.77.0.2:7000): connection closed by peer") == 0, "%s", err);
    CHECK(cv_link_recv(a, 0, &f, err, sizeof err) == -1);
    cv_link_close(a);
}

/* One thread waits on two links by polling their sockets. */
static void test_poll_fds(void)
{
    cv_link *a1, *b1, *a2, *b2;
    if (test_link_pair(NULL, NULL, &a1, &b1))
        SKIP("no loopback TCP");
    if (test_link_pair(NULL, NULL, &a2, &b2)) {
        cv_link_close(a1);
        cv_link_close(b1);
        SKIP("no loopback TCP");
    }
    char err[CV_ERRLEN];
    struct pollfd p[2] = {{.fd = cv_link_poll_fd(b1), .events = POLLIN}, {.fd = cv_link_poll_fd(b2), .events = POLLIN}};
    CHECK(poll(p, 2, 100) == 0);
    CHECK(cv_link_send(a2, CV_MSG_BYE, 22, NULL, 0, err, sizeof err) == 0);
    CHECK(poll(p, 2, 5000) == 1 && p[1].revents & POLLIN);
    cv_frame f;
    CHECK(cv_link_recv(b1, 0, &f, err, sizeof err) == CV_LINK_TIMEOUT);
    CHECK(cv_link_recv(b2, 0, &f, err, sizeof err) == 0 && f.h.id == 22);
    cv_link_release(b2, &f);
    CHECK(poll(p, 2, 100) == 0);
    /* the end of a link is news too */
    cv_link_close(a1);
    CHECK(poll(p, 2, 5000) == 1 && p[0].revents);
    CHECK(cv_link_recv(b1, 0, &f, err, sizeof err) == -1 && has(err, "connection closed by peer"));
    cv_link_close(b1);
    cv_link_close(a2);
    cv_link_close(b2);
}

static void test_large_payload_and_cap(void)
{
    cv_link *a, *b;
    if (test_link_pair(NULL, NULL, &a, &b))
        SKIP("no loopback TCP");
    char err[CV_ERRLEN];
    size_t n = 24u << 20;
    uint8_t *big = cv_malloc(n);
    uint32_t x = 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        big[i] = (uint8_t)(x >> 16);
    }
    /* three parts, as a FORWARD head + activations would go */
    struct iovec parts[3] = {{big, 1000}, {big + 1000, n - 2000}, {big + n - 1000, 1000}};
    uint64_t ticket;
    CHECK(cv_link_sendv(a, CV_MSG_FORWARD, 42, parts, 3, &ticket, err, sizeof err) == 0);
    cv_frame f;
    CHECKF(cv_link_recv(b, 10000, &f, err, sizeof err) == 0, "%s", err);
    CHECK(cv_link_wait_sent(a, ticket, err, sizeof err) == 0);
    CHECK(f.h.payload_len == n && f.h.id == 42 && memcmp(f.payload, big, n) == 0);
    cv_link_release(b, &f);

    /* a smaller frame reuses the pooled buffer */
    CHECK(cv_link_send(a, CV_MSG_FORWARD, 43, big, 4096, err, sizeof err) == 0);
    CHECK(cv_link_recv(b, 5000, &f, err, sizeof err) == 0 && f.h.payload_len == 4096);
    CHECK(f.buf_cap >= n && memcmp(f.payload, big, 4096) == 0);
    cv_link_release(b, &f);

    /* over b's cap: b refuses the frame and names the cap */
    cv_link_set_max_payload(b, 1u << 20);
    CHECK(cv_link_send(a, CV_MSG_FORWARD, 44, big, (1u << 20) + 1, err, sizeof err) == 0);
    CHECK(cv_link_recv(b, 5000, &f, err, sizeof err) == -1);
    CHECKF(has(err, "peer 127.0.0.1:") && has(err, "exceeds the link's cap of 1048576"), "%s", err);
    /* b can still send (a node answers ERROR after a bad frame) */
    uint8_t eb[128];
    size_t en;
    cv_msg_error_encode(CV_PERR_BAD_FRAME, "too big", eb, sizeof eb, &en, err, sizeof err);
    CHECK(cv_link_send(b, CV_MSG_ERROR, 44, eb, en, err, sizeof err) == 0);
    CHECK(cv_link_recv(a, 5000, &f, err, sizeof err) == 0 && f.h.type == CV_MSG_ERROR);
    cv_link_release(a, &f);
    cv_link_close(a);
    cv_link_close(b);
    cv_free(big);
}

/* The child connects, sends a header claiming 100000 bytes and 3000 of
 * them, then dies by SIGKILL. */
static void test_peer_killed_mid_frame(void)
{
    char err[CV_ERRLEN];
    cv_listener *ls = NULL;
    if (cv_listener_open("127.0.0.1", 0, &ls, err, sizeof err))
        SKIP("no loopback TCP");
    int port = cv_listener_port(ls);
    static uint8_t payload[100000];
    cv_frame_header h = cv_frame_header_make(CV_MSG_FORWARD, 9, payload, sizeof payload);
    uint8_t hdr[CV_FRAME_HEADER_SIZE];
    cv_frame_header_encode(&h, hdr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            write_all(fd, hdr, sizeof hdr);
            write_all(fd, payload, 3000);
            usleep(200 * 1000);
        }
        raise(SIGKILL);
        _exit(1);
    }
    cv_link_opts o = cv_link_default_opts();
    o.read_timeout_ms = 5000;
    cv_link *l = NULL;
    CHECKF(cv_listener_accept(ls, 5000, &o, &l, err, sizeof err) == 0, "%s", err);
    cv_listener_close(ls);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (!l)
        return;
    int64_t t0 = cv_now_ms();
    cv_frame f;
    CHECK(cv_link_recv(l, 10000, &f, err, sizeof err) == -1);
    CHECKF(has(err, "peer 127.0.0.1:") &&
               has(err, "connection closed while reading FORWARD payload (got 3000 of 100000 bytes)"),
           "%s", err);
    CHECK(cv_now_ms() - t0 < MARGIN_MS);
    cv_link_close(l);
}

static void test_garbage_and_bad_checksum(void)
{
    char err[CV_ERRLEN];
    int raw;
    cv_link *l;
    if (make_raw_pair(NULL, &raw, &l))
        SKIP("no loopback TCP");
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    write_all(raw, http, strlen(http));
    cv_frame f;
    CHECK(cv_link_recv(l, 5000, &f, err, sizeof err) == -1);
    CHECKF(has(err, "peer 127.0.0.1:") && has(err, "bad frame magic 47 45 54 20"), "%s", err);
    close(raw);
    cv_link_close(l);

    if (make_raw_pair(NULL, &raw, &l))
        return;
    uint8_t payload[16] = {1, 2, 3};
    cv_frame_header h = cv_frame_header_make(CV_MSG_PING, 3, payload, sizeof payload);
    uint8_t hdr[CV_FRAME_HEADER_SIZE];
    cv_frame_header_encode(&h, hdr);
    write_all(raw, hdr, sizeof hdr);
    write_all(raw, payload, sizeof payload);
    payload[5] ^= 1;
    write_all(raw, hdr, sizeof hdr);
    write_all(raw, payload, sizeof payload);
    CHECK(cv_link_recv(l, 5000, &f, err, sizeof err) == 0 && f.h.type == CV_MSG_PING);
    cv_link_release(l, &f);
    CHECK(cv_link_recv(l, 5000, &f, err, sizeof err) == -1);
    CHECKF(has(err, "PING frame (id 3, 16 bytes): payload checksum"), "%s", err);
    close(raw);
    cv_link_close(l);

    /* a header with a wrong version, then one with a huge length */
    uint8_t bad[CV_FRAME_HEADER_SIZE];
    if (make_raw_pair(NULL, &raw, &l))
        return;
    memcpy(bad, hdr, sizeof bad);
    bad[4] = 7;
    write_all(raw, bad, sizeof bad);
    CHECK(cv_link_recv(l, 5000, &f, err, sizeof err) == -1 && has(err, "frame version 7"));
    close(raw);
    cv_link_close(l);
    if (make_raw_pair(NULL, &raw, &l))
        return;
    memcpy(bad, hdr, sizeof bad);
    bad[19] = 0xff;
    write_all(raw, bad, sizeof bad);
    CHECK(cv_link_recv(l, 5000, &f, err, sizeof err) == -1 && has(err, "exceeds the link's cap"));
    close(raw);
    cv_link_close(l);
}

static void test_silent_and_stalled_peer(void)
{
    char err[CV_ERRLEN];
    int raw;
    cv_link *l;
    cv_link_opts o = cv_link_default_opts();
    o.read_timeout_ms = 300;
    if (make_raw_pair(&o, &raw, &l))
        SKIP("no loopback TCP");
    cv_frame f;
    /* silent between frames: recv times out, the link is fine */
    int64_t t0 = cv_now_ms();
    CHECK(cv_link_recv(l, 400, &f, err, sizeof err) == CV_LINK_TIMEOUT && has(err, "no frame within 400 ms"));
    int64_t dt = cv_now_ms() - t0;
    CHECKF(dt >= 390 && dt < 400 + MARGIN_MS, "%lld ms", (long long)dt);
    /* a frame in pieces: a look between them keeps what came */
    uint8_t payload[40] = {7, 8, 9};
    cv_frame_header h = cv_frame_header_make(CV_MSG_PING, 4, payload, sizeof payload);
    uint8_t hdr[CV_FRAME_HEADER_SIZE];
    cv_frame_header_encode(&h, hdr);
    write_all(raw, hdr, 10);
    usleep(20 * 1000);
    CHECK(cv_link_recv(l, 0, &f, err, sizeof err) == CV_LINK_TIMEOUT);
    write_all(raw, hdr + 10, sizeof hdr - 10);
    write_all(raw, payload, 25);
    usleep(20 * 1000);
    CHECK(cv_link_recv(l, 0, &f, err, sizeof err) == CV_LINK_TIMEOUT);
    write_all(raw, payload + 25, sizeof payload - 25);
    CHECKF(cv_link_recv(l, 1000, &f, err, sizeof err) == 0, "%s", err);
    CHECK(f.h.type == CV_MSG_PING && f.h.id == 4 && f.h.payload_len == sizeof payload && f.payload[2] == 9);
    cv_link_release(l, &f);
    /* silent in the middle of a header: the read timeout ends the link */
    h = cv_frame_header_make(CV_MSG_BYE, 1, NULL, 0);
    cv_frame_header_encode(&h, hdr);
    write_all(raw, hdr, 10);
    t0 = cv_now_ms();
    CHECK(cv_link_recv(l, 10000, &f, err, sizeof err) == -1);
    dt = cv_now_ms() - t0;
    CHECKF(has(err, "timed out after 300 ms while reading frame header (got 10 of 24 bytes)"), "%s", err);
    CHECKF(dt < 300 + MARGIN_MS, "%lld ms", (long long)dt);
    close(raw);
    cv_link_close(l);
}

static void test_send_stall_and_dead_peer(void)
{
    char err[CV_ERRLEN];
    int raw;
    cv_link *l;
    cv_link_opts o = cv_link_default_opts();
    o.send_timeout_ms = 300;
    if (make_raw_pair(&o, &raw, &l))
        SKIP("no loopback TCP");
    /* the raw peer never reads: once the socket buffers fill, no byte
     * moves for 300 ms and the frame fails */
    size_t n = 64u << 20;
    uint8_t *big = cv_calloc(1, n);
    uint64_t ticket;
    struct iovec part = {big, n};
    CHECK(cv_link_sendv(l, CV_MSG_FORWARD, 1, &part, 1, &ticket, err, sizeof err) == 0);
    int64_t t0 = cv_now_ms();
    CHECK(cv_link_wait_sent(l, ticket, err, sizeof err) == -1);
    CHECKF(has(err, "peer 127.0.0.1:") && has(err, "send stalled: the peer took no data for 300 ms"), "%s", err);
    CHECK(cv_now_ms() - t0 < 300 + 3 * MARGIN_MS);
    CHECK(cv_link_send(l, CV_MSG_BYE, 2, NULL, 0, err, sizeof err) == -1 && has(err, "send stalled"));
    cv_free(big);
    close(raw);
    cv_link_close(l);

    /* a peer that is gone: sends fail (the first may still reach the
     * kernel), with the peer's name, and nothing hangs */
    if (make_raw_pair(NULL, &raw, &l))
        return;
    close(raw);
    uint8_t small[64] = {0};
    int failed = 0;
    for (int i = 0; i < 100 && !failed; i++) {
        failed = cv_link_send(l, CV_MSG_PING, 1, small, CV_MSG_PING_SIZE, err, sizeof err) != 0;
        usleep(10 * 1000);
    }
    CHECKF(failed && has(err, "peer 127.0.0.1:") && has(err, "connection closed by peer"), "%s", err);
    cv_frame f;
    CHECK(cv_link_recv(l, 2000, &f, err, sizeof err) == -1 &&
          (has(err, "connection closed by peer") || has(err, "connection reset")));
    cv_link_close(l);
}

static void test_connect_and_accept_errors(void)
{
    char err[CV_ERRLEN];
    cv_listener *ls = NULL;
    if (cv_listener_open("127.0.0.1", 0, &ls, err, sizeof err))
        SKIP("no loopback TCP");
    int port = cv_listener_port(ls);
    cv_link *l = NULL;
    int64_t t0 = cv_now_ms();
    CHECK(cv_listener_accept(ls, 100, NULL, &l, err, sizeof err) == CV_LINK_TIMEOUT);
    CHECK(cv_now_ms() - t0 >= 90 && has(err, "no connection within 100 ms"));
    cv_listener_close(ls);
    /* the port is closed now */
    CHECK(cv_link_connect("127.0.0.1", port, 1000, NULL, &l, err, sizeof err) == -1);
    char expect[64];
    snprintf(expect, sizeof expect, "node 127.0.0.1:%d: connect failed", port);
    CHECKF(has(err, expect), "%s", err);
    CHECK(cv_link_connect("no.such.host.invalid", 7000, 1000, NULL, &l, err, sizeof err) == -1 &&
          has(err, "node no.such.host.invalid:7000: cannot resolve"));
    CHECK(cv_link_connect("127.0.0.1", 0, 1000, NULL, &l, err, sizeof err) == -1 && has(err, "port 0"));

    char host[64];
    int p;
    CHECK(cv_parse_addr("10.77.0.2:7001", host, sizeof host, &p, err, sizeof err) == 0 &&
          strcmp(host, "10.77.0.2") == 0 && p == 7001);
    CHECK(cv_parse_addr("[::1]:80", host, sizeof host, &p, err, sizeof err) == 0 && strcmp(host, "::1") == 0 &&
          p == 80);
    CHECK(cv_parse_addr("host", host, sizeof host, &p, err, sizeof err) == -1);
    CHECK(cv_parse_addr("host:", host, sizeof host, &p, err, sizeof err) == -1);
    CHECK(cv_parse_addr("host:70000", host, sizeof host, &p, err, sizeof err) == -1);
    CHECK(cv_parse_addr(":80", host, sizeof host, &p, err, sizeof err) == -1);
    CHECK(cv_parse_addr("host:8x", host, sizeof host, &p, err, sizeof err) == -1);
}

int main(void)
{
    TEST_RUN(test_frames_both_ways);
    TEST_RUN(test_poll_fds);
    TEST_RUN(test_large_payload_and_cap);
    TEST_RUN(test_peer_killed_mid_frame);
    TEST_RUN(test_garbage_and_bad_checksum);
    TEST_RUN(test_silent_and_stalled_peer);
    TEST_RUN(test_send_stall_and_dead_peer);
    TEST_RUN(test_connect_and_accept_errors);
    return test_summary();
}
