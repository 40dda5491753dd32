/* test_attacks.c: a keyed stage that strangers and key holders cannot hold
 * or inflate (issue 13), attacked as a stranger over raw sockets and as a
 * key holder through the link API with crafted frames:
 *   half handshake, garbage, 200 idle connections, idle sockets at the
 *   second stage while a chain over both nodes is set up;
 *   query HELLOs repeated, an assignment then silence, 4096 slots x 8192
 *   positions, a FORWARD over the agreed size, a next address that is a
 *   closed port or a silent listener, a FORWARD of another activation type.
 * The stages, and the real head and resident memory judged after each
 * attack, are attack_test.h's; test_attacks_work.c holds the attacks on a
 * stage's work (issue 33). */
#include "test.h"
#include "attack_test.h"

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

static void oversized_forward(void)
{
    const long rss0 = rss_kb();
    cv_link *l = holder_connect();
    if (!l)
        return;
    assign_all(l, 1, N_CTX, "", NULL);
    send_forward(l, 200000, CV_ACT_F32, N_CTX); /* 52 MB: refused at its header */
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
    send_forward(l, 1, CV_ACT_F16, N_CTX);
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

int main(void)
{
    const int rc = begin_attacks();
    if (rc >= 0)
        return rc;
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
    return end_attacks();
}
