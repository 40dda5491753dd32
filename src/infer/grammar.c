/* grammar.c: see grammar.h.
 *
 * Parsing: a recursive-descent parser over the text, every read bounds
 * checked (peek past the end gives -1), builds llama.cpp's rule form: a rule
 * is its alternatives' elements, each alternative ended by ALT and the last
 * by END; groups and repetitions become generated rules (x* is r ::= x r |,
 * x{m,n} is m copies of x then n-m nested optional rules). The rules are
 * then flattened into one element array, checked (undefined rules, root,
 * nullable rules by a worklist, left recursion as a cycle in the "can start
 * with" graph by an iterative DFS) and the start is expanded once to refuse
 * a grammar whose start exceeds the caps.
 *
 * Matching: a position is a set of parse stacks kept as a forest of nodes
 * (element position, parent node), hash-consed so that equal stacks are the
 * same node and the forest is canonical: a function of the text matched.
 * Tops are stacks whose next element is a terminal. A step over a code
 * point copies the parent chains of the tops that match it into a new
 * forest and expands their next positions (pushing rule references, popping
 * finished alternatives), each (position, parent) expanded once per step.
 * All tables are preallocated in the state and cleared by generation
 * stamps, and every cap is checked against per-step quantities only, so a
 * step's result depends on the position and the code point alone.
 * Partial UTF-8 sequences ride along in the position; a partial prefix is
 * allowed when some top's class meets the range of code points it starts.
 *
 * Masking walks the pieces sorted by their bytes (an implicit byte trie:
 * consecutive pieces share their longest common prefix), keeping the
 * position after each byte of the current piece in an arena, so a shared
 * prefix is matched once and a refused prefix masks every piece under it
 * at once. A step's result depends only on which tops matched, so siblings
 * whose code points match the same tops share one step, and a class that
 * loops in place (inside a JSON string) costs no step at all. Where the
 * arena is full or a piece is deeper than the levels kept, the rest of that
 * piece is matched as allows would (the same steps, hence the same answer). */
#include "infer/grammar.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"

/* ---------------------------------------------------------------- rules */

enum { E_END, E_ALT, E_REF, E_CHAR, E_SET, E_ANY };

typedef struct gelem {
    uint32_t type;
    uint32_t v; /* E_REF: rule, E_CHAR: code point, E_SET: set index */
} gelem;

typedef struct gset {
    uint32_t off, n; /* ranges[off .. off+n): sorted, disjoint, not adjacent */
    uint32_t neg;
} gset;

struct cv_grammar {
    gelem *el;
    uint32_t n_el;
    uint32_t n_rules, root;
    uint32_t *rule_alt; /* rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r+1]) */
    uint32_t *alt_start;
    uint32_t n_alts;
    gset *sets;
    uint32_t *ranges; /* pairs lo, hi */
};

/* --------------------------------------------------------------- parser */

typedef struct prule {
    gelem *el;
    uint32_t n, cap;
    size_t name_off, name_len; /* named rules: the name in the text */
    uint32_t owner;            /* the named rule a generated one belongs to (itself when named) */
    size_t pos;                /* definition (or, undefined, first reference); generated: where made */
    bool named, defined;
} prule;

typedef struct parser {
    const uint8_t *s;
    size_t len, pos;
    prule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t n_el; /* elements of all rules */
    gset *sets;
    uint32_t n_sets, cap_sets;
    uint32_t *ranges;
    uint32_t n_ranges, cap_ranges; /* in pairs */
    uint32_t *tmp;                 /* a class's ranges before sorting (pairs) */
    uint32_t n_tmp, cap_tmp;
    int32_t *htab; /* named rules by name */
    uint32_t hmask;
    uint32_t depth;
    bool failed;
    char *err;
    size_t errlen;
} parser;

static void line_col(const uint8_t *s, size_t len, size_t pos, size_t *line, size_t *col)
{
    size_t l = 1, c = 1;
    for (size_t i = 0; i < pos && i < len; i++) {
        if (s[i] == '\n' || (s[i] == '\r' && (i + 1 >= len || s[i + 1] != '\n'))) {
            l++;
            c = 1;
        } else if (s[i] != '\r' && (s[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

/* Records the first error at pos ("line L:C: ..."); returns -1. */
static int perr(parser *p, size_t pos, const char *fmt, ...) CV_PRINTF(3, 4);
static int perr(parser *p, size_t pos, const char *fmt, ...)
{
    if (p->failed)
        return -1;
    p->failed = true;
    char msg[CV_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(p->s, p->len, pos, &line, &col);
    return cv_errf(p->err, p->errlen, "line %zu:%zu: %s", line, col, msg);
}

static int peek(const parser *p, size_t k)
{
    return p->pos + k < p->len ? p->s[p->pos + k] : -1;
}

/* A character of the text for a message: printable ASCII as is, else \xNN. */
static const char *show(int c, char buf[8])
{
    if (c < 0)
        snprintf(buf, 8, "end");
    else if (c >= 0x20 && c < 0x7F && c != '\'')
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "\\x%02X", (unsigned)c & 0xFFu);
    return buf;
}

static bool is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static void skip_space(parser *p, bool newline_ok)
{
    for (;;) {
        const int c = peek(p, 0);
        if (c == ' ' || c == '\t') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n' && p->s[p->pos] != '\r')
                p->pos++;
        } else if (newline_ok && (c == '\r' || c == '\n')) {
            p->pos++;
        } else {
            return;
        }
    }
}

static int grow(void **buf, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    uint32_t n = *cap ? *cap : 8;
    while (n < need)
        n = n > UINT32_MAX / 2 ? need : n * 2;
    void *b = cv_realloc(*buf, (size_t)n * size);
    if (!b)
        return -1;
    *buf = b;
    *cap = n;
    return 0;
}

static int push_el(parser *p, uint32_t r, uint32_t type, uint32_t v)
{
    if (p->n_el >= CV_GRAMMAR_MAX_ELEMENTS)
        return perr(p, p->pos, "grammar too large: more than %u elements after expanding repetitions",
                    CV_GRAMMAR_MAX_ELEMENTS);
    prule *ru = &p->rules[r];
    if (grow((void **)&ru->el, &ru->cap, ru->n + 1, sizeof(gelem)) != 0)
        return perr(p, p->pos, "out of memory");
    ru->el[ru->n++] = (gelem){type, v};
    p->n_el++;
    return 0;
}

static int new_rule(parser *p, uint32_t owner, size_t pos, uint32_t *id)
{
    if (p->n_rules >= CV_GRAMMAR_MAX_RULES)
        return perr(p, pos, "grammar too large: more than %u rules (groups and repetitions make rules too)",
                    CV_GRAMMAR_MAX_RULES);
    if (grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof(prule)) != 0)
        return perr(p, pos, "out of memory");
    *id = p->n_rules++;
    p->rules[*id] = (prule){.owner = owner == UINT32_MAX ? *id : owner, .pos = pos};
    return 0;
}

static uint32_t name_hash(const uint8_t *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 16777619u;
    return h;
}

/* The named rule called s[off, off+n), made (undefined) when new. */
static int rule_named(parser *p, size_t off, size_t n, uint32_t *id)
{
    uint32_t h = name_hash(p->s + off, n) & p->hmask;
    for (;; h = (h + 1) & p->hmask) {
        const int32_t r = p->htab[h];
        if (r < 0)
            break;
        const prule *ru = &p->rules[r];
        if (ru->name_len == n && memcmp(p->s + ru->name_off, p->s + off, n) == 0) {
            *id = (uint32_t)r;
            return 0;
        }
    }
    if (new_rule(p, UINT32_MAX, off, id) != 0)
        return -1;
    prule *ru = &p->rules[*id];
    ru->named = true;
    ru->name_off = off;
    ru->name_len = n;
    p->htab[h] = (int32_t)*id; /* at most MAX_RULES names in a table twice that size */
    return 0;
}

static int parse_hex(parser *p, int digits, uint32_t *cp)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        const int c = peek(p, 0);
        const int d = c < 0 ? -1 : cv_hex_digit((char)c);
        if (d < 0)
            return perr(p, p->pos, "bad escape: expecting %d hex digits", digits);
        v = v << 4 | (uint32_t)d;
        p->pos++;
    }
    *cp = v;
    return 0;
}

/* One character of a literal or class (an escape or a UTF-8 character). */
static int parse_char(parser *p, uint32_t *cp)
{
    const size_t at = p->pos;
    const int c = peek(p, 0);
    if (c == '\\') {
        p->pos++;
        const int e = peek(p, 0);
        char b[8];
        p->pos++;
        switch (e) {
        case 'x':
            return parse_hex(p, 2, cp);
        case 'u':
            return parse_hex(p, 4, cp);
        case 'U':
            if (parse_hex(p, 8, cp) != 0)
                return -1;
            if (*cp > 0x10FFFF)
                return perr(p, at, "bad escape: U+%X is past U+10FFFF", (unsigned)*cp);
            return 0;
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '\\': case '"': case '[': case ']': case '-':
            *cp = (uint32_t)e;
            return 0;
        default:
            return perr(p, at, "bad escape: unknown escape \\%s", e < 0 ? "at the end of the text" : show(e, b));
        }
    }
    const size_t n = cv_utf8_len((const char *)p->s + p->pos, p->len - p->pos);
    if (n == 0)
        return perr(p, at, "invalid UTF-8 in the grammar");
    const uint8_t *u = p->s + p->pos;
    uint32_t v = n == 1 ? u[0] : n == 2 ? u[0] & 0x1Fu : n == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (size_t k = 1; k < n; k++)
        v = v << 6 | (u[k] & 0x3Fu);
    *cp = v;
    p->pos += n;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1];
}

/* [...] or [^...] at '[' into a set element of rule r. */
static int parse_class(parser *p, uint32_t r)
{
    const size_t start = p->pos;
    p->pos++;
    uint32_t neg = 0;
    if (peek(p, 0) == '^') {
        neg = 1;
        p->pos++;
    }
    p->n_tmp = 0;
    for (;;) {
        if (p->pos >= p->len)
            return perr(p, start, "unterminated character class");
        if (peek(p, 0) == ']')
            break;
        const size_t at = p->pos;
        uint32_t lo, hi;
        if (parse_char(p, &lo) != 0)
            return -1;
        hi = lo;
        if (peek(p, 0) == '-' && peek(p, 1) >= 0 && peek(p, 1) != ']') {
            p->pos++;
            if (parse_char(p, &hi) != 0)
                return -1;
            if (hi < lo)
                return perr(p, at, "bad range in character class: U+%04X is after U+%04X", (unsigned)lo,
                            (unsigned)hi);
        }
        if (grow((void **)&p->tmp, &p->cap_tmp, 2 * (p->n_tmp + 1), sizeof(uint32_t)) != 0)
            return perr(p, at, "out of memory");
        p->tmp[2 * p->n_tmp] = lo;
        p->tmp[2 * p->n_tmp + 1] = hi;
        p->n_tmp++;
    }
    p->pos++;
    if (p->n_tmp > 1)
        qsort(p->tmp, p->n_tmp, 2 * sizeof(uint32_t), cmp_range);
    if (grow((void **)&p->sets, &p->cap_sets, p->n_sets + 1, sizeof(gset)) != 0 ||
        grow((void **)&p->ranges, &p->cap_ranges, 2 * (p->n_ranges + p->n_tmp), sizeof(uint32_t)) != 0)
        return perr(p, start, "out of memory");
    gset *st = &p->sets[p->n_sets];
    st->off = p->n_ranges;
    st->n = 0;
    st->neg = neg;
    for (uint32_t i = 0; i < p->n_tmp; i++) {
        const uint32_t lo = p->tmp[2 * i], hi = p->tmp[2 * i + 1];
        uint32_t *last = st->n ? &p->ranges[2 * (st->off + st->n - 1)] : NULL;
        if (last && lo <= last[1] + 1) {
            if (hi > last[1])
                last[1] = hi;
        } else {
            p->ranges[2 * (st->off + st->n)] = lo;
            p->ranges[2 * (st->off + st->n) + 1] = hi;
            st->n++;
        }
    }
    p->n_ranges += st->n;
    return push_el(p, r, E_SET, p->n_sets++);
}

static int parse_int(parser *p, uint32_t *v)
{
    const size_t at = p->pos;
    int c = peek(p, 0);
    if (c < '0' || c > '9')
        return perr(p, at, "bad repetition bounds: expecting a number");
    uint64_t x = 0;
    while ((c = peek(p, 0)) >= '0' && c <= '9') {
        x = x * 10 + (uint64_t)(c - '0');
        if (x > CV_GRAMMAR_MAX_ELEMENTS)
            return perr(p, at, "bad repetition bounds: a bound over %u", CV_GRAMMAR_MAX_ELEMENTS);
        p->pos++;
    }
    *v = (uint32_t)x;
    return 0;
}

/* Applies {min, max} (max UINT32_MAX: unbounded) to r's elements from sym on. */
static int repeat(parser *p, uint32_t r, uint32_t sym, uint32_t min, uint32_t max, size_t at)
{
    const uint32_t xn = p->rules[r].n - sym;
    gelem *x = cv_malloc((size_t)xn * sizeof *x + 1);
    if (!x)
        return perr(p, at, "out of memory");
    memcpy(x, p->rules[r].el + sym, (size_t)xn * sizeof *x);
    int rc = 0;
    if (min == 0) {
        p->n_el -= xn;
        p->rules[r].n = sym;
    }
    for (uint32_t i = 1; i < min && rc == 0; i++)
        for (uint32_t k = 0; k < xn && rc == 0; k++)
            rc = push_el(p, r, x[k].type, x[k].v);
    const uint32_t n_opt = max == UINT32_MAX ? 1 : max - min;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n_opt && rc == 0; i++) {
        uint32_t g;
        rc = new_rule(p, p->rules[r].owner, at, &g);
        for (uint32_t k = 0; k < xn && rc == 0; k++)
            rc = push_el(p, g, x[k].type, x[k].v);
        if (rc == 0 && (i > 0 || max == UINT32_MAX))
            rc = push_el(p, g, E_REF, max == UINT32_MAX ? g : last);
        if (rc == 0)
            rc = push_el(p, g, E_ALT, 0);
        if (rc == 0)
            rc = push_el(p, g, E_END, 0);
        if (rc == 0)
            p->rules[g].defined = true;
        last = g;
    }
    if (rc == 0 && n_opt > 0)
        rc = push_el(p, r, E_REF, last);
    cv_free(x);
    return rc;
}

static int parse_alternates(parser *p, uint32_t r, bool nested);

/* "..." at '"' into r's characters. */
static int parse_literal(parser *p, uint32_t r)
{
    const size_t at = p->pos;
    p->pos++;
    for (;;) {
        if (p->pos >= p->len)
            return perr(p, at, "unterminated string literal");
        if (peek(p, 0) == '"')
            break;
        uint32_t cp;
        if (parse_char(p, &cp) != 0 || push_el(p, r, E_CHAR, cp) != 0)
            return -1;
    }
    p->pos++;
    return 0;
}

/* A rule name at its first character into a reference of r. */
static int parse_ref(parser *p, uint32_t r)
{
    const size_t at = p->pos;
    while (is_word(peek(p, 0)))
        p->pos++;
    uint32_t id;
    if (rule_named(p, at, p->pos - at, &id) != 0 || push_el(p, r, E_REF, id) != 0)
        return -1;
    return 0;
}

/* (...) at '(' into a generated rule that r references. */
static int parse_group(parser *p, uint32_t r)
{
    const size_t at = p->pos;
    if (p->depth >= CV_GRAMMAR_MAX_NESTING)
        return perr(p, at, "parentheses nested more than %u deep", CV_GRAMMAR_MAX_NESTING);
    p->pos++;
    skip_space(p, true);
    uint32_t g;
    if (new_rule(p, p->rules[r].owner, at, &g) != 0)
        return -1;
    p->rules[g].defined = true;
    p->depth++;
    const int rc = parse_alternates(p, g, true);
    p->depth--;
    if (rc != 0)
        return -1;
    if (peek(p, 0) != ')') {
        char b[8];
        size_t line, col;
        line_col(p->s, p->len, at, &line, &col);
        return perr(p, p->pos, "expecting ')' to close the group opened at %zu:%zu, found %s", line, col,
                    show(peek(p, 0), b));
    }
    p->pos++;
    if (push_el(p, r, E_REF, g) != 0)
        return -1;
    return 0;
}

/* The bounds after '{' (at: the '{'): {m}, {m,} or {m,n}, through '}';
 * *max is left as is for {m,}. */
static int parse_bounds(parser *p, bool nested, size_t at, uint32_t *min, uint32_t *max)
{
    skip_space(p, nested);
    if (parse_int(p, min) != 0)
        return -1;
    skip_space(p, nested);
    if (peek(p, 0) == '}') {
        *max = *min;
    } else if (peek(p, 0) == ',') {
        p->pos++;
        skip_space(p, nested);
        if (peek(p, 0) >= '0' && peek(p, 0) <= '9') {
            if (parse_int(p, max) != 0)
                return -1;
            skip_space(p, nested);
        }
        if (peek(p, 0) != '}')
            return perr(p, p->pos, "bad repetition bounds: expecting '}'");
    } else {
        return perr(p, p->pos, "bad repetition bounds: expecting ',' or '}'");
    }
    p->pos++;
    if (*max < *min)
        return perr(p, at, "bad repetition bounds {%u,%u}: the maximum is below the minimum", (unsigned)*min,
                    (unsigned)*max);
    return 0;
}

/* '*', '+', '?' or '{' at the operator: repeats r's last symbol (from sym). */
static int parse_repetition(parser *p, uint32_t r, uint32_t sym, bool nested)
{
    const int c = peek(p, 0);
    const size_t at = p->pos;
    if (sym == p->rules[r].n)
        return perr(p, at, "repetition '%c' with nothing before it to repeat", c);
    uint32_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : UINT32_MAX;
    p->pos++;
    if (c == '{' && parse_bounds(p, nested, at, &min, &max) != 0)
        return -1;
    if (repeat(p, r, sym, min, max, at) != 0)
        return -1;
    return 0;
}

/* One sequence of symbols into r, each followed by its repetitions. */
static int parse_sequence(parser *p, uint32_t r, bool nested)
{
    uint32_t sym = p->rules[r].n; /* where the last symbol starts */
    while (p->pos < p->len && !p->failed) {
        const int c = peek(p, 0);
        int rc;
        if (c == '*' || c == '+' || c == '?' || c == '{') {
            rc = parse_repetition(p, r, sym, nested);
        } else if (c == '"') {
            sym = p->rules[r].n;
            rc = parse_literal(p, r);
        } else if (c == '[') {
            sym = p->rules[r].n;
            rc = parse_class(p, r);
        } else if (is_word(c)) {
            sym = p->rules[r].n;
            rc = parse_ref(p, r);
        } else if (c == '(') {
            sym = p->rules[r].n;
            rc = parse_group(p, r);
        } else if (c == '.') {
            sym = p->rules[r].n;
            p->pos++;
            rc = push_el(p, r, E_ANY, 0);
        } else {
            break;
        }
        if (rc != 0)
            return -1;
        skip_space(p, nested);
    }
    return p->failed ? -1 : 0;
}

static int parse_alternates(parser *p, uint32_t r, bool nested)
{
    if (parse_sequence(p, r, nested) != 0)
        return -1;
    while (peek(p, 0) == '|') {
        if (push_el(p, r, E_ALT, 0) != 0)
            return -1;
        p->pos++;
        skip_space(p, true);
        if (parse_sequence(p, r, nested) != 0)
            return -1;
    }
    return push_el(p, r, E_END, 0);
}

static int parse_rule(parser *p)
{
    const size_t at = p->pos;
    char b[8];
    while (is_word(peek(p, 0)))
        p->pos++;
    if (p->pos == at)
        return perr(p, at, "expecting a rule name, found %s", show(peek(p, 0), b));
    uint32_t id;
    if (rule_named(p, at, p->pos - at, &id) != 0)
        return -1;
    if (p->rules[id].defined)
        return perr(p, at, "rule '%.*s' defined twice", (int)(p->pos - at), (const char *)p->s + at);
    p->rules[id].defined = true;
    p->rules[id].pos = at;
    skip_space(p, false);
    if (!(peek(p, 0) == ':' && peek(p, 1) == ':' && peek(p, 2) == '='))
        return perr(p, p->pos, "expecting '::=' after the rule name, found %s", show(peek(p, 0), b));
    p->pos += 3;
    skip_space(p, true);
    if (parse_alternates(p, id, false) != 0)
        return -1;
    const int c = peek(p, 0);
    if (c == '\r')
        p->pos += peek(p, 1) == '\n' ? 2 : 1;
    else if (c == '\n')
        p->pos++;
    else if (c >= 0)
        return perr(p, p->pos, "expecting the end of the rule, found %s", show(c, b));
    skip_space(p, true);
    return 0;
}

/* ------------------------------------------------------------- checking */

static void grammar_release(cv_grammar *g)
{
    if (!g)
        return;
    cv_free(g->el);
    cv_free(g->rule_alt);
    cv_free(g->alt_start);
    cv_free(g->sets);
    cv_free(g->ranges);
    cv_free(g);
}

void cv_grammar_free(cv_grammar *g) { grammar_release(g); }

/* Where rule r is for a message: its owner's name (written into buf). */
static const char *rule_label(const parser *p, uint32_t r, char *buf, size_t n)
{
    const prule *o = &p->rules[p->rules[r].owner];
    snprintf(buf, n, "%.*s", (int)(o->name_len > 200 ? 200 : o->name_len), (const char *)p->s + o->name_off);
    return buf;
}

/* compile's working tables. */
typedef struct ctabs {
    uint32_t *alt_rule, *alt_end; /* an alternative's rule and its ALT or END element */
    uint32_t *remaining;          /* its references not yet known nullable; UINT32_MAX: has a terminal */
    uint32_t *occ_off, *occ;      /* the alternatives referring to rule r: occ[occ_off[r] .. occ_off[r+1]) */
    uint8_t *nullable;
    uint32_t *queue; /* rules found nullable, to propagate */
    uint8_t *color;  /* DFS: 0 unseen, 1 on the path, 2 done */
    uint32_t *dfs;   /* frames (rule, next element) */
} ctabs;

static void ctabs_release(ctabs *t)
{
    cv_free(t->alt_rule);
    cv_free(t->alt_end);
    cv_free(t->remaining);
    cv_free(t->occ_off);
    cv_free(t->occ);
    cv_free(t->nullable);
    cv_free(t->queue);
    cv_free(t->color);
    cv_free(t->dfs);
}

/* Copies the rules' elements one after the other into g, noting where
 * each rule's alternatives start and end. */
static void flatten(const parser *p, cv_grammar *g, ctabs *t)
{
    uint32_t at = 0, a = 0;
    for (uint32_t r = 0; r < p->n_rules; r++) {
        const prule *ru = &p->rules[r];
        g->rule_alt[r] = a;
        g->alt_start[a] = at;
        t->alt_rule[a] = r;
        for (uint32_t k = 0; k < ru->n; k++) {
            g->el[at] = ru->el[k];
            if (ru->el[k].type == E_ALT || ru->el[k].type == E_END) {
                t->alt_end[a] = at;
                a++;
                if (ru->el[k].type == E_ALT) {
                    g->alt_start[a] = at + 1;
                    t->alt_rule[a] = r;
                }
            }
            at++;
        }
    }
    g->rule_alt[p->n_rules] = a;
}

/* Nullable rules by a worklist: an alternative is nullable when all its
 * elements are references to nullable rules. */
static void find_nullable(const cv_grammar *g, ctabs *t)
{
    const uint32_t nr = g->n_rules;
    for (uint32_t i = 0; i < g->n_el; i++)
        if (g->el[i].type == E_REF)
            t->occ_off[g->el[i].v + 1]++;
    for (uint32_t r = 0; r < nr; r++)
        t->occ_off[r + 1] += t->occ_off[r];
    uint32_t nq = 0;
    for (uint32_t a = 0; a < g->n_alts; a++) {
        t->remaining[a] = 0;
        for (uint32_t i = g->alt_start[a]; i < t->alt_end[a]; i++) {
            if (g->el[i].type == E_REF) {
                t->occ[t->occ_off[g->el[i].v]++] = a;
                if (t->remaining[a] != UINT32_MAX)
                    t->remaining[a]++;
            } else {
                t->remaining[a] = UINT32_MAX;
            }
        }
        if (t->remaining[a] == 0 && !t->nullable[t->alt_rule[a]]) {
            t->nullable[t->alt_rule[a]] = 1;
            t->queue[nq++] = t->alt_rule[a];
        }
    }
    for (uint32_t r = nr; r > 0; r--) /* occ_off[r] now ends r's list: shift back */
        t->occ_off[r] = t->occ_off[r - 1];
    t->occ_off[0] = 0;
    for (uint32_t qi = 0; qi < nq; qi++) {
        const uint32_t r = t->queue[qi];
        for (uint32_t k = t->occ_off[r]; k < t->occ_off[r + 1]; k++) {
            const uint32_t oa = t->occ[k];
            if (t->remaining[oa] != UINT32_MAX && --t->remaining[oa] == 0 && !t->nullable[t->alt_rule[oa]]) {
                t->nullable[t->alt_rule[oa]] = 1;
                t->queue[nq++] = t->alt_rule[oa];
            }
        }
    }
}

/* Records that rule r is left-recursive; returns -1. */
static int left_recursive(parser *p, uint32_t r)
{
    char b[256];
    const prule *t = &p->rules[r];
    if (t->named)
        perr(p, t->pos, "rule '%s' is left-recursive (it can reach itself before matching a character)",
             rule_label(p, r, b, sizeof b));
    else
        perr(p, t->pos,
             "rule '%s' is left-recursive here (a group or repetition that can reach itself before "
             "matching a character, as a repetition of what can be empty)",
             rule_label(p, r, b, sizeof b));
    return -1;
}

/* Left recursion among the rules reachable from root: a cycle of "r can
 * start with s" edges; iterative DFS with (rule, next element) frames. */
static int check_left_recursion(parser *p, const cv_grammar *g, ctabs *t, uint32_t root)
{
    uint32_t *dfs = t->dfs;
    uint8_t *color = t->color;
    dfs[0] = root;
    dfs[1] = g->alt_start[g->rule_alt[root]];
    color[root] = 1;
    uint32_t sp = 1;
    while (sp) {
        uint32_t *f = &dfs[2 * (sp - 1)];
        const uint32_t r = f[0];
        /* f[1]: the element to look at next, within r's elements */
        const uint32_t end = g->alt_start[g->rule_alt[r]] + p->rules[r].n;
        if (f[1] >= end) {
            color[r] = 2;
            sp--;
            continue;
        }
        const gelem e = g->el[f[1]];
        if (e.type == E_ALT || e.type == E_END) {
            f[1]++;
            continue;
        }
        if (e.type == E_REF && t->nullable[e.v]) {
            f[1]++; /* what follows may start r too */
        } else {    /* the rest of this alternative cannot start r */
            uint32_t j = f[1];
            while (g->el[j].type != E_ALT && g->el[j].type != E_END)
                j++;
            f[1] = j + 1;
        }
        if (e.type != E_REF)
            continue;
        if (color[e.v] == 1)
            return left_recursive(p, e.v);
        if (color[e.v] == 0) {
            color[e.v] = 1;
            dfs[2 * sp] = e.v;
            dfs[2 * sp + 1] = g->alt_start[g->rule_alt[e.v]];
            sp++;
        }
    }
    return 0;
}

/* Flattens the rules into g, then refuses left recursion. */
static int compile(parser *p, cv_grammar *g)
{
    const uint32_t nr = p->n_rules;
    uint32_t n_alts = 0;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t k = 0; k < p->rules[r].n; k++)
            n_alts += p->rules[r].el[k].type == E_ALT || p->rules[r].el[k].type == E_END;
    g->n_rules = nr;
    g->n_el = p->n_el;
    g->n_alts = n_alts;
    g->el = cv_malloc((size_t)p->n_el * sizeof *g->el + 1);
    g->rule_alt = cv_malloc(((size_t)nr + 1) * sizeof *g->rule_alt);
    g->alt_start = cv_malloc((size_t)n_alts * sizeof *g->alt_start + 1);
    ctabs t;
    t.alt_rule = cv_malloc((size_t)n_alts * sizeof *t.alt_rule + 1);
    t.alt_end = cv_malloc((size_t)n_alts * sizeof *t.alt_end + 1);
    t.remaining = cv_malloc((size_t)n_alts * sizeof *t.remaining + 1);
    t.occ_off = cv_calloc((size_t)nr + 2, sizeof *t.occ_off);
    t.occ = cv_malloc((size_t)p->n_el * sizeof *t.occ + 1);
    t.nullable = cv_calloc((size_t)nr + 1, 1);
    t.queue = cv_malloc(((size_t)nr + 1) * sizeof *t.queue);
    t.color = cv_calloc((size_t)nr + 1, 1);
    t.dfs = cv_malloc(((size_t)nr + 1) * 2 * sizeof *t.dfs);
    int rc = -1;
    if (!g->el || !g->rule_alt || !g->alt_start || !t.alt_rule || !t.alt_end || !t.remaining || !t.occ_off ||
        !t.occ || !t.nullable || !t.queue || !t.color || !t.dfs) {
        perr(p, 0, "out of memory compiling the grammar");
        goto done;
    }
    flatten(p, g, &t);
    find_nullable(g, &t);
    for (uint32_t root = 0; root < nr; root++)
        if (!t.color[root] && check_left_recursion(p, g, &t, root) != 0)
            goto done;
    rc = 0;
done:
    ctabs_release(&t);
    return rc;
}

static void parser_release(parser *p)
{
    for (uint32_t r = 0; r < p->n_rules; r++)
        cv_free(p->rules[r].el);
    cv_free(p->rules);
    cv_free(p->sets);
    cv_free(p->ranges);
    cv_free(p->tmp);
    cv_free(p->htab);
}

static int start_fits(const cv_grammar *g); /* below: whether the start is within the caps */

cv_grammar *cv_grammar_parse(const char *text, size_t len, char *err, size_t errlen)
{
    if (len > CV_GRAMMAR_MAX_TEXT) {
        cv_errf(err, errlen, "line 1:1: grammar is %zu bytes, over the limit of %u", len, CV_GRAMMAR_MAX_TEXT);
        return NULL;
    }
    parser p = {.s = (const uint8_t *)(text ? text : ""), .len = text ? len : 0, .err = err, .errlen = errlen};
    p.hmask = 2 * CV_GRAMMAR_MAX_RULES - 1;
    p.htab = cv_malloc((size_t)(p.hmask + 1) * sizeof *p.htab);
    cv_grammar *g = cv_calloc(1, sizeof *g);
    if (!p.htab || !g) {
        cv_errf(err, errlen, "line 1:1: out of memory for the grammar");
        goto fail;
    }
    memset(p.htab, 0xFF, (size_t)(p.hmask + 1) * sizeof *p.htab);
    if (grow((void **)&p.ranges, &p.cap_ranges, 2, sizeof(uint32_t)) != 0 ||
        grow((void **)&p.sets, &p.cap_sets, 1, sizeof(gset)) != 0) {
        cv_errf(err, errlen, "line 1:1: out of memory for the grammar");
        goto fail;
    }
    skip_space(&p, true);
    while (p.pos < p.len && !p.failed)
        if (parse_rule(&p) != 0)
            break;
    if (p.failed)
        goto fail;
    for (uint32_t r = 0; r < p.n_rules; r++)
        if (!p.rules[r].defined) {
            perr(&p, p.rules[r].pos, "undefined rule '%.*s'", (int)(p.rules[r].name_len > 200 ? 200 : p.rules[r].name_len),
                 (const char *)p.s + p.rules[r].name_off);
            goto fail;
        }
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; r < p.n_rules; r++)
        if (p.rules[r].named && p.rules[r].name_len == 4 && memcmp(p.s + p.rules[r].name_off, "root", 4) == 0)
            root = r;
    if (root == UINT32_MAX) {
        perr(&p, p.len, "missing rule 'root' (the start rule)");
        goto fail;
    }
    g->root = root;
    if (compile(&p, g) != 0)
        goto fail;
    {
        /* the sets and ranges move into the grammar */
        g->sets = p.sets;
        g->ranges = p.ranges;
        p.sets = NULL;
        p.ranges = NULL;
    }
    const int fit = start_fits(g);
    if (fit != 0) {
        perr(&p, 0, fit < 0 ? "out of memory for the grammar's start"
                            : "the grammar is too ambiguous: its start needs more than the matcher's limits "
                              "(" "stacks, depth or nodes)");
        goto fail;
    }
    parser_release(&p);
    return g;
fail:
    parser_release(&p);
    grammar_release(g);
    return NULL;
}

/* ------------------------------------------------------------- matching */

#define MAX_ITEMS (2 * CV_GRAMMAR_MAX_NODES) /* (position, parent) pairs met in one step */
#define TAB_SIZE (4 * MAX_ITEMS)             /* hash slots: a power of two, at most half full */
#define ARENA_NODES (4 * CV_GRAMMAR_MAX_NODES)
#define ARENA_TOPS (4 * CV_GRAMMAR_MAX_STACKS)
#define MAX_LEVELS 256 /* bytes of a piece kept level by level in mask */

enum { R_OK = 0, R_REJECT = 1, R_NOSPACE = 2 };

typedef struct gnode {
    uint32_t pos;   /* element: a terminal for a top, a rule reference for a frame */
    int32_t parent; /* -1: the bottom */
    uint32_t depth;
} gnode;

/* A matcher position: the forest of stacks and the pending UTF-8 bytes. */
typedef struct mpos {
    const gnode *nodes;
    const uint32_t *tops;
    uint32_t n_nodes, n_tops;
    bool accepting;
    uint8_t pb[4];
    uint8_t plen, need;
} mpos;

/* Where a step writes its forest. */
typedef struct outf {
    gnode *nodes;
    uint32_t *tops;
    uint32_t ncap, tcap;
    uint32_t n_nodes, n_tops;
    bool accepting;
} outf;

typedef struct hent {
    uint32_t gen, pos;
    int32_t parent, node;
    uint32_t expanded;
} hent;

typedef struct item {
    uint32_t pos;
    int32_t parent;
} item;

/* What mask remembers of the steps from a level. A step's result depends
 * only on which of the level's tops matched (a signature), so a sibling
 * byte whose code point matches the same tops takes the same forest: the
 * last one stays in the arena right after the level; and signatures whose
 * step gave the level's own forest back (a class looping in place) need no
 * step at all, at this level or at the levels below that share the forest. */
#define N_SELF 4
typedef struct stepcache {
    bool valid, accepting; /* the arena entry */
    int rc;
    uint64_t sig; /* the tops that matched (levels of at most 64 tops) */
    uint32_t n_nodes, n_tops;
    uint64_t self[N_SELF];
    uint32_t n_self;
} stepcache;

typedef struct level {
    mpos m;
    uint32_t an, at; /* arena used up to and including this level */
    stepcache c;
} level;

typedef struct scratch {
    hent *tab;
    uint32_t gen, n_ent;
    int32_t *memo;
    uint32_t *memo_gen;
    item *work;
    int32_t *path;
    gnode *nbuf[2];
    uint32_t *tbuf[2];
    gnode *anodes;
    uint32_t *atops;
    level *levels;
} scratch;

struct cv_grammar_state {
    const cv_grammar *g;
    gnode *nodes;
    uint32_t *tops;
    mpos cur;
    scratch *w;
};

static void new_gen(scratch *w)
{
    if (++w->gen == 0) {
        for (uint32_t i = 0; i < TAB_SIZE; i++)
            w->tab[i].gen = 0;
        for (uint32_t i = 0; i < CV_GRAMMAR_MAX_NODES; i++)
            w->memo_gen[i] = 0;
        w->gen = 1;
    }
    w->n_ent = 0;
}

/* The entry of (pos, parent) in this step's table, made when new; NULL past the cap. */
static hent *entry(scratch *w, uint32_t pos, int32_t parent)
{
    uint32_t h = pos * 0x9E3779B1u ^ (uint32_t)(parent + 1) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    for (h &= TAB_SIZE - 1;; h = (h + 1) & (TAB_SIZE - 1)) {
        hent *e = &w->tab[h];
        if (e->gen != w->gen) {
            if (w->n_ent >= MAX_ITEMS)
                return NULL;
            w->n_ent++;
            *e = (hent){w->gen, pos, parent, -1, 0};
            return e;
        }
        if (e->pos == pos && e->parent == parent)
            return e;
    }
}

/* The node of entry e in o, made when new. */
static int node_of(hent *e, outf *o, int32_t *id)
{
    if (e->node < 0) {
        const uint32_t depth = e->parent < 0 ? 1 : o->nodes[e->parent].depth + 1;
        if (depth > CV_GRAMMAR_MAX_DEPTH)
            return R_REJECT;
        if (o->n_nodes >= o->ncap)
            return o->ncap < CV_GRAMMAR_MAX_NODES ? R_NOSPACE : R_REJECT;
        o->nodes[o->n_nodes] = (gnode){e->pos, e->parent, depth};
        e->node = (int32_t)o->n_nodes++;
    }
    *id = e->node;
    return R_OK;
}

/* Copies node id of the input forest (and its ancestors) into o. */
static int translate(scratch *w, const mpos *in, int32_t id, outf *o, int32_t *out)
{
    uint32_t n = 0;
    while (id >= 0 && w->memo_gen[id] != w->gen) {
        if (n > CV_GRAMMAR_MAX_DEPTH)
            return R_REJECT; /* cannot happen: input depths are within the cap */
        w->path[n++] = id;
        id = in->nodes[id].parent;
    }
    int32_t cur = id < 0 ? -1 : w->memo[id];
    while (n) {
        const int32_t k = w->path[--n];
        hent *e = entry(w, in->nodes[k].pos, cur);
        if (!e)
            return R_REJECT;
        const int rc = node_of(e, o, &cur);
        if (rc)
            return rc;
        w->memo[k] = cur;
        w->memo_gen[k] = w->gen;
    }
    *out = cur;
    return R_OK;
}

/* Expands the stack (pos, parent) into o: its tops, its end. */
static int expand(const cv_grammar *g, scratch *w, uint32_t pos, int32_t parent, outf *o)
{
    uint32_t sp = 0;
    w->work[sp++] = (item){pos, parent};
    while (sp) {
        const item it = w->work[--sp];
        hent *e = entry(w, it.pos, it.parent);
        if (!e)
            return R_REJECT;
        if (e->expanded)
            continue;
        e->expanded = 1;
        const gelem el = g->el[it.pos];
        int32_t id;
        int rc;
        switch (el.type) {
        case E_END:
        case E_ALT:
            if (it.parent < 0) {
                o->accepting = true;
            } else {
                const gnode pn = o->nodes[it.parent];
                if (sp >= MAX_ITEMS)
                    return R_REJECT;
                w->work[sp++] = (item){pn.pos + 1, pn.parent};
            }
            break;
        case E_REF: {
            /* a reference that ends its alternative returns where the
             * alternative would: no frame (x* does not deepen the stack) */
            const uint32_t nt = g->el[it.pos + 1].type;
            if (nt == E_ALT || nt == E_END)
                id = it.parent;
            else if ((rc = node_of(e, o, &id)) != 0)
                return rc;
            const uint32_t a0 = g->rule_alt[el.v], a1 = g->rule_alt[el.v + 1];
            if (a1 - a0 > MAX_ITEMS - sp)
                return R_REJECT;
            for (uint32_t a = a1; a > a0; a--)
                w->work[sp++] = (item){g->alt_start[a - 1], id};
            break;
        }
        default:
            if ((rc = node_of(e, o, &id)) != 0)
                return rc;
            if (o->n_tops >= o->tcap)
                return o->tcap < CV_GRAMMAR_MAX_STACKS ? R_NOSPACE : R_REJECT;
            o->tops[o->n_tops++] = (uint32_t)id;
            break;
        }
    }
    return R_OK;
}

static bool set_has(const cv_grammar *g, uint32_t si, uint32_t cp)
{
    const gset *st = &g->sets[si];
    const uint32_t *rg = g->ranges + 2 * (size_t)st->off;
    uint32_t lo = 0, hi = st->n; /* first range whose end is >= cp */
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (rg[2 * mid + 1] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    const bool in = lo < st->n && rg[2 * lo] <= cp;
    return in != (st->neg != 0);
}

static bool matches(const cv_grammar *g, gelem e, uint32_t cp)
{
    switch (e.type) {
    case E_CHAR: return e.v == cp;
    case E_ANY: return true;
    case E_SET: return set_has(g, e.v, cp);
    default: return false;
    }
}

/* Whether terminal e matches some code point in [lo, hi]. */
static bool meets(const cv_grammar *g, gelem e, uint32_t lo, uint32_t hi)
{
    switch (e.type) {
    case E_CHAR: return lo <= e.v && e.v <= hi;
    case E_ANY: return true;
    case E_SET: {
        const gset *st = &g->sets[e.v];
        const uint32_t *rg = g->ranges + 2 * (size_t)st->off;
        uint32_t a = 0, b = st->n; /* first range ending at or after lo */
        while (a < b) {
            const uint32_t mid = a + (b - a) / 2;
            if (rg[2 * mid + 1] < lo)
                a = mid + 1;
            else
                b = mid;
        }
        if (!st->neg)
            return a < st->n && rg[2 * a] <= hi;
        return !(a < st->n && rg[2 * a] <= lo && rg[2 * a + 1] >= hi);
    }
    default: return false;
    }
}

/* One code point from in into o. */
static int step(const cv_grammar *g, scratch *w, const mpos *in, uint32_t cp, outf *o)
{
    new_gen(w);
    o->n_nodes = o->n_tops = 0;
    o->accepting = false;
    bool matched = false;
    for (uint32_t t = 0; t < in->n_tops; t++) {
        const gnode *tn = &in->nodes[in->tops[t]];
        if (!matches(g, g->el[tn->pos], cp))
            continue;
        matched = true;
        int32_t par;
        int rc = translate(w, in, tn->parent, o, &par);
        if (rc == R_OK)
            rc = expand(g, w, tn->pos + 1, par, o);
        if (rc)
            return rc;
    }
    return matched ? R_OK : R_REJECT;
}

/* The start into o. */
static int start(const cv_grammar *g, scratch *w, outf *o)
{
    new_gen(w);
    o->n_nodes = o->n_tops = 0;
    o->accepting = false;
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        const int rc = expand(g, w, g->alt_start[a], -1, o);
        if (rc)
            return rc;
    }
    return R_OK;
}

/* Adds byte b to the pending UTF-8 of out (a copy of in): 1 when it
 * completes code point *cp (out has nothing pending then), 0 when the
 * sequence goes on, -1 when b cannot come next. */
static int utf8_add(const mpos *in, uint8_t b, mpos *out, uint32_t *cp)
{
    if (in->plen == 0) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        const uint8_t need = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!need)
            return -1;
        out->pb[0] = b;
        out->plen = 1;
        out->need = need;
        return 0;
    }
    const uint8_t lead = in->pb[0];
    uint8_t lo = 0x80, hi = 0xBF;
    if (in->plen == 1) {
        if (lead == 0xE0)
            lo = 0xA0;
        else if (lead == 0xED)
            hi = 0x9F;
        else if (lead == 0xF0)
            lo = 0x90;
        else if (lead == 0xF4)
            hi = 0x8F;
    }
    if (b < lo || b > hi)
        return -1;
    out->pb[out->plen++] = b;
    if (out->plen != out->need)
        return 0;
    uint32_t v = out->need == 2 ? lead & 0x1Fu : out->need == 3 ? lead & 0x0Fu : lead & 0x07u;
    for (uint32_t k = 1; k < out->need; k++)
        v = v << 6 | (out->pb[k] & 0x3Fu);
    out->plen = 0;
    out->need = 0;
    *cp = v;
    return 1;
}

/* R_OK when some top of in meets a code point that out's partial
 * sequence may begin, else R_REJECT. */
static int partial_fits(const cv_grammar *g, const mpos *in, const mpos *out)
{
    const uint8_t lead = out->pb[0];
    uint32_t v = out->need == 2 ? lead & 0x1Fu : out->need == 3 ? lead & 0x0Fu : lead & 0x07u;
    for (uint32_t k = 1; k < out->plen; k++)
        v = v << 6 | (out->pb[k] & 0x3Fu);
    const uint32_t bits = 6u * (uint32_t)(out->need - out->plen);
    uint32_t lo = v << bits, hi = lo | ((1u << bits) - 1);
    if (out->plen == 1) {
        if (lead == 0xE0 && lo < 0x800)
            lo = 0x800;
        if (lead == 0xED && hi > 0xD7FF)
            hi = 0xD7FF;
        if (lead == 0xF0 && lo < 0x10000)
            lo = 0x10000;
        if (lead == 0xF4 && hi > 0x10FFFF)
            hi = 0x10FFFF;
    }
    for (uint32_t t = 0; t < in->n_tops; t++)
        if (meets(g, g->el[in->nodes[in->tops[t]].pos], lo, hi))
            return R_OK;
    return R_REJECT;
}

/* The tops of in (at most 64) that cp matches, a bit each. */
static uint64_t top_signature(const cv_grammar *g, const mpos *in, uint32_t cp)
{
    uint64_t sig = 0;
    for (uint32_t t = 0; t < in->n_tops; t++)
        if (matches(g, g->el[in->nodes[in->tops[t]].pos], cp))
            sig |= (uint64_t)1 << t;
    return sig;
}

static bool loops_in_place(const stepcache *c, uint64_t sig)
{
    for (uint32_t i = 0; i < c->n_self; i++)
        if (c->self[i] == sig)
            return true;
    return false;
}

/* Whether a step gave back in's own forest. */
static bool same_forest(const mpos *in, const outf *o)
{
    return o->n_nodes == in->n_nodes && o->n_tops == in->n_tops && o->accepting == in->accepting &&
           memcmp(o->nodes, in->nodes, (size_t)o->n_nodes * sizeof *o->nodes) == 0 &&
           memcmp(o->tops, in->tops, (size_t)o->n_tops * sizeof *o->tops) == 0;
}

/* Remembers the step of signature sig (result rc, forest in o). */
static void cache_step(stepcache *c, uint64_t sig, int rc, const outf *o)
{
    /* a step that ran out of arena leaves nothing to reuse */
    c->valid = rc != R_NOSPACE;
    c->accepting = o->accepting;
    c->rc = rc;
    c->sig = sig;
    c->n_nodes = o->n_nodes;
    c->n_tops = o->n_tops;
}

/* out takes o's forest. */
static void take_forest(mpos *out, const outf *o, bool *stepped)
{
    out->nodes = o->nodes;
    out->tops = o->tops;
    out->n_nodes = o->n_nodes;
    out->n_tops = o->n_tops;
    out->accepting = o->accepting;
    *stepped = true;
}

/* Code point cp from in: a step into o, unless the level's cache c (NULL:
 * none) knows the result, or knows the step gives in's forest back. */
static int feed_code_point(const cv_grammar *g, scratch *w, const mpos *in, uint32_t cp, mpos *out, outf *o,
                           bool *stepped, stepcache *c)
{
    const bool cached = c && in->n_tops <= 64;
    uint64_t sig = 0;
    if (cached) {
        sig = top_signature(g, in, cp);
        if (!sig)
            return R_REJECT;
        if (loops_in_place(c, sig)) {
            c->valid = false; /* what follows reuses the arena after the level */
            return R_OK;
        }
        if (c->valid && c->sig == sig) {
            if (c->rc)
                return c->rc;
            o->n_nodes = c->n_nodes;
            o->n_tops = c->n_tops;
            o->accepting = c->accepting;
            take_forest(out, o, stepped);
            return R_OK;
        }
    } else if (c) {
        c->valid = false;
    }
    const int rc = step(g, w, in, cp, o);
    if (cached) {
        if (rc == R_OK && same_forest(in, o)) {
            c->self[c->n_self < N_SELF ? c->n_self++ : sig % N_SELF] = sig;
            c->valid = false;
            return R_OK; /* the same forest: out keeps in's */
        }
        cache_step(c, sig, rc, o);
    }
    if (rc)
        return rc;
    take_forest(out, o, stepped);
    return R_OK;
}

/* One byte from in into out; a completed code point steps into o (then
 * *stepped is set and out's forest is o's). */
static int feed(const cv_grammar *g, scratch *w, const mpos *in, uint8_t b, mpos *out, outf *o, bool *stepped,
                stepcache *c)
{
    *out = *in;
    *stepped = false;
    uint32_t cp;
    const int u = utf8_add(in, b, out, &cp);
    if (u < 0)
        return R_REJECT;
    if (u > 0)
        return feed_code_point(g, w, in, cp, out, o, stepped, c);
    if (c) /* what follows a partial byte reuses the arena after the level */
        c->valid = false;
    return partial_fits(g, in, out); /* a partial sequence: the code points it may begin */
}

/* Matches bytes from *m with the ping-pong buffers; *m is the result. */
static int run(const cv_grammar *g, scratch *w, mpos *m, const uint8_t *b, size_t n)
{
    int which = 0;
    for (size_t i = 0; i < n; i++) {
        outf o = {w->nbuf[which], w->tbuf[which], CV_GRAMMAR_MAX_NODES, CV_GRAMMAR_MAX_STACKS, 0, 0, false};
        mpos nx;
        bool stepped;
        if (feed(g, w, m, b[i], &nx, &o, &stepped, NULL) != R_OK)
            return -1;
        if (stepped)
            which ^= 1;
        *m = nx;
    }
    return 0;
}

static void scratch_free(scratch *w)
{
    if (!w)
        return;
    cv_free(w->tab);
    cv_free(w->memo);
    cv_free(w->memo_gen);
    cv_free(w->work);
    cv_free(w->path);
    for (int i = 0; i < 2; i++) {
        cv_free(w->nbuf[i]);
        cv_free(w->tbuf[i]);
    }
    cv_free(w->anodes);
    cv_free(w->atops);
    cv_free(w->levels);
    cv_free(w);
}

static scratch *scratch_new(bool for_mask)
{
    scratch *w = cv_calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->tab = cv_calloc(TAB_SIZE, sizeof *w->tab);
    w->memo = cv_calloc(CV_GRAMMAR_MAX_NODES, sizeof *w->memo);
    w->memo_gen = cv_calloc(CV_GRAMMAR_MAX_NODES, sizeof *w->memo_gen);
    w->work = cv_malloc(MAX_ITEMS * sizeof *w->work);
    w->path = cv_malloc((CV_GRAMMAR_MAX_DEPTH + 2) * sizeof *w->path);
    bool ok = w->tab && w->memo && w->memo_gen && w->work && w->path;
    for (int i = 0; i < 2 && for_mask; i++) {
        w->nbuf[i] = cv_malloc(CV_GRAMMAR_MAX_NODES * sizeof(gnode));
        w->tbuf[i] = cv_malloc(CV_GRAMMAR_MAX_STACKS * sizeof(uint32_t));
        ok = ok && w->nbuf[i] && w->tbuf[i];
    }
    if (for_mask) {
        w->anodes = cv_malloc(ARENA_NODES * sizeof(gnode));
        w->atops = cv_malloc(ARENA_TOPS * sizeof(uint32_t));
        w->levels = cv_malloc((MAX_LEVELS + 1) * sizeof(level));
        ok = ok && w->anodes && w->atops && w->levels;
    }
    if (!ok) {
        scratch_free(w);
        return NULL;
    }
    return w;
}

/* 0 when the start is within the caps, 1 when not, -1 out of memory. */
static int start_fits(const cv_grammar *g)
{
    scratch *w = scratch_new(false);
    gnode *nodes = cv_malloc(CV_GRAMMAR_MAX_NODES * sizeof *nodes);
    uint32_t *tops = cv_malloc(CV_GRAMMAR_MAX_STACKS * sizeof *tops);
    int rc = -1;
    if (w && nodes && tops) {
        outf o = {nodes, tops, CV_GRAMMAR_MAX_NODES, CV_GRAMMAR_MAX_STACKS, 0, 0, false};
        rc = start(g, w, &o) == R_OK ? 0 : 1;
    }
    scratch_free(w);
    cv_free(nodes);
    cv_free(tops);
    return rc;
}

void cv_grammar_state_reset(cv_grammar_state *s)
{
    outf o = {s->nodes, s->tops, CV_GRAMMAR_MAX_NODES, CV_GRAMMAR_MAX_STACKS, 0, 0, false};
    const int rc = start(s->g, s->w, &o); /* within the caps: checked at parse */
    s->cur = (mpos){.nodes = s->nodes, .tops = s->tops, .n_nodes = rc ? 0 : o.n_nodes, .n_tops = rc ? 0 : o.n_tops,
                    .accepting = rc ? false : o.accepting};
}

cv_grammar_state *cv_grammar_state_create(const cv_grammar *g)
{
    if (!g)
        return NULL;
    cv_grammar_state *s = cv_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->g = g;
    s->nodes = cv_malloc(CV_GRAMMAR_MAX_NODES * sizeof *s->nodes);
    s->tops = cv_malloc(CV_GRAMMAR_MAX_STACKS * sizeof *s->tops);
    s->w = scratch_new(true);
    if (!s->nodes || !s->tops || !s->w) {
        cv_grammar_state_free(s);
        return NULL;
    }
    cv_grammar_state_reset(s);
    return s;
}

void cv_grammar_state_free(cv_grammar_state *s)
{
    if (!s)
        return;
    cv_free(s->nodes);
    cv_free(s->tops);
    scratch_free(s->w);
    cv_free(s);
}

bool cv_grammar_allows(const cv_grammar_state *s, const char *bytes, size_t n)
{
    if (n == 0)
        return true;
    mpos m = s->cur;
    return run(s->g, s->w, &m, (const uint8_t *)bytes, n) == 0;
}

int cv_grammar_accept(cv_grammar_state *s, const char *bytes, size_t n)
{
    if (n == 0)
        return 0;
    mpos m = s->cur;
    if (run(s->g, s->w, &m, (const uint8_t *)bytes, n) != 0)
        return -1;
    if (m.nodes != s->nodes) {
        memcpy(s->nodes, m.nodes, (size_t)m.n_nodes * sizeof *s->nodes);
        memcpy(s->tops, m.tops, (size_t)m.n_tops * sizeof *s->tops);
        m.nodes = s->nodes;
        m.tops = s->tops;
    }
    s->cur = m;
    return 0;
}

bool cv_grammar_complete(const cv_grammar_state *s)
{
    return s->cur.plen == 0 && s->cur.accepting;
}

/* --------------------------------------------------------------- pieces */

struct cv_grammar_pieces {
    int32_t n;
    uint8_t *data;
    size_t *off;
    uint32_t *len;
    int32_t *order; /* ids sorted by their bytes */
    uint32_t *lcp;  /* lcp[k]: common prefix of the pieces order[k-1] and order[k] */
};

/* Piece x before piece y: by bytes, a prefix first, equal pieces by id. */
static bool piece_before(const cv_grammar_pieces *p, int32_t x, int32_t y)
{
    const uint32_t lx = p->len[x], ly = p->len[y];
    const int c = memcmp(p->data + p->off[x], p->data + p->off[y], lx < ly ? lx : ly);
    if (c)
        return c < 0;
    if (lx != ly)
        return lx < ly;
    return x < y;
}

/* Sorts ids[0, n) by piece_before: a bottom-up merge sort (qsort has no
 * context argument, and this must be safe in concurrent loads). */
static void sort_pieces(const cv_grammar_pieces *p, int32_t *ids, int32_t *tmp, size_t n)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            const size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = piece_before(p, ids[j], ids[i]) ? ids[j++] : ids[i++];
            while (i < mid)
                tmp[k++] = ids[i++];
            while (j < hi)
                tmp[k++] = ids[j++];
        }
        memcpy(ids, tmp, n * sizeof *ids);
    }
}

void cv_grammar_pieces_free(cv_grammar_pieces *p)
{
    if (!p)
        return;
    cv_free(p->data);
    cv_free(p->off);
    cv_free(p->len);
    cv_free(p->order);
    cv_free(p->lcp);
    cv_free(p);
}

cv_grammar_pieces *cv_grammar_pieces_create(int32_t n_tokens, const char *const *bytes, const uint32_t *len)
{
    if (n_tokens < 0 || (n_tokens > 0 && (!bytes || !len)))
        return NULL;
    cv_grammar_pieces *p = cv_calloc(1, sizeof *p);
    if (!p)
        return NULL;
    const size_t n = (size_t)n_tokens;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t l = bytes[i] ? len[i] : 0;
        if (total > SIZE_MAX - l - 1) {
            cv_free(p);
            return NULL;
        }
        total += l;
    }
    p->n = n_tokens;
    p->data = cv_malloc(total + 1);
    p->off = cv_malloc(n * sizeof *p->off + 1);
    p->len = cv_malloc(n * sizeof *p->len + 1);
    p->order = cv_malloc(n * sizeof *p->order + 1);
    p->lcp = cv_malloc(n * sizeof *p->lcp + 1);
    if (!p->data || !p->off || !p->len || !p->order || !p->lcp) {
        cv_grammar_pieces_free(p);
        return NULL;
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        p->off[i] = at;
        p->len[i] = bytes[i] ? len[i] : 0;
        if (p->len[i])
            memcpy(p->data + at, bytes[i], p->len[i]);
        at += p->len[i];
        p->order[i] = (int32_t)i;
    }
    int32_t *tmp = cv_malloc(n * sizeof *tmp + 1);
    if (!tmp) {
        cv_grammar_pieces_free(p);
        return NULL;
    }
    sort_pieces(p, p->order, tmp, n);
    cv_free(tmp);
    for (size_t k = 0; k < n; k++) {
        uint32_t l = 0;
        if (k > 0) {
            const int32_t a = p->order[k - 1], b = p->order[k];
            const uint32_t m = p->len[a] < p->len[b] ? p->len[a] : p->len[b];
            while (l < m && p->data[p->off[a] + l] == p->data[p->off[b] + l])
                l++;
        }
        p->lcp[k] = l;
    }
    return p;
}

uint32_t cv_grammar_piece(const cv_grammar_pieces *p, int32_t id, const char **bytes)
{
    if (!p || id < 0 || id >= p->n) {
        *bytes = "";
        return 0;
    }
    *bytes = (const char *)p->data + p->off[id];
    return p->len[id];
}

void cv_grammar_mask(const cv_grammar_state *s, const cv_grammar_pieces *p, float *logits)
{
    const cv_grammar *g = s->g;
    scratch *w = s->w;
    level *lv = w->levels;
    lv[0] = (level){s->cur, 0, 0, {.valid = false}};
    uint32_t valid = 0; /* lv[0 .. valid] hold the prefixes of the last piece walked */
    for (int32_t k = 0; k < p->n; k++) {
        const int32_t id = p->order[k];
        const uint32_t len = p->len[id];
        const uint8_t *b = p->data + p->off[id];
        if (len == 0) {
            logits[id] = -INFINITY;
            continue;
        }
        uint32_t d = valid < p->lcp[k] ? valid : p->lcp[k];
        valid = d;
        while (d < len) {
            int rc = R_NOSPACE;
            bool stepped = false;
            if (d < MAX_LEVELS) {
                const level *in = &lv[d];
                const uint32_t fn = ARENA_NODES - in->an, ft = ARENA_TOPS - in->at;
                outf o = {w->anodes + in->an, w->atops + in->at, fn < CV_GRAMMAR_MAX_NODES ? fn : CV_GRAMMAR_MAX_NODES,
                          ft < CV_GRAMMAR_MAX_STACKS ? ft : CV_GRAMMAR_MAX_STACKS, 0, 0, false};
                rc = feed(g, w, &in->m, b[d], &lv[d + 1].m, &o, &stepped, &lv[d].c);
                if (rc == R_OK) {
                    /* a level with the forest of the one above keeps its loops */
                    lv[d + 1].c.valid = false;
                    lv[d + 1].c.n_self = stepped ? 0 : lv[d].c.n_self;
                    memcpy(lv[d + 1].c.self, lv[d].c.self, sizeof lv[d].c.self);
                    lv[d + 1].an = in->an + (stepped ? o.n_nodes : 0);
                    lv[d + 1].at = in->at + (stepped ? o.n_tops : 0);
                }
            }
            if (rc == R_NOSPACE) { /* the rest of this piece as allows matches it */
                mpos m = lv[d].m;
                if (run(g, w, &m, b + d, len - d) != 0)
                    logits[id] = -INFINITY;
                break;
            }
            if (rc == R_REJECT) { /* every piece with this prefix of d + 1 bytes */
                logits[id] = -INFINITY;
                while (k + 1 < p->n && p->lcp[k + 1] >= d + 1)
                    logits[p->order[++k]] = -INFINITY;
                break;
            }
            valid = ++d;
        }
    }
}
