/* test_grammar.c: the GBNF engine (infer/grammar.h) against its contract:
 * a JSON grammar over documents byte by byte, at once and in random
 * tokens; arithmetic; repetition bounds; negated classes; `.`; partial
 * UTF-8 through byte pieces; complete(); mask equal to allows on every
 * piece of a few thousand random ones (UTF-8 fragments, long pieces,
 * empty ones) in many states; every parse error's message; a refused
 * accept leaves the state as it was; reset; the caps refuse
 * deterministically; nothing allocates after create. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/err.h"
#include "infer/grammar.h"
#include "test.h"

static const char JSON[] =
    "# JSON, as llama.cpp's grammars/json.gbnf\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)((rng_state >> 11) % n);
}

static cv_grammar *parse_ok(const char *text)
{
    char err[CV_ERRLEN] = "";
    cv_grammar *g = cv_grammar_parse(text, strlen(text), err, sizeof err);
    CHECKF(g != NULL, "%s\n--- grammar:\n%s", err, text);
    return g;
}

/* Matches text byte by byte: 1 complete, 0 every byte taken but not
 * complete, -1 a byte refused (checking allows == accept on the way). */
static int match_bytes(const cv_grammar *g, const char *text, size_t n)
{
    cv_grammar_state *s = cv_grammar_state_create(g);
    int r = 1;
    for (size_t i = 0; i < n; i++) {
        const bool a = cv_grammar_allows(s, text + i, 1);
        const int rc = cv_grammar_accept(s, text + i, 1);
        CHECK(a == (rc == 0));
        if (rc != 0) {
            r = -1;
            break;
        }
    }
    if (r == 1 && !cv_grammar_complete(s))
        r = 0;
    cv_grammar_state_free(s);
    return r;
}

/* The same in one call and in random tokens of 1..7 bytes; all three agree. */
static int match_all_ways(const cv_grammar *g, const char *text)
{
    const size_t n = strlen(text);
    const int a = match_bytes(g, text, n);
    cv_grammar_state *s = cv_grammar_state_create(g);
    const bool allowed = cv_grammar_allows(s, text, n);
    const int b = cv_grammar_accept(s, text, n) != 0 ? -1 : cv_grammar_complete(s) ? 1 : 0;
    CHECKF(allowed == (b >= 0), "allows and accept disagree on \"%s\"", text);
    cv_grammar_state_free(s);
    /* random tokens, allows agreeing with accept at each, to the first refusal */
    s = cv_grammar_state_create(g);
    int c = 1;
    for (size_t i = 0; i < n;) {
        size_t k = 1 + rnd(7);
        if (k > n - i)
            k = n - i;
        const bool al = cv_grammar_allows(s, text + i, k);
        const int rc = cv_grammar_accept(s, text + i, k);
        CHECKF(al == (rc == 0), "allows and accept disagree on a token of \"%s\"", text);
        if (rc != 0) {
            c = -1;
            break;
        }
        i += k;
    }
    if (c == 1 && !cv_grammar_complete(s))
        c = 0;
    cv_grammar_state_free(s);
    CHECKF(a == b && b == c, "\"%s\": bytes %d, at once %d, tokens %d", text, a, b, c);
    return a;
}

static void test_json(void)
{
    cv_grammar *g = parse_ok(JSON);
    if (!g)
        return;
    static const char *good[] = {
        "{}",
        "{\"a\": 1}",
        "{\"a\": [1, 2.5e3, -0.25, true, false, null], \"b\": {\"c\": \"x\\u00e9\\\"y\"}}",
        "{\"caf\xC3\xA9\": \"\xE2\x82\xAC \xF0\x9F\x98\x80\", \"n\": [[[[]]]], \"e\": {}}",
        "{\n  \"k\": \"v\",\n  \"l\": [ 1 , 2 ]\n}",
        "{\"esc\": \"\\n\\t\\\\\\/\"}",
    };
    static const char *bad[] = {
        "[]",                /* root is an object */
        "{\"a\" 1}",         /* missing colon */
        "{\"a\": [1,]}",     /* trailing comma */
        "{'a': 1}",          /* single quotes */
        "{\"a\": 01}",       /* leading zero */
        "{\"a\": \"x\ty\"}", /* control character in a string */
        "{\"a\": tru}",      /* not a literal */
        "{\"a\": \"\\q\"}",  /* bad escape */
        "{\"a\": \"\xC3\"}", /* cut UTF-8 */
        "{\"a\": \"\xFF\"}", /* invalid UTF-8 */
        "{\"a\": \"\xED\xA0\x80\"}", /* a surrogate */
        "{\"a\": 1}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECKF(match_all_ways(g, good[i]) == 1, "refused: %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECKF(match_all_ways(g, bad[i]) != 1, "accepted: %s", bad[i]);
    /* prefixes are taken but not complete */
    CHECK(match_all_ways(g, "{\"a\": [1, 2") == 0);
    CHECK(match_all_ways(g, "{\"a\": \"\xE2\x82") == 0);
    CHECK(match_all_ways(g, "") == 0);
    cv_grammar_free(g);
}

static void test_arithmetic(void)
{
    cv_grammar *g = parse_ok("root ::= expr\n"
                             "expr ::= term ((\"+\" | \"-\") term)*\n"
                             "term ::= factor ((\"*\" | \"/\") factor)*\n"
                             "factor ::= number | \"(\" expr \")\" | \"-\" factor\n"
                             "number ::= [0-9]+ (\".\" [0-9]+)?\n");
    if (!g)
        return;
    CHECK(match_all_ways(g, "1+2*(3-4)/5") == 1);
    CHECK(match_all_ways(g, "((((1))))") == 1);
    CHECK(match_all_ways(g, "-(-2.5)*-3") == 1);
    CHECK(match_all_ways(g, "12.") == 0);
    CHECK(match_all_ways(g, "1+") == 0);
    CHECK(match_all_ways(g, "(1") == 0);
    CHECK(match_all_ways(g, "1++2") == -1);
    CHECK(match_all_ways(g, ")") == -1);
    CHECK(match_all_ways(g, "1 + 2") == -1);
    cv_grammar_free(g);
}

static void test_repetition(void)
{
    cv_grammar *g = parse_ok("root ::= \"a\"{2,4}");
    if (g) {
        CHECK(match_all_ways(g, "a") == 0);
        CHECK(match_all_ways(g, "aa") == 1);
        CHECK(match_all_ways(g, "aaa") == 1);
        CHECK(match_all_ways(g, "aaaa") == 1);
        CHECK(match_all_ways(g, "aaaaa") == -1);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= \"ab\"{3} \"c\"{2,} [xy]{0,2} \"z\"? \"w\"* \"v\"+");
    if (g) {
        CHECK(match_all_ways(g, "abababccv") == 1);
        CHECK(match_all_ways(g, "abababcccccxyzwwwvv") == 1);
        CHECK(match_all_ways(g, "ababccv") == -1);
        CHECK(match_all_ways(g, "abababcv") == -1);
        CHECK(match_all_ways(g, "abababccxyxv") == -1);
        CHECK(match_all_ways(g, "abababcczzv") == -1);
        CHECK(match_all_ways(g, "abababccw") == 0);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= (\"x\" | \"yz\"){1,3} \"!\" { 0 , 1 }");
    if (g) {
        CHECK(match_all_ways(g, "yzxyz!") == 1);
        CHECK(match_all_ways(g, "x") == 1);
        CHECK(match_all_ways(g, "xxxx") == -1);
        CHECK(match_all_ways(g, "") == 0);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= \"q\"{0} \"r\"");
    if (g) {
        CHECK(match_all_ways(g, "r") == 1);
        CHECK(match_all_ways(g, "qr") == -1);
        cv_grammar_free(g);
    }
}

static void test_classes(void)
{
    cv_grammar *g = parse_ok("root ::= [^a-z\\]]+");
    if (g) {
        CHECK(match_all_ways(g, "A1-\n\xC3\xA9\xF0\x9F\x98\x80[") == 1);
        CHECK(match_all_ways(g, "Ab") == -1);
        CHECK(match_all_ways(g, "]") == -1);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= [a-cx\\-\\x41\\u00e9\\U0001F600]*");
    if (g) {
        CHECK(match_all_ways(g, "abcx-A\xC3\xA9\xF0\x9F\x98\x80") == 1);
        CHECK(match_all_ways(g, "d") == -1);
        CHECK(match_all_ways(g, "B") == -1);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= [] | \"k\"\n");
    if (g) {
        CHECK(match_all_ways(g, "k") == 1);
        CHECK(match_all_ways(g, "]") == -1);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= [^]\n");
    if (g) {
        CHECK(match_all_ways(g, "\xE2\x82\xAC") == 1);
        cv_grammar_free(g);
    }
}

static void test_any(void)
{
    cv_grammar *g = parse_ok("root ::= \"<\" . . . \">\"");
    if (g) {
        CHECK(match_all_ways(g, "<a\xE2\x82\xAC\xF0\x9F\x98\x80>") == 1);
        CHECK(match_all_ways(g, "<>>>>") == 1);
        CHECK(match_all_ways(g, "<ab>") == 0);
        CHECK(match_all_ways(g, "<abcd") == -1);
        CHECK(match_all_ways(g, "<\x01\x7F\n>") == 1);
        CHECK(match_all_ways(g, "<ab\xC0\x80>") == -1);
        cv_grammar_free(g);
    }
    g = parse_ok("root ::= .* \"end\"");
    if (g) {
        CHECK(match_all_ways(g, "the end") == 1);
        CHECK(match_all_ways(g, "endend") == 1);
        CHECK(match_all_ways(g, "ending") == 0);
        cv_grammar_free(g);
    }
}

static void test_partial_utf8(void)
{
    cv_grammar *g = parse_ok("root ::= \"\xE2\x82\xAC\" \"!\"");
    if (!g)
        return;
    cv_grammar_state *s = cv_grammar_state_create(g);
    CHECK(cv_grammar_allows(s, "\xE2", 1));
    CHECK(!cv_grammar_allows(s, "\xE3", 1));
    CHECK(!cv_grammar_allows(s, "\x82", 1));
    CHECK(cv_grammar_allows(s, "\xE2\x82", 2));
    CHECK(!cv_grammar_allows(s, "\xE2\x82\xAD", 3));
    CHECK(cv_grammar_accept(s, "\xE2", 1) == 0);
    CHECK(!cv_grammar_complete(s));
    CHECK(!cv_grammar_allows(s, "!", 1));
    CHECK(!cv_grammar_allows(s, "\xE2", 1));
    CHECK(cv_grammar_allows(s, "\x82\xAC!", 3));
    CHECK(cv_grammar_accept(s, "\x82", 1) == 0);
    CHECK(cv_grammar_accept(s, "\xAD", 1) != 0);
    CHECK(cv_grammar_accept(s, "\xAC", 1) == 0);
    CHECK(!cv_grammar_complete(s));
    CHECK(cv_grammar_accept(s, "!", 1) == 0);
    CHECK(cv_grammar_complete(s));
    cv_grammar_state_free(s);
    cv_grammar_free(g);

    /* classes: a lead byte is allowed when some code point it starts is */
    g = parse_ok("root ::= [\\u0100-\\u0101] | [^\\x00-\\u07FF\\u0800-\\u0FFF] \"z\"");
    if (!g)
        return;
    s = cv_grammar_state_create(g);
    CHECK(cv_grammar_allows(s, "\xC4", 1));
    CHECK(cv_grammar_allows(s, "\xC4\x81", 2));
    CHECK(!cv_grammar_allows(s, "\xC4\x82", 2));
    CHECK(!cv_grammar_allows(s, "\xC5", 1));
    CHECK(!cv_grammar_allows(s, "\xC3", 1));
    CHECK(!cv_grammar_allows(s, "\xE0", 1)); /* E0 starts U+0800..U+0FFF only: all refused */
    CHECK(cv_grammar_allows(s, "\xE1", 1));
    CHECK(cv_grammar_allows(s, "\xF4\x8F\xBF\xBFz", 5));
    CHECK(!cv_grammar_allows(s, "\xF4\x90", 2)); /* past U+10FFFF */
    CHECK(!cv_grammar_allows(s, "\xED\xA0", 2)); /* a surrogate */
    CHECK(cv_grammar_allows(s, "\xED\x9F", 2));
    CHECK(!cv_grammar_allows(s, "\xC0", 1)); /* overlong */
    CHECK(!cv_grammar_allows(s, "\xF0\x80", 2));
    CHECK(!cv_grammar_allows(s, "\xF5", 1));
    CHECK(!cv_grammar_allows(s, "\xFF", 1));
    cv_grammar_state_free(s);
    cv_grammar_free(g);
}

static void test_complete_and_reset(void)
{
    cv_grammar *g = parse_ok("root ::= \"ab\" | \"abc\" \"d\"*");
    if (!g)
        return;
    cv_grammar_state *s = cv_grammar_state_create(g);
    CHECK(!cv_grammar_complete(s));
    CHECK(cv_grammar_accept(s, "a", 1) == 0 && !cv_grammar_complete(s));
    CHECK(cv_grammar_accept(s, "b", 1) == 0 && cv_grammar_complete(s));
    CHECK(cv_grammar_accept(s, "c", 1) == 0 && cv_grammar_complete(s));
    CHECK(cv_grammar_accept(s, "dd", 2) == 0 && cv_grammar_complete(s));
    CHECK(!cv_grammar_allows(s, "a", 1));
    cv_grammar_state_reset(s);
    CHECK(!cv_grammar_complete(s));
    CHECK(cv_grammar_allows(s, "a", 1));
    CHECK(!cv_grammar_allows(s, "d", 1));
    CHECK(cv_grammar_accept(s, "abcd", 4) == 0 && cv_grammar_complete(s));
    cv_grammar_state_free(s);
    cv_grammar_free(g);
    /* a grammar that may be empty is complete at the start */
    g = parse_ok("root ::= \"x\"*");
    if (g) {
        s = cv_grammar_state_create(g);
        CHECK(cv_grammar_complete(s));
        cv_grammar_state_free(s);
        cv_grammar_free(g);
    }
}

/* The mask of state s equals allows on each piece, and allocates nothing. */
static void check_mask(const cv_grammar_state *s, const cv_grammar_pieces *p, char **pieces, const uint32_t *len,
                       int n, const char *what)
{
    float *logits = malloc((size_t)n * sizeof *logits);
    for (int i = 0; i < n; i++)
        logits[i] = (float)i * 0.5f;
    const uint64_t before = cv_alloc_count();
    cv_grammar_mask(s, p, logits);
    CHECK(cv_alloc_count() == before);
    int bad = 0, allowed = 0;
    for (int i = 0; i < n; i++) {
        const bool a = len[i] > 0 && cv_grammar_allows(s, pieces[i], len[i]);
        allowed += a;
        const bool kept = logits[i] == (float)i * 0.5f;
        if (a != kept || (!kept && !(isinf(logits[i]) && logits[i] < 0))) {
            if (bad++ < 5)
                fprintf(stderr, "%s: piece %d (%u bytes) allows %d, mask %g\n", what, i, len[i], a,
                        (double)logits[i]);
        }
    }
    CHECKF(bad == 0, "%s: %d pieces differ (%d allowed)", what, bad, allowed);
    free(logits);
}

/* Random pieces: JSON-ish ASCII, UTF-8 fragments and whole characters,
 * invalid bytes, empty pieces, duplicates and a few long pieces. */
static int random_pieces(char ***out, uint32_t **lens, int n)
{
    static const char *atoms[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\\", "a", "b", "e", "k", "1",
                                  "0", "9", ".", "-", "true", "null", "fals", "u", "00e9", "\xE2", "\x82", "\xAC",
                                  "\xC3", "\xA9", "\xF0\x9F", "\x98\x80", "\xFF", "\xC0", "\xED\xA0", "\t", "x"};
    const int na = (int)(sizeof atoms / sizeof *atoms);
    char **pc = malloc((size_t)n * sizeof *pc);
    uint32_t *ln = malloc((size_t)n * sizeof *ln);
    for (int i = 0; i < n; i++) {
        char buf[1024];
        size_t m = 0;
        const int kind = (int)rnd(100);
        if (kind < 2) {
            m = 0; /* empty */
        } else if (kind < 4 && i > 0) {
            const int j = (int)rnd((uint32_t)i); /* a duplicate */
            m = ln[j];
            memcpy(buf, pc[j], m);
        } else if (kind < 5) {
            const char *f = rnd(2) ? " " : "\"a\": 1, ";
            while (m + strlen(f) < 300 + rnd(400)) { /* past the levels mask keeps */
                memcpy(buf + m, f, strlen(f));
                m += strlen(f);
            }
        } else {
            const int parts = 1 + (int)rnd(4);
            for (int k = 0; k < parts; k++) {
                const char *a = atoms[rnd((uint32_t)na)];
                memcpy(buf + m, a, strlen(a));
                m += strlen(a);
            }
        }
        pc[i] = malloc(m + 1);
        memcpy(pc[i], buf, m);
        ln[i] = (uint32_t)m;
    }
    *out = pc;
    *lens = ln;
    return n;
}

static void test_mask(void)
{
    cv_grammar *g = parse_ok(JSON);
    if (!g)
        return;
    const int n = 4000;
    char **pc;
    uint32_t *ln;
    random_pieces(&pc, &ln, n);
    cv_grammar_pieces *p = cv_grammar_pieces_create(n, (const char *const *)pc, ln);
    CHECK(p != NULL);
    if (!p)
        return;
    const char *piece;
    CHECK(cv_grammar_piece(p, 5, &piece) == ln[5] && memcmp(piece, pc[5], ln[5]) == 0);
    CHECK(cv_grammar_piece(p, n, &piece) == 0 && piece[0] == 0);
    cv_grammar_state *s = cv_grammar_state_create(g);
    const char doc[] = "{\"k\": [1, -2.5e3, \"a\\u00e9 \xE2\x82\xAC\", {\"b\": null}, true], \"x\": {}}";
    char what[64];
    for (size_t i = 0; i <= sizeof doc - 1; i++) {
        snprintf(what, sizeof what, "after %zu bytes", i);
        check_mask(s, p, pc, ln, n, what);
        if (i < sizeof doc - 1)
            CHECK(cv_grammar_accept(s, doc + i, 1) == 0);
    }
    CHECK(cv_grammar_complete(s));
    cv_grammar_state_free(s);
    for (int i = 0; i < n; i++)
        free(pc[i]);
    free(pc);
    free(ln);
    cv_grammar_pieces_free(p);
    cv_grammar_free(g);
}

/* Tokens by a random walk: the mask picks, accept follows, in agreement. */
static void test_mask_walk(void)
{
    cv_grammar *g = parse_ok(JSON);
    if (!g)
        return;
    const int n = 3000;
    char **pc;
    uint32_t *ln;
    random_pieces(&pc, &ln, n);
    cv_grammar_pieces *p = cv_grammar_pieces_create(n, (const char *const *)pc, ln);
    cv_grammar_state *s = cv_grammar_state_create(g);
    float *logits = malloc((size_t)n * sizeof *logits);
    int steps = 0;
    for (int walk = 0; walk < 6; walk++) {
        cv_grammar_state_reset(s);
        for (int t = 0; t < 40; t++) {
            for (int i = 0; i < n; i++)
                logits[i] = 0.0f;
            const uint64_t before = cv_alloc_count();
            cv_grammar_mask(s, p, logits);
            CHECK(cv_alloc_count() == before);
            int ok[4096], m = 0;
            for (int i = 0; i < n; i++)
                if (logits[i] == 0.0f)
                    ok[m++] = i;
            if (m == 0)
                break;
            const int id = ok[rnd((uint32_t)m)];
            CHECK(cv_grammar_allows(s, pc[id], ln[id]));
            CHECK(cv_grammar_accept(s, pc[id], ln[id]) == 0);
            steps++;
            if (t % 8 == 7)
                check_mask(s, p, pc, ln, n, "walk");
        }
    }
    CHECK(steps > 100);
    free(logits);
    cv_grammar_state_free(s);
    for (int i = 0; i < n; i++)
        free(pc[i]);
    free(pc);
    free(ln);
    cv_grammar_pieces_free(p);
    cv_grammar_free(g);
}

/* Deep stacks: forests of hundreds of nodes per level fill mask's arena
 * (the rest of a piece is matched as allows does) and reach the depth cap
 * inside pieces; the mask still equals allows. */
static void test_mask_deep(void)
{
    cv_grammar *g = parse_ok("root ::= \"(\" root \")\" | \"x\"");
    if (!g)
        return;
    enum { N = 1200 };
    char *pc[N];
    uint32_t ln[N];
    for (int i = 0; i < N; i++) {
        const uint32_t m = 1 + (uint32_t)(i % 400) + (i >= 800 ? 300 : 0);
        pc[i] = malloc(m);
        for (uint32_t k = 0; k < m; k++)
            pc[i][k] = i % 3 == 0 ? '(' : i % 3 == 1 ? ')' : (k == m / 2 ? 'x' : k < m / 2 ? '(' : ')');
        ln[i] = m;
    }
    cv_grammar_pieces *p = cv_grammar_pieces_create(N, (const char *const *)pc, ln);
    cv_grammar_state *s = cv_grammar_state_create(g);
    static const int depth[] = {0, 300, 700, 1000};
    int at = 0;
    for (size_t k = 0; k < sizeof depth / sizeof *depth; k++) {
        for (; at < depth[k]; at++)
            CHECK(cv_grammar_accept(s, "(", 1) == 0);
        char what[32];
        snprintf(what, sizeof what, "depth %d", at);
        check_mask(s, p, pc, ln, N, what);
    }
    cv_grammar_state_free(s);
    cv_grammar_free(g);
    /* more than 64 tops at once (mask's step cache is off there) */
    char text[4096];
    size_t m = (size_t)snprintf(text, sizeof text, "root ::= (\"(\" | \")\" | \"x\"");
    for (int i = 0; i < 100; i++)
        m += (size_t)snprintf(text + m, sizeof text - m, " | \"(%d\"", i);
    snprintf(text + m, sizeof text - m, ")+");
    g = parse_ok(text);
    if (g) {
        s = cv_grammar_state_create(g);
        check_mask(s, p, pc, ln, N, "many tops");
        CHECK(cv_grammar_accept(s, "(5", 2) == 0);
        check_mask(s, p, pc, ln, N, "many tops, later");
        cv_grammar_state_free(s);
        cv_grammar_free(g);
    }
    cv_grammar_pieces_free(p);
    for (int i = 0; i < N; i++)
        free(pc[i]);
}

static void test_rejected_accept_keeps_state(void)
{
    cv_grammar *g = parse_ok(JSON);
    if (!g)
        return;
    cv_grammar_state *s = cv_grammar_state_create(g);
    CHECK(cv_grammar_accept(s, "{\"a\": [1, \"\xE2", sizeof "{\"a\": [1, \"\xE2" - 1) == 0);
    CHECK(!cv_grammar_complete(s));
    /* long refusals: the bad byte comes late, after steps */
    CHECK(cv_grammar_accept(s, "\x82\xAC\", 2, 3,, 4]}", sizeof "\x82\xAC\", 2, 3,, 4]}" - 1) != 0);
    CHECK(!cv_grammar_complete(s));
    CHECK(cv_grammar_allows(s, "\x82", 1) && !cv_grammar_allows(s, "\"", 1));
    cv_grammar_state_free(s);

    s = cv_grammar_state_create(g);
    CHECK(cv_grammar_accept(s, "{\"a\": [1, \"\xE2", sizeof "{\"a\": [1, \"\xE2" - 1) == 0);
    CHECK(cv_grammar_accept(s, "\x82\xAC\", 2, 3,, 4]}", sizeof "\x82\xAC\", 2, 3,, 4]}" - 1) != 0);
    CHECK(cv_grammar_accept(s, "A", sizeof "A" - 1) != 0);
    CHECK(cv_grammar_accept(s, "\x82\xAC\", {\"z\": x}", sizeof "\x82\xAC\", {\"z\": x}" - 1) != 0);
    CHECK(cv_grammar_accept(s, "\x82\xAC\", 2]}", sizeof "\x82\xAC\", 2]}" - 1) == 0);
    CHECK(cv_grammar_complete(s));
    cv_grammar_state_free(s);
    cv_grammar_free(g);
}

static void expect_error(const char *text, size_t len, const char *want, const char *where)
{
    char err[CV_ERRLEN] = "";
    cv_grammar *g = cv_grammar_parse(text, len, err, sizeof err);
    CHECKF(g == NULL, "parsed, expected \"%s\": %.80s", want, text);
    cv_grammar_free(g);
    if (g)
        return;
    CHECKF(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
    CHECKF(strncmp(err, "line ", 5) == 0, "message \"%s\" names no line", err);
    if (where) {
        char at[32];
        snprintf(at, sizeof at, "line %s:", where);
        CHECKF(strncmp(err, at, strlen(at)) == 0, "message \"%s\" is not at %s", err, where);
    }
}

static void test_errors(void)
{
#define E(text, want, where) expect_error(text, strlen(text), want, where)
    E("root ::= foo", "undefined rule 'foo'", "1:10");
    E("root ::= \"a\"\n\nroot2 ::= bar-baz \"x\"", "undefined rule 'bar-baz'", "3:11");
    E("foo ::= \"a\"", "missing rule 'root'", NULL);
    E("", "missing rule 'root'", NULL);
    E("# only a comment\n", "missing rule 'root'", NULL);
    E("root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive", "1:1");
    E("root ::= \"x\" a\na ::= b \"x\"\nb ::= \"y\"? a", "left-recursive", NULL);
    E("root ::= (\"a\"?)*", "rule 'root' is left-recursive", NULL);
    E("root ::= \"x\"\nexpr ::= expr \"+\" \"1\" | \"1\"", "rule 'expr' is left-recursive", "2:1");
    E("root ::= \"abc", "unterminated string literal", "1:10");
    E("root ::= \"a\"\nx ::= [abc", "unterminated character class", "2:7");
    E("root ::= \"\\q\"", "bad escape", "1:11");
    E("root ::= \"\\x4\"", "bad escape", NULL);
    E("root ::= [\\u12]", "bad escape", NULL);
    E("root ::= \"\\U00110000\"", "past U+10FFFF", NULL);
    E("root ::= \"\\", "escape", NULL);
    E("root ::= \"a\"{3,1}", "bad repetition bounds {3,1}", "1:13");
    E("root ::= \"a\"{99999999}", "bad repetition bounds", NULL);
    E("root ::= \"a\"{,2}", "bad repetition bounds", NULL);
    E("root ::= \"a\"{2", "bad repetition bounds", NULL);
    E("root ::= \"a\"{2;3}", "bad repetition bounds", NULL);
    E("root ::= * \"a\"", "nothing before it", "1:10");
    E("root ::= [z-a]", "bad range", NULL);
    E("root ::= (\"a\" | \"b\"", "expecting ')'", NULL);
    E("root \"a\"", "expecting '::='", "1:6");
    E("root ::= \"a\" )", "expecting the end of the rule", "1:14");
    E("::= \"a\"", "expecting a rule name", "1:1");
    E("root ::= \"a\"\nroot ::= \"b\"", "defined twice", "2:1");
    E("root ::= \"\xC3(\"", "invalid UTF-8", "1:11");
    E("root ::= \"aaaaaaaaaa\"{7000}", "more than 65536 elements", NULL);
    E("root ::= \"a\"{0,20000}", "more than 16384 rules", NULL);
    {
        char deep[400] = "root ::= ";
        for (int i = 0; i < 100; i++)
            strcat(deep, "(");
        expect_error(deep, strlen(deep), "nested more than", NULL);
    }
    {
        const size_t n = CV_GRAMMAR_MAX_TEXT + 1;
        char *big = malloc(n);
        memset(big, ' ', n);
        memcpy(big, "root ::= \"a\"", 12);
        expect_error(big, n, "over the limit", "1:1");
        free(big);
    }
    {
        /* a start with more stacks than the cap */
        size_t cap = 64 + 8 * 2000, m = 0;
        char *amb = malloc(cap);
        m += (size_t)sprintf(amb + m, "root ::= \"a\"");
        for (int i = 0; i < 1100; i++)
            m += (size_t)sprintf(amb + m, " | \"a\"");
        expect_error(amb, m, "too ambiguous", NULL);
        free(amb);
    }
    /* NUL bytes and other bytes are refused with a line, never a crash */
    expect_error("root ::= \"a\"\0", 13, "expecting", NULL);
    expect_error("root ::= [a-\0]", 14, "", NULL);
    CHECK(cv_grammar_parse(NULL, 0, NULL, 0) == NULL);
#undef E
}

static void test_syntax(void)
{
    /* comments, CRLF, newlines in groups and after |, names with digits and dashes */
    cv_grammar *g = parse_ok("# top\r\nroot ::= item-1 | # trailing\r\n  (\r\n \"b\" # in a group\n\n \"c\"\n)\r\n"
                             "item-1 ::=\n  \"a\" |\n  \"\" \"z\"\n");
    if (g) {
        CHECK(match_all_ways(g, "a") == 1);
        CHECK(match_all_ways(g, "z") == 1);
        CHECK(match_all_ways(g, "bc") == 1);
        CHECK(match_all_ways(g, "b") == 0);
        cv_grammar_free(g);
    }
    /* a literal repeats whole; a later rule may be referenced first */
    g = parse_ok("root ::= later \"ab\"*\nlater ::= \"[\\\"\\\\\\t\\]\"");
    if (g) {
        CHECK(match_all_ways(g, "[\"\\\t]abab") == 1);
        CHECK(match_all_ways(g, "[\"\\\t]aba") == 0);
        CHECK(match_all_ways(g, "[\"\\\t]b") == -1);
        cv_grammar_free(g);
    }
    /* unused rules and empty alternatives */
    g = parse_ok("root ::= | \"x\"\nunused ::= \"q\"\n");
    if (g) {
        CHECK(match_all_ways(g, "") == 1);
        CHECK(match_all_ways(g, "x") == 1);
        cv_grammar_free(g);
    }
}

static void test_caps(void)
{
    /* depth: each "(" opens a frame; the first refusal is at the same
     * place every time, and allows agrees */
    cv_grammar *g = parse_ok("root ::= \"(\" root \")\" | \"x\"");
    if (g) {
        int first[2] = {-1, -1};
        for (int rep = 0; rep < 2; rep++) {
            cv_grammar_state *s = cv_grammar_state_create(g);
            for (int i = 0; i < 3000; i++) {
                const bool a = cv_grammar_allows(s, "(", 1);
                const int rc = cv_grammar_accept(s, "(", 1);
                CHECK(a == (rc == 0));
                if (rc != 0) {
                    first[rep] = i;
                    break;
                }
            }
            CHECK(cv_grammar_accept(s, "x", 1) == 0);
            cv_grammar_state_free(s);
        }
        CHECKF(first[0] > 500 && first[0] <= (int)CV_GRAMMAR_MAX_DEPTH && first[0] == first[1], "first %d %d",
               first[0], first[1]);
        cv_grammar_free(g);
    }
    /* stacks: after "x" too many alternatives at once: refused */
    size_t cap = 64 + 8 * 2000, m = 0;
    char *amb = malloc(cap);
    m += (size_t)sprintf(amb + m, "root ::= \"x\" y | \"z\"\ny ::= \"a\"");
    for (int i = 0; i < 1100; i++)
        m += (size_t)sprintf(amb + m, " | \"a\"");
    g = cv_grammar_parse(amb, m, NULL, 0);
    CHECK(g != NULL);
    if (g) {
        cv_grammar_state *s = cv_grammar_state_create(g);
        CHECK(!cv_grammar_allows(s, "x", 1));
        CHECK(cv_grammar_accept(s, "x", 1) != 0);
        CHECK(cv_grammar_allows(s, "z", 1));
        const char *pcs[3] = {"x", "z", "xa"};
        const uint32_t lens[3] = {1, 1, 2};
        cv_grammar_pieces *p = cv_grammar_pieces_create(3, pcs, lens);
        float lg[3] = {0, 0, 0};
        cv_grammar_mask(s, p, lg);
        CHECK(isinf(lg[0]) && lg[1] == 0 && isinf(lg[2]));
        cv_grammar_pieces_free(p);
        cv_grammar_state_free(s);
        cv_grammar_free(g);
    }
    free(amb);
}

static void test_no_alloc(void)
{
    cv_grammar *g = parse_ok(JSON);
    if (!g)
        return;
    cv_grammar_state *s = cv_grammar_state_create(g);
    const char doc[] = "{\"a\": [1, 2, {\"b\": \"\xE2\x82\xAC\"}]}";
    const int prev = cv_alloc_forbid(1);
    const uint64_t before = cv_alloc_count();
    bool ok = true;
    for (size_t i = 0; i + 1 < sizeof doc; i++) {
        ok = ok && cv_grammar_allows(s, doc + i, 1);
        ok = ok && cv_grammar_accept(s, doc + i, 1) == 0;
        (void)cv_grammar_complete(s);
    }
    ok = ok && cv_grammar_complete(s);
    cv_grammar_state_reset(s);
    ok = ok && cv_grammar_accept(s, doc, sizeof doc - 1) == 0;
    const uint64_t after = cv_alloc_count();
    cv_alloc_forbid(prev);
    CHECK(ok);
    CHECK(after == before);
    cv_grammar_state_free(s);
    cv_grammar_free(g);
}

/* Timing only: a 128K-piece vocabulary of word-like pieces, masked inside a
 * string and between values. */
static void test_mask_speed(void)
{
    cv_grammar *g = parse_ok(JSON);
    if (!g)
        return;
    const int n = 128000;
    char **pc = malloc((size_t)n * sizeof *pc);
    uint32_t *ln = malloc((size_t)n * sizeof *ln);
    static const char alpha[] = "etaoinshrdlucmfwypvbgkjqxzETAOIN    ,.\"{}[]:0123456789-_\n";
    for (int i = 0; i < n; i++) {
        const uint32_t m = 1 + rnd(4) + rnd(6);
        pc[i] = malloc(m + 1);
        for (uint32_t k = 0; k < m; k++)
            pc[i][k] = alpha[rnd(sizeof alpha - 1)];
        if (rnd(10) == 0)
            pc[i][0] = ' ';
        ln[i] = m;
    }
    cv_grammar_pieces *p = cv_grammar_pieces_create(n, (const char *const *)pc, ln);
    cv_grammar_state *s = cv_grammar_state_create(g);
    float *logits = malloc((size_t)n * sizeof *logits);
    static const char *prefix[] = {"{\"key\": \"some text ", "{\"a\": [1, 2, ", "{"};
    for (int k = 0; k < 3; k++) {
        cv_grammar_state_reset(s);
        CHECK(cv_grammar_accept(s, prefix[k], strlen(prefix[k])) == 0);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        memset(logits, 0, (size_t)n * sizeof *logits);
        cv_grammar_mask(s, p, logits);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int kept = 0;
        for (int i = 0; i < n; i++)
            kept += logits[i] == 0.0f;
        fprintf(stderr, "mask after '%s': %d of %d kept, %.2f ms\n", prefix[k], kept, n,
                (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
    free(logits);
    cv_grammar_state_free(s);
    cv_grammar_pieces_free(p);
    for (int i = 0; i < n; i++)
        free(pc[i]);
    free(pc);
    free(ln);
    cv_grammar_free(g);
}

int main(void)
{
    TEST_RUN(test_json);
    TEST_RUN(test_arithmetic);
    TEST_RUN(test_repetition);
    TEST_RUN(test_classes);
    TEST_RUN(test_any);
    TEST_RUN(test_partial_utf8);
    TEST_RUN(test_complete_and_reset);
    TEST_RUN(test_mask);
    TEST_RUN(test_mask_walk);
    TEST_RUN(test_mask_deep);
    TEST_RUN(test_rejected_accept_keeps_state);
    TEST_RUN(test_errors);
    TEST_RUN(test_syntax);
    TEST_RUN(test_caps);
    TEST_RUN(test_no_alloc);
    TEST_RUN(test_mask_speed);
    return test_summary();
}
