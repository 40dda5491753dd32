/* test_attacks_work.c: a stage's work bounded for every peer (issue 33):
 *   batches of 16,384 rows; a shard claimed at 2^40 bytes, a .part
 *   symlinked out of the cache, transfers left unfinished; malformed and
 *   unexpected frames of each kind (each answered with its ERROR code);
 *   a flood of queries by reconnecting; a peer from another address (this
 *   machine's non-loopback one) naming loopback ports as the next node.
 * The stages, and the real head and resident memory judged after each
 * attack, are attack_test.h's; test_attacks.c holds the attacks that try
 * to hold or inflate a keyed stage (issue 13). */
#include <ifaddrs.h>
#include <poll.h>
#include <sys/stat.h>

#include "test.h"
#include "attack_test.h"

/* ---- issue 33: peer-sized work, the shard cache, error codes ---- */

/* A FORWARD of 16,384 rows: a HELLO that asks for batches of them is
 * refused by the stage's own batch limit (TOO_LARGE, naming it), so no
 * such FORWARD is ever computed (where the HELLO is taken, the attack
 * sends it and the real head waits behind its compute). */
static void batch_16384(void)
{
    char err[512];
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    uint8_t *buf;
    cv_msg_hello h = hello_of(true, &buf);
    h.n_batch_max = 16384;
    h.n_slot = 16;
    h.n_ctx = 1024;
    cv_msg_hello_ok ok;
    const int rc = cv_hello_ask(l, &h, 5000, &ok, err, sizeof err);
    free(buf);
    if (rc == 0)
        send_forward(l, 16384, CV_ACT_F32, 1024);
    CHECKF(rc != 0 && strstr(err, "(TOO_LARGE)") && strstr(err, "16384") && strstr(err, "limit of 512"),
           "a HELLO of 16384-row batches: %s", rc ? err : "taken (HELLO_OK), and its FORWARD computed");
    judge("key holder: a FORWARD of 16384 rows", rss0, 1);
    cv_link_close(l);
}

/* ---- the shard cache (node_cache: --cache, no model) ---- */

/* An assignment of every layer of an invented model (its hash all `tag`
 * bytes) to the cache node, into *h (the hashes in *buf: freed by the
 * caller); the shard's path in the cache. */
static cv_msg_hello invented_hello(uint8_t tag, uint8_t **buf, char *path, size_t len)
{
    cv_msg_hello h = hello_of(true, buf);
    memset(h.model_hash, tag, CV_HASH_BYTES);
    char hex[17];
    cv_hash_hex8(h.model_hash, hex);
    snprintf(path, len, "%s/%s.layers-0-%u.gguf", cache_dir, hex, h.n_layer);
    return h;
}

/* invented_hello's assignment, sent on l. */
static void invented_assignment(cv_link *l, uint8_t tag, char *path, size_t len)
{
    uint8_t *buf;
    const cv_msg_hello h = invented_hello(tag, &buf, path, len);
    send_hello(l, &h);
    free(buf);
}

/* The next frame on l within 2 s: its type, and an ERROR's text in err. */
static int next_frame(cv_link *l, char *err, size_t errlen)
{
    cv_frame f;
    if (cv_link_recv(l, 2000, &f, err, errlen))
        return 0;
    const int type = f.h.type;
    if (type == CV_MSG_ERROR)
        cv_error_frame_text(l, &f, err, errlen);
    else
        snprintf(err, errlen, "%s", cv_msg_type_name(type));
    cv_link_release(l, &f);
    return type;
}

/* Sends a SHIP of a 16-byte raw segment at offset of a file of size. */
static void send_ship(cv_link *l, uint64_t offset, uint64_t size)
{
    char err[512];
    uint8_t p[CV_SHIP_FIXED_SIZE + 9 + 16];
    size_t len;
    const cv_msg_ship m = {.offset = offset, .size = size};
    const uint64_t n = 16;
    CHECKF(cv_msg_ship_encode_header(&m, p, sizeof p, &len, err, sizeof err) == 0, "%s", err);
    p[len] = CV_PACK_RAW; /* codec/pack.h: kind, u64 length, the bytes */
    memcpy(p + len + 1, &n, 8);
    memset(p + len + 9, 0xab, n);
    CHECKF(cv_link_send(l, CV_MSG_SHIP, 0, p, sizeof p, err, sizeof err) == 0, "%s", err);
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A shard claimed at 2^40 bytes: refused (over the 256 MB budget and the
 * free disk) before a byte is written, with an ERROR that names it. */
static void shard_claim_2e40(void)
{
    char err[512], path[256], part[300];
    const long rss0 = rss_kb();
    cv_link *l = peer_connect(&node_cache);
    if (!l)
        return;
    invented_assignment(l, 0x40, path, sizeof path);
    snprintf(part, sizeof part, "%s.part", path);
    const int first = next_frame(l, err, sizeof err);
    CHECKF(first == CV_MSG_FETCH, "the assignment was answered %s", err);
    send_ship(l, 0, 1ull << 40);
    const int answer = next_frame(l, err, sizeof err);
    CHECKF(answer == CV_MSG_ERROR && strstr(err, "(NO_MEMORY)") && strstr(err, "1099511627776"),
           "a 2^40-byte shard was answered: %s", answer ? err : "nothing");
    CHECKF(!exists(part), "%s was written", part);
    cv_link_close(l);
    node_run *const cached[1] = {&node_cache};
    judge_on("key holder: a shard claimed at 2^40 bytes", rss0, cached, 1);
}

/* A .part that is a symbolic link out of the cache: refused, the file it
 * points to untouched. */
static void shard_part_symlink(void)
{
    char err[512], path[256], part[300], outside[300];
    const long rss0 = rss_kb();
    uint8_t *buf;
    const cv_msg_hello h = invented_hello(0x51, &buf, path, sizeof path);
    snprintf(part, sizeof part, "%s.part", path);
    snprintf(outside, sizeof outside, "%s.outside", cache_dir);
    FILE *fp = fopen(outside, "w");
    CHECK(fp && fputs("not the cache's", fp) >= 0 && fclose(fp) == 0);
    CHECK(symlink(outside, part) == 0);
    cv_link *l = peer_connect(&node_cache);
    if (l)
        send_hello(l, &h);
    free(buf);
    if (!l)
        return;
    const int first = next_frame(l, err, sizeof err);
    if (first == CV_MSG_FETCH) {
        send_ship(l, 0, 100);
        usleep(200000);
    }
    CHECKF(first == CV_MSG_ERROR && strstr(err, "symbolic link"), "a symlinked .part was answered: %s",
           first ? err : "nothing");
    size_t n = 0;
    char *kept = test_read_file(outside, &n);
    CHECKF(kept && !strcmp(kept, "not the cache's"), "the file the .part points to now holds %zu bytes", n);
    free(kept);
    unlink(part);
    unlink(outside);
    cv_link_close(l);
    node_run *const cached[1] = {&node_cache};
    judge_on("key holder: a .part symlinked out of the cache", rss0, cached, 1);
}

static bool in_cache(const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s", cache_dir, name);
    return exists(path);
}

/* Transfers begun for invented models and left: the .part of one just
 * left stays (a head may resume it), an hour-old one goes, at start (see
 * setup) and when a transfer is left; files of other names stay. */
static void shard_parts_abandoned(void)
{
    char err[512], path[256], part[300];
    const long rss0 = rss_kb();
    CHECKF(!in_cache("00000000000000a0.layers-0-5.gguf.part"), "an hour-old .part was kept at start");
    plant_part("00000000000000a1.layers-0-5.gguf.part", 3600);
    plant_part("notes.part", 3600);
    cv_link *l = peer_connect(&node_cache);
    if (!l)
        return;
    invented_assignment(l, 0x62, path, sizeof path);
    snprintf(part, sizeof part, "%s.part", path);
    const int first = next_frame(l, err, sizeof err);
    CHECKF(first == CV_MSG_FETCH, "the assignment was answered %s", err);
    send_ship(l, 0, 100);
    usleep(100000);
    cv_link_close(l); /* the transfer is left */
    usleep(300000);
    CHECKF(exists(part), "the .part of the transfer just left is gone");
    CHECKF(!in_cache("00000000000000a1.layers-0-5.gguf.part"), "an hour-old .part was kept");
    CHECKF(in_cache("notes.part"), "a file the cache did not name was removed");
    node_run *const cached[1] = {&node_cache};
    judge_on("key holder: shard transfers left unfinished", rss0, cached, 1);
}

/* ---- error codes (proto.h's ERROR) ---- */

/* Sends a frame on l and checks the ERROR that answers it names code. */
static void answered(cv_link *l, const char *what, uint16_t type, const void *payload, size_t len, const char *code)
{
    char err[512];
    int got = 0;
    if (cv_link_send(l, type, 3, payload, len, err, sizeof err) == 0)
        got = next_frame(l, err, sizeof err);
    CHECKF(got == CV_MSG_ERROR && strstr(err, code), "%s: expected an ERROR %s, got: %s", what, code,
           got ? err : "nothing");
}

/* The first frame of a handshake, each on a connection of its own. */
static void first_frame_answered(const char *what, uint16_t type, const void *payload, size_t len, const char *code)
{
    cv_link *l = holder_connect();
    if (l)
        answered(l, what, type, payload, len, code);
    cv_link_close(l);
}

/* Malformed and unexpected frames in a handshake and in a session: each
 * answered with the code proto.h gives it. */
static void error_codes(void)
{
    const long rss0 = rss_kb();
    uint8_t p[256] = {0}, *buf;
    size_t len;
    char err[512];
    first_frame_answered("a PING before HELLO", CV_MSG_PING, p, CV_MSG_PING_SIZE, "(BAD_STATE)");
    first_frame_answered("a HELLO of one byte", CV_MSG_HELLO, p, 1, "(BAD_FRAME)");
    first_frame_answered("a HELLO cut short", CV_MSG_HELLO, (const uint8_t[]){CV_PROTO_VERSION, 0, 0}, 3,
                         "(BAD_FRAME)");
    first_frame_answered("a HELLO of version 9", CV_MSG_HELLO, (const uint8_t[]){9, 0, 0}, 3, "(VERSION)");
    cv_link *l = holder_connect();
    if (!l)
        return;
    assign_all(l, 1, N_CTX, "", NULL);
    answered(l, "a PING of 5 bytes", CV_MSG_PING, p, 5, "(BAD_FRAME)");
    answered(l, "STATS with a payload", CV_MSG_STATS, p, 4, "(BAD_FRAME)");
    answered(l, "a FORWARD cut short", CV_MSG_FORWARD, p, 12, "(BAD_FRAME)");
    answered(l, "a SEQ_OP cut short", CV_MSG_SEQ_OP, p, 5, "(BAD_FRAME)");
    const uint8_t empty_result[16] = {[8] = 1}; /* no rows, a trail of one time */
    answered(l, "a RESULT to a node", CV_MSG_RESULT, empty_result, sizeof empty_result, "(BAD_STATE)");
    answered(l, "a SHIP in a session", CV_MSG_SHIP, p, 4, "(BAD_FRAME)");
    const cv_msg_hello h = hello_of(false, &buf);
    CHECK(cv_msg_hello_encode(&h, p, sizeof p, &len, err, sizeof err) == 0);
    answered(l, "a HELLO in a session", CV_MSG_HELLO, p, len, "(BAD_STATE)");
    cv_link_close(l);
    char path[256];
    l = peer_connect(&node_cache);
    if (l) { /* while the cache node receives */
        invented_assignment(l, 0x73, path, sizeof path);
        CHECKF(next_frame(l, err, sizeof err) == CV_MSG_FETCH, "the assignment was answered %s", err);
        answered(l, "a SHIP cut short", CV_MSG_SHIP, p, 8, "(BAD_FRAME)");
    }
    cv_link_close(l);
    if ((l = peer_connect(&node_cache)) != NULL) {
        invented_assignment(l, 0x74, path, sizeof path);
        CHECKF(next_frame(l, err, sizeof err) == CV_MSG_FETCH, "the assignment was answered %s", err);
        answered(l, "a PING while receiving a shard", CV_MSG_PING, p, CV_MSG_PING_SIZE, "(BAD_STATE)");
    }
    cv_link_close(l);
    judge("key holder: malformed and unexpected frames", rss0, 1);
}

/* A raw frame header (type, flags, payload length, checksum) on a new
 * plaintext connection to node_plain, then the payload; the node's answer
 * is an ERROR naming code. */
static void raw_frame_answered(const char *what, uint16_t type, uint32_t flags, uint32_t len, uint32_t checksum,
                               const char *code)
{
    uint8_t hdr[CV_FRAME_HEADER_SIZE], payload[16] = {0};
    cv_frame_header h = cv_frame_header_make(type, 1, payload, len <= sizeof payload ? len : 0);
    h.flags = flags;
    h.payload_len = len;
    h.checksum = checksum;
    cv_frame_header_encode(&h, hdr);
    const int s = raw_connect(node_plain.port);
    CHECK(s >= 0 && send(s, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr);
    if (len <= sizeof payload)
        CHECK(send(s, payload, len, 0) == (ssize_t)len);
    uint8_t in[CV_FRAME_HEADER_SIZE + 600];
    struct timeval tv = {.tv_sec = 2};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t got = 0;
    for (ssize_t r; got < sizeof in && (r = recv(s, in + got, sizeof in - got, 0)) > 0;)
        got += (size_t)r;
    cv_frame_header eh;
    cv_msg_error e = {0};
    char err[512] = "nothing";
    const bool ok = got >= CV_FRAME_HEADER_SIZE &&
                    cv_frame_header_decode(in, sizeof in, &eh, err, sizeof err) == 0 && eh.type == CV_MSG_ERROR &&
                    got >= CV_FRAME_HEADER_SIZE + eh.payload_len &&
                    cv_msg_error_decode(in + CV_FRAME_HEADER_SIZE, eh.payload_len, &e, err, sizeof err) == 0;
    CHECKF(ok && !strcmp(cv_perr_name(e.code), code), "%s: expected an ERROR %s, got %s: %s", what, code,
           ok ? cv_perr_name(e.code) : "none", ok ? e.message : err);
    close(s);
}

/* Frames a plaintext stage's link refuses at their header or checksum. */
static void error_codes_raw(void)
{
    const long rss0 = rss_kb();
    raw_frame_answered("an unknown type", 99, 0, 0, 0, "BAD_FRAME");
    raw_frame_answered("unknown flags", CV_MSG_PING, 4, 0, 0, "BAD_FRAME");
    raw_frame_answered("a checksum that does not match", CV_MSG_HELLO, 0, 16, 0x1234, "BAD_FRAME");
    raw_frame_answered("a 1 GB payload", CV_MSG_HELLO, 0, 1u << 30, 0, "BAD_FRAME");
    node_run *const plain[1] = {&node_plain};
    judge_on("stranger: malformed frames, plaintext", rss0, plain, 1);
}

/* ---- a next address on loopback, named by a peer from another host ---- */

/* This machine's first IPv4 address that is not loopback, as text. */
static bool outside_address(char *ip, size_t len)
{
    struct ifaddrs *ifs, *i;
    bool found = false;
    if (getifaddrs(&ifs))
        return false;
    for (i = ifs; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            const struct in_addr a = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
            found = (ntohl(a.s_addr) >> 24) != 127 && inet_ntop(AF_INET, &a, ip, (socklen_t)len) != NULL;
        }
    freeifaddrs(ifs);
    return found;
}

/* ---- a flood of queries by reconnecting ---- */

typedef struct flooder {
    volatile int stop;
    int answered, limited;
    char err[512];
    pthread_t t;
} flooder;

/* Connects to node_plain, asks one query, closes; again until stopped. */
static void *flood_main(void *arg)
{
    flooder *q = arg;
    uint8_t *buf;
    const cv_msg_hello h = hello_of(false, &buf);
    const cv_link_opts lo = cv_link_io_opts(2000);
    while (!q->stop) {
        cv_link *l = NULL;
        cv_msg_hello_ok ok;
        char err[512];
        if (cv_link_connect("127.0.0.1", node_plain.port, 1000, &lo, &l, err, sizeof err) == 0) {
            if (cv_hello_ask(l, &h, 2000, &ok, err, sizeof err) == 0)
                q->answered++;
            else if (strstr(err, "(RATE)"))
                q->limited++;
        }
        cv_link_close(l);
    }
    return NULL;
}

/* Query HELLOs on new connections from 127.0.0.1 as fast as they go, from
 * two threads for a second: the address is held to its rate; meanwhile a
 * head from this machine's other address (another host, to the stage) is
 * served, and one from the flood's own address a second after it stops. */
static void query_flood(void)
{
    const long rss0 = rss_kb();
    flooder q[2] = {{0}, {0}};
    for (int i = 0; i < 2; i++)
        pthread_create(&q[i].t, NULL, flood_main, &q[i]);
    usleep(500000);
    char ip[64];
    node_run *const plain[1] = {&node_plain};
    if (outside_address(ip, sizeof ip)) {
        head_host = ip;
        judge_on("stranger: a flood of queries, another head", rss0, plain, 1);
        head_host = "127.0.0.1";
    }
    usleep(500000);
    for (int i = 0; i < 2; i++) {
        q[i].stop = 1;
        pthread_join(q[i].t, NULL);
    }
    const int answered = q[0].answered + q[1].answered, limited = q[0].limited + q[1].limited;
    printf("%-42s %d queries answered, %d refused (RATE)\n", "stranger: a flood of queries", answered, limited);
    CHECKF(limited > 0, "%d queries answered in a second, none refused for the rate", answered);
    usleep(1000000);
    judge_on("stranger: a flood of queries, reconnecting", rss0, plain, 1);
}

/* An assignment to node_plain from `from` naming `next` as the next node:
 * refused (NEXT_NODE) without a connection to the listener s. */
static void next_refused(const char *from, const char *next, int s)
{
    char err[512];
    cv_link_opts lo = cv_link_io_opts(5000);
    cv_link *l = NULL;
    if (cv_link_connect(from, node_plain.port, 2000, &lo, &l, err, sizeof err)) {
        CHECKF(0, "cannot connect to %s:%d: %s", from, node_plain.port, err);
        return;
    }
    uint8_t *buf;
    cv_msg_hello h = hello_of(true, &buf);
    snprintf(h.next_addr, sizeof h.next_addr, "%s", next);
    cv_msg_hello_ok ok;
    const int rc = cv_hello_ask(l, &h, 5000, &ok, err, sizeof err);
    free(buf);
    cv_link_close(l);
    struct pollfd pf = {.fd = s, .events = POLLIN};
    const int probe = poll(&pf, 1, 0) == 1 ? accept(s, NULL, NULL) : -1;
    CHECKF(probe < 0, "a peer at %s made the stage connect to %s", from, next);
    if (probe >= 0)
        close(probe);
    CHECKF(rc != 0 && strstr(err, "(NEXT_NODE)") && strstr(err, "loopback"), "next %s from %s: %s", next, from,
           rc ? err : "HELLO_OK");
}

/* A plaintext stage with --insecure on every address: a peer that is not
 * on this machine names this machine's loopback ports as the next node. */
static void next_loopback_probe(void)
{
    char ip[64];
    if (!outside_address(ip, sizeof ip))
        SKIP("no IPv4 address besides loopback to come from");
    const long rss0 = rss_kb();
    const int port = test_free_port();
    int s = socket(AF_INET, SOCK_STREAM, 0);
    const struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(s, (const struct sockaddr *)&a, sizeof a) == 0 && listen(s, 4) == 0);
    const char *names[] = {"127.0.0.1", "0.0.0.0", "localhost", "127.9.9.9"};
    for (int i = 0; i < 4; i++) {
        char next[64];
        snprintf(next, sizeof next, "%s:%d", names[i], port);
        next_refused(ip, next, s);
    }
    close(s);
    node_run *const plain[1] = {&node_plain};
    judge_on("stranger from elsewhere: next node on loopback", rss0, plain, 1);
}

int main(void)
{
    const int rc = begin_attacks();
    if (rc >= 0)
        return rc;
    TEST_RUN(batch_16384);
    TEST_RUN(shard_claim_2e40);
    TEST_RUN(shard_part_symlink);
    TEST_RUN(shard_parts_abandoned);
    TEST_RUN(error_codes);
    TEST_RUN(error_codes_raw);
    TEST_RUN(query_flood);
    TEST_RUN(next_loopback_probe);
    return end_attacks();
}
