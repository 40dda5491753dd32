/* fuzz_grammar.c: libFuzzer target for the GBNF engine (infer/grammar.h).
 *
 * The input's first part, up to a NUL byte, is a grammar; it must parse or
 * be refused with a message that names a line. The rest is fed one byte at
 * a time: allows must say exactly whether accept takes the byte (a refused
 * byte is skipped, the state unchanged), complete must hold no more than
 * the grammar's start or a taken byte allows, and at the first positions
 * cv_grammar_mask over pieces cut from the rest must equal allows on each.
 * AddressSanitizer and UBSan watch every byte; nothing may allocate after
 * the state is made. tests/fuzz/grammar.dict holds the language's tokens. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/grammar.h"

#define MAX_PIECES 48

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t glen = nul ? (size_t)(nul - data) : size;
    const uint8_t *rest = nul ? nul + 1 : data + size;
    const size_t n = nul ? size - glen - 1 : 0;
    char err[CV_ERRLEN] = "";
    cv_grammar *g = cv_grammar_parse((const char *)data, glen, err, sizeof err);
    if (!g) {
        if (strncmp(err, "line ", 5) != 0)
            abort();
        return 0;
    }
    cv_grammar_state *s = cv_grammar_state_create(g);
    if (!s)
        abort();
    /* pieces: slices of the rest, 1 to 4 bytes, and one empty */
    const char *pc[MAX_PIECES];
    uint32_t pl[MAX_PIECES];
    int np = 0;
    pc[np] = "";
    pl[np++] = 0;
    for (size_t i = 0; i < n && np < MAX_PIECES; i++) {
        pc[np] = (const char *)rest + i;
        pl[np] = (uint32_t)((rest[i] % 4) + 1 <= n - i ? (rest[i] % 4) + 1 : n - i);
        np++;
    }
    cv_grammar_pieces *p = cv_grammar_pieces_create(np, pc, pl);
    if (!p)
        abort();
    float logits[MAX_PIECES];
    const uint64_t before = cv_alloc_count();
    for (size_t i = 0; i < n; i++) {
        if (i < 12) {
            for (int k = 0; k < np; k++)
                logits[k] = 1.0f;
            cv_grammar_mask(s, p, logits);
            for (int k = 0; k < np; k++) {
                const bool a = pl[k] > 0 && cv_grammar_allows(s, pc[k], pl[k]);
                if (a != (logits[k] == 1.0f) || (!a && !(isinf(logits[k]) && logits[k] < 0)))
                    abort();
            }
        }
        const bool a = cv_grammar_allows(s, (const char *)rest + i, 1);
        /* the whole rest at the first bytes only: later ones would make an input quadratic */
        const bool whole = i < 8 && cv_grammar_allows(s, (const char *)rest + i, n - i);
        const int rc = cv_grammar_accept(s, (const char *)rest + i, 1);
        if (a != (rc == 0) || (whole && !a))
            abort();
        (void)cv_grammar_complete(s);
    }
    if (cv_alloc_count() != before)
        abort();
    cv_grammar_state_reset(s);
    if (n && cv_grammar_allows(s, (const char *)rest, n) != (cv_grammar_accept(s, (const char *)rest, n) == 0))
        abort();
    cv_grammar_pieces_free(p);
    cv_grammar_state_free(s);
    cv_grammar_free(g);
    return 0;
}
