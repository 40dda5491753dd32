/* gguf_format.h: what the GGUF reader (gguf.c) and writer (gguf_write.c)
 * share beyond gguf.h: the format's limits and the checked arithmetic both
 * validate with, so the writer refuses exactly what the reader would.
 * Private to those two files. */
#ifndef CONVOY_MODEL_GGUF_FORMAT_H
#define CONVOY_MODEL_GGUF_FORMAT_H

#include <stdbool.h>
#include <stdint.h>

#define GGUF_DEFAULT_ALIGNMENT 32 /* when general.alignment is absent */
#define GGUF_MAX_DIMS 4

static inline bool gguf_is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* a * b into *out; false on uint64 overflow. */
static inline bool gguf_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

#endif
