/* attack_test.h: the stages test_attacks.c and test_attacks_work.c attack,
 * a key holder's frames, and how an attack is judged (include after
 * test.h). In-process nodes (cv_node_serve in threads, on free loopback
 * ports, stories260K, a 256 MB budget): two keyed (a key from the seal
 * API), one keyed with --cache (no model: the head ships its layers), one
 * plaintext with --insecure on every address. begin_attacks starts them
 * and runs the first heads over them; end_attacks stops them and removes
 * their files. After each attack (its sockets still open where holding
 * them is the attack) judge checks that a real head (cv_chain_open, with
 * the key where the node has one, one cv_chain_step) is served within
 * REAL_HEAD_MS, and that the process's resident memory (VmRSS) grew by at
 * most RSS_SLACK_KB (under ASan RSS_SLACK_SANITIZED_KB) from before the
 * attack to after it. One line per attack gives both figures. */
#ifndef CONVOY_TESTS_ATTACK_TEST_H
#define CONVOY_TESTS_ATTACK_TEST_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "core/clock.h"
#include "model/fingerprint.h"
#include "model/llama.h"
#include "pipe/chain.h"
#include "pipe/node.h"
#include "pipe/wire.h"
#include "stage_test.h"

#define REAL_HEAD_MS 2000
#define RSS_SLACK_KB 4096 /* this process also runs the heads: malloc arenas and link threads move by ~1.5 MB */
/* Under ASan (CONVOY_SANITIZED), freed blocks wait in its quarantine while
 * still resident: a flood of short connections grew RSS by ~4.9 MB there. */
#define RSS_SLACK_SANITIZED_KB 16384

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
    const char *cache; /* --cache DIR: no model, the head ships the layers */
    bool plain;        /* no key: plaintext with --insecure, on every address */
    volatile sig_atomic_t stop;
    pthread_t t;
    int rc;
    char err[512];
} node_run;

static node_run node1, node2;
static char cache_dir[64];
static node_run node_cache = {.cache = cache_dir}, node_plain = {.plain = true};

static inline void *node_main(void *arg)
{
    node_run *r = arg;
    const cv_node_opts o = {.listen = r->listen, .model_path = r->cache ? NULL : model, .cache_dir = r->cache,
                            .mem_budget = 256u << 20, .n_threads = 1, .handshake_timeout_ms = 10000,
                            .io_timeout_ms = 30000, .stop = &r->stop, .key_file = r->plain ? NULL : key_path,
                            .insecure = r->plain};
    r->rc = cv_node_serve(&o, r->err, sizeof r->err);
    return NULL;
}

/* A raw TCP connection to port, or -1. */
static inline int raw_connect(int port)
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

static inline void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Starts a node and waits until it listens. */
static inline bool start_node(node_run *r)
{
    r->port = test_free_port();
    snprintf(r->listen, sizeof r->listen, "%s:%d", r->plain ? "0.0.0.0" : "127.0.0.1", r->port);
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

static inline void stop_node(node_run *r)
{
    r->stop = 1;
    pthread_join(r->t, NULL);
    CHECKF(r->rc == 0, "node on port %d: %s", r->port, r->err);
}

/* VmRSS of this process in KB (/proc files have no size to read by). */
static inline long rss_kb(void)
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

/* The address the real head reaches the nodes by: loopback, or for a head
 * from elsewhere this machine's other address (the plaintext node listens
 * on every address, and sees the head come from there). */
static const char *head_host = "127.0.0.1";

/* A real head over nodes[0 .. n_nodes) (keyed unless they are plaintext):
 * opened, one step. Returns the milliseconds it took, or -1 (reported). */
static inline double real_head_on(node_run *const *nodes, int n_nodes)
{
    char addr[2][64], err[512];
    const char *list[2];
    for (int i = 0; i < n_nodes; i++) {
        snprintf(addr[i], sizeof addr[i], "%s:%d", head_host, nodes[i]->port);
        list[i] = addr[i];
    }
    cv_chain_opts o = cv_chain_default_opts();
    o.nodes = list;
    o.n_nodes = n_nodes;
    o.n_ctx = N_CTX;
    o.n_batch = N_BATCH;
    o.key = nodes[0]->plain ? NULL : &key;
    o.insecure = nodes[0]->plain;
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

/* A real head over node1 (and node2). */
static inline double real_head(int n_nodes)
{
    node_run *const both[2] = {&node1, &node2};
    return real_head_on(both, n_nodes);
}

/* The real head over nodes after an attack, within REAL_HEAD_MS, and the
 * memory from rss0 (before the attack) to now. */
static inline void judge_on(const char *attack, long rss0, node_run *const *nodes, int n_nodes)
{
    const double ms = real_head_on(nodes, n_nodes);
    const long grew = rss_kb() - rss0;
    printf("%-42s real head served in %6.0f ms, resident memory %+6ld KB\n", attack, ms, grew);
    CHECKF(rss0 > 0, "no VmRSS in /proc/self/status");
    CHECKF(ms >= 0 && ms < REAL_HEAD_MS, "%s: the real head took %.0f ms", attack, ms);
    const long slack = getenv("CONVOY_SANITIZED") ? RSS_SLACK_SANITIZED_KB : RSS_SLACK_KB;
    CHECKF(grew <= slack, "%s: resident memory grew by %ld KB", attack, grew);
}

/* judge_on node1 (and node2). */
static inline void judge(const char *attack, long rss0, int n_nodes)
{
    node_run *const both[2] = {&node1, &node2};
    judge_on(attack, rss0, both, n_nodes);
}

/* ---- a key holder's frames ---- */

/* A peer of node r: a key holder, or anyone when r is plaintext. */
static inline cv_link *peer_connect(const node_run *r)
{
    char err[512];
    cv_link_opts lo = cv_link_io_opts(5000);
    lo.key = r->plain ? NULL : &key;
    cv_link *l = NULL;
    if (cv_link_connect("127.0.0.1", r->port, 2000, &lo, &l, err, sizeof err)) {
        CHECKF(0, "key holder cannot connect: %s", err);
        return NULL;
    }
    return l;
}

static inline cv_link *holder_connect(void) { return peer_connect(&node1); }

/* A head's HELLO for this model: a query (l1 = 0) or an assignment of
 * every layer, with the tensor hashes in *buf (freed by the caller). */
static inline cv_msg_hello hello_of(bool assign, uint8_t **buf)
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
static inline void send_hello(cv_link *l, const cv_msg_hello *h)
{
    char err[512];
    uint8_t buf[16384];
    size_t len;
    CHECKF(cv_msg_hello_encode(h, buf, sizeof buf, &len, err, sizeof err) == 0 &&
               cv_link_send(l, CV_MSG_HELLO, 0, buf, len, err, sizeof err) == 0,
           "%s", err);
}

/* The next frame on l within ms: an ERROR whose text contains want. */
static inline void expect_error(cv_link *l, int ms, const char *want)
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
static inline void assign_all(cv_link *l, uint32_t n_slot, uint32_t n_ctx, const char *next, const char *want_error)
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


/* A FORWARD of rows rows of act_type after a 4-row f32 assignment: each
 * slot's rows at positions 0 .. per_slot - 1, so a session that took the
 * batch would compute every row. */
static inline void send_forward(cv_link *l, uint32_t rows, uint32_t act_type, uint32_t per_slot)
{
    char err[512];
    const size_t n_embd = (size_t)meta.hp.n_embd;
    cv_fwd_token *tok = calloc(rows, sizeof *tok);
    for (uint32_t i = 0; i < rows; i++)
        tok[i] = (cv_fwd_token){.token = 1 + (int32_t)(i % 300), .seq = (int32_t)(i / per_slot),
                                .pos = (int32_t)(i % per_slot), .want = i + 1 == rows};
    void *act = calloc(rows * n_embd, sizeof(float));
    const cv_msg_forward m = {.n_embd = (uint32_t)n_embd, .act_type = (uint8_t)act_type, .flags = CV_FWD_HAS_HIDDEN};
    /* the fixed part of a 1-row FORWARD with the attack's count (its first
     * field): records and activations go as parts of their own */
    uint8_t header[CV_FWD_FIXED_SIZE + sizeof *tok];
    size_t len;
    const cv_msg_forward one = {.n_tokens = 1, .n_embd = m.n_embd, .act_type = m.act_type, .flags = m.flags,
                                .tokens = tok, .act = act};
    CHECKF(cv_msg_forward_encode_header(&one, header, sizeof header, &len, err, sizeof err) == 0, "%s", err);
    memcpy(header, &rows, sizeof rows);
    const struct iovec parts[3] = {{header, CV_FWD_FIXED_SIZE},
                                   {tok, rows * sizeof *tok},
                                   {act, (size_t)cv_act_bytes(act_type, rows, n_embd)}};
    uint64_t ticket;
    if (cv_link_sendv(l, CV_MSG_FORWARD, 7, parts, 3, &ticket, err, sizeof err) == 0)
        cv_link_wait_sent(l, ticket, err, sizeof err); /* the node may close first: its answer says */
    free(tok);
    free(act);
}

/* A .part of the cache's naming, written `age_s` seconds ago. */
static inline void plant_part(const char *name, int age_s)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s", cache_dir, name);
    FILE *fp = fopen(path, "w");
    CHECK(fp && fputs("an unfinished shard", fp) >= 0 && fclose(fp) == 0);
    const struct timeval t[2] = {{.tv_sec = time(NULL) - age_s}, {.tv_sec = time(NULL) - age_s}};
    CHECK(utimes(path, t) == 0);
}

static inline void warm_up(void)
{
    /* the first heads touch what every later one reuses: not counted (the
     * cache node receives its layers here) */
    node_run *const cached[1] = {&node_cache}, *const plain[1] = {&node_plain};
    CHECK(real_head(2) >= 0 && real_head(1) >= 0);
    CHECK(real_head_on(cached, 1) >= 0 && real_head_on(plain, 1) >= 0);
    judge("no attack", rss_kb(), 1);
}

static inline void model_present(void) { test_shared_path(model, sizeof model, "models/stories260K.gguf"); }

/* The cache node, in a new directory that holds an hour-old .part (gone
 * once it has started: see shard_parts_abandoned). */
static inline bool start_cache_node(void)
{
    snprintf(cache_dir, sizeof cache_dir, "/tmp/convoy-attacks-cache-XXXXXX");
    if (!mkdtemp(cache_dir))
        return false;
    plant_part("00000000000000a0.layers-0-5.gguf.part", 3600);
    return start_node(&node_cache);
}

static inline bool setup(char *err, size_t errlen)
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
           start_node(&node1) && start_node(&node2) && start_cache_node() && start_node(&node_plain);
}

/* A test's opening: -1 when the nodes are up and warm and the attacks may
 * begin, else main's exit status (no model: the summary; no setup: 1). */
static inline int begin_attacks(void)
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
    return -1;
}

/* A test's close: stops the nodes, removes the key and the cache, and
 * gives main's exit status. */
static inline int end_attacks(void)
{
    stop_node(&node1);
    stop_node(&node2);
    stop_node(&node_cache);
    stop_node(&node_plain);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", cache_dir);
    CHECK(system(rm) == 0);
    unlink(key_path);
    *strrchr(key_path, '/') = 0;
    rmdir(key_path);
    cv_model_hashes_free(&hashes);
    cv_llama_free(&meta);
    return test_summary();
}

#endif
