/* jinja_filters.c: the filters and tests of the Jinja engine (jinja.h lists
 * them), each as Jinja2 3.1 defines it (tojson as transformers does), in
 * two tables whose positions are the ids the parser stores. A filter gets
 * its operand and arguments (positional, then keyword by Jinja's parameter
 * names) and refuses arguments it does not take. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chat/jinja_impl.h"
#include "core/alloc.h"

/* ---- arguments ---- */

bool cv_ja_arg(jargs *a, int i, const char *name, jv *out)
{
    if (i >= 0 && i < a->n_pos) {
        *out = a->pos[i];
        return true;
    }
    size_t n = strlen(name);
    for (int k = 0; k < a->n_kw; k++)
        if (a->kw_name[k].n == n && memcmp(a->kw_name[k].p, name, n) == 0) {
            a->kw_used |= 1u << k;
            *out = a->kw[k];
            return true;
        }
    return false;
}

int cv_ja_done(jrender *r, jargs *a, int n_pos)
{
    if (a->n_pos > n_pos)
        return cv_jr_fail(r, a->line, "%s takes at most %d argument(s), %d given", a->what, n_pos, a->n_pos);
    for (int k = 0; k < a->n_kw; k++)
        if (!(a->kw_used & (1u << k)))
            return cv_jr_fail(r, a->line, "%s got an unexpected keyword argument '%.*s'", a->what,
                           (int)a->kw_name[k].n, a->kw_name[k].p);
    return 0;
}

int cv_ja_typed(jrender *r, jargs *a, int i, const char *name, int want, jv *out, bool *given)
{
    bool g = cv_ja_arg(a, i, name, out);
    if (given)
        *given = g;
    if (!g || out->t == want || (want == JV_INT && out->t == JV_BOOL) || (want == JV_FLOAT && out->t == JV_INT))
        return 0;
    static const char *const names[] = {[JV_BOOL] = "a boolean", [JV_INT] = "an integer", [JV_FLOAT] = "a number",
                                        [JV_STR] = "a string"};
    return cv_jr_fail(r, a->line, "%s: %s must be %s, not %s", a->what, name, names[want], cv_jv_type_name(*out));
}

static bool flag(jargs *a, int i, const char *name)
{
    jv v;
    return cv_ja_arg(a, i, name, &v) && cv_jv_truthy(v);
}

/* ---- text filters ---- */

static int f_string(jrender *r, jv v, jargs *a, jv *out)
{
    return cv_ja_done(r, a, 0) != 0 ? -1 : cv_jv_to_str(r, a->line, v, out);
}

static int case_filter(jrender *r, jv v, jargs *a, jv *out, int mode)
{
    jv s;
    if (cv_ja_done(r, a, 0) != 0 || cv_jv_to_str(r, a->line, v, &s) != 0)
        return -1;
    return cv_jm_case(r, a->line, s.u.s, mode, out);
}

static int f_upper(jrender *r, jv v, jargs *a, jv *out) { return case_filter(r, v, a, out, JCASE_UPPER); }
static int f_lower(jrender *r, jv v, jargs *a, jv *out) { return case_filter(r, v, a, out, JCASE_LOWER); }
static int f_title(jrender *r, jv v, jargs *a, jv *out) { return case_filter(r, v, a, out, JCASE_JTITLE); }
static int f_capitalize(jrender *r, jv v, jargs *a, jv *out) { return case_filter(r, v, a, out, JCASE_CAPITALIZE); }

static int f_trim(jrender *r, jv v, jargs *a, jv *out)
{
    jv s, chars;
    bool given = cv_ja_arg(a, 0, "chars", &chars);
    if (cv_ja_done(r, a, 1) != 0 || cv_jv_to_str(r, a->line, v, &s) != 0)
        return -1;
    return cv_jm_strip(r, a->line, s.u.s, given ? &chars : NULL, true, true, out);
}

static int f_replace(jrender *r, jv v, jargs *a, jv *out)
{
    jv s, old, rep, count = jv_int(-1);
    if (cv_ja_typed(r, a, 0, "old", JV_STR, &old, NULL) || cv_ja_typed(r, a, 1, "new", JV_STR, &rep, NULL) ||
        cv_ja_typed(r, a, 2, "count", JV_INT, &count, NULL) || cv_ja_done(r, a, 3) || cv_jv_to_str(r, a->line, v, &s))
        return -1;
    if (old.t != JV_STR || rep.t != JV_STR)
        return cv_jr_fail(r, a->line, "%s needs the old and the new text", a->what);
    return cv_jm_replace(r, a->line, s.u.s, old.u.s, rep.u.s, count.t == JV_BOOL ? count.u.b : count.u.i, out);
}

static int f_safe(jrender *r, jv v, jargs *a, jv *out) { return f_string(r, v, a, out); }

static int f_escape(jrender *r, jv v, jargs *a, jv *out)
{
    jv s;
    if (cv_ja_done(r, a, 0) != 0 || cv_jv_to_str(r, a->line, v, &s) != 0)
        return -1;
    jbuf b = {0};
    size_t from = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        static const char *const esc[] = {"&amp;", "&lt;", "&gt;", "&#34;", "&#39;"};
        const char *k = strchr("&<>\"'", s.u.s.p[i]);
        if (!k || !s.u.s.p[i])
            continue;
        if (cv_jb_put(r, &b, a->line, s.u.s.p + from, i - from) != 0 || jb_puts(r, &b, a->line, esc[k - "&<>\"'"]) != 0)
            goto fail;
        from = i + 1;
    }
    if (cv_jb_put(r, &b, a->line, s.u.s.p + from, s.u.s.n - from) == 0)
        return cv_jb_take(r, &b, a->line, out);
fail:
    cv_jb_free(&b);
    return -1;
}

static int f_center(jrender *r, jv v, jargs *a, jv *out)
{
    jv s, width = jv_int(80);
    if (cv_ja_typed(r, a, 0, "width", JV_INT, &width, NULL) || cv_ja_done(r, a, 1) || cv_jv_to_str(r, a->line, v, &s))
        return -1;
    int64_t w = width.t == JV_BOOL ? width.u.b : width.u.i, len = (int64_t)cv_jt_count(s.u.s);
    if (w <= len) {
        *out = s;
        return 0;
    }
    if ((uint64_t)w > r->lim.max_output)
        return cv_jr_fail(r, a->line, "%s: width %lld is too large", a->what, (long long)w);
    int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
    jbuf b = {0};
    int rc = 0;
    for (int64_t i = 0; i < marg && rc == 0; i++) {
        if (i == left)
            rc = cv_jb_put(r, &b, a->line, s.u.s.p, s.u.s.n);
        rc = rc ? rc : jb_puts(r, &b, a->line, " ");
    }
    if (rc == 0 && left == marg)
        rc = cv_jb_put(r, &b, a->line, s.u.s.p, s.u.s.n);
    return rc == 0 ? cv_jb_take(r, &b, a->line, out) : (cv_jb_free(&b), -1);
}

/* Python's str.splitlines() boundaries: the length of the break at p, or 0. */
static size_t line_break(const char *p, const char *end)
{
    size_t len;
    uint32_t cp = cv_jt_decode(p, (size_t)(end - p), &len);
    if (cp == '\r' && len == 1 && p + 1 < end && p[1] == '\n')
        return 2;
    bool brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 ||
               cp == 0x2028 || cp == 0x2029;
    return brk ? len : 0;
}

int cv_jm_splitlines(jrender *r, int line, jstr s, bool keepends, jlist **out)
{
    if (!(*out = cv_jl_new(r, line, 0)))
        return -1;
    size_t start = 0, i = 0;
    while (i < s.n) {
        size_t k = line_break(s.p + i, s.p + s.n);
        if (k == 0) {
            size_t len;
            cv_jt_decode(s.p + i, s.n - i, &len);
            i += len;
            continue;
        }
        if (cv_jl_push(r, line, *out, jv_str(s.p + start, (keepends ? i + k : i) - start)) != 0)
            return -1;
        i += k;
        start = i;
    }
    if (start < s.n && cv_jl_push(r, line, *out, jv_str(s.p + start, s.n - start)) != 0)
        return -1;
    return cv_jr_work(r, line, s.n / 64);
}

static int f_indent(jrender *r, jv v, jargs *a, jv *out)
{
    jv s, width = jv_int(4);
    bool first = flag(a, 1, "first"), blank = flag(a, 2, "blank");
    cv_ja_arg(a, 0, "width", &width);
    if (cv_ja_done(r, a, 3) != 0)
        return -1;
    if (v.t != JV_STR) /* Jinja adds "\n" to the value first */
        return cv_jr_fail(r, a->line, "unsupported operand type(s) for +=: '%s' and 'str'", cv_jv_type_name(v));
    s = v;
    jstr pad = width.t == JV_STR ? width.u.s : (jstr){NULL, 0};
    if (width.t != JV_STR && width.t != JV_INT && width.t != JV_BOOL)
        return cv_jr_fail(r, a->line, "%s: width must be an integer or a string", a->what);
    int64_t w = width.t == JV_STR ? 0 : width.t == JV_BOOL ? width.u.b : width.u.i;
    if (w < 0 || (uint64_t)w > 4096)
        return cv_jr_fail(r, a->line, "%s: width %lld is not supported", a->what, (long long)w);
    char spaces[4096];
    memset(spaces, ' ', (size_t)w);
    if (!pad.p)
        pad = (jstr){spaces, (size_t)w};
    jbuf text = {0};
    jlist *lines;
    if (cv_jb_put(r, &text, a->line, s.u.s.p, s.u.s.n) || jb_puts(r, &text, a->line, "\n") ||
        cv_jm_splitlines(r, a->line, (jstr){text.p, text.n}, false, &lines))
        return cv_jb_free(&text), -1;
    jbuf b = {0};
    int rc = first ? cv_jb_put(r, &b, a->line, pad.p, pad.n) : 0;
    for (size_t i = 0; i < lines->n && rc == 0; i++) {
        jstr ln = lines->v[i].u.s;
        if (i > 0)
            rc = jb_puts(r, &b, a->line, "\n");
        if (rc == 0 && i > 0 && (blank || ln.n > 0))
            rc = cv_jb_put(r, &b, a->line, pad.p, pad.n);
        rc = rc ? rc : cv_jb_put(r, &b, a->line, ln.p, ln.n);
    }
    rc = rc ? rc : cv_jb_take(r, &b, a->line, out);
    cv_jb_free(&text);
    if (rc != 0)
        cv_jb_free(&b);
    return rc;
}

static int f_format(jrender *r, jv v, jargs *a, jv *out)
{
    jv s;
    if (cv_jv_to_str(r, a->line, v, &s) != 0)
        return -1;
    if (a->n_kw > 0 && a->n_pos > 0)
        return cv_jr_fail(r, a->line, "%s takes positional or keyword arguments, not both", a->what);
    if (a->n_kw > 0) {
        jdict *d = cv_jd_new(r, a->line, (size_t)a->n_kw);
        if (!d)
            return -1;
        for (int k = 0; k < a->n_kw; k++)
            if (cv_jd_set(r, a->line, d, jv_str(a->kw_name[k].p, a->kw_name[k].n), a->kw[k]) != 0)
                return -1;
        return cv_jm_percent(r, a->line, s.u.s, jv_dict(d), out);
    }
    jlist *t = cv_jl_new(r, a->line, (size_t)a->n_pos);
    if (!t)
        return -1;
    t->tuple = true;
    for (int i = 0; i < a->n_pos; i++)
        t->v[t->n++] = a->pos[i];
    return cv_jm_percent(r, a->line, s.u.s, jv_list(t), out);
}

static int f_wordcount(jrender *r, jv v, jargs *a, jv *out)
{
    jv s;
    if (cv_ja_done(r, a, 0) != 0 || cv_jv_to_str(r, a->line, v, &s) != 0)
        return -1;
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0, len; i < s.u.s.n; i += len) {
        uint32_t cp = cv_jt_decode(s.u.s.p + i, s.u.s.n - i, &len);
        bool w = cp == '_' || cv_jt_is_alpha(cp) || cv_jt_is_digit(cp);
        words += w && !in_word;
        in_word = w;
    }
    *out = jv_int(words);
    return 0;
}

/* ---- numbers ---- */

static int f_abs(jrender *r, jv v, jargs *a, jv *out)
{
    if (cv_ja_done(r, a, 0) != 0)
        return -1;
    if (v.t == JV_FLOAT)
        *out = jv_float(fabs(v.u.f));
    else if (v.t == JV_INT && v.u.i == INT64_MIN)
        return cv_jr_fail(r, a->line, "integer overflow");
    else if (v.t == JV_INT || v.t == JV_BOOL)
        *out = jv_int(v.t == JV_BOOL ? v.u.b : v.u.i < 0 ? -v.u.i : v.u.i);
    else
        return cv_jr_fail(r, a->line, "bad operand type for abs(): '%s'", cv_jv_type_name(v));
    return 0;
}

/* int(f) of a finite float in range, else def. */
static jv int_of_float(double f, jv def) { return isfinite(f) && fabs(f) < 9.2e18 ? jv_int((int64_t)f) : def; }

static int f_int(jrender *r, jv v, jargs *a, jv *out)
{
    jv def = jv_int(0), base = jv_int(10);
    cv_ja_arg(a, 0, "default", &def);
    if (cv_ja_typed(r, a, 1, "base", JV_INT, &base, NULL) != 0 || cv_ja_done(r, a, 2) != 0)
        return -1;
    int64_t i;
    double f;
    *out = def;
    if (v.t == JV_UNDEF)
        return cv_je_undefined(r, a->line, v);
    if (v.t == JV_INT || v.t == JV_BOOL)
        *out = jv_int(v.t == JV_BOOL ? v.u.b : v.u.i);
    else if (v.t == JV_FLOAT)
        *out = int_of_float(v.u.f, def);
    else if (v.t == JV_STR && cv_jt_parse_int(v.u.s, (int)base.u.i, &i))
        *out = jv_int(i);
    else if (v.t == JV_STR && cv_jt_parse_float(v.u.s, &f))
        *out = int_of_float(f, def);
    return 0;
}

static int f_float(jrender *r, jv v, jargs *a, jv *out)
{
    jv def = jv_float(0.0);
    cv_ja_arg(a, 0, "default", &def);
    if (cv_ja_done(r, a, 1) != 0)
        return -1;
    double f;
    *out = def;
    if (v.t == JV_UNDEF)
        return cv_je_undefined(r, a->line, v);
    if (jv_is_num(v))
        *out = jv_float(v.t == JV_FLOAT ? v.u.f : (double)(v.t == JV_BOOL ? v.u.b : v.u.i));
    else if (v.t == JV_STR && cv_jt_parse_float(v.u.s, &f))
        *out = jv_float(f);
    return 0;
}

static bool is_word(jstr s, const char *w) { return s.n == strlen(w) && memcmp(s.p, w, s.n) == 0; }

static int f_round(jrender *r, jv v, jargs *a, jv *out)
{
    jv prec = jv_int(0), method = jv_str("common", 6);
    if (cv_ja_typed(r, a, 0, "precision", JV_INT, &prec, NULL) ||
        cv_ja_typed(r, a, 1, "method", JV_STR, &method, NULL) || cv_ja_done(r, a, 2))
        return -1;
    bool common = is_word(method.u.s, "common"), ceiling = is_word(method.u.s, "ceil");
    if (!common && !ceiling && !is_word(method.u.s, "floor"))
        return cv_jr_fail(r, a->line, "%s: method must be common, ceil or floor", a->what);
    if (!jv_is_num(v))
        return cv_jr_fail(r, a->line, "type %s doesn't define __round__ method", cv_jv_type_name(v));
    int64_t p = prec.t == JV_BOOL ? prec.u.b : prec.u.i;
    if (common && v.t != JV_FLOAT && p >= 0) { /* round(int, n) is the int */
        *out = jv_int(v.t == JV_BOOL ? v.u.b : v.u.i);
        return 0;
    }
    double x = v.t == JV_FLOAT ? v.u.f : (double)(v.t == JV_BOOL ? v.u.b : v.u.i);
    double scale = pow(10.0, (double)(p > 300 ? 300 : p < -300 ? -300 : p));
    if (!isfinite(x)) {
        *out = jv_float(x);
    } else if (!common) {
        *out = jv_float((ceiling ? ceil(x * scale) : floor(x * scale)) / scale);
    } else if (p >= 0) { /* Python rounds the exact binary value half to even, as printf does */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)(p > 300 ? 300 : p), x);
        *out = jv_float(strtod(buf, NULL));
    } else {
        double q = nearbyint(x * scale) / scale;
        *out = v.t == JV_FLOAT ? jv_float(q) : jv_int((int64_t)q);
    }
    return 0;
}

/* ---- sequences ---- */

static int f_length(jrender *r, jv v, jargs *a, jv *out)
{
    if (cv_ja_done(r, a, 0) != 0)
        return -1;
    switch (v.t) {
    case JV_UNDEF: *out = jv_int(0); return 0;
    case JV_STR: *out = jv_int((int64_t)cv_jt_count(v.u.s)); return 0;
    case JV_LIST: *out = jv_int((int64_t)v.u.l->n); return 0;
    case JV_DICT: *out = jv_int((int64_t)v.u.d->n); return 0;
    case JV_LOOP: *out = jv_int((int64_t)v.u.lp->items->n); return 0;
    default: return cv_jr_fail(r, a->line, "object of type '%s' has no len()", cv_jv_type_name(v));
    }
}

static int f_list(jrender *r, jv v, jargs *a, jv *out)
{
    jlist *l;
    if (cv_ja_done(r, a, 0) != 0 || cv_je_iterate(r, a->line, v, &l) != 0)
        return -1;
    *out = jv_list(l);
    return 0;
}

static int f_first_last(jrender *r, jv v, jargs *a, jv *out, bool last)
{
    jlist *l;
    if (cv_ja_done(r, a, 0) != 0 || cv_je_iterate(r, a->line, v, &l) != 0)
        return -1;
    *out = l->n ? l->v[last ? l->n - 1 : 0] : jv_undef();
    return 0;
}

static int f_first(jrender *r, jv v, jargs *a, jv *out) { return f_first_last(r, v, a, out, false); }
static int f_last(jrender *r, jv v, jargs *a, jv *out) { return f_first_last(r, v, a, out, true); }

static int f_reverse(jrender *r, jv v, jargs *a, jv *out)
{
    jlist *l;
    if (cv_ja_done(r, a, 0) != 0 || cv_je_iterate(r, a->line, v, &l) != 0)
        return -1;
    for (size_t i = 0; i < l->n / 2; i++) {
        jv t = l->v[i];
        l->v[i] = l->v[l->n - 1 - i];
        l->v[l->n - 1 - i] = t;
    }
    if (v.t != JV_STR) {
        *out = jv_list(l);
        return 0;
    }
    jbuf b = {0};
    for (size_t i = 0; i < l->n; i++)
        if (cv_jb_put(r, &b, a->line, l->v[i].u.s.p, l->v[i].u.s.n) != 0)
            return cv_jb_free(&b), -1;
    return cv_jb_take(r, &b, a->line, out);
}

static int f_default(jrender *r, jv v, jargs *a, jv *out)
{
    jv def = jv_str("", 0);
    cv_ja_arg(a, 0, "default_value", &def);
    bool boolean = flag(a, 1, "boolean");
    if (cv_ja_done(r, a, 2) != 0)
        return -1;
    *out = v.t == JV_UNDEF || (boolean && !cv_jv_truthy(v)) ? def : v;
    return 0;
}

static int f_join(jrender *r, jv v, jargs *a, jv *out)
{
    jv sep = jv_str("", 0), attr;
    jlist *l;
    bool by_attr;
    if (cv_ja_typed(r, a, 0, "d", JV_STR, &sep, NULL) || cv_ja_typed(r, a, 1, "attribute", JV_STR, &attr, &by_attr) ||
        cv_ja_done(r, a, 2) || cv_je_iterate(r, a->line, v, &l))
        return -1;
    jbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        jv x = l->v[i];
        if ((i && cv_jb_put(r, &b, a->line, sep.u.s.p, sep.u.s.n)) ||
            (by_attr && cv_je_getpath(r, a->line, x, attr.u.s, &x)) || cv_jv_write_str(r, &b, a->line, x))
            return cv_jb_free(&b), -1;
    }
    return cv_jb_take(r, &b, a->line, out);
}

static int f_batch(jrender *r, jv v, jargs *a, jv *out)
{
    jv count, fill;
    jlist *l, *res;
    bool filled = cv_ja_arg(a, 1, "fill_with", &fill), given;
    if (cv_ja_typed(r, a, 0, "linecount", JV_INT, &count, &given) || cv_ja_done(r, a, 2) ||
        cv_je_iterate(r, a->line, v, &l))
        return -1;
    int64_t k = !given ? 0 : count.t == JV_BOOL ? count.u.b : count.u.i;
    if (k <= 0)
        return cv_jr_fail(r, a->line, "%s needs a positive line count", a->what);
    if (!(res = cv_jl_new(r, a->line, 0)))
        return -1;
    for (size_t i = 0; i < l->n; i += (size_t)k) {
        jlist *row = cv_jl_new(r, a->line, 0);
        if (!row || cv_jl_push(r, a->line, res, jv_list(row)) != 0)
            return -1;
        for (size_t j = i; j < i + (size_t)k && (j < l->n || filled); j++)
            if (cv_jl_push(r, a->line, row, j < l->n ? l->v[j] : fill) != 0)
                return -1;
    }
    *out = jv_list(res);
    return 0;
}

static int f_items(jrender *r, jv v, jargs *a, jv *out)
{
    if (cv_ja_done(r, a, 0) != 0)
        return -1;
    if (v.t == JV_UNDEF) {
        jlist *l = cv_jl_new(r, a->line, 0);
        *out = jv_list(l);
        return l ? 0 : -1;
    }
    if (v.t != JV_DICT)
        return cv_jr_fail(r, a->line, "Can only get item pairs from a mapping.");
    jv self = v;
    jfunc fn = {JM_D_ITEMS, self};
    jargs none = {.what = "items()", .line = a->line};
    return cv_jm_call(r, a->line, &fn, &none, out);
}

/* A stable merge sort by key values (ties keep their order). */
static int sort_by(jrender *r, int line, jv *items, jv *keys, size_t n, bool fold, bool reverse, jv *tmp, jv *tmpk)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    if (sort_by(r, line, items, keys, h, fold, reverse, tmp, tmpk) != 0 ||
        sort_by(r, line, items + h, keys + h, n - h, fold, reverse, tmp, tmpk) != 0)
        return -1;
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        int c = 0;
        if (i < h && j < n && cv_jv_cmp(r, line, keys[j], keys[i], fold, &c) != 0)
            return -1;
        bool take_right = j < n && (i >= h || (reverse ? c > 0 : c < 0));
        tmp[o] = take_right ? items[j] : items[i];
        tmpk[o++] = take_right ? keys[j++] : keys[i++];
    }
    memcpy(items, tmp, n * sizeof *items);
    memcpy(keys, tmpk, n * sizeof *keys);
    return cv_jr_work(r, line, n);
}

/* Sorts l (in place) by its items or an attribute of them. */
static int sort_list(jrender *r, int line, jlist *l, const jv *attr, bool fold, bool reverse)
{
    jv *keys = cv_jr_alloc(r, line, (l->n + 1) * sizeof *keys), *tmp = cv_jr_alloc(r, line, (l->n + 1) * sizeof *tmp);
    jv *tmpk = tmp ? cv_jr_alloc(r, line, (l->n + 1) * sizeof *tmpk) : NULL;
    if (!keys || !tmpk)
        return -1;
    for (size_t i = 0; i < l->n; i++) {
        keys[i] = l->v[i];
        if (attr && cv_je_getpath(r, line, l->v[i], attr->u.s, &keys[i]) != 0)
            return -1;
    }
    return sort_by(r, line, l->v, keys, l->n, fold, reverse, tmp, tmpk);
}

static int f_sort(jrender *r, jv v, jargs *a, jv *out)
{
    jv attr;
    bool by_attr, reverse = flag(a, 0, "reverse"), cs = flag(a, 1, "case_sensitive");
    jlist *l;
    if (cv_ja_typed(r, a, 2, "attribute", JV_STR, &attr, &by_attr) || cv_ja_done(r, a, 3) ||
        cv_je_iterate(r, a->line, v, &l) || sort_list(r, a->line, l, by_attr ? &attr : NULL, !cs, reverse))
        return -1;
    *out = jv_list(l);
    return 0;
}

static int f_dictsort(jrender *r, jv v, jargs *a, jv *out)
{
    jv by = jv_str("key", 3), items;
    bool cs = flag(a, 0, "case_sensitive"), reverse = flag(a, 2, "reverse");
    if (cv_ja_typed(r, a, 1, "by", JV_STR, &by, NULL) || cv_ja_done(r, a, 3))
        return -1;
    bool by_value = by.u.s.n == 5 && memcmp(by.u.s.p, "value", 5) == 0;
    if (!by_value && !(by.u.s.n == 3 && memcmp(by.u.s.p, "key", 3) == 0))
        return cv_jr_fail(r, a->line, "You can only sort by either \"key\" or \"value\"");
    jargs none = {.what = a->what, .line = a->line};
    if (v.t == JV_UNDEF)
        return cv_je_undefined(r, a->line, v);
    if (f_items(r, v, &none, &items) != 0)
        return -1;
    jv path = jv_str(by_value ? "1" : "0", 1);
    if (sort_list(r, a->line, items.u.l, &path, !cs, reverse) != 0)
        return -1;
    *out = items;
    return 0;
}

static int f_unique(jrender *r, jv v, jargs *a, jv *out)
{
    jv attr;
    bool by_attr, cs = flag(a, 0, "case_sensitive");
    jlist *l, *res;
    if (cv_ja_typed(r, a, 1, "attribute", JV_STR, &attr, &by_attr) || cv_ja_done(r, a, 2) ||
        cv_je_iterate(r, a->line, v, &l) || !(res = cv_jl_new(r, a->line, l->n)))
        return -1;
    jv *seen = cv_jr_alloc(r, a->line, (l->n + 1) * sizeof *seen);
    if (!seen)
        return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        if ((by_attr && cv_je_getpath(r, a->line, k, attr.u.s, &k) != 0) || cv_jr_work(r, a->line, res->n) != 0)
            return -1;
        if (!cs && k.t == JV_STR && cv_jm_case(r, a->line, k.u.s, JCASE_LOWER, &k) != 0)
            return -1;
        bool dup = false;
        for (size_t j = 0; j < res->n && !dup && !r->failed; j++)
            dup = cv_jv_equal(r, a->line, seen[j], k);
        if (r->failed)
            return -1;
        if (!dup)
            seen[res->n] = k, res->v[res->n++] = l->v[i];
    }
    *out = jv_list(res);
    return 0;
}

static int f_minmax(jrender *r, jv v, jargs *a, jv *out, bool max)
{
    jv attr;
    bool by_attr, cs = flag(a, 0, "case_sensitive");
    jlist *l;
    if (cv_ja_typed(r, a, 1, "attribute", JV_STR, &attr, &by_attr) || cv_ja_done(r, a, 2) ||
        cv_je_iterate(r, a->line, v, &l))
        return -1;
    *out = jv_undef();
    jv best_key = jv_undef();
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        int c = 0;
        if (by_attr && cv_je_getpath(r, a->line, k, attr.u.s, &k) != 0)
            return -1;
        if (i > 0 && cv_jv_cmp(r, a->line, k, best_key, !cs, &c) != 0)
            return -1;
        if (i == 0 || (max ? c > 0 : c < 0))
            *out = l->v[i], best_key = k;
    }
    return 0;
}

static int f_max(jrender *r, jv v, jargs *a, jv *out) { return f_minmax(r, v, a, out, true); }
static int f_min(jrender *r, jv v, jargs *a, jv *out) { return f_minmax(r, v, a, out, false); }

static int f_sum(jrender *r, jv v, jargs *a, jv *out)
{
    jv attr, acc = jv_int(0);
    bool by_attr;
    jlist *l;
    cv_ja_arg(a, 1, "start", &acc);
    if (cv_ja_typed(r, a, 0, "attribute", JV_STR, &attr, &by_attr) || cv_ja_done(r, a, 2) ||
        cv_je_iterate(r, a->line, v, &l))
        return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv x = l->v[i];
        if (by_attr && cv_je_getpath(r, a->line, x, attr.u.s, &x) != 0)
            return -1;
        if (!jv_is_num(x) || !jv_is_num(acc))
            return cv_jr_fail(r, a->line, "unsupported operand type(s) for +: '%s' and '%s'", cv_jv_type_name(acc),
                           cv_jv_type_name(x));
        int64_t s;
        if (acc.t != JV_FLOAT && x.t != JV_FLOAT &&
            !__builtin_add_overflow(acc.t == JV_BOOL ? acc.u.b : acc.u.i, x.t == JV_BOOL ? x.u.b : x.u.i, &s))
            acc = jv_int(s);
        else if (acc.t != JV_FLOAT && x.t != JV_FLOAT)
            return cv_jr_fail(r, a->line, "integer overflow");
        else
            acc = jv_float((acc.t == JV_FLOAT ? acc.u.f : (double)(acc.t == JV_BOOL ? acc.u.b : acc.u.i)) +
                           (x.t == JV_FLOAT ? x.u.f : (double)(x.t == JV_BOOL ? x.u.b : x.u.i)));
    }
    *out = acc;
    return 0;
}

/* ---- map, select, reject and their attribute forms ---- */

static int f_map(jrender *r, jv v, jargs *a, jv *out)
{
    jv attr, def;
    jlist *l, *res;
    bool by_attr = cv_ja_arg(a, -1, "attribute", &attr), has_def = by_attr && cv_ja_arg(a, -1, "default", &def);
    if (!cv_jv_truthy(v)) /* Jinja maps nothing over a false value (none, "", []) */
        v = jv_undef();
    if (cv_je_iterate(r, a->line, v, &l) != 0 || !(res = cv_jl_new(r, a->line, l->n)))
        return -1;
    if (by_attr) {
        if (attr.t != JV_STR || cv_ja_done(r, a, 0) != 0)
            return attr.t != JV_STR ? cv_jr_fail(r, a->line, "%s: attribute must be a string", a->what) : -1;
        for (size_t i = 0; i < l->n; i++) {
            jv x;
            if (cv_je_getpath(r, a->line, l->v[i], attr.u.s, &x) != 0)
                return -1;
            res->v[res->n++] = x.t == JV_UNDEF && has_def ? def : x;
        }
    } else {
        int id = a->n_pos > 0 && a->pos[0].t == JV_STR ? cv_jf_filter_id(a->pos[0].u.s) : -1;
        if (id < 0)
            return cv_jr_fail(r, a->line, "%s needs a filter name or attribute=", a->what);
        for (size_t i = 0; i < l->n; i++) {
            jargs sub = *a;
            sub.pos++, sub.n_pos--, sub.kw_used = 0;
            if (cv_jf_filter(r, id, l->v[i], &sub, &res->v[res->n++]) != 0)
                return -1;
        }
    }
    *out = jv_list(res);
    return 0;
}

/* select, reject, selectattr, rejectattr: keep the items whose test (or
 * truth) is want; with attr, the test looks at that attribute. */
static int filter_items(jrender *r, jv v, jargs *a, jv *out, bool want, bool attr)
{
    jlist *l, *res;
    int first = attr ? 1 : 0;
    if (attr && (a->n_pos < 1 || a->pos[0].t != JV_STR))
        return cv_jr_fail(r, a->line, "%s needs an attribute name", a->what);
    int id = -1;
    if (a->n_pos > first && (a->pos[first].t != JV_STR || (id = cv_jf_test_id(a->pos[first].u.s)) < 0))
        return cv_jr_fail(r, a->line, "%s: no test named '%.*s'", a->what,
                       a->pos[first].t == JV_STR ? (int)a->pos[first].u.s.n : 1,
                       a->pos[first].t == JV_STR ? a->pos[first].u.s.p : "?");
    if (!cv_jv_truthy(v)) /* Jinja selects nothing from a false value (none, "", []) */
        v = jv_undef();
    if (cv_je_iterate(r, a->line, v, &l) != 0 || !(res = cv_jl_new(r, a->line, l->n)))
        return -1;
    for (size_t i = 0; i < l->n; i++) {
        jv x = l->v[i];
        bool ok;
        if (attr && cv_je_getpath(r, a->line, x, a->pos[0].u.s, &x) != 0)
            return -1;
        jargs sub = *a; /* the test's own arguments follow its name */
        sub.kw_used = 0;
        if (id >= 0) {
            sub.pos += first + 1;
            sub.n_pos -= first + 1;
        }
        if (id < 0)
            ok = cv_jv_truthy(x);
        else if (cv_jf_test(r, id, x, &sub, &ok) != 0)
            return -1;
        if (ok == want)
            res->v[res->n++] = l->v[i];
    }
    *out = jv_list(res);
    return 0;
}

static int f_select(jrender *r, jv v, jargs *a, jv *out) { return filter_items(r, v, a, out, true, false); }
static int f_reject(jrender *r, jv v, jargs *a, jv *out) { return filter_items(r, v, a, out, false, false); }
static int f_selectattr(jrender *r, jv v, jargs *a, jv *out) { return filter_items(r, v, a, out, true, true); }
static int f_rejectattr(jrender *r, jv v, jargs *a, jv *out) { return filter_items(r, v, a, out, false, true); }

static int f_attr(jrender *r, jv v, jargs *a, jv *out)
{
    jv name;
    if (cv_ja_typed(r, a, 0, "name", JV_STR, &name, NULL) != 0 || cv_ja_done(r, a, 1) != 0)
        return -1;
    if (name.t != JV_STR)
        return cv_jr_fail(r, a->line, "%s needs a name", a->what);
    if (v.t == JV_NS || v.t == JV_LOOP || v.t == JV_UNDEF)
        return cv_je_getattr(r, a->line, v, name.u.s, out);
    if (cv_jm_method(r, a->line, v, name.u.s, out))
        return r->failed ? -1 : 0;
    *out = (jv){JV_UNDEF, (uint8_t)v.t, {.s = name.u.s}};
    return 0;
}

/* ---- JSON ---- */

static int f_tojson(jrender *r, jv v, jargs *a, jv *out)
{
    jv ascii = jv_bool(false), indent = jv_none(), seps = jv_none(), sort = jv_bool(false);
    cv_ja_arg(a, 0, "ensure_ascii", &ascii);
    cv_ja_arg(a, 1, "indent", &indent);
    cv_ja_arg(a, 2, "separators", &seps);
    cv_ja_arg(a, 3, "sort_keys", &sort);
    if (cv_ja_done(r, a, 4) != 0)
        return -1;
    if (indent.t != JV_NONE && indent.t != JV_INT)
        return cv_jr_fail(r, a->line, "%s: indent must be an integer", a->what);
    jjson_opts o = {indent.t == JV_INT ? (int)(indent.u.i < 0 ? 0 : indent.u.i > 64 ? 64 : indent.u.i) : -1,
                    {indent.t == JV_INT ? "," : ", ", indent.t == JV_INT ? 1u : 2u}, {": ", 2}, cv_jv_truthy(sort),
                    cv_jv_truthy(ascii)};
    if (seps.t == JV_LIST) {
        if (seps.u.l->n != 2 || seps.u.l->v[0].t != JV_STR || seps.u.l->v[1].t != JV_STR)
            return cv_jr_fail(r, a->line, "%s: separators must be two strings", a->what);
        o.item_sep = seps.u.l->v[0].u.s;
        o.key_sep = seps.u.l->v[1].u.s;
    } else if (seps.t != JV_NONE) {
        return cv_jr_fail(r, a->line, "%s: separators must be two strings", a->what);
    }
    jbuf b = {0};
    if (cv_jv_write_json(r, &b, a->line, v, &o, 0) != 0)
        return cv_jb_free(&b), -1;
    return cv_jb_take(r, &b, a->line, out);
}

static int f_from_json(jrender *r, jv v, jargs *a, jv *out)
{
    if (cv_ja_done(r, a, 0) != 0)
        return -1;
    if (v.t != JV_STR)
        return cv_jr_fail(r, a->line, "%s needs a string, not %s", a->what, cv_jv_type_name(v));
    json_error_t e;
    json_t *j = json_loadb(v.u.s.p, v.u.s.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!j)
        return cv_jr_fail(r, a->line, "%s: not JSON: %s", a->what, e.text);
    int rc = cv_jv_from_json(r, a->line, j, true, out, 0);
    json_decref(j);
    return rc;
}

typedef int (*filter_fn)(jrender *r, jv v, jargs *a, jv *out);

static const struct {
    const char *name;
    filter_fn fn;
} FILTERS[] = {
    {"abs", f_abs},         {"attr", f_attr},         {"batch", f_batch},       {"capitalize", f_capitalize},
    {"center", f_center},   {"count", f_length},      {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},     {"first", f_first},
    {"float", f_float},     {"format", f_format},     {"from_json", f_from_json}, {"indent", f_indent},
    {"int", f_int},         {"items", f_items},       {"join", f_join},         {"last", f_last},
    {"length", f_length},   {"list", f_list},         {"lower", f_lower},       {"map", f_map},
    {"max", f_max},         {"min", f_min},           {"reject", f_reject},     {"rejectattr", f_rejectattr},
    {"replace", f_replace}, {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},
    {"select", f_select},   {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},
    {"sum", f_sum},         {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},
    {"unique", f_unique},   {"upper", f_upper},       {"wordcount", f_wordcount},
};

int cv_jf_filter_id(jstr name)
{
    for (size_t k = 0; k < sizeof FILTERS / sizeof FILTERS[0]; k++)
        if (strlen(FILTERS[k].name) == name.n && memcmp(FILTERS[k].name, name.p, name.n) == 0)
            return (int)k;
    return -1;
}

int cv_jf_filter(jrender *r, int id, jv operand, jargs *a, jv *out)
{
    return FILTERS[id].fn(r, operand, a, out);
}

/* ---- tests ---- */

static int one_arg(jrender *r, jargs *a, const char *name, jv *out)
{
    if (!cv_ja_arg(a, 0, name, out))
        return cv_jr_fail(r, a->line, "%s needs an argument", a->what);
    return cv_ja_done(r, a, 1);
}

static int t_type(jrender *r, jv v, jargs *a, bool *out, bool ok)
{
    *out = ok;
    (void)v;
    return cv_ja_done(r, a, 0);
}

static int t_boolean(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_BOOL); }
static int t_callable(jrender *r, jv v, jargs *a, bool *out)
{
    return t_type(r, v, a, out, v.t == JV_MACRO || v.t == JV_FUNC);
}
static int t_defined(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t != JV_UNDEF); }
static int t_undefined(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_UNDEF); }
static int t_escaped(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, false); }
static int t_false(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_BOOL && !v.u.b); }
static int t_true(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_BOOL && v.u.b); }
static int t_float(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_FLOAT); }
static int t_integer(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_INT); }
static int t_number(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, jv_is_num(v)); }
static int t_mapping(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_DICT); }
static int t_none(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_NONE); }
static int t_string(jrender *r, jv v, jargs *a, bool *out) { return t_type(r, v, a, out, v.t == JV_STR); }

/* Jinja's iterable (iter() works, Undefined included) and sequence (len and []). */
static int t_iterable(jrender *r, jv v, jargs *a, bool *out)
{
    return t_type(r, v, a, out, v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF || v.t == JV_LOOP);
}

static int t_sequence(jrender *r, jv v, jargs *a, bool *out)
{
    return t_type(r, v, a, out, v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF);
}

/* value % n == 0 (odd, even: value % 2). */
static int modulo_is(jrender *r, int line, jv v, jv n, int64_t want, bool *out)
{
    if (!jv_is_num(v) || !jv_is_num(n))
        return cv_jr_fail(r, line, "unsupported operand type(s) for %%: '%s' and '%s'", cv_jv_type_name(v),
                          cv_jv_type_name(n));
    if (v.t == JV_FLOAT || n.t == JV_FLOAT) {
        double x = v.t == JV_FLOAT ? v.u.f : (double)(v.t == JV_BOOL ? v.u.b : v.u.i);
        double y = n.t == JV_FLOAT ? n.u.f : (double)(n.t == JV_BOOL ? n.u.b : n.u.i);
        if (y == 0)
            return cv_jr_fail(r, line, "float modulo");
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0)))
            m += y;
        *out = m == (double)want;
        return 0;
    }
    int64_t x = v.t == JV_BOOL ? v.u.b : v.u.i, y = n.t == JV_BOOL ? n.u.b : n.u.i;
    if (y == 0)
        return cv_jr_fail(r, line, "integer division or modulo by zero");
    int64_t m = y == -1 ? 0 : x % y;
    if (m != 0 && ((m < 0) != (y < 0)))
        m += y;
    *out = m == want;
    return 0;
}

static int t_odd(jrender *r, jv v, jargs *a, bool *out)
{
    return cv_ja_done(r, a, 0) != 0 ? -1 : modulo_is(r, a->line, v, jv_int(2), 1, out);
}

static int t_even(jrender *r, jv v, jargs *a, bool *out)
{
    return cv_ja_done(r, a, 0) != 0 ? -1 : modulo_is(r, a->line, v, jv_int(2), 0, out);
}

static int t_divisibleby(jrender *r, jv v, jargs *a, bool *out)
{
    jv n;
    return one_arg(r, a, "num", &n) != 0 ? -1 : modulo_is(r, a->line, v, n, 0, out);
}

static int t_compare(jrender *r, jv v, jargs *a, bool *out, int op)
{
    jv other;
    int c = 0;
    if (one_arg(r, a, "b", &other) != 0)
        return -1;
    if (op == OP_EQ || op == OP_NE) {
        *out = cv_jv_equal(r, a->line, v, other) == (op == OP_EQ);
        return r->failed ? -1 : 0;
    }
    if (cv_jv_cmp(r, a->line, v, other, false, &c) != 0)
        return -1;
    *out = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
    return 0;
}

static int t_eq(jrender *r, jv v, jargs *a, bool *out) { return t_compare(r, v, a, out, OP_EQ); }
static int t_ne(jrender *r, jv v, jargs *a, bool *out) { return t_compare(r, v, a, out, OP_NE); }
static int t_lt(jrender *r, jv v, jargs *a, bool *out) { return t_compare(r, v, a, out, OP_LT); }
static int t_le(jrender *r, jv v, jargs *a, bool *out) { return t_compare(r, v, a, out, OP_LE); }
static int t_gt(jrender *r, jv v, jargs *a, bool *out) { return t_compare(r, v, a, out, OP_GT); }
static int t_ge(jrender *r, jv v, jargs *a, bool *out) { return t_compare(r, v, a, out, OP_GE); }

static int t_in(jrender *r, jv v, jargs *a, bool *out)
{
    jv seq;
    return one_arg(r, a, "seq", &seq) != 0 ? -1 : cv_je_contains(r, a->line, v, seq, out);
}

static int t_sameas(jrender *r, jv v, jargs *a, bool *out)
{
    jv o;
    if (one_arg(r, a, "other", &o) != 0)
        return -1;
    if (v.t != o.t)
        *out = false;
    else if (v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS || v.t == JV_MACRO || v.t == JV_LOOP)
        *out = v.u.d == o.u.d;
    else
        *out = cv_jv_equal(r, a->line, v, o);
    return r->failed ? -1 : 0;
}

/* str.islower() / str.isupper(): some cased letter, none of the other case. */
static int case_test(jrender *r, jv v, jargs *a, bool *out, bool lower)
{
    jv s;
    if (cv_ja_done(r, a, 0) != 0 || cv_jv_to_str(r, a->line, v, &s) != 0)
        return -1;
    bool cased = false, wrong = false;
    for (size_t i = 0, len; i < s.u.s.n; i += len) {
        uint32_t cp = cv_jt_decode(s.u.s.p + i, s.u.s.n - i, &len);
        bool is_lower = cv_jt_upper(cp) != cp, is_upper = cv_jt_lower(cp) != cp;
        cased |= lower ? is_lower : is_upper;
        wrong |= lower ? is_upper : is_lower;
    }
    *out = cased && !wrong;
    return 0;
}

static int t_lower(jrender *r, jv v, jargs *a, bool *out) { return case_test(r, v, a, out, true); }
static int t_upper(jrender *r, jv v, jargs *a, bool *out) { return case_test(r, v, a, out, false); }

typedef int (*test_fn)(jrender *r, jv v, jargs *a, bool *out);

static const struct {
    const char *name;
    test_fn fn;
} TESTS[] = {
    {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},   {"divisibleby", t_divisibleby},
    {"eq", t_eq},           {"equalto", t_eq},        {"==", t_eq},             {"escaped", t_escaped},
    {"even", t_even},       {"false", t_false},       {"float", t_float},       {"ge", t_ge},
    {">=", t_ge},           {"gt", t_gt},             {"greaterthan", t_gt},    {">", t_gt},
    {"in", t_in},           {"integer", t_integer},   {"iterable", t_iterable}, {"le", t_le},
    {"<=", t_le},           {"lower", t_lower},       {"lt", t_lt},             {"lessthan", t_lt},
    {"<", t_lt},            {"mapping", t_mapping},   {"ne", t_ne},             {"!=", t_ne},
    {"none", t_none},       {"number", t_number},     {"odd", t_odd},           {"sameas", t_sameas},
    {"sequence", t_sequence}, {"string", t_string},   {"true", t_true},         {"undefined", t_undefined},
    {"upper", t_upper},
};

int cv_jf_test_id(jstr name)
{
    for (size_t k = 0; k < sizeof TESTS / sizeof TESTS[0]; k++)
        if (strlen(TESTS[k].name) == name.n && memcmp(TESTS[k].name, name.p, name.n) == 0)
            return (int)k;
    return -1;
}

int cv_jf_test(jrender *r, int id, jv operand, jargs *a, bool *out)
{
    return TESTS[id].fn(r, operand, a, out);
}
