/* regex.c: see regex.h.
 *
 * A recursive descent writes the GBNF as it reads: each part of the
 * pattern comes back as text with what a quantifier after it must know
 * (whether it may match nothing, what it costs once repetitions are
 * written out, whether it is one GBNF symbol). A run of single characters
 * becomes one literal. Character sets are sorted, merged ranges of code
 * points, built in frames outside the recursion; each is written as a
 * class of the characters JSON holds as they are, beside the escapes of
 * those it must escape.
 *
 * Anchors follow JSON Schema, not llama.cpp: llama.cpp's
 * json-schema-to-grammar refuses a pattern that is not written ^...$
 * ("Pattern must start with '^' and end with '$'") and reads ^ or $
 * elsewhere as literal characters. A pattern written ^...$ means the
 * same here; one without its anchors is the search JSON Schema (and ajv)
 * make of it, an end without its anchor open to any text; ^ or $
 * elsewhere is refused rather than read as a literal. */
#include "serve/regex.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"
#include "serve/buf.h"

#define MAX_CP 0x10FFFFu
#define MAX_RANGES 128 /* ranges of one character set */

typedef struct cset {
    uint32_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n;
    bool full; /* a range did not fit */
} cset;

typedef struct rx {
    const char *s;
    size_t n, pos;
    const char *any; /* the rule of one JSON string character */
    int depth;       /* groups open */
    char *err;
    size_t errlen;
    bool failed;
} rx;

typedef struct part {
    cv_buf t;      /* GBNF text; empty when the part matches only the empty string */
    bool nullable; /* may match the empty string */
    bool atom;     /* one GBNF symbol: takes a quantifier without parentheses */
    size_t cost;   /* characters and classes once every repetition is written out */
} part;

/* ---- errors --------------------------------------------------------------------------------------- */

/* Records the first refusal, the sentence then the byte it stands at; returns false. */
static bool refuse(rx *r, size_t at, const char *fmt, ...) CV_PRINTF(3, 4);
static bool refuse(rx *r, size_t at, const char *fmt, ...)
{
    const bool first = !r->failed && r->err && r->errlen;
    r->failed = true;
    if (!first)
        return false;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(r->err, r->errlen, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < r->errlen)
        snprintf(r->err + n, r->errlen - (size_t)n, " (byte %zu of the pattern)", at);
    return false;
}

/* Appends s to b: false (refused) when memory runs out. */
static bool puts_ok(rx *r, cv_buf *b, const char *s)
{
    return !cv_buf_puts(b, s) || refuse(r, r->pos, "out of memory");
}

/* ---- character sets ------------------------------------------------------------------------------- */

/* Adds [lo, hi], merging with the ranges it touches. */
static void cset_add(cset *s, uint32_t lo, uint32_t hi)
{
    int i = 0;
    while (i < s->n && s->hi[i] + 1 < lo)
        i++;
    int j = i;
    for (; j < s->n && s->lo[j] <= hi + 1; j++) {
        lo = s->lo[j] < lo ? s->lo[j] : lo;
        hi = s->hi[j] > hi ? s->hi[j] : hi;
    }
    if (j == i && s->n == MAX_RANGES) {
        s->full = true;
        return;
    }
    memmove(&s->lo[i + 1], &s->lo[j], (size_t)(s->n - j) * sizeof s->lo[0]);
    memmove(&s->hi[i + 1], &s->hi[j], (size_t)(s->n - j) * sizeof s->hi[0]);
    s->lo[i] = lo;
    s->hi[i] = hi;
    s->n += 1 - (j - i);
}

/* Every code point s lacks, and none it has. */
static void cset_invert(cset *s)
{
    cset r = {.n = 0, .full = s->full};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->lo[i] > next)
            cset_add(&r, next, s->lo[i] - 1);
        next = s->hi[i] + 1;
    }
    if (next <= MAX_CP)
        cset_add(&r, next, MAX_CP);
    *s = r;
}

/* Takes [lo, hi] out (a range it splits makes one more). */
static void cset_remove(cset *s, uint32_t lo, uint32_t hi)
{
    cset r = {.n = 0, .full = s->full};
    for (int i = 0; i < s->n; i++) {
        if (s->hi[i] < lo || s->lo[i] > hi) {
            cset_add(&r, s->lo[i], s->hi[i]);
            continue;
        }
        if (s->lo[i] < lo)
            cset_add(&r, s->lo[i], lo - 1);
        if (s->hi[i] > hi)
            cset_add(&r, hi + 1, s->hi[i]);
    }
    *s = r;
}

static void cset_add_pairs(cset *s, const uint32_t *pairs, size_t n)
{
    for (size_t i = 0; i + 1 < n; i += 2)
        cset_add(s, pairs[i], pairs[i + 1]);
}

static bool cset_has(const cset *s, uint32_t cp)
{
    for (int i = 0; i < s->n; i++)
        if (s->lo[i] <= cp && cp <= s->hi[i])
            return true;
    return false;
}

static const uint32_t digit_set[] = {'0', '9'};
static const uint32_t word_set[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
/* ECMAScript's \s: WhiteSpace and LineTerminator */
static const uint32_t space_set[] = {0x09,   0x0D,   0x20,   0x20,   0xA0,   0xA0,   0x1680, 0x1680, 0x2000, 0x200A,
                                     0x2028, 0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
static const uint32_t line_ends[] = {0x0A, 0x0A, 0x0D, 0x0D, 0x2028, 0x2029};

/* Adds \d \w \s or (upper case) their complements. */
static void add_shorthand(cset *s, char c)
{
    cset t = {.n = 0};
    if (c == 'd' || c == 'D')
        cset_add_pairs(&t, digit_set, sizeof digit_set / sizeof digit_set[0]);
    else if (c == 'w' || c == 'W')
        cset_add_pairs(&t, word_set, sizeof word_set / sizeof word_set[0]);
    else
        cset_add_pairs(&t, space_set, sizeof space_set / sizeof space_set[0]);
    if (c == 'D' || c == 'W' || c == 'S')
        cset_invert(&t);
    for (int i = 0; i < t.n; i++)
        cset_add(s, t.lo[i], t.hi[i]);
}

/* ---- writing characters as JSON and GBNF ------------------------------------------------------------ */

/* The short JSON escapes: the character, then its letter. */
static const char short_esc[] = "\bb\tt\nn\ff\rr\"\"\\\\";

/* Whether JSON must escape cp (U+0000 aside: never written). */
static bool must_escape(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\' || cp == 0x7F; }

/* The JSON text of one character (U+0001..U+10FFFF, not a surrogate), in its one encoding; its length. */
static size_t json_char(uint32_t cp, char out[8])
{
    const char *e = cp < 0x80 && cp ? strchr(short_esc, (int)cp) : NULL;
    if (e && (e - short_esc) % 2 == 0)
        return (size_t)snprintf(out, 8, "\\%c", e[1]);
    if (must_escape(cp))
        return (size_t)snprintf(out, 8, "\\u%04x", (unsigned)cp);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    const int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int i = n - 1; i > 0; i--, cp >>= 6)
        out[i] = (char)(0x80 | (cp & 0x3F));
    out[0] = (char)(lead[n] | cp);
    return (size_t)n;
}

/* One end of a GBNF class range. */
static void class_char(char out[12], uint32_t cp)
{
    const bool alnum = (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z');
    if (alnum)
        snprintf(out, 12, "%c", (char)cp);
    else if (cp < 0x80)
        snprintf(out, 12, "\\x%02X", (unsigned)cp);
    else if (cp <= 0xFFFF)
        snprintf(out, 12, "\\u%04X", (unsigned)cp);
    else
        snprintf(out, 12, "\\U%08X", (unsigned)cp);
}

/* A GBNF class of the characters of s (none that JSON escapes), listed: a negated class would be no
 * shorter, as its list would hold the control characters JSON escapes besides. */
static int put_class(cv_buf *b, const cset *s)
{
    int bad = cv_buf_puts(b, "[");
    for (int i = 0; i < s->n && !bad; i++) {
        char lo[12], hi[12];
        class_char(lo, s->lo[i]);
        class_char(hi, s->hi[i]);
        bad |= cv_buf_puts(b, lo);
        if (s->hi[i] > s->lo[i])
            bad |= cv_buf_puts(b, s->hi[i] > s->lo[i] + 1 ? "-" : "") || cv_buf_puts(b, hi);
    }
    return bad || cv_buf_puts(b, "]");
}

/* An alternative: the GBNF literal of JSON text, then a class of the characters in cls[] when any. */
static int put_alt(cv_buf *b, int *nalt, const char *json, const char *cls)
{
    char *lit = cv_gbnf_literal(json, strlen(json));
    int bad = !lit || cv_buf_puts(b, (*nalt)++ ? " | " : "") || cv_buf_puts(b, lit);
    cv_free(lit);
    if (!bad && cls[0])
        bad |= cv_buf_puts(b, " [") || cv_buf_puts(b, cls) || cv_buf_puts(b, "]");
    return bad;
}

/* The escapes of the characters of s that JSON escapes, as alternatives: \" \\, the short letters, \u000x,
 * \u001x and \u007f. */
static int put_escapes(cv_buf *b, const cset *s, int *nalt)
{
    int bad = 0;
    if (cset_has(s, '"'))
        bad |= put_alt(b, nalt, "\\\"", "");
    if (cset_has(s, '\\'))
        bad |= put_alt(b, nalt, "\\\\", "");
    char letters[8] = "", hex[2][17] = {"", ""};
    size_t nl = 0, nh[2] = {0, 0};
    for (uint32_t cp = 1; cp < 0x20; cp++) {
        if (!cset_has(s, cp))
            continue;
        const char *e = strchr(short_esc, (int)cp);
        if (e && (e - short_esc) % 2 == 0)
            letters[nl++] = e[1];
        else
            hex[cp >> 4][nh[cp >> 4]++] = "0123456789abcdef"[cp & 15];
    }
    if (nl == 1)
        bad |= put_alt(b, nalt, (char[]){'\\', letters[0], 0}, "");
    else if (nl > 1)
        bad |= put_alt(b, nalt, "\\", letters);
    for (int h = 0; h < 2 && !bad; h++) {
        const char pre[8] = {'\\', 'u', '0', '0', (char)('0' + h), nh[h] == 1 ? hex[h][0] : 0, 0};
        if (nh[h])
            bad |= put_alt(b, nalt, pre, nh[h] == 1 ? "" : hex[h]);
    }
    if (cset_has(s, 0x7F))
        bad |= put_alt(b, nalt, "\\u007f", "");
    return bad;
}

/* The GBNF of one character of s (writable characters only, at least one): a literal, a class, or a group of
 * the class and the escapes. */
static bool put_set(rx *r, part *out, const cset *s)
{
    *out = (part){.cost = 1, .atom = true};
    int bad;
    if (s->n == 1 && s->lo[0] == s->hi[0]) {
        char j[8];
        const size_t n = json_char(s->lo[0], j);
        char *lit = cv_gbnf_literal(j, n);
        bad = !lit || cv_buf_puts(&out->t, lit);
        cv_free(lit);
        return !bad || refuse(r, r->pos, "out of memory");
    }
    cset raw = *s;
    cset_remove(&raw, 0, 0x1F);
    cset_remove(&raw, '"', '"');
    cset_remove(&raw, '\\', '\\');
    cset_remove(&raw, 0x7F, 0x7F);
    if (raw.full)
        return refuse(r, r->pos, "a class of more than %d ranges", MAX_RANGES);
    int nesc = 0;
    cv_buf esc = {0};
    bad = put_escapes(&esc, s, &nesc);
    const int nalt = (raw.n > 0) + nesc;
    bad |= cv_buf_puts(&out->t, nalt > 1 ? "( " : "");
    if (raw.n)
        bad |= put_class(&out->t, &raw);
    if (esc.n)
        bad |= cv_buf_puts(&out->t, raw.n ? " | " : "") || cv_buf_puts(&out->t, esc.p);
    bad |= cv_buf_puts(&out->t, nalt > 1 ? " )" : "");
    cv_buf_free(&esc);
    return !bad || refuse(r, r->pos, "out of memory");
}

/* ---- reading the pattern -------------------------------------------------------------------------------- */

static char peek(const rx *r, size_t k) { return r->pos + k < r->n ? r->s[r->pos + k] : 0; }
static bool more(const rx *r) { return r->pos < r->n; }

/* The code point at r->pos (the pattern is UTF-8), stepping over it. */
static bool next_cp(rx *r, uint32_t *cp)
{
    const size_t l = cv_utf8_len(r->s + r->pos, r->n - r->pos);
    if (!l)
        return refuse(r, r->pos, "invalid UTF-8");
    static const unsigned char mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    const unsigned char *u = (const unsigned char *)r->s + r->pos;
    uint32_t v = u[0] & mask[l];
    for (size_t i = 1; i < l; i++)
        v = v << 6 | (u[i] & 0x3Fu);
    r->pos += l;
    *cp = v;
    return true;
}

/* n hex digits at r->pos + k into *v. */
static bool hex_at(const rx *r, size_t k, int n, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        const int d = cv_hex_digit(peek(r, k + (size_t)i));
        if (d < 0)
            return false;
        *v = *v << 4 | (uint32_t)d;
    }
    return true;
}

/* \u after "\u": \uHHHH (a surrogate pair of two such joined) or \u{H...}. */
static bool parse_u(rx *r, size_t at, uint32_t *cp)
{
    if (peek(r, 0) == '{') {
        size_t k = 1;
        uint32_t v = 0;
        for (int d; (d = cv_hex_digit(peek(r, k))) >= 0 && v <= MAX_CP; k++)
            v = v << 4 | (uint32_t)d;
        if (k == 1 || peek(r, k) != '}' || v > MAX_CP)
            return refuse(r, at, "\\u{...} needs hex digits of a code point up to 10FFFF");
        r->pos += k + 1;
        *cp = v;
        return true;
    }
    if (!hex_at(r, 0, 4, cp))
        return refuse(r, at, "\\u needs four hex digits");
    r->pos += 4;
    uint32_t lo;
    if (*cp >= 0xD800 && *cp <= 0xDBFF && peek(r, 0) == '\\' && peek(r, 1) == 'u' && hex_at(r, 2, 4, &lo) &&
        lo >= 0xDC00 && lo <= 0xDFFF) {
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
        r->pos += 6;
    }
    return true;
}

/* The escapes that name what is refused, by their letter. */
static bool refuse_escape(rx *r, size_t at, char c, bool in_class)
{
    if (c == 'b' || c == 'B')
        return refuse(r, at, "a word boundary \\%c is not supported", c);
    if (c >= '1' && c <= '9')
        return refuse(r, at, "%s \\%c is not supported", in_class ? "an octal escape" : "a backreference", c);
    if (c == 'k')
        return refuse(r, at, "a named backreference \\k<...> is not supported");
    if (c == 'p' || c == 'P')
        return refuse(r, at, "a Unicode property escape \\%c{...} is not supported", c);
    if (c > 0x20 && c < 0x7F)
        return refuse(r, at, "the escape \\%c is not supported", c);
    return refuse(r, at, "a backslash before a character that is not a known escape");
}

/* The escape at r->pos (after its backslash at at): 1 with one code point in *cp, 2 with \d \w \s (or
 * their complements) added to *set, 0 after a refusal. */
static int parse_escape(rx *r, size_t at, bool in_class, uint32_t *cp, cset *set)
{
    if (!more(r))
        return refuse(r, at, "a backslash ends the pattern");
    const char c = r->s[r->pos++];
    static const char letters[] = "n\nt\tr\rf\fv\v";
    const char *l = c ? strchr(letters, c) : NULL;
    if (c && strchr("dDwWsS", c)) {
        add_shorthand(set, c);
        return 2;
    }
    if (l && (l - letters) % 2 == 0)
        *cp = (uint32_t)l[1];
    else if ((c && strchr("^$\\.*+?()[]{}|/", c)) || (in_class && c == '-'))
        *cp = (uint32_t)c;
    else if (in_class && c == 'b')
        *cp = 0x08;
    else if (c == '0' && !(peek(r, 0) >= '0' && peek(r, 0) <= '9'))
        *cp = 0;
    else if (c == 'x' && hex_at(r, 0, 2, cp))
        r->pos += 2;
    else if (c == 'x')
        return refuse(r, at, "\\x needs two hex digits");
    else if (c == 'u')
        return parse_u(r, at, cp) ? 1 : 0;
    else
        return refuse_escape(r, at, c, in_class);
    return 1;
}

/* One member of a class: 1 with a code point, 2 with a set added, 0 after a refusal. */
static int class_atom(rx *r, uint32_t *cp, cset *set)
{
    if (peek(r, 0) != '\\')
        return next_cp(r, cp) ? 1 : 0;
    const size_t at = r->pos++;
    return parse_escape(r, at, true, cp, set);
}

/* The class at '[' (at) into *set: members, ranges a-b, ^ negating. */
static bool parse_class(rx *r, cset *set)
{
    const size_t at = r->pos++;
    const bool neg = peek(r, 0) == '^';
    r->pos += neg;
    while (peek(r, 0) != ']') {
        if (!more(r))
            return refuse(r, at, "the class [ is not closed");
        const size_t item = r->pos;
        uint32_t lo, hi;
        const int k = class_atom(r, &lo, set);
        if (!k)
            return false;
        if (peek(r, 0) != '-' || peek(r, 1) == ']' || r->pos + 1 >= r->n) {
            if (k == 1)
                cset_add(set, lo, lo);
            continue;
        }
        r->pos++;
        const int k2 = class_atom(r, &hi, set);
        if (!k2)
            return false;
        if (k != 1 || k2 != 1)
            return refuse(r, item, "a class range with \\d, \\w or \\s at an end");
        if (hi < lo)
            return refuse(r, item, "a class range out of order");
        cset_add(set, lo, hi);
    }
    r->pos++;
    if (neg)
        cset_invert(set);
    return true;
}

/* One character of the pattern (a literal, an escape, '.', a class) at at: its GBNF in *out and, for a single
 * code point, that code point in *cp (else -1). Sets live here, outside the recursion over groups. */
static bool char_atom(rx *r, part *out, int64_t *cp)
{
    const size_t at = r->pos;
    cset set = {.n = 0};
    uint32_t c = 0;
    int k = 1;
    if (peek(r, 0) == '[') {
        k = parse_class(r, &set) ? 2 : 0;
    } else if (peek(r, 0) == '.') {
        r->pos++;
        cset_add_pairs(&set, line_ends, sizeof line_ends / sizeof line_ends[0]);
        cset_invert(&set);
        k = 2;
    } else if (peek(r, 0) == '\\') {
        r->pos++;
        k = parse_escape(r, at, false, &c, &set);
    } else {
        k = next_cp(r, &c) ? 1 : 0;
    }
    if (!k)
        return false;
    if (k == 1)
        cset_add(&set, c, c);
    /* U+0000 and surrogates have no encoding here */
    cset_remove(&set, 0, 0);
    cset_remove(&set, 0xD800, 0xDFFF);
    if (set.full)
        return refuse(r, at, "a class of more than %d ranges", MAX_RANGES);
    if (!set.n)
        return refuse(r, at, "a class or character that matches nothing a JSON string here holds (U+0000 and "
                             "lone surrogates are never written)");
    *cp = set.n == 1 && set.lo[0] == set.hi[0] ? (int64_t)set.lo[0] : -1;
    return put_set(r, out, &set);
}

/* ---- parts: sequences, alternatives, groups, quantifiers ------------------------------------------------- */

static bool parse_alts(rx *r, bool top, part *out);

static bool within_cost(rx *r, size_t at, size_t cost)
{
    return cost <= CV_REGEX_MAX_EXPANSION ||
           refuse(r, at, "the pattern stands for more than %d characters once its repetitions are written out",
                  CV_REGEX_MAX_EXPANSION);
}

/* A bound of {n,m} at r->pos: its digits, saturated past the largest allowed. */
static long read_bound(rx *r)
{
    long v = 0;
    for (; peek(r, 0) >= '0' && peek(r, 0) <= '9'; r->pos++)
        v = v > CV_REGEX_MAX_REPEAT ? v : v * 10 + (peek(r, 0) - '0');
    return v;
}

/* The quantifier at r->pos, if any (none: 1, 1), lazy or not; max -1 when unbounded. */
static bool parse_quantifier(rx *r, long *min, long *max)
{
    const size_t at = r->pos;
    const char c = peek(r, 0);
    *min = *max = 1;
    if (c == '*' || c == '+' || c == '?') {
        *min = c == '+';
        *max = c == '?' ? 1 : -1;
        r->pos++;
    } else if (c == '{') {
        r->pos++;
        if (peek(r, 0) < '0' || peek(r, 0) > '9')
            return refuse(r, at, "a '{' that is not a quantifier {n}, {n,} or {n,m}");
        *min = *max = read_bound(r);
        if (peek(r, 0) == ',') {
            r->pos++;
            *max = peek(r, 0) >= '0' && peek(r, 0) <= '9' ? read_bound(r) : -1;
        }
        if (peek(r, 0) != '}')
            return refuse(r, at, "a '{' that is not a quantifier {n}, {n,} or {n,m}");
        r->pos++;
    } else {
        return true;
    }
    r->pos += peek(r, 0) == '?'; /* lazy: the same language */
    if (peek(r, 0) && strchr("*+?{", peek(r, 0)))
        return refuse(r, r->pos, "a quantifier with nothing to repeat");
    return true;
}

/* Applies {min, max} to a. */
static bool quantify(rx *r, size_t at, part *a, long min, long max)
{
    if (min == 1 && max == 1)
        return true;
    if (!a->cost) /* the empty string, repeated */
        return true;
    if (min > CV_REGEX_MAX_REPEAT || max > CV_REGEX_MAX_REPEAT)
        return refuse(r, at, "a repetition bound over %d", CV_REGEX_MAX_REPEAT);
    if (max >= 0 && min > max)
        return refuse(r, at, "a repetition {%ld,%ld} whose minimum passes its maximum", min, max);
    if (max < 0 && a->nullable)
        return refuse(r, at, "*, + or {n,} on a part that may match the empty string is not supported");
    if (!within_cost(r, at, a->cost * (size_t)(max < 0 ? min + 1 : max)))
        return false;
    part q = {.nullable = a->nullable || min == 0, .cost = a->cost * (size_t)(max < 0 ? min + 1 : max)};
    char suffix[48] = "";
    if (min == 0 && max < 0)
        snprintf(suffix, sizeof suffix, "*");
    else if (min == 1 && max < 0)
        snprintf(suffix, sizeof suffix, "+");
    else if (min == 0 && max == 1)
        snprintf(suffix, sizeof suffix, "?");
    else if (max < 0)
        snprintf(suffix, sizeof suffix, "{%ld,}", min);
    else if (min == max)
        snprintf(suffix, sizeof suffix, "{%ld}", min);
    else
        snprintf(suffix, sizeof suffix, "{%ld,%ld}", min, max);
    const bool ok = !max || (puts_ok(r, &q.t, a->atom ? "" : "( ") && puts_ok(r, &q.t, a->t.p) &&
                             puts_ok(r, &q.t, a->atom ? "" : " )") && puts_ok(r, &q.t, suffix));
    cv_buf_free(&a->t);
    *a = q;
    return ok;
}

/* A group at '(' (at): (...) or (?:...); the other (? forms are refused by name. */
static bool parse_group(rx *r, part *out)
{
    const size_t at = r->pos++;
    if (peek(r, 0) == '?') {
        const char c = peek(r, 1), d = peek(r, 2);
        if (c == '=' || c == '!')
            return refuse(r, at, "a lookahead (?%c is not supported", c);
        if (c == '<' && (d == '=' || d == '!'))
            return refuse(r, at, "a lookbehind (?<%c is not supported", d);
        if (c == '<')
            return refuse(r, at, "a named group (?<name> is not supported");
        if (c != ':')
            return refuse(r, at, "inline flags or another (? group than (?: are not supported");
        r->pos += 2;
    }
    if (r->depth == CV_REGEX_MAX_NESTING)
        return refuse(r, at, "groups nested more than %d deep", CV_REGEX_MAX_NESTING);
    r->depth++;
    part in;
    const bool ok = parse_alts(r, false, &in);
    r->depth--;
    if (!ok)
        return false;
    *out = (part){.nullable = in.nullable, .atom = true, .cost = in.cost};
    if (peek(r, 0) != ')') {
        cv_buf_free(&in.t);
        return refuse(r, at, "a '(' that is not closed");
    }
    r->pos++;
    if (!in.cost || in.atom) { /* the empty string, or already one symbol */
        if (in.cost)
            out->t = in.t;
        else
            cv_buf_free(&in.t);
        return true;
    }
    const bool w = puts_ok(r, &out->t, "( ") && puts_ok(r, &out->t, in.t.p) && puts_ok(r, &out->t, " )");
    cv_buf_free(&in.t);
    return w;
}

/* Appends part a (taken over) to the sequence seq, which holds n parts. */
static bool seq_add(rx *r, part *seq, int *n, part *a)
{
    bool ok = true;
    if (a->t.n) {
        ok = puts_ok(r, &seq->t, seq->t.n ? " " : "") && puts_ok(r, &seq->t, a->t.p);
        seq->atom = !(*n)++ && a->atom;
    }
    seq->nullable &= a->nullable;
    seq->cost += a->cost;
    cv_buf_free(&a->t);
    return ok && within_cost(r, r->pos, seq->cost);
}

/* The literal of the single characters in lit (JSON text) as one part of seq; lit emptied. */
static bool flush_literal(rx *r, part *seq, int *n, cv_buf *lit, size_t *nchars)
{
    if (!lit->n)
        return true;
    char *g = cv_gbnf_literal(lit->p, lit->n);
    part a = {.atom = true, .cost = *nchars};
    const bool ok = g && !cv_buf_puts(&a.t, g);
    cv_free(g);
    lit->n = 0;
    *nchars = 0;
    if (!ok) {
        cv_buf_free(&a.t);
        return refuse(r, r->pos, "out of memory");
    }
    return seq_add(r, seq, n, &a);
}

/* One term at r->pos (an atom and its quantifier) onto seq: an unquantified single character joins lit. */
static bool parse_term(rx *r, part *seq, int *n, cv_buf *lit, size_t *nchars)
{
    const size_t at = r->pos;
    const char c = peek(r, 0);
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return refuse(r, at, "a quantifier %c with nothing to repeat", c);
    if (c == ']' || c == '}')
        return refuse(r, at, "a lone '%c'", c);
    if (c == '^' || c == '$')
        return refuse(r, at, "an anchor %c inside the pattern is not supported (only at the start or end of a "
                              "top-level alternative)", c);
    part a = {0};
    int64_t cp = -1;
    if (!(c == '(' ? parse_group(r, &a) : char_atom(r, &a, &cp))) {
        cv_buf_free(&a.t);
        return false;
    }
    long min, max;
    if (!parse_quantifier(r, &min, &max)) {
        cv_buf_free(&a.t);
        return false;
    }
    if (cp >= 0 && min == 1 && max == 1) {
        char j[8];
        cv_buf_free(&a.t);
        (*nchars)++;
        return !cv_buf_append(lit, j, json_char((uint32_t)cp, j)) || refuse(r, at, "out of memory");
    }
    if (!flush_literal(r, seq, n, lit, nchars) || !quantify(r, at, &a, min, max)) {
        cv_buf_free(&a.t);
        return false;
    }
    return seq_add(r, seq, n, &a);
}

/* The any-text ends of a top-level alternative that lacks its anchors, around seq's text. */
static bool open_ends(rx *r, part *seq, bool start, bool end)
{
    cv_buf t = {0};
    bool ok = true;
    if (!start)
        ok = puts_ok(r, &t, r->any) && puts_ok(r, &t, "*");
    if (ok && seq->t.n)
        ok = puts_ok(r, &t, t.n ? " " : "") && puts_ok(r, &t, seq->t.p);
    if (ok && !end && (start || seq->t.n)) /* one any-text when both ends are open around nothing */
        ok = puts_ok(r, &t, " ") && puts_ok(r, &t, r->any) && puts_ok(r, &t, "*");
    cv_buf_free(&seq->t);
    seq->t = t;
    seq->atom = false;
    return ok;
}

/* One alternative, up to '|', ')' or the end; at the top level with its anchors. Never empty text. */
static bool parse_seq(rx *r, bool top, part *seq)
{
    *seq = (part){.nullable = true, .atom = true};
    cv_buf lit = {0};
    size_t nchars = 0;
    int n = 0;
    const bool start = top && peek(r, 0) == '^';
    bool end = false, ok = true;
    r->pos += start;
    while (ok && more(r) && peek(r, 0) != '|' && peek(r, 0) != ')') {
        if (top && peek(r, 0) == '$' && (r->pos + 1 == r->n || peek(r, 1) == '|')) {
            end = true;
            r->pos++;
            break;
        }
        ok = parse_term(r, seq, &n, &lit, &nchars);
    }
    ok = ok && flush_literal(r, seq, &n, &lit, &nchars);
    cv_buf_free(&lit);
    if (ok && top)
        ok = open_ends(r, seq, start, end);
    if (ok && !seq->t.n)
        ok = puts_ok(r, &seq->t, "\"\"");
    if (!ok)
        cv_buf_free(&seq->t);
    return ok;
}

/* Alternatives a | b | ... up to ')' or the end. */
static bool parse_alts(rx *r, bool top, part *out)
{
    if (!parse_seq(r, top, out))
        return false;
    if (peek(r, 0) != '|')
        return true;
    part all = {.nullable = out->nullable, .atom = true, .cost = out->cost};
    bool ok = puts_ok(r, &all.t, "( ") && puts_ok(r, &all.t, out->t.p);
    cv_buf_free(&out->t);
    while (ok && peek(r, 0) == '|') {
        r->pos++;
        part s;
        ok = parse_seq(r, top, &s);
        if (!ok)
            break;
        all.nullable |= s.nullable;
        all.cost += s.cost;
        ok = within_cost(r, r->pos, all.cost) && puts_ok(r, &all.t, " | ") && puts_ok(r, &all.t, s.t.p);
        cv_buf_free(&s.t);
    }
    ok = ok && puts_ok(r, &all.t, " )");
    if (!ok)
        cv_buf_free(&all.t);
    *out = all;
    return ok;
}

char *cv_regex_gbnf(const char *pattern, size_t len, const char *any_char, char *err, size_t errlen)
{
    rx r = {.s = pattern, .n = len, .any = any_char, .err = err, .errlen = errlen};
    part p;
    if (!parse_alts(&r, true, &p))
        return NULL;
    if (more(&r)) {
        cv_buf_free(&p.t);
        refuse(&r, r.pos, "a ')' that closes no group");
        return NULL;
    }
    return p.t.p;
}

char *cv_gbnf_literal(const char *s, size_t n)
{
    cv_buf b = {0};
    int bad = cv_buf_puts(&b, "\"");
    for (size_t i = 0; i < n && !bad; i++) {
        const unsigned char ch = (unsigned char)s[i];
        char tmp[8];
        if (ch == '"' || ch == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)ch;
            tmp[2] = 0;
        } else if (ch < 0x20 || ch == 0x7F) {
            snprintf(tmp, sizeof tmp, "\\x%02X", ch);
        } else {
            tmp[0] = (char)ch;
            tmp[1] = 0;
        }
        bad = cv_buf_puts(&b, tmp);
    }
    if (bad || cv_buf_puts(&b, "\"")) {
        cv_buf_free(&b);
        return NULL;
    }
    return b.p;
}
