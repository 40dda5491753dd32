/* jinja_methods.c: the methods of str, list and dict values, the global
 * functions (range, namespace, dict, raise_exception, strftime_now),
 * loop.cycle, and Python's two string formattings (str % args and
 * str.format), each as Python 3 defines it on the cases templates use.
 *
 * str.format takes {}, {0}, {name} with !s or !r and no format spec; %
 * takes %s %r %d %i %u %f %F %e %E %g %G %x %X %o %c %% with (name),
 * flags, width and precision (* too). Anything else fails, naming it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chat/jinja_impl.h"

#define MAX_RANGE 100000

typedef int (*method_fn)(jrender *r, int line, jv self, jargs *a, jv *out);

/* ---- shared text helpers ---- */

static bool eq_name(jstr s, const char *w) { return s.n == strlen(w) && memcmp(s.p, w, s.n) == 0; }

static bool in_set(uint32_t cp, jstr set)
{
    for (size_t i = 0, len; i < set.n; i += len)
        if (cv_jt_decode(set.p + i, set.n - i, &len) == cp)
            return true;
    return false;
}

int cv_jm_strip(jrender *r, int line, jstr s, const jv *chars, bool left, bool right, jv *out)
{
    if (!chars || chars->t == JV_NONE || chars->t == JV_UNDEF) {
        jstr t = cv_jt_strip(s, left, right);
        *out = jv_str(t.p, t.n);
        return 0;
    }
    if (chars->t != JV_STR)
        return cv_jr_fail(r, line, "strip arg must be None or str");
    const char *p = s.p, *end = s.p + s.n;
    size_t len;
    while (left && p < end && in_set(cv_jt_decode(p, (size_t)(end - p), &len), chars->u.s))
        p += len;
    while (right && end > p) {
        size_t k = 1;
        while (k < 4 && end - k > p && ((unsigned char)end[-(ptrdiff_t)k] & 0xc0) == 0x80)
            k++;
        if (!in_set(cv_jt_decode(end - k, k, &len), chars->u.s) || len != k)
            break;
        end -= k;
    }
    *out = jv_str(p, (size_t)(end - p));
    return cv_jr_work(r, line, s.n / 16);
}

int cv_jm_case(jrender *r, int line, jstr s, int mode, jv *out)
{
    jbuf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0, len; i < s.n; i += len) {
        uint32_t cp = cv_jt_decode(s.p + i, s.n - i, &len), m = cp;
        bool cased = cv_jt_upper(cp) != cp || cv_jt_lower(cp) != cp;
        switch (mode) {
        case JCASE_UPPER: m = cv_jt_upper(cp); break;
        case JCASE_LOWER: m = cv_jt_lower(cp); break;
        case JCASE_TITLE: m = cased ? (prev_cased ? cv_jt_lower(cp) : cv_jt_upper(cp)) : cp; break;
        case JCASE_CAPITALIZE: m = first ? cv_jt_upper(cp) : cv_jt_lower(cp); break;
        default: /* Jinja's title: words begin after - ( { [ < or whitespace */
            m = prev_cased ? cv_jt_lower(cp) : cv_jt_upper(cp);
            cased = !(cv_jt_is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<');
        }
        prev_cased = cased;
        first = false;
        char buf[4];
        size_t n = m == cp ? len : cv_jt_encode(m, buf);
        if (cv_jb_put(r, &b, line, m == cp ? s.p + i : buf, n) != 0) {
            cv_jb_free(&b);
            return -1;
        }
    }
    return cv_jb_take(r, &b, line, out);
}

static const char *find_bytes(jstr hay, size_t from, jstr needle)
{
    if (from > hay.n || needle.n > hay.n - from)
        return NULL;
    return needle.n == 0 ? hay.p + from : memmem(hay.p + from, hay.n - from, needle.p, needle.n);
}

int cv_jm_replace(jrender *r, int line, jstr s, jstr old, jstr rep, int64_t count, jv *out)
{
    jbuf b = {0};
    size_t at = 0;
    int rc = 0;
    for (int64_t done = 0; rc == 0 && (count < 0 || done < count); done++) {
        const char *hit = find_bytes(s, at, old);
        if (!hit || (old.n == 0 && at > s.n))
            break;
        size_t pos = (size_t)(hit - s.p), step = 0;
        if (old.n == 0 && pos < s.n)
            cv_jt_decode(s.p + pos, s.n - pos, &step);
        rc = cv_jb_put(r, &b, line, s.p + at, pos - at);
        rc = rc ? rc : cv_jb_put(r, &b, line, rep.p, rep.n);
        rc = rc ? rc : cv_jb_put(r, &b, line, s.p + pos, step);
        at = pos + old.n + step + (old.n == 0 && pos == s.n);
    }
    if (rc == 0 && at < s.n)
        rc = cv_jb_put(r, &b, line, s.p + at, s.n - at);
    return rc == 0 ? cv_jb_take(r, &b, line, out) : (cv_jb_free(&b), -1);
}

/* split on whitespace runs (sep None): Python's rules for ends and maxsplit. */
static int split_space(jrender *r, int line, jstr s, int64_t maxsplit, bool from_right, jlist *l)
{
    const char *p = s.p, *end = s.p + s.n;
    for (int64_t done = 0;; done++) {
        jstr t = cv_jt_strip((jstr){p, (size_t)(end - p)}, !from_right, from_right);
        p = t.p;
        end = t.p + t.n;
        if (p == end)
            return 0;
        if (maxsplit >= 0 && done == maxsplit)
            return cv_jl_push(r, line, l, jv_str(p, (size_t)(end - p)));
        const char *q = from_right ? end : p;
        while (from_right && q > p && cv_jt_space_before(p, q) == 0)
            q--;
        while (!from_right && q < end && cv_jt_space_at(q, end) == 0)
            q++;
        jv word = from_right ? jv_str(q, (size_t)(end - q)) : jv_str(p, (size_t)(q - p));
        if (cv_jl_push(r, line, l, word) != 0)
            return -1;
        if (from_right)
            end = q;
        else
            p = q;
    }
}

int cv_jm_split(jrender *r, int line, jstr s, const jv *sep, int64_t maxsplit, bool from_right, jv *out)
{
    jlist *l = cv_jl_new(r, line, 0);
    if (!l || cv_jr_work(r, line, s.n / 16) != 0)
        return -1;
    *out = jv_list(l);
    if (!sep || sep->t == JV_NONE) {
        if (split_space(r, line, s, maxsplit, from_right, l) != 0)
            return -1;
    } else if (sep->t != JV_STR || sep->u.s.n == 0) {
        return cv_jr_fail(r, line, sep->t != JV_STR ? "must be str or None, not %s" : "empty separator",
                       cv_jv_type_name(*sep));
    } else {
        jstr d = sep->u.s;
        size_t lo = 0, hi = s.n;
        for (int64_t done = 0; maxsplit < 0 || done < maxsplit; done++) {
            const char *hit = NULL;
            if (from_right) {
                for (size_t k = hi; k >= lo + d.n && !hit; k--)
                    hit = memcmp(s.p + k - d.n, d.p, d.n) == 0 ? s.p + k - d.n : NULL;
            } else {
                hit = find_bytes((jstr){s.p, hi}, lo, d);
            }
            if (!hit)
                break;
            size_t pos = (size_t)(hit - s.p);
            jv part = from_right ? jv_str(hit + d.n, hi - pos - d.n) : jv_str(s.p + lo, pos - lo);
            if (cv_jl_push(r, line, l, part) != 0)
                return -1;
            if (from_right)
                hi = pos;
            else
                lo = pos + d.n;
        }
        if (cv_jl_push(r, line, l, jv_str(s.p + lo, hi - lo)) != 0)
            return -1;
    }
    if (from_right)
        for (size_t i = 0; i < l->n / 2; i++) {
            jv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    return 0;
}

/* ---- str methods ---- */

static int m_case(jrender *r, int line, jv self, jargs *a, jv *out, int mode)
{
    return cv_ja_done(r, a, 0) != 0 ? -1 : cv_jm_case(r, line, self.u.s, mode, out);
}

static int m_upper(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_case(r, line, self, a, out, JCASE_UPPER);
}
static int m_lower(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_case(r, line, self, a, out, JCASE_LOWER);
}
static int m_title(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_case(r, line, self, a, out, JCASE_TITLE);
}
static int m_capitalize(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_case(r, line, self, a, out, JCASE_CAPITALIZE);
}

static int m_strip_any(jrender *r, int line, jv self, jargs *a, jv *out, bool left, bool right)
{
    jv chars;
    bool given = cv_ja_arg(a, 0, "chars", &chars);
    return cv_ja_done(r, a, 1) != 0 ? -1 : cv_jm_strip(r, line, self.u.s, given ? &chars : NULL, left, right, out);
}

static int m_strip(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_strip_any(r, line, self, a, out, true, true);
}
static int m_lstrip(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_strip_any(r, line, self, a, out, true, false);
}
static int m_rstrip(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_strip_any(r, line, self, a, out, false, true);
}

static int m_split_any(jrender *r, int line, jv self, jargs *a, jv *out, bool from_right)
{
    jv sep = jv_none(), max = jv_int(-1);
    cv_ja_arg(a, 0, "sep", &sep);
    if (cv_ja_typed(r, a, 1, "maxsplit", JV_INT, &max, NULL) != 0 || cv_ja_done(r, a, 2) != 0)
        return -1;
    return cv_jm_split(r, line, self.u.s, &sep, max.t == JV_BOOL ? max.u.b : max.u.i, from_right, out);
}

static int m_split(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_split_any(r, line, self, a, out, false);
}
static int m_rsplit(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_split_any(r, line, self, a, out, true);
}

static int m_splitlines(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv keep = jv_bool(false);
    jlist *l;
    cv_ja_arg(a, 0, "keepends", &keep);
    if (cv_ja_done(r, a, 1) != 0 || cv_jm_splitlines(r, line, self.u.s, cv_jv_truthy(keep), &l) != 0)
        return -1;
    *out = jv_list(l);
    return 0;
}

static int m_replace(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv old, rep, count = jv_int(-1);
    if (cv_ja_typed(r, a, 0, "old", JV_STR, &old, NULL) || cv_ja_typed(r, a, 1, "new", JV_STR, &rep, NULL) ||
        cv_ja_typed(r, a, 2, "count", JV_INT, &count, NULL) || cv_ja_done(r, a, 3))
        return -1;
    if (a->n_pos < 2)
        return cv_jr_fail(r, line, "replace() takes at least 2 arguments");
    return cv_jm_replace(r, line, self.u.s, old.u.s, rep.u.s, count.t == JV_BOOL ? count.u.b : count.u.i, out);
}

/* startswith / endswith with a string or a tuple of strings. */
static int m_affix(jrender *r, int line, jv self, jargs *a, jv *out, bool end)
{
    jv x;
    if (!cv_ja_arg(a, 0, "prefix", &x) || cv_ja_done(r, a, 1) != 0)
        return r->failed ? -1 : cv_jr_fail(r, line, "%s needs an argument", end ? "endswith()" : "startswith()");
    jstr s = self.u.s;
    size_t n = x.t == JV_LIST ? x.u.l->n : 1;
    *out = jv_bool(false);
    for (size_t i = 0; i < n; i++) {
        jv p = x.t == JV_LIST ? x.u.l->v[i] : x;
        if (p.t != JV_STR)
            return cv_jr_fail(r, line, "%s first arg must be str or a tuple of str, not %s",
                           end ? "endswith" : "startswith", cv_jv_type_name(p));
        if (p.u.s.n <= s.n && memcmp(end ? s.p + s.n - p.u.s.n : s.p, p.u.s.p, p.u.s.n) == 0)
            *out = jv_bool(true);
    }
    return 0;
}

static int m_startswith(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_affix(r, line, self, a, out, false);
}
static int m_endswith(jrender *r, int line, jv self, jargs *a, jv *out) { return m_affix(r, line, self, a, out, true); }

/* find / rfind / count of a substring (code point positions). */
static int m_search(jrender *r, int line, jv self, jargs *a, jv *out, int kind)
{
    jv sub;
    if (cv_ja_typed(r, a, 0, "sub", JV_STR, &sub, NULL) != 0 || cv_ja_done(r, a, 1) != 0)
        return -1;
    if (a->n_pos < 1)
        return cv_jr_fail(r, line, "%s needs an argument", a->what);
    jstr s = self.u.s, t = sub.u.s;
    int64_t count = 0, found = -1;
    for (size_t at = 0;;) {
        const char *hit = find_bytes(s, at, t);
        if (!hit)
            break;
        size_t pos = (size_t)(hit - s.p);
        if (found < 0 || kind == 1)
            found = (int64_t)pos;
        count++;
        if (kind == 0)
            break;
        at = pos + (t.n ? t.n : 1);
        if (at > s.n)
            break;
    }
    if (kind == 2)
        *out = jv_int(count);
    else
        *out = jv_int(found < 0 ? -1 : (int64_t)cv_jt_count((jstr){s.p, (size_t)found}));
    return cv_jr_work(r, line, s.n / 16);
}

static int m_find(jrender *r, int line, jv self, jargs *a, jv *out) { return m_search(r, line, self, a, out, 0); }
static int m_rfind(jrender *r, int line, jv self, jargs *a, jv *out) { return m_search(r, line, self, a, out, 1); }
static int m_count(jrender *r, int line, jv self, jargs *a, jv *out) { return m_search(r, line, self, a, out, 2); }

/* isalnum, isalpha, isdigit, isspace: every code point, and at least one. */
static int m_is(jrender *r, int line, jv self, jargs *a, jv *out, int kind)
{
    if (cv_ja_done(r, a, 0) != 0)
        return -1;
    jstr s = self.u.s;
    bool ok = s.n > 0;
    for (size_t i = 0, len; i < s.n && ok; i += len) {
        uint32_t cp = cv_jt_decode(s.p + i, s.n - i, &len);
        ok = kind == 0 ? cv_jt_is_alpha(cp) || cv_jt_is_digit(cp) : kind == 1 ? cv_jt_is_alpha(cp)
             : kind == 2 ? cv_jt_is_digit(cp) : cv_jt_is_space(cp);
    }
    (void)line;
    *out = jv_bool(ok);
    return 0;
}

static int m_isalnum(jrender *r, int line, jv self, jargs *a, jv *out) { return m_is(r, line, self, a, out, 0); }
static int m_isalpha(jrender *r, int line, jv self, jargs *a, jv *out) { return m_is(r, line, self, a, out, 1); }
static int m_isdigit(jrender *r, int line, jv self, jargs *a, jv *out) { return m_is(r, line, self, a, out, 2); }
static int m_isspace(jrender *r, int line, jv self, jargs *a, jv *out) { return m_is(r, line, self, a, out, 3); }

static int m_islower_upper(jrender *r, int line, jv self, jargs *a, jv *out, bool lower)
{
    if (cv_ja_done(r, a, 0) != 0)
        return -1;
    bool cased = false, wrong = false;
    for (size_t i = 0, len; i < self.u.s.n; i += len) {
        uint32_t cp = cv_jt_decode(self.u.s.p + i, self.u.s.n - i, &len);
        bool is_lower = cv_jt_upper(cp) != cp, is_upper = cv_jt_lower(cp) != cp;
        cased |= lower ? is_lower : is_upper;
        wrong |= lower ? is_upper : is_lower;
    }
    (void)line;
    *out = jv_bool(cased && !wrong);
    return 0;
}

static int m_islower(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_islower_upper(r, line, self, a, out, true);
}
static int m_isupper(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_islower_upper(r, line, self, a, out, false);
}

static int m_join(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv seq;
    jlist *l;
    if (!cv_ja_arg(a, 0, "iterable", &seq) || cv_ja_done(r, a, 1) != 0 || cv_je_iterate(r, line, seq, &l) != 0)
        return r->failed ? -1 : cv_jr_fail(r, line, "join() takes exactly one argument");
    jbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].t != JV_STR) {
            cv_jb_free(&b);
            return cv_jr_fail(r, line, "sequence item %zu: expected str instance, %s found", i,
                              cv_jv_type_name(l->v[i]));
        }
        if ((i && cv_jb_put(r, &b, line, self.u.s.p, self.u.s.n)) ||
            cv_jb_put(r, &b, line, l->v[i].u.s.p, l->v[i].u.s.n)) {
            cv_jb_free(&b);
            return -1;
        }
    }
    return cv_jb_take(r, &b, line, out);
}

/* One {field} of str.format: its text (name, !conversion) into b. */
static int format_field(jrender *r, int line, jstr field, jargs *a, int *auto_idx, jbuf *b)
{
    size_t bang = 0;
    while (bang < field.n && field.p[bang] != '!' && field.p[bang] != ':')
        bang++;
    if (bang < field.n &&
        (field.p[bang] == ':' || field.n != bang + 2 || (field.p[bang + 1] != 's' && field.p[bang + 1] != 'r')))
        return cv_jr_fail(r, line, "format(): only {}, {n} and {name} with !s or !r are supported");
    jstr name = {field.p, bang};
    jv v;
    int64_t idx;
    bool found;
    if (name.n == 0)
        found = cv_ja_arg(a, (*auto_idx)++, "", &v);
    else if (cv_jt_parse_int(name, 10, &idx) && name.p[0] >= '0' && name.p[0] <= '9')
        found = idx < a->n_pos && cv_ja_arg(a, (int)idx, "", &v);
    else {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(name.n < 63 ? name.n : 63), name.p);
        found = cv_ja_arg(a, -1, key, &v);
    }
    if (!found)
        return cv_jr_fail(r, line, "format(): no argument for {%.*s}", (int)field.n, field.p);
    bool repr = bang < field.n && field.p[bang + 1] == 'r';
    return repr ? cv_jv_write_repr(r, b, line, v, 0) : cv_jv_write_str(r, b, line, v);
}

static int m_format(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jstr s = self.u.s;
    jbuf b = {0};
    int auto_idx = 0, rc = 0;
    for (size_t i = 0; i < s.n && rc == 0; i++) {
        char c = s.p[i];
        if ((c == '{' || c == '}') && i + 1 < s.n && s.p[i + 1] == c) {
            rc = cv_jb_put(r, &b, line, &c, 1);
            i++;
        } else if (c == '{') {
            const char *close = memchr(s.p + i, '}', s.n - i);
            if (!close)
                rc = cv_jr_fail(r, line, "Single '{' encountered in format string");
            else
                rc = format_field(r, line, (jstr){s.p + i + 1, (size_t)(close - s.p - i - 1)}, a, &auto_idx, &b);
            i = close ? (size_t)(close - s.p) : i;
        } else if (c == '}') {
            rc = cv_jr_fail(r, line, "Single '}' encountered in format string");
        } else {
            rc = cv_jb_put(r, &b, line, &c, 1);
        }
    }
    return rc == 0 ? cv_jb_take(r, &b, line, out) : (cv_jb_free(&b), -1);
}

/* ---- list and dict methods ---- */

static int m_append(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv x;
    if (!cv_ja_arg(a, 0, "object", &x) || cv_ja_done(r, a, 1) != 0)
        return r->failed ? -1 : cv_jr_fail(r, line, "append() takes exactly one argument");
    *out = jv_none();
    return cv_jl_push(r, line, self.u.l, x);
}

static int m_extend(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv x;
    jlist *l;
    if (!cv_ja_arg(a, 0, "iterable", &x) || cv_ja_done(r, a, 1) != 0 || cv_je_iterate(r, line, x, &l) != 0)
        return r->failed ? -1 : cv_jr_fail(r, line, "extend() takes exactly one argument");
    for (size_t i = 0; i < l->n; i++)
        if (cv_jl_push(r, line, self.u.l, l->v[i]) != 0)
            return -1;
    *out = jv_none();
    return 0;
}

static int64_t clamp_index(int64_t i, size_t n)
{
    if (i < 0)
        i += (int64_t)n;
    return i < 0 ? 0 : i > (int64_t)n ? (int64_t)n : i;
}

static int m_insert(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv at, x;
    if (cv_ja_typed(r, a, 0, "index", JV_INT, &at, NULL) != 0 || !cv_ja_arg(a, 1, "object", &x) ||
        cv_ja_done(r, a, 2) != 0)
        return r->failed ? -1 : cv_jr_fail(r, line, "insert() takes exactly two arguments");
    jlist *l = self.u.l;
    int64_t i = clamp_index(at.t == JV_BOOL ? at.u.b : at.u.i, l->n);
    if (cv_jl_push(r, line, l, x) != 0)
        return -1;
    memmove(l->v + i + 1, l->v + i, (l->n - 1 - (size_t)i) * sizeof(jv));
    l->v[i] = x;
    *out = jv_none();
    return cv_jr_work(r, line, l->n / 16);
}

static int m_pop(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv at = jv_int(-1);
    if (cv_ja_typed(r, a, 0, "index", JV_INT, &at, NULL) != 0 || cv_ja_done(r, a, 1) != 0)
        return -1;
    jlist *l = self.u.l;
    if (l->n == 0)
        return cv_jr_fail(r, line, "pop from empty list");
    int64_t i = at.t == JV_BOOL ? at.u.b : at.u.i;
    if (i < 0)
        i += (int64_t)l->n;
    if (i < 0 || (uint64_t)i >= l->n)
        return cv_jr_fail(r, line, "pop index out of range");
    *out = l->v[i];
    memmove(l->v + i, l->v + i + 1, (l->n - 1 - (size_t)i) * sizeof(jv));
    l->n--;
    return cv_jr_work(r, line, l->n / 16);
}

static int m_list_find(jrender *r, int line, jv self, jargs *a, jv *out, bool count)
{
    jv x;
    if (!cv_ja_arg(a, 0, "value", &x) || cv_ja_done(r, a, 1) != 0)
        return r->failed ? -1 : cv_jr_fail(r, line, "%s takes exactly one argument", a->what);
    int64_t n = 0;
    for (size_t i = 0; i < self.u.l->n && !r->failed; i++)
        if (cv_jv_equal(r, line, self.u.l->v[i], x)) {
            if (!count) {
                *out = jv_int((int64_t)i);
                return 0;
            }
            n++;
        }
    if (!count)
        return cv_jr_fail(r, line, "value is not in list");
    *out = jv_int(n);
    return r->failed ? -1 : 0;
}

static int m_index(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_list_find(r, line, self, a, out, false);
}
static int m_lcount(jrender *r, int line, jv self, jargs *a, jv *out)
{
    return m_list_find(r, line, self, a, out, true);
}

static int m_get(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv key, def = jv_none();
    if (!cv_ja_arg(a, 0, "key", &key))
        return cv_jr_fail(r, line, "get expected at least 1 argument, got 0");
    cv_ja_arg(a, 1, "default", &def);
    if (cv_ja_done(r, a, 2) != 0)
        return -1;
    if ((key.t == JV_LIST && !key.u.l->tuple) || key.t == JV_DICT || key.t == JV_NS)
        return cv_jr_fail(r, line, "unhashable type: '%s'", cv_jv_type_name(key));
    const jv *v = cv_jd_get(r, line, self.u.d, key);
    *out = v ? *v : def;
    return r->failed ? -1 : 0;
}

/* items(), keys(), values(): 0, 1, 2. */
static int m_view(jrender *r, int line, jv self, jargs *a, jv *out, int kind)
{
    const jdict *d = self.u.d;
    jlist *l;
    if (cv_ja_done(r, a, 0) != 0 || !(l = cv_jl_new(r, line, d->n)))
        return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (kind != 0) {
            l->v[l->n++] = kind == 1 ? d->k[i] : d->v[i];
            continue;
        }
        jlist *pair = cv_jl_new(r, line, 2);
        if (!pair)
            return -1;
        pair->tuple = true;
        pair->v[0] = d->k[i];
        pair->v[1] = d->v[i];
        pair->n = 2;
        l->v[l->n++] = jv_list(pair);
    }
    *out = jv_list(l);
    return cv_jr_work(r, line, d->n / 8);
}

static int m_items(jrender *r, int line, jv self, jargs *a, jv *out) { return m_view(r, line, self, a, out, 0); }
static int m_keys(jrender *r, int line, jv self, jargs *a, jv *out) { return m_view(r, line, self, a, out, 1); }
static int m_values(jrender *r, int line, jv self, jargs *a, jv *out) { return m_view(r, line, self, a, out, 2); }

/* ---- globals ---- */

static int g_range(jrender *r, int line, jv self, jargs *a, jv *out)
{
    int64_t b[3] = {0, 0, 1};
    (void)self;
    if (a->n_kw || a->n_pos < 1 || a->n_pos > 3)
        return cv_jr_fail(r, line, "range() takes 1 to 3 positional arguments");
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i].t != JV_INT && a->pos[i].t != JV_BOOL)
            return cv_jr_fail(r, line, "'%s' object cannot be interpreted as an integer", cv_jv_type_name(a->pos[i]));
        b[a->n_pos == 1 ? 1 : i] = a->pos[i].t == JV_BOOL ? a->pos[i].u.b : a->pos[i].u.i;
    }
    if (b[2] == 0)
        return cv_jr_fail(r, line, "range() arg 3 must not be zero");
    double n = ceil(((double)b[1] - (double)b[0]) / (double)b[2]);
    if (n > MAX_RANGE)
        return cv_jr_fail(r, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    jlist *l = cv_jl_new(r, line, n > 0 ? (size_t)n : 0);
    if (!l)
        return -1;
    for (int64_t i = b[0]; b[2] > 0 ? i < b[1] : i > b[1]; i += b[2])
        l->v[l->n++] = jv_int(i);
    *out = jv_list(l);
    return 0;
}

/* namespace(...) and dict(...): a mapping and/or keyword arguments. */
static int g_mapping(jrender *r, int line, jargs *a, bool ns, jv *out)
{
    jdict *d = cv_jd_new(r, line, 0);
    if (!d)
        return -1;
    if (a->n_pos > 1)
        return cv_jr_fail(r, line, "%s expected at most 1 argument, got %d", ns ? "namespace" : "dict", a->n_pos);
    if (a->n_pos == 1 && a->pos[0].t == JV_DICT) {
        for (size_t i = 0; i < a->pos[0].u.d->n; i++)
            if (cv_jd_set(r, line, d, a->pos[0].u.d->k[i], a->pos[0].u.d->v[i]) != 0)
                return -1;
    } else if (a->n_pos == 1) {
        return cv_jr_fail(r, line, "%s: the argument must be a mapping", ns ? "namespace" : "dict");
    }
    for (int k = 0; k < a->n_kw; k++)
        if (cv_jd_set(r, line, d, jv_str(a->kw_name[k].p, a->kw_name[k].n), a->kw[k]) != 0)
            return -1;
    *out = (jv){(uint8_t)(ns ? JV_NS : JV_DICT), 0, {.d = d}};
    return 0;
}

static int g_namespace(jrender *r, int line, jv self, jargs *a, jv *out)
{
    (void)self;
    return g_mapping(r, line, a, true, out);
}

static int g_dict(jrender *r, int line, jv self, jargs *a, jv *out)
{
    (void)self;
    return g_mapping(r, line, a, false, out);
}

static int g_raise(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv msg = jv_str("", 0), text;
    (void)self;
    (void)out;
    cv_ja_arg(a, 0, "message", &msg);
    if (cv_jv_to_str(r, line, msg, &text) != 0)
        return -1;
    return cv_jr_fail(r, line, "%.*s", (int)(text.u.s.n > 400 ? 400 : text.u.s.n), text.u.s.p);
}

static int g_strftime(jrender *r, int line, jv self, jargs *a, jv *out)
{
    jv fmt;
    (void)self;
    if (cv_ja_typed(r, a, 0, "format", JV_STR, &fmt, NULL) != 0 || cv_ja_done(r, a, 1) != 0)
        return -1;
    if (a->n_pos < 1)
        return cv_jr_fail(r, line, "strftime_now() needs a format");
    jbuf b = {0};
    if (cv_jt_strftime(r, &b, line, fmt.u.s, r->year, r->month, r->day) != 0) {
        cv_jb_free(&b);
        return -1;
    }
    return cv_jb_take(r, &b, line, out);
}

static int g_cycle(jrender *r, int line, jv self, jargs *a, jv *out)
{
    if (a->n_pos == 0 || a->n_kw)
        return cv_jr_fail(r, line, "no items for cycling given");
    *out = a->pos[self.u.lp->i % (size_t)a->n_pos];
    return 0;
}

/* ---- str % args ---- */

typedef struct pct_spec {
    char flags[8];
    int width, prec; /* -1: none */
    char type;
} pct_spec;

/* Reads flags, width and precision (with * from the arguments) at fmt[*i]. */
static int pct_read(jrender *r, int line, jstr fmt, size_t *i, const jlist *args, size_t *next, pct_spec *sp)
{
    int nf = 0;
    while (*i < fmt.n && strchr("-+ #0", fmt.p[*i]) && fmt.p[*i] && nf < 7)
        sp->flags[nf++] = fmt.p[(*i)++];
    sp->flags[nf] = '\0';
    for (int part = 0; part < 2; part++) {
        int *dst = part ? &sp->prec : &sp->width;
        *dst = -1;
        if (part && !(*i < fmt.n && fmt.p[*i] == '.'))
            break;
        *i += part;
        if (*i < fmt.n && fmt.p[*i] == '*') {
            (*i)++;
            if (*next >= args->n || args->v[*next].t != JV_INT)
                return cv_jr_fail(r, line, "* wants int");
            *dst = (int)(args->v[(*next)++].u.i);
            *dst = *dst < -4096 ? -4096 : *dst > 4096 ? 4096 : *dst;
        } else {
            *dst = part ? 0 : -1; /* "%.f": precision 0 */
            for (; *i < fmt.n && fmt.p[*i] >= '0' && fmt.p[*i] <= '9'; (*i)++)
                *dst = (*dst < 0 ? 0 : *dst) * 10 + (fmt.p[*i] - '0') > 4096
                           ? 4096
                           : (*dst < 0 ? 0 : *dst) * 10 + (fmt.p[*i] - '0');
        }
    }
    while (*i < fmt.n && strchr("hlL", fmt.p[*i]) && fmt.p[*i])
        (*i)++;
    if (*i >= fmt.n)
        return cv_jr_fail(r, line, "incomplete format");
    sp->type = fmt.p[(*i)++];
    return 0;
}

/* Pads text (code points) to the width, left-aligned with the - flag. */
static int pct_pad(jrender *r, jbuf *b, int line, const pct_spec *sp, jstr text)
{
    if (sp->prec >= 0 && (sp->type == 's' || sp->type == 'r' || sp->type == 'a'))
        text.n = cv_jt_offset(text, (size_t)sp->prec);
    size_t width = (size_t)(sp->width < 0 ? -sp->width : sp->width), len = cv_jt_count(text);
    size_t pad = width > len ? width - len : 0;
    bool left = strchr(sp->flags, '-') != NULL || sp->width < -1;
    for (size_t k = 0; !left && k < pad; k++)
        if (jb_puts(r, b, line, " ") != 0)
            return -1;
    if (cv_jb_put(r, b, line, text.p, text.n) != 0)
        return -1;
    for (size_t k = 0; left && k < pad; k++)
        if (jb_puts(r, b, line, " ") != 0)
            return -1;
    return 0;
}

/* A number conversion through C's printf, which agrees with Python's. */
static int pct_number(jrender *r, jbuf *b, int line, const pct_spec *sp, jv v)
{
    char cfmt[32], out[4400];
    bool integral = strchr("diuxXoc", sp->type) != NULL;
    if (!jv_is_num(v) || (strchr("xXo", sp->type) && v.t == JV_FLOAT))
        return cv_jr_fail(r, line, "%%%c format: a%s number is required, not %s", sp->type,
                       integral ? "n integer" : " real", cv_jv_type_name(v));
    double f = v.t == JV_FLOAT ? v.u.f : (double)(v.t == JV_BOOL ? v.u.b : v.u.i);
    long long i = v.t == JV_FLOAT ? (isfinite(f) && fabs(f) < 9.2e18 ? (long long)f : 0)
                                  : (long long)(v.t == JV_BOOL ? v.u.b : v.u.i);
    int n;
    if (sp->type == 'c') {
        char enc[4];
        return pct_pad(r, b, line, sp, (jstr){enc, cv_jt_encode((uint32_t)(i < 0 ? 0xFFFD : i), enc)});
    }
    if (integral) {
        snprintf(cfmt, sizeof cfmt, "%%%s*ll%c", sp->flags, sp->type == 'i' || sp->type == 'u' ? 'd' : sp->type);
        n = snprintf(out, sizeof out, cfmt, sp->width, i);
    } else {
        snprintf(cfmt, sizeof cfmt, "%%%s*.*%c", sp->flags, sp->type);
        n = snprintf(out, sizeof out, cfmt, sp->width, sp->prec < 0 ? 6 : sp->prec, f);
    }
    return cv_jb_put(r, b, line, out, n < 0 ? 0 : (size_t)n < sizeof out ? (size_t)n : sizeof out - 1);
}

static int pct_one(jrender *r, jbuf *b, int line, const pct_spec *sp, jv v)
{
    if (sp->type == 's' || sp->type == 'r' || sp->type == 'a') {
        jbuf t = {0};
        int rc = sp->type == 's' ? cv_jv_write_str(r, &t, line, v) : cv_jv_write_repr(r, &t, line, v, 0);
        rc = rc ? rc : pct_pad(r, b, line, sp, (jstr){t.p ? t.p : "", t.n});
        cv_jb_free(&t);
        return rc;
    }
    if (!strchr("diuxXofFeEgGc", sp->type) || !sp->type)
        return cv_jr_fail(r, line, "unsupported format character '%c'", sp->type);
    return pct_number(r, b, line, sp, v);
}

/* The value of %(name)s from a mapping. */
static int pct_named(jrender *r, int line, jstr fmt, size_t *i, jv args, jv *v)
{
    const char *close = memchr(fmt.p + *i, ')', fmt.n - *i);
    if (!close)
        return cv_jr_fail(r, line, "incomplete format key");
    if (args.t != JV_DICT)
        return cv_jr_fail(r, line, "format requires a mapping");
    const jv *hit = cv_jd_get_str(args.u.d, fmt.p + *i + 1, (size_t)(close - fmt.p - *i - 1));
    if (!hit)
        return cv_jr_fail(r, line, "format: no key '%.*s'", (int)(close - fmt.p - *i - 1), fmt.p + *i + 1);
    *v = *hit;
    *i = (size_t)(close - fmt.p) + 1;
    return 0;
}

int cv_jm_percent(jrender *r, int line, jstr fmt, jv args, jv *out)
{
    jlist one = {&args, 1, 1, true};
    const jlist *pos = args.t == JV_LIST && args.u.l->tuple ? args.u.l : &one;
    size_t next = 0;
    bool named = false;
    jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < fmt.n && rc == 0;) {
        const char *pc = memchr(fmt.p + i, '%', fmt.n - i);
        size_t upto = pc ? (size_t)(pc - fmt.p) : fmt.n;
        rc = cv_jb_put(r, &b, line, fmt.p + i, upto - i);
        i = upto + 1;
        if (!pc || rc != 0)
            break;
        if (i < fmt.n && fmt.p[i] == '%') {
            rc = jb_puts(r, &b, line, "%");
            i++;
            continue;
        }
        jv v;
        pct_spec sp;
        if (i < fmt.n && fmt.p[i] == '(')
            rc = pct_named(r, line, fmt, &i, args, &v), named = true;
        rc = rc ? rc : pct_read(r, line, fmt, &i, pos, &next, &sp);
        if (rc == 0 && !named && next >= pos->n)
            rc = cv_jr_fail(r, line, "not enough arguments for format string");
        else if (rc == 0 && !named)
            v = pos->v[next++];
        rc = rc ? rc : pct_one(r, &b, line, &sp, v);
    }
    /* Python reads a lone argument with [] (a dict, a list, Undefined) as a mapping: not left over */
    bool mapping = pos == &one && (args.t == JV_DICT || (args.t == JV_LIST && !args.u.l->tuple) || args.t == JV_UNDEF);
    if (rc == 0 && !named && next < pos->n && !mapping)
        rc = cv_jr_fail(r, line, "not all arguments converted during string formatting");
    return rc == 0 ? cv_jb_take(r, &b, line, out) : (cv_jb_free(&b), -1);
}

/* ---- tables ---- */

static const method_fn CALLS[] = {
    [JM_RANGE] = g_range, [JM_NAMESPACE] = g_namespace, [JM_DICT] = g_dict, [JM_RAISE] = g_raise,
    [JM_STRFTIME] = g_strftime, [JM_CYCLE] = g_cycle,
    [JM_S_CAPITALIZE] = m_capitalize, [JM_S_COUNT] = m_count, [JM_S_ENDSWITH] = m_endswith, [JM_S_FIND] = m_find,
    [JM_S_FORMAT] = m_format, [JM_S_ISALNUM] = m_isalnum, [JM_S_ISALPHA] = m_isalpha, [JM_S_ISDIGIT] = m_isdigit,
    [JM_S_ISLOWER] = m_islower, [JM_S_ISSPACE] = m_isspace, [JM_S_ISUPPER] = m_isupper, [JM_S_JOIN] = m_join,
    [JM_S_LOWER] = m_lower, [JM_S_LSTRIP] = m_lstrip, [JM_S_REPLACE] = m_replace, [JM_S_RFIND] = m_rfind,
    [JM_S_RSPLIT] = m_rsplit, [JM_S_RSTRIP] = m_rstrip, [JM_S_SPLIT] = m_split, [JM_S_SPLITLINES] = m_splitlines,
    [JM_S_STARTSWITH] = m_startswith, [JM_S_STRIP] = m_strip, [JM_S_TITLE] = m_title, [JM_S_UPPER] = m_upper,
    [JM_L_APPEND] = m_append, [JM_L_COUNT] = m_lcount, [JM_L_EXTEND] = m_extend, [JM_L_INDEX] = m_index,
    [JM_L_INSERT] = m_insert, [JM_L_POP] = m_pop,
    [JM_D_GET] = m_get, [JM_D_ITEMS] = m_items, [JM_D_KEYS] = m_keys, [JM_D_VALUES] = m_values,
};

static const struct {
    uint8_t type;
    bool mutates; /* lists only: tuples lack it */
    const char *name;
    int id;
} METHODS[] = {
    {JV_STR, 0, "capitalize", JM_S_CAPITALIZE}, {JV_STR, 0, "count", JM_S_COUNT},
    {JV_STR, 0, "endswith", JM_S_ENDSWITH},     {JV_STR, 0, "find", JM_S_FIND},
    {JV_STR, 0, "format", JM_S_FORMAT},         {JV_STR, 0, "isalnum", JM_S_ISALNUM},
    {JV_STR, 0, "isalpha", JM_S_ISALPHA},       {JV_STR, 0, "isdigit", JM_S_ISDIGIT},
    {JV_STR, 0, "islower", JM_S_ISLOWER},       {JV_STR, 0, "isspace", JM_S_ISSPACE},
    {JV_STR, 0, "isupper", JM_S_ISUPPER},       {JV_STR, 0, "join", JM_S_JOIN},
    {JV_STR, 0, "lower", JM_S_LOWER},           {JV_STR, 0, "lstrip", JM_S_LSTRIP},
    {JV_STR, 0, "replace", JM_S_REPLACE},       {JV_STR, 0, "rfind", JM_S_RFIND},
    {JV_STR, 0, "rsplit", JM_S_RSPLIT},         {JV_STR, 0, "rstrip", JM_S_RSTRIP},
    {JV_STR, 0, "split", JM_S_SPLIT},           {JV_STR, 0, "splitlines", JM_S_SPLITLINES},
    {JV_STR, 0, "startswith", JM_S_STARTSWITH}, {JV_STR, 0, "strip", JM_S_STRIP},
    {JV_STR, 0, "title", JM_S_TITLE},           {JV_STR, 0, "upper", JM_S_UPPER},
    {JV_LIST, 1, "append", JM_L_APPEND},        {JV_LIST, 0, "count", JM_L_COUNT},
    {JV_LIST, 1, "extend", JM_L_EXTEND},        {JV_LIST, 0, "index", JM_L_INDEX},
    {JV_LIST, 1, "insert", JM_L_INSERT},        {JV_LIST, 1, "pop", JM_L_POP},
    {JV_DICT, 0, "get", JM_D_GET},              {JV_DICT, 0, "items", JM_D_ITEMS},
    {JV_DICT, 0, "keys", JM_D_KEYS},            {JV_DICT, 0, "values", JM_D_VALUES},
};

bool cv_jm_method(jrender *r, int line, jv obj, jstr name, jv *out)
{
    for (size_t k = 0; k < sizeof METHODS / sizeof METHODS[0]; k++) {
        if (METHODS[k].type != obj.t || !eq_name(name, METHODS[k].name))
            continue;
        if (METHODS[k].mutates && obj.u.l->tuple)
            return false;
        jfunc *fn = cv_jr_alloc(r, line, sizeof *fn);
        if (fn) {
            fn->id = METHODS[k].id;
            fn->self = obj;
            *out = (jv){JV_FUNC, 0, {.fn = fn}};
        }
        return true;
    }
    return false;
}

/* The name a function or method is called by, for messages. */
static const char *call_name(int id)
{
    static const char *const globals[] = {
        [JM_RANGE] = "range", [JM_NAMESPACE] = "namespace", [JM_DICT] = "dict", [JM_RAISE] = "raise_exception",
        [JM_STRFTIME] = "strftime_now", [JM_CYCLE] = "loop.cycle"};
    if (id <= JM_CYCLE)
        return globals[id];
    for (size_t k = 0; k < sizeof METHODS / sizeof METHODS[0]; k++)
        if (METHODS[k].id == id)
            return METHODS[k].name;
    return "method";
}

int cv_jm_call(jrender *r, int line, const jfunc *fn, jargs *a, jv *out)
{
    char what[48];
    snprintf(what, sizeof what, "%s()", call_name(fn->id));
    if (!a->what || !strcmp(a->what, "call"))
        a->what = what;
    return CALLS[fn->id](r, line, fn->self, a, out);
}
