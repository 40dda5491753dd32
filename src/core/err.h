/* err.h: error reporting by message buffer.
 *
 * Contract: every function that can fail returns 0 on success and -1 on
 * failure, and on failure writes one human-readable sentence into the
 * caller's buffer `err` of `errlen` bytes (always NUL-terminated, truncated
 * if needed). The message names the object and the problem, for example
 * "model.gguf: tensor 'blk.3.attn_q.weight' extends past end of file (...)".
 * A NULL `err` is allowed and discards the message. */
#ifndef CONVOY_CORE_ERR_H
#define CONVOY_CORE_ERR_H

#include <stddef.h>

#define CV_ERRLEN 512

#if defined(__GNUC__)
#define CV_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CV_PRINTF(a, b)
#endif

/* Writes the formatted message into err and returns -1, so that a failure
 * path reads `return cv_errf(err, errlen, "...", ...);`. */
int cv_errf(char *err, size_t errlen, const char *fmt, ...) CV_PRINTF(3, 4);

#endif
