/* test_rans.c: convoy's rANS coder (codec/rans.h), the tensor codec
 * (codec/planes.h) and the packed file and its segments (codec/pack.h):
 * round trips of random, constant, empty, one-byte and skewed buffers at
 * every lane count edge; each type's stream split against kernels/types.h's
 * block layouts; every tensor of ../shared/models/ *.gguf and of a small
 * synthetic model of every type bit for bit; the segment cut against one
 * written out here, tensors over 1 MiB in pieces of whole blocks; a file
 * in separate buffers round tripped segment by segment and whole;
 * truncated, corrupted, oversized and version 1 input refused; the
 * decoder for this CPU (AVX2) against the scalar cv_rans_decode_ref on
 * round trips, every cut, corrupted bytes, lengths and word counts. */
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
#include "kernels/kernels.h"
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
    CHECK(round_trip(buf, n, 8) == n + CV_RANS_HEADER_BYTES);
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
    uint8_t src[5000], back[5000], coded[5000 + CV_RANS_HEADER_BYTES];
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

/* Bytes of a few bits of entropy each (sums of three nibbles): a coded
 * stream that takes a word at almost every byte. */
static void fill_moderate(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = next_random();
        p[i] = (uint8_t)((r & 15) + (r >> 4 & 15) + (r >> 8 & 15));
    }
}

/* Decodes p[0..len) with cv_rans_decode and cv_rans_decode_ref, each from
 * its own copy of exactly len bytes into its own buffer of exactly cap
 * (so that ASan sees a read or write past either): the same verdict,
 * message, length, cursor and bytes. Returns cv_rans_decode's result. */
static int same_decode(const uint8_t *p, size_t len, uint64_t cap, const char *what, uint64_t at)
{
    uint8_t *in[2], *out[2];
    char err[2][CV_ERRLEN] = {"", ""};
    uint64_t n[2] = {0, 0};
    cv_cursor c[2];
    int rc[2];
    for (int k = 0; k < 2; k++) {
        in[k] = malloc(len ? len : 1);
        out[k] = malloc(cap ? cap : 1);
        memcpy(in[k], p, len);
        memset(out[k], 0xEE, cap);
        cv_cursor_init(&c[k], in[k], len);
        rc[k] = (k ? cv_rans_decode_ref : cv_rans_decode)(&c[k], out[k], cap, &n[k], err[k], sizeof err[k]);
    }
    CHECKF(rc[0] == rc[1] && n[0] == n[1] && c[0].off == c[1].off && c[0].failed == c[1].failed &&
               strcmp(err[0], err[1]) == 0 && memcmp(out[0], out[1], cap) == 0,
           "%s %" PRIu64 ": simd %d %" PRIu64 " '%s', ref %d %" PRIu64 " '%s'", what, at, rc[0], n[0], err[0], rc[1],
           n[1], err[1]);
    for (int k = 0; k < 2; k++) {
        free(in[k]);
        free(out[k]);
    }
    return rc[0];
}

/* Codes src[0..n) with `lanes`; returns the stream (to free), *len its
 * size. */
static uint8_t *coded_of(const uint8_t *src, uint64_t n, int lanes, uint64_t *len)
{
    uint8_t *coded = malloc(cv_rans_bound(n));
    CHECK(cv_rans_encode(src, n, lanes, coded, cv_rans_bound(n), len, NULL, 0) == 0);
    return coded;
}

static const int simd_lanes[] = {8, 16, 24, 32};

/* Round trips of random lengths (0..100000, and the edges of a round) and
 * kinds, stored and coded, at the SIMD lane counts and a few others. */
static void simd_round_trips(void)
{
    static const uint64_t edges[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 100000};
    const size_t n_edges = sizeof edges / sizeof edges[0];
    uint8_t *src = malloc(100000);
    int methods[2] = {0, 0};
    for (size_t t = 0; t < n_edges + 120; t++) {
        const uint64_t n = t < n_edges ? edges[t] : next_random() % 100001;
        const int lanes = t % 5 < 4 ? simd_lanes[t % 4] : (int)(next_random() % CV_RANS_MAX_LANES) + 1;
        void (*fill[])(uint8_t *, size_t) = {fill_random, fill_skewed, fill_moderate};
        fill[t % 3](src, n);
        uint64_t len;
        uint8_t *coded = coded_of(src, n, lanes, &len);
        uint8_t *back = malloc(n ? n : 1);
        cv_cursor c;
        uint64_t got;
        methods[coded[0] == CV_RANS_CODED]++;
        CHECKF(same_decode(coded, len, n, "round trip of n", n) == 0, "lanes %d", lanes);
        cv_cursor_init(&c, coded, len);
        CHECK(cv_rans_decode(&c, back, n, &got, NULL, 0) == 0 && got == n && (n == 0 || !memcmp(back, src, n)));
        free(back);
        free(coded);
    }
    CHECKF(methods[0] > 10 && methods[1] > 10, "%d stored, %d coded", methods[0], methods[1]);
    free(src);
}

/* Sets the u64 at p. */
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Every cut, every byte flipped (two ways), random bit flips among the
 * words, and the length and the word count off by a little (the stream cut
 * to match), of one coded stream: both decoders agree on each. */
static void simd_hostile(const uint8_t *src, uint64_t n, int lanes)
{
    uint64_t len;
    uint8_t *coded = coded_of(src, n, lanes, &len);
    CHECK(coded[0] == CV_RANS_CODED);
    int k = 0; /* the present symbols: the word count follows their frequencies */
    for (int s = 0; s < 256; s++)
        k += coded[10 + s / 8] >> (s % 8) & 1;
    const uint64_t words_at = 50 + 2 * (uint64_t)k + 4 * (uint64_t)lanes, n_words = (len - words_at) / 2;
    for (uint64_t cut = 0; cut < len; cut++)
        CHECK(same_decode(coded, cut, n, "cut at", cut) == -1);
    for (uint64_t i = 0; i < len; i++)
        for (int f = 0; f < 2; f++) {
            const uint8_t flip = f ? 0x5A : 0x01;
            coded[i] ^= flip;
            same_decode(coded, len, n, "flipped byte", i);
            coded[i] ^= flip;
        }
    for (int t = 0; t < 300; t++) {
        const uint64_t i = words_at + next_random() % (len - words_at);
        const uint8_t flip = (uint8_t)(1u << next_random() % 8);
        coded[i] ^= flip;
        same_decode(coded, len, n, "flipped bit in the words at", i);
        coded[i] ^= flip;
    }
    for (uint64_t d = 0; d <= 40; d++) {
        put_u64(coded + 1, n - 20 + d);
        CHECK(same_decode(coded, len, n + 20, "length", n - 20 + d) == (d == 20 ? 0 : -1));
    }
    put_u64(coded + 1, n);
    for (uint64_t d = 1; d <= 40 && d <= n_words; d++) {
        put_u64(coded + words_at - 8 - 4 * (uint64_t)lanes, n_words - d);
        CHECK(same_decode(coded, len - 2 * d, n, "word count short by", d) == -1);
    }
    free(coded);
}

/* The decoder for this CPU and the scalar reference give the same answer
 * on every input here (the same code on a CPU without SIMD rounds). */
static void test_simd_matches_ref(void)
{
    if (!cv_kernels_avx2())
        SKIP("cv_rans_decode runs the scalar rounds here (kernels: %s)", cv_kernels_name());
    simd_round_trips();
    uint8_t src[6000];
    for (size_t i = 0; i < sizeof simd_lanes / sizeof simd_lanes[0]; i++) {
        fill_skewed(src, 3001);
        simd_hostile(src, 3001, simd_lanes[i]);
        fill_moderate(src, 6000);
        simd_hostile(src, 6000 - i, simd_lanes[i]);
    }
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
    if (cv_gguf_open(&f, path, err, sizeof err)) {
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
    cv_gguf_close(&f);
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
        CHECK(coded > 0 && coded < bytes + 64 * CV_RANS_HEADER_BYTES);
        fprintf(stderr, "  synth %s: %" PRIu64 " -> %" PRIu64 " bytes of tensors\n", types[i], bytes, coded);
    }
    unlink(path);
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A packed file: back byte for byte; cut anywhere, with a bad header, a
 * version 1 head or a segment over CV_PACK_SEGMENT_MAX, refused. */
static void test_pack(void)
{
    uint8_t file[3000];
    fill_skewed(file, sizeof file);
    const cv_pack_tensor t[] = {{100, 800, CV_TYPE_F32}, {900, 18 * 50, CV_TYPE_Q4_0}, {2000, 990, CV_TYPE_BF16}};
    cv_pack_src s;
    cv_pack_src_of_buffer(&s, file, sizeof file, t, 3);
    char *packed = NULL;
    size_t plen = 0;
    uint64_t written, size, n_segments;
    FILE *mem = open_memstream(&packed, &plen);
    CHECK(cv_pack_write(&s, mem, &written, NULL, 0) == 0);
    fclose(mem);
    CHECK(written == plen && plen < sizeof file);
    FILE *out = tmpfile();
    CHECK(cv_pack_read((uint8_t *)packed, plen, out, &size, &n_segments, NULL, 0) == 0);
    CHECK(size == sizeof file && n_segments == 6); /* three tensors, the gaps before two of them and after the last */
    uint8_t back[3000];
    rewind(out);
    CHECK(fread(back, 1, sizeof back, out) == sizeof back && memcmp(back, file, sizeof file) == 0);
    fclose(out);
    char err[CV_ERRLEN];
    out = fopen("/dev/null", "wb");
    for (size_t cut = 0; cut < plen; cut++)
        CHECKF(cv_pack_read((uint8_t *)packed, cut, out, &size, &n_segments, err, sizeof err) == -1,
               "cut at %zu accepted", cut);
    packed[4] = 1;
    CHECK(cv_pack_read((uint8_t *)packed, plen, out, &size, &n_segments, err, sizeof err) == -1 &&
          strstr(err, "version 1"));
    /* a head claiming a terabyte, then a raw segment of a byte too many */
    uint8_t huge[CV_PACK_HEADER_BYTES + CV_PACK_RAW_HEADER_BYTES] = "CVPK";
    put_le(huge + 4, CV_PACK_VERSION, 4);
    put_le(huge + 8, 1ull << 40, 8);
    put_le(huge + 16, 1, 8);
    put_le(huge + 25, CV_PACK_SEGMENT_MAX + 1, 8);
    CHECK(cv_pack_read(huge, sizeof huge, out, &size, &n_segments, err, sizeof err) == -1 && strstr(err, "over"));
    fclose(out);
    const cv_pack_tensor bad[] = {{900, 18 * 50, CV_TYPE_Q4_0}, {100, 800, CV_TYPE_F32}};
    cv_pack_src_of_buffer(&s, file, sizeof file, bad, 2);
    CHECK(cv_pack_write(&s, stdout, &written, err, sizeof err) == -1 && strstr(err, "order"));
    free(packed);
}

#define MIB (1ull << 20)

/* A file's layout for the segment tests: each tensor `gap` bytes after the
 * last (0: right after it), then a trailing gap. */
typedef struct layout_case {
    uint64_t gap, size;
    uint32_t type;
} layout_case;

static const layout_case layout[] = {
    {MIB + MIB / 2 + 3, 144 * 20000, CV_TYPE_Q4_K}, /* a header of two segments, a tensor of three */
    {32, 34 * 70000, CV_TYPE_Q8_0},
    {0, 4 * 600000, CV_TYPE_F32},
    {0, MIB, CV_TYPE_F32},              /* one whole piece, right after a tensor of its type */
    {17, 144 * 8000 + 7, CV_TYPE_Q4_K}, /* not whole blocks: its last piece is one stream */
    {5, 1200000, CV_TYPE_Q8_K},         /* no layout in planes.h: 1-byte blocks */
    {0, 100, CV_TYPE_BF16},
};
#define N_LAYOUT (sizeof layout / sizeof layout[0])
#define TRAILING_GAP (2 * MIB + 5)

/* Places the layout's tensors in t; returns the file's size. */
static uint64_t place(cv_pack_tensor *t)
{
    uint64_t at = 0;
    for (size_t i = 0; i < N_LAYOUT; i++) {
        t[i] = (cv_pack_tensor){at + layout[i].gap, layout[i].size, layout[i].type};
        at = t[i].offset + t[i].size;
    }
    return at + TRAILING_GAP;
}

/* A block of the layout's types, from kernels/types.h (1: no layout). */
static uint64_t block_bytes(uint32_t type)
{
    switch (type) {
    case CV_TYPE_F32: return sizeof(float);
    case CV_TYPE_BF16: return sizeof(cv_bf16);
    case CV_TYPE_Q8_0: return sizeof(block_q8_0);
    case CV_TYPE_Q4_K: return sizeof(block_q4_K);
    default: return 1;
    }
}

/* Appends the segments of [start, end) cut every piece bytes. */
static size_t cut_stretch(cv_pack_segment *out, size_t n, uint64_t start, uint64_t end, uint64_t piece,
                          uint8_t kind, uint32_t type)
{
    for (uint64_t at = start; at < end; at += piece)
        out[n++] = (cv_pack_segment){at, end - at < piece ? end - at : piece, kind, type};
    return n;
}

/* pack.h's cut, written out again: gaps every MiB, tensors every largest
 * whole number of blocks in a MiB. */
static size_t reference_cut(const cv_pack_tensor *t, size_t nt, uint64_t size, cv_pack_segment *out)
{
    size_t n = 0;
    uint64_t at = 0;
    for (size_t i = 0; i < nt; i++) {
        const uint64_t block = block_bytes(t[i].type);
        n = cut_stretch(out, n, at, t[i].offset, MIB, CV_PACK_RAW, 0);
        n = cut_stretch(out, n, t[i].offset, t[i].offset + t[i].size, MIB / block * block, CV_PACK_TENSOR, t[i].type);
        at = t[i].offset + t[i].size;
    }
    return cut_stretch(out, n, at, size, MIB, CV_PACK_RAW, 0);
}

/* The cut: cv_pack_segment_at walks the reference cut exactly,
 * cv_pack_boundary agrees with it everywhere, and the tensors over 1 MiB
 * get pieces of whole blocks. */
static void test_segment_cut(void)
{
    cv_pack_tensor t[N_LAYOUT];
    cv_pack_segment want[64], seg;
    cv_pack_src s;
    const uint64_t size = place(t);
    cv_pack_src_of_buffer(&s, NULL, size, t, N_LAYOUT);
    CHECK(CV_PACK_SEGMENT_MAX == MIB && cv_pack_src_check(&s, NULL, 0) == 0);
    for (size_t i = 0; i < N_LAYOUT; i++)
        CHECKF(cv_planes_block(t[i].type) == block_bytes(t[i].type), "type %" PRIu32, t[i].type);
    const size_t n = reference_cut(t, N_LAYOUT, size, want);
    CHECK(cv_pack_count(&s) == n);
    size_t i = 0;
    for (uint64_t at = 0; at < size && i < n; at += seg.len, i++) {
        cv_pack_segment_at(&s, at, &seg);
        CHECKF(seg.offset == want[i].offset && seg.len == want[i].len && seg.kind == want[i].kind &&
                   seg.type == want[i].type,
               "segment %zu: [%" PRIu64 ", +%" PRIu64 ") kind %u type %" PRIu32 ", want [%" PRIu64 ", +%" PRIu64 ")",
               i, seg.offset, seg.len, seg.kind, seg.type, want[i].offset, want[i].len);
        CHECK(seg.len >= 1 && seg.len <= CV_PACK_SEGMENT_MAX);
        CHECK(cv_pack_boundary(&s, at) == at && cv_pack_boundary(&s, at + seg.len - 1) == at);
    }
    CHECK(i == n && want[n - 1].offset + want[n - 1].len == size && cv_pack_boundary(&s, size) == size);
    for (int k = 0; k < 20000; k++) {
        const uint64_t x = next_random() % size, b = cv_pack_boundary(&s, x);
        cv_pack_segment_at(&s, b, &seg);
        CHECKF(b <= x && x < b + seg.len, "%" PRIu64 ": boundary %" PRIu64 " +%" PRIu64, x, b, seg.len);
    }
    /* Q4_K: 7281 blocks of 144; Q8_0: 30840 of 34; F32: a whole MiB */
    cv_pack_segment_at(&s, t[0].offset, &seg);
    CHECK(seg.len == 144 * 7281 && seg.len % sizeof(block_q4_K) == 0);
    cv_pack_segment_at(&s, t[1].offset + 34 * 30840, &seg);
    CHECK(seg.len == 34 * 30840 && seg.len % sizeof(block_q8_0) == 0);
    cv_pack_segment_at(&s, t[2].offset + MIB, &seg);
    CHECK(seg.len == MIB && seg.kind == CV_PACK_TENSOR && seg.type == CV_TYPE_F32);
    cv_pack_segment_at(&s, t[4].offset + 144 * 7281, &seg);
    CHECK(seg.len == layout[4].size - 144 * 7281 && seg.len % 144 == 7);
}

/* A file in parts, as a shard is before it is written: the header (the gap
 * before the first tensor) in one buffer, each tensor in its own, zeros
 * between and after. A call across two parts gets NULL. */
typedef struct scattered {
    const cv_pack_tensor *t;
    const uint8_t *header;
    uint8_t *tensor[N_LAYOUT];
} scattered;

static const uint8_t zeros[MIB];

static const uint8_t *scattered_bytes(const void *user, uint64_t off, uint64_t n)
{
    const scattered *f = user;
    for (size_t i = 0; i < N_LAYOUT; i++) {
        const cv_pack_tensor *t = &f->t[i];
        if (off < t->offset && off + n > t->offset)
            return NULL;
        if (off < t->offset)
            return i ? zeros : f->header + off;
        if (off < t->offset + t->size)
            return off + n <= t->offset + t->size ? f->tensor[i] + (off - t->offset) : NULL;
    }
    return zeros;
}

/* Every segment of s encoded and decoded on its own gives back its bytes of
 * flat. */
static void segments_round_trip(const cv_pack_src *s, const uint8_t *flat)
{
    uint8_t *coded = malloc(cv_pack_segment_bound()), *back = malloc(MIB);
    char err[CV_ERRLEN] = "";
    cv_pack_segment seg;
    for (uint64_t at = 0; at < s->size; at += seg.len) {
        uint64_t len = 0, n = 0;
        uint8_t kind = 9;
        uint32_t type = 0;
        cv_cursor c;
        cv_pack_segment_at(s, at, &seg);
        CHECKF(cv_pack_segment_encode(s, &seg, coded, cv_pack_segment_bound(), &len, err, sizeof err) == 0, "%s", err);
        cv_cursor_init(&c, coded, len);
        CHECKF(cv_pack_segment_decode(&c, back, MIB, &n, &kind, &type, err, sizeof err) == 0, "%s", err);
        CHECKF(n == seg.len && kind == seg.kind && type == seg.type && cv_cursor_left(&c) == 0 &&
                   memcmp(back, flat + at, n) == 0,
               "segment at %" PRIu64, at);
    }
    free(coded);
    free(back);
}

/* Packs s: returns the packed bytes (to free), *len their count. */
static char *pack_of(const cv_pack_src *s, size_t *len)
{
    char *packed = NULL, err[CV_ERRLEN] = "";
    uint64_t written = 0;
    FILE *mem = open_memstream(&packed, len);
    CHECKF(cv_pack_write(s, mem, &written, err, sizeof err) == 0, "%s", err);
    fclose(mem);
    CHECK(written == *len);
    return packed;
}

/* The scattered file, segment by segment and as a whole, gives back the
 * flat file, and packs to the same bytes as the flat one. */
static void check_scattered(const cv_pack_src *s, const uint8_t *flat, const cv_pack_tensor *t)
{
    cv_pack_src f;
    cv_pack_src_of_buffer(&f, flat, s->size, t, N_LAYOUT);
    segments_round_trip(s, flat);
    size_t plen, flen;
    char *packed = pack_of(s, &plen), *from_flat = pack_of(&f, &flen);
    CHECK(plen == flen && memcmp(packed, from_flat, plen) == 0 && plen < s->size / 2);
    FILE *out = tmpfile();
    uint64_t size, n_segments;
    char err[CV_ERRLEN] = "";
    CHECKF(cv_pack_read((uint8_t *)packed, plen, out, &size, &n_segments, err, sizeof err) == 0, "%s", err);
    CHECK(size == s->size && n_segments == cv_pack_count(s));
    uint8_t *back = malloc(s->size);
    rewind(out);
    CHECK(fread(back, 1, s->size, out) == s->size && memcmp(back, flat, s->size) == 0);
    fclose(out);
    free(back);
    free(packed);
    free(from_flat);
}

static const uint8_t *no_bytes(const void *user, uint64_t off, uint64_t n)
{
    (void)user, (void)off, (void)n;
    return NULL;
}

static void test_segment_round_trip(void)
{
    cv_pack_tensor t[N_LAYOUT];
    const uint64_t size = place(t);
    uint8_t *flat = calloc(size, 1), *header = malloc(t[0].offset);
    scattered f = {.t = t, .header = header};
    fill_skewed(header, t[0].offset);
    memcpy(flat, header, t[0].offset);
    for (size_t i = 0; i < N_LAYOUT; i++) {
        f.tensor[i] = malloc(t[i].size);
        fill_skewed(f.tensor[i], t[i].size);
        memcpy(flat + t[i].offset, f.tensor[i], t[i].size);
    }
    const cv_pack_src s = {size, t, N_LAYOUT, scattered_bytes, &f};
    check_scattered(&s, flat, t);
    /* a segment that is not the cut's, room too small, bytes not to be had */
    char err[CV_ERRLEN] = "";
    uint8_t *coded = malloc(cv_pack_segment_bound());
    uint64_t len;
    cv_pack_segment seg;
    cv_pack_segment_at(&s, t[0].offset, &seg);
    seg.offset++;
    CHECK(cv_pack_segment_encode(&s, &seg, coded, cv_pack_segment_bound(), &len, err, sizeof err) == -1 &&
          strstr(err, "not a segment"));
    seg.offset--;
    CHECK(cv_pack_segment_encode(&s, &seg, coded, seg.len, &len, err, sizeof err) == -1 && strstr(err, "room"));
    const cv_pack_src lost = {size, t, N_LAYOUT, no_bytes, NULL};
    CHECK(cv_pack_segment_encode(&lost, &seg, coded, cv_pack_segment_bound(), &len, err, sizeof err) == -1 &&
          strstr(err, "cannot be had"));
    free(coded);
    free(header);
    for (size_t i = 0; i < N_LAYOUT; i++)
        free(f.tensor[i]);
    free(flat);
}

/* Decodes p[0..len) as one segment with room for cap bytes; err gets the
 * message. */
static int decode_one(const uint8_t *p, size_t len, uint64_t cap, char *err, size_t errlen)
{
    static uint8_t out[2 * MIB];
    cv_cursor c;
    uint64_t n;
    cv_cursor_init(&c, p, len);
    err[0] = 0;
    return cv_pack_segment_decode(&c, out, cap, &n, NULL, NULL, err, errlen);
}

/* Every cut of a coded segment of s at `at` is refused with the codec's
 * message. */
static void refuse_cuts(const cv_pack_src *s, uint64_t at)
{
    uint8_t *coded = malloc(cv_pack_segment_bound());
    uint64_t len;
    char err[CV_ERRLEN];
    cv_pack_segment seg;
    cv_pack_segment_at(s, at, &seg);
    CHECK(cv_pack_segment_encode(s, &seg, coded, cv_pack_segment_bound(), &len, NULL, 0) == 0);
    CHECK(decode_one(coded, len, MIB, err, sizeof err) == 0);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut + 1);
        memcpy(copy, coded, cut);
        CHECKF(decode_one(copy, cut, MIB, err, sizeof err) == -1 &&
                   (!strncmp(err, "pack: ", 6) || !strncmp(err, "planes: ", 8) || !strncmp(err, "rans: ", 6)),
               "kind %u, cut at %zu: %s", seg.kind, cut, err);
        free(copy);
    }
    free(coded);
}

/* cv_pack_segment_decode refuses a length over CV_PACK_SEGMENT_MAX (with
 * its bytes all there and room for them), over cap, or 0, an unknown kind,
 * and every cut of a raw and a tensor segment. */
static void test_segment_refusals(void)
{
    const size_t n = CV_PACK_TENSOR_HEADER_BYTES + MIB + 4;
    uint8_t *seg = calloc(n, 1);
    char err[CV_ERRLEN];
    put_le(seg + 1, MIB + 1, 8);
    CHECK(decode_one(seg, n, 2 * MIB, err, sizeof err) == -1 && strstr(err, "over the 1048576"));
    seg[0] = CV_PACK_TENSOR;
    put_le(seg + 1, CV_TYPE_F32, 4);
    put_le(seg + 5, MIB + 4, 8);
    CHECK(decode_one(seg, n, 2 * MIB, err, sizeof err) == -1 && strstr(err, "over the 1048576"));
    seg[0] = CV_PACK_RAW;
    put_le(seg + 1, 0, 8);
    CHECK(decode_one(seg, n, MIB, err, sizeof err) == -1 && strstr(err, "empty"));
    put_le(seg + 1, 100, 8);
    CHECK(decode_one(seg, n, 99, err, sizeof err) == -1 && strstr(err, "room for 99"));
    CHECK(decode_one(seg, n, 100, err, sizeof err) == 0);
    seg[0] = 2;
    CHECK(decode_one(seg, n, MIB, err, sizeof err) == -1 && strstr(err, "unknown segment kind 2"));
    seg[0] = 0xFF;
    CHECK(decode_one(seg, n, MIB, err, sizeof err) == -1 && strstr(err, "unknown segment kind 255"));
    free(seg);
    uint8_t file[3000];
    const cv_pack_tensor t[] = {{100, 800, CV_TYPE_F32}, {900, 18 * 50, CV_TYPE_Q4_0}};
    cv_pack_src s;
    fill_skewed(file, sizeof file);
    cv_pack_src_of_buffer(&s, file, sizeof file, t, 2);
    refuse_cuts(&s, 0);
    refuse_cuts(&s, 100);
    refuse_cuts(&s, 900);
}

int main(void)
{
    TEST_RUN(test_round_trips);
    TEST_RUN(test_sizes);
    TEST_RUN(test_hostile);
    TEST_RUN(test_simd_matches_ref);
    TEST_RUN(test_splits);
    TEST_RUN(test_pack);
    TEST_RUN(test_segment_cut);
    TEST_RUN(test_segment_round_trip);
    TEST_RUN(test_segment_refusals);
    TEST_RUN(test_shared_models);
    TEST_RUN(test_synth_models);
    return test_summary();
}
