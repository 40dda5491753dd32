/* test_gguf.c: the GGUF reader on real files, the writer by round trip, and
 * a generated corpus of broken files that must each be rejected with a
 * message naming the problem.
 *
 * The corpus starts from a small valid file made by the writer; the byte
 * offsets of its fields are taken from the reader's own view of that file
 * (string pointers minus the buffer), then single fields are overwritten,
 * spliced out or cut off. Every broken buffer is an exact-size heap copy, so
 * the sanitizer build catches any read past its end.
 *
 * `test_gguf --corpus DIR` also writes the corpus (and the valid file) into
 * DIR as seed inputs for tests/fuzz/fuzz_gguf. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/cursor.h"
#include "core/err.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/llama.h"
#include "test.h"

static char tmp_dir[256];
static const char *corpus_dir;

static void make_tmp_dir(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/convoy-test-gguf-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
}

static void tmp_path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmp_dir, name); }

static uint32_t kv_u32(const gguf_file *f, const char *key)
{
    uint32_t v = 0;
    char err[CV_ERRLEN];
    if (cv_gguf_get_u32(f, key, &v, err, sizeof err) != 0)
        fprintf(stderr, "%s\n", err);
    return v;
}

/* Every tensor's data lies inside [base, base+len), aligned, rows sized by type. */
static void check_tensors_in_file(const gguf_file *f, const uint8_t *base, size_t len)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const uint8_t *d = t->data;
        CHECK(d >= base + f->data_offset && d + t->size <= base + len);
        CHECK((uint64_t)(d - base) % f->alignment == 0);
        int blck;
        size_t tsize;
        CHECK(cv_ggml_type_info((uint32_t)t->type, NULL, &blck, &tsize));
        CHECK(t->size == (uint64_t)(t->ne[0] / blck) * tsize * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]));
        CHECK(cv_gguf_find_tensor(f, "") == NULL);
        char *name = cv_gguf_str_dup(t->name);
        CHECK(name && cv_gguf_find_tensor(f, name) == t);
        cv_free(name);
    }
}

/* ---- (a) real files ---- */

static void test_stories260k(void)
{
    char path[512], err[CV_ERRLEN];
    if (!test_shared_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    gguf_file f;
    int rc = cv_gguf_open(&f, path, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc != 0)
        return;
    CHECK(f.version == 3);
    CHECK(f.alignment == 32);
    CHECK(kv_u32(&f, "llama.block_count") == 5);
    CHECK(kv_u32(&f, "llama.embedding_length") == 64);
    gguf_str arch;
    CHECK(cv_gguf_get_str(&f, "general.architecture", &arch, err, sizeof err) == 0 && cv_gguf_str_eq(arch, "llama"));
    float eps = 0;
    CHECK(cv_gguf_get_f32(&f, "llama.attention.layer_norm_rms_epsilon", &eps, err, sizeof err) == 0);
    CHECK(eps > 0 && eps < 1e-3f);
    const gguf_kv *tokens = cv_gguf_find_kv(&f, "tokenizer.ggml.tokens");
    CHECK(tokens && tokens->type == GGUF_ARRAY && tokens->arr_type == GGUF_STRING && tokens->arr_n == 512);
    const gguf_kv *scores = cv_gguf_find_kv(&f, "tokenizer.ggml.scores");
    CHECK(scores && scores->arr_type == GGUF_FLOAT32 && scores->arr_n == 512);

    const gguf_tensor *t = cv_gguf_find_tensor(&f, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK(t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512 && t->ne[2] == 1 && t->ne[3] == 1);
        CHECK(t->type == CV_TYPE_F32);
        CHECK(t->size == 64 * 512 * 4);
    }
    CHECK(cv_gguf_find_tensor(&f, "token_embd.weigh") == NULL);
    check_tensors_in_file(&f, f.map.data, f.map.size);

    /* getter errors name the key */
    uint32_t u;
    CHECK(cv_gguf_get_u32(&f, "general.architecture", &u, err, sizeof err) == -1 &&
          strstr(err, "general.architecture"));
    CHECK(cv_gguf_get_u32(&f, "no.such.key", &u, err, sizeof err) == -1 && strstr(err, "'no.such.key' not found"));
    bool b;
    CHECK(cv_gguf_get_bool(&f, "llama.block_count", &b, err, sizeof err) == -1 && strstr(err, "llama.block_count"));
    CHECK(cv_gguf_get_str(&f, "llama.block_count", &arch, err, sizeof err) == -1);
    cv_gguf_close(&f);
    cv_gguf_close(&f); /* harmless twice */
}

static void test_reference_models(void)
{
    char dir[512], path[1024], err[CV_ERRLEN];
    if (!test_shared_path(dir, sizeof dir, "reference/models"))
        return;
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d)
        return;
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        gguf_file f;
        int rc = cv_gguf_open(&f, path, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        if (rc != 0)
            continue;
        n_files++;
        gguf_str arch;
        CHECKF(cv_gguf_get_str(&f, "general.architecture", &arch, err, sizeof err) == 0, "%s", err);
        CHECKF(f.n_tensors > 0 && cv_gguf_find_tensor(&f, "token_embd.weight"), "%s", path);
        const gguf_kv *al = cv_gguf_find_kv(&f, "general.alignment");
        CHECK(al ? f.alignment == al->v.u64 : f.alignment == 32);
        check_tensors_in_file(&f, f.map.data, f.map.size);
        cv_gguf_close(&f);
    }
    closedir(d);
    CHECKF(n_files >= 10, "parsed %d reference models", n_files);
}

static void test_vocab_only(void)
{
    char path[512], err[CV_ERRLEN];
    if (!test_shared_path(path, sizeof path, "reference/vocab/ggml-vocab-llama-spm.gguf"))
        return;
    gguf_file f;
    int rc = cv_gguf_open(&f, path, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc != 0)
        return;
    CHECK(f.n_tensors == 0);
    const gguf_kv *tokens = cv_gguf_find_kv(&f, "tokenizer.ggml.tokens");
    CHECK(tokens && tokens->arr_type == GGUF_STRING && tokens->arr_n == 32000);
    if (tokens && tokens->arr_n == 32000) {
        CHECK(cv_gguf_str_eq(tokens->arr_strs[0], "<unk>"));
        CHECK(cv_gguf_str_eq(tokens->arr_strs[1], "<s>"));
    }
    cv_gguf_close(&f);
}

static void test_open_errors(void)
{
    char err[CV_ERRLEN] = "";
    gguf_file f;
    CHECK(cv_gguf_open(&f, "/nonexistent/x.gguf", err, sizeof err) == -1);
    CHECKF(strstr(err, "/nonexistent/x.gguf") != NULL, "%s", err);
    CHECK(cv_gguf_open(&f, "/tmp", err, sizeof err) == -1 && strstr(err, "not a regular file"));
    char path[512];
    tmp_path(path, sizeof path, "empty.gguf");
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (fp)
        fclose(fp);
    CHECK(cv_gguf_open(&f, path, err, sizeof err) == -1 && strstr(err, "too short"));
    CHECK(cv_gguf_parse(&f, NULL, 0, "null", err, sizeof err) == -1 && strstr(err, "null: "));
    remove(path);
}

/* Released pages of a tensor read back the same bytes (they fault in again). */
static void test_fmap_release(void)
{
    char path[512], err[CV_ERRLEN];
    if (!test_shared_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    gguf_file f;
    if (cv_gguf_open(&f, path, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    const gguf_tensor *t = cv_gguf_find_tensor(&f, "token_embd.weight");
    CHECK(t != NULL);
    if (t) {
        uint8_t *copy = malloc(t->size);
        memcpy(copy, t->data, t->size);
        size_t off = (size_t)((const uint8_t *)t->data - f.map.data);
        cv_fmap_release(&f.map, off, t->size);
        cv_fmap_release(&f.map, 0, f.map.size);
        cv_fmap_release(&f.map, f.map.size + 100, 10); /* outside: ignored */
        CHECK(memcmp(copy, t->data, t->size) == 0);
        free(copy);
    }
    cv_gguf_close(&f);
}

/* cv_fmap_read copies the file's bytes; a range past the end is refused
 * naming it. */
static void test_fmap_read(void)
{
    char path[512], err[CV_ERRLEN];
    if (!test_shared_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    cv_fmap m;
    if (cv_fmap_open(&m, path, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    uint8_t *buf = malloc(m.size);
    CHECK(cv_fmap_read(&m, 0, m.size, buf, err, sizeof err) == 0 && memcmp(buf, m.data, m.size) == 0);
    CHECK(cv_fmap_read(&m, m.size - 7, 7, buf, err, sizeof err) == 0 && memcmp(buf, m.data + m.size - 7, 7) == 0);
    CHECK(cv_fmap_read(&m, m.size - 7, 8, buf, err, sizeof err) == -1 && strstr(err, "past the file's end"));
    CHECK(cv_fmap_read(&m, m.size + 1, 0, buf, err, sizeof err) == -1);
    free(buf);
    cv_fmap_close(&m);
}

/* Each bound matrix is read into the resident block (64-byte aligned,
 * inside it) with the file's bytes; token_embd stays in the mapping. The
 * F32 vectors are copies outside the mapping, with the file's values. */
static void test_resident_weights(void)
{
    char path[512], err[CV_ERRLEN];
    if (!test_shared_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    cv_llama m;
    if (cv_llama_load(&m, path, 0, -1, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    const uint8_t *lo = m.resident, *hi = m.resident + m.resident_bytes;
    const struct {
        const char *name;
        const cv_weight *w;
    } bound[] = {{"output.weight", &m.output}, {"blk.0.attn_q.weight", &m.layers[0].wq},
                 {"blk.0.ffn_down.weight", &m.layers[0].w_down}, {"token_embd.weight", &m.tok_embd}};
    for (size_t i = 0; i < sizeof bound / sizeof bound[0]; i++) {
        const gguf_tensor *t = cv_gguf_find_tensor(&m.gguf, bound[i].name);
        if (!t) /* tied output */
            t = cv_gguf_find_tensor(&m.gguf, "token_embd.weight");
        const uint8_t *p = bound[i].w->data;
        const bool mapped = p >= m.gguf.map.data && p < m.gguf.map.data + m.gguf.map.size;
        CHECKF(mapped == !strcmp(bound[i].name, "token_embd.weight"), "%s", bound[i].name);
        CHECKF(mapped || (p >= lo && p + t->size <= hi && (uintptr_t)p % 64 == 0), "%s", bound[i].name);
        CHECKF(memcmp(p, t->data, t->size) == 0, "%s", bound[i].name);
    }
    const struct {
        const char *name;
        const float *v;
    } vecs[] = {{"blk.0.attn_norm.weight", m.layers[0].attn_norm},
                {"blk.4.ffn_norm.weight", m.layers[4].ffn_norm},
                {"output_norm.weight", m.output_norm}};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
        const gguf_tensor *t = cv_gguf_find_tensor(&m.gguf, vecs[i].name);
        const uint8_t *p = (const uint8_t *)vecs[i].v;
        CHECKF(t && t->type == CV_TYPE_F32, "%s is F32 in the file", vecs[i].name);
        if (!t)
            continue;
        CHECKF(p + t->size <= m.gguf.map.data || p >= m.gguf.map.data + m.gguf.map.size, "%s is a copy",
               vecs[i].name);
        CHECKF(memcmp(p, t->data, t->size) == 0, "%s", vecs[i].name);
    }
    cv_llama_free(&m);
}

/* The cursor underneath the reader: short reads fail, stick, and report
 * where and what; nothing is read past the end. */
static void test_cursor(void)
{
    const uint8_t bytes[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    uint8_t *buf = malloc(sizeof bytes);
    memcpy(buf, bytes, sizeof bytes);
    cv_cursor c;
    cv_cursor_init(&c, buf, sizeof bytes);
    CHECK(cv_cursor_u8(&c, "a") == 1);
    CHECK(cv_cursor_u16(&c, "b") == 0x0302);
    CHECK(cv_cursor_u32(&c, "c") == 0x07060504);
    CHECK(cv_cursor_left(&c) == 4 && !c.failed);
    cv_cursor_align(&c, 8, "pad");
    CHECK(c.off == 8 && !c.failed);
    CHECK(cv_cursor_u64(&c, "d") == 0 && c.failed && c.fail_off == 8 && strcmp(c.fail_what, "d") == 0);
    CHECK(cv_cursor_u8(&c, "e") == 0 && c.fail_off == 8 && strcmp(c.fail_what, "d") == 0);
    CHECK(cv_cursor_left(&c) == 0);
    cv_cursor_init(&c, buf, sizeof bytes);
    CHECK(cv_cursor_bytes(&c, UINT64_MAX, "huge") == NULL && c.failed && c.fail_off == 0);
    cv_cursor_init(&c, buf, sizeof bytes);
    CHECK(cv_cursor_bytes(&c, 11, "all") == buf && cv_cursor_left(&c) == 0);
    CHECK(cv_cursor_bytes(&c, 0, "none") != NULL && !c.failed);
    cv_cursor_align(&c, 4, "pad past end");
    CHECK(c.failed && c.fail_off == 11);
    cv_cursor_init(&c, buf, sizeof bytes);
    cv_cursor_align(&c, 3, "not a power of two");
    CHECK(c.failed);
    cv_cursor_init(&c, buf, sizeof bytes);
    CHECK(cv_cursor_f32(&c, "f") == cv_bits_f32(0x04030201) && cv_cursor_f64(&c, "g") == 0.0 && c.failed);
    cv_cursor_init(&c, NULL, 0);
    CHECK(cv_cursor_u8(&c, "x") == 0 && c.failed);
    free(buf);
}

/* ---- (b) writer round trip ---- */

static const float tensor_a[16] = {1, -2, 3.5f, 0, 1e-3f, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, -0.0f};
static uint8_t tensor_b[2 * 34]; /* Q8_0, 64 x 1 */
static const uint16_t tensor_c[16] = {0x3c00, 0x4000, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0x7c00};

/* The small valid file of the corpus: every value kind, three tensors of
 * three types (one of them a block type), alignment given explicitly. */
static int write_small(const char *path, uint32_t alignment, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof tensor_b; i++)
        tensor_b[i] = (uint8_t)(i * 37 + 1);
    gguf_writer *w = cv_gguf_writer_create();
    if (!w)
        return -1;
    cv_gguf_set_str(w, "general.architecture", "llama");
    cv_gguf_set_u32(w, "general.alignment", alignment);
    cv_gguf_set_u32(w, "test.key_a", 7);
    cv_gguf_set_f32(w, "test.key_b", 1.5f);
    cv_gguf_set_bool(w, "test.flag", true);
    cv_gguf_set_i32(w, "test.neg", -5);
    const int32_t ints[3] = {1, -2, 3};
    cv_gguf_set_arr(w, "test.ints", GGUF_INT32, ints, 3);
    const char *strs[3] = {"ab", "cde", ""};
    cv_gguf_set_arr_str(w, "test.strs", strs, 3);
    const int64_t ne_a[2] = {8, 2}, ne_b[1] = {64}, ne_c[3] = {4, 2, 2};
    cv_gguf_add_tensor(w, "t.aa", CV_TYPE_F32, 2, ne_a, tensor_a, sizeof tensor_a);
    cv_gguf_add_tensor(w, "t.ab", CV_TYPE_Q8_0, 1, ne_b, tensor_b, sizeof tensor_b);
    cv_gguf_add_tensor(w, "t.ac", CV_TYPE_F16, 3, ne_c, tensor_c, sizeof tensor_c);
    int rc = cv_gguf_write(w, path, err, errlen);
    cv_gguf_writer_free(w);
    return rc;
}

static void check_small(const gguf_file *f, uint64_t alignment)
{
    char err[CV_ERRLEN];
    CHECK(f->version == 3 && f->n_kv == 8 && f->n_tensors == 3);
    CHECK(f->alignment == alignment && f->data_offset % alignment == 0);
    CHECK(kv_u32(f, "test.key_a") == 7);
    float x = 0;
    CHECK(cv_gguf_get_f32(f, "test.key_b", &x, err, sizeof err) == 0 && x == 1.5f);
    CHECK(cv_gguf_get_f32(f, "test.key_a", &x, err, sizeof err) == 0 && x == 7.0f); /* integer to float, exact */
    bool b = false;
    CHECK(cv_gguf_get_bool(f, "test.flag", &b, err, sizeof err) == 0 && b);
    uint32_t u;
    CHECK(cv_gguf_get_u32(f, "test.neg", &u, err, sizeof err) == -1 && strstr(err, "-5"));
    const gguf_kv *neg = cv_gguf_find_kv(f, "test.neg");
    CHECK(neg && neg->type == GGUF_INT32 && neg->v.i64 == -5);
    const gguf_kv *ints = cv_gguf_find_kv(f, "test.ints");
    CHECK(ints && ints->type == GGUF_ARRAY && ints->arr_type == GGUF_INT32 && ints->arr_n == 3);
    if (ints && ints->arr_n == 3) {
        CHECK(cv_gguf_arr_i64(ints, 0) == 1 && cv_gguf_arr_i64(ints, 1) == -2 && cv_gguf_arr_i64(ints, 2) == 3);
        CHECK(cv_gguf_arr_f64(ints, 1) == -2.0);
    }
    const gguf_kv *strs = cv_gguf_find_kv(f, "test.strs");
    CHECK(strs && strs->arr_type == GGUF_STRING && strs->arr_n == 3);
    if (strs && strs->arr_n == 3)
        CHECK(cv_gguf_str_eq(strs->arr_strs[0], "ab") && cv_gguf_str_eq(strs->arr_strs[1], "cde") &&
              cv_gguf_str_eq(strs->arr_strs[2], ""));
    const gguf_tensor *a = cv_gguf_find_tensor(f, "t.aa"), *bq = cv_gguf_find_tensor(f, "t.ab"),
                      *c = cv_gguf_find_tensor(f, "t.ac");
    CHECK(a && bq && c);
    if (!a || !bq || !c)
        return;
    CHECK(a->type == CV_TYPE_F32 && a->n_dims == 2 && a->ne[0] == 8 && a->ne[1] == 2 && a->size == sizeof tensor_a);
    CHECK(memcmp(a->data, tensor_a, sizeof tensor_a) == 0);
    CHECK(bq->type == CV_TYPE_Q8_0 && bq->n_dims == 1 && bq->ne[0] == 64 && bq->size == sizeof tensor_b);
    CHECK(memcmp(bq->data, tensor_b, sizeof tensor_b) == 0);
    CHECK(c->type == CV_TYPE_F16 && c->n_dims == 3 && c->ne[2] == 2 && c->ne[3] == 1);
    CHECK(memcmp(c->data, tensor_c, sizeof tensor_c) == 0);
    CHECK(a->offset % alignment == 0 && bq->offset % alignment == 0 && c->offset % alignment == 0);
}

static void test_writer_round_trip(void)
{
    char path[512], err[CV_ERRLEN];
    const uint32_t aligns[3] = {32, 64, 8};
    for (int k = 0; k < 3; k++) {
        tmp_path(path, sizeof path, "small.gguf");
        int rc = write_small(path, aligns[k], err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        gguf_file f;
        rc = cv_gguf_open(&f, path, err, sizeof err);
        CHECKF(rc == 0, "%s", err);
        if (rc != 0)
            continue;
        check_small(&f, aligns[k]);
        check_tensors_in_file(&f, f.map.data, f.map.size);
        cv_gguf_close(&f);
        remove(path);
    }
}

/* Every key/value of stories260K copied by cv_gguf_copy_kv comes back equal. */
static void test_writer_copy_kv(void)
{
    char src[512], path[512], err[CV_ERRLEN];
    if (!test_shared_path(src, sizeof src, "models/stories260K.gguf"))
        return;
    gguf_file in, out;
    if (cv_gguf_open(&in, src, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    gguf_writer *w = cv_gguf_writer_create();
    for (uint64_t i = 0; i < in.n_kv; i++)
        cv_gguf_copy_kv(w, &in.kv[i]);
    const gguf_tensor *t = cv_gguf_find_tensor(&in, "output_norm.weight");
    CHECK(t != NULL);
    if (!t) {
        cv_gguf_writer_free(w);
        cv_gguf_close(&in);
        return;
    }
    cv_gguf_add_tensor(w, "output_norm.weight", t->type, t->n_dims, t->ne, t->data, t->size);
    tmp_path(path, sizeof path, "copy.gguf");
    int rc = cv_gguf_write(w, path, err, sizeof err);
    cv_gguf_writer_free(w);
    CHECKF(rc == 0, "%s", err);
    rc = cv_gguf_open(&out, path, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc == 0) {
        CHECK(out.n_kv == in.n_kv && out.n_tensors == 1);
        for (uint64_t i = 0; i < in.n_kv && i < out.n_kv; i++) {
            const gguf_kv *a = &in.kv[i], *b = &out.kv[i];
            char *key = cv_gguf_str_dup(a->key);
            CHECKF(cv_gguf_str_eq(b->key, key) && a->type == b->type, "key %s", key);
            if (a->type == GGUF_ARRAY) {
                CHECKF(a->arr_type == b->arr_type && a->arr_n == b->arr_n, "key %s", key);
                if (a->arr_type == GGUF_STRING)
                    for (uint64_t j = 0; j < a->arr_n && j < b->arr_n; j++)
                        CHECK(a->arr_strs[j].len == b->arr_strs[j].len &&
                              memcmp(a->arr_strs[j].ptr, b->arr_strs[j].ptr, a->arr_strs[j].len) == 0);
                else if (a->arr_n == b->arr_n)
                    CHECK(memcmp(a->arr_data, b->arr_data, a->arr_n * cv_gguf_vtype_size(a->arr_type)) == 0);
            } else if (a->type == GGUF_STRING) {
                CHECK(a->v.str.len == b->v.str.len && memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len) == 0);
            } else {
                CHECKF(memcmp(&a->v, &b->v, sizeof a->v.u64) == 0, "key %s", key);
            }
            cv_free(key);
        }
        const gguf_tensor *t2 = cv_gguf_find_tensor(&out, "output_norm.weight");
        CHECK(t2 && t2->size == t->size && memcmp(t2->data, t->data, t->size) == 0);
        cv_gguf_close(&out);
    }
    cv_gguf_close(&in);
    remove(path);
}

/* The writer refuses what the reader would reject, and creates no file. */
static void test_writer_errors(void)
{
    char path[512], err[CV_ERRLEN];
    tmp_path(path, sizeof path, "bad.gguf");
    const int64_t ne33[1] = {33}, ne2[2] = {8, 2}, ne0[1] = {0};
    float data[64] = {0};
    struct {
        const char *expect;
        int which;
    } cases[] = {
        {"block size 32", 0}, {"bytes of data", 1}, {"added twice", 2}, {"empty key", 3},
        {"power-of-two", 4},  {"dimensions", 5},    {"unknown type", 6}, {"dimension 0 of size 0", 7},
        {"own setter", 8},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gguf_writer *w = cv_gguf_writer_create();
        cv_gguf_set_u32(w, "a.b", 1);
        switch (cases[k].which) {
        case 0: cv_gguf_add_tensor(w, "t", CV_TYPE_Q8_0, 1, ne33, data, 34); break;
        case 1: cv_gguf_add_tensor(w, "t", CV_TYPE_F32, 2, ne2, data, 60); break;
        case 2:
            cv_gguf_add_tensor(w, "t", CV_TYPE_F32, 2, ne2, data, 64);
            cv_gguf_add_tensor(w, "t", CV_TYPE_F32, 2, ne2, data, 64);
            break;
        case 3: cv_gguf_set_u32(w, "", 1); break;
        case 4: cv_gguf_set_u32(w, "general.alignment", 48); break;
        case 5: cv_gguf_add_tensor(w, "t", CV_TYPE_F32, 5, ne2, data, 64); break;
        case 6: cv_gguf_add_tensor(w, "t", (cv_type)4, 2, ne2, data, 64); break;
        case 7: cv_gguf_add_tensor(w, "t", CV_TYPE_F32, 1, ne0, data, 0); break;
        case 8: cv_gguf_set_arr(w, "x", GGUF_STRING, data, 1); break;
        }
        remove(path);
        CHECK(cv_gguf_write(w, path, err, sizeof err) == -1);
        CHECKF(strstr(err, cases[k].expect) != NULL, "expected '%s' in: %s", cases[k].expect, err);
        CHECK(access(path, F_OK) != 0);
        cv_gguf_writer_free(w);
    }
    /* a key set twice keeps its place and takes the last value */
    gguf_writer *w = cv_gguf_writer_create();
    cv_gguf_set_u32(w, "a.first", 1);
    cv_gguf_set_str(w, "a.second", "x");
    cv_gguf_set_u32(w, "a.first", 2);
    CHECK(cv_gguf_write(w, path, err, sizeof err) == 0);
    cv_gguf_writer_free(w);
    gguf_file f;
    CHECK(cv_gguf_open(&f, path, err, sizeof err) == 0);
    CHECK(f.n_kv == 2 && f.n_tensors == 0 && cv_gguf_str_eq(f.kv[0].key, "a.first") && f.kv[0].v.u64 == 2);
    cv_gguf_close(&f);
    remove(path);
}

/* ---- (c) broken files ---- */

static uint8_t *base;  /* the small valid file */
static size_t base_len;
static gguf_file base_f; /* parsed view of base, for field offsets */
static int n_cases, n_corpus;

static size_t off_of(const void *p) { return (size_t)((const uint8_t *)p - base); }
static const gguf_kv *bkv(const char *key) { return cv_gguf_find_kv(&base_f, key); }
static const gguf_tensor *bt(const char *name) { return cv_gguf_find_tensor(&base_f, name); }

/* Offsets of a key/value's fields in base. */
static size_t key_len_off(const gguf_kv *kv) { return off_of(kv->key.ptr) - 8; }
static size_t type_off(const gguf_kv *kv) { return off_of(kv->key.ptr) + kv->key.len; }
static size_t value_off(const gguf_kv *kv) { return type_off(kv) + 4; }
/* ...and of a tensor info's. */
static size_t name_len_off(const gguf_tensor *t) { return off_of(t->name.ptr) - 8; }
static size_t ndims_off(const gguf_tensor *t) { return off_of(t->name.ptr) + t->name.len; }
static size_t ne_off(const gguf_tensor *t, int d) { return ndims_off(t) + 4 + 8 * (size_t)d; }
static size_t ttype_off(const gguf_tensor *t) { return ne_off(t, (int)t->n_dims); }
static size_t toffset_off(const gguf_tensor *t) { return ttype_off(t) + 4; }

static void save_corpus(const char *label, const uint8_t *buf, size_t len)
{
    if (!corpus_dir)
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%04d-%s.gguf", corpus_dir, n_corpus++, label);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(buf, 1, len, fp) != len)
        fprintf(stderr, "cannot write %s\n", path);
    if (fp)
        fclose(fp);
}

/* Parses buf (an exact-size heap copy) and expects a rejection whose message
 * begins with the file name and contains `expect` (if not NULL). */
static void expect_reject(const char *label, const uint8_t *bytes, size_t len, const char *expect)
{
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, bytes, len);
    save_corpus(label, copy, len);
    char err[CV_ERRLEN] = "";
    gguf_file f;
    int rc = cv_gguf_parse(&f, copy, len, "case.gguf", err, sizeof err);
    n_cases++;
    CHECKF(rc == -1, "%s: accepted", label);
    if (rc == 0) {
        cv_gguf_close(&f);
    } else {
        CHECKF(strncmp(err, "case.gguf: ", 11) == 0 && strlen(err) > 11, "%s: message '%s'", label, err);
        CHECKF(!expect || strstr(err, expect), "%s: expected '%s' in '%s'", label, expect, err);
        CHECK(f.kv == NULL && f.tensors == NULL);
    }
    free(copy);
}

/* base with the n bytes at off replaced by val's low bytes (little-endian). */
static void reject_patched(const char *label, size_t off, uint64_t val, int n, const char *expect)
{
    uint8_t *b = malloc(base_len);
    memcpy(b, base, base_len);
    for (int i = 0; i < n; i++)
        b[off + (size_t)i] = (uint8_t)(val >> (8 * i));
    expect_reject(label, b, base_len, expect);
    free(b);
}

/* base with `cut` bytes at off replaced by `ins` (n_ins bytes). */
static void reject_spliced(const char *label, size_t off, size_t cut, const void *ins, size_t n_ins, const char *expect)
{
    size_t len = base_len - cut + n_ins;
    uint8_t *b = malloc(len);
    memcpy(b, base, off);
    memcpy(b + off, ins, n_ins);
    memcpy(b + off + n_ins, base + off + cut, base_len - off - cut);
    expect_reject(label, b, len, expect);
    free(b);
}

static int load_base(uint32_t alignment)
{
    char path[512], err[CV_ERRLEN];
    tmp_path(path, sizeof path, "corpus-base.gguf");
    if (write_small(path, alignment, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return -1;
    }
    base = (uint8_t *)test_read_file(path, &base_len);
    remove(path);
    CHECK(base != NULL);
    if (!base)
        return -1;
    int rc = cv_gguf_parse(&base_f, base, base_len, "base.gguf", err, sizeof err);
    CHECKF(rc == 0, "%s", err);
    if (rc != 0) {
        free(base);
        return -1;
    }
    return 0;
}

static void free_base(void)
{
    cv_gguf_close(&base_f);
    free(base);
}

static void test_corpus_truncation(void)
{
    if (load_base(32) != 0)
        return;
    save_corpus("valid", base, base_len);
    uint64_t needed = 0; /* the shortest prefix holding every tensor */
    for (uint64_t i = 0; i < base_f.n_tensors; i++) {
        const gguf_tensor *t = &base_f.tensors[i];
        if (base_f.data_offset + t->offset + t->size > needed)
            needed = base_f.data_offset + t->offset + t->size;
    }
    CHECK(needed > base_f.data_offset && needed <= base_len);
    char label[64], err[CV_ERRLEN];
    for (size_t len = 0; len <= base_len; len++) {
        snprintf(label, sizeof label, "truncated-%zu", len);
        if (len < needed) {
            int at_data = len >= base_f.data_offset;
            expect_reject(label, base, len, len < 4 ? "too short" : at_data ? "extends past end of file" : NULL);
        } else {
            uint8_t *copy = malloc(len);
            memcpy(copy, base, len);
            gguf_file f;
            int rc = cv_gguf_parse(&f, copy, len, "case.gguf", err, sizeof err);
            CHECKF(rc == 0, "prefix of %zu bytes (all tensors inside) rejected: %s", len, err);
            if (rc == 0)
                cv_gguf_close(&f);
            free(copy);
        }
    }
    free_base();
}

static void test_corpus_header(void)
{
    if (load_base(32) != 0)
        return;
    reject_patched("magic-GGUG", 3, 'G', 1, "not a GGUF file");
    reject_patched("magic-reversed", 0, 0x47475546, 4, "not a GGUF file");
    reject_patched("magic-zero", 0, 0, 4, "not a GGUF file");
    reject_patched("version-0", 4, 0, 4, "unsupported GGUF version 0");
    reject_patched("version-1", 4, 1, 4, "version 1");
    reject_patched("version-4", 4, 4, 4, "unsupported GGUF version 4");
    reject_patched("version-big-endian", 4, 0x03000000, 4, "big-endian");
    const uint64_t huge[4] = {UINT64_C(1) << 63, UINT64_MAX, UINT64_C(1) << 32, base_len};
    char label[64];
    for (int k = 0; k < 4; k++) {
        snprintf(label, sizeof label, "n_tensors-%" PRIu64, huge[k]);
        reject_patched(label, 8, huge[k], 8, "claims");
        snprintf(label, sizeof label, "n_kv-%" PRIu64, huge[k]);
        reject_patched(label, 16, huge[k], 8, "claims");
    }
    reject_patched("n_tensors-plus-1", 8, base_f.n_tensors + 1, 8, NULL);
    reject_patched("n_kv-plus-1", 16, base_f.n_kv + 1, 8, NULL);

    /* version 2 has the same layout: accepted */
    uint8_t *v2 = malloc(base_len);
    memcpy(v2, base, base_len);
    v2[4] = 2;
    gguf_file f;
    char err[CV_ERRLEN];
    CHECKF(cv_gguf_parse(&f, v2, base_len, "v2.gguf", err, sizeof err) == 0, "%s", err);
    CHECK(f.version == 2);
    cv_gguf_close(&f);
    free(v2);
    free_base();
}

static void test_corpus_kv(void)
{
    if (load_base(32) != 0)
        return;
    const gguf_kv *arch = bkv("general.architecture"), *ints = bkv("test.ints"), *strs = bkv("test.strs"),
                  *flag = bkv("test.flag"), *key_b = bkv("test.key_b"), *align = bkv("general.alignment");
    CHECK(arch && ints && strs && flag && key_b && align);
    if (!arch || !ints || !strs || !flag || !key_b || !align) {
        free_base();
        return;
    }
    const uint64_t huge[3] = {UINT64_C(1) << 63, UINT64_MAX, base_len};
    char label[64];
    for (int k = 0; k < 3; k++) {
        snprintf(label, sizeof label, "key-length-%" PRIu64, huge[k]);
        reject_patched(label, key_len_off(arch), huge[k], 8, "has a key of length");
        snprintf(label, sizeof label, "string-length-%" PRIu64, huge[k]);
        reject_patched(label, value_off(arch), huge[k], 8, "has a string value of length");
        snprintf(label, sizeof label, "string-element-length-%" PRIu64, huge[k]);
        reject_patched(label, value_off(strs) + 12, huge[k], 8, "has a string element of length");
    }
    /* counts whose byte size wraps around 2^64 if multiplied unchecked */
    const uint64_t counts[4] = {UINT64_C(1) << 63, UINT64_MAX, UINT64_C(1) << 62, UINT64_C(1) << 61};
    for (int k = 0; k < 4; k++) {
        snprintf(label, sizeof label, "int-array-count-%" PRIu64, counts[k]);
        reject_patched(label, value_off(ints) + 4, counts[k], 8, "claims");
        snprintf(label, sizeof label, "string-array-count-%" PRIu64, counts[k]);
        reject_patched(label, value_off(strs) + 4, counts[k], 8, "claims");
    }
    reject_patched("nested-array", value_off(ints), GGUF_ARRAY, 4, "nested arrays");
    reject_patched("nested-string-array", value_off(strs), GGUF_ARRAY, 4, "nested arrays");
    reject_patched("array-elem-type-13", value_off(ints), 13, 4, "unknown element type 13");
    reject_patched("array-elem-type-max", value_off(ints), UINT32_MAX, 4, "unknown element type");
    reject_patched("value-type-13", type_off(flag), 13, 4, "unknown value type 13");
    reject_patched("value-type-max", type_off(flag), UINT32_MAX, 4, "unknown value type 4294967295");
    reject_patched("bool-value-2", value_off(flag), 2, 1, "bool value 2");

    /* test.key_a and test.key_b have keys of equal length */
    reject_spliced("duplicate-key", off_of(key_b->key.ptr), key_b->key.len, "test.key_a", 10, "'test.key_a' appears more than once");
    reject_spliced("empty-key", key_len_off(arch), 8 + arch->key.len, (const uint8_t[8]){0}, 8, "empty key");
    reject_patched("nul-in-key", off_of(arch->key.ptr) + 3, 0, 1, "NUL");

    const uint32_t bad_align[5] = {0, 3, 48, 0x80000001u, 0xffffffffu};
    for (int k = 0; k < 5; k++) {
        snprintf(label, sizeof label, "alignment-%" PRIu32, bad_align[k]);
        reject_patched(label, value_off(align), bad_align[k], 4, "must be a power of two");
    }
    reject_patched("alignment-as-int32", type_off(align), GGUF_INT32, 4, "'general.alignment' has type int32");
    reject_patched("alignment-2^31", value_off(align), UINT32_C(1) << 31, 4, "not a multiple of the alignment 2147483648");
    reject_patched("alignment-64-with-32-offsets", value_off(align), 64, 4, "not a multiple of the alignment 64");
    free_base();
}

static void test_corpus_tensors(void)
{
    if (load_base(32) != 0)
        return;
    const gguf_tensor *a = bt("t.aa"), *b = bt("t.ab"), *c = bt("t.ac");
    CHECK(a && b && c);
    if (!a || !b || !c) {
        free_base();
        return;
    }
    char label[64];
    const uint32_t types[4] = {4, 5, 40, UINT32_MAX};
    for (int k = 0; k < 4; k++) {
        snprintf(label, sizeof label, "tensor-type-%" PRIu32, types[k]);
        reject_patched(label, ttype_off(a), types[k], 4, "has unknown type");
    }
    reject_patched("n_dims-0", ndims_off(a), 0, 4, "has 0 dimensions");
    reject_patched("n_dims-5", ndims_off(a), 5, 4, "has 5 dimensions");
    reject_patched("n_dims-max", ndims_off(a), UINT32_MAX, 4, "dimensions");
    reject_patched("dim0-zero", ne_off(a, 0), 0, 8, "dimension 0 of size 0");
    reject_patched("dim1-zero", ne_off(a, 1), 0, 8, "dimension 1 of size 0");
    reject_patched("dim0-2^63", ne_off(a, 0), UINT64_C(1) << 63, 8, "of size 9223372036854775808");
    reject_patched("dim0-max", ne_off(a, 0), UINT64_MAX, 8, "dimension 0");
    {
        uint8_t dims[16];
        for (int i = 0; i < 16; i++)
            dims[i] = i % 8 == 4 ? 1 : 0; /* 2^32 x 2^32 */
        reject_spliced("dims-product-overflow", ne_off(a, 0), 16, dims, 16, "too many elements");
        for (int i = 0; i < 16; i++)
            dims[i] = i % 8 == 3 ? 0x80 : 0; /* 2^31 x 2^31 elements of 4 bytes: 2^64 bytes */
        reject_spliced("size-overflow", ne_off(a, 0), 16, dims, 16, "data size that overflows");
        /* 2^62 x 1 x 2^2 elements is exactly 2^64: the element count overflow */
        reject_spliced("dims-2^62x4", ne_off(c, 0), 24,
                       (const uint8_t[24]){0, 0, 0, 0, 0, 0, 0, 0x40, 1, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0},
                       24, "too many elements");
    }
    reject_patched("q8_0-row-33", ne_off(b, 0), 33, 8, "not a multiple of the Q8_0 block size 32");
    reject_patched("q8_0-row-16", ne_off(b, 0), 16, 8, "block size");
    reject_patched("offset-misaligned-1", toffset_off(b), b->offset + 1, 8, "not a multiple of the alignment 32");
    reject_patched("offset-misaligned-16", toffset_off(c), c->offset + 16, 8, "not a multiple of the alignment");
    reject_patched("overlap-same-offset", toffset_off(b), a->offset, 8, "overlaps tensor 't.a");
    reject_patched("overlap-inside", toffset_off(b), a->offset + 32, 8, "overlaps tensor 't.aa'");
    reject_patched("overlap-last", toffset_off(c), b->offset + 64, 8, "overlaps tensor 't.ab'");
    uint64_t data_len = base_len - base_f.data_offset;
    const uint64_t outside[4] = {UINT64_C(1) << 40, UINT64_MAX - 31, data_len - data_len % 32, data_len + 32};
    for (int k = 0; k < 4; k++) {
        snprintf(label, sizeof label, "offset-outside-%" PRIu64, outside[k]);
        reject_patched(label, toffset_off(c), outside[k], 8, "'t.ac' extends past end of file");
    }
    /* a row length that makes the last tensor end past the file */
    reject_patched("dim-past-end", ne_off(c, 2), 1000, 8, "extends past end of file");
    for (int k = 0; k < 3; k++) {
        snprintf(label, sizeof label, "name-length-%d", k);
        reject_patched(label, name_len_off(b), k == 0 ? UINT64_C(1) << 63 : k == 1 ? UINT64_MAX : base_len, 8,
                       "has a tensor name of length");
    }
    reject_spliced("duplicate-tensor", off_of(b->name.ptr), 4, "t.aa", 4, "tensor 't.aa' appears more than once");
    reject_spliced("empty-tensor-name", name_len_off(b), 8 + b->name.len, (const uint8_t[8]){0}, 8, "empty name");
    reject_patched("nul-in-tensor-name", off_of(b->name.ptr) + 1, 0, 1, "NUL");
    free_base();
}

/* Every bit of the metadata flipped in turn: rejected with a message, or
 * accepted with every tensor inside the file; never a crash (the sanitizer
 * build checks the reads). */
static void test_corpus_bit_flips(void)
{
    if (load_base(32) != 0)
        return;
    uint8_t *b = malloc(base_len);
    char err[CV_ERRLEN];
    int rejected = 0, total = 0;
    for (size_t off = 0; off < base_f.data_offset; off++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(b, base, base_len);
            b[off] ^= (uint8_t)(1u << bit);
            err[0] = '\0';
            gguf_file f;
            total++;
            if (cv_gguf_parse(&f, b, base_len, "flip.gguf", err, sizeof err) == 0) {
                check_tensors_in_file(&f, b, base_len);
                cv_gguf_close(&f);
            } else {
                rejected++;
                CHECKF(strncmp(err, "flip.gguf: ", 11) == 0, "byte %zu bit %d: '%s'", off, bit, err);
            }
        }
    fprintf(stderr, "bit flips: %d of %d rejected\n", rejected, total);
    free(b);
    free_base();
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--corpus") == 0) {
        corpus_dir = argv[2];
        mkdir(corpus_dir, 0755);
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--corpus DIR]\n", argv[0]);
        return 2;
    }
    make_tmp_dir();
    TEST_RUN(test_stories260k);
    TEST_RUN(test_reference_models);
    TEST_RUN(test_vocab_only);
    TEST_RUN(test_open_errors);
    TEST_RUN(test_fmap_release);
    TEST_RUN(test_fmap_read);
    TEST_RUN(test_resident_weights);
    TEST_RUN(test_cursor);
    TEST_RUN(test_writer_round_trip);
    TEST_RUN(test_writer_copy_kv);
    TEST_RUN(test_writer_errors);
    TEST_RUN(test_corpus_truncation);
    TEST_RUN(test_corpus_header);
    TEST_RUN(test_corpus_kv);
    TEST_RUN(test_corpus_tensors);
    TEST_RUN(test_corpus_bit_flips);
    fprintf(stderr, "%d broken files rejected%s%s\n", n_cases, corpus_dir ? ", corpus written to " : "",
            corpus_dir ? corpus_dir : "");
    rmdir(tmp_dir);
    return test_summary();
}
