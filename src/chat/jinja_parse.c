/* jinja_parse.c: tokens -> syntax tree, and cv_jinja_parse (jinja.h): the
 * parser's helpers (jinja_parser.h), the statements and the template; the
 * expressions are jinja_parse_expr.c's.
 *
 * Statements are Jinja2's tags (if, for, set, macro, call, filter,
 * generation, break, continue), each a node whose body is parsed up to the
 * tag that closes it. Any tag convoy does not implement is a parse error
 * naming it and its line. Every recursion counts against MAX_NESTING, so a
 * hostile template cannot exhaust the stack here or when rendered. */
#include <stdio.h>
#include <string.h>

#include "chat/jinja_parser.h"
#include "core/alloc.h"

#define MAX_TEMPLATE (1u << 20)
#define MAX_NESTING 200

static void describe(const jtok *t, char *buf, size_t cap)
{
    static const char *const kinds[] = {"the end of the template", "text", "'{{'", "'}}'", "'{%'", "'%}'",
                                        "a name", "an integer", "a number", "a string", "an operator"};
    if (t->kind == TK_NAME)
        snprintf(buf, cap, "'%.*s'", t->s.n > 40 ? 40 : (int)t->s.n, t->s.p);
    else
        snprintf(buf, cap, "%s", kinds[t->kind]);
}

int cv_jp_fail_at(parser *P, int line, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return cv_errf(P->err, P->errlen, "line %d: %s", line, msg);
}

int cv_jp_unexpected(parser *P, const char *wanted)
{
    char got[64], msg[200];
    describe(cur(P), got, sizeof got);
    snprintf(msg, sizeof msg, "expected %s, found %s", wanted, got);
    return cv_jp_fail_at(P, cur(P)->line, "%s", msg);
}

int cv_jp_expect_op(parser *P, int op, const char *wanted)
{
    if (!at_op(P, op))
        return cv_jp_unexpected(P, wanted);
    P->pos++;
    return 0;
}

static int expect_end(parser *P) { return cur(P)->kind == TK_BLOCK_END ? (P->pos++, 0) : cv_jp_unexpected(P, "'%}'"); }

int cv_jp_enter(parser *P)
{
    if (++P->depth > MAX_NESTING)
        return cv_jp_fail_at(P, cur(P)->line, "the template nests blocks or expressions more than %s deep", "200");
    return 0;
}

jnode *cv_jp_node(parser *P, int kind, int line)
{
    jnode *n = cv_ja_alloc(&P->t->ar, sizeof *n);
    if (!n) {
        cv_errf(P->err, P->errlen, "line %d: out of memory reading the template", line);
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = line;
    n->sym = -1;
    return n;
}

int cv_jp_nv_push(parser *P, nvec *v, jnode *n)
{
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 8;
        jnode **p = cv_realloc(v->v, (size_t)cap * sizeof *p);
        if (!p)
            return cv_errf(P->err, P->errlen, "out of memory reading the template");
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = n;
    return 0;
}

int cv_jp_nv_done(parser *P, nvec *v, jnode ***out, int *n)
{
    *n = v->n;
    *out = NULL;
    if (v->n > 0) {
        *out = cv_ja_alloc(&P->t->ar, (size_t)v->n * sizeof **out);
        if (*out)
            memcpy(*out, v->v, (size_t)v->n * sizeof **out);
    }
    cv_free(v->v);
    v->v = NULL;
    if (v->n > 0 && !*out)
        return cv_errf(P->err, P->errlen, "out of memory reading the template");
    return 0;
}

static uint32_t hash_name(jstr s)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < s.n; i++)
        h = (h ^ (unsigned char)s.p[i]) * 16777619u;
    return h;
}

static int rehash(parser *P)
{
    int cap = P->hash_cap ? 2 * P->hash_cap : 64;
    int *h = cv_malloc((size_t)cap * sizeof *h);
    if (!h)
        return cv_errf(P->err, P->errlen, "out of memory reading the template");
    for (int i = 0; i < cap; i++)
        h[i] = -1;
    for (int i = 0; i < P->n_names; i++) {
        uint32_t k = hash_name(P->names[i]) & (uint32_t)(cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (uint32_t)(cap - 1);
        h[k] = i;
    }
    cv_free(P->hash);
    P->hash = h;
    P->hash_cap = cap;
    return 0;
}

/* The symbol of a name: its index among the template's names. */
static int intern(parser *P, jstr s)
{
    if (2 * (P->n_names + 1) > P->hash_cap && rehash(P) != 0)
        return -1;
    uint32_t k = hash_name(s) & (uint32_t)(P->hash_cap - 1);
    for (; P->hash[k] >= 0; k = (k + 1) & (uint32_t)(P->hash_cap - 1)) {
        jstr o = P->names[P->hash[k]];
        if (o.n == s.n && memcmp(o.p, s.p, s.n) == 0)
            return P->hash[k];
    }
    if (P->n_names == P->cap_names) {
        int cap = P->cap_names ? 2 * P->cap_names : 32;
        jstr *p = cv_realloc(P->names, (size_t)cap * sizeof *p);
        if (!p)
            return cv_errf(P->err, P->errlen, "out of memory reading the template");
        P->names = p;
        P->cap_names = cap;
    }
    P->names[P->n_names] = s;
    P->hash[k] = P->n_names;
    return P->n_names++;
}

jnode *cv_jp_name_node(parser *P, const jtok *t)
{
    jnode *n = cv_jp_node(P, N_NAME, t->line);
    if (!n || (n->sym = intern(P, t->s)) < 0)
        return NULL;
    n->val = jv_str(t->s.p, t->s.n);
    return n;
}

/* ---- statements ---- */

typedef struct stop_set {
    const char *const *names; /* tags that end the body */
    const char *opener;       /* "for" */
    int line;                 /* the opener's line */
} stop_set;

/* The tag that closes a body: the last of its stop tags ("endfor"). */
static const char *closer(const stop_set *stop)
{
    int k = 0;
    while (stop->names[k + 1])
        k++;
    return stop->names[k];
}

static int parse_body(parser *P, const stop_set *stop, jnode **out);

static int parse_target(parser *P, bool with_ns, jnode **out)
{
    if (with_ns && cur(P)->kind == TK_NAME && look(P)->kind == TK_OP && look(P)->op == OP_DOT) {
        jnode *n = cv_jp_node(P, N_ATTR, cur(P)->line);
        if (!n || !(n->a = cv_jp_name_node(P, cur(P))))
            return -1;
        P->pos += 2;
        if (cur(P)->kind != TK_NAME)
            return cv_jp_unexpected(P, "an attribute name");
        n->val = jv_str(cur(P)->s.p, cur(P)->s.n);
        P->pos++;
        *out = n;
        return 0;
    }
    if (cv_jp_parse_tuple(P, true, false, false, true, out) != 0)
        return -1;
    bool ok = (*out)->kind == N_NAME;
    if ((*out)->kind == N_TUPLE) {
        ok = true;
        for (int i = 0; i < (*out)->n; i++)
            ok = ok && (*out)->v[i]->kind == N_NAME;
    }
    return ok ? 0 : cv_jp_fail_at(P, (*out)->line, "cannot assign to this expression%s", "");
}

static int parse_if(parser *P, int line, jnode **out)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    jnode *n = cv_jp_node(P, N_IF, line);
    if (!n || cv_jp_parse_tuple(P, false, false, false, false, &n->a) != 0 || expect_end(P) != 0)
        return -1;
    stop_set st = {stops, "if", line};
    if (parse_body(P, &st, &n->d) != 0)
        return -1;
    n->v = n->d->v;
    n->n = n->d->n;
    n->d = NULL;
    *out = n;
    const jtok *t = cur(P);
    P->pos++;
    if (tok_is(t, "elif")) {
        if (cv_jp_enter(P) != 0 || parse_if(P, t->line, &n->b) != 0)
            return -1;
        P->depth--;
        return 0;
    }
    if (tok_is(t, "else")) {
        static const char *const end[] = {"endif", NULL};
        stop_set se = {end, "if", line};
        if (expect_end(P) != 0 || parse_body(P, &se, &n->b) != 0)
            return -1;
        P->pos++;
    }
    return expect_end(P);
}

static int parse_for(parser *P, int line, jnode **out)
{
    static const char *const stops[] = {"else", "endfor", NULL}, *const end[] = {"endfor", NULL};
    jnode *n = cv_jp_node(P, N_FOR, line);
    if (!n || parse_target(P, false, &n->a) != 0)
        return -1;
    if (!at_name(P, "in"))
        return cv_jp_unexpected(P, "'in'");
    P->pos++;
    if (cv_jp_parse_tuple(P, false, false, false, false, &n->b) != 0)
        return -1;
    if (at_name(P, "if")) {
        P->pos++;
        if (cv_jp_parse_expression(P, true, &n->c) != 0)
            return -1;
    }
    if (at_name(P, "recursive"))
        return cv_jp_fail_at(P, cur(P)->line, "recursive for loops are not supported%s", "");
    if (expect_end(P) != 0)
        return -1;
    stop_set st = {stops, "for", line};
    P->loops++;
    jnode *body = NULL;
    int rc = parse_body(P, &st, &body);
    P->loops--;
    if (rc != 0)
        return -1;
    n->v = body->v;
    n->n = body->n;
    *out = n;
    if (at_name(P, "else")) {
        stop_set se = {end, "for", line};
        P->pos++;
        if (expect_end(P) != 0 || parse_body(P, &se, &n->d) != 0)
            return -1;
    }
    P->pos++;
    return expect_end(P);
}

static int parse_set(parser *P, int line, jnode **out)
{
    static const char *const end[] = {"endset", NULL};
    jnode *target = NULL;
    if (parse_target(P, true, &target) != 0)
        return -1;
    if (at_op(P, OP_ASSIGN)) {
        jnode *n = cv_jp_node(P, N_SET, line);
        if (!n)
            return -1;
        n->a = target;
        P->pos++;
        *out = n;
        if (cv_jp_parse_tuple(P, false, true, false, false, &n->b) != 0)
            return -1;
        return expect_end(P);
    }
    if (at_op(P, OP_PIPE))
        return cv_jp_fail_at(P, line, "a filtered block set is not supported%s", "");
    if (target->kind == N_TUPLE)
        return cv_jp_fail_at(P, line, "a block set needs one name%s", "");
    jnode *n = cv_jp_node(P, N_SETBLOCK, line), *body = NULL;
    stop_set st = {end, "set", line};
    if (!n || expect_end(P) != 0 || parse_body(P, &st, &body) != 0)
        return -1;
    n->a = target;
    n->v = body->v;
    n->n = body->n;
    *out = n;
    P->pos++;
    return expect_end(P);
}

/* (name, name=default, ...) of a macro or a call block, into n->kw. */
static int parse_params(parser *P, jnode *n)
{
    nvec ps = {0};
    int rc = cv_jp_expect_op(P, OP_LPAREN, "'('");
    while (rc == 0 && !at_op(P, OP_RPAREN)) {
        if (ps.n && ((rc = cv_jp_expect_op(P, OP_COMMA, "',' or ')'")) != 0 || at_op(P, OP_RPAREN)))
            break;
        if (cur(P)->kind != TK_NAME) {
            rc = cv_jp_unexpected(P, "a parameter name");
            break;
        }
        jnode *p = cv_jp_node(P, N_PARAM, cur(P)->line);
        if (!p || (p->sym = intern(P, cur(P)->s)) < 0) {
            rc = -1;
            break;
        }
        p->val = jv_str(cur(P)->s.p, cur(P)->s.n);
        P->pos++;
        if (at_op(P, OP_ASSIGN)) {
            P->pos++;
            rc = cv_jp_parse_expression(P, true, &p->a);
        } else if (ps.n && ps.v[ps.n - 1]->a) {
            rc = cv_jp_fail_at(P, p->line, "a parameter without a default after one with a default%s", "");
        }
        rc = rc ? rc : cv_jp_nv_push(P, &ps, p);
    }
    rc = rc ? rc : cv_jp_expect_op(P, OP_RPAREN, "')'");
    int rc2 = cv_jp_nv_done(P, &ps, &n->kw, &n->n_kw);
    return rc ? rc : rc2;
}

/* Whether the tree reads the variable sym (macros nested inside excluded). */
static bool reads(const jnode *n, int sym)
{
    if (!n)
        return false;
    if (n->kind == N_NAME && n->sym == sym)
        return true;
    if (n->kind == N_MACRO)
        return false;
    if (reads(n->a, sym) || reads(n->b, sym) || reads(n->c, sym) || reads(n->d, sym))
        return true;
    for (int i = 0; i < n->n; i++)
        if (reads(n->v[i], sym))
            return true;
    for (int i = 0; i < n->n_kw; i++)
        if (reads(n->kw[i], sym))
            return true;
    return false;
}

/* The body of a macro or call block, and the special names it reads. */
static int parse_macro_body(parser *P, jnode *n, const char *opener, const char *endname)
{
    const char *end[] = {endname, NULL};
    stop_set st = {end, opener, n->line};
    jnode *body = NULL;
    int loops = P->loops;
    P->loops = 0;
    int rc = expect_end(P);
    rc = rc ? rc : parse_body(P, &st, &body);
    P->loops = loops;
    if (rc != 0)
        return -1;
    n->v = body->v;
    n->n = body->n;
    P->pos++;
    int s_varargs = intern(P, (jstr){"varargs", 7}), s_kwargs = intern(P, (jstr){"kwargs", 6});
    int s_caller = intern(P, (jstr){"caller", 6});
    if (s_varargs < 0 || s_kwargs < 0 || s_caller < 0)
        return -1;
    n->flag = (uint8_t)((reads(body, s_varargs) ? MF_VARARGS : 0) | (reads(body, s_kwargs) ? MF_KWARGS : 0) |
                        (reads(body, s_caller) ? MF_CALLER : 0));
    return expect_end(P);
}

static int parse_macro(parser *P, int line, jnode **out)
{
    jnode *n = cv_jp_node(P, N_MACRO, line);
    if (!n)
        return -1;
    if (cur(P)->kind != TK_NAME)
        return cv_jp_unexpected(P, "a macro name");
    n->val = jv_str(cur(P)->s.p, cur(P)->s.n);
    if ((n->sym = intern(P, cur(P)->s)) < 0)
        return -1;
    P->pos++;
    *out = n;
    if (parse_params(P, n) != 0)
        return -1;
    return parse_macro_body(P, n, "macro", "endmacro");
}

static int parse_call_block(parser *P, int line, jnode **out)
{
    jnode *n = cv_jp_node(P, N_CALLBLOCK, line);
    if (!n)
        return -1;
    *out = n;
    if (at_op(P, OP_LPAREN) && parse_params(P, n) != 0)
        return -1;
    if (cv_jp_parse_expression(P, true, &n->a) != 0)
        return -1;
    if (n->a->kind != N_CALL)
        return cv_jp_fail_at(P, line, "a call block needs a call%s", "");
    return parse_macro_body(P, n, "call", "endcall");
}

static int parse_filter_block(parser *P, int line, jnode **out)
{
    static const char *const end[] = {"endfilter", NULL};
    jnode *n = cv_jp_node(P, N_FILTERBLOCK, line), *body = NULL;
    if (!n || cv_jp_parse_filters(P, &n->a, true) != 0)
        return -1;
    stop_set st = {end, "filter", line};
    if (expect_end(P) != 0 || parse_body(P, &st, &body) != 0)
        return -1;
    n->v = body->v;
    n->n = body->n;
    *out = n;
    P->pos++;
    return expect_end(P);
}

/* transformers' {% generation %}: its body, as is. */
static int parse_generation(parser *P, int line, jnode **out)
{
    static const char *const end[] = {"endgeneration", NULL};
    stop_set st = {end, "generation", line};
    if (expect_end(P) != 0 || parse_body(P, &st, out) != 0)
        return -1;
    P->pos++;
    return expect_end(P);
}

static int parse_loop_control(parser *P, int line, bool is_break, jnode **out)
{
    if (P->loops == 0)
        return cv_jp_fail_at(P, line, "'%s' outside a for loop", is_break ? "break" : "continue");
    if (!(*out = cv_jp_node(P, is_break ? N_BREAK : N_CONTINUE, line)))
        return -1;
    return expect_end(P);
}

static int parse_statement(parser *P, jnode **out)
{
    const jtok *t = cur(P);
    int line = t->line;
    static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "with", "do",
                                              "autoescape", "trans", "print", NULL};
    if (t->kind != TK_NAME)
        return cv_jp_unexpected(P, "a tag name");
    P->pos++;
    if (tok_is(t, "if"))
        return parse_if(P, line, out);
    if (tok_is(t, "for"))
        return parse_for(P, line, out);
    if (tok_is(t, "set"))
        return parse_set(P, line, out);
    if (tok_is(t, "macro"))
        return parse_macro(P, line, out);
    if (tok_is(t, "call"))
        return parse_call_block(P, line, out);
    if (tok_is(t, "filter"))
        return parse_filter_block(P, line, out);
    if (tok_is(t, "generation"))
        return parse_generation(P, line, out);
    if (tok_is(t, "break") || tok_is(t, "continue"))
        return parse_loop_control(P, line, tok_is(t, "break"), out);
    char nm[64];
    snprintf(nm, sizeof nm, "%.*s", t->s.n > 40 ? 40 : (int)t->s.n, t->s.p);
    for (int k = 0; unsupported[k]; k++)
        if (tok_is(t, unsupported[k]))
            return cv_jp_fail_at(P, line, "the tag '%s' is not supported", nm);
    return cv_jp_fail_at(P, line, "unexpected tag '%s'", nm);
}

static bool is_stop(const jtok *t, const stop_set *stop)
{
    for (int k = 0; stop && stop->names[k]; k++)
        if (tok_is(t, stop->names[k]))
            return true;
    return false;
}

static int unclosed(parser *P, const stop_set *stop)
{
    char msg[160];
    snprintf(msg, sizeof msg, "the '%s' tag of line %d is not closed (expected '%s')", stop->opener, stop->line,
             closer(stop));
    return cv_jp_fail_at(P, cur(P)->line, "%s", msg);
}

/* One item of a body: text, {{ expr }} or a statement (NULL for a stop tag). */
static int parse_item(parser *P, const stop_set *stop, jnode **out)
{
    const jtok *t = cur(P);
    *out = NULL;
    if (t->kind == TK_TEXT) {
        P->pos++;
        if (!(*out = cv_jp_node(P, N_TEXT, t->line)))
            return -1;
        (*out)->val = jv_str(t->s.p, t->s.n);
        return 0;
    }
    if (t->kind == TK_VAR_BEGIN) {
        P->pos++;
        if (!(*out = cv_jp_node(P, N_OUT, t->line)) || cv_jp_parse_tuple(P, false, true, false, false, &(*out)->a) != 0)
            return -1;
        return cur(P)->kind == TK_VAR_END ? (P->pos++, 0) : cv_jp_unexpected(P, "'}}'");
    }
    P->pos++; /* {% */
    if (is_stop(cur(P), stop))
        return 0;
    return parse_statement(P, out);
}

/* Statements up to a stop tag (the cursor is left on its name) or, at the
 * top, the end of the template. */
static int parse_body(parser *P, const stop_set *stop, jnode **out)
{
    if (cv_jp_enter(P) != 0)
        return -1;
    jnode *body = cv_jp_node(P, N_BODY, cur(P)->line);
    nvec items = {0};
    int rc = body ? 0 : -1;
    while (rc == 0) {
        if (cur(P)->kind == TK_EOF) {
            rc = stop ? unclosed(P, stop) : 0;
            break;
        }
        jnode *item = NULL;
        rc = parse_item(P, stop, &item);
        if (rc == 0 && !item)
            break;
        rc = rc ? rc : cv_jp_nv_push(P, &items, item);
    }
    int rc2 = body ? cv_jp_nv_done(P, &items, &body->v, &body->n) : (cv_free(items.v), -1);
    *out = body;
    P->depth--;
    return rc ? rc : rc2;
}

/* ---- the template ---- */

/* The source with \r\n and \r read as \n and one trailing newline dropped. */
static char *normalize(jarena *ar, const char *src, size_t len, size_t *out_len)
{
    char *s = cv_ja_alloc(ar, len + 1);
    if (!s)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[o++] = '\n';
            i += i + 1 < len && src[i + 1] == '\n';
        } else {
            s[o++] = src[i];
        }
    }
    if (o > 0 && s[o - 1] == '\n')
        o--;
    *out_len = o;
    return s;
}

static int finish_names(parser *P)
{
    static const char *const globals[JG_COUNT] = {
        [JG_RANGE] = "range", [JG_NAMESPACE] = "namespace", [JG_DICT] = "dict",
        [JG_RAISE] = "raise_exception", [JG_STRFTIME] = "strftime_now"};
    cv_jinja *t = P->t;
    if ((t->sym_loop = intern(P, (jstr){"loop", 4})) < 0 || (t->sym_caller = intern(P, (jstr){"caller", 6})) < 0 ||
        (t->sym_varargs = intern(P, (jstr){"varargs", 7})) < 0 || (t->sym_kwargs = intern(P, (jstr){"kwargs", 6})) < 0)
        return -1;
    t->n_names = P->n_names;
    t->names = cv_ja_alloc(&t->ar, (size_t)P->n_names * sizeof *t->names);
    t->global_of = cv_ja_alloc(&t->ar, (size_t)P->n_names);
    if (!t->names || !t->global_of)
        return cv_errf(P->err, P->errlen, "out of memory reading the template");
    for (int i = 0; i < P->n_names; i++) {
        t->names[i] = P->names[i];
        t->global_of[i] = -1;
        for (int g = 0; g < JG_COUNT; g++)
            if (strlen(globals[g]) == P->names[i].n && memcmp(globals[g], P->names[i].p, P->names[i].n) == 0)
                t->global_of[i] = (int8_t)g;
    }
    return 0;
}

static int parse_all(parser *P, const char *src, size_t len)
{
    size_t n;
    char *s = normalize(&P->t->ar, src, len, &n);
    if (!s)
        return cv_errf(P->err, P->errlen, "out of memory reading the template");
    jlex lx = {.ar = &P->t->ar, .err = P->err, .errlen = P->errlen};
    int rc = cv_jx_lex(&lx, s, n);
    if (rc == 0) {
        P->tok = lx.tok;
        rc = parse_body(P, NULL, &P->t->root);
        rc = rc ? rc : finish_names(P);
    }
    cv_free(lx.tok);
    return rc;
}

int cv_jinja_parse(const char *src, size_t len, cv_jinja **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!src && len > 0)
        return cv_errf(err, errlen, "no template text");
    if (len > MAX_TEMPLATE)
        return cv_errf(err, errlen, "the template is %zu bytes, more than the %u allowed", len, MAX_TEMPLATE);
    cv_jinja *t = cv_calloc(1, sizeof *t);
    if (!t)
        return cv_errf(err, errlen, "out of memory reading the template");
    t->ar.limit = (size_t)64 * len + ((size_t)1 << 20);
    parser P = {.t = t, .err = err, .errlen = errlen};
    int rc = parse_all(&P, src ? src : "", len);
    cv_free(P.names);
    cv_free(P.hash);
    if (rc != 0) {
        cv_jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void cv_jinja_free(cv_jinja *t)
{
    if (!t)
        return;
    cv_ja_release(&t->ar);
    cv_free(t);
}
