/* fingerprint.h: a 64-bit identity of a model's shape, for the pipeline
 * handshake and `convoy info`.
 *
 * Contract: cv_model_fingerprint hashes (FNV-1a, 64 bit) the value of
 * general.architecture, every key/value whose key starts with
 * "<architecture>." (in file order: key, value type, value), and the tensor
 * directory (count, then per tensor in file order: name, type, rank, dims,
 * data offset). Tensor data is not read, so the hash is instant on any file
 * size. Two files with the same architecture keys and tensor directory get
 * the same fingerprint; integers are hashed as little-endian bytes, so the
 * value is the same on every machine. */
#ifndef CONVOY_MODEL_FINGERPRINT_H
#define CONVOY_MODEL_FINGERPRINT_H

#include <stdint.h>

#include "model/gguf.h"

uint64_t cv_model_fingerprint(const gguf_file *f);

#endif
