/* test_schema.c: JSON schemas compiled into GBNF (serve/schema.h): the text
 * of a few small grammars; refusals naming the keyword and its JSON
 * pointer; and, through the grammar matcher (infer/grammar.h), valid
 * instances accepted byte by byte and invalid ones (missing required
 * property, wrong type, extra property under additionalProperties false,
 * too many items, enum miss, out of range...) refused, with integer and
 * number ranges checked against every value of a window around them;
 * each construct of a pattern (serve/regex.h) taken and refused as
 * ECMAScript means it, searches and anchors, and what is refused named
 * with its place. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/err.h"
#include "infer/grammar.h"
#include "serve/schema.h"
#include "test.h"

static char *compile(const char *schema_text, char *err, size_t errlen)
{
    json_error_t je;
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (!s) {
        snprintf(err, errlen, "bad test schema: %s", je.text);
        return NULL;
    }
    char *g = cv_schema_grammar(s, err, errlen);
    json_decref(s);
    return g;
}

/* 1: the text is a complete sentence, fed one byte at a time; 0: refused somewhere or incomplete;
 * -1: the grammar does not parse. */
static int matches(const cv_grammar *g, const char *text)
{
    cv_grammar_state *st = cv_grammar_state_create(g);
    if (!st)
        return -1;
    int ok = 1;
    for (size_t i = 0; text[i] && ok; i++)
        if (cv_grammar_accept(st, text + i, 1))
            ok = 0;
    if (ok && !cv_grammar_complete(st))
        ok = 0;
    cv_grammar_state_free(st);
    return ok;
}

typedef struct probe {
    const char *text;
    int valid;
} probe;

/* Compiles schema, parses the grammar, and checks each probe. */
static void check_schema(const char *schema, const probe *p, int n)
{
    char err[CV_ERRLEN];
    char *text = compile(schema, err, sizeof err);
    CHECKF(text != NULL, "%s: %s", schema, err);
    if (!text)
        return;
    cv_grammar *g = cv_grammar_parse(text, strlen(text), err, sizeof err);
    CHECKF(g != NULL, "%s: grammar refused: %s\n%s", schema, err, text);
    if (!g) {
        free(text);
        return;
    }
    for (int i = 0; i < n; i++) {
        const int m = matches(g, p[i].text);
        CHECKF(m == p[i].valid, "schema %s: %s should be %s\n%s", schema, p[i].text,
               p[i].valid ? "accepted" : "refused", text);
    }
    cv_grammar_free(g);
    free(text);
}

#define CHECK_SCHEMA(schema, ...)                                                  \
    do {                                                                           \
        static const probe probes_[] = {__VA_ARGS__};                              \
        check_schema(schema, probes_, (int)(sizeof probes_ / sizeof probes_[0]));  \
    } while (0)

static void test_text(void)
{
    char err[CV_ERRLEN];
    char *g = compile("{\"type\":\"boolean\"}", err, sizeof err);
    CHECK(g && !strcmp(g, "root ::= boolean\nboolean ::= \"true\" | \"false\"\n"));
    free(g);
    g = compile("{\"enum\":[\"a\",1,null]}", err, sizeof err);
    CHECKF(g && !strcmp(g, "root ::= ( \"\\\"a\\\"\" | \"1\" | \"null\" )\n"), "%s", g);
    free(g);
    g = compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":12}},"
                "\"required\":[\"a\"],\"additionalProperties\":false}",
                err, sizeof err);
    CHECKF(g && strstr(g, "root ::= \"{\" a-kv  \"}\"\n") && strstr(g, "a-kv ::= \"\\\"a\\\":\" ws ") &&
               strstr(g, "ws ::= \" \"?\n"),
           "%s", g);
    free(g);
    g = compile("{\"type\":\"string\",\"maxLength\":3}", err, sizeof err);
    CHECKF(g && strstr(g, "root ::= \"\\\"\" char{0,3} \"\\\"\"\n"), "%s", g);
    free(g);
    g = cv_schema_any_object_grammar();
    CHECK(g && !strncmp(g, "root ::= object\n", 16) && strstr(g, "ws ::= \" \"?\n"));
    free(g);
}

static void refused(const char *schema, const char *needle1, const char *needle2)
{
    char err[CV_ERRLEN] = "";
    char *g = compile(schema, err, sizeof err);
    CHECKF(g == NULL, "%s compiled:\n%s", schema, g);
    CHECKF(strstr(err, needle1) && (!needle2 || strstr(err, needle2)), "%s: message \"%s\" lacks \"%s\" / \"%s\"",
           schema, err, needle1, needle2 ? needle2 : "");
    free(g);
}

static void test_refusals(void)
{
    refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}}}", "lookahead",
            "#/properties/a/pattern");
    refused("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems", NULL);
    refused("{\"type\":\"number\",\"multipleOf\":2}", "multipleOf", NULL);
    refused("{\"type\":\"object\",\"minProperties\":1}", "minProperties", NULL);
    refused("{\"not\":{}}", "\"not\"", NULL);
    refused("{\"type\":\"strin\"}", "unknown type \"strin\"", "#/type");
    refused("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}}}",
            "without consuming input", NULL);
    refused("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}}}",
            "without consuming input", NULL);
    refused("{\"$ref\":\"#/$defs/nope\"}", "cannot be resolved", NULL);
    refused("{\"$ref\":\"http://x/y\"}", "cannot be resolved", NULL);
    refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer", NULL);
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems", NULL);
    refused("{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", "minItems", NULL);
    refused("{\"type\":\"string\",\"maxLength\":-1}", "maxLength", "#/maxLength");
    refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
            "\"b\"", NULL);
    refused("{\"enum\":[1,2],\"type\":\"string\"}", "no value", NULL);
    refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":2}]}", "object schemas only", NULL);
    refused("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"string\"}}},{\"properties\":{\"a\":{\"type\":"
            "\"integer\"}}}]}",
            "two different schemas", NULL);
    refused("false", "admits no value", NULL);
    /* additionalProperties false next to allOf sees no properties of its own */
    refused("{\"allOf\":[{\"properties\":{\"a\":{}},\"required\":[\"a\"]}],\"properties\":{},"
            "\"additionalProperties\":false}",
            "excludes", NULL);
}

static void test_objects(void)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2}},"
                    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    CHECK_SCHEMA(s, {"{\"name\":\"Bob\",\"age\":42}", 1}, {"{\"name\": \"Bob\", \"age\": -7}", 1},
                 {"{\"name\":\"B\\u00e9\\n\",\"age\":0,\"tags\":[]}", 1},
                 {"{\"name\":\"\xc3\xa9t\xc3\xa9\",\"age\":1,\"tags\":[\"a\", \"b\"]}", 1},
                 {"{\"name\":\"Bob\"}", 0},                            /* missing required */
                 {"{\"age\":1}", 0},                                   /* missing required */
                 {"{\"name\":\"Bob\",\"age\":\"42\"}", 0},             /* wrong type */
                 {"{\"name\":\"Bob\",\"age\":4.5}", 0},                /* not an integer */
                 {"{\"name\":\"Bob\",\"age\":1,\"x\":1}", 0},          /* extra property */
                 {"{\"name\":\"Bob\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}", 0}, /* too many items */
                 {"{\"age\":1,\"name\":\"Bob\"}", 0},                  /* out of order (a subset) */
                 {"{\"name\":\"a\nb\",\"age\":1}", 0},                 /* raw control character */
                 {"{\"name\":\"\\ud800\",\"age\":1}", 0},              /* lone surrogate escape */
                 {"{\"name\":\"Bob\",\"age\":01}", 0},                 /* leading zero */
                 {"{\"name\":\"Bob\",\"age\":1}  ", 0},                /* trailing whitespace */
                 {"{\"name\":\"Bob\",  \"age\":1}", 0});               /* two spaces */
    /* optional members in any combination, in order */
    CHECK_SCHEMA("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"},"
                 "\"c\":{\"const\":\"x\"}},\"required\":[\"b\"],\"additionalProperties\":false}",
                 {"{\"b\":true}", 1}, {"{\"a\":null,\"b\":false}", 1}, {"{\"b\":true,\"c\":\"x\"}", 1},
                 {"{\"a\":null,\"b\":true,\"c\":\"x\"}", 1}, {"{}", 0}, {"{\"a\":null}", 0},
                 {"{\"b\":true,\"c\":\"y\"}", 0}, {"{\"b\":true,}", 0}, {"{,\"b\":true}", 0});
    /* additional properties: absent means any extra key (not a listed one) after the listed ones */
    CHECK_SCHEMA("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":{\"type\":\"integer\"}}}",
                 {"{}", 1}, {"{\"a\":1}", 1}, {"{\"a\":1,\"x\":[1,{\"y\":null}]}", 1}, {"{\"abc\":\"s\"}", 1},
                 {"{\"\":1}", 1}, {"{\"a\":1,\"a\":\"s\"}", 0}, {"{\"ab\":\"s\"}", 0}, {"{\"a\":\"s\"}", 0});
    CHECK_SCHEMA("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}", {"{}", 1},
                 {"{\"x\":1.5,\"y\":-2e10}", 1}, {"{\"x\":\"1\"}", 0});
    /* any object */
    char *text = cv_schema_any_object_grammar();
    char err[CV_ERRLEN];
    cv_grammar *g = text ? cv_grammar_parse(text, strlen(text), err, sizeof err) : NULL;
    CHECKF(g != NULL, "%s", err);
    if (g) {
        CHECK(matches(g, "{}") == 1);
        CHECK(matches(g, "{\"a\": [1, 2.5e-3, true, null, {\"b\": \"c\"}], \"d\": {}}") == 1);
        CHECK(matches(g, "[]") == 0);
        CHECK(matches(g, "\"x\"") == 0);
        CHECK(matches(g, "{\"a\":}") == 0);
        CHECK(matches(g, "{\"a\":1e999}") == 0);
        cv_grammar_free(g);
    }
    free(text);
}

static void test_arrays_strings(void)
{
    CHECK_SCHEMA("{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\"]},\"minItems\":1,\"maxItems\":3}",
                 {"[\"red\"]", 1}, {"[\"red\", \"green\",\"red\"]", 1}, {"[]", 0}, {"[\"blue\"]", 0},
                 {"[\"red\",\"red\",\"red\",\"red\"]", 0});
    CHECK_SCHEMA("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}",
                 {"[]", 1}, {"[1]", 1}, {"[1,\"a\"]", 1}, {"[1,\"a\",2]", 0}, {"[\"a\"]", 0});
    CHECK_SCHEMA("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"boolean\"},"
                 "\"minItems\":2,\"maxItems\":3}",
                 {"[1,true]", 1}, {"[1,true,false]", 1}, {"[1]", 0}, {"[1,true,false,true]", 0}, {"[1,2]", 0});
    CHECK_SCHEMA("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", 1}, {"\"a\\\"c\"", 1},
                 {"\"\xe2\x82\xac\xe2\x82\xac\"", 1}, {"\"a\"", 0}, {"\"abcd\"", 0});
    CHECK_SCHEMA("{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-29\"", 1}, {"\"2023-12-31\"", 1},
                 {"\"2000-02-29\"", 1}, {"\"2023-02-29\"", 0}, {"\"1900-02-29\"", 0}, {"\"2023-04-31\"", 0},
                 {"\"2023-13-01\"", 0});
    CHECK_SCHEMA("{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-01-02T03:04:05Z\"", 1},
                 {"\"2024-01-02T23:59:59.123+05:30\"", 1}, {"\"2024-01-02T24:00:00Z\"", 0},
                 {"\"2024-01-02T03:04:05\"", 0});
    CHECK_SCHEMA("{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\"", 1},
                 {"\"123e4567-e89b-12d3-a456-42661417400\"", 0});
    CHECK_SCHEMA("{\"type\":[\"string\",\"null\"],\"maxLength\":1}", {"null", 1}, {"\"a\"", 1}, {"\"ab\"", 0},
                 {"1", 0});
}

static void test_combinators(void)
{
    const char *tree = "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{"
                       "\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
                       "\"required\":[\"v\"],\"additionalProperties\":false}}}";
    CHECK_SCHEMA(tree, {"{\"v\":1}", 1}, {"{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}", 1},
                 {"{\"v\":1,\"kids\":[{}]}", 0});
    CHECK_SCHEMA("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},"
                 "\"required\":[\"a\"],\"additionalProperties\":false}]}",
                 {"5", 1}, {"{\"a\":1}", 1}, {"{\"a\":2}", 0}, {"\"5\"", 0});
    CHECK_SCHEMA("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
                 "{\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
                 {"{\"a\":\"x\",\"b\":true}", 1}, {"{\"a\":\"x\",\"b\":true,\"c\":1}", 1}, {"{\"a\":\"x\"}", 0},
                 {"{\"b\":true}", 0}, {"{\"a\":\"x\",\"b\":true,\"b\":1}", 0});
    CHECK_SCHEMA("{\"definitions\":{\"c\":{\"enum\":[\"x\",\"y\"]}},\"type\":\"object\",\"properties\":{\"c\":{"
                 "\"$ref\":\"#/definitions/c\"}},\"required\":[\"c\"],\"additionalProperties\":false,\"title\":\"T\"}",
                 {"{\"c\":\"x\"}", 1}, {"{\"c\":\"z\"}", 0});
    CHECK_SCHEMA("{\"type\":[\"number\",\"integer\"]}", {"1", 1}, {"-1.5e3", 1}, {"1.", 0}, {".5", 0});
}

/* ---- pattern ------------------------------------------------------------------------------------------ */

/* The schema {"type":"string","pattern":pat} checked against probes, each the text between a JSON string's
 * quotes. */
static void check_pattern(const char *pat, const probe *p, int n)
{
    json_t *s = json_pack("{s:s,s:s}", "type", "string", "pattern", pat);
    char *schema = json_dumps(s, JSON_COMPACT);
    probe q[32];
    char texts[32][2100];
    for (int i = 0; i < n && i < 32; i++) {
        snprintf(texts[i], sizeof texts[i], "\"%s\"", p[i].text);
        q[i] = (probe){texts[i], p[i].valid};
    }
    check_schema(schema, q, n < 32 ? n : 32);
    free(schema);
    json_decref(s);
}

#define CHECK_PATTERN(pat, ...)                                                    \
    do {                                                                           \
        static const probe probes_[] = {__VA_ARGS__};                              \
        check_pattern(pat, probes_, (int)(sizeof probes_ / sizeof probes_[0]));    \
    } while (0)

/* pat refused at #/properties/p/pattern with a message holding needle. */
static void refused_pattern(const char *pat, const char *needle)
{
    json_t *s = json_pack("{s:s,s:{s:{s:s,s:s}}}", "type", "object", "properties", "p", "type", "string", "pattern",
                          pat);
    char *schema = json_dumps(s, JSON_COMPACT);
    refused(schema, needle, "\"#/properties/p/pattern\"");
    free(schema);
    json_decref(s);
}

/* Each construct of regex.h: the strings it takes and those it does not, anchored and not. */
static void test_pattern_constructs(void)
{
    char err[CV_ERRLEN];
    char *g = compile("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}$\"}", err, sizeof err);
    CHECKF(g && strstr(g, "root ::= \"\\\"\" [A-Z]{2} \"-\" [0-9]{3,4} \"\\\"\"\n"), "%s", g ? g : err);
    free(g);
    CHECK_PATTERN("^[A-Z]{2}-\\d{3,4}$", {"AB-123", 1}, {"ZZ-0000", 1}, {"AB-12", 0}, {"AB-12345", 0},
                  {"ab-123", 0}, {"XAB-123", 0}, {"AB-123x", 0}, {"AB123", 0});
    /* no anchors: a search, any text around the match */
    CHECK_PATTERN("(cat|dog)s?", {"cat", 1}, {"hotdogs!", 1}, {"a cat", 1}, {"dogcat", 1}, {"cow", 0}, {"", 0},
                  {"ca t", 0});
    CHECK_PATTERN("^(cat|dog)s?", {"cats and", 1}, {"dog", 1}, {"a cat", 0});
    CHECK_PATTERN("(cat|dog)$", {"hotdog", 1}, {"cat", 1}, {"dogs", 0});
    CHECK_PATTERN("^a|b$", {"axx", 1}, {"xxb", 1}, {"a", 1}, {"xax", 0}, {"bxx", 0});
    CHECK_PATTERN("", {"", 1}, {"anything \\\" at all", 1});
    CHECK_PATTERN("^$", {"", 1}, {"a", 0});
    /* '.': any character but line terminators, written as JSON writes it */
    CHECK_PATTERN("^a.c$", {"abc", 1}, {"a\\\"c", 1}, {"a\\\\c", 1}, {"a\\tc", 1}, {"a\xc3\xa9" "c", 1},
                  {"a\\u0001c", 1}, {"a\\u007fc", 1}, {"a\\nc", 0}, {"a\\rc", 0}, {"a\xe2\x80\xa8" "c", 0},
                  {"ac", 0}, {"a\"c", 0}, {"a\x7f" "c", 0}, {"a\\u00e9c", 0} /* one encoding: é as itself */);
    /* classes, ranges, negation */
    CHECK_PATTERN("^[a-z0-9_]+$", {"abc_09", 1}, {"z", 1}, {"aB", 0}, {"", 0}, {"a-b", 0});
    CHECK_PATTERN("^[^a-z]$", {"A", 1}, {"\\\"", 1}, {"\\\\", 1}, {"\\n", 1}, {"\\u0001", 1}, {"\\u007f", 1},
                  {"\xe2\x82\xac", 1}, {"a", 0}, {"", 0}, {"AB", 0});
    CHECK_PATTERN("^[-a]+[a-]*[\\]\\-]$", {"-a-]", 1}, {"a-", 1}, {"a]", 1}, {"ab", 0});
    CHECK_PATTERN("^[^]$", {"x", 1}, {"\\n", 1}, {"", 0});
    /* \d \w \s and their complements, outside and inside classes */
    CHECK_PATTERN("^\\d\\w\\s$", {"1a ", 1}, {"9_\\t", 1}, {"0Z\\n", 1}, {"1a\xc2\xa0", 1}, {"a1 ", 0},
                  {"1- ", 0}, {"1ax", 0});
    CHECK_PATTERN("^\\D\\W\\S$", {"a b", 1}, {"a!b", 1}, {"1!b", 0}, {"a_b", 0}, {"a! ", 0}, {"a!\\t", 0});
    CHECK_PATTERN("^[\\d\\s-]+$", {"1 2-3", 1}, {"\\t", 1}, {"a", 0});
    CHECK_PATTERN("^[^\\S]$", {" ", 1}, {"\\u000b", 1}, {"a", 0});
    CHECK_PATTERN("^[\\b]$", {"\\b", 1}, {"b", 0});
    /* groups, alternation, quantifiers (lazy ones the same) */
    CHECK_PATTERN("^(?:ab|c){2,3}d*?e+f?$", {"abce", 1}, {"ccabdddeef", 1}, {"cabde", 1}, {"abe", 0},
                  {"ababababe", 0}, {"abcf", 0});
    CHECK_PATTERN("^x{2,}y{0}z{3}$", {"xxzzz", 1}, {"xxxxxzzz", 1}, {"xzzz", 0}, {"xxyzzz", 0}, {"xxzz", 0});
    CHECK_PATTERN("^((a|b)c)+?$", {"ac", 1}, {"acbcac", 1}, {"", 0}, {"ab", 0});
    CHECK_PATTERN("^(|a){2}b$", {"b", 1}, {"ab", 1}, {"aab", 1}, {"aaab", 0});
    /* escapes, and the characters JSON escapes written escaped */
    CHECK_PATTERN("^\\.\\\\\\/\\n\\t\\u00e9\\x41\\u{1F600}\\uD83D\\uDE00$",
                  {".\\\\/\\n\\t\xc3\xa9" "A\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 1},
                  {".\\\\\\/\\n\\t\xc3\xa9" "A\xf0\x9f\x98\x80\xf0\x9f\x98\x80", 0}, {"x\\\\/\\n\\t\xc3\xa9" "A", 0});
    CHECK_PATTERN("^say \"hi\"$", {"say \\\"hi\\\"", 1}, {"say hi", 0});
    CHECK_PATTERN("^[\\x00-\\x1f]+$", {"\\n\\u0001\\u001f", 1}, {"\\u0000", 0}, {" ", 0});
    /* pattern applies to strings: it implies the type, and other types are left alone */
    CHECK_SCHEMA("{\"pattern\":\"^a$\"}", {"\"a\"", 1}, {"\"b\"", 0}, {"1", 0});
    CHECK_SCHEMA("{\"type\":[\"string\",\"null\"],\"pattern\":\"^a+$\"}", {"null", 1}, {"\"aa\"", 1}, {"\"\"", 0});
    CHECK_SCHEMA("{\"type\":\"object\",\"properties\":{\"date\":{\"type\":\"string\",\"pattern\":"
                 "\"^\\\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\\\d|3[01])$\"}},\"required\":[\"date\"],"
                 "\"additionalProperties\":false}",
                 {"{\"date\":\"2024-02-29\"}", 1}, {"{\"date\":\"2024-13-01\"}", 0}, {"{\"date\":\"24-01-01\"}", 0});
}

/* The largest bound: a string of 1,000 characters takes {0,1000}, one more does not. */
static void test_pattern_bounds(void)
{
    static char text[1002];
    memset(text, 'a', 1001);
    const probe p[] = {{text + 1, 1}, {text, 0}};
    check_pattern("^a{0,1000}$", p, 2);
}

/* Refused by name, with the pattern's place. */
static void test_pattern_refusals(void)
{
    refused_pattern("a(?=b)", "lookahead (?=");
    refused_pattern("a(?!b)", "lookahead (?!");
    refused_pattern("(?<=a)b", "lookbehind (?<=");
    refused_pattern("(?<!a)b", "lookbehind (?<!");
    refused_pattern("(?<year>\\d{4})", "named group");
    refused_pattern("(a)\\1", "backreference \\1");
    refused_pattern("(?<n>a)\\k<n>", "named group");
    refused_pattern("\\k<n>", "named backreference");
    refused_pattern("\\bword", "word boundary \\b");
    refused_pattern("a\\B", "word boundary \\B");
    refused_pattern("(?i)abc", "inline flags");
    refused_pattern("\\p{L}+", "Unicode property escape \\p");
    refused_pattern("[\\P{L}]", "Unicode property escape \\P");
    refused_pattern("\\q", "the escape \\q");
    refused_pattern("\\cA", "the escape \\c");
    refused_pattern("[\\1]", "octal escape");
    refused_pattern("a^b", "anchor ^ inside the pattern");
    refused_pattern("a$b", "anchor $ inside the pattern");
    refused_pattern("(^a)", "anchor ^ inside the pattern");
    refused_pattern("a{1001}", "repetition bound over 1000");
    refused_pattern("a{5,2}", "minimum passes its maximum");
    refused_pattern("(a{0,100}){0,100}", "more than 4096 characters");
    refused_pattern("(a?)*", "may match the empty string");
    refused_pattern("(a|)+", "may match the empty string");
    refused_pattern("(a*){2,}", "may match the empty string");
    refused_pattern("(a", "not closed");
    refused_pattern("a)", "closes no group");
    refused_pattern("[a", "class [ is not closed");
    refused_pattern("a{x}", "not a quantifier");
    refused_pattern("a{2", "not a quantifier");
    refused_pattern("*a", "nothing to repeat");
    refused_pattern("a**", "nothing to repeat");
    refused_pattern("^*", "nothing to repeat");
    refused_pattern("a]", "lone ']'");
    refused_pattern("[z-a]", "out of order");
    refused_pattern("[\\d-z]", "\\d, \\w or \\s at an end");
    refused_pattern("\\0", "matches nothing");
    refused_pattern("[]", "matches nothing");
    refused_pattern("\\uD800", "matches nothing");
    refused_pattern("a\\", "backslash ends the pattern");
    refused_pattern("\\x4", "two hex digits");
    refused_pattern("\\u{110000}", "up to 10FFFF");
    char deep[80] = "";
    for (int i = 0; i < 33; i++)
        strcat(deep, "(");
    strcat(deep, "a");
    for (int i = 0; i < 33; i++)
        strcat(deep, ")");
    refused_pattern(deep, "nested more than 32 deep");
    deep[33] = 0;
    refused_pattern(deep, "nested more than 32 deep"); /* the limit is met before the missing ')' */
    char wide[400] = "[";
    for (int i = 0; i < 130; i++) /* U+0100, U+0102, ...: 130 ranges */
        snprintf(wide + strlen(wide), sizeof wide - strlen(wide), "%c%c", 0xC4 + i / 32, 0x80 + (i % 32) * 2);
    strcat(wide, "]");
    refused_pattern(wide, "more than 128 ranges");
    static char longer[6000];
    memset(longer, 'a', sizeof longer - 1);
    refused_pattern(longer, "more than 4096 characters");
    /* what cannot be combined exactly */
    refused("{\"type\":\"string\",\"pattern\":\"^a+$\",\"maxLength\":3}", "minLength/maxLength next to pattern",
            "#/pattern");
    refused("{\"type\":\"string\",\"pattern\":\"^2\",\"format\":\"date\"}", "format \"date\" next to pattern",
            "#/pattern");
    refused("{\"type\":\"string\",\"pattern\":5}", "pattern must be a string", "#/pattern");
    refused("{\"enum\":[\"a\"],\"pattern\":\"a\"}", "\"pattern\" next to enum/const", NULL);
}

/* Every integer in a window: accepted exactly when within [lo, hi]. */
/* Under ASan (CONVOY_SANITIZED) a grammar state costs 50 times more: the
 * windows then take every SPARSE-th value, and every bound's neighbours. */
#define SPARSE 7
static int window_step(void) { return getenv("CONVOY_SANITIZED") ? SPARSE : 1; }

/* Whether g takes integer v exactly when it lies in [lo, hi]. */
static int integer_ok(const cv_grammar *g, const char *schema, const char *text, long long v, long long lo,
                      long long hi)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    const int want = v >= lo && v <= hi;
    const int got = matches(g, buf);
    CHECKF(got == want, "%s: %s %s\n%s", schema, buf, want ? "refused" : "accepted", text);
    return got == want;
}

static void range_window(const char *schema, long long lo, long long hi, long long from, long long to)
{
    char err[CV_ERRLEN];
    char *text = compile(schema, err, sizeof err);
    CHECKF(text != NULL, "%s: %s", schema, err);
    cv_grammar *g = text ? cv_grammar_parse(text, strlen(text), err, sizeof err) : NULL;
    CHECKF(g != NULL, "%s: %s\n%s", schema, err, text);
    const long long edges[] = {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1};
    for (int i = 0; g && i < 6; i++)
        if (edges[i] >= from && edges[i] <= to && !integer_ok(g, schema, text, edges[i], lo, hi))
            break;
    for (long long v = from; g && v <= to; v += window_step())
        if (!integer_ok(g, schema, text, v, lo, hi))
            break;
    if (g)
        CHECK(matches(g, "01") == 0 && matches(g, "1.5") == 0);
    cv_grammar_free(g);
    free(text);
}

static void test_integer_ranges(void)
{
    range_window("{\"type\":\"integer\",\"minimum\":0,\"maximum\":12}", 0, 12, -30, 300);
    range_window("{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", -37, 1234, -2000, 2000);
    range_window("{\"type\":\"integer\",\"minimum\":17}", 17, (long long)1e15, -100, 10200);
    range_window("{\"type\":\"integer\",\"maximum\":-5}", -(long long)1e15, -5, -10200, 100);
    range_window("{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":99}", -2, 98, -200, 200);
    range_window("{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":-990}", -1000, -990, -1100, 100);
    range_window("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":7.9}", 2, 7, -10, 20);
    range_window("{\"type\":\"integer\",\"minimum\":95,\"maximum\":10005}", 95, 10005, 0, 12000);
}

/* Numbers in a grid of decimals: every accepted one lies within the bounds. */
static void number_window(const char *schema, double lo, double hi, int lo_strict, int hi_strict)
{
    char err[CV_ERRLEN];
    char *text = compile(schema, err, sizeof err);
    CHECKF(text != NULL, "%s: %s", schema, err);
    cv_grammar *g = text ? cv_grammar_parse(text, strlen(text), err, sizeof err) : NULL;
    CHECKF(g != NULL, "%s: %s\n%s", schema, err, text);
    int accepted = 0;
    for (int i = -3000; g && i <= 3000; i += window_step()) {
        char buf[32];
        for (int form = 0; form < 2; form++) {
            if (form == 0) {
                if (i % 10)
                    continue;
                snprintf(buf, sizeof buf, "%d", i / 10);
            } else {
                snprintf(buf, sizeof buf, "%s%d.%d", i < 0 ? "-" : "", abs(i) / 10, abs(i) % 10);
            }
            const double v = strtod(buf, NULL);
            const int ok = (lo_strict ? v > lo : v >= lo) && (hi_strict ? v < hi : v <= hi);
            const int got = matches(g, buf);
            accepted += got;
            CHECKF(!got || ok, "%s: %s accepted\n%s", schema, buf, text);
        }
    }
    CHECKF(accepted > 0, "%s accepts nothing", schema);
    cv_grammar_free(g);
    free(text);
}

static void test_number_ranges(void)
{
    number_window("{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", 0, 1, 0, 0);
    number_window("{\"type\":\"number\",\"minimum\":-5,\"maximum\":12}", -5, 12, 0, 0);
    number_window("{\"type\":\"number\",\"exclusiveMinimum\":-5,\"exclusiveMaximum\":-2}", -5, -2, 1, 1);
    number_window("{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3.5}", -2.5, 3.5, 0, 0);
    number_window("{\"type\":\"number\",\"exclusiveMinimum\":0}", 0, INFINITY, 1, 0);
    number_window("{\"type\":\"number\",\"maximum\":0}", -INFINITY, 0, 0, 0);
}

/* test_schema --sample N SCHEMA: N random sentences of the schema's grammar, one a line (a random walk
 * over printable ASCII and 'é', closing once long), for tests/test_schema_ajv.mjs to validate. */
static int sample(int n, const char *schema)
{
    char err[CV_ERRLEN];
    char *text = compile(schema, err, sizeof err);
    cv_grammar *g = text ? cv_grammar_parse(text, strlen(text), err, sizeof err) : NULL;
    if (!g) {
        fprintf(stderr, "%s\n", err);
        free(text);
        return 2;
    }
    cv_grammar_state *st = cv_grammar_state_create(g);
    unsigned long long rng = 0x9E3779B97F4A7C15ull;
    char units[100][3];
    int nu = 0;
    for (int c = 0x20; c < 0x7F; c++, nu++)
        units[nu][0] = (char)c, units[nu][1] = 0;
    memcpy(units[nu++], "\xc3\xa9", 3);
    int bad = 0;
    for (int k = 0; k < n; k++) {
        char out[4096];
        size_t len = 0;
        cv_grammar_state_reset(st);
        for (;;) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const unsigned r = (unsigned)(rng >> 33);
            if (cv_grammar_complete(st) && (r % 100 < 15 || len > 200))
                break;
            int ok[100], m = 0, closers = 0;
            for (int u = 0; u < nu; u++)
                if (cv_grammar_allows(st, units[u], strlen(units[u]))) {
                    ok[m++] = u;
                    closers += strchr("]}\"", units[u][0]) != NULL;
                }
            if (!m && cv_grammar_complete(st))
                break;
            if (!m || len + 4 >= sizeof out) {
                fprintf(stderr, "dead end after %.*s\n", (int)len, out);
                bad = 1;
                break;
            }
            int u = ok[(r / 7) % (unsigned)m];
            if (len > 150 && closers) /* steer towards the end: close strings first, then arrays, objects */
                for (const char *cl = "}]\""; *cl; cl++)
                    for (int i = 0; i < m; i++)
                        if (units[ok[i]][0] == *cl)
                            u = ok[i];
            const size_t l = strlen(units[u]);
            cv_grammar_accept(st, units[u], l);
            memcpy(out + len, units[u], l);
            len += l;
        }
        printf("%.*s\n", (int)len, out);
    }
    cv_grammar_state_free(st);
    cv_grammar_free(g);
    free(text);
    return bad;
}

/* Nested arrays `depth` deep around a string ("{\"type\":\"array\",\"items\":" ... "}"), and the
 * instance holding one string that deep. */
static void nested_arrays(int depth, char *schema, size_t cap, char *instance, size_t icap)
{
    size_t n = 0, m = 0;
    for (int i = 0; i < depth; i++) {
        n += (size_t)snprintf(schema + n, cap - n, "{\"type\":\"array\",\"items\":");
        m += (size_t)snprintf(instance + m, icap - m, "[");
    }
    n += (size_t)snprintf(schema + n, cap - n, "{\"type\":\"string\"}");
    m += (size_t)snprintf(instance + m, icap - m, "\"x\"");
    for (int i = 0; i < depth; i++) {
        n += (size_t)snprintf(schema + n, cap - n, "}");
        m += (size_t)snprintf(instance + m, icap - m, "]");
    }
}

/* Hostile schemas (issue 33, item 1): an item's expression is written once, so nesting grows the
 * grammar linearly (before: doubling per level, 1 GB at depth 25); the byte limit and the nesting
 * limit are met as the compiler goes, with errors naming them. */
static void test_hostile_sizes(void)
{
    static char schema[1 << 16], instance[1 << 12];
    const int depths[] = {25, 30, 60};
    for (size_t i = 0; i < sizeof depths / sizeof depths[0]; i++) {
        nested_arrays(depths[i], schema, sizeof schema, instance, sizeof instance);
        char err[CV_ERRLEN];
        char *text = compile(schema, err, sizeof err);
        CHECKF(text && strlen(text) < 100u * (size_t)depths[i], "depth %d: %s", depths[i], text ? "too long" : err);
        const probe p[] = {{instance, 1}, {"[\"x\"]", 0}, {"[[],[]]", 1}};
        if (text)
            check_schema(schema, p, 3);
        free(text);
    }
    nested_arrays(70, schema, sizeof schema, instance, sizeof instance);
    refused(schema, "nest more than 64 deep", "#/items/items");

    /* 120 optional properties: linear text, no parentheses 120 deep */
    size_t n = (size_t)snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 120; i++)
        n += (size_t)snprintf(schema + n, sizeof schema - n, "%s\"p%d\":{\"type\":\"integer\"}", i ? "," : "", i);
    snprintf(schema + n, sizeof schema - n, "},\"additionalProperties\":false}");
    CHECK_SCHEMA(schema, {"{}", 1}, {"{\"p0\":1,\"p119\":2}", 1}, {"{\"p7\":1,\"p3\":2}", 0}, {"{\"q\":1}", 0});

    /* past the byte limit: refused, naming it */
    n = (size_t)snprintf(schema, sizeof schema, "{\"enum\":[");
    for (int i = 0; i < 5000; i++)
        n += (size_t)snprintf(schema + n, sizeof schema - n, "%s\"value-%d\"", i ? "," : "", i);
    snprintf(schema + n, sizeof schema - n, "]}");
    refused(schema, "the grammar passes 65520 bytes", "#");
    n = (size_t)snprintf(schema, sizeof schema, "{\"type\":\"array\",\"prefixItems\":[");
    for (int i = 0; i < 3000; i++)
        n += (size_t)snprintf(schema + n, sizeof schema - n, "%s{\"type\":\"integer\"}", i ? "," : "");
    snprintf(schema + n, sizeof schema - n, "]}");
    refused(schema, "the grammar passes 65520 bytes", "#");

    /* growing objects of primitives' formats: every grammar up to the limit stays within it (the
     * primitives' rules count too), the first past it is refused */
    bool refused_once = false;
    for (int k = 1; k <= 1500 && !refused_once; k += k < 400 ? 57 : 4) {
        n = (size_t)snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < k; i++)
            n += (size_t)snprintf(schema + n, sizeof schema - n, "%s\"key%d\":{\"type\":\"string\",\"format\":\"%s\"}",
                                  i ? "," : "", i, i % 2 ? "uuid" : "date-time");
        snprintf(schema + n, sizeof schema - n, "},\"required\":[\"key0\"]}");
        char err[CV_ERRLEN] = "";
        char *text = compile(schema, err, sizeof err);
        CHECKF(text ? strlen(text) <= 65520 : strstr(err, "passes 65520 bytes") != NULL, "%d properties: %s", k,
               text ? "over the limit" : err);
        refused_once = !text;
        free(text);
    }
    CHECK(refused_once);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--sample"))
        return sample(atoi(argv[2]), argv[3]);
    TEST_RUN(test_text);
    TEST_RUN(test_refusals);
    TEST_RUN(test_objects);
    TEST_RUN(test_arrays_strings);
    TEST_RUN(test_combinators);
    TEST_RUN(test_integer_ranges);
    TEST_RUN(test_number_ranges);
    TEST_RUN(test_hostile_sizes);
    TEST_RUN(test_pattern_constructs);
    TEST_RUN(test_pattern_bounds);
    TEST_RUN(test_pattern_refusals);
    return test_summary();
}
