/* shard.h: a model cut into per-stage files (`convoy split`), one per
 * pipeline stage, each holding only its layers.
 *
 * Contract: a shard is a GGUF with every key/value of the whole model, the
 * tensors of its layers [first, last) (rope_freqs too when the model has
 * it), token_embd when first == 0, output_norm and the output matrix
 * (token_embd when tied) when last == n_layer; and these keys:
 *   convoy.shard.first, convoy.shard.last (u32): the layers it holds;
 *   convoy.shard.n_layer (u32): the whole model's block count;
 *   convoy.shard.n_vocab (u32): the vocabulary, which a shard without
 *     token_embd cannot tell from its tensors;
 *   convoy.shard.dir_hash (32 x u8): the hash of the whole model's tensor
 *     directory (model/fingerprint.h), which with the shard's own
 *     key/values (the model's) gives the model's metadata hash: the one a
 *     shard answers for, so a shard whose key/values were changed does not
 *     pass for the model's.
 * A tensor's content hash covers only its name, type, dims and data, so it
 * is the same in a shard as in the whole model: a stage compares those of
 * the tensors it reads, shard or not.
 *
 * cv_shard_write cuts the model at `in` into n shards of counts[i] layers
 * (in order, each >= 1, summing to the model's; counts NULL: as equal as
 * they go, the first ones one layer more), named
 * DIR/STEM.shard-K-of-N.gguf (STEM: the input's base name less ".gguf", K
 * from 1); a shard is refused as input. Tensor data is copied from the
 * input's mapping. */
#ifndef CONVOY_MODEL_SHARD_H
#define CONVOY_MODEL_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/llama.h"

#define CV_SHARD_KEY_FIRST "convoy.shard.first"
#define CV_SHARD_KEY_LAST "convoy.shard.last"
#define CV_SHARD_KEY_N_LAYER "convoy.shard.n_layer"
#define CV_SHARD_KEY_N_VOCAB "convoy.shard.n_vocab"
#define CV_SHARD_KEY_DIR_HASH "convoy.shard.dir_hash"
#define CV_SHARD_KEY_PREFIX "convoy.shard." /* keys of the cut, not of the model */
#define CV_SHARD_MAX 64 /* shards one split writes at most */

/* The layers the file holds: [0, n_layer) for a whole model, a shard's
 * range (checked against n_layer, the file's block count) otherwise. */
int cv_shard_range(const gguf_file *f, int32_t n_layer, int32_t *first, int32_t *last, char *err, size_t errlen);
/* Whether f is a shard (it has convoy.shard.first). */
bool cv_shard_is(const gguf_file *f);

/* What cv_shard_write tells of each shard written. */
typedef void (*cv_shard_note_fn)(void *user, int32_t k, int32_t n, const char *path, int32_t first, int32_t last,
                                 uint64_t n_tensors, uint64_t bytes);

int cv_shard_write(const char *in, const char *dir, int32_t n, const int32_t *counts, cv_shard_note_fn note,
                   void *user, char *err, size_t errlen);

/* The file cv_shard_write writes for layers [l0, l1) of the whole model m
 * (its file mapped, no layers need be bound), laid out without writing it:
 * its header and each of its tensors' offset in it (layout), and which
 * of m's tensors those are (tensors[k], an index into m's, for
 * layout.offsets[k]), so that a head can send it byte for byte. */
typedef struct cv_shard_image {
    gguf_layout layout;
    uint64_t *tensors;
    uint64_t n_tensors;
} cv_shard_image;

int cv_shard_image_make(const cv_llama *m, int32_t l0, int32_t l1, cv_shard_image *img, char *err, size_t errlen);
void cv_shard_image_free(cv_shard_image *img);

#endif
