/* grammar_parse.c: the GBNF parser behind cv_grammar_parse (grammar.h),
 * which compiles text into the rules the matcher (grammar_match.c) runs.
 *
 * Parsing: a recursive-descent parser over the text, every read bounds
 * checked (peek past the end gives -1), builds llama.cpp's rule form: a rule
 * is its alternatives' elements, each alternative ended by ALT and the last
 * by END; groups and repetitions become generated rules (x* is r ::= x r |,
 * x{m,n} is m copies of x then n-m nested optional rules). The rules are
 * then flattened into one element array, checked (undefined rules, root,
 * nullable rules by a worklist, left recursion as a cycle in the "can start
 * with" graph by an iterative DFS) and the start is expanded once to refuse
 * a grammar whose start exceeds the caps. */
#include "infer/grammar_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"

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

/* One concatenation of symbols into r, each followed by its repetitions. */
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
            perr(&p, p.rules[r].pos, "undefined rule '%.*s'",
                 (int)(p.rules[r].name_len > 200 ? 200 : p.rules[r].name_len), (const char *)p.s + p.rules[r].name_off);
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
    const int fit = cv_grammar_start_fits(g);
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
