/* test_seal.c: the cluster key, the key handshake and sealed frames
 * (src/pipe/seal.h), and keyed links through a gate (gate.h) over loopback.
 *
 * The pure functions: both sides of a handshake agree on the frame keys
 * with the right key and refuse with a wrong one (each side's proof), a
 * low-order or mislabelled HELLO is refused, a sealed frame opens once and
 * only unchanged and in order. Key files: written 0600, never over an
 * existing file; a file readable by others, of the wrong size or not hex is
 * refused. Over sockets: keyed links carry frames both ways (empty, gathered
 * and large ones), encrypted on the wire; a wrong key is refused by both
 * sides; a raw peer that runs the handshake itself and then sends a frame
 * with a flipped byte, a replayed frame or two frames swapped fails the
 * link with the authentication message; a peer that stops after the
 * handshake's first half or sends nothing is dropped within the gate's
 * deadline; a full pending set drops its oldest so a real client gets in. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/err.h"
#include "pipe/gate.h"
#include "pipe/link.h"
#include "pipe/proto.h"
#include "pipe/seal.h"
#include "test.h"

#define DEADLINE_MS 600
#define MARGIN_MS 1500 /* scheduling slack on a loaded machine */
#define AUTH_MSG "frame failed authentication (tampered, replayed or out of order)"

static int has(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

static cv_seal_key key_of(uint8_t fill)
{
    cv_seal_key k;
    for (int i = 0; i < CV_SEAL_KEY_BYTES; i++)
        k.k[i] = (uint8_t)(fill + i);
    return k;
}

/* A whole handshake over buffers: 0 when both sides finished. */
static int handshake(const cv_seal_key *kc, const cv_seal_key *ks, cv_seal_hs *c, cv_seal_hs *s, char *err,
                     size_t errlen)
{
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    if (cv_seal_client_hello(c, hello, err, errlen) || cv_seal_server_reply(s, ks, hello, reply, err, errlen) ||
        cv_seal_client_finish(c, kc, reply, proof, err, errlen))
        return -1;
    return cv_seal_server_finish(s, proof, err, errlen);
}

static void test_handshake_steps(void)
{
    char err[CV_ERRLEN];
    const cv_seal_key k = key_of(1), other = key_of(2);
    cv_seal_hs c, s, c2, s2;
    CHECKF(handshake(&k, &k, &c, &s, err, sizeof err) == 0, "%s", err);
    CHECK(!memcmp(c.session.tx.key, s.session.rx.key, CV_SEAL_KEY_BYTES));
    CHECK(!memcmp(c.session.rx.key, s.session.tx.key, CV_SEAL_KEY_BYTES));
    CHECK(memcmp(c.session.tx.key, c.session.rx.key, CV_SEAL_KEY_BYTES)); /* one key per direction */
    /* fresh ephemeral keys: a second session shares no key with the first */
    CHECKF(handshake(&k, &k, &c2, &s2, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(c.session.tx.key, c2.session.tx.key, CV_SEAL_KEY_BYTES));

    /* the client refuses a server without its key */
    CHECK(handshake(&k, &other, &c, &s, err, sizeof err) != 0);
    CHECKF(has(err, "did not prove the cluster key"), "%s", err);
    /* the server refuses a proof made without its key (or a reflected one) */
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    CHECK(cv_seal_client_hello(&c, hello, err, sizeof err) == 0);
    CHECK(cv_seal_server_reply(&s, &k, hello, reply, err, sizeof err) == 0);
    memcpy(proof, reply + 32, sizeof proof); /* the server's own proof, sent back */
    CHECK(cv_seal_server_finish(&s, proof, err, sizeof err) != 0);
    CHECKF(!strcmp(err, "key proof did not verify"), "%s", err);

    /* a HELLO with another magic, or a low-order public key (all zero) */
    CHECK(cv_seal_client_hello(&c, hello, err, sizeof err) == 0);
    hello[0] = 'X';
    CHECK(cv_seal_server_reply(&s, &k, hello, reply, err, sizeof err) != 0 && has(err, "CVK1"));
    memset(hello + 4, 0, 32);
    memcpy(hello, CV_SEAL_MAGIC, 4);
    CHECK(cv_seal_server_reply(&s, &k, hello, reply, err, sizeof err) != 0 && has(err, "low order"));
}

/* A sealed frame of len bytes of payload under hdr, its tag in tag. */
static void seal_one(cv_seal_dir *d, uint8_t hdr[CV_FRAME_HEADER_SIZE], uint8_t *p, size_t len, uint8_t *tag,
                     uint32_t id)
{
    char err[CV_ERRLEN];
    const cv_frame_header h = {.magic = CV_FRAME_MAGIC, .version = CV_FRAME_VERSION, .type = CV_MSG_PING, .id = id,
                               .payload_len = (uint32_t)len};
    cv_frame_header_encode(&h, hdr);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(id + i);
    CHECK(cv_seal_frame(d, hdr, p, len, tag, err, sizeof err) == 0);
}

static void test_seal_open(void)
{
    char err[CV_ERRLEN];
    const cv_seal_key k = key_of(7);
    cv_seal_hs c, s;
    CHECK(handshake(&k, &k, &c, &s, err, sizeof err) == 0);
    uint8_t hdr[3][CV_FRAME_HEADER_SIZE], p[3][16], tag[3][CV_SEAL_TAG_BYTES];
    for (uint32_t i = 0; i < 3; i++)
        seal_one(&c.session.tx, hdr[i], p[i], i == 2 ? 0 : 16, tag[i], i + 1);
    CHECK(p[0][0] != 1 || p[0][1] != 2); /* encrypted */
    cv_seal_dir rx = s.session.rx;
    uint8_t q[16];
    /* reordered: frame 1 before frame 0 */
    memcpy(q, p[1], 16);
    CHECK(cv_seal_open(&rx, hdr[1], q, 16, tag[1], err, sizeof err) != 0 && !strcmp(err, AUTH_MSG));
    /* a flipped bit in the payload, the header, the tag */
    for (int where = 0; where < 3; where++) {
        uint8_t h2[CV_FRAME_HEADER_SIZE], t2[CV_SEAL_TAG_BYTES];
        memcpy(q, p[0], 16);
        memcpy(h2, hdr[0], sizeof h2);
        memcpy(t2, tag[0], sizeof t2);
        (where == 0 ? q : where == 1 ? h2 + CV_FRAME_OFF_ID : t2)[3] ^= 0x10;
        CHECK(cv_seal_open(&rx, h2, q, 16, t2, err, sizeof err) != 0 && !strcmp(err, AUTH_MSG));
    }
    /* in order it opens, once */
    memcpy(q, p[0], 16);
    CHECKF(cv_seal_open(&rx, hdr[0], q, 16, tag[0], err, sizeof err) == 0, "%s", err);
    CHECK(q[0] == 1 && q[15] == 16);
    memcpy(q, p[0], 16);
    CHECK(cv_seal_open(&rx, hdr[0], q, 16, tag[0], err, sizeof err) != 0 && !strcmp(err, AUTH_MSG));
    CHECK(cv_seal_open(&rx, hdr[1], p[1], 16, tag[1], err, sizeof err) == 0 && p[1][0] == 2);
    /* an empty frame has a tag too */
    CHECK(cv_seal_open(&rx, hdr[2], NULL, 0, tag[2], err, sizeof err) == 0);
    /* the other direction's key does not open it */
    cv_seal_dir wrong = c.session.rx;
    seal_one(&c.session.tx, hdr[0], p[0], 16, tag[0], 9);
    wrong.counter = 3;
    CHECK(cv_seal_open(&wrong, hdr[0], p[0], 16, tag[0], err, sizeof err) != 0);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd >= 0) {
        CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
        fchmod(fd, mode);
        close(fd);
    }
}

static void test_key_files(void)
{
    char dir[] = "/tmp/convoy-seal-XXXXXX", path[64], err[CV_ERRLEN];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/key", dir);
    CHECKF(cv_seal_key_generate(path, err, sizeof err) == 0, "%s", err);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 65);
    cv_seal_key k1, k2;
    CHECKF(cv_seal_key_load(path, &k1, err, sizeof err) == 0, "%s", err);
    CHECK(cv_seal_key_generate(path, err, sizeof err) != 0 && has(err, "refusing to overwrite"));
    CHECK(cv_seal_key_load(path, &k2, err, sizeof err) == 0 && !memcmp(k1.k, k2.k, sizeof k1.k));
    chmod(path, 0644);
    CHECK(cv_seal_key_load(path, &k2, err, sizeof err) != 0 && has(err, "readable by others") && has(err, path));
    const char *hex64 = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    write_file(path, hex64, 0600); /* no newline is fine */
    CHECK(cv_seal_key_load(path, &k2, err, sizeof err) == 0 && k2.k[5] == 0x55 && k2.k[31] == 0xff);
    write_file(path, "0011\n", 0600);
    CHECK(cv_seal_key_load(path, &k2, err, sizeof err) != 0 && has(err, "64 hex digits"));
    write_file(path, "zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
    CHECK(cv_seal_key_load(path, &k2, err, sizeof err) != 0 && has(err, "not a hex digit"));
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK(cv_seal_key_load(path, &k2, err, sizeof err) != 0 && has(err, path));
    snprintf(path, sizeof path, "%s/key", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- over sockets ---- */

typedef struct gate_run {
    cv_gate *g;
    int timeout_ms;
    cv_link *link;
    int rc;
    char err[CV_ERRLEN];
    pthread_t t;
} gate_run;

static void *gate_main(void *arg)
{
    gate_run *r = arg;
    const cv_link_opts o = cv_link_io_opts(2000);
    r->rc = cv_gate_next(r->g, r->timeout_ms, &o, &r->link, r->err, sizeof r->err);
    return NULL;
}

/* Pumps the gate on a thread for up to timeout_ms. */
static void gate_start(gate_run *r, cv_gate *g, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->g = g;
    r->timeout_ms = timeout_ms;
    pthread_create(&r->t, NULL, gate_main, r);
}

static void gate_join(gate_run *r) { pthread_join(r->t, NULL); }

static cv_gate *open_gate(const cv_seal_key *key, int max_pending)
{
    char err[CV_ERRLEN];
    const cv_gate_opts o = {.key = key, .deadline_ms = DEADLINE_MS, .max_pending = max_pending,
                            .log_prefix = "test_seal"};
    cv_gate *g = NULL;
    if (cv_gate_open("127.0.0.1", 0, &o, &g, err, sizeof err))
        fprintf(stderr, "%s\n", err);
    return g;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (ssize_t w; n; b += w, n -= (size_t)w)
        if ((w = write(fd, b, n)) <= 0)
            return -1;
    return 0;
}

/* Reads n bytes within timeout_ms: n, or what came before EOF or timeout. */
static size_t read_within(int fd, void *p, size_t n, int timeout_ms)
{
    const int64_t until = cv_now_ms() + timeout_ms;
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        const int64_t left = until - cv_now_ms();
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            break;
        const ssize_t r = read(fd, (uint8_t *)p + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* ms until the peer closes fd (reads whatever comes), or -1 past limit. */
static int64_t ms_until_closed(int fd, int limit_ms)
{
    const int64_t t0 = cv_now_ms();
    uint8_t b[64];
    while (cv_now_ms() - t0 < limit_ms) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 50) > 0 && read(fd, b, sizeof b) <= 0)
            return cv_now_ms() - t0;
    }
    return -1;
}

static void test_keyed_links(void)
{
    char err[CV_ERRLEN];
    const cv_seal_key k = key_of(3);
    cv_gate *g = open_gate(&k, 0);
    CHECK(g != NULL);
    if (!g)
        return;
    gate_run r;
    gate_start(&r, g, 3000);
    cv_link_opts co = cv_link_io_opts(2000);
    co.key = &k;
    cv_link *c = NULL;
    CHECKF(cv_link_connect("127.0.0.1", cv_gate_port(g), 2000, &co, &c, err, sizeof err) == 0, "%s", err);
    gate_join(&r);
    CHECKF(r.rc == 0 && r.link, "%s", r.err);
    if (!c || !r.link)
        goto out;
    enum { BIG = 3 << 20 };
    uint8_t *big = malloc(BIG);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (uint8_t)(i * 7);
    const struct iovec parts[3] = {{(void *)"abc", 3}, {big, BIG}, {(void *)"xyz", 3}};
    uint64_t t;
    CHECK(cv_link_sendv(c, CV_MSG_FORWARD, 5, parts, 3, &t, err, sizeof err) == 0);
    CHECK(cv_link_send(c, CV_MSG_BYE, 6, NULL, 0, err, sizeof err) == 0);
    CHECK(cv_link_wait_sent(c, t, err, sizeof err) == 0);
    cv_frame f;
    CHECKF(cv_link_recv(r.link, 3000, &f, err, sizeof err) == 0, "%s", err);
    CHECK(f.h.type == CV_MSG_FORWARD && f.h.id == 5 && f.h.payload_len == BIG + 6);
    CHECK(f.payload && !memcmp(f.payload, "abc", 3) && !memcmp(f.payload + 3, big, BIG) &&
          !memcmp(f.payload + 3 + BIG, "xyz", 3));
    cv_link_release(r.link, &f);
    CHECK(cv_link_recv(r.link, 3000, &f, err, sizeof err) == 0 && f.h.type == CV_MSG_BYE && !f.payload);
    cv_link_release(r.link, &f);
    CHECK(cv_link_send(r.link, CV_MSG_PONG, 8, "pong-payload-16b", 16, err, sizeof err) == 0);
    CHECK(cv_link_recv(c, 3000, &f, err, sizeof err) == 0 && f.h.id == 8 && !memcmp(f.payload, "pong", 4));
    cv_link_release(c, &f);
    free(big);
out:
    cv_link_close(c);
    cv_link_close(r.link);
    cv_gate_close(g);
}

static void test_wrong_key_refused(void)
{
    char err[CV_ERRLEN];
    const cv_seal_key k = key_of(3), other = key_of(4);
    cv_gate *g = open_gate(&k, 0);
    CHECK(g != NULL);
    if (!g)
        return;
    gate_run r;
    gate_start(&r, g, 1500);
    cv_link_opts co = cv_link_io_opts(2000);
    co.key = &other;
    cv_link *c = NULL;
    CHECK(cv_link_connect("127.0.0.1", cv_gate_port(g), 2000, &co, &c, err, sizeof err) != 0);
    CHECKF(has(err, "did not prove the cluster key") && has(err, "node 127.0.0.1:"), "%s", err);
    /* plaintext against a keyed gate: nothing comes back, the link fails */
    co.key = NULL;
    CHECK(cv_link_connect("127.0.0.1", cv_gate_port(g), 2000, &co, &c, err, sizeof err) == 0);
    cv_frame f;
    if (c) {
        CHECK(cv_link_send(c, CV_MSG_PING, 1, "0123456789abcdef", 16, err, sizeof err) == 0);
        CHECK(cv_link_recv(c, 1500, &f, err, sizeof err) < 0);
        cv_link_close(c);
    }
    /* a proof made without the key */
    int fd = raw_connect(cv_gate_port(g));
    cv_seal_hs hs;
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES] = {1, 2, 3};
    CHECK(cv_seal_client_hello(&hs, hello, err, sizeof err) == 0 && write_all(fd, hello, sizeof hello) == 0);
    CHECK(read_within(fd, reply, sizeof reply, 1000) == sizeof reply);
    CHECK(write_all(fd, proof, sizeof proof) == 0);
    CHECK(ms_until_closed(fd, 1000) >= 0);
    close(fd);
    gate_join(&r);
    CHECKF(r.rc == CV_LINK_TIMEOUT && !r.link, "rc %d: %s", r.rc, r.err); /* nobody got through */
    cv_gate_close(g);
}

/* A raw peer that completes the handshake with key k: its fd and session. */
static int raw_keyed(int port, const cv_seal_key *k, cv_seal_session *s)
{
    char err[CV_ERRLEN];
    int fd = raw_connect(port);
    cv_seal_hs hs;
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    if (fd < 0 || cv_seal_client_hello(&hs, hello, err, sizeof err) || write_all(fd, hello, sizeof hello) ||
        read_within(fd, reply, sizeof reply, 2000) != sizeof reply ||
        cv_seal_client_finish(&hs, k, reply, proof, err, sizeof err) || write_all(fd, proof, sizeof proof)) {
        fprintf(stderr, "raw keyed peer: %s\n", err);
        return -1;
    }
    *s = hs.session;
    return fd;
}

enum { CASE_FLIP, CASE_REPLAY, CASE_SWAP };

/* Sends two sealed PINGs (A, B) on a fresh keyed link, spoiled as the case
 * says; the receiving link takes A (except when swapped) and then fails. */
static void spoiled_frames(cv_gate *g, const cv_seal_key *k, int how)
{
    char err[CV_ERRLEN];
    gate_run r;
    gate_start(&r, g, 3000);
    cv_seal_session s;
    const int fd = raw_keyed(cv_gate_port(g), k, &s);
    gate_join(&r);
    if (fd < 0 || !r.link) {
        CHECKF(0, "case %d: %s", how, r.err);
        return;
    }
    uint8_t fr[2][CV_FRAME_HEADER_SIZE + 16 + CV_SEAL_TAG_BYTES];
    for (int i = 0; i < 2; i++)
        seal_one(&s.tx, fr[i], fr[i] + CV_FRAME_HEADER_SIZE, 16, fr[i] + CV_FRAME_HEADER_SIZE + 16, 40 + i);
    if (how == CASE_FLIP)
        fr[1][CV_FRAME_HEADER_SIZE + 5] ^= 1;
    const int order[3][2] = {{0, 1}, {0, 0}, {1, 0}};
    for (int i = 0; i < 2; i++)
        write_all(fd, fr[order[how][i]], sizeof fr[0]);
    cv_frame f;
    if (how != CASE_SWAP) {
        CHECK(cv_link_recv(r.link, 2000, &f, err, sizeof err) == 0 && f.h.id == 40 && f.payload[3] == 43);
        cv_link_release(r.link, &f);
    }
    CHECK(cv_link_recv(r.link, 2000, &f, err, sizeof err) < 0);
    CHECKF(has(err, AUTH_MSG) && has(err, "peer 127.0.0.1:"), "case %d: %s", how, err);
    CHECK(cv_link_recv(r.link, 100, &f, err, sizeof err) < 0 && has(err, AUTH_MSG)); /* the link stays failed */
    /* what the link sends is sealed: the raw peer opens it with its keys */
    uint8_t in[CV_FRAME_HEADER_SIZE + 16 + CV_SEAL_TAG_BYTES];
    CHECK(cv_link_send(r.link, CV_MSG_PONG, 7, "plain text here!", 16, err, sizeof err) == 0);
    CHECK(read_within(fd, in, sizeof in, 2000) == sizeof in);
    CHECK(memcmp(in + CV_FRAME_HEADER_SIZE, "plain text here!", 16) != 0);
    CHECK(cv_seal_open(&s.rx, in, in + CV_FRAME_HEADER_SIZE, 16, in + CV_FRAME_HEADER_SIZE + 16, err, sizeof err) ==
              0 &&
          !memcmp(in + CV_FRAME_HEADER_SIZE, "plain text here!", 16));
    cv_link_close(r.link);
    close(fd);
}

static void test_tampered_replayed_reordered(void)
{
    const cv_seal_key k = key_of(5);
    cv_gate *g = open_gate(&k, 0);
    CHECK(g != NULL);
    if (!g)
        return;
    for (int how = CASE_FLIP; how <= CASE_SWAP; how++)
        spoiled_frames(g, &k, how);
    cv_gate_close(g);
}

static void test_half_handshake_dropped(void)
{
    char err[CV_ERRLEN];
    const cv_seal_key k = key_of(6);
    cv_gate *g = open_gate(&k, 0);
    CHECK(g != NULL);
    if (!g)
        return;
    gate_run r;
    gate_start(&r, g, DEADLINE_MS + MARGIN_MS);
    const int half = raw_connect(cv_gate_port(g)), silent = raw_connect(cv_gate_port(g));
    cv_seal_hs hs;
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES];
    CHECK(cv_seal_client_hello(&hs, hello, err, sizeof err) == 0 && write_all(half, hello, sizeof hello) == 0);
    CHECK(read_within(half, reply, sizeof reply, 1000) == sizeof reply);
    const int64_t t_half = ms_until_closed(half, DEADLINE_MS + MARGIN_MS);
    const int64_t t_silent = ms_until_closed(silent, MARGIN_MS);
    CHECKF(t_half >= DEADLINE_MS - 100 && t_half <= DEADLINE_MS + MARGIN_MS, "half handshake closed after %lld ms",
           (long long)t_half);
    CHECKF(t_silent >= 0, "a silent peer was not dropped (%lld)", (long long)t_silent);
    gate_join(&r);
    CHECK(r.rc == CV_LINK_TIMEOUT && !r.link);
    close(half);
    close(silent);
    cv_gate_close(g);
}

/* Idle sockets fill a small pending set; the oldest are dropped, and a real
 * client gets in at once. */
static void test_full_set_drops_oldest(void)
{
    char err[CV_ERRLEN];
    const cv_seal_key k = key_of(8);
    cv_gate *g = open_gate(&k, 4);
    CHECK(g != NULL);
    if (!g)
        return;
    gate_run r;
    gate_start(&r, g, 3000);
    int idle[6];
    for (int i = 0; i < 6; i++)
        idle[i] = raw_connect(cv_gate_port(g));
    usleep(100 * 1000);
    cv_link_opts co = cv_link_io_opts(2000);
    co.key = &k;
    cv_link *c = NULL;
    const int64_t t0 = cv_now_ms();
    CHECKF(cv_link_connect("127.0.0.1", cv_gate_port(g), 2000, &co, &c, err, sizeof err) == 0, "%s", err);
    gate_join(&r);
    CHECKF(r.rc == 0 && r.link && cv_now_ms() - t0 < DEADLINE_MS, "%s", r.err);
    CHECK(ms_until_closed(idle[0], 200) >= 0); /* the oldest was dropped at once */
    cv_link_close(c);
    cv_link_close(r.link);
    for (int i = 0; i < 6; i++)
        close(idle[i]);
    cv_gate_close(g);
}

/* Without a key the gate waits for a frame's first bytes. */
static void test_plaintext_gate(void)
{
    char err[CV_ERRLEN];
    cv_gate *g = open_gate(NULL, 0);
    CHECK(g != NULL);
    if (!g)
        return;
    const cv_seal_key k = key_of(9);
    gate_run r;
    gate_start(&r, g, 3000);
    const int junk = raw_connect(cv_gate_port(g));
    CHECK(write_all(junk, "GET / HTTP/1.0\r\n\r\n", 18) == 0);
    CHECK(ms_until_closed(junk, 1000) >= 0);
    cv_link_opts co = cv_link_io_opts(2000);
    co.key = &k; /* keyed client, plaintext gate: refused */
    cv_link *c = NULL;
    CHECK(cv_link_connect("127.0.0.1", cv_gate_port(g), 1000, &co, &c, err, sizeof err) != 0);
    CHECKF(has(err, "key handshake"), "%s", err);
    co.key = NULL;
    CHECK(cv_link_connect("127.0.0.1", cv_gate_port(g), 1000, &co, &c, err, sizeof err) == 0);
    CHECK(c && cv_link_send(c, CV_MSG_STATS, 3, NULL, 0, err, sizeof err) == 0);
    gate_join(&r);
    cv_frame f;
    CHECKF(r.rc == 0 && r.link, "%s", r.err);
    CHECK(r.link && cv_link_recv(r.link, 1000, &f, err, sizeof err) == 0 && f.h.type == CV_MSG_STATS);
    cv_link_close(c);
    cv_link_close(r.link);
    close(junk);
    cv_gate_close(g);
}

static void test_loopback(void)
{
    CHECK(cv_host_is_loopback("127.0.0.1") && cv_host_is_loopback("127.1.2.3") && cv_host_is_loopback("::1"));
    CHECK(cv_host_is_loopback("localhost"));
    CHECK(!cv_host_is_loopback("0.0.0.0") && !cv_host_is_loopback("10.0.0.5") && !cv_host_is_loopback(""));
    CHECK(!cv_host_is_loopback(NULL) && !cv_host_is_loopback("::"));
}

int main(void)
{
    TEST_RUN(test_handshake_steps);
    TEST_RUN(test_seal_open);
    TEST_RUN(test_key_files);
    TEST_RUN(test_keyed_links);
    TEST_RUN(test_wrong_key_refused);
    TEST_RUN(test_tampered_replayed_reordered);
    TEST_RUN(test_half_handshake_dropped);
    TEST_RUN(test_full_set_drops_oldest);
    TEST_RUN(test_plaintext_gate);
    TEST_RUN(test_loopback);
    return test_summary();
}
