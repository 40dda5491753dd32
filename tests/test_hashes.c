/* test_hashes.c: a model's content hashes and their cache.
 *
 * Tiny synthetic models in a temporary folder: the hashes follow the
 * weights (another seed changes the matrices' hashes, not the norms' or the
 * metadata's) and do not depend on the thread count; the cache beside the
 * model is written on the first load and read on the second; a model
 * touched since (a new mtime) or replaced by a copy (a new inode) is hashed
 * again; a cache that is truncated, damaged in one byte or garbage is
 * ignored and rewritten, and the hashes are the true ones every time. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "core/err.h"
#include "model/fingerprint.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "test.h"

static char dir[256];

static void model_path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

static int synth(const char *name, uint64_t seed)
{
    char path[512], err[CV_ERRLEN];
    cv_synth_params p;
    cv_synth_defaults(&p);
    model_path(path, sizeof path, name);
    p.seed = seed;
    p.type = CV_TYPE_Q8_0;
    if (cv_synth_preset(&p, "tiny", err, sizeof err) || cv_synth_write(&p, path, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "synth %s: %s\n", name, err);
        return -1;
    }
    return 0;
}

/* Loads the hashes of model `name` (opening it anew, as a process would):
 * 0 and *cached, or -1. */
static int load(const char *name, cv_model_hashes *h, bool *cached)
{
    char path[512], err[CV_ERRLEN], note[2 * CV_ERRLEN];
    gguf_file f;
    model_path(path, sizeof path, name);
    if (cv_gguf_open(&f, path, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    const int rc = cv_model_hashes_load(&f, path, 2, h, cached, note, sizeof note, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s\n", err);
    cv_gguf_close(&f);
    return rc;
}

static bool same(const cv_model_hashes *a, const cv_model_hashes *b)
{
    return a->n_tensors == b->n_tensors && !memcmp(a->meta, b->meta, CV_HASH_BYTES) &&
           !memcmp(a->tensor, b->tensor, (size_t)a->n_tensors * CV_HASH_BYTES);
}

static cv_model_hashes truth; /* a.gguf's, computed without a cache */

static void test_hashes_follow_the_weights(void)
{
    char path[512], err[CV_ERRLEN];
    gguf_file a, b;
    model_path(path, sizeof path, "a.gguf");
    CHECKF(cv_gguf_open(&a, path, err, sizeof err) == 0, "%s", err);
    model_path(path, sizeof path, "seed2.gguf");
    CHECKF(cv_gguf_open(&b, path, err, sizeof err) == 0, "%s", err);
    cv_model_hashes one, hb;
    CHECK(cv_model_hashes_compute(&a, 1, &truth, err, sizeof err) == 0);
    CHECK(cv_model_hashes_compute(&a, 3, &one, err, sizeof err) == 0);
    CHECK(cv_model_hashes_compute(&b, 2, &hb, err, sizeof err) == 0);
    CHECK(same(&truth, &one));
    /* seeds change only general.description, which is descriptive */
    CHECK(!memcmp(truth.meta, hb.meta, CV_HASH_BYTES));
    int differ = 0, norms_same = 0;
    for (uint64_t i = 0; i < a.n_tensors; i++) {
        const bool eq = !memcmp(truth.tensor[i], hb.tensor[i], CV_HASH_BYTES);
        const bool norm = a.tensors[i].n_dims == 1; /* synth's only vectors */
        differ += !eq && !norm;
        norms_same += eq && norm;
    }
    CHECKF(differ == 5 * 7 + 2 && norms_same == 5 * 2 + 1, "%d matrices differ, %d norms equal", differ, norms_same);
    /* no two tensors of one file hash alike, even equal norms: the name counts */
    for (uint64_t i = 1; i < a.n_tensors; i++)
        CHECK(memcmp(truth.tensor[i], truth.tensor[i - 1], CV_HASH_BYTES) != 0);
    cv_model_hashes_free(&one);
    cv_model_hashes_free(&hb);
    cv_gguf_close(&a);
    cv_gguf_close(&b);
}

static void test_cache_hit(void)
{
    cv_model_hashes h;
    bool cached = true;
    CHECK(load("a.gguf", &h, &cached) == 0 && !cached && same(&h, &truth));
    cv_model_hashes_free(&h);
    char path[512];
    struct stat st;
    model_path(path, sizeof path, "a.gguf.convoy-hashes");
    CHECKF(stat(path, &st) == 0, "no cache beside the model: %s", strerror(errno));
    CHECK(load("a.gguf", &h, &cached) == 0 && cached && same(&h, &truth));
    cv_model_hashes_free(&h);
}

/* Loads a.gguf twice: the first must recompute (`why`), the second hit. */
static void expect_recomputed(const char *why)
{
    cv_model_hashes h;
    bool cached = true;
    CHECKF(load("a.gguf", &h, &cached) == 0 && !cached && same(&h, &truth), "%s", why);
    cv_model_hashes_free(&h);
    CHECKF(load("a.gguf", &h, &cached) == 0 && cached && same(&h, &truth), "%s: not cached again", why);
    cv_model_hashes_free(&h);
}

static void test_stale_cache(void)
{
    char path[512], copy[2200];
    model_path(path, sizeof path, "a.gguf");
    /* touched: a new mtime, to the nanosecond */
    struct stat st;
    CHECK(stat(path, &st) == 0);
    const struct timespec times[2] = {st.st_atim, {st.st_mtim.tv_sec, (st.st_mtim.tv_nsec + 1) % 1000000000}};
    CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
    expect_recomputed("after touch");
    /* replaced by a copy with the same size and mtime: a new inode */
    snprintf(copy, sizeof copy, "cp -p '%s' '%s.new' && mv '%s.new' '%s'", path, path, path, path);
    CHECK(system(copy) == 0);
    expect_recomputed("after a copy keeping the mtime");
}

/* Rewrites a.gguf's cache with f applied to its bytes, then checks that it
 * is ignored and rewritten. */
static void damage_cache(const char *what, void (*f)(uint8_t *b, size_t *n))
{
    char path[512];
    model_path(path, sizeof path, "a.gguf.convoy-hashes");
    static uint8_t b[1 << 16];
    FILE *fp = fopen(path, "rb");
    size_t n = fp ? fread(b, 1, sizeof b, fp) : 0;
    if (fp)
        fclose(fp);
    CHECKF(n > 100, "%s: no cache to damage", what);
    f(b, &n);
    fp = fopen(path, "wb");
    CHECK(fp && fwrite(b, 1, n, fp) == n);
    if (fp)
        fclose(fp);
    expect_recomputed(what);
}

static void flip_tensor_hash(uint8_t *b, size_t *n) { (void)n, b[100] ^= 1; } /* inside tensor 0's hash */
static void flip_checksum(uint8_t *b, size_t *n) { b[*n - 1] ^= 0x80; }
static void truncate_half(uint8_t *b, size_t *n) { (void)b, *n /= 2; }
static void append_byte(uint8_t *b, size_t *n) { b[(*n)++] = 0; }
static void huge_count(uint8_t *b, size_t *n) { (void)n, memset(b + 48, 0xff, 8); }
static void garbage(uint8_t *b, size_t *n)
{
    for (size_t i = 0; i < *n; i++)
        b[i] = (uint8_t)(i * 131 + 7);
}
static void empty(uint8_t *b, size_t *n) { (void)b, *n = 0; }

static void test_corrupt_cache(void)
{
    damage_cache("one bit of a tensor hash", flip_tensor_hash);
    damage_cache("one bit of the checksum", flip_checksum);
    damage_cache("half the file", truncate_half);
    damage_cache("a trailing byte", append_byte);
    damage_cache("a tensor count of 2^64 - 1", huge_count);
    damage_cache("garbage", garbage);
    damage_cache("an empty file", empty);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/convoy-test-hashes-XXXXXX");
    if (!mkdtemp(dir) || synth("a.gguf", 1) || synth("seed2.gguf", 2))
        return 1;
    TEST_RUN(test_hashes_follow_the_weights);
    TEST_RUN(test_cache_hit);
    TEST_RUN(test_stale_cache);
    TEST_RUN(test_corrupt_cache);
    cv_model_hashes_free(&truth);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
