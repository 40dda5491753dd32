/* test_ship.c: layers shipped from a head to a node (src/pipe/ship.h)
 * over a loopback link, with stories260K.
 *
 * 1. The shard of layers [2, 5) sent by cv_ship_send and written by the
 *    receiving end is byte for byte the file `convoy split` writes for
 *    them (cv_shard_write), and so is one resumed from half of it (the
 *    sender starts at the boundary below what the .part holds).
 * 2. Hostile SHIP payloads are refused with a message, the .part kept
 *    within what was checked: a fixed part cut short, a start past the
 *    .part, a segment that is garbage, one that runs past the file, bytes
 *    after the segment, a second SHIP that does not follow the first.
 * 3. A claimed size over max_size or over the disk's free space is refused
 *    (NO_MEMORY) before the .part exists; a .part that is a symbolic link,
 *    or another name of a file (a hard link), is refused at open and the
 *    file it names is left as it was. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/err.h"
#include "model/llama.h"
#include "model/shard.h"
#include "pipe/ship.h"
#include "test.h"
#include "link_test.h"

static char model_path[1024];
static char dir[64];

typedef struct send_job {
    cv_link *l;
    const cv_llama *m;
    uint64_t have;
    int rc;
    char err[CV_ERRLEN];
} send_job;

static void *send_main(void *arg)
{
    send_job *j = arg;
    j->rc = cv_ship_send(j->l, 0, j->m, 2, 5, j->have, NULL, NULL, j->err, sizeof j->err);
    return NULL;
}

/* Ships layers [2, 5) into path (resuming from its .part) and checks it
 * equals `want`. */
static void ship_into(const cv_llama *m, const char *path, const char *want)
{
    cv_link *a, *b;
    const cv_link_opts o = cv_link_default_opts();
    if (test_link_pair(&o, &o, &a, &b)) {
        CHECK(0);
        return;
    }
    char err[CV_ERRLEN];
    cv_ship_rx rx;
    CHECKF(cv_ship_rx_open(&rx, path, 0, err, sizeof err) == 0, "%s", err);
    send_job j = {.l = a, .m = m, .have = rx.have};
    pthread_t t;
    pthread_create(&t, NULL, send_main, &j);
    bool done = false;
    while (!done) {
        cv_frame f;
        if (cv_link_recv(b, 5000, &f, err, sizeof err)) {
            CHECKF(0, "%s", err);
            break;
        }
        const int rc = cv_ship_rx_take(&rx, f.payload, f.h.payload_len, &done, err, sizeof err);
        cv_link_release(b, &f);
        CHECKF(rc == 0, "%s", err);
        if (rc)
            break;
    }
    pthread_join(t, NULL);
    CHECKF(j.rc == 0, "%s", j.err);
    cv_ship_rx_close(&rx);
    cv_link_close(a);
    cv_link_close(b);
    size_t n_got, n_want;
    char *got = test_read_file(path, &n_got), *exp = test_read_file(want, &n_want);
    CHECKF(got && exp && n_got == n_want && !memcmp(got, exp, n_got), "%s: %zu bytes, the split's %zu", path,
           got ? n_got : 0, exp ? n_want : 0);
    free(got);
    free(exp);
}

static void test_ship_is_the_split(void)
{
    char err[CV_ERRLEN], path[256], part[300], want[256];
    const int32_t counts[2] = {2, 3};
    if (!test_shared_path(model_path, sizeof model_path, "models/stories260K.gguf"))
        return;
    CHECKF(cv_shard_write(model_path, dir, 2, counts, NULL, NULL, err, sizeof err) == 0, "%s", err);
    snprintf(want, sizeof want, "%s/stories260K.shard-2-of-2.gguf", dir);
    cv_llama m;
    if (cv_llama_load(&m, model_path, 0, 0, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return;
    }
    snprintf(path, sizeof path, "%s/shipped.gguf", dir);
    snprintf(part, sizeof part, "%s.part", path);
    ship_into(&m, path, want);
    /* half of it kept as a .part: the rest comes from the boundary below */
    CHECK(truncate(path, 400000) == 0 && rename(path, part) == 0);
    ship_into(&m, path, want);
    struct stat st;
    CHECK(stat(part, &st) != 0); /* renamed once complete */
    cv_llama_free(&m);
}

/* A SHIP payload: offset, size, then `seg` (n bytes). */
static size_t ship_payload(uint8_t *p, uint64_t offset, uint64_t size, const void *seg, size_t n)
{
    memcpy(p, &offset, 8);
    memcpy(p + 8, &size, 8);
    memcpy(p + 16, seg, n);
    return 16 + n;
}

/* A raw segment of n bytes of `byte`. */
static size_t raw_segment(uint8_t *p, uint64_t n, uint8_t byte)
{
    p[0] = CV_PACK_RAW;
    memcpy(p + 1, &n, 8);
    memset(p + 9, byte, n);
    return 9 + n;
}

static void refused(const char *what, cv_ship_rx *rx, const uint8_t *p, size_t len, const char *needle)
{
    char err[CV_ERRLEN] = "";
    bool done;
    const int rc = cv_ship_rx_take(rx, p, len, &done, err, sizeof err);
    CHECKF(rc != 0 && strstr(err, needle), "%s: rc %d, '%s' (expected '%s')", what, rc, err, needle);
}

static void test_hostile_ships(void)
{
    char err[CV_ERRLEN], path[256];
    snprintf(path, sizeof path, "%s/hostile.gguf", dir);
    cv_ship_rx rx;
    CHECKF(cv_ship_rx_open(&rx, path, 0, err, sizeof err) == 0, "%s", err);
    static uint8_t p[64 + (1u << 20)];
    uint8_t seg[64];
    size_t n = raw_segment(seg, 16, 0xab);
    refused("cut short", &rx, p, ship_payload(p, 0, 100, seg, n) - n - 4, "SHIP");
    refused("past the .part", &rx, p, ship_payload(p, 10, 100, seg, n), "holds 0");
    refused("past the file", &rx, p, ship_payload(p, 0, 8, seg, n), "8-byte file");
    seg[0] = 7;
    refused("an unknown kind", &rx, p, ship_payload(p, 0, 100, seg, n), "kind");
    seg[0] = CV_PACK_RAW;
    refused("bytes after", &rx, p, ship_payload(p, 0, 100, seg, n + 3), "after it");
    bool done;
    CHECKF(cv_ship_rx_take(&rx, p, ship_payload(p, 0, 100, seg, n), &done, err, sizeof err) == 0 && !done, "%s",
           err);
    refused("not following", &rx, p, ship_payload(p, 0, 100, seg, n), "expected at 16");
    refused("another size", &rx, p, ship_payload(p, 16, 200, seg, n), "expected at 16 of 100");
    cv_ship_rx_close(&rx);
    struct stat st;
    char part[300];
    snprintf(part, sizeof part, "%s.part", path);
    CHECKF(stat(part, &st) == 0 && st.st_size == 16, "the .part holds %lld bytes, the one segment taken is 16",
           (long long)st.st_size);
}

static void test_ship_claims(void)
{
    char err[CV_ERRLEN], path[256], part[300], target[300];
    snprintf(path, sizeof path, "%s/claimed.gguf", dir);
    snprintf(part, sizeof part, "%s.part", path);
    static uint8_t p[64];
    uint8_t seg[64];
    const size_t n = raw_segment(seg, 16, 0xab);
    cv_ship_rx rx;
    CHECKF(cv_ship_rx_open(&rx, path, 1000, err, sizeof err) == 0, "%s", err);
    refused("over max_size", &rx, p, ship_payload(p, 0, 1001, seg, n), "memory budget of 1000");
    CHECK(rx.code == CV_PERR_NO_MEMORY);
    cv_ship_rx_close(&rx);
    CHECKF(cv_ship_rx_open(&rx, path, 0, err, sizeof err) == 0, "%s", err);
    refused("over the free disk", &rx, p, ship_payload(p, 0, 1ull << 62, seg, n), "bytes free");
    CHECK(rx.code == CV_PERR_NO_MEMORY);
    cv_ship_rx_close(&rx);
    struct stat st;
    CHECKF(lstat(part, &st) != 0, "a refused claim made %s", part);
    snprintf(target, sizeof target, "%s/target", dir);
    FILE *fp = fopen(target, "w");
    CHECK(fp && fputs("kept", fp) >= 0 && fclose(fp) == 0);
    CHECK(symlink(target, part) == 0);
    CHECKF(cv_ship_rx_open(&rx, path, 0, err, sizeof err) != 0 && strstr(err, "symbolic link"), "symlink: %s", err);
    cv_ship_rx_close(&rx);
    CHECK(unlink(part) == 0 && link(target, part) == 0);
    CHECKF(cv_ship_rx_open(&rx, path, 0, err, sizeof err) != 0 && strstr(err, "hard links"), "hard link: %s", err);
    cv_ship_rx_close(&rx);
    CHECK(stat(target, &st) == 0 && st.st_size == 4);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/convoy-test-ship-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    TEST_RUN(test_ship_is_the_split);
    TEST_RUN(test_hostile_ships);
    TEST_RUN(test_ship_claims);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? test_summary() : 1;
}
