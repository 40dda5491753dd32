/* regex.h: a JSON schema's "pattern" (an ECMAScript regular expression, as
 * JSON Schema reads it) compiled into a GBNF expression over the text
 * between a JSON string's quotes; and the GBNF literal writer that the
 * schema compiler shares.
 *
 * Contract: cv_regex_gbnf reads pattern[0, len) (untrusted: any bytes)
 * and returns a GBNF expression (release with cv_free) whose sentences are
 * JSON string contents that decode to a string the pattern matches, or
 * NULL with one sentence in err naming what it refuses and the byte of the
 * pattern where it stands. Matching is a search, as JSON Schema means it:
 * a top-level alternative that does not begin with ^ may follow any text,
 * one that does not end with $ may be followed by any; that text is
 * any_char* (any_char: the name of a rule for one JSON string character in
 * any of its encodings). What the pattern itself places is written in one
 * encoding: a character as itself, or escaped where JSON must (\" \\ \b \f
 * \n \r \t, \u00xx for other control characters and DEL). U+0000 and lone
 * surrogates are never written: a class left with nothing else is refused.
 *
 * Understood, over code points (ajv's "u" flag): literal characters; the
 * escapes of syntax characters (\. \\ \/ \* ...; \- in classes), \n \t \r
 * \f \v \0 \xHH \uHHHH (surrogate pairs joined) \u{H...}; . (any character
 * but \n \r U+2028 U+2029); classes [...] and [^...] with ranges; \d \w \s
 * \D \W \S in and out of classes ([\b]: backspace); groups (...) and
 * (?:...); alternation |; * + ? {n} {n,} {n,m}, lazy or not (the same
 * language); ^ at the start and $ at the end of a top-level alternative.
 * Refused by name: backreferences, lookahead, lookbehind, named groups,
 * word boundaries \b \B, inline flags (?i), property escapes \p{...},
 * other escapes, anchors elsewhere, * + {n,} on what may match the empty
 * string (GBNF refuses a loop that may consume nothing), bounds over
 * CV_REGEX_MAX_REPEAT, repetitions that expand the pattern past
 * CV_REGEX_MAX_EXPANSION characters, groups nested past
 * CV_REGEX_MAX_NESTING, and syntax errors.
 * Time and memory grow linearly with len (times the nesting limit, which
 * also bounds the recursion).
 *
 * cv_gbnf_literal is the GBNF string literal of s[0, n): '"', '\' and
 * control bytes escaped, other bytes as they are (NULL when out of memory). */
#ifndef CONVOY_SERVE_REGEX_H
#define CONVOY_SERVE_REGEX_H

#include <stddef.h>

#define CV_REGEX_MAX_REPEAT 1000     /* the largest n or m in {n,m} */
#define CV_REGEX_MAX_EXPANSION 4096  /* characters and classes once every repetition is written out */
#define CV_REGEX_MAX_NESTING 32      /* groups inside groups */

char *cv_regex_gbnf(const char *pattern, size_t len, const char *any_char, char *err, size_t errlen);
char *cv_gbnf_literal(const char *s, size_t n);

#endif
