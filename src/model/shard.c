/* shard.c: per-stage files of a model (see shard.h). A shard is written
 * like any GGUF (gguf_write.h): the input's key/values, the shard's keys,
 * and the tensors it holds, taken in the input's order straight from its
 * mapping; a shard image lays the same file out without writing it. */
#include "model/shard.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/fmap.h"
#include "model/fingerprint.h"
#include "model/gguf_write.h"
#include "model/llama.h"
#include "model/quantize.h"

bool cv_shard_is(const gguf_file *f) { return cv_gguf_find_kv(f, CV_SHARD_KEY_FIRST) != NULL; }

int cv_shard_range(const gguf_file *f, int32_t n_layer, int32_t *first, int32_t *last, char *err, size_t errlen)
{
    *first = 0;
    *last = n_layer;
    if (!cv_shard_is(f))
        return 0;
    uint32_t l0, l1, n;
    if (cv_gguf_get_u32(f, CV_SHARD_KEY_FIRST, &l0, err, errlen) ||
        cv_gguf_get_u32(f, CV_SHARD_KEY_LAST, &l1, err, errlen) ||
        cv_gguf_get_u32(f, CV_SHARD_KEY_N_LAYER, &n, err, errlen))
        return -1;
    if (n != (uint32_t)n_layer || l0 >= l1 || l1 > n)
        return cv_errf(err, errlen, "%s: shard of layers [%u, %u) of %u, but the model has %d layers", f->name, l0, l1,
                       n, n_layer);
    *first = (int32_t)l0;
    *last = (int32_t)l1;
    return 0;
}

/* What every shard of a model shares: the model (no layers bound), the
 * hash of its tensor directory, and its tensor names as C strings (the
 * writer takes them). */
typedef struct shard_src {
    const cv_llama *m;
    bool tied; /* no output.weight: the last shard takes token_embd for the output */
    uint8_t dir[CV_HASH_BYTES];
    char **names;
} shard_src;

static void shard_src_free(shard_src *s)
{
    for (uint64_t i = 0; s->names && i < s->m->gguf.n_tensors; i++)
        cv_free(s->names[i]);
    cv_free(s->names);
    s->names = NULL;
}

static int shard_src_init(shard_src *s, const cv_llama *m, char *err, size_t errlen)
{
    *s = (shard_src){.m = m, .tied = cv_gguf_find_tensor(&m->gguf, "output.weight") == NULL};
    if (cv_shard_is(&m->gguf))
        return cv_errf(err, errlen, "%s is a shard already: split the whole model", m->gguf.name);
    if (cv_model_dir_hash(&m->gguf, s->dir, err, errlen))
        return -1;
    s->names = cv_calloc(m->gguf.n_tensors ? m->gguf.n_tensors : 1, sizeof *s->names);
    for (uint64_t i = 0; s->names && i < m->gguf.n_tensors; i++)
        if (!(s->names[i] = cv_gguf_str_dup(m->gguf.tensors[i].name))) {
            shard_src_free(s);
            return cv_errf(err, errlen, "out of memory");
        }
    return s->names ? 0 : cv_errf(err, errlen, "out of memory");
}

/* Whether input tensor `name` belongs in the shard of layers [l0, l1). */
static bool holds(const shard_src *s, const char *name, int32_t l0, int32_t l1)
{
    const int32_t n_layer = s->m->hp.n_layer;
    const int layer = cv_quant_layer_of(name);
    if (layer >= 0)
        return layer >= l0 && layer < l1;
    if (!strcmp(name, "token_embd.weight"))
        return l0 == 0 || (s->tied && l1 == n_layer);
    if (!strcmp(name, "output_norm.weight") || !strcmp(name, "output.weight"))
        return l1 == n_layer;
    return true; /* rope_freqs and anything else shared by every layer */
}

/* The writer of the shard of layers [l0, l1): the model's key/values, the
 * shard's keys, and the tensors it holds in the model's order, which go
 * into held[] (when given) as indices of the model's tensors. */
static gguf_writer *shard_writer(const shard_src *s, int32_t l0, int32_t l1, uint64_t *held, uint64_t *n_held)
{
    gguf_writer *w = cv_gguf_writer_create();
    if (!w)
        return NULL;
    const gguf_file *f = &s->m->gguf;
    for (uint64_t i = 0; i < f->n_kv; i++)
        cv_gguf_copy_kv(w, &f->kv[i]);
    cv_gguf_set_u32(w, CV_SHARD_KEY_FIRST, (uint32_t)l0);
    cv_gguf_set_u32(w, CV_SHARD_KEY_LAST, (uint32_t)l1);
    cv_gguf_set_u32(w, CV_SHARD_KEY_N_LAYER, (uint32_t)s->m->hp.n_layer);
    cv_gguf_set_u32(w, CV_SHARD_KEY_N_VOCAB, (uint32_t)s->m->hp.n_vocab);
    cv_gguf_set_arr(w, CV_SHARD_KEY_DIR_HASH, GGUF_UINT8, s->dir, CV_HASH_BYTES);
    *n_held = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (!holds(s, s->names[i], l0, l1))
            continue;
        cv_gguf_add_tensor(w, s->names[i], t->type, t->n_dims, t->ne, t->data, t->size);
        if (held)
            held[*n_held] = i;
        ++*n_held;
    }
    return w;
}

/* The split being written: the whole model and where its shards go. */
typedef struct split_run {
    cv_llama m; /* the input, no layers bound */
    shard_src src;
    const char *dir;
    char stem[256];
} split_run;

/* Writes shard k of n, layers [l0, l1). */
static int write_shard(const split_run *s, int32_t k, int32_t n, int32_t l0, int32_t l1, cv_shard_note_fn note,
                       void *user, char *err, size_t errlen)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s.shard-%d-of-%d.gguf", s->dir, s->stem, k + 1, n) >= (int)sizeof path)
        return cv_errf(err, errlen, "%s: path too long", s->dir);
    uint64_t n_tensors;
    gguf_writer *w = shard_writer(&s->src, l0, l1, NULL, &n_tensors);
    if (!w)
        return cv_errf(err, errlen, "out of memory");
    const int rc = cv_gguf_write(w, path, err, errlen);
    cv_gguf_writer_free(w);
    struct stat st;
    if (rc == 0 && note)
        note(user, k, n, path, l0, l1, n_tensors, stat(path, &st) == 0 ? (uint64_t)st.st_size : 0);
    return rc;
}

static int check_counts(const split_run *s, int32_t n, const int32_t *counts, char *err, size_t errlen)
{
    if (n < 1 || n > CV_SHARD_MAX)
        return cv_errf(err, errlen, "a split has 1 to %d shards, not %d", CV_SHARD_MAX, n);
    int64_t total = 0;
    for (int32_t k = 0; k < n; k++) {
        if (counts[k] < 1)
            return cv_errf(err, errlen, "shard %d would hold %d layers: each holds at least one", k + 1, counts[k]);
        total += counts[k];
    }
    if (total != s->m.hp.n_layer)
        return cv_errf(err, errlen, "the shards hold %lld layers, the model has %d", (long long)total,
                       s->m.hp.n_layer);
    return 0;
}

/* Opens the input (a whole model) and takes what every shard shares. */
static int split_open(split_run *s, const char *in, char *err, size_t errlen)
{
    if (cv_llama_load(&s->m, in, 0, 0, err, errlen) || shard_src_init(&s->src, &s->m, err, errlen))
        return -1;
    const char *base = strrchr(in, '/') ? strrchr(in, '/') + 1 : in;
    snprintf(s->stem, sizeof s->stem, "%s", base);
    const size_t len = strlen(s->stem);
    if (len > 5 && !strcmp(s->stem + len - 5, ".gguf"))
        s->stem[len - 5] = 0;
    return 0;
}

int cv_shard_write(const char *in, const char *dir, int32_t n, const int32_t *counts, cv_shard_note_fn note,
                   void *user, char *err, size_t errlen)
{
    split_run s = {.dir = dir};
    int32_t even[CV_SHARD_MAX];
    int rc = cv_make_dirs(dir, err, errlen) || split_open(&s, in, err, errlen) ? -1 : 0;
    const int32_t n_layer = s.m.hp.n_layer;
    if (rc == 0 && !counts && n >= 1 && n <= CV_SHARD_MAX) { /* the first ones take the odd layers */
        for (int32_t k = 0; k < n; k++)
            even[k] = n_layer / n + (k < n_layer % n);
        counts = even;
    }
    rc = rc || check_counts(&s, n, counts, err, errlen) ? -1 : 0;
    for (int32_t k = 0, l0 = 0; rc == 0 && k < n; l0 += counts[k++])
        rc = write_shard(&s, k, n, l0, l0 + counts[k], note, user, err, errlen);
    shard_src_free(&s.src);
    cv_llama_free(&s.m);
    return rc;
}

int cv_shard_image_make(const cv_llama *m, int32_t l0, int32_t l1, cv_shard_image *img, char *err, size_t errlen)
{
    memset(img, 0, sizeof *img);
    if (l0 < 0 || l0 >= l1 || l1 > m->hp.n_layer)
        return cv_errf(err, errlen, "no shard of layers [%d, %d) in a model of %d", l0, l1, m->hp.n_layer);
    shard_src src;
    if (shard_src_init(&src, m, err, errlen))
        return -1;
    img->tensors = cv_malloc(sizeof(uint64_t) * (m->gguf.n_tensors ? m->gguf.n_tensors : 1));
    gguf_writer *w = img->tensors ? shard_writer(&src, l0, l1, img->tensors, &img->n_tensors) : NULL;
    int rc = w ? cv_gguf_write_layout(w, &img->layout, err, errlen) : cv_errf(err, errlen, "out of memory");
    cv_gguf_writer_free(w);
    shard_src_free(&src);
    if (rc)
        cv_shard_image_free(img);
    return rc;
}

void cv_shard_image_free(cv_shard_image *img)
{
    cv_gguf_layout_free(&img->layout);
    cv_free(img->tensors);
    memset(img, 0, sizeof *img);
}
