/* test_attacks.c: a keyed stage that strangers and key holders cannot hold
 * or inflate (issue 13). Two in-process nodes (cv_node_serve in threads, on
 * free loopback ports, stories260K, a key from the seal API, a 256 MB
 * budget) are attacked, as a stranger over raw sockets and as a key holder
 * through the link API with crafted frames:
 *   half handshake, garbage, 200 idle connections, idle sockets at the
 *   second stage while a chain over both nodes is set up;
 *   query HELLOs repeated, an assignment then silence, 4096 slots x 8192
 *   positions, a FORWARD over the agreed size, a next address that is a
 *   closed port or a silent listener, a FORWARD of another activation type.
 * After each (its sockets still open where holding them is the attack) a
 * real head (cv_chain_open with the key, one cv_chain_step) is served
 * within REAL_HEAD_MS, and the process's resident memory (VmRSS) grew by at
 * most RSS_SLACK_KB from before the attack to after it. One line per
 * attack gives both figures. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include "core/clock.h"
#include "model/fingerprint.h"
#include "model/llama.h"
#include "pipe/chain.h"
#include "pipe/node.h"
#include "pipe/wire.h"
#include "test.h"
#include "stage_test.h"

#define REAL_HEAD_MS 2000
#define RSS_SLACK_KB 4096 /* this process also runs the heads: malloc arenas and link threads move by ~1.5 MB */

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer keeps freed blocks in quarantine, resident: the
 * attacker's own 52 MB would count as the node's. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=0"; }
#endif
#define N_BATCH 4
#define N_CTX 64

static char model[512], key_path[600];
static cv_seal_key key;
static cv_llama meta;
static cv_model_hashes hashes;

typedef struct node_run {
    int port;
    char listen[64];
    volatile sig_atomic_t stop;
    pthread_t t;
    int rc;
    char err[512];
} node_run;

static node_run node1, node2;

static void *node_main(void *arg)
{
    node_run *r = arg;
    const cv_node_opts o = {.listen = r->listen, .model_path = model, .mem_budget = 256u << 20, .n_threads = 1,
                            .handshake_timeout_ms = 10000, .io_timeout_ms = 30000, .stop = &r->stop,
                            .key_file = key_path};
    r->rc = cv_node_serve(&o, r->err, sizeof r->err);
    return NULL;
}


/* A raw TCP connection to port, or -1. */
static int raw_connect(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    const struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (const struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    return s;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Starts a node and waits until it listens. */
static bool start_node(node_run *r)
{
    r->port = test_free_port();
    snprintf(r->listen, sizeof r->listen, "127.0.0.1:%d", r->port);
    if (pthread_create(&r->t, NULL, node_main, r))
        return false;
    for (int i = 0; i < 200; i++) {
        const int s = raw_connect(r->port);
        if (s >= 0) {
            close(s);
            return true;
        }
        usleep(20000);
    }
    return false;
}

static void stop_node(node_run *r)
{
    r->stop = 1;
    pthread_join(r->t, NULL);
    CHECKF(r->rc == 0, "node on port %d: %s", r->port, r->err);
}

/* VmRSS of this process in KB (/proc files have no size to read by). */
static long rss_kb(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (fp && kb < 0 && fgets(line, sizeof line, fp))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtol(line + 6, NULL, 10);
    if (fp)
        fclose(fp);
    return kb;
}

/* A real head over the nodes (1 or 2): opened with the key, one step.
 * Returns the milliseconds it took, or -1 (reported). */
static double real_head(int n_nodes)
{
    char a1[64], a2[64], err[512];
    snprintf(a1, sizeof a1, "127.0.0.1:%d", node1.port);
    snprintf(a2, sizeof a2, "127.0.0.1:%d", node2.port);
    const char *nodes[2] = {a1, a2};
    cv_chain_opts o = cv_chain_default_opts();
    o.nodes = nodes;
    o.n_nodes = n_nodes;
    o.n_ctx = N_CTX;
    o.n_batch = N_BATCH;
    o.key = &key;
    o.hashes = &hashes;
    const uint64_t t0 = cv_now_ns();
    cv_chain *c = NULL;
    int32_t tok[2] = {1, 400}, pos[2] = {0, 1}, seq[2] = {0, 0}, next = -1;
    uint8_t want[2] = {0, 1};
    const cv_batch b = {.n_tokens = 2, .token = tok, .pos = pos, .seq = seq, .want = want};
    const int rc = cv_chain_open(&c, model, &o, err, sizeof err) || cv_chain_step(c, &b, &next, err, sizeof err);
    const double ms = (double)(cv_now_ns() - t0) / 1e6;
    cv_chain_close(c);
    CHECKF(rc == 0 && next >= 0, "the real head was not served: %s", rc ? err : "no token");
    return rc ? -1 : ms;
}

/* The real head after an attack, within REAL_HEAD_MS, and the memory from
 * rss0 (before the attack) to now. */
static void judge(const char *attack, long rss0, int n_nodes)
{
    const double ms = real_head(n_nodes);
    const long grew = rss_kb() - rss0;
    printf("%-42s real head served in %6.0f ms, resident memory %+6ld KB\n", attack, ms, grew);
    CHECKF(rss0 > 0, "no VmRSS in /proc/self/status");
    CHECKF(ms >= 0 && ms < REAL_HEAD_MS, "%s: the real head took %.0f ms", attack, ms);
    CHECKF(grew <= RSS_SLACK_KB, "%s: resident memory grew by %ld KB", attack, grew);
}

/* ---- a key holder's frames ---- */

static cv_link *holder_connect(void)
{
    char err[512];
    cv_link_opts lo = cv_link_io_opts(5000);
    lo.key = &key;
    cv_link *l = NULL;
    if (cv_link_connect("127.0.0.1", node1.port, 2000, &lo, &l, err, sizeof err)) {
        CHECKF(0, "key holder cannot connect: %s", err);
        return NULL;
    }
    return l;
}

/* A head's HELLO for this model: a query (l1 = 0) or an assignment of
 * every layer, with the tensor hashes in *buf (freed by the caller). */
static cv_msg_hello hello_of(bool assign, uint8_t **buf)
{
    cv_msg_hello h = {.proto_version = CV_PROTO_VERSION, .role = CV_ROLE_HEAD, .act_type = CV_ACT_F32,
                      .n_layer = (uint32_t)meta.hp.n_layer, .n_ctx = N_CTX, .n_slot = 1, .n_batch_max = N_BATCH,
                      .n_embd = (uint32_t)meta.hp.n_embd, .max_payload = CV_PROTO_DEFAULT_MAX_PAYLOAD,
                      .cluster_id = 0x5eed};
    memcpy(h.model_hash, hashes.meta, CV_HASH_BYTES);
    *buf = NULL;
    if (!assign)
        return h;
    h.l1 = h.n_layer;
    uint64_t *idx = malloc(sizeof *idx * cv_llama_span_tensors_max(h.l1));
    const size_t n = cv_llama_span_tensors(&meta, 0, (int32_t)h.l1, idx);
    *buf = malloc(n * CV_HASH_BYTES);
    for (size_t i = 0; i < n; i++)
        memcpy(*buf + i * CV_HASH_BYTES, hashes.tensor[idx[i]], CV_HASH_BYTES);
    free(idx);
    h.n_hashes = (uint32_t)n;
    h.hashes = *buf;
    return h;
}

/* Sends h without waiting for the answer. */
static void send_hello(cv_link *l, const cv_msg_hello *h)
{
    char err[512];
    uint8_t buf[16384];
    size_t len;
    CHECKF(cv_msg_hello_encode(h, buf, sizeof buf, &len, err, sizeof err) == 0 &&
               cv_link_send(l, CV_MSG_HELLO, 0, buf, len, err, sizeof err) == 0,
           "%s", err);
}

/* The next frame on l within ms: an ERROR whose text contains want. */
static void expect_error(cv_link *l, int ms, const char *want)
{
    char err[512];
    cv_frame f;
    const int rc = cv_link_recv(l, ms, &f, err, sizeof err);
    if (rc == 0) {
        if (f.h.type == CV_MSG_ERROR)
            cv_error_frame_text(l, &f, err, sizeof err);
        else
            snprintf(err, sizeof err, "%s", cv_msg_type_name(f.h.type));
        cv_link_release(l, &f);
    }
    CHECKF(rc == 0 && strstr(err, want), "expected an ERROR with \"%s\", got: %s", want, err);
}

/* An assignment of every layer, answered HELLO_OK (or an ERROR naming
 * want_error). */
static void assign_all(cv_link *l, uint32_t n_slot, uint32_t n_ctx, const char *next, const char *want_error)
{
    char err[512];
    uint8_t *buf;
    cv_msg_hello h = hello_of(true, &buf);
    h.n_slot = n_slot;
    h.n_ctx = n_ctx;
    snprintf(h.next_addr, sizeof h.next_addr, "%s", next);
    cv_msg_hello_ok ok;
    const int rc = cv_hello_ask(l, &h, 5000, &ok, err, sizeof err);
    free(buf);
    if (want_error)
        CHECKF(rc != 0 && strstr(err, want_error), "expected %s, got: %s", want_error, rc ? err : "HELLO_OK");
    else
        CHECKF(rc == 0, "assignment refused: %s", err);
}

/* ---- the attacks ---- */

static void half_handshake(void)
{
    const long rss0 = rss_kb();
    uint8_t hello[CV_SEAL_HELLO_BYTES] = "CVK1";
    for (int i = 4; i < CV_SEAL_HELLO_BYTES; i++)
        hello[i] = (uint8_t)(i * 37);
    int s = raw_connect(node1.port);
    CHECK(s >= 0 && send(s, hello, sizeof hello, 0) == (ssize_t)sizeof hello);
    judge("stranger: half a key handshake", rss0, 1);
    close_all(&s, 1);
}

static void garbage(void)
{
    const long rss0 = rss_kb();
    int s = raw_connect(node1.port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(s >= 0 && send(s, junk, sizeof junk - 1, 0) > 0);
    judge("stranger: garbage", rss0, 1);
    close_all(&s, 1);
}

static void idle_connections(void)
{
    enum { N = 200 };
    int fds[N];
    const long rss0 = rss_kb();
    for (int i = 0; i < N; i++)
        fds[i] = raw_connect(node1.port);
    judge("stranger: 200 idle connections", rss0, 1);
    close_all(fds, N);
}

static void idle_at_second_stage(void)
{
    enum { N = 8 };
    int fds[N];
    const long rss0 = rss_kb();
    for (int i = 0; i < N; i++)
        fds[i] = raw_connect(node2.port);
    judge("stranger: 8 idle sockets at stage 2", rss0, 2);
    close_all(fds, N);
}

typedef struct querier {
    volatile int stop;
    int answered;
    char err[512];
    pthread_t t;
} querier;

/* A key holder asking a query every 100 ms until stopped or cut off. */
static void *query_main(void *arg)
{
    querier *q = arg;
    cv_link *l = holder_connect();
    uint8_t *buf;
    const cv_msg_hello h = hello_of(false, &buf);
    cv_msg_hello_ok ok;
    while (l && !q->stop && cv_hello_ask(l, &h, 5000, &ok, q->err, sizeof q->err) == 0) {
        q->answered++;
        usleep(100000);
    }
    cv_link_close(l);
    return NULL;
}

static void repeated_queries(void)
{
    const long rss0 = rss_kb();
    querier q = {0};
    pthread_create(&q.t, NULL, query_main, &q);
    usleep(150000); /* it holds the node */
    judge("key holder: query HELLOs repeated", rss0, 1);
    q.stop = 1;
    pthread_join(q.t, NULL);
    CHECKF(q.answered >= 1 && q.err[0], "the querier was answered %d times and never cut off", q.answered);
}

static void assignment_then_silence(void)
{
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    assign_all(l, 1, N_CTX, "", NULL);
    judge("key holder: an assignment, then silence", rss0, 1);
    expect_error(l, 1000, "(TIMEOUT)"); /* it was told why it lost the node */
    cv_link_close(l);
}

static void huge_hello(void)
{
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    assign_all(l, 4096, 8192, "", "(NO_MEMORY)");
    judge("key holder: 4096 slots x 8192 positions", rss0, 1);
    cv_link_close(l);
}

/* A FORWARD of rows rows of act_type after a 4-row f32 assignment. */
static void send_forward(cv_link *l, uint32_t rows, uint32_t act_type)
{
    char err[512];
    const size_t n_embd = (size_t)meta.hp.n_embd;
    cv_fwd_token *tok = calloc(rows, sizeof *tok);
    void *act = calloc(rows * n_embd, sizeof(float));
    const cv_msg_forward m = {.n_embd = (uint32_t)n_embd, .act_type = (uint8_t)act_type, .flags = CV_FWD_HAS_HIDDEN};
    /* the fixed part of a 1-row FORWARD with the attack's count (its first
     * field): records and activations go as parts of their own */
    uint8_t head[CV_FWD_FIXED_SIZE + sizeof *tok];
    size_t len;
    const cv_msg_forward one = {.n_tokens = 1, .n_embd = m.n_embd, .act_type = m.act_type, .flags = m.flags,
                                .tokens = tok, .act = act};
    CHECKF(cv_msg_forward_encode_head(&one, head, sizeof head, &len, err, sizeof err) == 0, "%s", err);
    memcpy(head, &rows, sizeof rows);
    const struct iovec parts[3] = {{head, CV_FWD_FIXED_SIZE},
                                   {tok, rows * sizeof *tok},
                                   {act, (size_t)cv_act_bytes(act_type, rows, n_embd)}};
    uint64_t ticket;
    if (cv_link_sendv(l, CV_MSG_FORWARD, 7, parts, 3, &ticket, err, sizeof err) == 0)
        cv_link_wait_sent(l, ticket, err, sizeof err); /* the node may close first: its answer says */
    free(tok);
    free(act);
}

static void oversized_forward(void)
{
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    assign_all(l, 1, N_CTX, "", NULL);
    send_forward(l, 200000, CV_ACT_F32); /* 52 MB: refused at its header */
    expect_error(l, 2000, "(BAD_FRAME)");
    cv_link_close(l);
    judge("key holder: a 52 MB FORWARD", rss0, 1);
}

static void next_closed_port(void)
{
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    char next[64];
    snprintf(next, sizeof next, "127.0.0.1:%d", test_free_port());
    assign_all(l, 1, N_CTX, next, "(NEXT_NODE)");
    judge("key holder: next address a closed port", rss0, 1);
    cv_link_close(l);
}

static void next_silent_listener(void)
{
    const long rss0 = rss_kb();
    const int port = test_free_port();
    int s = socket(AF_INET, SOCK_STREAM, 0);
    const struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(s, (const struct sockaddr *)&a, sizeof a) == 0 && listen(s, 4) == 0); /* accepts, says nothing */
    cv_link *l = holder_connect();
    if (!l)
        return;
    uint8_t *buf;
    cv_msg_hello h = hello_of(true, &buf);
    snprintf(h.next_addr, sizeof h.next_addr, "127.0.0.1:%d", port);
    send_hello(l, &h); /* the real head comes at once */
    free(buf);
    judge("key holder: next address a silent listener", rss0, 1);
    expect_error(l, 1000, "(NEXT_NODE)");
    cv_link_close(l);
    close(s);
}

static void foreign_act_type(void)
{
    char err[512];
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    assign_all(l, 1, N_CTX, "", NULL);
    send_forward(l, 1, CV_ACT_F16);
    expect_error(l, 2000, "(ACT_TYPE)");
    cv_frame f;
    cv_msg_stats st = {.steps = 99};
    const bool asked = cv_link_send(l, CV_MSG_STATS, 8, NULL, 0, err, sizeof err) == 0 &&
                       cv_link_recv(l, 2000, &f, err, sizeof err) == 0;
    CHECKF(asked && f.h.type == CV_MSG_STATS_OK && cv_msg_stats_decode(f.payload, f.h.payload_len, &st, err,
                                                                       sizeof err) == 0 && st.steps == 0,
           "the f16 FORWARD was computed (%llu steps) or STATS failed: %s", (unsigned long long)st.steps, err);
    if (asked)
        cv_link_release(l, &f);
    judge("key holder: a FORWARD of f16 (f32 agreed)", rss0, 1); /* the session is held, silent */
    cv_link_close(l);
}

static void warm_up(void)
{
    /* the first heads touch what every later one reuses: not counted */
    CHECK(real_head(2) >= 0 && real_head(1) >= 0);
    judge("no attack", rss_kb(), 1);
}

static void model_present(void) { test_shared_path(model, sizeof model, "models/stories260K.gguf"); }

static bool setup(char *err, size_t errlen)
{
    char dir[] = "/tmp/convoy-attacks-XXXXXX";
    bool cached;
    char note[1024];
    if (!mkdtemp(dir))
        return false;
    snprintf(key_path, sizeof key_path, "%s/key", dir);
    return cv_seal_key_generate(key_path, err, errlen) == 0 && cv_seal_key_load(key_path, &key, err, errlen) == 0 &&
           cv_llama_load(&meta, model, 0, 0, err, errlen) == 0 &&
           cv_model_hashes_load(&meta.gguf, model, 1, &hashes, &cached, note, sizeof note, err, errlen) == 0 &&
           start_node(&node1) && start_node(&node2);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    TEST_RUN(model_present);
    if (access(model, R_OK))
        return test_summary();
    char err[512] = "";
    if (!setup(err, sizeof err)) {
        fprintf(stderr, "setup failed: %s\n", err);
        return 1;
    }
    TEST_RUN(warm_up);
    TEST_RUN(half_handshake);
    TEST_RUN(garbage);
    TEST_RUN(idle_connections);
    TEST_RUN(idle_at_second_stage);
    TEST_RUN(repeated_queries);
    TEST_RUN(assignment_then_silence);
    TEST_RUN(huge_hello);
    TEST_RUN(oversized_forward);
    TEST_RUN(next_closed_port);
    TEST_RUN(next_silent_listener);
    TEST_RUN(foreign_act_type);
    stop_node(&node1);
    stop_node(&node2);
    unlink(key_path);
    *strrchr(key_path, '/') = 0;
    rmdir(key_path);
    cv_model_hashes_free(&hashes);
    cv_llama_free(&meta);
    return test_summary();
}
