/* test_rans.c: convoy's rANS coder (codec/rans.h), the tensor codec
 * (codec/planes.h) and the packed file (codec/pack.h): round trips of
 * random, constant, empty, one-byte and skewed buffers at every lane count
 * edge; each type's stream split against kernels/types.h's block layouts;
 * every tensor of ../shared/models/ *.gguf and of a small synthetic model of
 * every type bit for bit; truncated and corrupted input refused. */
#include <glob.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/pack.h"
#include "codec/planes.h"
#include "codec/rans.h"
#include "convoy.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/splitmix.h"
#include "kernels/types.h"
#include "model/gguf.h"
#include "test.h"

static uint64_t seed = 7;

static uint64_t next_random(void)
{
    seed += CV_SPLITMIX_GAMMA;
    return cv_splitmix64_mix(seed);
}

static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)next_random();
}

/* Geometric-ish bytes: mostly small values, like exponents. */
static void fill_skewed(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(__builtin_ctzll(next_random() | 1ull << 40) * 3);
}

/* Encodes and decodes src with `lanes`; returns the coded size (0 on a
 * failed check). */
static uint64_t round_trip(const uint8_t *src, uint64_t n, int lanes)
{
    uint8_t *coded = malloc(cv_rans_bound(n)), *back = malloc(n + 1);
    uint64_t len = 0, got = 0;
    char err[CV_ERRLEN];
    CHECKF(cv_rans_encode(src, n, lanes, coded, cv_rans_bound(n), &len, err, sizeof err) == 0, "%s", err);
    cv_cursor c;
    cv_cursor_init(&c, coded, len);
    const int rc = cv_rans_decode(&c, back, n, &got, err, sizeof err);
    CHECKF(rc == 0, "n %" PRIu64 " lanes %d: %s", n, lanes, err);
    CHECK(got == n && cv_cursor_left(&c) == 0);
    CHECKF(rc || n == 0 || memcmp(src, back, n) == 0, "n %" PRIu64 " lanes %d differs", n, lanes);
    free(coded);
    free(back);
    return rc || got != n ? 0 : len;
}

static void test_round_trips(void)
{
    static const int lanes[] = {1, 2, 3, 4, 7, 8, 16, 31, 32};
    uint8_t *buf = malloc(4096 * CV_RANS_MAX_LANES);
    for (size_t li = 0; li < sizeof lanes / sizeof lanes[0]; li++) {
        const int l = lanes[li];
        const uint64_t sizes[] = {0, 1, 2, (uint64_t)l - 1, (uint64_t)l, (uint64_t)l + 1, 2 * (uint64_t)l + 1,
                                  1000, 4096 * (uint64_t)l - 1, 65537};
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            const uint64_t n = sizes[si];
            fill_random(buf, n);
            CHECK(round_trip(buf, n, l) == cv_rans_bound(n)); /* random: stored */
            memset(buf, 0xA5, n);
            CHECK(round_trip(buf, n, l) > 0);
            fill_skewed(buf, n);
            CHECK(round_trip(buf, n, l) > 0);
        }
    }
    free(buf);
}

/* Coding pays where it should: a constant buffer takes the model and the
 * states, a skewed one less than its bytes, a random one never more. */
static void test_sizes(void)
{
    const uint64_t n = 1 << 16;
    uint8_t *buf = malloc(n);
    memset(buf, 0, n);
    CHECK(round_trip(buf, n, 8) < 100);
    fill_skewed(buf, n);
    CHECK(round_trip(buf, n, 8) < n / 3);
    fill_random(buf, n);
    CHECK(round_trip(buf, n, 8) == n + CV_RANS_HEAD_BYTES);
    char err[CV_ERRLEN];
    uint64_t len;
    CHECK(cv_rans_encode(buf, n, 0, buf, 0, &len, err, sizeof err) == -1 && strstr(err, "lanes"));
    CHECK(cv_rans_encode(buf, n, 8, buf, n, &len, err, sizeof err) == -1 && strstr(err, "room"));
    free(buf);
}

/* Every cut of a coded stream is refused; every corrupted byte is refused
 * or decodes to something, never outside the buffers (ASan builds). */
static void hostile(int lanes)
{
    const uint64_t n = 5000;
    uint8_t src[5000], back[5000], coded[5000 + CV_RANS_HEAD_BYTES];
    uint64_t len, got;
    char err[CV_ERRLEN];
    fill_skewed(src, n);
    CHECK(cv_rans_encode(src, n, lanes, coded, sizeof coded, &len, err, sizeof err) == 0 && coded[0] == CV_RANS_CODED);
    for (uint64_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut + 1);
        memcpy(copy, coded, cut);
        cv_cursor c;
        cv_cursor_init(&c, copy, cut);
        err[0] = 0;
        CHECKF(cv_rans_decode(&c, back, n, &got, err, sizeof err) == -1 && !strncmp(err, "rans: ", 6),
               "cut at %" PRIu64 ": %s", cut, err);
        free(copy);
    }
    int refused = 0;
    for (uint64_t i = 0; i < len; i++) {
        cv_cursor c;
        coded[i] ^= 0x5A;
        cv_cursor_init(&c, coded, len);
        refused += cv_rans_decode(&c, back, n, &got, err, sizeof err) != 0;
        coded[i] ^= 0x5A;
    }
    CHECKF(refused > (int)len / 2, "%d of %" PRIu64 " corruptions refused", refused, len);
    cv_cursor c;
    cv_cursor_init(&c, coded, len);
    CHECK(cv_rans_decode(&c, back, n - 1, &got, err, sizeof err) == -1 && strstr(err, "fit"));
}

/* 8 lanes: the unrolled loop; 4: the general one. */
static void test_hostile(void)
{
    hostile(8);
    hostile(4);
}

/* Codes a tensor and decodes it again; returns the coded size, 0 on a
 * failed check. */
static uint64_t planes_round_trip(uint32_t type, const uint8_t *src, uint64_t n, const char *what)
{
    const uint64_t bound = cv_planes_bound(type, n);
    uint8_t *coded = cv_malloc(bound), *back = cv_malloc(n ? n : 1);
    uint64_t len = 0;
    char err[CV_ERRLEN] = "";
    int rc = cv_planes_encode(type, src, n, coded, bound, &len, err, sizeof err);
    cv_cursor c;
    cv_cursor_init(&c, coded, len);
    rc = rc || cv_planes_decode(type, &c, back, n, err, sizeof err);
    CHECKF(rc == 0 && cv_cursor_left(&c) == 0, "%s: %s", what, err);
    CHECKF(rc || n == 0 || memcmp(src, back, n) == 0, "%s: decoded bytes differ", what);
    cv_free(coded);
    cv_free(back);
    return rc ? 0 : len;
}

/* A type's expected split: where its fp16 scales lie (set constant, so
 * that their streams code to almost nothing) and each stream's bytes per
 * block, from kernels/types.h. */
typedef struct split_case {
    uint32_t type;
    size_t block;
    size_t fp16_at[2];
    int n_fp16;
    size_t per_stream[CV_PLANES_MAX_STREAMS];
    int n_streams;
    int fp16_lo, fp16_hi; /* the streams of the scales' low and high bytes */
} split_case;

static const split_case splits[] = {
    {CV_TYPE_Q4_0, sizeof(block_q4_0), {offsetof(block_q4_0, d)}, 1, {1, 1, QK4_0 / 2}, 3, 0, 1},
    {CV_TYPE_Q8_0, sizeof(block_q8_0), {offsetof(block_q8_0, d)}, 1, {1, 1, QK8_0}, 3, 0, 1},
    {CV_TYPE_Q4_K, sizeof(block_q4_K), {offsetof(block_q4_K, d), offsetof(block_q4_K, dmin)}, 2,
     {2, 2, K_SCALE_SIZE, QK_K / 2}, 4, 0, 1},
    {CV_TYPE_Q5_K, sizeof(block_q5_K), {offsetof(block_q5_K, d), offsetof(block_q5_K, dmin)}, 2,
     {2, 2, K_SCALE_SIZE, QK_K / 8, QK_K / 2}, 5, 0, 1},
    {CV_TYPE_Q6_K, sizeof(block_q6_K), {offsetof(block_q6_K, d)}, 1, {QK_K / 2, QK_K / 4, QK_K / 16, 1, 1}, 5, 3, 4},
};

/* Walks the coded streams: each one's length must match the layout, and
 * the constant scales' streams must be the coded ones. */
static void check_split(const split_case *sc, const uint8_t *coded, uint64_t len, uint64_t blocks)
{
    cv_cursor c;
    cv_cursor_init(&c, coded, len);
    for (int s = 0; s < sc->n_streams; s++) {
        const size_t at = c.off;
        const uint8_t method = cv_cursor_u8(&c, "method");
        const uint64_t n = cv_cursor_u64(&c, "n");
        CHECKF(n == blocks * sc->per_stream[s], "type %u stream %d: %" PRIu64 " bytes", sc->type, s, n);
        CHECKF((method == CV_RANS_CODED) == (s == sc->fp16_lo || s == sc->fp16_hi), "type %u stream %d method %u",
               sc->type, s, method);
        uint8_t *tmp = malloc(n + 1);
        uint64_t got;
        c.off = at;
        CHECK(cv_rans_decode(&c, tmp, n, &got, NULL, 0) == 0);
        free(tmp);
    }
    CHECK(cv_cursor_left(&c) == 0);
}

static void test_splits(void)
{
    const uint64_t blocks = 300;
    CHECK(cv_planes_streams(CV_TYPE_F32, 8) == 4 && cv_planes_streams(CV_TYPE_F32, 6) == 1);
    CHECK(cv_planes_streams(CV_TYPE_BF16, 8) == 2 && cv_planes_streams(CV_TYPE_Q8_K, 292) == 1);
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        const split_case *sc = &splits[i];
        const uint64_t n = blocks * sc->block;
        uint8_t *src = malloc(n), *coded = malloc(cv_planes_bound(sc->type, n));
        fill_random(src, n);
        for (uint64_t b = 0; b < blocks; b++)
            for (int f = 0; f < sc->n_fp16; f++)
                memcpy(src + b * sc->block + sc->fp16_at[f], &(cv_fp16){0x3C00}, 2);
        uint64_t len = 0;
        CHECK(cv_planes_encode(sc->type, src, n, coded, cv_planes_bound(sc->type, n), &len, NULL, 0) == 0);
        check_split(sc, coded, len, blocks);
        CHECK(planes_round_trip(sc->type, src, n, "split") > 0);
        CHECK(planes_round_trip(sc->type, src, n - 1, "split, a byte short") > 0);
        free(src);
        free(coded);
    }
}

/* Every tensor of a GGUF through the tensor codec; returns the tensors'
 * bytes and adds their coded size to *coded. */
static uint64_t file_round_trip(const char *path, uint64_t *coded)
{
    gguf_file f;
    char err[CV_ERRLEN];
    uint64_t bytes = 0;
    if (gguf_open(&f, path, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return 0;
    }
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        char what[300];
        snprintf(what, sizeof what, "%s: %.*s", path, (int)t->name.len, t->name.ptr);
        *coded += planes_round_trip(t->type, t->data, t->size, what);
        bytes += t->size;
    }
    gguf_close(&f);
    return bytes;
}

static void test_shared_models(void)
{
    char dir[1024], pattern[1100];
    if (!test_shared_path(dir, sizeof dir, "models"))
        return;
    snprintf(pattern, sizeof pattern, "%s/*.gguf", dir);
    glob_t g;
    CHECK(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        uint64_t coded = 0, bytes = file_round_trip(g.gl_pathv[i], &coded);
        fprintf(stderr, "  %s: %" PRIu64 " -> %" PRIu64 " bytes of tensors\n", g.gl_pathv[i], bytes, coded);
    }
    globfree(&g);
}

/* A small synthetic model of every type the codec splits. */
static void test_synth_models(void)
{
    static const char *types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"};
    char path[256], err[CV_ERRLEN];
    snprintf(path, sizeof path, "/tmp/convoy-test-rans-%d.gguf", (int)getpid());
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        convoy_synth_params p = convoy_synth_default_params();
        p.n_embd = 256;
        p.n_layer = 2;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 512;
        p.n_vocab = 300;
        p.type = types[i];
        p.n_threads = 2;
        CHECKF(convoy_synth_file(&p, path, NULL, NULL, err, sizeof err) == 0, "%s: %s", types[i], err);
        uint64_t coded = 0, bytes = file_round_trip(path, &coded);
        CHECK(coded > 0 && coded < bytes + 64 * CV_RANS_HEAD_BYTES);
        fprintf(stderr, "  synth %s: %" PRIu64 " -> %" PRIu64 " bytes of tensors\n", types[i], bytes, coded);
    }
    unlink(path);
}

/* A packed file: back byte for byte; cut anywhere or with a bad header,
 * refused. */
static void test_pack(void)
{
    uint8_t file[3000];
    fill_skewed(file, sizeof file);
    const cv_pack_tensor t[] = {{100, 800, CV_TYPE_F32}, {900, 18 * 50, CV_TYPE_Q4_0}, {2000, 990, CV_TYPE_BF16}};
    char *packed = NULL;
    size_t plen = 0;
    uint64_t written, size, n_tensors;
    FILE *mem = open_memstream(&packed, &plen);
    CHECK(cv_pack_write(file, sizeof file, t, 3, mem, &written, NULL, 0) == 0);
    fclose(mem);
    CHECK(written == plen && plen < sizeof file);
    FILE *out = tmpfile();
    CHECK(cv_pack_read((uint8_t *)packed, plen, out, &size, &n_tensors, NULL, 0) == 0);
    CHECK(size == sizeof file && n_tensors == 3);
    uint8_t back[3000];
    rewind(out);
    CHECK(fread(back, 1, sizeof back, out) == sizeof back && memcmp(back, file, sizeof file) == 0);
    fclose(out);
    char err[CV_ERRLEN];
    for (size_t cut = 0; cut < plen; cut++) {
        out = fopen("/dev/null", "wb");
        CHECKF(cv_pack_read((uint8_t *)packed, cut, out, &size, &n_tensors, err, sizeof err) == -1,
               "cut at %zu accepted", cut);
        fclose(out);
    }
    const cv_pack_tensor bad[] = {{900, 18 * 50, CV_TYPE_Q4_0}, {100, 800, CV_TYPE_F32}};
    CHECK(cv_pack_write(file, sizeof file, bad, 2, stdout, &written, err, sizeof err) == -1 && strstr(err, "order"));
    free(packed);
}

int main(void)
{
    TEST_RUN(test_round_trips);
    TEST_RUN(test_sizes);
    TEST_RUN(test_hostile);
    TEST_RUN(test_splits);
    TEST_RUN(test_pack);
    TEST_RUN(test_shared_models);
    TEST_RUN(test_synth_models);
    return test_summary();
}
