/* fuzz_schema.c: libFuzzer target for the JSON schema compiler (serve/schema.h).
 *
 * The input is JSON text; what jansson refuses is skipped. A schema is
 * compiled, or refused with a message that names the schema's place; a
 * compiled grammar stays within CONVOY_GRAMMAR_TEXT_MAX bytes and must
 * parse (infer/grammar.h), since every compiled schema reaches a slot.
 * Run with -rss_limit_mb=256 -timeout=1: the compiler's budgets must hold
 * any input to that. tests/fuzz/schema.dict holds the keywords. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "convoy.h"
#include "core/alloc.h"
#include "core/err.h"
#include "infer/grammar.h"
#include "serve/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (!schema)
        return 0;
    char err[CV_ERRLEN] = "";
    char *text = cv_schema_grammar(schema, err, sizeof err);
    json_decref(schema);
    if (!text) {
        if (strncmp(err, "response_format schema", 22) != 0)
            abort();
        return 0;
    }
    const size_t len = strlen(text);
    if (len > CONVOY_GRAMMAR_TEXT_MAX)
        abort();
    cv_grammar *g = cv_grammar_parse(text, len, err, sizeof err);
    /* the parser's own caps (rules, elements after repetition) may refuse a legal text; nothing else */
    if (!g && !strstr(err, "over") && !strstr(err, "more than"))
        abort();
    cv_grammar_free(g);
    cv_free(text);
    return 0;
}
