/* schema.c: see schema.h.
 *
 * The compiler walks the schema and returns, for each subschema, a GBNF
 * expression (malloc'd text, parenthesized when it has alternatives);
 * named rules (primitives, object members, $ref targets) collect in a
 * table, deduplicated by body. Errors: the first one wins, written with
 * the JSON pointer of the place (ctx.path) into the caller's buffer.
 *
 * The schema is untrusted, so the work is bounded as it goes, not at the
 * end: an expression written twice (an array's item, an object's optional
 * tail) becomes a rule and is written by name (share), so the text grows
 * with the schema, never by doubling per level; every subschema's
 * expression and every rule count against the grammar's byte limit the
 * moment they exist (budget); and schemas nest at most MAX_NESTING deep. */
#include "serve/schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"
#include "serve/buf.h"
#include "serve/regex.h"
#include "convoy.h"

#define MAX_INT_DIGITS 16
#define INT_INF 9999999999999999LL /* the largest integer part: 16 digits */
#define MAX_MERGE_DEPTH 32
#define MAX_NESTING 64  /* subschemas inside subschemas */
#define SHARE_BYTES 32  /* an expression written twice becomes a rule from this length on */

typedef struct rule {
    char *name, *body; /* body NULL while a $ref target is being compiled */
    size_t body_len;   /* compared first when bodies are deduplicated */
} rule;

typedef struct ref {
    char *ptr, *name;
    int done, depth;
} ref;

typedef struct ctx {
    const json_t *root;
    rule *rules;
    int nrules, caprules;
    ref *refs;
    int nrefs, caprefs;
    int depth; /* structural characters consumed on the way here (for $ref cycles) */
    int nesting;  /* subschemas open on the way here */
    size_t text;  /* bytes of the rules so far */
    char path[1024];
    size_t plen;
    char *err;
    size_t errlen;
    bool failed;
} ctx;

/* ---- small helpers ---------------------------------------------------------------------------- */

static char *xvfmt(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    const int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return NULL;
    char *s = cv_malloc((size_t)n + 1);
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

static char *xfmt(const char *fmt, ...) CV_PRINTF(1, 2);
static char *xfmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = xvfmt(fmt, ap);
    va_end(ap);
    return s;
}

static char *xstrdup(const char *s) { return xfmt("%s", s); }

static void *fail(ctx *c, const char *fmt, ...) CV_PRINTF(2, 3);
static void *fail(ctx *c, const char *fmt, ...)
{
    if (c->failed)
        return NULL;
    c->failed = true;
    char msg[CV_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cv_errf(c->err, c->errlen, "response_format schema at \"#%s\": %s", c->path, msg);
    return NULL;
}

static void *oom(ctx *c) { return fail(c, "out of memory"); }

/* Checks an allocation: NULL reports out of memory. */
static char *chk(ctx *c, char *s)
{
    if (!s)
        oom(c);
    return s;
}

/* Whether the rules so far and more bytes stay within the grammar's byte limit (fails if not). */
static bool within_budget(ctx *c, size_t more)
{
    if (c->text + more <= CONVOY_GRAMMAR_TEXT_MAX)
        return true;
    fail(c, "the grammar passes %u bytes, the most a request may use", CONVOY_GRAMMAR_TEXT_MAX);
    return false;
}

/* expr, or NULL (expr freed) when it would not fit beside the rules so far. */
static char *budget(ctx *c, char *expr)
{
    if (expr && !within_budget(c, strlen(expr))) {
        cv_free(expr);
        return NULL;
    }
    return expr;
}

/* Appends a JSON pointer token (escaped ~0 ~1); returns the old length for path_pop. */
static size_t path_push(ctx *c, const char *tok)
{
    const size_t old = c->plen;
    size_t n = c->plen;
    if (n + 1 < sizeof c->path)
        c->path[n++] = '/';
    for (const char *p = tok; *p && n + 3 < sizeof c->path; p++) {
        if (*p == '~' || *p == '/') {
            c->path[n++] = '~';
            c->path[n++] = *p == '~' ? '0' : '1';
        } else {
            c->path[n++] = *p;
        }
    }
    c->path[n] = 0;
    c->plen = n;
    return old;
}

static size_t path_push_index(ctx *c, const char *tok, size_t i)
{
    char buf[32];
    const size_t old = path_push(c, tok);
    snprintf(buf, sizeof buf, "%zu", i);
    path_push(c, buf);
    return old;
}

static void path_pop(ctx *c, size_t old)
{
    c->plen = old;
    c->path[old] = 0;
}

static char *gbnf_lit(const char *s) { return cv_gbnf_literal(s, strlen(s)); }

/* The JSON text of a string (compact, UTF-8 as is). */
static char *json_string_text(const char *s)
{
    json_t *j = json_string(s);
    if (!j)
        return NULL;
    char *t = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    if (!t)
        return NULL;
    char *r = xstrdup(t);
    free(t);
    return r;
}

/* Shortest text of a double that reads back as the same value. */
static void real_text(double v, char *out, size_t n)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(out, n, "%.*g", p, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* Compact JSON text of v, reals in their shortest form, keys in order. */
static int json_text(sv_buf *b, const json_t *v)
{
    char tmp[64];
    switch (json_typeof(v)) {
    case JSON_NULL:
        return sv_buf_puts(b, "null");
    case JSON_TRUE:
        return sv_buf_puts(b, "true");
    case JSON_FALSE:
        return sv_buf_puts(b, "false");
    case JSON_INTEGER:
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return sv_buf_puts(b, tmp);
    case JSON_REAL:
        real_text(json_real_value(v), tmp, sizeof tmp);
        return sv_buf_puts(b, tmp);
    case JSON_STRING: {
        char *t = json_string_text(json_string_value(v));
        const int r = t ? sv_buf_puts(b, t) : -1;
        cv_free(t);
        return r;
    }
    case JSON_ARRAY: {
        if (sv_buf_puts(b, "["))
            return -1;
        for (size_t i = 0; i < json_array_size(v); i++)
            if ((i && sv_buf_puts(b, ",")) || json_text(b, json_array_get(v, i)))
                return -1;
        return sv_buf_puts(b, "]");
    }
    case JSON_OBJECT: {
        const char *k;
        const json_t *x;
        bool first = true;
        if (sv_buf_puts(b, "{"))
            return -1;
        json_object_foreach ((json_t *)v, k, x) {
            char *t = json_string_text(k);
            const int bad = !t || (!first && sv_buf_puts(b, ",")) || sv_buf_puts(b, t) || sv_buf_puts(b, ":") ||
                            json_text(b, x);
            cv_free(t);
            if (bad)
                return -1;
            first = false;
        }
        return sv_buf_puts(b, "}");
    }
    }
    return -1;
}

/* ---- the rule table ----------------------------------------------------------------------------- */

static rule *find_rule(ctx *c, const char *name)
{
    for (int i = 0; i < c->nrules; i++)
        if (!strcmp(c->rules[i].name, name))
            return &c->rules[i];
    return NULL;
}

/* Gives rule r its body (taken over), counted against the byte limit; false after a failure. */
static bool set_body(ctx *c, rule *r, char *body)
{
    if (body && !within_budget(c, strlen(body))) {
        cv_free(body);
        return false;
    }
    r->body = body;
    r->body_len = body ? strlen(body) : 0;
    c->text += r->body_len;
    return !c->failed;
}

/* Appends the rule name ::= body (both taken over; body NULL reserves the
 * name), counted against the byte limit; returns a copy of its name. */
static char *append_rule(ctx *c, char *name, char *body)
{
    if (!name || c->nrules == c->caprules) {
        const int cap = c->caprules ? c->caprules * 2 : 32;
        rule *r = name ? cv_realloc(c->rules, (size_t)cap * sizeof *r) : NULL;
        if (!r) {
            cv_free(name);
            cv_free(body);
            return oom(c);
        }
        c->rules = r;
        c->caprules = cap;
    }
    c->rules[c->nrules++] = (rule){name, NULL, 0};
    c->text += strlen(name) + sizeof " ::= \n" - 1;
    if (!set_body(c, &c->rules[c->nrules - 1], body))
        return NULL;
    return chk(c, xstrdup(name));
}

/* Adds a rule named after base (made unique) with body (taken over; NULL reserves the name) and
 * returns a copy of its name; an existing rule with the same body is reused. */
static char *add_rule(ctx *c, const char *base, char *body)
{
    if (c->failed) {
        cv_free(body);
        return NULL;
    }
    const size_t len = body ? strlen(body) : 0;
    for (int i = 0; body && i < c->nrules; i++)
        if (c->rules[i].body && c->rules[i].body_len == len && !memcmp(c->rules[i].body, body, len)) {
            cv_free(body);
            return chk(c, xstrdup(c->rules[i].name));
        }
    char clean[48];
    size_t n = 0;
    for (const char *p = base; *p && n + 1 < sizeof clean; p++) {
        const char ch = *p;
        const bool word = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (word)
            clean[n++] = ch;
        else if (n && clean[n - 1] != '-')
            clean[n++] = '-';
    }
    while (n && clean[n - 1] == '-')
        n--;
    clean[n] = 0;
    if (!n)
        snprintf(clean, sizeof clean, "r");
    char *name = xstrdup(clean);
    /* numbered from the rule count, so a base met n times is not probed n times */
    for (int k = c->nrules + 1; name && find_rule(c, name); k++) {
        cv_free(name);
        name = xfmt("%s-%d", clean, k);
    }
    return append_rule(c, name, body);
}

/* expr itself when short, else the name of a rule holding it (expr taken over): for an expression
 * the caller writes more than once. */
static char *share(ctx *c, const char *base, char *expr)
{
    if (!expr || strlen(expr) < SHARE_BYTES)
        return expr;
    return add_rule(c, base, expr);
}

/* ---- primitives ----------------------------------------------------------------------------------- */

typedef struct prim {
    const char *name, *body;
} prim;

static const prim prims[] = {
    {"ws", "\" \"?"},
    {"hex", "[0-9a-fA-F]"},
    /* \uXXXX without U+0000 and without surrogates (D800-DFFF) */
    {"uesc", "\"0\" \"0\" \"0\" [1-9a-fA-F] | \"0\" \"0\" [1-9a-fA-F] hex | \"0\" [1-9a-fA-F] hex hex | "
             "[1-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex"},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )"},
    {"kchar", "[^\"\\\\\\x7F\\x00-\\x1F]"},
    {"string", "\"\\\"\" char* \"\\\"\""},
    {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )"},
    {"number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?"},
    {"boolean", "\"true\" | \"false\""},
    {"null", "\"null\""},
    {"value", "object | array | string | number | boolean | null"},
    {"member", "string \":\" ws value"},
    {"object", "\"{\" ( member ( \",\" ws member )* )? \"}\""},
    {"array", "\"[\" ( value ( \",\" ws value )* )? \"]\""},
    {"year", "[0-9]{4}"},
    {"leap", "[0-9] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( \"0\" [048] | [2468] [048] | [13579] "
             "[26] ) \"00\""},
    {"date", "year \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" "
             "[469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | "
             "\"2\" [0-8] ) ) | leap \"-02-29\""},
    {"hour", "[01] [0-9] | \"2\" [0-3]"},
    {"time", "hour \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [-+] hour \":\" [0-5] [0-9] )"},
    {"date-time", "date \"T\" time"},
    {"uuid", "hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}"},
};

/* The primitive's name, its rule (and those it uses) added on first use. */
static char *use_prim(ctx *c, const char *name)
{
    if (c->failed)
        return NULL;
    if (find_rule(c, name))
        return chk(c, xstrdup(name));
    for (size_t i = 0; i < sizeof prims / sizeof prims[0]; i++) {
        if (strcmp(prims[i].name, name))
            continue;
        char *body = chk(c, xstrdup(prims[i].body));
        if (!body)
            return NULL;
        cv_free(append_rule(c, xstrdup(name), body));
        if (c->failed)
            return NULL;
        /* the rules this body names */
        static const char *const deps[][4] = {
            {"uesc", "hex"},          {"char", "uesc"},          {"string", "char"},
            {"value", "object", "array", "string"}, {"member", "string", "ws", "value"},
            {"object", "member", "ws"}, {"array", "value", "ws"}, {"date", "year", "leap"},
            {"time", "hour"},         {"date-time", "date", "time"}, {"uuid", "hex"},
        };
        for (size_t d = 0; d < sizeof deps / sizeof deps[0]; d++)
            if (!strcmp(deps[d][0], name))
                for (int k = 1; k < 4 && deps[d][k]; k++)
                    cv_free(use_prim(c, deps[d][k]));
        if (!strcmp(name, "value")) {
            cv_free(use_prim(c, "number"));
            cv_free(use_prim(c, "boolean"));
            cv_free(use_prim(c, "null"));
        }
        return c->failed ? NULL : chk(c, xstrdup(name));
    }
    return fail(c, "internal: no primitive '%s'", name);
}

/* ---- integer ranges ------------------------------------------------------------------------------- */

static int ndigits(long long v)
{
    int d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

static long long pow10ll(int d)
{
    long long p = 1;
    while (d-- > 0)
        p *= 10;
    return p;
}

static int digits_rep(sv_buf *b, int r)
{
    char tmp[32];
    if (r <= 0)
        return 0;
    if (r == 1)
        return sv_buf_puts(b, " [0-9]");
    snprintf(tmp, sizeof tmp, " [0-9]{%d}", r);
    return sv_buf_puts(b, tmp);
}

/* Decimal strings of equal length n in [a, b] (a <= b, digit strings). */
static int same_len(sv_buf *b, const char *a, const char *z, int n)
{
    int i = 0;
    while (i < n && a[i] == z[i])
        i++;
    if (i > 0) {
        char *lit = cv_gbnf_literal(a, (size_t)i);
        const int bad = !lit || sv_buf_puts(b, " ") || sv_buf_puts(b, lit);
        cv_free(lit);
        if (bad)
            return -1;
    }
    if (i == n)
        return 0;
    const int r = n - i - 1;
    bool a_zero = true, z_nine = true;
    for (int k = i + 1; k < n; k++) {
        a_zero &= a[k] == '0';
        z_nine &= z[k] == '9';
    }
    char lo = a[i], hi = z[i];
    char nines[MAX_INT_DIGITS + 1], zeros[MAX_INT_DIGITS + 1];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int nalt = 0;
    if (sv_buf_puts(b, " ("))
        return -1;
    char tmp[32];
    if (!a_zero) {
        snprintf(tmp, sizeof tmp, " \"%c\"", a[i]);
        if (sv_buf_puts(b, tmp) || same_len(b, a + i + 1, nines, r))
            return -1;
        nalt++;
        lo++;
    }
    const char hi_mid = z_nine ? hi : (char)(hi - 1);
    if (lo <= hi_mid) {
        if (nalt && sv_buf_puts(b, " |"))
            return -1;
        if (lo == hi_mid)
            snprintf(tmp, sizeof tmp, " \"%c\"", lo);
        else
            snprintf(tmp, sizeof tmp, " [%c-%c]", lo, hi_mid);
        if (sv_buf_puts(b, tmp) || digits_rep(b, r))
            return -1;
        nalt++;
    }
    if (!z_nine) {
        if (nalt && sv_buf_puts(b, " |"))
            return -1;
        snprintf(tmp, sizeof tmp, " \"%c\"", z[i]);
        if (sv_buf_puts(b, tmp) || same_len(b, zeros, z + i + 1, r))
            return -1;
    }
    return sv_buf_puts(b, " )");
}

/* Canonical decimals (no leading zeros) in [a, b], 0 <= a <= b <= INT_INF, as one parenthesized
 * expression. */
static char *nonneg_range(long long a, long long z)
{
    sv_buf b = {0};
    int bad = sv_buf_puts(&b, "(");
    const int da = ndigits(a), dz = ndigits(z);
    bool first = true;
    for (int d = da; d <= dz && !bad; d++) {
        const long long lo = a > (d == 1 ? 0 : pow10ll(d - 1)) ? a : (d == 1 ? 0 : pow10ll(d - 1));
        const long long hi = z < pow10ll(d) - 1 ? z : pow10ll(d) - 1;
        if (!first)
            bad |= sv_buf_puts(&b, " |");
        first = false;
        if (d >= 2 && lo == pow10ll(d - 1) && z == pow10ll(dz) - 1 && dz > d) {
            char tmp[48];
            snprintf(tmp, sizeof tmp, " [1-9] [0-9]{%d,%d}", d - 1, dz - 1);
            bad |= sv_buf_puts(&b, tmp);
            break;
        }
        char sa[32], sz[32];
        snprintf(sa, sizeof sa, "%0*lld", d & 31, lo);
        snprintf(sz, sizeof sz, "%0*lld", d & 31, hi);
        bad |= same_len(&b, sa, sz, d);
    }
    bad |= sv_buf_puts(&b, " )");
    if (bad) {
        sv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

/* Integers in [lo, hi], both within [-INT_INF, INT_INF], lo <= hi. */
static char *int_range(long long lo, long long hi)
{
    char *pos = NULL, *neg = NULL;
    if (hi >= 0)
        pos = nonneg_range(lo > 0 ? lo : 0, hi);
    if (lo < 0) {
        const long long a = hi < 0 ? -hi : 1;
        neg = nonneg_range(a, -lo);
    }
    char *r = NULL;
    if (pos && neg)
        r = xfmt("( \"-\" %s | %s )", neg, pos);
    else if (neg)
        r = xfmt("\"-\" %s", neg);
    else if (pos)
        r = xstrdup(pos);
    cv_free(pos);
    cv_free(neg);
    return r;
}

/* ---- the compiler --------------------------------------------------------------------------------- */

static char *gen(ctx *c, const json_t *s);
static char *gen_schema(ctx *c, const json_t *s);

static const char *const annotations[] = {"title",    "description", "examples",        "default",
                                          "$schema",  "$id",         "$anchor",         "$comment",
                                          "deprecated", "readOnly",  "writeOnly",       "contentEncoding",
                                          "contentMediaType", "$defs", "definitions"};

static bool is_annotation(const char *k)
{
    for (size_t i = 0; i < sizeof annotations / sizeof annotations[0]; i++)
        if (!strcmp(annotations[i], k))
            return true;
    return false;
}

static const char *const handled[] = {
    "type",      "enum",     "const",    "properties", "required",  "additionalProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "minimum",
    "maximum",   "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "format",
    "uniqueItems", "pattern"};

static bool is_handled(const char *k)
{
    for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
        if (!strcmp(handled[i], k))
            return true;
    return false;
}

/* The first key of s other than annotations and those listed (NULL-terminated), or NULL. */
static const char *other_key(const json_t *s, const char *const *allowed)
{
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)s, k, v) {
        if (is_annotation(k))
            continue;
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok |= !strcmp(*a, k);
        if (!ok)
            return k;
    }
    return NULL;
}

/* Resolves "#..." against the root; NULL when it names nothing. */
static const json_t *resolve(const json_t *root, const char *ptr)
{
    if (ptr[0] != '#')
        return NULL;
    const json_t *cur = root;
    const char *p = ptr + 1;
    while (*p) {
        if (*p != '/')
            return NULL;
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p == '0')
                    ch = '~';
                else if (*p == '1')
                    ch = '/';
                else
                    return NULL;
                p++;
            }
            if (n + 1 >= sizeof tok)
                return NULL;
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            const unsigned long i = strtoul(tok, &end, 10);
            if (!n || *end)
                return NULL;
            cur = json_array_get(cur, i);
        } else {
            return NULL;
        }
        if (!cur)
            return NULL;
    }
    return cur;
}

static char *gen_ref(ctx *c, const char *ptr)
{
    for (int i = 0; i < c->nrefs; i++) {
        ref *r = &c->refs[i];
        if (strcmp(r->ptr, ptr))
            continue;
        if (!r->done && r->depth == c->depth)
            return fail(c, "$ref \"%s\" leads back to itself without consuming input", ptr);
        return chk(c, xstrdup(r->name));
    }
    const json_t *target = resolve(c->root, ptr);
    if (!target)
        return fail(c, "$ref \"%s\" cannot be resolved (only \"#\" and \"#/...\" pointers into this schema)", ptr);
    const char *base = strrchr(ptr, '/');
    base = base ? base + 1 : "root-ref";
    char *name = add_rule(c, base, NULL);
    if (!name)
        return NULL;
    if (c->nrefs == c->caprefs) {
        const int cap = c->caprefs ? c->caprefs * 2 : 8;
        ref *nr = cv_realloc(c->refs, (size_t)cap * sizeof *nr);
        if (!nr) {
            cv_free(name);
            return oom(c);
        }
        c->refs = nr;
        c->caprefs = cap;
    }
    char *pcopy = chk(c, xstrdup(ptr));
    char *ncopy = chk(c, xstrdup(name));
    if (!pcopy || !ncopy) {
        cv_free(pcopy);
        cv_free(ncopy);
        cv_free(name);
        return NULL;
    }
    const int idx = c->nrefs++;
    c->refs[idx] = (ref){pcopy, ncopy, 0, c->depth};
    /* compile the target with its own path */
    char saved[sizeof c->path];
    const size_t saved_len = c->plen;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ptr + 1);
    c->plen = strlen(c->path);
    char *body = gen(c, target);
    memcpy(c->path, saved, sizeof saved);
    c->plen = saved_len;
    c->refs[idx].done = 1;
    if (!body) {
        cv_free(name);
        return NULL;
    }
    if (!set_body(c, find_rule(c, name), body)) {
        cv_free(name);
        return NULL;
    }
    return name;
}

/* Is the JSON value v of the named type? */
static bool value_is(const json_t *v, const char *t)
{
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v));
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "object"))
        return json_is_object(v);
    if (!strcmp(t, "array"))
        return json_is_array(v);
    return false;
}

static const char *const type_names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};

static bool known_type(const char *t)
{
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (!strcmp(type_names[i], t))
            return true;
    return false;
}

/* Joins n expressions as alternatives (frees them). */
static char *alts(ctx *c, char **e, int n)
{
    sv_buf b = {0};
    int bad = 0;
    if (n == 1) {
        char *r = e[0];
        return r;
    }
    bad |= sv_buf_puts(&b, "(");
    for (int i = 0; i < n; i++) {
        bad |= sv_buf_puts(&b, i ? " | " : " ");
        bad |= sv_buf_puts(&b, e[i]);
        cv_free(e[i]);
    }
    bad |= sv_buf_puts(&b, " )");
    if (bad) {
        sv_buf_free(&b);
        return oom(c);
    }
    return b.p;
}

static char *gen_enum(ctx *c, const json_t *s)
{
    const char *other = other_key(s, (const char *const[]){"enum", "const", "type", NULL});
    if (other)
        return fail(c, "\"%s\" next to enum/const is not supported", other);
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && cn)
        return fail(c, "enum and const together are not supported");
    if (en && !json_is_array(en))
        return fail(c, "enum must be an array");
    const json_t *type = json_object_get(s, "type");
    if (type && !json_is_string(type) && !json_is_array(type))
        return fail(c, "type must be a string or an array of strings");
    const size_t n = en ? json_array_size(en) : 1;
    char **e = cv_calloc(n ? n : 1, sizeof *e);
    if (!e)
        return oom(c);
    int k = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = en ? json_array_get(en, i) : cn;
        bool ok = !type;
        if (json_is_string(type))
            ok = value_is(v, json_string_value(type));
        for (size_t t = 0; json_is_array(type) && t < json_array_size(type); t++)
            if (json_is_string(json_array_get(type, t)))
                ok |= value_is(v, json_string_value(json_array_get(type, t)));
        if (!ok)
            continue;
        sv_buf b = {0};
        if (json_text(&b, v) || !(e[k] = cv_gbnf_literal(b.p, b.n))) {
            sv_buf_free(&b);
            for (int j = 0; j < k; j++)
                cv_free(e[j]);
            cv_free(e);
            return oom(c);
        }
        sv_buf_free(&b);
        total += strlen(e[k++]) + 3;
        if (!within_budget(c, total)) {
            for (int j = 0; j < k; j++)
                cv_free(e[j]);
            cv_free(e);
            return NULL;
        }
    }
    if (!k) {
        cv_free(e);
        return fail(c, "enum/const admits no value of the schema's type");
    }
    char *r = alts(c, e, k);
    cv_free(e);
    return r;
}

/* Reads a non-negative integer keyword; -1 when absent; -2 after an error. */
static long long count_kw(ctx *c, const json_t *s, const char *kw)
{
    const json_t *v = json_object_get(s, kw);
    if (!v)
        return -1;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (d < 0 || floor(d) != d) {
        const size_t old = path_push(c, kw);
        fail(c, "%s must be a non-negative integer", kw);
        path_pop(c, old);
        return -2;
    }
    return d > 1e9 ? 1000000000LL : (long long)d;
}

static char *rep(const char *atom, long long lo, long long hi /* -1: unbounded */)
{
    if (hi == 0)
        return xstrdup("");
    if (lo == 0 && hi < 0)
        return xfmt("%s*", atom);
    if (lo == 1 && hi < 0)
        return xfmt("%s+", atom);
    if (lo == 0 && hi == 1)
        return xfmt("%s?", atom);
    if (lo == 1 && hi == 1)
        return xstrdup(atom);
    if (hi < 0)
        return xfmt("%s{%lld,}", atom, lo);
    if (lo == hi)
        return xfmt("%s{%lld}", atom, lo);
    return xfmt("%s{%lld,%lld}", atom, lo, hi);
}

/* Whether the grammar writes strings of this format (others are annotations). */
static bool known_format(const char *fmt)
{
    return fmt && (!strcmp(fmt, "date") || !strcmp(fmt, "time") || !strcmp(fmt, "date-time") || !strcmp(fmt, "uuid"));
}

/* A string that matches pattern (regex.h), at #/.../pattern. Lengths and formats beside it are refused: the
 * grammar cannot count a pattern's characters nor meet two regular languages at once. */
static char *gen_pattern(ctx *c, const json_t *pat, bool lengths, const char *fmt)
{
    const size_t old = path_push(c, "pattern");
    char *r = NULL;
    if (!json_is_string(pat)) {
        fail(c, "pattern must be a string");
    } else if (lengths) {
        fail(c, "minLength/maxLength next to pattern are not supported");
    } else if (known_format(fmt)) {
        fail(c, "format \"%s\" next to pattern is not supported", fmt);
    } else {
        char err[CV_ERRLEN];
        char *ch = use_prim(c, "char");
        char *body = ch ? cv_regex_gbnf(json_string_value(pat), json_string_length(pat), ch, err, sizeof err) : NULL;
        if (ch && !body)
            fail(c, "%s", err);
        r = body ? chk(c, xfmt("\"\\\"\" %s \"\\\"\"", body)) : NULL;
        cv_free(body);
        cv_free(ch);
    }
    path_pop(c, old);
    return r;
}

static char *gen_string(ctx *c, const json_t *s)
{
    const long long mn = count_kw(c, s, "minLength"), mx = count_kw(c, s, "maxLength");
    if (mn == -2 || mx == -2)
        return NULL;
    const json_t *f = json_object_get(s, "format");
    if (f && !json_is_string(f))
        return fail(c, "format must be a string");
    const char *fmt = f ? json_string_value(f) : NULL;
    const json_t *pat = json_object_get(s, "pattern");
    if (pat)
        return gen_pattern(c, pat, mn >= 0 || mx >= 0, fmt);
    if (known_format(fmt)) {
        if (mn >= 0 || mx >= 0)
            return fail(c, "minLength/maxLength with format \"%s\" are not supported", fmt);
        char *p = use_prim(c, fmt);
        if (!p)
            return NULL;
        char *r = chk(c, xfmt("\"\\\"\" %s \"\\\"\"", p));
        cv_free(p);
        return r;
    }
    if (mx >= 0 && mn > mx)
        return fail(c, "minLength %lld exceeds maxLength %lld", mn, mx);
    if (mn < 0 && mx < 0) /* unknown formats are annotations */
        return use_prim(c, "string");
    char *ch = use_prim(c, "char");
    if (!ch)
        return NULL;
    char *body = chk(c, rep(ch, mn < 0 ? 0 : mn, mx));
    cv_free(ch);
    if (!body)
        return NULL;
    char *r = chk(c, xfmt("\"\\\"\" %s \"\\\"\"", body));
    cv_free(body);
    return r;
}

/* Numeric bound keyword: 0 absent, 1 present (value in *v), -1 error. */
static int bound_kw(ctx *c, const json_t *s, const char *kw, double *v)
{
    const json_t *j = json_object_get(s, kw);
    if (!j)
        return 0;
    if (json_is_boolean(j)) /* draft-04 exclusiveMinimum/Maximum: modifies minimum/maximum */
        return 0;
    if (!json_is_number(j)) {
        const size_t old = path_push(c, kw);
        fail(c, "%s must be a number", kw);
        path_pop(c, old);
        return -1;
    }
    *v = json_number_value(j);
    return 1;
}

/* Integer-part bounds: [lo, hi] inclusive for integers; lo_strict / hi_strict say whether the bound
 * itself is excluded for numbers with fractions (exclusive bound at an integer). */
typedef struct bounds {
    bool has_lo, has_hi;
    long long lo, hi; /* for integers: the inclusive range */
    bool lo_excl_int, hi_excl_int;
} bounds;

static int read_bounds(ctx *c, const json_t *s, bounds *b, bool *any)
{
    double mn = 0, mx = 0, emn = 0, emx = 0;
    const int hmn = bound_kw(c, s, "minimum", &mn), hmx = bound_kw(c, s, "maximum", &mx);
    const int hemn = bound_kw(c, s, "exclusiveMinimum", &emn), hemx = bound_kw(c, s, "exclusiveMaximum", &emx);
    if (hmn < 0 || hmx < 0 || hemn < 0 || hemx < 0)
        return -1;
    const bool d4_emn = json_is_true(json_object_get(s, "exclusiveMinimum"));
    const bool d4_emx = json_is_true(json_object_get(s, "exclusiveMaximum"));
    *any = hmn || hmx || hemn || hemx;
    /* lowest allowed integer, as a double, and whether it is the (excluded) bound itself for reals */
    double lo = -INFINITY, hi = INFINITY;
    if (hmn) {
        if (d4_emn)
            lo = floor(mn) + 1;
        else
            lo = ceil(mn);
    }
    if (hemn && floor(emn) + 1 > lo)
        lo = floor(emn) + 1;
    if (hmx) {
        if (d4_emx)
            hi = ceil(mx) - 1;
        else
            hi = floor(mx);
    }
    if (hemx && ceil(emx) - 1 < hi)
        hi = ceil(emx) - 1;
    if (lo > (double)INT_INF)
        return fail(c, "minimum is beyond the %d-digit integers this grammar writes", MAX_INT_DIGITS), -1;
    if (hi < -(double)INT_INF)
        return fail(c, "maximum is beyond the %d-digit integers this grammar writes", MAX_INT_DIGITS), -1;
    b->has_lo = lo > -(double)INT_INF;
    b->has_hi = hi < (double)INT_INF;
    b->lo = b->has_lo ? (long long)lo : -INT_INF;
    b->hi = b->has_hi ? (long long)hi : INT_INF;
    if (b->lo > b->hi)
        return fail(c, "no integer lies between the minimum and the maximum"), -1;
    return 0;
}

static char *gen_integer(ctx *c, const json_t *s)
{
    bounds b;
    bool any;
    if (read_bounds(c, s, &b, &any))
        return NULL;
    if (!any || (!b.has_lo && !b.has_hi))
        return use_prim(c, "integer");
    return chk(c, int_range(b.lo, b.hi));
}

/* Numbers within bounds, without exponent: an integer part n with an optional fraction when the
 * whole [n, n+1) (or (-(n+1), -n]) lies inside, and the integral bounds themselves. */
static char *gen_number(ctx *c, const json_t *s)
{
    bounds b;
    bool any;
    if (read_bounds(c, s, &b, &any))
        return NULL;
    if (!any)
        return use_prim(c, "number");
    /* b.lo / b.hi are the extreme integers allowed. Positive side: integer parts in [max(lo,0), hi-1]
     * take a fraction; hi itself is written alone. Negative side: "-" n with n in [max(-hi,0)... ] */
    char *e[4];
    int k = 0;
    const char *frac = "( \".\" [0-9]{1,16} )?";
    const long long plo = b.lo > 0 ? b.lo : 0;
    const long long phi = b.has_hi ? b.hi - 1 : INT_INF;
    if (plo <= phi) {
        char *r = nonneg_range(plo, phi);
        e[k++] = r ? xfmt("%s %s", r, frac) : NULL;
        cv_free(r);
    }
    if (b.has_hi && b.hi >= plo) {
        e[k++] = nonneg_range(b.hi, b.hi);
    }
    /* negative values -(n + f): need -(n+1) >= lo (n <= -lo-1) and -n <= hi (n >= -hi), n >= 1 so
     * that "-0" never appears */
    const long long nlo = b.hi < 0 ? -b.hi : 1;
    const long long nhi = b.has_lo ? -b.lo - 1 : INT_INF;
    if (nlo <= nhi) {
        char *r = nonneg_range(nlo, nhi);
        e[k++] = r ? xfmt("\"-\" %s %s", r, frac) : NULL;
        cv_free(r);
    }
    if (b.has_lo && b.lo < 0) {
        char *r = nonneg_range(-b.lo, -b.lo);
        e[k++] = r ? xfmt("\"-\" %s", r) : NULL;
        cv_free(r);
    }
    for (int i = 0; i < k; i++)
        if (!e[i]) {
            for (int j = 0; j < k; j++)
                cv_free(e[j]);
            return oom(c);
        }
    if (!k)
        return fail(c, "no number lies between the minimum and the maximum");
    return alts(c, e, k);
}

/* Extra keys: strings written without escapes that differ from every listed name. One rule per
 * node of the names' trie (by UTF-8 character). */
typedef struct trie {
    char ch[5];
    bool end;
    struct trie *kid;
    int nkid;
} trie;

static void trie_free(trie *t)
{
    for (int i = 0; i < t->nkid; i++)
        trie_free(&t->kid[i]);
    cv_free(t->kid);
}

static int trie_add(trie *t, const char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i < n; i++) /* names needing escapes cannot be written by an extra key */
        if ((unsigned char)s[i] < 0x20 || s[i] == '"' || s[i] == '\\' || s[i] == 0x7F)
            return 0;
    for (size_t i = 0; i < n;) {
        size_t l = cv_utf8_len(s + i, n - i);
        if (!l)
            l = 1;
        int j = 0;
        while (j < t->nkid && (strlen(t->kid[j].ch) != l || memcmp(t->kid[j].ch, s + i, l)))
            j++;
        if (j == t->nkid) {
            trie *k = cv_realloc(t->kid, (size_t)(t->nkid + 1) * sizeof *k);
            if (!k)
                return -1;
            t->kid = k;
            t->kid[t->nkid] = (trie){{0}, false, NULL, 0};
            memcpy(t->kid[t->nkid].ch, s + i, l);
            t->nkid++;
        }
        t = &t->kid[j];
        i += l;
    }
    t->end = true;
    return 0;
}

static char *trie_rule(ctx *c, const trie *t)
{
    sv_buf b = {0};
    int bad = 0;
    char *kc = use_prim(c, "kchar");
    if (!kc)
        return NULL;
    bad |= sv_buf_puts(&b, "[^\"\\\\\\x7F\\x00-\\x1F");
    for (int i = 0; i < t->nkid && !bad; i++) {
        const unsigned char ch = (unsigned char)t->kid[i].ch[0];
        char tmp[8];
        if (ch < 0x80 && !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
            snprintf(tmp, sizeof tmp, "\\x%02X", ch);
        else
            snprintf(tmp, sizeof tmp, "%s", t->kid[i].ch);
        bad |= sv_buf_puts(&b, tmp);
    }
    bad |= sv_buf_puts(&b, "] ") || sv_buf_puts(&b, kc) || sv_buf_puts(&b, "* \"\\\"\"");
    cv_free(kc);
    if (!t->end)
        bad |= sv_buf_puts(&b, " | \"\\\"\"");
    for (int i = 0; i < t->nkid && !bad; i++) {
        char *sub = trie_rule(c, &t->kid[i]);
        char *lit = gbnf_lit(t->kid[i].ch);
        bad |= !sub || !lit || sv_buf_puts(&b, " | ") || sv_buf_puts(&b, lit) || sv_buf_puts(&b, " ") ||
               sv_buf_puts(&b, sub);
        cv_free(sub);
        cv_free(lit);
    }
    if (bad || c->failed) {
        sv_buf_free(&b);
        return c->failed ? NULL : oom(c);
    }
    return add_rule(c, "xkey", b.p);
}

typedef struct member {
    const char *name;
    const json_t *schema;
    bool required;
    char *kv; /* rule name */
} member;

/* The rule "name": value for one listed member. */
static char *member_kv(ctx *c, const member *mi)
{
    const size_t old = path_push(c, "properties");
    path_push(c, mi->name);
    c->depth++;
    char *v = gen(c, mi->schema);
    c->depth--;
    path_pop(c, old);
    if (!v)
        return NULL;
    char *js = json_string_text(mi->name);
    char *lit = js ? xfmt("%s:", js) : NULL;
    char *klit = lit ? gbnf_lit(lit) : NULL;
    char *ws = use_prim(c, "ws");
    char *body = klit && ws ? xfmt("%s %s %s", klit, ws, v) : NULL;
    cv_free(js);
    cv_free(lit);
    cv_free(klit);
    cv_free(ws);
    cv_free(v);
    if (!body)
        return c->failed ? NULL : oom(c);
    char base[64];
    snprintf(base, sizeof base, "%s-kv", mi->name);
    return add_rule(c, base, body);
}

/* The value expression of extra members (additionalProperties absent, true or a schema). */
static char *extra_value(ctx *c, const json_t *addl)
{
    char *v;
    c->depth++;
    if (!addl || json_is_true(addl)) {
        v = use_prim(c, "value");
    } else {
        const size_t old = path_push(c, "additionalProperties");
        v = gen(c, addl);
        path_pop(c, old);
    }
    c->depth--;
    return v;
}

/* The key expression of extra members: any string, or one that differs from every listed name. */
static char *extra_key(ctx *c, const member *m, int n)
{
    if (!n)
        return use_prim(c, "string");
    int bad = 0;
    trie t = {{0}, false, NULL, 0};
    for (int i = 0; i < n && !bad; i++)
        bad |= trie_add(&t, m[i].name);
    char *node = bad ? NULL : trie_rule(c, &t);
    trie_free(&t);
    char *key = node ? xfmt("\"\\\"\" %s", node) : NULL;
    cv_free(node);
    return key;
}

/* The rule key: value for extra members. */
static char *extra_kv(ctx *c, const member *m, int n, const json_t *addl)
{
    char *v = extra_value(c, addl);
    if (!v)
        return NULL;
    char *key = extra_key(c, m, n);
    char *ws = use_prim(c, "ws");
    char *body = key && ws ? xfmt("%s \":\" %s %s", key, ws, v) : NULL;
    cv_free(key);
    cv_free(ws);
    cv_free(v);
    if (!body)
        return c->failed ? NULL : oom(c);
    return add_rule(c, "extra-kv", body);
}

/* The braces around the members in order (required ones always, optional ones maybe) then extras
 * (extra: a rule name or NULL). */
static char *member_sequence(ctx *c, const member *m, int n, const char *extra)
{
    /* F(i): members from i on, none written yet; A(i): members from i on, each after a comma.
     * F(i) and A(i) both write A(i+1), F(i) also F(i+1): shared, so the text grows linearly with n
     * and parentheses do not nest n deep. */
    char *f = extra ? xfmt("( %s ( \",\" ws %s )* )?", extra, extra) : xstrdup("");
    char *a = share(c, "rest", extra ? xfmt("( \",\" ws %s )*", extra) : xstrdup(""));
    for (int i = n - 1; i >= 0 && f && a; i--) {
        char *nf = m[i].required ? xfmt("%s %s", m[i].kv, a)
                                 : xfmt("( %s %s | %s )", m[i].kv, a, f);
        char *na = m[i].required ? xfmt("\",\" ws %s %s", m[i].kv, a) : xfmt("( \",\" ws %s )? %s", m[i].kv, a);
        cv_free(f);
        cv_free(a);
        f = share(c, "members", budget(c, nf));
        a = share(c, "rest", budget(c, na));
    }
    char *r = f && a ? xfmt("\"{\" %s \"}\"", f) : NULL;
    cv_free(f);
    cv_free(a);
    return r;
}

/* Object of listed members (in order) then extras (extra: a value expression or NULL for none). */
static char *gen_object_members(ctx *c, member *m, int n, const json_t *addl)
{
    for (int i = 0; i < n && !c->failed; i++) {
        m[i].kv = member_kv(c, &m[i]);
        if (!m[i].kv)
            return NULL;
    }
    if (c->failed)
        return NULL;
    char *extra = NULL;
    if (!json_is_false(addl)) {
        extra = extra_kv(c, m, n, addl);
        if (!extra)
            return NULL;
    }
    char *r = member_sequence(c, m, n, extra);
    cv_free(extra);
    return r ? r : (c->failed ? NULL : oom(c));
}

static char *gen_object(ctx *c, const json_t *s)
{
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, "properties must be an object");
    if (req && !json_is_array(req))
        return fail(c, "required must be an array of strings");
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return fail(c, "additionalProperties must be a schema");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i)))
            return fail(c, "required must be an array of strings");
    const size_t cap = json_object_size(props) + json_array_size(req);
    member *m = cv_calloc(cap ? cap : 1, sizeof *m);
    if (!m)
        return oom(c);
    int n = 0;
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)props, k, v) {
        bool required = false;
        for (size_t i = 0; i < json_array_size(req); i++)
            required |= !strcmp(json_string_value(json_array_get(req, i)), k);
        if (json_is_false(v)) {
            if (required) {
                cv_free(m);
                return fail(c, "required property \"%s\" has the schema false", k);
            }
            continue;
        }
        m[n++] = (member){k, v, required, NULL};
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        bool seen = json_object_get(props, name) != NULL;
        for (int j = 0; j < n; j++)
            seen |= !strcmp(m[j].name, name);
        if (seen)
            continue;
        if (json_is_false(addl)) {
            cv_free(m);
            return fail(c, "required property \"%s\" is not allowed by additionalProperties false", name);
        }
        m[n++] = (member){name, addl ? addl : json_true(), true, NULL};
    }
    char *r = gen_object_members(c, m, n, addl);
    for (int i = 0; i < n; i++)
        cv_free(m[i].kv);
    cv_free(m);
    return r;
}

/* An array schema read: the prefix items (under prefix_kw, the first k of them used), the schema of
 * the items after them (under rest_kw; has_rest: whether any may follow) and the count bounds. */
typedef struct array_shape {
    const json_t *prefix, *rest;
    const char *prefix_kw, *rest_kw;
    long long mn, mx /* -1: unbounded */, k;
    bool has_rest;
} array_shape;

/* The prefix and rest keywords: prefixItems and items, or a draft-07 items array and additionalItems. */
static int array_items(ctx *c, const json_t *s, array_shape *a)
{
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    a->prefix = prefix;
    a->rest = items;
    a->prefix_kw = "prefixItems";
    a->rest_kw = "items";
    if (json_is_array(items)) {
        if (prefix) {
            fail(c, "prefixItems next to an items array is not supported");
            return -1;
        }
        a->prefix = items;
        a->prefix_kw = "items";
        a->rest = json_object_get(s, "additionalItems");
        a->rest_kw = "additionalItems";
    } else if (json_object_get(s, "additionalItems")) {
        /* additionalItems without an items array has no effect */
    }
    if (a->prefix && !json_is_array(a->prefix)) {
        fail(c, "prefixItems must be an array of schemas");
        return -1;
    }
    if (a->rest && !json_is_object(a->rest) && !json_is_boolean(a->rest)) {
        fail(c, "%s must be a schema", a->rest_kw);
        return -1;
    }
    const json_t *uniq = json_object_get(s, "uniqueItems");
    if (uniq && !json_is_false(uniq)) {
        fail(c, "uniqueItems true is not supported");
        return -1;
    }
    return 0;
}

/* minItems and maxItems, then how many prefix items are used and whether more may follow. */
static int array_bounds(ctx *c, const json_t *s, array_shape *a)
{
    const long long mn0 = count_kw(c, s, "minItems"), mx = count_kw(c, s, "maxItems");
    if (mn0 == -2 || mx == -2)
        return -1;
    const long long mn = mn0 < 0 ? 0 : mn0;
    if (mx >= 0 && mn > mx) {
        fail(c, "minItems %lld exceeds maxItems %lld", mn, mx);
        return -1;
    }
    long long k = (long long)json_array_size(a->prefix);
    if (mx >= 0 && mx < k)
        k = mx;
    /* a prefix item with the schema false ends the array there */
    for (long long i = 0; i < k; i++)
        if (json_is_false(json_array_get(a->prefix, (size_t)i))) {
            k = i;
            a->rest = json_false();
            break;
        }
    a->mn = mn;
    a->mx = mx;
    a->k = k;
    a->has_rest = !json_is_false(a->rest) && !(mx >= 0 && mx <= k);
    if (!a->has_rest && mn > k) {
        fail(c, "minItems %lld cannot be met: at most %lld items are allowed", mn, k);
        return -1;
    }
    return 0;
}

/* The expression of the items after the prefix (NULL when none may follow or on failure). */
static char *array_item_rule(ctx *c, const array_shape *a)
{
    if (!a->has_rest)
        return NULL;
    if (!a->rest || json_is_true(a->rest))
        return use_prim(c, "value");
    const size_t old = path_push(c, a->rest_kw);
    char *r = gen(c, a->rest);
    path_pop(c, old);
    return r;
}

/* The expressions of the k prefix items (NULL when out of memory; entries NULL after a failure). */
static char **array_prefix_rules(ctx *c, const array_shape *a)
{
    char **p = cv_calloc(a->k ? (size_t)a->k : 1, sizeof *p);
    for (long long i = 0; p && i < a->k && !c->failed; i++) {
        const size_t old = path_push_index(c, a->prefix_kw, (size_t)i);
        p[i] = gen(c, json_array_get(a->prefix, (size_t)i));
        path_pop(c, old);
    }
    return p;
}

/* Items without a prefix: r_expr repeated within the count bounds. */
static char *array_rest_only(const array_shape *a, const char *r_expr)
{
    if (!a->has_rest)
        return xstrdup("");
    const long long mn = a->mn, mx = a->mx;
    char *cur = NULL;
    char *sep = xfmt("( \",\" ws %s )", r_expr);
    char *more = sep ? rep(sep, mn > 0 ? mn - 1 : 0, mx < 0 ? -1 : mx - 1) : NULL;
    if (more)
        cur = mn > 0 ? xfmt("%s %s", r_expr, more) : xfmt("( %s %s )?", r_expr, more);
    cv_free(sep);
    cv_free(more);
    return cur;
}

/* The prefix items (those from minItems on optional, each only after the one before), then the rest. */
static char *array_prefixed(ctx *c, const array_shape *a, char **p, const char *r_expr)
{
    const long long mn = a->mn, mx = a->mx, k = a->k;
    char *cur;
    if (a->has_rest) {
        char *sep = xfmt("( \",\" ws %s )", r_expr);
        cur = sep ? rep(sep, mn > k ? mn - k : 0, mx < 0 ? -1 : mx - k) : NULL;
        cv_free(sep);
    } else {
        cur = xstrdup("");
    }
    for (long long j = k - 1; j >= 0 && cur; j--) {
        char *item = xfmt("%s%s %s", j ? "\",\" ws " : "", p[j], cur);
        cv_free(cur);
        cur = item && j >= mn ? xfmt("( %s )?", item) : item;
        if (item && j >= mn)
            cv_free(item);
        cur = share(c, "items", budget(c, cur)); /* each item's text once, parentheses not k deep */
    }
    return cur;
}

static char *gen_array(ctx *c, const json_t *s)
{
    array_shape a;
    if (array_items(c, s, &a) || array_bounds(c, s, &a))
        return NULL;
    c->depth++;
    char *r_expr = share(c, "item", array_item_rule(c, &a));
    char **p = array_prefix_rules(c, &a);
    c->depth--;
    char *cur = NULL;
    char *ws = use_prim(c, "ws");
    if (!p)
        oom(c);
    if (!c->failed && (!a.has_rest || r_expr)) {
        cur = a.k == 0 ? array_rest_only(&a, r_expr) : array_prefixed(c, &a, p, r_expr);
        if (!cur)
            oom(c);
    }
    for (long long i = 0; p && i < a.k; i++)
        cv_free(p[i]);
    cv_free(p);
    cv_free(r_expr);
    cv_free(ws);
    if (c->failed) {
        cv_free(cur);
        return NULL;
    }
    char *r = chk(c, xfmt("\"[\" %s \"]\"", cur));
    cv_free(cur);
    return r;
}

/* ---- allOf: object schemas merged ------------------------------------------------------------------ */

/* Adds sub (after $ref) into the merged parts: props (name -> schema, first wins if equal), req,
 * the closed sets (arrays of property-name objects of subschemas with additionalProperties false). */
static int merge_into(ctx *c, const json_t *sub, json_t *props, json_t *req, json_t *closed, int depth)
{
    if (depth > MAX_MERGE_DEPTH)
        return fail(c, "allOf / $ref nesting too deep (a cycle?)"), -1;
    if (json_is_true(sub))
        return 0;
    if (!json_is_object(sub))
        return fail(c, "allOf members must be object schemas"), -1;
    const json_t *r = json_object_get(sub, "$ref");
    if (r) {
        if (!json_is_string(r))
            return fail(c, "$ref must be a string"), -1;
        const char *other = other_key(sub, (const char *const[]){"$ref", NULL});
        if (other)
            return fail(c, "\"%s\" next to $ref is not supported", other), -1;
        const json_t *t = resolve(c->root, json_string_value(r));
        if (!t)
            return fail(c, "$ref \"%s\" cannot be resolved", json_string_value(r)), -1;
        return merge_into(c, t, props, req, closed, depth + 1);
    }
    const json_t *all = json_object_get(sub, "allOf");
    if (all) {
        if (!json_is_array(all))
            return fail(c, "allOf must be an array"), -1;
        for (size_t i = 0; i < json_array_size(all); i++)
            if (merge_into(c, json_array_get(all, i), props, req, closed, depth + 1))
                return -1;
    }
    const char *other = other_key(sub, (const char *const[]){"type", "properties", "required",
                                                             "additionalProperties", "allOf", NULL});
    if (other)
        return fail(c, "allOf is supported for object schemas only (\"%s\" found)", other), -1;
    const json_t *type = json_object_get(sub, "type");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "object")))
        return fail(c, "allOf is supported for object schemas only (type is not \"object\")"), -1;
    const json_t *p = json_object_get(sub, "properties"), *rq = json_object_get(sub, "required");
    const json_t *addl = json_object_get(sub, "additionalProperties");
    if (p && !json_is_object(p))
        return fail(c, "properties must be an object"), -1;
    if (rq && !json_is_array(rq))
        return fail(c, "required must be an array of strings"), -1;
    if (addl && !json_is_boolean(addl))
        return fail(c, "additionalProperties with a schema inside allOf is not supported"), -1;
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)p, k, v) {
        const json_t *have = json_object_get(props, k);
        if (have && !json_equal((json_t *)have, (json_t *)v) && !json_is_true(have) && !json_is_true(v))
            return fail(c, "allOf gives property \"%s\" two different schemas", k), -1;
        if (!have || json_is_true(have))
            json_object_set(props, k, (json_t *)v);
    }
    for (size_t i = 0; i < json_array_size(rq); i++) {
        const json_t *name = json_array_get(rq, i);
        if (!json_is_string(name))
            return fail(c, "required must be an array of strings"), -1;
        json_array_append(req, (json_t *)name);
    }
    if (json_is_false(addl)) {
        json_t *names = json_object();
        json_object_foreach ((json_t *)p, k, v) json_object_set_new(names, k, json_true());
        json_array_append_new(closed, names);
    }
    return 0;
}

static char *gen_allof(ctx *c, const json_t *s)
{
    json_t *props = json_object(), *req = json_array(), *closed = json_array();
    char *r = NULL;
    if (!props || !req || !closed) {
        oom(c);
        goto out;
    }
    if (merge_into(c, s, props, req, closed, 0))
        goto out;
    /* with any closed member, only names every closed member lists may appear */
    json_t *merged = json_object();
    json_t *mprops = json_object(), *mreq = json_array();
    const char *k;
    json_t *v;
    json_object_foreach (props, k, v) {
        bool ok = true;
        for (size_t i = 0; i < json_array_size(closed); i++)
            ok &= json_object_get(json_array_get(closed, i), k) != NULL;
        if (ok)
            json_object_set(mprops, k, v);
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        bool ok = true;
        for (size_t j = 0; j < json_array_size(closed); j++)
            ok &= json_object_get(json_array_get(closed, j), name) != NULL;
        if (!ok) {
            fail(c, "allOf requires property \"%s\" that additionalProperties false excludes", name);
            json_decref(merged);
            json_decref(mprops);
            json_decref(mreq);
            goto out;
        }
        json_array_append(mreq, json_array_get(req, i));
    }
    json_object_set_new(merged, "type", json_string("object"));
    json_object_set_new(merged, "properties", mprops);
    json_object_set_new(merged, "required", mreq);
    if (json_array_size(closed))
        json_object_set_new(merged, "additionalProperties", json_false());
    r = gen_object(c, merged);
    json_decref(merged);
out:
    json_decref(props);
    json_decref(req);
    json_decref(closed);
    return r;
}

/* ---- one schema ------------------------------------------------------------------------------------- */

static char *gen_type(ctx *c, const json_t *s, const char *t)
{
    if (!strcmp(t, "null"))
        return use_prim(c, "null");
    if (!strcmp(t, "boolean"))
        return use_prim(c, "boolean");
    if (!strcmp(t, "integer"))
        return gen_integer(c, s);
    if (!strcmp(t, "number"))
        return gen_number(c, s);
    if (!strcmp(t, "string"))
        return gen_string(c, s);
    if (!strcmp(t, "array"))
        return gen_array(c, s);
    return gen_object(c, s);
}

/* Refuses the first keyword that is neither an annotation nor handled (0: none). */
static int check_keywords(ctx *c, const json_t *s)
{
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)s, k, v) {
        if (is_annotation(k))
            continue;
        if (!is_handled(k)) {
            const size_t old = path_push(c, k);
            fail(c, "keyword \"%s\" is not supported", k);
            path_pop(c, old);
            return -1;
        }
    }
    return 0;
}

/* $ref alone. */
static char *gen_ref_kw(ctx *c, const json_t *s, const json_t *ref)
{
    if (!json_is_string(ref))
        return fail(c, "$ref must be a string");
    const char *other = other_key(s, (const char *const[]){"$ref", NULL});
    if (other)
        return fail(c, "\"%s\" next to $ref is not supported", other);
    return gen_ref(c, json_string_value(ref));
}

/* allOf: a single subschema alone is that subschema, else the object schemas merged. */
static char *gen_allof_kw(ctx *c, const json_t *s, const json_t *all)
{
    if (!json_is_array(all) || !json_array_size(all))
        return fail(c, "allOf must be a non-empty array");
    if (json_array_size(all) == 1 && !other_key(s, (const char *const[]){"allOf", NULL})) {
        const size_t old = path_push_index(c, "allOf", 0);
        char *r = gen(c, json_array_get(all, 0));
        path_pop(c, old);
        return r;
    }
    return gen_allof(c, s);
}

/* anyOf or oneOf (any, under any_kw) alone: the alternatives of the branches that are not false. */
static char *gen_anyof(ctx *c, const json_t *s, const json_t *any, const char *any_kw)
{
    if (!json_is_array(any) || !json_array_size(any))
        return fail(c, "%s must be a non-empty array", any_kw);
    const char *other = other_key(s, (const char *const[]){"anyOf", "oneOf", NULL});
    if (other)
        return fail(c, "\"%s\" next to %s is not supported", other, any_kw);
    const size_t n = json_array_size(any);
    char **e = cv_calloc(n, sizeof *e);
    if (!e)
        return oom(c);
    int k2 = 0;
    for (size_t i = 0; i < n; i++) {
        if (json_is_false(json_array_get(any, i)))
            continue;
        const size_t old = path_push_index(c, any_kw, i);
        e[k2] = gen(c, json_array_get(any, i));
        path_pop(c, old);
        if (!e[k2])
            break;
        k2++;
    }
    if (c->failed || !k2) {
        for (int i = 0; i < k2; i++)
            cv_free(e[i]);
        cv_free(e);
        return c->failed ? NULL : fail(c, "every branch of %s is false", any_kw);
    }
    char *r = alts(c, e, k2);
    cv_free(e);
    return r;
}

/* The names of the type keyword (a name or a list of at most 7), without duplicates: their count,
 * or -1 when it is not such a list. */
static int type_list(const json_t *type, const char **types)
{
    if (json_is_string(type)) {
        types[0] = json_string_value(type);
        return 1;
    }
    if (!json_is_array(type) || !json_array_size(type) || json_array_size(type) > 7)
        return -1;
    int nt = 0;
    for (size_t i = 0; i < json_array_size(type); i++) {
        const json_t *t = json_array_get(type, i);
        if (!json_is_string(t))
            return -1;
        bool dup = false;
        for (int j = 0; j < nt; j++)
            dup |= !strcmp(types[j], json_string_value(t));
        if (!dup)
            types[nt++] = json_string_value(t);
    }
    return nt;
}

/* The valid names of the type keyword, at #/.../type: their count, or -1 after a failure. */
static int checked_type_names(ctx *c, const json_t *type, const char **types)
{
    const int nt = type_list(type, types);
    if (nt < 0) {
        fail(c, "type must be a type name or a non-empty array of them");
        return -1;
    }
    for (int i = 0; i < nt; i++)
        if (!known_type(types[i])) {
            fail(c, "unknown type \"%s\"", types[i]);
            return -1;
        }
    return nt;
}

/* The types the type keyword lists ("number" covers "integer"): their count, or -1 after a failure. */
static int explicit_types(ctx *c, const json_t *type, const char **types)
{
    const size_t old = path_push(c, "type");
    int nt = checked_type_names(c, type, types);
    path_pop(c, old);
    if (nt < 0)
        return -1;
    bool has_number = false;
    for (int i = 0; i < nt; i++)
        has_number |= !strcmp(types[i], "number");
    if (has_number) {
        int w = 0;
        for (int i = 0; i < nt; i++)
            if (strcmp(types[i], "integer"))
                types[w++] = types[i];
        nt = w;
    }
    return nt;
}

/* The types that a schema without "type" implies by its keywords: their count (0: any value). */
static int implied_types(const json_t *s, const char **types)
{
    static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const arr[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                      "uniqueItems", NULL};
    static const char *const str[] = {"minLength", "maxLength", "format", "pattern", NULL};
    static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    static const char *const *const kws[] = {obj, arr, str, num};
    static const char *const names[] = {"object", "array", "string", "number"};
    int nt = 0;
    for (int g = 0; g < 4; g++)
        for (const char *const *p = kws[g]; *p; p++)
            if (json_object_get(s, *p)) {
                types[nt++] = names[g];
                break;
            }
    return nt;
}

/* The schema by its types, explicit or implied: the alternatives of one expression per type. */
static char *gen_types(ctx *c, const json_t *s)
{
    const char *types[8];
    const json_t *type = json_object_get(s, "type");
    const int nt = type ? explicit_types(c, type, types) : implied_types(s, types);
    if (nt < 0)
        return NULL;
    if (!nt)
        return use_prim(c, "value");
    char *e[8];
    for (int i = 0; i < nt; i++) {
        e[i] = gen_type(c, s, types[i]);
        if (!e[i]) {
            for (int j = 0; j < i; j++)
                cv_free(e[j]);
            return NULL;
        }
    }
    return alts(c, e, nt);
}

/* One schema, nested at most MAX_NESTING deep, its expression within the byte limit. */
static char *gen(ctx *c, const json_t *s)
{
    if (c->failed)
        return NULL;
    if (c->nesting == MAX_NESTING)
        return fail(c, "subschemas nest more than %d deep", MAX_NESTING);
    c->nesting++;
    char *r = budget(c, gen_schema(c, s));
    c->nesting--;
    return r;
}

/* One schema: boolean schemas, then by keyword family ($ref, allOf, anyOf/oneOf, enum/const, types). */
static char *gen_schema(ctx *c, const json_t *s)
{
    if (json_is_true(s))
        return use_prim(c, "value");
    if (json_is_false(s))
        return fail(c, "the schema false admits no value");
    if (!json_is_object(s))
        return fail(c, "a schema must be an object or a boolean");
    if (check_keywords(c, s))
        return NULL;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref)
        return gen_ref_kw(c, s, ref);
    const json_t *all = json_object_get(s, "allOf");
    if (all)
        return gen_allof_kw(c, s, all);
    const json_t *any = json_object_get(s, "anyOf");
    const char *any_kw = "anyOf";
    if (json_object_get(s, "oneOf")) {
        if (any)
            return fail(c, "anyOf and oneOf together are not supported");
        any = json_object_get(s, "oneOf");
        any_kw = "oneOf";
    }
    if (any)
        return gen_anyof(c, s, any, any_kw);
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return gen_enum(c, s);
    return gen_types(c, s);
}

static char *assemble(ctx *c)
{
    sv_buf b = {0};
    int bad = 0;
    for (int i = 0; i < c->nrules && !bad; i++) {
        bad |= sv_buf_puts(&b, c->rules[i].name) || sv_buf_puts(&b, " ::= ") ||
               sv_buf_puts(&b, c->rules[i].body ? c->rules[i].body : "") || sv_buf_puts(&b, "\n");
    }
    if (bad) {
        sv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

static void ctx_free(ctx *c)
{
    for (int i = 0; i < c->nrules; i++) {
        cv_free(c->rules[i].name);
        cv_free(c->rules[i].body);
    }
    cv_free(c->rules);
    for (int i = 0; i < c->nrefs; i++) {
        cv_free(c->refs[i].ptr);
        cv_free(c->refs[i].name);
    }
    cv_free(c->refs);
}

char *cv_schema_grammar(const json_t *schema, char *err, size_t errlen)
{
    ctx c = {0};
    c.root = schema;
    c.err = err;
    c.errlen = errlen;
    if (!schema) {
        cv_errf(err, errlen, "response_format schema: missing");
        return NULL;
    }
    char *root = add_rule(&c, "root", NULL);
    char *body = root ? gen(&c, schema) : NULL;
    char *out = NULL;
    if (body && set_body(&c, find_rule(&c, "root"), body)) {
        out = assemble(&c);
        if (!out)
            oom(&c);
    }
    cv_free(root);
    ctx_free(&c);
    return out;
}

char *cv_schema_any_object_grammar(void)
{
    ctx c = {0};
    char *root = add_rule(&c, "root", NULL);
    char *obj = root ? use_prim(&c, "object") : NULL;
    char *out = NULL;
    if (obj) {
        find_rule(&c, "root")->body = obj;
        out = assemble(&c);
    }
    cv_free(root);
    ctx_free(&c);
    return out;
}
