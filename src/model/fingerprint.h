/* fingerprint.h: a model's identity: its shape (64 bits, for `convoy info`)
 * and its content (BLAKE2b hashes, for the pipeline handshake).
 *
 * Contract:
 * - cv_model_fingerprint hashes (FNV-1a, 64 bit) the value of
 *   general.architecture, every key/value whose key starts with
 *   "<architecture>." (in file order: key, value type, value), and the
 *   tensor directory (count, then per tensor in file order: name, type,
 *   rank, dims, data offset). Tensor data is not read, so it is instant on
 *   any file size; two files with the same architecture keys and tensor
 *   directory get the same fingerprint, whatever their weights.
 * - The content hashes (cv_model_hashes) are BLAKE2b-256 (libsodium's
 *   crypto_generichash): `meta` is H(K || D), K the hash of every
 *   key/value of the file that can change what the model computes (in
 *   file order, as above: all but the descriptive general.* keys, such as
 *   general.name or general.description, and a shard's convoy.shard.*
 *   keys; general.architecture counts), D (cv_model_dir_hash) that of the
 *   tensor directory without data offsets (count, then name, type, rank,
 *   dims), so it covers the tokenizer and hyperparameters; tensor[i] over
 *   tensor i's name, type, rank, dims and data bytes. Integers enter as little-endian bytes, so
 *   every machine gets the same values. Two models hash alike only if they
 *   agree on the tokenizer, the hyperparameters and every weight byte; a
 *   stage compares the hashes of just the tensors it uses.
 * - cv_model_hashes_load gives a file's content hashes, from its cache when
 *   one matches, else by reading every tensor once (n_threads threads over
 *   the file mapping, whose pages are released as they are hashed, so the
 *   process does not keep the file resident) and then writing the cache.
 *   The cache is MODEL.convoy-hashes beside the model, or, where that
 *   cannot be written, $XDG_CACHE_HOME/convoy/ (else ~/.cache/convoy/)
 *   under the model's base name and a hash of its full path. A cache counts
 *   only if its format, checksum, file size, inode, modification time (ns),
 *   tensor count and metadata hash all match the file now; anything else (stale,
 *   truncated, corrupt) is ignored and rewritten, never trusted. Failing to
 *   write a cache is not an error (the note says why). A shard
 *   (model/shard.h) is cached by its own hashes like any file, but loads
 *   with `meta` the whole model's, from its own key/values and the
 *   directory hash its split recorded: the model it serves a part of,
 *   which the head compares. */
#ifndef CONVOY_MODEL_FINGERPRINT_H
#define CONVOY_MODEL_FINGERPRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

#define CV_HASH_BYTES 32

uint64_t cv_model_fingerprint(const gguf_file *f);

typedef struct cv_model_hashes {
    uint8_t meta[CV_HASH_BYTES];
    uint64_t n_tensors;
    uint8_t (*tensor)[CV_HASH_BYTES]; /* [n_tensors], in file order */
} cv_model_hashes;

/* The metadata hash alone (instant: no tensor data is read), and D. */
int cv_model_dir_hash(const gguf_file *f, uint8_t out[CV_HASH_BYTES], char *err, size_t errlen);
int cv_model_meta_hash(const gguf_file *f, uint8_t out[CV_HASH_BYTES], char *err, size_t errlen);
/* Every hash, read from the file now (no cache). */
int cv_model_hashes_compute(const gguf_file *f, int n_threads, cv_model_hashes *h, char *err, size_t errlen);
/* Every hash, from the cache of the file at `path` (f is that file, opened)
 * when it matches, else computed and cached. *cached says which; note
 * receives a sentence for a log (where the hashes came from, the time, the
 * cache written or why not). */
int cv_model_hashes_load(const gguf_file *f, const char *path, int n_threads, cv_model_hashes *h, bool *cached,
                         char *note, size_t notelen, char *err, size_t errlen);
void cv_model_hashes_free(cv_model_hashes *h);
/* The first 8 bytes of a hash as 16 hex digits, for logs. */
void cv_hash_hex8(const uint8_t h[CV_HASH_BYTES], char out[17]);

#endif
