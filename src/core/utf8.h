/* utf8.h: text from outside the process: UTF-8 characters, and text made
 * safe to print on a terminal.
 *
 * Contract: cv_utf8_len is the length (1 to 4) of the valid UTF-8
 * character that starts s, of which n bytes are there; 0 when the bytes
 * are not one (a stray continuation byte, an overlong form, a surrogate,
 * past U+10FFFF, cut short). cv_escape copies text[0, len) into out
 * (always NUL-terminated when n > 0, cut to n bytes at a character's end)
 * with every byte that could steer a terminal written as \xNN: C0
 * controls (newlines too), DEL, the C1 controls U+0080..U+009F and the
 * bytes of invalid UTF-8; a backslash becomes \\, so that the output reads
 * back unambiguously. It returns out; 4 * len + 1 bytes always suffice. */
#ifndef CONVOY_CORE_UTF8_H
#define CONVOY_CORE_UTF8_H

#include <stddef.h>

size_t cv_utf8_len(const char *s, size_t n);
/* The value of hex digit c (0-9, a-f, A-F), or -1. */
int cv_hex_digit(char c);
char *cv_escape(char *out, size_t n, const char *text, size_t len);

#endif
