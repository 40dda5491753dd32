/* jinja_expr.c: expressions of the Jinja engine (jinja_impl.h): names,
 * literals, operators with Python's semantics (64-bit integers that fail on
 * overflow, floor division and modulo by the divisor's sign, str * n,
 * list + list, str % args), comparisons, attribute and item access with
 * Jinja's sandbox order (an attribute first for obj.name, an item first
 * for obj[key]), slices, calls, filters and tests.
 *
 * Undefined: a missing variable or attribute evaluates to Undefined
 * carrying its name; printing, truth, `is defined`, iteration and length
 * accept it, and everything else that Jinja refuses fails here with
 * Jinja's message ("'foo' is undefined", "'dict object' has no attribute
 * 'x'"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "chat/jinja_impl.h"

/* jv.aux of an undefined attribute of a tuple (beyond the JV_* types). */
#define AUX_TUPLE (JV_LOOP + 1)

static const char *object_name(int t)
{
    if (t == AUX_TUPLE)
        return "tuple object";
    static const char *const names[] = {[JV_NONE] = "None",          [JV_BOOL] = "bool object",
                                        [JV_INT] = "int object",     [JV_FLOAT] = "float object",
                                        [JV_STR] = "str object",     [JV_LIST] = "list object",
                                        [JV_DICT] = "dict object",   [JV_NS] = "Namespace object",
                                        [JV_MACRO] = "Macro object", [JV_FUNC] = "function object",
                                        [JV_LOOP] = "LoopContext object"};
    return t > JV_UNDEF && t <= JV_LOOP ? names[t] : "object";
}

/* Jinja's UndefinedError for using u. */
int cv_je_undefined(jrender *r, int line, jv u)
{
    if (u.u.s.n == 0)
        return cv_jr_fail(r, line, "an undefined value was used");
    if (u.aux == JV_UNDEF)
        return cv_jr_fail(r, line, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p);
    return cv_jr_fail(r, line, "'%s' has no attribute '%.*s'", object_name(u.aux), (int)u.u.s.n, u.u.s.p);
}

static jv missing(jv obj, jstr name)
{
    jv u = {JV_UNDEF, (uint8_t)(obj.t == JV_LIST && obj.u.l->tuple ? AUX_TUPLE : obj.t), {.s = name}};
    return u;
}

/* ---- attributes and items ---- */

static int loop_attr(jrender *r, int line, jv obj, jstr name, jv *out)
{
    const jloop *lp = obj.u.lp;
    size_t i = lp->i, n = lp->items->n;
    static const char *const names[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                        "previtem", "nextitem", "depth", "depth0", "cycle"};
    int k = 0;
    while (k < 12 && !(strlen(names[k]) == name.n && memcmp(names[k], name.p, name.n) == 0))
        k++;
    switch (k) {
    case 0: *out = jv_int((int64_t)i + 1); return 0;
    case 1: *out = jv_int((int64_t)i); return 0;
    case 2: *out = jv_int((int64_t)(n - i)); return 0;
    case 3: *out = jv_int((int64_t)(n - i - 1)); return 0;
    case 4: *out = jv_bool(i == 0); return 0;
    case 5: *out = jv_bool(i + 1 == n); return 0;
    case 6: *out = jv_int((int64_t)n); return 0;
    case 7: *out = i > 0 ? lp->items->v[i - 1] : missing(obj, name); return 0;
    case 8: *out = i + 1 < n ? lp->items->v[i + 1] : missing(obj, name); return 0;
    case 9: *out = jv_int(1); return 0;
    case 10: *out = jv_int(0); return 0;
    case 11: {
        jfunc *fn = cv_jr_alloc(r, line, sizeof *fn);
        if (!fn)
            return -1;
        fn->id = JM_CYCLE;
        fn->self = obj;
        *out = (jv){JV_FUNC, 0, {.fn = fn}};
        return 0;
    }
    default: *out = missing(obj, name); return 0;
    }
}

int cv_je_getattr(jrender *r, int line, jv obj, jstr name, jv *out)
{
    if (obj.t == JV_UNDEF)
        return cv_je_undefined(r, line, obj);
    if (obj.t == JV_LOOP)
        return loop_attr(r, line, obj, name, out);
    if (obj.t == JV_NS) {
        const jv *v = cv_jd_get_str(obj.u.d, name.p, name.n);
        *out = v ? *v : missing(obj, name);
        return 0;
    }
    if (cv_jm_method(r, line, obj, name, out))
        return r->failed ? -1 : 0;
    const jv *v = NULL;
    if (obj.t == JV_DICT) {
        if (cv_jr_work(r, line, obj.u.d->n / 16) != 0)
            return -1;
        v = cv_jd_get_str(obj.u.d, name.p, name.n);
    }
    *out = v ? *v : missing(obj, name);
    return 0;
}

/* Python's index of a sequence of n items (negative from the end), or -1. */
static int64_t seq_index(jv key, size_t n)
{
    if (key.t != JV_INT && key.t != JV_BOOL)
        return -1;
    int64_t i = key.t == JV_BOOL ? key.u.b : key.u.i;
    if (i < 0)
        i += (int64_t)n;
    return i >= 0 && (uint64_t)i < n ? i : -1;
}

static jstr key_name(jv key) { return key.t == JV_STR ? key.u.s : (jstr){"", 0}; }

int cv_je_getitem(jrender *r, int line, jv obj, jv key, jv *out)
{
    if (obj.t == JV_UNDEF)
        return cv_je_undefined(r, line, obj);
    const jv *v = NULL;
    if (obj.t == JV_DICT) {
        bool hashable = !(key.t == JV_LIST && !key.u.l->tuple) && key.t != JV_DICT && key.t != JV_NS;
        v = hashable ? cv_jd_get(r, line, obj.u.d, key) : NULL;
        if (r->failed)
            return -1;
    } else if (obj.t == JV_LIST) {
        int64_t i = seq_index(key, obj.u.l->n);
        v = i >= 0 ? &obj.u.l->v[i] : NULL;
    } else if (obj.t == JV_STR && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = seq_index(key, cv_jt_count(obj.u.s));
        if (i >= 0) {
            size_t from = cv_jt_offset(obj.u.s, (size_t)i), len;
            cv_jt_decode(obj.u.s.p + from, obj.u.s.n - from, &len);
            *out = jv_str(obj.u.s.p + from, len);
            return 0;
        }
    }
    if (v) {
        *out = *v;
        return 0;
    }
    if (key.t == JV_STR && obj.t != JV_DICT)
        return cv_je_getattr(r, line, obj, key.u.s, out);
    if (key.t == JV_STR && cv_jm_method(r, line, obj, key.u.s, out))
        return r->failed ? -1 : 0;
    *out = missing(obj, key_name(key));
    return 0;
}

int cv_je_getpath(jrender *r, int line, jv obj, jstr path, jv *out)
{
    *out = obj;
    size_t i = 0;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.p[j] != '.')
            j++;
        jstr part = {path.p + i, j - i};
        int64_t k;
        int rc = cv_jt_parse_int(part, 10, &k) && part.n > 0 && part.p[0] >= '0' && part.p[0] <= '9'
                     ? cv_je_getitem(r, line, *out, jv_int(k), out)
                     : cv_je_getitem(r, line, *out, jv_str(part.p, part.n), out);
        if (rc != 0)
            return -1;
        i = j + 1;
    }
    return 0;
}

int cv_je_iterate(jrender *r, int line, jv v, jlist **out)
{
    switch (v.t) {
    case JV_UNDEF: return (*out = cv_jl_new(r, line, 0)) ? 0 : -1;
    case JV_LIST:
    case JV_DICT: {
        size_t n = v.t == JV_LIST ? v.u.l->n : v.u.d->n;
        if (!(*out = cv_jl_new(r, line, n)))
            return -1;
        if (n)
            memcpy((*out)->v, v.t == JV_LIST ? v.u.l->v : v.u.d->k, n * sizeof(jv));
        (*out)->n = n;
        return cv_jr_work(r, line, n / 16);
    }
    case JV_STR: {
        if (!(*out = cv_jl_new(r, line, v.u.s.n)))
            return -1;
        for (size_t i = 0, len; i < v.u.s.n; i += len) {
            cv_jt_decode(v.u.s.p + i, v.u.s.n - i, &len);
            (*out)->v[(*out)->n++] = jv_str(v.u.s.p + i, len);
        }
        return cv_jr_work(r, line, v.u.s.n / 16);
    }
    default: return cv_jr_fail(r, line, "'%s' object is not iterable", cv_jv_type_name(v));
    }
}

/* ---- arithmetic ---- */

static int type_error(jrender *r, int line, const char *op, jv a, jv b)
{
    if (a.t == JV_UNDEF)
        return cv_je_undefined(r, line, a);
    if (b.t == JV_UNDEF)
        return cv_je_undefined(r, line, b);
    if (a.t == JV_STR && !strcmp(op, "+"))
        return cv_jr_fail(r, line, "can only concatenate str (not \"%s\") to str", cv_jv_type_name(b));
    return cv_jr_fail(r, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, cv_jv_type_name(a),
                   cv_jv_type_name(b));
}

static int64_t ival(jv v) { return v.t == JV_BOOL ? (int64_t)v.u.b : v.u.i; }
static double fval(jv v) { return v.t == JV_FLOAT ? v.u.f : (double)ival(v); }

static int int_pow(jrender *r, int line, int64_t base, int64_t e, jv *out)
{
    int64_t acc = 1;
    while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
            return cv_jr_fail(r, line, "integer overflow in **");
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base))
            return cv_jr_fail(r, line, "integer overflow in **");
    }
    *out = jv_int(acc);
    return 0;
}

static int int_arith(jrender *r, int line, int op, int64_t a, int64_t b, jv *out)
{
    int64_t v = 0;
    bool over = false;
    switch (op) {
    case OP_ADD: over = __builtin_add_overflow(a, b, &v); break;
    case OP_SUB: over = __builtin_sub_overflow(a, b, &v); break;
    case OP_MUL: over = __builtin_mul_overflow(a, b, &v); break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (b == 0)
            return cv_jr_fail(r, line, "integer division or modulo by zero");
        if (a == INT64_MIN && b == -1) {
            over = op == OP_FLOORDIV;
            break;
        }
        v = op == OP_FLOORDIV ? a / b - ((a % b != 0) && ((a < 0) != (b < 0))) : a % b;
        if (op == OP_MOD && v != 0 && ((v < 0) != (b < 0)))
            v += b;
        break;
    case OP_POW:
        if (b < 0) {
            if (a == 0)
                return cv_jr_fail(r, line, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow((double)a, (double)b));
            return 0;
        }
        return int_pow(r, line, a, b, out);
    default: *out = jv_float((double)a / (double)b); return b == 0 ? cv_jr_fail(r, line, "division by zero") : 0;
    }
    if (over)
        return cv_jr_fail(r, line, "integer overflow");
    *out = jv_int(v);
    return 0;
}

static int float_arith(jrender *r, int line, int op, double a, double b, jv *out)
{
    double v;
    switch (op) {
    case OP_ADD: v = a + b; break;
    case OP_SUB: v = a - b; break;
    case OP_MUL: v = a * b; break;
    case OP_POW:
        if (a == 0 && b < 0)
            return cv_jr_fail(r, line, "0.0 cannot be raised to a negative power");
        v = pow(a, b);
        break;
    default:
        if (b == 0)
            return cv_jr_fail(r, line, "float division by zero");
        if (op == OP_DIV) {
            v = a / b;
        } else { /* Python's float divmod */
            double m = fmod(a, b), div = (a - m) / b;
            if (m != 0 && ((m < 0) != (b < 0))) {
                m += b;
                div -= 1.0;
            }
            double fl = floor(div);
            fl += div - fl > 0.5;
            v = op == OP_MOD ? m : div != 0 ? fl : copysign(0.0, a / b);
        }
    }
    *out = jv_float(v);
    return 0;
}

/* str * n and list * n. */
static int repeat(jrender *r, int line, jv seq, int64_t times, jv *out)
{
    size_t unit = seq.t == JV_STR ? seq.u.s.n : seq.u.l->n * sizeof(jv);
    size_t count = times > 0 ? (size_t)times : 0;
    if (count && unit > r->lim.max_output / count)
        return cv_jr_fail(r, line, "a repetition larger than %zu bytes", r->lim.max_output);
    if (cv_jr_work(r, line, unit * count / 64) != 0)
        return -1;
    if (seq.t == JV_STR) {
        char *p = cv_jr_alloc(r, line, unit * count + 1);
        if (!p)
            return -1;
        for (size_t i = 0; i < count && unit; i++)
            memcpy(p + i * unit, seq.u.s.p, unit);
        *out = jv_str(p, unit * count);
        return 0;
    }
    jlist *l = cv_jl_new(r, line, seq.u.l->n * count);
    if (!l)
        return -1;
    for (size_t i = 0; i < count; i++)
        for (size_t k = 0; k < seq.u.l->n; k++)
            l->v[l->n++] = seq.u.l->v[k];
    l->tuple = seq.u.l->tuple;
    *out = jv_list(l);
    return 0;
}

static int concat_lists(jrender *r, int line, const jlist *a, const jlist *b, jv *out)
{
    jlist *l = cv_jl_new(r, line, a->n + b->n);
    if (!l)
        return -1;
    if (a->n)
        memcpy(l->v, a->v, a->n * sizeof(jv));
    if (b->n)
        memcpy(l->v + a->n, b->v, b->n * sizeof(jv));
    l->n = a->n + b->n;
    l->tuple = a->tuple;
    *out = jv_list(l);
    return cv_jr_work(r, line, l->n / 16);
}

static const char *op_text(int op)
{
    static const char *const t[] = {[OP_ADD] = "+", [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/",
                                    [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**"};
    return t[op];
}

static int binop(jrender *r, int line, int op, jv a, jv b, jv *out)
{
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT || op == OP_DIV)
            return op == OP_DIV && a.t != JV_FLOAT && b.t != JV_FLOAT
                       ? int_arith(r, line, op, ival(a), ival(b), out)
                       : float_arith(r, line, op, fval(a), fval(b), out);
        return int_arith(r, line, op, ival(a), ival(b), out);
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        char *p = cv_jr_alloc(r, line, a.u.s.n + b.u.s.n + 1);
        if (!p || cv_jr_work(r, line, (a.u.s.n + b.u.s.n) / 64) != 0)
            return -1;
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        *out = jv_str(p, a.u.s.n + b.u.s.n);
        return 0;
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple)
        return concat_lists(r, line, a.u.l, b.u.l, out);
    if (op == OP_MUL && (a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))
        return repeat(r, line, a, ival(b), out);
    if (op == OP_MUL && (b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL))
        return repeat(r, line, b, ival(a), out);
    if (op == OP_MOD && a.t == JV_STR)
        return cv_jm_percent(r, line, a.u.s, b, out);
    return type_error(r, line, op_text(op), a, b);
}

/* ---- comparisons ---- */

int cv_je_contains(jrender *r, int line, jv item, jv seq, bool *out)
{
    switch (seq.t) {
    case JV_UNDEF: *out = false; return 0;
    case JV_STR:
        if (item.t != JV_STR)
            return cv_jr_fail(r, line, "'in <string>' requires string as left operand, not %s", cv_jv_type_name(item));
        *out = item.u.s.n == 0 || memmem(seq.u.s.p, seq.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return cv_jr_work(r, line, seq.u.s.n / 64);
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < seq.u.l->n && !*out && !r->failed; i++)
            *out = cv_jv_equal(r, line, item, seq.u.l->v[i]);
        return r->failed ? -1 : 0;
    case JV_DICT:
        if ((item.t == JV_LIST && !item.u.l->tuple) || item.t == JV_DICT || item.t == JV_NS)
            return cv_jr_fail(r, line, "unhashable type: '%s'", cv_jv_type_name(item));
        *out = cv_jd_get(r, line, seq.u.d, item) != NULL;
        return r->failed ? -1 : 0;
    default: return cv_jr_fail(r, line, "argument of type '%s' is not iterable", cv_jv_type_name(seq));
    }
}

static int compare(jrender *r, int line, int op, jv a, jv b, bool *out)
{
    int c;
    switch (op) {
    case OP_EQ: *out = cv_jv_equal(r, line, a, b); return r->failed ? -1 : 0;
    case OP_NE: *out = !cv_jv_equal(r, line, a, b); return r->failed ? -1 : 0;
    case OP_IN: return cv_je_contains(r, line, a, b, out);
    case OP_NOTIN:
        if (cv_je_contains(r, line, a, b, out) != 0)
            return -1;
        *out = !*out;
        return 0;
    default:
        if (a.t == JV_UNDEF || b.t == JV_UNDEF)
            return cv_je_undefined(r, line, a.t == JV_UNDEF ? a : b);
        if (cv_jv_cmp(r, line, a, b, false, &c) != 0)
            return -1;
        *out = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
        return 0;
    }
}

static int eval_compare(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv left;
    if (cv_je_expr(r, s, n->a, &left) != 0)
        return -1;
    bool ok = true;
    for (int i = 0; i < n->n && ok; i++) {
        jv right;
        if (cv_je_expr(r, s, n->v[i]->a, &right) != 0 || compare(r, n->v[i]->line, n->v[i]->op, left, right, &ok) != 0)
            return -1;
        left = right;
    }
    *out = jv_bool(ok);
    return 0;
}

/* ---- slices ---- */

static int slice_bound(jrender *r, jscope *s, const jnode *n, bool *given, int64_t *v)
{
    *given = false;
    if (!n)
        return 0;
    jv x;
    if (cv_je_expr(r, s, n, &x) != 0)
        return -1;
    if (x.t == JV_NONE || x.t == JV_UNDEF)
        return 0;
    if (x.t != JV_INT && x.t != JV_BOOL)
        return cv_jr_fail(r, n->line, "slice indices must be integers or None");
    *given = true;
    *v = ival(x);
    return 0;
}

/* Python's slice.indices(len): the positions a slice takes, into idx. */
static size_t slice_positions(int64_t len, bool has[3], int64_t b[3], int64_t *idx)
{
    int64_t step = has[2] ? b[2] : 1, lo = step < 0 ? -1 : 0, hi = step < 0 ? len - 1 : len;
    int64_t start = has[0] ? b[0] : (step < 0 ? hi : lo), stop = has[1] ? b[1] : (step < 0 ? lo : hi);
    if (has[0])
        start = start < 0 ? (start + len < lo ? lo : start + len) : (start > hi ? hi : start);
    if (has[1])
        stop = stop < 0 ? (stop + len < lo ? lo : stop + len) : (stop > hi ? hi : stop);
    size_t k = 0;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        idx[k++] = i;
    return k;
}

static int eval_slice(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv obj;
    bool has[3];
    int64_t b[3] = {0, 0, 0};
    if (cv_je_expr(r, s, n->a, &obj) != 0 || slice_bound(r, s, n->b, &has[0], &b[0]) != 0 ||
        slice_bound(r, s, n->c, &has[1], &b[1]) != 0 || slice_bound(r, s, n->d, &has[2], &b[2]) != 0)
        return -1;
    if (has[2] && b[2] == 0)
        return cv_jr_fail(r, n->line, "slice step cannot be zero");
    if (obj.t == JV_UNDEF)
        return cv_je_undefined(r, n->line, obj);
    if (obj.t != JV_STR && obj.t != JV_LIST)
        return cv_jr_fail(r, n->line, "'%s' object is not subscriptable", cv_jv_type_name(obj));
    jlist *items = NULL;
    if (obj.t == JV_STR ? cv_je_iterate(r, n->line, obj, &items) != 0 : !(items = obj.u.l))
        return -1;
    int64_t *idx = cv_jr_alloc(r, n->line, (items->n + 1) * sizeof *idx);
    jlist *res = idx ? cv_jl_new(r, n->line, items->n) : NULL;
    if (!res)
        return -1;
    size_t k = slice_positions((int64_t)items->n, has, b, idx);
    for (size_t i = 0; i < k; i++)
        res->v[res->n++] = items->v[idx[i]];
    res->tuple = items->tuple && obj.t == JV_LIST;
    if (obj.t == JV_LIST) {
        *out = jv_list(res);
        return 0;
    }
    jbuf buf = {0};
    for (size_t i = 0; i < res->n; i++)
        if (cv_jb_put(r, &buf, n->line, res->v[i].u.s.p, res->v[i].u.s.n) != 0) {
            cv_jb_free(&buf);
            return -1;
        }
    return cv_jb_take(r, &buf, n->line, out);
}

/* ---- calls, filters, tests ---- */

int cv_je_args(jrender *r, jscope *s, const jnode *n, const char *what, jargs *a)
{
    memset(a, 0, sizeof *a);
    a->what = what;
    a->line = n->line;
    if (n->n_kw > 32)
        return cv_jr_fail(r, n->line, "more than 32 keyword arguments");
    jv *pos = n->n ? cv_jr_alloc(r, n->line, (size_t)n->n * sizeof *pos) : NULL;
    jv *kw = n->n_kw ? cv_jr_alloc(r, n->line, (size_t)n->n_kw * sizeof *kw) : NULL;
    jstr *names = n->n_kw ? cv_jr_alloc(r, n->line, (size_t)n->n_kw * sizeof *names) : NULL;
    if ((n->n && !pos) || (n->n_kw && (!kw || !names)))
        return -1;
    for (int i = 0; i < n->n; i++)
        if (cv_je_expr(r, s, n->v[i], &pos[i]) != 0)
            return -1;
    for (int i = 0; i < n->n_kw; i++) {
        names[i] = n->kw[i]->val.u.s;
        if (cv_je_expr(r, s, n->kw[i]->a, &kw[i]) != 0)
            return -1;
    }
    a->pos = pos;
    a->n_pos = n->n;
    a->kw = kw;
    a->kw_name = names;
    a->n_kw = n->n_kw;
    return 0;
}

int cv_je_call(jrender *r, int line, jv fn, jargs *a, jv *out)
{
    if (fn.t == JV_MACRO)
        return cv_je_call_macro(r, line, fn.u.m, a, out);
    if (fn.t == JV_FUNC)
        return cv_jm_call(r, line, fn.u.fn, a, out);
    if (fn.t == JV_UNDEF)
        return cv_je_undefined(r, line, fn);
    return cv_jr_fail(r, line, "'%s' object is not callable", cv_jv_type_name(fn));
}

static int eval_call(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv fn;
    jargs a;
    if (cv_je_expr(r, s, n->a, &fn) != 0 || cv_je_args(r, s, n, "call", &a) != 0)
        return -1;
    return cv_je_call(r, n->line, fn, &a, out);
}

static int eval_filter(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv operand;
    jargs a;
    char what[80];
    snprintf(what, sizeof what, "filter '%.*s'", (int)n->val.u.s.n, n->val.u.s.p);
    if (cv_je_expr(r, s, n->a, &operand) != 0 || cv_je_args(r, s, n, what, &a) != 0)
        return -1;
    return cv_jf_filter(r, n->op, operand, &a, out);
}

static int eval_test(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv operand;
    jargs a;
    bool ok;
    char what[80];
    snprintf(what, sizeof what, "test '%.*s'", (int)n->val.u.s.n, n->val.u.s.p);
    if (cv_je_expr(r, s, n->a, &operand) != 0 || cv_je_args(r, s, n, what, &a) != 0 ||
        cv_jf_test(r, n->op, operand, &a, &ok) != 0)
        return -1;
    *out = jv_bool(n->flag ? !ok : ok);
    return 0;
}

/* ---- the rest ---- */

static int eval_name(jrender *r, jscope *s, const jnode *n, jv *out)
{
    static const int fn_of[JG_COUNT] = {[JG_RANGE] = JM_RANGE, [JG_NAMESPACE] = JM_NAMESPACE, [JG_DICT] = JM_DICT,
                                        [JG_RAISE] = JM_RAISE, [JG_STRFTIME] = JM_STRFTIME};
    const jv *v = cv_js_find(s, n->sym);
    if (v) {
        *out = *v;
        return 0;
    }
    int g = r->t->global_of[n->sym];
    if (g < 0) {
        *out = (jv){JV_UNDEF, JV_UNDEF, {.s = n->val.u.s}};
        return 0;
    }
    jfunc *fn = cv_jr_alloc(r, n->line, sizeof *fn);
    if (!fn)
        return -1;
    fn->id = fn_of[g];
    *out = (jv){JV_FUNC, 0, {.fn = fn}};
    return 0;
}

static int eval_collection(jrender *r, jscope *s, const jnode *n, jv *out)
{
    if (n->kind != N_DICT) {
        jlist *l = cv_jl_new(r, n->line, (size_t)n->n);
        if (!l)
            return -1;
        l->tuple = n->kind == N_TUPLE;
        for (int i = 0; i < n->n; i++)
            if (cv_je_expr(r, s, n->v[i], &l->v[l->n++]) != 0)
                return -1;
        *out = jv_list(l);
        return 0;
    }
    jdict *d = cv_jd_new(r, n->line, (size_t)n->n);
    if (!d)
        return -1;
    for (int i = 0; i < n->n; i++) {
        jv k, v;
        if (cv_je_expr(r, s, n->v[i], &k) != 0 || cv_je_expr(r, s, n->kw[i], &v) != 0)
            return -1;
        if ((k.t == JV_LIST && !k.u.l->tuple) || k.t == JV_DICT || k.t == JV_NS || k.t == JV_UNDEF)
            return cv_jr_fail(r, n->line, "unhashable type: '%s'", cv_jv_type_name(k));
        if (cv_jd_set(r, n->line, d, k, v) != 0)
            return -1;
    }
    *out = jv_dict(d);
    return 0;
}

static int eval_unary(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv x;
    if (cv_je_expr(r, s, n->a, &x) != 0)
        return -1;
    if (n->kind == N_NOT) {
        *out = jv_bool(!cv_jv_truthy(x));
        return 0;
    }
    if (x.t == JV_UNDEF)
        return cv_je_undefined(r, n->line, x);
    if (!jv_is_num(x))
        return cv_jr_fail(r, n->line, "bad operand type for unary %s: '%s'", n->kind == N_NEG ? "-" : "+",
                       cv_jv_type_name(x));
    if (n->kind == N_POS)
        *out = x.t == JV_BOOL ? jv_int(x.u.b) : x;
    else if (x.t == JV_FLOAT)
        *out = jv_float(-x.u.f);
    else if (ival(x) == INT64_MIN)
        return cv_jr_fail(r, n->line, "integer overflow");
    else
        *out = jv_int(-ival(x));
    return 0;
}

static int eval_concat(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jbuf b = {0};
    for (int i = 0; i < n->n; i++) {
        jv x;
        if (cv_je_expr(r, s, n->v[i], &x) != 0 || cv_jv_write_str(r, &b, n->line, x) != 0) {
            cv_jb_free(&b);
            return -1;
        }
    }
    return cv_jb_take(r, &b, n->line, out);
}

static int eval_node(jrender *r, jscope *s, const jnode *n, jv *out)
{
    jv a, b;
    switch (n->kind) {
    case N_CONST: *out = n->val; return 0;
    case N_NAME: return eval_name(r, s, n, out);
    case N_LIST:
    case N_TUPLE:
    case N_DICT: return eval_collection(r, s, n, out);
    case N_ATTR: return cv_je_expr(r, s, n->a, &a) != 0 ? -1 : cv_je_getattr(r, n->line, a, n->val.u.s, out);
    case N_ITEM:
        if (cv_je_expr(r, s, n->a, &a) != 0 || cv_je_expr(r, s, n->b, &b) != 0)
            return -1;
        return cv_je_getitem(r, n->line, a, b, out);
    case N_SLICE: return eval_slice(r, s, n, out);
    case N_CALL: return eval_call(r, s, n, out);
    case N_FILTER: return eval_filter(r, s, n, out);
    case N_TEST: return eval_test(r, s, n, out);
    case N_NEG:
    case N_POS:
    case N_NOT: return eval_unary(r, s, n, out);
    case N_AND:
    case N_OR:
        if (cv_je_expr(r, s, n->a, &a) != 0)
            return -1;
        if (cv_jv_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        return cv_je_expr(r, s, n->b, out);
    case N_BIN:
        if (cv_je_expr(r, s, n->a, &a) != 0 || cv_je_expr(r, s, n->b, &b) != 0)
            return -1;
        return binop(r, n->line, n->op, a, b, out);
    case N_CMP: return eval_compare(r, s, n, out);
    case N_COND:
        if (cv_je_expr(r, s, n->b, &b) != 0)
            return -1;
        if (cv_jv_truthy(b))
            return cv_je_expr(r, s, n->a, out);
        *out = jv_undef();
        return n->c ? cv_je_expr(r, s, n->c, out) : 0;
    case N_CONCAT: return eval_concat(r, s, n, out);
    default: return cv_jr_fail(r, n->line, "unexpected expression node %d", n->kind);
    }
}

int cv_je_expr(jrender *r, jscope *s, const jnode *n, jv *out)
{
    if (++r->depth > r->lim.max_depth) {
        r->depth--;
        return cv_jr_fail(r, n->line, "the template nests calls or expressions more than %d deep", r->lim.max_depth);
    }
    int rc = cv_jr_work(r, n->line, 1) != 0 ? -1 : eval_node(r, s, n, out);
    r->depth--;
    return rc;
}
