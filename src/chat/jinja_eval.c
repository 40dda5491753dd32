/* jinja_eval.c: statements, scopes, macros and cv_jinja_render (jinja.h).
 *
 * Scopes follow Jinja2's: the context's variables, under them the
 * template's top level, then one scope per for loop and per macro call. A
 * loop's scope is emptied at every iteration, so what its body sets neither
 * leaks out of the loop nor carries over to the next iteration (Jinja2's
 * rule: namespaces are the way to carry state). Macros resolve names where
 * they were defined, when they are called. Every statement, expression and
 * macro call counts one level of depth and one step; loops count
 * iterations; all output goes through cv_jb_put, which bounds it. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat/jinja_impl.h"
#include "core/alloc.h"

/* ---- failure, work, output ---- */

int cv_jr_fail(jrender *r, int line, const char *fmt, ...)
{
    if (r->failed)
        return -1;
    r->failed = true;
    char msg[CV_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cv_errf(r->err, r->errlen, "line %d: %s", line, msg);
}

int cv_jr_work(jrender *r, int line, uint64_t n)
{
    const uint64_t before = r->steps;
    r->steps += n;
    if (r->steps > r->lim.max_steps)
        return cv_jr_fail(r, line, "the template took more than %llu steps (a loop that does not end?)",
                       (unsigned long long)r->lim.max_steps);
    if (r->stop && before / CV_JINJA_STOP_STEPS != r->steps / CV_JINJA_STOP_STEPS && r->stop(r->stop_user))
        return cv_jr_fail(r, line, "stopped (the request was cancelled)");
    return 0;
}

int cv_jb_put(jrender *r, jbuf *b, int line, const char *p, size_t n)
{
    if (!b)
        b = r->out;
    if (n == 0)
        return 0;
    /* one text, or all the captures (macro results, blocks) alive at once */
    if (n > r->lim.max_output || b->n > r->lim.max_output - n || r->held + n > 2 * r->lim.max_output)
        return cv_jr_fail(r, line, "the rendered text would exceed %zu bytes", r->lim.max_output);
    if (cv_jr_work(r, line, n / 64) != 0)
        return -1;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (!cv_ja_hold(&r->ar, cap - b->cap))
            return cv_jr_no_memory(r, line);
        char *q = cv_realloc(b->p, cap);
        if (!q) {
            cv_ja_unhold(&r->ar, cap - b->cap);
            return cv_jr_fail(r, line, "out of memory rendering the template");
        }
        b->ar = &r->ar;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->held = &r->held;
    r->held += n;
    return 0;
}

int cv_jb_take(jrender *r, jbuf *b, int line, jv *out)
{
    int rc = cv_jv_str_dup(r, line, b->p ? b->p : "", b->n, out);
    cv_jb_free(b);
    return rc;
}

void cv_jb_free(jbuf *b)
{
    if (b->held)
        *b->held -= b->n;
    if (b->ar)
        cv_ja_unhold(b->ar, b->cap);
    cv_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- scopes ---- */

static jscope *js_new(jrender *r, int line, jscope *parent)
{
    jscope *s = cv_jr_alloc(r, line, sizeof *s);
    if (s)
        s->parent = parent;
    return s;
}

jv *cv_js_find(jscope *s, int sym)
{
    for (; s; s = s->parent)
        for (int i = s->n - 1; i >= 0; i--)
            if (s->sym[i] == sym)
                return &s->val[i];
    return NULL;
}

int cv_js_set(jrender *r, int line, jscope *s, int sym, jv v)
{
    for (int i = 0; i < s->n; i++)
        if (s->sym[i] == sym) {
            s->val[i] = v;
            return 0;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        int *ns = cv_jr_alloc(r, line, (size_t)cap * sizeof *ns);
        jv *nv = ns ? cv_jr_alloc(r, line, (size_t)cap * sizeof *nv) : NULL;
        if (!nv)
            return -1;
        if (s->n) {
            memcpy(ns, s->sym, (size_t)s->n * sizeof *ns);
            memcpy(nv, s->val, (size_t)s->n * sizeof *nv);
        }
        s->sym = ns;
        s->val = nv;
        s->cap = cap;
    }
    s->sym[s->n] = sym;
    s->val[s->n++] = v;
    return 0;
}

/* ---- statements ---- */

static int exec_list(jrender *r, jscope *s, jnode *const *v, int n);

/* Renders statements into a new string instead of the output. */
static int capture(jrender *r, jscope *s, jnode *const *v, int n, int line, jv *out)
{
    jbuf b = {0}, *saved = r->out;
    r->out = &b;
    int rc = exec_list(r, s, v, n);
    r->out = saved;
    if (rc != 0) {
        cv_jb_free(&b);
        return -1;
    }
    return cv_jb_take(r, &b, line, out);
}

static int assign(jrender *r, jscope *s, const jnode *target, jv v)
{
    if (target->kind == N_NAME)
        return cv_js_set(r, target->line, s, target->sym, v);
    if (target->kind == N_ATTR) {
        jv *ns = cv_js_find(s, target->a->sym);
        if (!ns || ns->t != JV_NS)
            return cv_jr_fail(r, target->line, "cannot assign attribute on non-namespace object");
        return cv_jd_set(r, target->line, ns->u.d, target->val, v);
    }
    jlist *items;
    if (cv_je_iterate(r, target->line, v, &items) != 0)
        return -1;
    if (items->n != (size_t)target->n)
        return cv_jr_fail(r, target->line, "%s values to unpack (expected %d, got %zu)",
                       items->n > (size_t)target->n ? "too many" : "not enough", target->n, items->n);
    for (int i = 0; i < target->n; i++)
        if (cv_js_set(r, target->line, s, target->v[i]->sym, items->v[i]) != 0)
            return -1;
    return 0;
}

/* The items of a for loop after its `if` filter (each tried in its own scope). */
static int loop_items(jrender *r, jscope *s, const jnode *n, jlist **out)
{
    jv seq;
    jlist *all;
    if (cv_je_expr(r, s, n->b, &seq) != 0 || cv_je_iterate(r, n->line, seq, &all) != 0)
        return -1;
    if (!n->c) {
        *out = all;
        return 0;
    }
    jlist *kept = cv_jl_new(r, n->line, all->n);
    jscope *probe = js_new(r, n->line, s);
    if (!kept || !probe)
        return -1;
    for (size_t i = 0; i < all->n; i++) {
        jv keep;
        probe->n = 0;
        if (assign(r, probe, n->a, all->v[i]) != 0 || cv_je_expr(r, probe, n->c, &keep) != 0)
            return -1;
        if (cv_jv_truthy(keep))
            kept->v[kept->n++] = all->v[i];
    }
    *out = kept;
    return 0;
}

static int exec_for(jrender *r, jscope *s, const jnode *n)
{
    jlist *items;
    if (loop_items(r, s, n, &items) != 0)
        return -1;
    jscope *scope = js_new(r, n->line, s);
    jloop *lp = cv_jr_alloc(r, n->line, sizeof *lp);
    if (!scope || !lp)
        return -1;
    lp->items = items;
    jv loop = {JV_LOOP, 0, {.lp = lp}};
    for (size_t i = 0; i < items->n; i++) {
        if (++r->iterations > r->lim.max_iterations)
            return cv_jr_fail(r, n->line, "the template ran more than %llu loop iterations",
                           (unsigned long long)r->lim.max_iterations);
        scope->n = 0;
        lp->i = i;
        if (cv_js_set(r, n->line, scope, r->t->sym_loop, loop) != 0 || assign(r, scope, n->a, items->v[i]) != 0 ||
            exec_list(r, scope, n->v, n->n) != 0)
            return -1;
        int ctl = r->ctl;
        r->ctl = JC_NONE;
        if (ctl == JC_BREAK)
            break;
    }
    if (items->n == 0 && n->d) {
        scope->n = 0;
        return exec_list(r, scope, n->d->v, n->d->n);
    }
    return 0;
}

static int exec_if(jrender *r, jscope *s, const jnode *n)
{
    while (n && n->kind == N_IF) {
        jv c;
        if (cv_je_expr(r, s, n->a, &c) != 0)
            return -1;
        if (cv_jv_truthy(c))
            return exec_list(r, s, n->v, n->n);
        n = n->b;
    }
    return n ? exec_list(r, s, n->v, n->n) : 0;
}

/* Applies a filter block's chain (innermost operand: the rendered body). */
static int block_filters(jrender *r, jscope *s, const jnode *f, jv text, jv *out)
{
    jv operand = text;
    if (f->a && block_filters(r, s, f->a, text, &operand) != 0)
        return -1;
    jargs a;
    if (cv_je_args(r, s, f, "filter", &a) != 0)
        return -1;
    return cv_jf_filter(r, f->op, operand, &a, out);
}

static int exec_call_block(jrender *r, jscope *s, const jnode *n)
{
    jmacro *caller = cv_jr_alloc(r, n->line, sizeof *caller);
    if (!caller)
        return -1;
    caller->def = n;
    caller->closure = s;
    const jnode *call = n->a;
    jv fn, result;
    jargs a;
    if (cv_je_expr(r, s, call->a, &fn) != 0 || cv_je_args(r, s, call, "call", &a) != 0)
        return -1;
    jstr *names = cv_jr_alloc(r, n->line, (size_t)(a.n_kw + 1) * sizeof *names);
    jv *vals = names ? cv_jr_alloc(r, n->line, (size_t)(a.n_kw + 1) * sizeof *vals) : NULL;
    if (!vals)
        return -1;
    for (int i = 0; i < a.n_kw; i++)
        names[i] = a.kw_name[i], vals[i] = a.kw[i];
    names[a.n_kw] = (jstr){"caller", 6};
    vals[a.n_kw] = (jv){JV_MACRO, 0, {.m = caller}};
    a.kw_name = names;
    a.kw = vals;
    a.n_kw++;
    if (cv_je_call(r, n->line, fn, &a, &result) != 0)
        return -1;
    return cv_jv_write_str(r, NULL, n->line, result);
}

static int exec(jrender *r, jscope *s, const jnode *n)
{
    jv v;
    switch (n->kind) {
    case N_TEXT: return cv_jb_put(r, NULL, n->line, n->val.u.s.p, n->val.u.s.n);
    case N_OUT: return cv_je_expr(r, s, n->a, &v) != 0 ? -1 : cv_jv_write_str(r, NULL, n->line, v);
    case N_IF: return exec_if(r, s, n);
    case N_FOR: return exec_for(r, s, n);
    case N_SET: return cv_je_expr(r, s, n->b, &v) != 0 ? -1 : assign(r, s, n->a, v);
    case N_SETBLOCK: return capture(r, s, n->v, n->n, n->line, &v) != 0 ? -1 : assign(r, s, n->a, v);
    case N_MACRO: {
        jmacro *m = cv_jr_alloc(r, n->line, sizeof *m);
        if (!m)
            return -1;
        m->def = n;
        m->closure = s;
        return cv_js_set(r, n->line, s, n->sym, (jv){JV_MACRO, 0, {.m = m}});
    }
    case N_CALLBLOCK: return exec_call_block(r, s, n);
    case N_FILTERBLOCK: {
        jv text;
        if (capture(r, s, n->v, n->n, n->line, &text) != 0 || block_filters(r, s, n->a, text, &v) != 0)
            return -1;
        return cv_jv_write_str(r, NULL, n->line, v);
    }
    case N_BREAK: r->ctl = JC_BREAK; return 0;
    case N_CONTINUE: r->ctl = JC_CONTINUE; return 0;
    case N_BODY: return exec_list(r, s, n->v, n->n);
    default: return cv_jr_fail(r, n->line, "unexpected node %d", n->kind);
    }
}

static int exec_list(jrender *r, jscope *s, jnode *const *v, int n)
{
    if (++r->depth > r->lim.max_depth) {
        r->depth--;
        return cv_jr_fail(r, n ? v[0]->line : 0, "the template nests calls or blocks more than %d deep",
                          r->lim.max_depth);
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0 && r->ctl == JC_NONE; i++)
        rc = cv_jr_work(r, v[i]->line, 1) != 0 ? -1 : exec(r, s, v[i]);
    r->depth--;
    return rc;
}

int cv_je_body(jrender *r, jscope *s, const jnode *body) { return exec_list(r, s, body->v, body->n); }

/* ---- macros ---- */

/* Whether the scope itself (not its parents) holds sym. */
static bool bound(const jscope *s, int sym)
{
    for (int i = 0; i < s->n; i++)
        if (s->sym[i] == sym)
            return true;
    return false;
}

static const jnode *param_named(const jnode *def, jstr name)
{
    for (int i = 0; i < def->n_kw; i++)
        if (def->kw[i]->val.u.s.n == name.n && memcmp(def->kw[i]->val.u.s.p, name.p, name.n) == 0)
            return def->kw[i];
    return NULL;
}

static const char *macro_name(const jmacro *m, char *buf, size_t cap)
{
    if (m->def->kind == N_MACRO)
        snprintf(buf, cap, "'%.*s'", (int)m->def->val.u.s.n, m->def->val.u.s.p);
    else
        snprintf(buf, cap, "'caller'");
    return buf;
}

/* Keyword arguments: to their parameters, else kwargs, caller, or an error. */
static int bind_keywords(jrender *r, int line, const jmacro *m, jscope *scope, jargs *a, jdict *kwargs)
{
    const jnode *def = m->def;
    char nm[96];
    for (int k = 0; k < a->n_kw; k++) {
        const jnode *p = param_named(def, a->kw_name[k]);
        jstr name = a->kw_name[k];
        int rc;
        if (p && bound(scope, p->sym))
            return cv_jr_fail(r, line, "macro %s got multiple values for argument '%.*s'", macro_name(m, nm, sizeof nm),
                           (int)name.n, name.p);
        if (p)
            rc = cv_js_set(r, line, scope, p->sym, a->kw[k]);
        else if (name.n == 6 && memcmp(name.p, "caller", 6) == 0 && (def->flag & MF_CALLER))
            rc = cv_js_set(r, line, scope, r->t->sym_caller, a->kw[k]);
        else if (def->flag & MF_KWARGS)
            rc = cv_jd_set(r, line, kwargs, jv_str(name.p, name.n), a->kw[k]);
        else
            return cv_jr_fail(r, line, "macro %s takes no keyword argument '%.*s'", macro_name(m, nm, sizeof nm),
                           (int)name.n, name.p);
        if (rc != 0)
            return -1;
    }
    return 0;
}

static int bind_args(jrender *r, int line, const jmacro *m, jscope *scope, jargs *a)
{
    const jnode *def = m->def;
    char nm[96];
    int n_params = def->n_kw;
    if (a->n_pos > n_params && !(def->flag & MF_VARARGS))
        return cv_jr_fail(r, line, "macro %s takes not more than %d argument(s)", macro_name(m, nm, sizeof nm),
                       n_params);
    for (int i = 0; i < a->n_pos && i < n_params; i++)
        if (cv_js_set(r, line, scope, def->kw[i]->sym, a->pos[i]) != 0)
            return -1;
    jdict *kwargs = cv_jd_new(r, line, 0);
    if (!kwargs || bind_keywords(r, line, m, scope, a, kwargs) != 0)
        return -1;
    for (int i = 0; i < n_params; i++) {
        const jnode *p = def->kw[i];
        jv v = {JV_UNDEF, 0, {.s = p->val.u.s}};
        if (bound(scope, p->sym))
            continue;
        if ((p->a && cv_je_expr(r, scope, p->a, &v) != 0) || cv_js_set(r, line, scope, p->sym, v) != 0)
            return -1;
    }
    if ((def->flag & MF_CALLER) && !bound(scope, r->t->sym_caller) &&
        cv_js_set(r, line, scope, r->t->sym_caller, jv_undef()) != 0)
        return -1;
    if ((def->flag & MF_KWARGS) && cv_js_set(r, line, scope, r->t->sym_kwargs, jv_dict(kwargs)) != 0)
        return -1;
    if (!(def->flag & MF_VARARGS))
        return 0;
    jlist *rest = cv_jl_new(r, line, a->n_pos > n_params ? (size_t)(a->n_pos - n_params) : 0);
    if (!rest)
        return -1;
    rest->tuple = true;
    for (int i = n_params; i < a->n_pos; i++)
        rest->v[rest->n++] = a->pos[i];
    return cv_js_set(r, line, scope, r->t->sym_varargs, jv_list(rest));
}

int cv_je_call_macro(jrender *r, int line, const jmacro *m, jargs *a, jv *out)
{
    jscope *scope = js_new(r, line, m->closure);
    if (!scope || bind_args(r, line, m, scope, a) != 0)
        return -1;
    return capture(r, scope, m->def->v, m->def->n, line, out);
}

/* ---- render ---- */

static void set_limits(cv_jinja_limits *l, const cv_jinja_limits *given)
{
    static const cv_jinja_limits defaults = {
        .max_output = (size_t)16 << 20,
        .max_memory = (size_t)256 << 20,
        .max_steps = 50000000,
        .max_iterations = 1000000,
        .max_depth = 400,
    };
    *l = defaults;
    if (!given)
        return;
    if (given->max_output)
        l->max_output = given->max_output;
    if (given->max_memory)
        l->max_memory = given->max_memory;
    if (given->max_steps)
        l->max_steps = given->max_steps;
    if (given->max_iterations)
        l->max_iterations = given->max_iterations;
    if (given->max_depth)
        l->max_depth = given->max_depth;
    if (l->max_output > SIZE_MAX / 4) /* the buffers' total is counted against twice it */
        l->max_output = SIZE_MAX / 4;
}

/* The context's members that the template names, as variables. */
static int load_context(jrender *r, jscope *s, const json_t *context)
{
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)context, key, val) {
        size_t n = strlen(key);
        for (int sym = 0; sym < r->t->n_names; sym++) {
            if (r->t->names[sym].n != n || memcmp(r->t->names[sym].p, key, n) != 0)
                continue;
            jv v;
            if (cv_jv_from_json(r, 0, val, false, &v, 0) != 0 || cv_js_set(r, 0, s, sym, v) != 0)
                return -1;
            break;
        }
    }
    return 0;
}

int cv_jinja_render(const cv_jinja *t, const json_t *context, const cv_jinja_env *env, char **out, size_t *len,
                    char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (!t || !env || (context && !json_is_object(context)))
        return cv_errf(err, errlen, "a render needs a template, an environment and a JSON object as context");
    jbuf text = {0};
    jrender r = {.t = t, .out = &text, .err = err, .errlen = errlen};
    r.year = env->year;
    r.month = env->month >= 1 && env->month <= 12 ? env->month : 1;
    r.day = env->day >= 1 && env->day <= 31 ? env->day : 1;
    set_limits(&r.lim, env->limits);
    r.ar.limit = r.lim.max_memory;
    r.ar.pool = env->pool;
    r.stop = env->stop;
    r.stop_user = env->stop_user;
    jscope *ctx = js_new(&r, 0, NULL), *top = ctx ? js_new(&r, 0, ctx) : NULL;
    int rc = top ? 0 : -1;
    if (rc == 0 && context)
        rc = load_context(&r, ctx, context);
    if (rc == 0)
        rc = cv_je_body(&r, top, t->root);
    if (rc == 0 && !text.p && !(text.p = cv_malloc(1)))
        rc = cv_jr_fail(&r, 0, "out of memory rendering the template");
    cv_ja_release(&r.ar);
    if (rc != 0) {
        cv_jb_free(&text);
        return -1;
    }
    if (text.ar) /* the caller's now */
        cv_ja_unhold(text.ar, text.cap);
    text.p[text.n] = '\0';
    *out = text.p;
    *len = text.n;
    return 0;
}
