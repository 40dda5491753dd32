/* schema_scalar.c: the schema compiler's scalar values (see schema.c for
 * the compiler, schema_impl.h for what it shares): enum and const as
 * literal JSON texts, strings (lengths, formats, a pattern through
 * regex.h), and integers and numbers within bounds, whose ranges are
 * written digit by digit as exact alternatives. */
#include "serve/schema_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "serve/regex.h"

#define MAX_INT_DIGITS 16
#define INT_INF 9999999999999999LL /* the largest integer part: 16 digits */

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
static int json_text(cv_buf *b, const json_t *v)
{
    char tmp[64];
    switch (json_typeof(v)) {
    case JSON_NULL:
        return cv_buf_puts(b, "null");
    case JSON_TRUE:
        return cv_buf_puts(b, "true");
    case JSON_FALSE:
        return cv_buf_puts(b, "false");
    case JSON_INTEGER:
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return cv_buf_puts(b, tmp);
    case JSON_REAL:
        real_text(json_real_value(v), tmp, sizeof tmp);
        return cv_buf_puts(b, tmp);
    case JSON_STRING: {
        char *t = cv_schema_json_string_text(json_string_value(v));
        const int r = t ? cv_buf_puts(b, t) : -1;
        cv_free(t);
        return r;
    }
    case JSON_ARRAY: {
        if (cv_buf_puts(b, "["))
            return -1;
        for (size_t i = 0; i < json_array_size(v); i++)
            if ((i && cv_buf_puts(b, ",")) || json_text(b, json_array_get(v, i)))
                return -1;
        return cv_buf_puts(b, "]");
    }
    case JSON_OBJECT: {
        const char *k;
        const json_t *x;
        bool first = true;
        if (cv_buf_puts(b, "{"))
            return -1;
        json_object_foreach ((json_t *)v, k, x) {
            char *t = cv_schema_json_string_text(k);
            const int bad = !t || (!first && cv_buf_puts(b, ",")) || cv_buf_puts(b, t) || cv_buf_puts(b, ":") ||
                            json_text(b, x);
            cv_free(t);
            if (bad)
                return -1;
            first = false;
        }
        return cv_buf_puts(b, "}");
    }
    }
    return -1;
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

static int digits_rep(cv_buf *b, int r)
{
    char tmp[32];
    if (r <= 0)
        return 0;
    if (r == 1)
        return cv_buf_puts(b, " [0-9]");
    snprintf(tmp, sizeof tmp, " [0-9]{%d}", r);
    return cv_buf_puts(b, tmp);
}

/* Decimal strings of equal length n in [a, b] (a <= b, digit strings). */
static int same_len(cv_buf *b, const char *a, const char *z, int n)
{
    int i = 0;
    while (i < n && a[i] == z[i])
        i++;
    if (i > 0) {
        char *lit = cv_gbnf_literal(a, (size_t)i);
        const int bad = !lit || cv_buf_puts(b, " ") || cv_buf_puts(b, lit);
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
    if (cv_buf_puts(b, " ("))
        return -1;
    char tmp[32];
    if (!a_zero) {
        snprintf(tmp, sizeof tmp, " \"%c\"", a[i]);
        if (cv_buf_puts(b, tmp) || same_len(b, a + i + 1, nines, r))
            return -1;
        nalt++;
        lo++;
    }
    const char hi_mid = z_nine ? hi : (char)(hi - 1);
    if (lo <= hi_mid) {
        if (nalt && cv_buf_puts(b, " |"))
            return -1;
        if (lo == hi_mid)
            snprintf(tmp, sizeof tmp, " \"%c\"", lo);
        else
            snprintf(tmp, sizeof tmp, " [%c-%c]", lo, hi_mid);
        if (cv_buf_puts(b, tmp) || digits_rep(b, r))
            return -1;
        nalt++;
    }
    if (!z_nine) {
        if (nalt && cv_buf_puts(b, " |"))
            return -1;
        snprintf(tmp, sizeof tmp, " \"%c\"", z[i]);
        if (cv_buf_puts(b, tmp) || same_len(b, zeros, z + i + 1, r))
            return -1;
    }
    return cv_buf_puts(b, " )");
}

/* Canonical decimals (no leading zeros) in [a, b], 0 <= a <= b <= INT_INF, as one parenthesized
 * expression. */
static char *nonneg_range(long long a, long long z)
{
    cv_buf b = {0};
    int bad = cv_buf_puts(&b, "(");
    const int da = ndigits(a), dz = ndigits(z);
    bool first = true;
    for (int d = da; d <= dz && !bad; d++) {
        const long long lo = a > (d == 1 ? 0 : pow10ll(d - 1)) ? a : (d == 1 ? 0 : pow10ll(d - 1));
        const long long hi = z < pow10ll(d) - 1 ? z : pow10ll(d) - 1;
        if (!first)
            bad |= cv_buf_puts(&b, " |");
        first = false;
        if (d >= 2 && lo == pow10ll(d - 1) && z == pow10ll(dz) - 1 && dz > d) {
            char tmp[48];
            snprintf(tmp, sizeof tmp, " [1-9] [0-9]{%d,%d}", d - 1, dz - 1);
            bad |= cv_buf_puts(&b, tmp);
            break;
        }
        char sa[32], sz[32];
        snprintf(sa, sizeof sa, "%0*lld", d & 31, lo);
        snprintf(sz, sizeof sz, "%0*lld", d & 31, hi);
        bad |= same_len(&b, sa, sz, d);
    }
    bad |= cv_buf_puts(&b, " )");
    if (bad) {
        cv_buf_free(&b);
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
        r = cv_schema_xfmt("( \"-\" %s | %s )", neg, pos);
    else if (neg)
        r = cv_schema_xfmt("\"-\" %s", neg);
    else if (pos)
        r = cv_schema_xstrdup(pos);
    cv_free(pos);
    cv_free(neg);
    return r;
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

char *cv_schema_gen_enum(ctx *c, const json_t *s)
{
    const char *other = cv_schema_other_key(s, (const char *const[]){"enum", "const", "type", NULL});
    if (other)
        return cv_schema_fail(c, "\"%s\" next to enum/const is not supported", other);
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && cn)
        return cv_schema_fail(c, "enum and const together are not supported");
    if (en && !json_is_array(en))
        return cv_schema_fail(c, "enum must be an array");
    const json_t *type = json_object_get(s, "type");
    if (type && !json_is_string(type) && !json_is_array(type))
        return cv_schema_fail(c, "type must be a string or an array of strings");
    const size_t n = en ? json_array_size(en) : 1;
    char **e = cv_calloc(n ? n : 1, sizeof *e);
    if (!e)
        return cv_schema_oom(c);
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
        cv_buf b = {0};
        if (json_text(&b, v) || !(e[k] = cv_gbnf_literal(b.p, b.n))) {
            cv_buf_free(&b);
            for (int j = 0; j < k; j++)
                cv_free(e[j]);
            cv_free(e);
            return cv_schema_oom(c);
        }
        cv_buf_free(&b);
        total += strlen(e[k++]) + 3;
        if (!cv_schema_within_budget(c, total)) {
            for (int j = 0; j < k; j++)
                cv_free(e[j]);
            cv_free(e);
            return NULL;
        }
    }
    if (!k) {
        cv_free(e);
        return cv_schema_fail(c, "enum/const admits no value of the schema's type");
    }
    char *r = cv_schema_alts(c, e, k);
    cv_free(e);
    return r;
}

/* Reads a non-negative integer keyword; -1 when absent; -2 after an error. */
long long cv_schema_count_kw(ctx *c, const json_t *s, const char *kw)
{
    const json_t *v = json_object_get(s, kw);
    if (!v)
        return -1;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (d < 0 || floor(d) != d) {
        const size_t old = cv_schema_path_push(c, kw);
        cv_schema_fail(c, "%s must be a non-negative integer", kw);
        cv_schema_path_pop(c, old);
        return -2;
    }
    return d > 1e9 ? 1000000000LL : (long long)d;
}

char *cv_schema_rep(const char *atom, long long lo, long long hi /* -1: unbounded */)
{
    if (hi == 0)
        return cv_schema_xstrdup("");
    if (lo == 0 && hi < 0)
        return cv_schema_xfmt("%s*", atom);
    if (lo == 1 && hi < 0)
        return cv_schema_xfmt("%s+", atom);
    if (lo == 0 && hi == 1)
        return cv_schema_xfmt("%s?", atom);
    if (lo == 1 && hi == 1)
        return cv_schema_xstrdup(atom);
    if (hi < 0)
        return cv_schema_xfmt("%s{%lld,}", atom, lo);
    if (lo == hi)
        return cv_schema_xfmt("%s{%lld}", atom, lo);
    return cv_schema_xfmt("%s{%lld,%lld}", atom, lo, hi);
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
    const size_t old = cv_schema_path_push(c, "pattern");
    char *r = NULL;
    if (!json_is_string(pat)) {
        cv_schema_fail(c, "pattern must be a string");
    } else if (lengths) {
        cv_schema_fail(c, "minLength/maxLength next to pattern are not supported");
    } else if (known_format(fmt)) {
        cv_schema_fail(c, "format \"%s\" next to pattern is not supported", fmt);
    } else {
        char err[CV_ERRLEN];
        char *ch = cv_schema_use_prim(c, "char");
        char *body = ch ? cv_regex_gbnf(json_string_value(pat), json_string_length(pat), ch, err, sizeof err) : NULL;
        if (ch && !body)
            cv_schema_fail(c, "%s", err);
        r = body ? cv_schema_chk(c, cv_schema_xfmt("\"\\\"\" %s \"\\\"\"", body)) : NULL;
        cv_free(body);
        cv_free(ch);
    }
    cv_schema_path_pop(c, old);
    return r;
}

char *cv_schema_gen_string(ctx *c, const json_t *s)
{
    const long long mn = cv_schema_count_kw(c, s, "minLength"), mx = cv_schema_count_kw(c, s, "maxLength");
    if (mn == -2 || mx == -2)
        return NULL;
    const json_t *f = json_object_get(s, "format");
    if (f && !json_is_string(f))
        return cv_schema_fail(c, "format must be a string");
    const char *fmt = f ? json_string_value(f) : NULL;
    const json_t *pat = json_object_get(s, "pattern");
    if (pat)
        return gen_pattern(c, pat, mn >= 0 || mx >= 0, fmt);
    if (known_format(fmt)) {
        if (mn >= 0 || mx >= 0)
            return cv_schema_fail(c, "minLength/maxLength with format \"%s\" are not supported", fmt);
        char *p = cv_schema_use_prim(c, fmt);
        if (!p)
            return NULL;
        char *r = cv_schema_chk(c, cv_schema_xfmt("\"\\\"\" %s \"\\\"\"", p));
        cv_free(p);
        return r;
    }
    if (mx >= 0 && mn > mx)
        return cv_schema_fail(c, "minLength %lld exceeds maxLength %lld", mn, mx);
    if (mn < 0 && mx < 0) /* unknown formats are annotations */
        return cv_schema_use_prim(c, "string");
    char *ch = cv_schema_use_prim(c, "char");
    if (!ch)
        return NULL;
    char *body = cv_schema_chk(c, cv_schema_rep(ch, mn < 0 ? 0 : mn, mx));
    cv_free(ch);
    if (!body)
        return NULL;
    char *r = cv_schema_chk(c, cv_schema_xfmt("\"\\\"\" %s \"\\\"\"", body));
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
        const size_t old = cv_schema_path_push(c, kw);
        cv_schema_fail(c, "%s must be a number", kw);
        cv_schema_path_pop(c, old);
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
        return cv_schema_fail(c, "minimum is beyond the %d-digit integers this grammar writes", MAX_INT_DIGITS), -1;
    if (hi < -(double)INT_INF)
        return cv_schema_fail(c, "maximum is beyond the %d-digit integers this grammar writes", MAX_INT_DIGITS), -1;
    b->has_lo = lo > -(double)INT_INF;
    b->has_hi = hi < (double)INT_INF;
    b->lo = b->has_lo ? (long long)lo : -INT_INF;
    b->hi = b->has_hi ? (long long)hi : INT_INF;
    if (b->lo > b->hi)
        return cv_schema_fail(c, "no integer lies between the minimum and the maximum"), -1;
    return 0;
}

char *cv_schema_gen_integer(ctx *c, const json_t *s)
{
    bounds b;
    bool any;
    if (read_bounds(c, s, &b, &any))
        return NULL;
    if (!any || (!b.has_lo && !b.has_hi))
        return cv_schema_use_prim(c, "integer");
    return cv_schema_chk(c, int_range(b.lo, b.hi));
}

/* Numbers within bounds, without exponent: an integer part n with an optional fraction when the
 * whole [n, n+1) (or (-(n+1), -n]) lies inside, and the integral bounds themselves. */
char *cv_schema_gen_number(ctx *c, const json_t *s)
{
    bounds b;
    bool any;
    if (read_bounds(c, s, &b, &any))
        return NULL;
    if (!any)
        return cv_schema_use_prim(c, "number");
    /* b.lo / b.hi are the extreme integers allowed. Positive side: integer parts in [max(lo,0), hi-1]
     * take a fraction; hi itself is written alone. Negative side: "-" n with n in [max(-hi,0)... ] */
    char *e[4];
    int k = 0;
    const char *frac = "( \".\" [0-9]{1,16} )?";
    const long long plo = b.lo > 0 ? b.lo : 0;
    const long long phi = b.has_hi ? b.hi - 1 : INT_INF;
    if (plo <= phi) {
        char *r = nonneg_range(plo, phi);
        e[k++] = r ? cv_schema_xfmt("%s %s", r, frac) : NULL;
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
        e[k++] = r ? cv_schema_xfmt("\"-\" %s %s", r, frac) : NULL;
        cv_free(r);
    }
    if (b.has_lo && b.lo < 0) {
        char *r = nonneg_range(-b.lo, -b.lo);
        e[k++] = r ? cv_schema_xfmt("\"-\" %s", r) : NULL;
        cv_free(r);
    }
    for (int i = 0; i < k; i++)
        if (!e[i]) {
            for (int j = 0; j < k; j++)
                cv_free(e[j]);
            return cv_schema_oom(c);
        }
    if (!k)
        return cv_schema_fail(c, "no number lies between the minimum and the maximum");
    return cv_schema_alts(c, e, k);
}
