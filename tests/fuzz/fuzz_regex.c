/* fuzz_regex.c: libFuzzer target for the pattern compiler (serve/regex.h).
 *
 * The input's first part, up to a NUL byte, is a pattern (any bytes: the
 * compiler reads untrusted text); the rest is the text of a JSON string's
 * contents. A pattern compiles, or is refused with a message that names
 * its byte; a compiled expression must make a grammar that parses (only
 * the GBNF parser's own caps may refuse it), and the text is then fed to
 * it byte by byte. Run with -rss_limit_mb=256 -timeout=1: the compiler's
 * caps (repetition bounds, expansion, nesting) must hold any input to
 * that. tests/fuzz/regex.dict holds the syntax. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/grammar.h"
#include "serve/regex.h"

/* one JSON string character, in any encoding */
#define CHAR_RULE "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t plen = nul ? (size_t)(nul - data) : size;
    char err[CV_ERRLEN] = "";
    char *expr = cv_regex_gbnf((const char *)data, plen, "char", err, sizeof err);
    if (!expr) {
        if (!strstr(err, " of the pattern)"))
            abort();
        return 0;
    }
    const size_t n = strlen(expr) + sizeof CHAR_RULE + 64;
    char *text = cv_malloc(n);
    if (!text)
        abort();
    snprintf(text, n, "root ::= \"\\\"\" %s \"\\\"\"\n" CHAR_RULE, expr);
    cv_free(expr);
    cv_grammar *g = cv_grammar_parse(text, strlen(text), err, sizeof err);
    cv_free(text);
    if (!g) {
        if (!strstr(err, "over") && !strstr(err, "more than"))
            abort();
        return 0;
    }
    cv_grammar_state *st = cv_grammar_state_create(g);
    if (st) {
        cv_grammar_accept(st, "\"", 1);
        for (size_t i = plen + 1; i < size; i++)
            cv_grammar_accept(st, (const char *)data + i, 1);
        cv_grammar_complete(st);
        cv_grammar_state_free(st);
    }
    cv_grammar_free(g);
    return 0;
}
