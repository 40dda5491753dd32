/* jinja_value.c: the arena and the values of the Jinja engine
 * (jinja_impl.h): lists and dicts, truth, equality and order as Python has
 * them, Python's str() and repr(), and JSON both ways (json.dumps as
 * transformers' tojson calls it; jansson values in).
 *
 * Recursion over values (equality, repr, JSON) stops at MAX_VALUE_DEPTH:
 * a list may contain itself (l.append(l)), which Python prints as [...]
 * and json.dumps refuses as a circular reference. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat/jinja_impl.h"
#include "core/alloc.h"

#define MAX_VALUE_DEPTH 200
#define CHUNK (64u << 10)

/* ---- arena ---- */

struct ja_chunk {
    ja_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

/* The part of h bytes held that is the pool's. */
static size_t pooled(size_t h) { return h > CV_JINJA_OWN_BYTES ? h - CV_JINJA_OWN_BYTES : 0; }

bool cv_ja_hold(jarena *a, size_t n)
{
    const size_t more = pooled(a->held + n) - pooled(a->held);
    if (a->pool && more && !cv_budget_take(a->pool, more)) {
        a->pool_spent = true;
        return false;
    }
    a->held += n;
    return true;
}

void cv_ja_unhold(jarena *a, size_t n)
{
    const size_t fewer = pooled(a->held) - pooled(a->held - n);
    if (a->pool && fewer)
        cv_budget_give(a->pool, fewer);
    a->held -= n;
}

static ja_chunk *new_chunk(jarena *a, size_t size)
{
    size_t bytes = sizeof(ja_chunk) + size;
    if (size > SIZE_MAX - sizeof(ja_chunk) || (a->limit && a->used + bytes > a->limit) || !cv_ja_hold(a, bytes))
        return NULL;
    ja_chunk *c = cv_malloc(bytes);
    if (!c) {
        cv_ja_unhold(a, bytes);
        return NULL;
    }
    c->size = size;
    c->used = 0;
    a->used += bytes;
    return c;
}

void *cv_ja_alloc(jarena *a, size_t n)
{
    if (n > SIZE_MAX - 16)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    ja_chunk *c = a->first;
    if (!c || c->size - c->used < n) {
        if (!(c = new_chunk(a, n > CHUNK / 4 ? n : CHUNK)))
            return NULL;
        if (n > CHUNK / 4 && a->first) { /* a big block: keep the current chunk's room */
            c->next = a->first->next;
            a->first->next = c;
        } else {
            c->next = a->first;
            a->first = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void cv_ja_release(jarena *a)
{
    for (ja_chunk *c = a->first, *next; c; c = next) {
        next = c->next;
        cv_free(c);
    }
    cv_ja_unhold(a, a->used);
    a->first = NULL;
    a->used = 0;
}

void *cv_jr_alloc(jrender *r, int line, size_t n)
{
    void *p = cv_ja_alloc(&r->ar, n);
    if (!p)
        cv_jr_no_memory(r, line);
    return p;
}

int cv_jr_no_memory(jrender *r, int line)
{
    if (r->ar.pool_spent)
        return cv_jr_fail(r, line, "the memory that chat templates share (%llu MiB for all requests at once) is spent",
                       (unsigned long long)(r->ar.pool->limit >> 20));
    return cv_jr_fail(r, line, "the template used more than %zu bytes of memory", r->lim.max_memory);
}

int cv_jv_str_dup(jrender *r, int line, const char *p, size_t n, jv *out)
{
    char *s = cv_jr_alloc(r, line, n + 1);
    if (!s)
        return -1;
    if (n)
        memcpy(s, p, n);
    *out = jv_str(s, n);
    return 0;
}

/* ---- lists and dicts ---- */

jlist *cv_jl_new(jrender *r, int line, size_t cap)
{
    jlist *l = cv_jr_alloc(r, line, sizeof *l);
    if (!l)
        return NULL;
    if (cap > (SIZE_MAX / 2) / sizeof(jv)) {
        cv_jr_fail(r, line, "a list too large");
        return NULL;
    }
    if (cap && !(l->v = cv_jr_alloc(r, line, cap * sizeof(jv))))
        return NULL;
    l->cap = cap;
    return l;
}

int cv_jl_push(jrender *r, int line, jlist *l, jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        if (cap > (SIZE_MAX / 2) / sizeof(jv))
            return cv_jr_fail(r, line, "a list too large");
        jv *nv = cv_jr_alloc(r, line, cap * sizeof(jv));
        if (!nv)
            return -1;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

jdict *cv_jd_new(jrender *r, int line, size_t cap)
{
    jdict *d = cv_jr_alloc(r, line, sizeof *d);
    if (!d)
        return NULL;
    if (cap > (SIZE_MAX / 4) / sizeof(jv)) {
        cv_jr_fail(r, line, "a dict too large");
        return NULL;
    }
    if (cap && (!(d->k = cv_jr_alloc(r, line, cap * sizeof(jv))) || !(d->v = cv_jr_alloc(r, line, cap * sizeof(jv)))))
        return NULL;
    d->cap = cap;
    return d;
}

jv *cv_jd_get(jrender *r, int line, const jdict *d, jv k)
{
    if (cv_jr_work(r, line, d->n / 16) != 0)
        return NULL;
    if (k.t == JV_STR)
        return cv_jd_get_str(d, k.u.s.p, k.u.s.n);
    for (size_t i = 0; i < d->n && !r->failed; i++)
        if (d->k[i].t != JV_STR && cv_jv_equal(r, line, d->k[i], k))
            return &d->v[i];
    return NULL;
}

jv *cv_jd_get_str(const jdict *d, const char *p, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, p, n) == 0)
            return &d->v[i];
    return NULL;
}

int cv_jd_set(jrender *r, int line, jdict *d, jv k, jv v)
{
    jv *old = cv_jd_get(r, line, d, k);
    if (r->failed)
        return -1;
    if (old) {
        *old = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        if (cap > (SIZE_MAX / 4) / sizeof(jv))
            return cv_jr_fail(r, line, "a dict too large");
        jv *nk = cv_jr_alloc(r, line, cap * sizeof(jv)), *nv = nk ? cv_jr_alloc(r, line, cap * sizeof(jv)) : NULL;
        if (!nv)
            return -1;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

/* ---- truth, equality, order ---- */

bool cv_jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n > 0;
    case JV_LIST: return v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

static int64_t int_of(jv v) { return v.t == JV_BOOL ? (int64_t)v.u.b : v.u.i; }
static double num_of(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)int_of(v); }

static bool equal(jrender *r, int line, jv a, jv b, int depth);

static bool dicts_equal(jrender *r, int line, const jdict *a, const jdict *b, int depth)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        const jv *w = cv_jd_get(r, line, b, a->k[i]);
        if (!w || !equal(r, line, a->v[i], *w, depth + 1))
            return false;
    }
    return true;
}

/* Each pair compared is a step: values that share their parts compare in
 * time exponential in their depth ([a] * 100, six deep, is 10^12 pairs). */
static bool equal(jrender *r, int line, jv a, jv b, int depth)
{
    if (depth > MAX_VALUE_DEPTH || cv_jr_work(r, line, 1) != 0)
        return false;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT)
            return num_of(a) == num_of(b);
        return int_of(a) == int_of(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l == b.u.l)
            return true;
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal(r, line, a.u.l->v[i], b.u.l->v[i], depth + 1))
                return false;
        return true;
    case JV_DICT: return a.u.d == b.u.d || dicts_equal(r, line, a.u.d, b.u.d, depth);
    case JV_FUNC: return a.u.fn->id == b.u.fn->id && equal(r, line, a.u.fn->self, b.u.fn->self, depth + 1);
    default: return a.u.d == b.u.d; /* identity: namespaces, macros, loops */
    }
}

bool cv_jv_equal(jrender *r, int line, jv a, jv b) { return equal(r, line, a, b, 0); }

const char *cv_jv_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "builtin_function_or_method";
    default: return "LoopContext";
    }
}

/* *scanned: the bytes looked at, for the step count. */
static int cmp_str(jstr a, jstr b, bool fold, size_t *scanned)
{
    size_t i = 0, j = 0;
    while (i < a.n && j < b.n) {
        size_t la, lb;
        uint32_t x = cv_jt_decode(a.p + i, a.n - i, &la), y = cv_jt_decode(b.p + j, b.n - j, &lb);
        if (fold)
            x = cv_jt_lower(x), y = cv_jt_lower(y);
        *scanned = i + la;
        if (x != y)
            return x < y ? -1 : 1;
        i += la;
        j += lb;
    }
    return (i < a.n) - (j < b.n);
}

/* A comparison is a step, and so is every 2 bytes of strings compared (a
 * step of the evaluator costs about as much as decoding and folding 2 or 3):
 * sorting long strings that share a prefix once took 13 s within the step
 * limit. */
static int cmp(jrender *r, int line, jv a, jv b, bool fold, int depth, int *out)
{
    if (depth > MAX_VALUE_DEPTH)
        return cv_jr_fail(r, line, "values nested too deeply to compare");
    if (cv_jr_work(r, line, 1) != 0)
        return -1;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT) {
            double x = num_of(a), y = num_of(b);
            *out = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = int_of(a), y = int_of(b);
            *out = x < y ? -1 : x > y ? 1 : 0;
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t scanned = 0;
        *out = cmp_str(a.u.s, b.u.s, fold, &scanned);
        return cv_jr_work(r, line, scanned / 2);
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (cmp(r, line, a.u.l->v[i], b.u.l->v[i], fold, depth + 1, out) != 0)
                return -1;
            if (*out != 0)
                return 0;
        }
        *out = (a.u.l->n > n) - (b.u.l->n > n);
        return 0;
    }
    return cv_jr_fail(r, line, "'<' not supported between instances of '%s' and '%s'", cv_jv_type_name(a),
                   cv_jv_type_name(b));
}

int cv_jv_cmp(jrender *r, int line, jv a, jv b, bool fold, int *out) { return cmp(r, line, a, b, fold, 0, out); }

/* ---- str() and repr() ---- */

static int write_int(jrender *r, jbuf *b, int line, int64_t i)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld", (long long)i);
    return cv_jb_put(r, b, line, buf, (size_t)n);
}

static int write_float(jrender *r, jbuf *b, int line, double f)
{
    char buf[32];
    cv_jt_float_repr(f, buf);
    return jb_puts(r, b, line, buf);
}

/* Python's str.isprintable() for a code point above U+007E. */
static bool printable(uint32_t cp)
{
    if (cp < 0xa0 || cp == 0xad || cv_jt_is_space(cp))
        return false;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61c || cp == 0x6dd || cp == 0x70f || cp == 0x180e)
        return false;
    if ((cp >= 0x200b && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x206f))
        return false;
    if (cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) || (cp >= 0xd800 && cp <= 0xf8ff))
        return false;
    if ((cp & 0xfffe) == 0xfffe || cp >= 0xf0000 || (cp >= 0xe0000 && cp <= 0xe007f))
        return false;
    return true;
}

static int write_repr_str(jrender *r, jbuf *b, int line, jstr s)
{
    bool has_single = memchr(s.p, '\'', s.n) != NULL, has_double = memchr(s.p, '"', s.n) != NULL;
    char q = has_single && !has_double ? '"' : '\'';
    if (cv_jb_put(r, b, line, &q, 1) != 0)
        return -1;
    for (size_t i = 0; i < s.n;) {
        size_t len;
        uint32_t cp = cv_jt_decode(s.p + i, s.n - i, &len);
        char esc[16];
        int rc;
        if (cp == (uint32_t)q || cp == '\\')
            rc = (esc[0] = '\\', esc[1] = (char)cp, cv_jb_put(r, b, line, esc, 2));
        else if (cp == '\n' || cp == '\r' || cp == '\t')
            rc = jb_puts(r, b, line, cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t");
        else if (cp < 0x20 || cp == 0x7f || (cp > 0x7e && !printable(cp)))
            rc = cv_jb_put(r, b, line, esc,
                        (size_t)snprintf(esc, sizeof esc, cp <= 0xff ? "\\x%02x" : cp <= 0xffff ? "\\u%04x" : "\\U%08x",
                                         cp));
        else
            rc = cv_jb_put(r, b, line, s.p + i, len);
        if (rc != 0)
            return -1;
        i += len;
    }
    return cv_jb_put(r, b, line, &q, 1);
}

static int write_items(jrender *r, jbuf *b, int line, const jv *k, const jv *v, size_t n, int depth)
{
    for (size_t i = 0; i < n; i++) {
        if (i && jb_puts(r, b, line, ", ") != 0)
            return -1;
        if (k && (cv_jv_write_repr(r, b, line, k[i], depth + 1) != 0 || jb_puts(r, b, line, ": ") != 0))
            return -1;
        if (cv_jv_write_repr(r, b, line, v[i], depth + 1) != 0)
            return -1;
    }
    return 0;
}

int cv_jv_write_repr(jrender *r, jbuf *b, int line, jv v, int depth)
{
    if (cv_jr_work(r, line, 1) != 0)
        return -1;
    if (depth > MAX_VALUE_DEPTH)
        return jb_puts(r, b, line, "...");
    switch (v.t) {
    case JV_UNDEF: return jb_puts(r, b, line, "Undefined");
    case JV_STR: return write_repr_str(r, b, line, v.u.s);
    case JV_LIST: {
        const jlist *l = v.u.l;
        if (jb_puts(r, b, line, l->tuple ? "(" : "[") != 0 || write_items(r, b, line, NULL, l->v, l->n, depth) != 0)
            return -1;
        return jb_puts(r, b, line, l->tuple ? (l->n == 1 ? ",)" : ")") : "]");
    }
    case JV_DICT:
        if (jb_puts(r, b, line, "{") != 0 || write_items(r, b, line, v.u.d->k, v.u.d->v, v.u.d->n, depth) != 0)
            return -1;
        return jb_puts(r, b, line, "}");
    case JV_NS:
        if (jb_puts(r, b, line, "<Namespace {") != 0 ||
            write_items(r, b, line, v.u.d->k, v.u.d->v, v.u.d->n, depth) != 0)
            return -1;
        return jb_puts(r, b, line, "}>");
    default: return cv_jv_write_str(r, b, line, v);
    }
}

int cv_jv_write_str(jrender *r, jbuf *b, int line, jv v)
{
    switch (v.t) {
    case JV_UNDEF: return 0;
    case JV_NONE: return jb_puts(r, b, line, "None");
    case JV_BOOL: return jb_puts(r, b, line, v.u.b ? "True" : "False");
    case JV_INT: return write_int(r, b, line, v.u.i);
    case JV_FLOAT: return write_float(r, b, line, v.u.f);
    case JV_STR: return cv_jb_put(r, b, line, v.u.s.p, v.u.s.n);
    case JV_MACRO:
        if (jb_puts(r, b, line, "<Macro '") != 0)
            return -1;
        if (v.u.m->def->kind == N_MACRO)
            return cv_jb_put(r, b, line, v.u.m->def->val.u.s.p, v.u.m->def->val.u.s.n) != 0 ? -1
                                                                                    : jb_puts(r, b, line, "'>");
        return jb_puts(r, b, line, "caller'>");
    case JV_FUNC: return jb_puts(r, b, line, "<built-in method>");
    case JV_LOOP: {
        char buf[64];
        int n = snprintf(buf, sizeof buf, "<LoopContext %zu/%zu>", v.u.lp->i + 1, v.u.lp->items->n);
        return cv_jb_put(r, b, line, buf, (size_t)n);
    }
    default: return cv_jv_write_repr(r, b, line, v, 0);
    }
}

int cv_jv_to_str(jrender *r, int line, jv v, jv *out)
{
    if (v.t == JV_STR) {
        *out = v;
        return 0;
    }
    if (v.t == JV_UNDEF) {
        *out = jv_str("", 0);
        return 0;
    }
    jbuf b = {0};
    if (cv_jv_write_str(r, &b, line, v) != 0) {
        cv_jb_free(&b);
        return -1;
    }
    return cv_jb_take(r, &b, line, out);
}

/* ---- JSON ---- */

/* A code point above U+007F as ensure_ascii writes it (a surrogate pair above U+FFFF). */
static int json_u_escape(jrender *r, jbuf *b, int line, uint32_t cp)
{
    char esc[16];
    int n = cp > 0xffff ? snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10),
                                   0xdc00 + ((cp - 0x10000) & 0x3ff))
                        : snprintf(esc, sizeof esc, "\\u%04x", cp);
    return cv_jb_put(r, b, line, esc, (size_t)n);
}

static int json_str_out(jrender *r, jbuf *b, int line, jstr s, bool ascii)
{
    if (jb_puts(r, b, line, "\"") != 0)
        return -1;
    size_t from = 0;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        if (c >= 0x80 && ascii) {
            size_t len;
            uint32_t cp = cv_jt_decode(s.p + i, s.n - i, &len);
            if (cv_jb_put(r, b, line, s.p + from, i - from) != 0 || json_u_escape(r, b, line, cp) != 0)
                return -1;
            i += len - 1;
            from = i + 1;
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        char esc[8];
        static const char named[] = "\b\f\n\r\t", letters[] = "bfnrt";
        const char *k = c ? strchr(named, c) : NULL;
        int n = c == '"' || c == '\\' ? snprintf(esc, sizeof esc, "\\%c", c)
                : k                   ? snprintf(esc, sizeof esc, "\\%c", letters[k - named])
                                      : snprintf(esc, sizeof esc, "\\u%04x", c);
        if (cv_jb_put(r, b, line, s.p + from, i - from) != 0 || cv_jb_put(r, b, line, esc, (size_t)n) != 0)
            return -1;
        from = i + 1;
    }
    if (cv_jb_put(r, b, line, s.p + from, s.n - from) != 0)
        return -1;
    return jb_puts(r, b, line, "\"");
}

static int json_newline(jrender *r, jbuf *b, int line, const jjson_opts *o, int level)
{
    if (o->indent < 0)
        return 0;
    if (jb_puts(r, b, line, "\n") != 0)
        return -1;
    for (int i = 0; i < level * o->indent; i++)
        if (jb_puts(r, b, line, " ") != 0)
            return -1;
    return 0;
}

/* A dict key as json.dumps writes it: strings as they are, scalars as text. */
static int json_key(jrender *r, jbuf *b, int line, jv k, bool ascii)
{
    if (k.t == JV_STR)
        return json_str_out(r, b, line, k.u.s, ascii);
    if (k.t == JV_NONE || k.t == JV_BOOL)
        return jb_puts(r, b, line, k.t == JV_NONE ? "\"null\"" : k.u.b ? "\"true\"" : "\"false\"");
    if (k.t != JV_INT && k.t != JV_FLOAT)
        return cv_jr_fail(r, line, "keys must be str, int, float, bool or None, not %s", cv_jv_type_name(k));
    if (jb_puts(r, b, line, "\"") != 0 || cv_jv_write_str(r, b, line, k) != 0)
        return -1;
    return jb_puts(r, b, line, "\"");
}

/* The order json.dumps(sort_keys=True) writes a dict's entries in. */
static int sorted_order(jrender *r, int line, const jdict *d, size_t *idx)
{
    for (size_t i = 0; i < d->n; i++) {
        size_t j = i;
        int c = 0;
        while (j > 0) {
            if (cv_jr_work(r, line, 1) != 0 || cv_jv_cmp(r, line, d->k[idx[j - 1]], d->k[i], false, &c) != 0)
                return -1;
            if (c <= 0)
                break;
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    return 0;
}

static int json_dict(jrender *r, jbuf *b, int line, const jdict *d, const jjson_opts *o, int depth)
{
    size_t *idx = NULL;
    if (o->sort_keys && d->n && (!(idx = cv_jr_alloc(r, line, d->n * sizeof *idx)) || sorted_order(r, line, d, idx)))
        return -1;
    if (jb_puts(r, b, line, "{") != 0)
        return -1;
    for (size_t k = 0; k < d->n; k++) {
        size_t i = idx ? idx[k] : k;
        if ((k && cv_jb_put(r, b, line, o->item_sep.p, o->item_sep.n) != 0) || json_newline(r, b, line, o, depth + 1) ||
            json_key(r, b, line, d->k[i], o->ascii) || cv_jb_put(r, b, line, o->key_sep.p, o->key_sep.n) ||
            cv_jv_write_json(r, b, line, d->v[i], o, depth + 1))
            return -1;
    }
    if (d->n && json_newline(r, b, line, o, depth) != 0)
        return -1;
    return jb_puts(r, b, line, "}");
}

static int json_list(jrender *r, jbuf *b, int line, const jlist *l, const jjson_opts *o, int depth)
{
    if (jb_puts(r, b, line, "[") != 0)
        return -1;
    for (size_t i = 0; i < l->n; i++)
        if ((i && cv_jb_put(r, b, line, o->item_sep.p, o->item_sep.n) != 0) || json_newline(r, b, line, o, depth + 1) ||
            cv_jv_write_json(r, b, line, l->v[i], o, depth + 1))
            return -1;
    if (l->n && json_newline(r, b, line, o, depth) != 0)
        return -1;
    return jb_puts(r, b, line, "]");
}

int cv_jv_write_json(jrender *r, jbuf *b, int line, jv v, const jjson_opts *o, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return cv_jr_fail(r, line, "tojson: circular reference detected (or values nested too deeply)");
    if (cv_jr_work(r, line, 1) != 0)
        return -1;
    switch (v.t) {
    case JV_NONE: return jb_puts(r, b, line, "null");
    case JV_BOOL: return jb_puts(r, b, line, v.u.b ? "true" : "false");
    case JV_INT: return write_int(r, b, line, v.u.i);
    case JV_FLOAT:
        if (isnan(v.u.f) || isinf(v.u.f))
            return jb_puts(r, b, line, isnan(v.u.f) ? "NaN" : v.u.f > 0 ? "Infinity" : "-Infinity");
        return write_float(r, b, line, v.u.f);
    case JV_STR: return json_str_out(r, b, line, v.u.s, o->ascii);
    case JV_LIST: return json_list(r, b, line, v.u.l, o, depth);
    case JV_DICT: return json_dict(r, b, line, v.u.d, o, depth);
    default: return cv_jr_fail(r, line, "tojson: Object of type %s is not JSON serializable", cv_jv_type_name(v));
    }
}

static int from_object(jrender *r, int line, const json_t *j, bool copy, jv *out, int depth)
{
    jdict *d = cv_jd_new(r, line, json_object_size(j));
    if (!d)
        return -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key, val) {
        jv v;
        jv k = jv_str(key, strlen(key));
        if (cv_jv_from_json(r, line, val, copy, &v, depth + 1) != 0 ||
            (copy && cv_jv_str_dup(r, line, key, k.u.s.n, &k)))
            return -1;
        d->k[d->n] = k;
        d->v[d->n++] = v;
    }
    *out = jv_dict(d);
    return 0;
}

int cv_jv_from_json(jrender *r, int line, const json_t *j, bool copy, jv *out, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return cv_jr_fail(r, line, "JSON nested more than %d deep", MAX_VALUE_DEPTH);
    if (cv_jr_work(r, line, 1) != 0)
        return -1;
    switch (json_typeof(j)) {
    case JSON_OBJECT: return from_object(r, line, j, copy, out, depth);
    case JSON_ARRAY: {
        jlist *l = cv_jl_new(r, line, json_array_size(j));
        if (!l)
            return -1;
        for (size_t i = 0; i < json_array_size(j); i++)
            if (cv_jv_from_json(r, line, json_array_get(j, i), copy, &l->v[l->n++], depth + 1) != 0)
                return -1;
        *out = jv_list(l);
        return 0;
    }
    case JSON_STRING:
        *out = jv_str(json_string_value(j), json_string_length(j));
        return copy ? cv_jv_str_dup(r, line, out->u.s.p, out->u.s.n, out) : 0;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_TRUE: *out = jv_bool(true); return 0;
    case JSON_FALSE: *out = jv_bool(false); return 0;
    default: *out = jv_none(); return 0;
    }
}
