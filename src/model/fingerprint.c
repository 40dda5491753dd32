/* fingerprint.c: a GGUF file's shape fingerprint and content hashes (see
 * fingerprint.h), and the content hashes' cache.
 *
 * Both identities feed the same canonical bytes (a sink: FNV-1a for the
 * fingerprint, BLAKE2b for the hashes): values in a fixed little-endian
 * encoding, never in-memory structs, so padding and byte order do not enter
 * them. Tensors are hashed by a pool of threads that take whole tensors in
 * file order from a shared counter, so each hash is one thread's sequential
 * pass and the results do not depend on timing. */
#include "model/fingerprint.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/cursor.h"
#include "core/err.h"
#include "core/fmap.h"
#include "core/pool.h"
#include "model/shard.h"

/* ---- canonical bytes ---- */

typedef struct sink {
    uint64_t fnv;                    /* FNV-1a state, or */
    crypto_generichash_state *b2;    /* BLAKE2b state when set */
} sink;

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static void feed(sink *s, const void *data, uint64_t n)
{
    if (s->b2) {
        crypto_generichash_update(s->b2, data, n);
        return;
    }
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++) {
        s->fnv ^= p[i];
        s->fnv *= FNV_PRIME;
    }
}

static void feed_u64(sink *s, uint64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    feed(s, le, 8);
}

static void feed_str(sink *s, gguf_str str)
{
    feed_u64(s, str.len);
    feed(s, str.ptr, str.len);
}

static void feed_scalar(sink *s, const gguf_kv *kv)
{
    switch (kv->type) {
    case GGUF_STRING:
        feed_str(s, kv->v.str);
        return;
    case GGUF_BOOL:
        feed_u64(s, kv->v.b ? 1 : 0);
        return;
    case GGUF_FLOAT32:
    case GGUF_FLOAT64: {
        uint64_t bits;
        memcpy(&bits, &kv->v.f64, 8);
        feed_u64(s, bits);
        return;
    }
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        feed_u64(s, (uint64_t)kv->v.i64);
        return;
    default:
        feed_u64(s, kv->v.u64);
    }
}

static void feed_kv(sink *s, const gguf_kv *kv)
{
    feed_str(s, kv->key);
    feed_u64(s, kv->type);
    if (kv->type != GGUF_ARRAY) {
        feed_scalar(s, kv);
        return;
    }
    feed_u64(s, kv->arr_type);
    feed_u64(s, kv->arr_n);
    if (kv->arr_type == GGUF_STRING) {
        for (uint64_t i = 0; i < kv->arr_n; i++)
            feed_str(s, kv->arr_strs[i]);
        return;
    }
    /* raw elements are little-endian in the file, the same on every host */
    feed(s, kv->arr_data, kv->arr_n * cv_gguf_vtype_size(kv->arr_type));
}

/* A tensor's name, type, rank and dims. */
static void feed_tensor_info(sink *s, const gguf_tensor *t)
{
    feed_str(s, t->name);
    feed_u64(s, (uint64_t)t->type);
    feed_u64(s, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++)
        feed_u64(s, (uint64_t)t->ne[d]);
}

static void feed_directory(sink *s, const gguf_file *f, bool with_offsets)
{
    feed_u64(s, f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        feed_tensor_info(s, &f->tensors[i]);
        if (with_offsets)
            feed_u64(s, f->tensors[i].offset);
    }
}

uint64_t cv_model_fingerprint(const gguf_file *f)
{
    sink s = {.fnv = FNV_OFFSET};
    const gguf_kv *arch = cv_gguf_find_kv(f, "general.architecture");
    if (arch && arch->type == GGUF_STRING) {
        feed_str(&s, arch->v.str);
        for (uint64_t i = 0; i < f->n_kv; i++) {
            const gguf_kv *kv = &f->kv[i];
            gguf_str prefix = arch->v.str;
            if (kv->key.len > prefix.len && kv->key.ptr[prefix.len] == '.' &&
                !memcmp(kv->key.ptr, prefix.ptr, prefix.len))
                feed_kv(&s, kv);
        }
    } else {
        feed_u64(&s, 0);
    }
    feed_directory(&s, f, true);
    return s.fnv;
}

/* ---- content hashes ---- */

static int sodium_ready(char *err, size_t errlen)
{
    return sodium_init() < 0 ? cv_errf(err, errlen, "libsodium failed to initialize") : 0;
}

static bool has_prefix(gguf_str key, const char *prefix)
{
    const size_t n = strlen(prefix);
    return key.len > n && !memcmp(key.ptr, prefix, n);
}

/* general.* keys other than the architecture describe a model (name,
 * description, author, file type) without changing what it computes: a
 * renamed copy is the same model. A shard's keys describe the cut. */
static bool descriptive(gguf_str key)
{
    return (has_prefix(key, "general.") && !cv_gguf_str_eq(key, "general.architecture")) ||
           has_prefix(key, CV_SHARD_KEY_PREFIX);
}

/* The metadata hash is H(H(key/values) || H(tensor directory)): a shard
 * holds the whole model's key/values but only part of its directory, so it
 * records the directory's hash, and its key/values are checked. */
static void kv_hash(const gguf_file *f, uint8_t out[CV_HASH_BYTES])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CV_HASH_BYTES);
    sink s = {.b2 = &st};
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!descriptive(f->kv[i].key))
            feed_kv(&s, &f->kv[i]);
    crypto_generichash_final(&st, out, CV_HASH_BYTES);
}

static void meta_of(const uint8_t kv[CV_HASH_BYTES], const uint8_t dir[CV_HASH_BYTES], uint8_t out[CV_HASH_BYTES])
{
    uint8_t both[2 * CV_HASH_BYTES];
    memcpy(both, kv, CV_HASH_BYTES);
    memcpy(both + CV_HASH_BYTES, dir, CV_HASH_BYTES);
    crypto_generichash(out, CV_HASH_BYTES, both, sizeof both, NULL, 0);
}

int cv_model_dir_hash(const gguf_file *f, uint8_t out[CV_HASH_BYTES], char *err, size_t errlen)
{
    if (sodium_ready(err, errlen))
        return -1;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CV_HASH_BYTES);
    sink s = {.b2 = &st};
    feed_directory(&s, f, false);
    crypto_generichash_final(&st, out, CV_HASH_BYTES);
    return 0;
}

int cv_model_meta_hash(const gguf_file *f, uint8_t out[CV_HASH_BYTES], char *err, size_t errlen)
{
    uint8_t kv[CV_HASH_BYTES], dir[CV_HASH_BYTES];
    if (cv_model_dir_hash(f, dir, err, errlen))
        return -1;
    kv_hash(f, kv);
    meta_of(kv, dir, out);
    return 0;
}

/* Bytes hashed between page releases: a thread keeps at most this much of
 * the file resident. */
#define HASH_CHUNK (64u << 20)

static void hash_tensor(const gguf_file *f, uint64_t i, uint8_t out[CV_HASH_BYTES])
{
    const gguf_tensor *t = &f->tensors[i];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CV_HASH_BYTES);
    sink s = {.b2 = &st};
    feed_tensor_info(&s, t);
    const uint8_t *data = t->data;
    for (uint64_t done = 0; done < t->size;) {
        const uint64_t n = t->size - done < HASH_CHUNK ? t->size - done : HASH_CHUNK;
        feed(&s, data + done, n);
        /* the pages stay in the page cache for the span that maps them */
        cv_fmap_release((cv_fmap *)&f->map, (size_t)(data + done - f->map.data), (size_t)n);
        done += n;
    }
    crypto_generichash_final(&st, out, CV_HASH_BYTES);
}

typedef struct hash_job {
    const gguf_file *f;
    cv_model_hashes *h;
    atomic_uint_fast64_t next;
} hash_job;

static void hash_some(void *ctx, int ith, int nth)
{
    (void)ith, (void)nth;
    hash_job *j = ctx;
    for (uint64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->f->n_tensors;)
        hash_tensor(j->f, i, j->h->tensor[i]);
}

/* An empty set for n tensors, or -1. */
static int hashes_alloc(cv_model_hashes *h, uint64_t n, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    h->n_tensors = n;
    h->tensor = cv_malloc(n ? n * CV_HASH_BYTES : 1);
    return h->tensor ? 0 : cv_errf(err, errlen, "out of memory for %llu tensor hashes", (unsigned long long)n);
}

int cv_model_hashes_compute(const gguf_file *f, int n_threads, cv_model_hashes *h, char *err, size_t errlen)
{
    if (hashes_alloc(h, f->n_tensors, err, errlen) || cv_model_meta_hash(f, h->meta, err, errlen))
        goto fail;
    cv_pool *pool = cv_pool_create(n_threads < 1 ? 1 : n_threads);
    if (!pool) {
        cv_errf(err, errlen, "cannot start %d threads", n_threads);
        goto fail;
    }
    hash_job j = {.f = f, .h = h};
    atomic_init(&j.next, 0);
    cv_pool_run(pool, hash_some, &j);
    cv_pool_free(pool);
    return 0;
fail:
    cv_model_hashes_free(h);
    return -1;
}

void cv_model_hashes_free(cv_model_hashes *h)
{
    cv_free(h->tensor);
    memset(h, 0, sizeof *h);
}

void cv_hash_hex8(const uint8_t h[CV_HASH_BYTES], char out[17])
{
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* ---- the cache ----
 *
 * A cache file, little-endian:
 *   8 bytes magic "CVHASH\0\1" (the last byte is the format version),
 *   u32 hash bytes (32), u32 reserved (0), the file's key: u64 size,
 *   u64 inode, i64 mtime seconds, u64 mtime nanoseconds; u64 tensor count
 *   n, 32 bytes metadata hash, n * 32 bytes tensor hashes in file order,
 *   then a BLAKE2b-256 of all the bytes before it (a torn or damaged file
 *   does not verify). The inode joins the size and mtime the key needs, so
 *   that a file put in the model's place (a copy, even one keeping the
 *   mtime) is hashed again. */

static const uint8_t CACHE_MAGIC[8] = {'C', 'V', 'H', 'A', 'S', 'H', 0, 1};
#define CACHE_OFF_KEY 16
#define CACHE_OFF_COUNT 48
#define CACHE_OFF_META 56
#define CACHE_HEADER 88 /* bytes before the tensor hashes */
static_assert(CACHE_OFF_COUNT == CACHE_OFF_KEY + 4 * 8 && CACHE_OFF_META == CACHE_OFF_COUNT + 8 &&
                  CACHE_HEADER == CACHE_OFF_META + CV_HASH_BYTES,
              "cache layout");

typedef struct file_key {
    uint64_t v[4]; /* size, inode, mtime seconds, mtime nanoseconds */
} file_key;

static int file_key_of(const gguf_file *f, file_key *k, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(f->map.fd, &st))
        return cv_errf(err, errlen, "%s: cannot stat: %s", f->name, strerror(errno));
    *k = (file_key){{(uint64_t)st.st_size, (uint64_t)st.st_ino, (uint64_t)st.st_mtim.tv_sec,
                      (uint64_t)st.st_mtim.tv_nsec}};
    return 0;
}

static bool cache_path(const char *path, bool beside, char *out, size_t outlen)
{
    if (beside)
        return (size_t)snprintf(out, outlen, "%s.convoy-hashes", path) < outlen;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[4096];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/convoy", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/convoy", home);
    else
        return false;
    /* the base name for people, a hash of the full path to tell apart
     * models of the same name in different folders */
    char *full = realpath(path, NULL);
    const char *key = full ? full : path;
    uint8_t ph[8];
    crypto_generichash(ph, sizeof ph, (const uint8_t *)key, strlen(key), NULL, 0);
    free(full);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char hex[17];
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", ph[i]);
    return (size_t)snprintf(out, outlen, "%s/%s-%s.convoy-hashes", dir, base, hex) < outlen;
}

static void put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The cache's bytes for h and the file's key (cv_malloc'ed). */
static uint8_t *cache_encode(const cv_model_hashes *h, const file_key *k, size_t *len)
{
    const size_t body = CACHE_HEADER + (size_t)h->n_tensors * CV_HASH_BYTES;
    uint8_t *b = cv_calloc(1, body + CV_HASH_BYTES);
    if (!b)
        return NULL;
    memcpy(b, CACHE_MAGIC, 8);
    put_u64le(b + 8, CV_HASH_BYTES); /* u32 hash bytes, u32 reserved 0 */
    for (int i = 0; i < 4; i++)
        put_u64le(b + CACHE_OFF_KEY + 8 * i, k->v[i]);
    put_u64le(b + CACHE_OFF_COUNT, h->n_tensors);
    memcpy(b + CACHE_OFF_META, h->meta, CV_HASH_BYTES);
    if (h->n_tensors)
        memcpy(b + CACHE_HEADER, h->tensor, (size_t)h->n_tensors * CV_HASH_BYTES);
    crypto_generichash(b + body, CV_HASH_BYTES, b, body, NULL, 0);
    *len = body + CV_HASH_BYTES;
    return b;
}

/* Whether buf is a cache of this file as it is now (key and metadata hash
 * `meta`); fills h's tensor hashes when it is. */
static bool cache_decode(const uint8_t *buf, size_t len, const file_key *k, const uint8_t meta[CV_HASH_BYTES],
                         cv_model_hashes *h)
{
    cv_cursor c;
    cv_cursor_init(&c, buf, len);
    const uint8_t *magic = cv_cursor_bytes(&c, 8, "magic");
    const uint32_t hash_bytes = cv_cursor_u32(&c, "hash bytes");
    const uint32_t reserved = cv_cursor_u32(&c, "reserved");
    bool key_ok = true;
    for (int i = 0; i < 4; i++)
        key_ok &= cv_cursor_u64(&c, "file key") == k->v[i];
    const uint64_t n = cv_cursor_u64(&c, "tensor count");
    const uint8_t *cached_meta = cv_cursor_bytes(&c, CV_HASH_BYTES, "metadata hash");
    if (c.failed || memcmp(magic, CACHE_MAGIC, 8) || hash_bytes != CV_HASH_BYTES || reserved || !key_ok ||
        n != h->n_tensors || memcmp(cached_meta, meta, CV_HASH_BYTES))
        return false;
    const uint8_t *tensors = cv_cursor_bytes(&c, n * CV_HASH_BYTES, "tensor hashes");
    const uint8_t *sum = cv_cursor_bytes(&c, CV_HASH_BYTES, "checksum");
    if (c.failed || cv_cursor_left(&c))
        return false;
    uint8_t want[CV_HASH_BYTES];
    crypto_generichash(want, CV_HASH_BYTES, buf, (size_t)(sum - buf), NULL, 0);
    if (sodium_memcmp(want, sum, CV_HASH_BYTES))
        return false;
    if (n)
        memcpy(h->tensor, tensors, (size_t)n * CV_HASH_BYTES);
    return true;
}

/* Reads the whole (small) cache file at p; NULL if absent or too large to
 * be a cache of n tensors. */
static uint8_t *read_small(const char *p, uint64_t n, size_t *len)
{
    FILE *fp = fopen(p, "rb");
    if (!fp)
        return NULL;
    const size_t cap = CACHE_HEADER + (size_t)(n + 1) * CV_HASH_BYTES + 1;
    uint8_t *buf = cv_malloc(cap);
    *len = buf ? fread(buf, 1, cap, fp) : 0;
    fclose(fp);
    return buf;
}

static bool cache_read(const char *p, const file_key *k, const uint8_t meta[CV_HASH_BYTES], cv_model_hashes *h)
{
    size_t len;
    uint8_t *buf = read_small(p, h->n_tensors, &len);
    const bool ok = buf && cache_decode(buf, len, k, meta, h);
    cv_free(buf);
    return ok;
}

/* A new file at path, never one that is there: a link planted under the
 * name is removed, not followed (O_EXCL refuses it, unlink drops the link
 * itself). NULL with errno set. */
static FILE *create_new(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(path) == 0)
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !fp)
        close(fd);
    return fp;
}

/* Writes the cache at p through a temporary file renamed into place, so a
 * reader never sees half a cache. */
static int cache_write(const char *p, const cv_model_hashes *h, const file_key *k, char *err, size_t errlen)
{
    size_t len;
    uint8_t *b = cache_encode(h, k, &len);
    if (!b)
        return cv_errf(err, errlen, "out of memory");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", p, (long)getpid());
    FILE *fp = create_new(tmp);
    int rc = 0;
    if (!fp) {
        rc = cv_errf(err, errlen, "%s: %s", tmp, strerror(errno));
    } else {
        const bool wrote = fwrite(b, 1, len, fp) == len;
        const bool closed = fclose(fp) == 0;
        if (!wrote || !closed || rename(tmp, p) != 0) {
            rc = cv_errf(err, errlen, "%s: %s", p, strerror(errno));
            unlink(tmp);
        }
    }
    cv_free(b);
    return rc;
}

/* mkdir -p of the folder that holds the file p (a failure shows when writing). */
static void make_parent(const char *p)
{
    char dir[4096], why[CV_ERRLEN];
    snprintf(dir, sizeof dir, "%s", p);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        cv_make_dirs(dir, why, sizeof why);
    }
}

/* Caches h beside the model, else in the fallback folder; the note says
 * where or why not. */
static void cache_store(const char *path, const cv_model_hashes *h, const file_key *k, char *note, size_t notelen)
{
    char p[4096], why[CV_ERRLEN], why2[CV_ERRLEN] = "no $XDG_CACHE_HOME or $HOME";
    if (cache_path(path, true, p, sizeof p) && cache_write(p, h, k, why, sizeof why) == 0) {
        snprintf(note, notelen, "cached in %s", p);
        return;
    }
    if (cache_path(path, false, p, sizeof p)) {
        make_parent(p);
        if (cache_write(p, h, k, why2, sizeof why2) == 0) {
            snprintf(note, notelen, "cached in %s", p);
            return;
        }
    }
    snprintf(note, notelen, "not cached (%s; %s)", why, why2);
}

/* A shard answers for the model it was cut from (model/shard.h): its
 * metadata hash is that model's, from its own key/values (the model's)
 * and the directory hash its split recorded, since its own directory
 * holds only its tensors. Its cache is keyed by its own. */
static int whole_model_meta(const gguf_file *f, cv_model_hashes *h, char *err, size_t errlen)
{
    if (!cv_shard_is(f))
        return 0;
    const gguf_kv *dir = cv_gguf_find_kv(f, CV_SHARD_KEY_DIR_HASH);
    if (!dir || dir->type != GGUF_ARRAY || dir->arr_type != GGUF_UINT8 || dir->arr_n != CV_HASH_BYTES) {
        cv_model_hashes_free(h);
        return cv_errf(err, errlen, "%s: %s is missing or not %d bytes (a shard of an older convoy: split the model "
                                    "again)",
                       f->name, CV_SHARD_KEY_DIR_HASH, CV_HASH_BYTES);
    }
    uint8_t kv[CV_HASH_BYTES];
    kv_hash(f, kv);
    meta_of(kv, dir->arr_data, h->meta);
    return 0;
}

int cv_model_hashes_load(const gguf_file *f, const char *path, int n_threads, cv_model_hashes *h, bool *cached,
                         char *note, size_t notelen, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    file_key k;
    uint8_t meta[CV_HASH_BYTES];
    if (file_key_of(f, &k, err, errlen) || cv_model_meta_hash(f, meta, err, errlen) ||
        hashes_alloc(h, f->n_tensors, err, errlen))
        return -1;
    memcpy(h->meta, meta, CV_HASH_BYTES);
    char p[4096];
    for (int beside = 1; beside >= 0; beside--)
        if (cache_path(path, beside, p, sizeof p) && cache_read(p, &k, meta, h)) {
            *cached = true;
            snprintf(note, notelen, "hashes from %s", p);
            return whole_model_meta(f, h, err, errlen);
        }
    *cached = false;
    cv_model_hashes_free(h);
    const int64_t t0 = cv_now_ms();
    if (cv_model_hashes_compute(f, n_threads, h, err, errlen))
        return -1;
    char where[CV_ERRLEN + 4200];
    cache_store(path, h, &k, where, sizeof where);
    snprintf(note, notelen, "hashed %.2f GB in %.1f s, %s", (double)k.v[0] / 1e9, (double)(cv_now_ms() - t0) / 1e3,
             where);
    return whole_model_meta(f, h, err, errlen);
}
