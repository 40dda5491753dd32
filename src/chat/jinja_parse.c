/* jinja_parse.c: tokens -> syntax tree, and cv_jinja_parse (jinja.h).
 *
 * A recursive-descent parser with Jinja2's grammar and precedence, loosest
 * first: a if c else b; or; and; not; comparisons (chained) and in/not in;
 * + -; ~; * / // %; **; unary - +; then primaries with their postfixes
 * (.name, [index], [a:b:c], calls) and their filters (|f) and tests
 * (is [not] t). Filters and tests are resolved here, so an unknown one is a
 * parse error naming it and its line, as in Jinja2; so is any tag convoy
 * does not implement. Every recursion counts against MAX_NESTING, so a
 * hostile template cannot exhaust the stack here or when rendered. */
#include <stdio.h>
#include <string.h>

#include "chat/jinja_impl.h"
#include "core/alloc.h"

#define MAX_TEMPLATE (1u << 20)
#define MAX_NESTING 200

typedef struct parser {
    cv_jinja *t;
    const jtok *tok;
    size_t pos;
    int depth;
    int loops; /* enclosing for loops (break and continue need one) */
    jstr *names;
    int n_names, cap_names;
    int *hash; /* open addressing over names: index or -1 */
    int hash_cap;
    char *err;
    size_t errlen;
} parser;

/* A growable list of nodes, moved into the arena when complete. */
typedef struct nvec {
    jnode **v;
    int n, cap;
} nvec;

static const jtok *cur(const parser *P) { return &P->tok[P->pos]; }
static const jtok *look(const parser *P) { return cur(P)->kind == TK_EOF ? cur(P) : &P->tok[P->pos + 1]; }
static bool at_op(const parser *P, int op) { return cur(P)->kind == TK_OP && cur(P)->op == op; }

static bool tok_is(const jtok *t, const char *name)
{
    size_t n = strlen(name);
    return t->kind == TK_NAME && t->s.n == n && memcmp(t->s.p, name, n) == 0;
}

static bool at_name(const parser *P, const char *name) { return tok_is(cur(P), name); }

static void describe(const jtok *t, char *buf, size_t cap)
{
    static const char *const kinds[] = {"the end of the template", "text", "'{{'", "'}}'", "'{%'", "'%}'",
                                        "a name", "an integer", "a number", "a string", "an operator"};
    if (t->kind == TK_NAME)
        snprintf(buf, cap, "'%.*s'", t->s.n > 40 ? 40 : (int)t->s.n, t->s.p);
    else
        snprintf(buf, cap, "%s", kinds[t->kind]);
}

static int fail_at(parser *P, int line, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return cv_errf(P->err, P->errlen, "line %d: %s", line, msg);
}

static int unexpected(parser *P, const char *wanted)
{
    char got[64], msg[200];
    describe(cur(P), got, sizeof got);
    snprintf(msg, sizeof msg, "expected %s, found %s", wanted, got);
    return fail_at(P, cur(P)->line, "%s", msg);
}

static int expect_op(parser *P, int op, const char *wanted)
{
    if (!at_op(P, op))
        return unexpected(P, wanted);
    P->pos++;
    return 0;
}

static int expect_end(parser *P) { return cur(P)->kind == TK_BLOCK_END ? (P->pos++, 0) : unexpected(P, "'%}'"); }

static int enter(parser *P)
{
    if (++P->depth > MAX_NESTING)
        return fail_at(P, cur(P)->line, "the template nests blocks or expressions more than %s deep", "200");
    return 0;
}

/* Each link of a chain (a + b + c, x.a.b, x|f|g) makes the tree one level
 * deeper: it counts as nesting until the chain ends (*k links so far). */
static int chain(parser *P, int *k)
{
    (*k)++;
    return enter(P);
}

static jnode *node(parser *P, int kind, int line)
{
    jnode *n = ja_alloc(&P->t->ar, sizeof *n);
    if (!n) {
        cv_errf(P->err, P->errlen, "line %d: out of memory reading the template", line);
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = line;
    n->sym = -1;
    return n;
}

static int nv_push(parser *P, nvec *v, jnode *n)
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

/* Moves v into the arena as (*out, *n); v is freed either way. */
static int nv_done(parser *P, nvec *v, jnode ***out, int *n)
{
    *n = v->n;
    *out = NULL;
    if (v->n > 0) {
        *out = ja_alloc(&P->t->ar, (size_t)v->n * sizeof **out);
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

static jnode *name_node(parser *P, const jtok *t)
{
    jnode *n = node(P, N_NAME, t->line);
    if (!n || (n->sym = intern(P, t->s)) < 0)
        return NULL;
    n->val = jv_str(t->s.p, t->s.n);
    return n;
}

/* ---- expressions ---- */

static int parse_expression(parser *P, bool with_cond, jnode **out);
static int parse_unary(parser *P, bool with_filter, jnode **out);
static int parse_primary(parser *P, jnode **out);
static int parse_postfix(parser *P, jnode **io);
static int parse_tuple(parser *P, bool simplified, bool with_cond, bool parens, bool in_ends, jnode **out);

/* (args): positional into v, name=value into kw. */
static int parse_call_args(parser *P, jnode *n)
{
    nvec pos = {0}, kw = {0};
    int rc = expect_op(P, OP_LPAREN, "'('");
    while (rc == 0 && !at_op(P, OP_RPAREN)) {
        if ((pos.n || kw.n) && ((rc = expect_op(P, OP_COMMA, "',' or ')'")) != 0 || at_op(P, OP_RPAREN)))
            break;
        if (at_op(P, OP_MUL) || at_op(P, OP_POW)) {
            rc = fail_at(P, cur(P)->line, "%s in a call is not supported", at_op(P, OP_MUL) ? "*args" : "**kwargs");
        } else if (cur(P)->kind == TK_NAME && look(P)->kind == TK_OP && look(P)->op == OP_ASSIGN) {
            jnode *k = node(P, N_KWARG, cur(P)->line);
            rc = k ? 0 : -1;
            if (k) {
                k->val = jv_str(cur(P)->s.p, cur(P)->s.n);
                P->pos += 2;
                rc = parse_expression(P, true, &k->a);
            }
            rc = rc ? rc : nv_push(P, &kw, k);
        } else if (kw.n) {
            rc = fail_at(P, cur(P)->line, "a positional argument after a keyword argument%s", "");
        } else {
            jnode *e = NULL;
            rc = parse_expression(P, true, &e);
            rc = rc ? rc : nv_push(P, &pos, e);
        }
    }
    rc = rc ? rc : expect_op(P, OP_RPAREN, "')'");
    int rc2 = nv_done(P, &pos, &n->v, &n->n);
    int rc3 = nv_done(P, &kw, &n->kw, &n->n_kw);
    return rc ? rc : rc2 ? rc2 : rc3;
}

static int parse_dotted_name(parser *P, jstr *out)
{
    if (cur(P)->kind != TK_NAME)
        return unexpected(P, "a name");
    *out = cur(P)->s;
    P->pos++;
    if (at_op(P, OP_DOT))
        return fail_at(P, cur(P)->line, "dotted filter and test names are not supported%s", "");
    return 0;
}

/* |name(args)|name... applied to *io (NULL in a filter block). */
static int parse_filters(parser *P, jnode **io, bool first_inline)
{
    int k = 0;
    while (first_inline || at_op(P, OP_PIPE)) {
        if (chain(P, &k) != 0)
            return -1;
        if (!first_inline)
            P->pos++;
        first_inline = false;
        int line = cur(P)->line;
        jstr name;
        if (parse_dotted_name(P, &name) != 0)
            return -1;
        int id = jf_filter_id(name);
        if (id < 0) {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", name.n > 40 ? 40 : (int)name.n, name.p);
            return fail_at(P, line, "unknown filter '%s'", nm);
        }
        jnode *f = node(P, N_FILTER, line);
        if (!f)
            return -1;
        f->op = (uint8_t)id;
        f->val = jv_str(name.p, name.n);
        f->a = *io;
        if (at_op(P, OP_LPAREN) && parse_call_args(P, f) != 0)
            return -1;
        *io = f;
    }
    P->depth -= k;
    return 0;
}

static bool starts_test_arg(const parser *P)
{
    const jtok *t = cur(P);
    if (t->kind == TK_NAME)
        return !tok_is(t, "else") && !tok_is(t, "or") && !tok_is(t, "and") && !tok_is(t, "is");
    return t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT ||
           (t->kind == TK_OP && (t->op == OP_LBRACKET || t->op == OP_LBRACE));
}

static int parse_test(parser *P, jnode **io)
{
    int line = cur(P)->line;
    P->pos++; /* is */
    bool negated = at_name(P, "not");
    P->pos += negated;
    jstr name;
    if (parse_dotted_name(P, &name) != 0)
        return -1;
    int id = jf_test_id(name);
    if (id < 0) {
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", name.n > 40 ? 40 : (int)name.n, name.p);
        return fail_at(P, line, "unknown test '%s'", nm);
    }
    jnode *t = node(P, N_TEST, line);
    if (!t)
        return -1;
    t->op = (uint8_t)id;
    t->flag = negated;
    t->val = jv_str(name.p, name.n);
    t->a = *io;
    if (at_op(P, OP_LPAREN)) {
        if (parse_call_args(P, t) != 0)
            return -1;
    } else if (starts_test_arg(P)) {
        jnode *arg = NULL;
        if (parse_primary(P, &arg) != 0 || parse_postfix(P, &arg) != 0)
            return -1;
        if (!(t->v = ja_alloc(&P->t->ar, sizeof *t->v)))
            return cv_errf(P->err, P->errlen, "out of memory reading the template");
        t->v[0] = arg;
        t->n = 1;
    }
    *io = t;
    return 0;
}

static int parse_filter_expr(parser *P, jnode **io)
{
    for (int k = 0;;) {
        if (chain(P, &k) != 0)
            return -1;
        int rc = 0;
        if (at_op(P, OP_PIPE)) {
            rc = parse_filters(P, io, false);
        } else if (at_name(P, "is")) {
            rc = parse_test(P, io);
        } else if (at_op(P, OP_LPAREN)) {
            jnode *c = node(P, N_CALL, cur(P)->line);
            rc = c ? parse_call_args(P, c) : -1;
            if (c)
                c->a = *io, *io = c;
        } else {
            P->depth -= k;
            return 0;
        }
        if (rc != 0)
            return rc;
    }
}

/* [start:stop:step] after the opening bracket, or a plain index. */
static int parse_subscribed(parser *P, jnode **out)
{
    jnode *parts[3] = {NULL, NULL, NULL};
    int line = cur(P)->line;
    if (!at_op(P, OP_COLON)) {
        if (parse_expression(P, true, &parts[0]) != 0)
            return -1;
        if (!at_op(P, OP_COLON)) {
            *out = parts[0];
            return 0;
        }
    }
    for (int k = 1; k < 3 && at_op(P, OP_COLON); k++) {
        P->pos++;
        if (!at_op(P, OP_COLON) && !at_op(P, OP_RBRACKET) && !at_op(P, OP_COMMA) &&
            parse_expression(P, true, &parts[k]) != 0)
            return -1;
    }
    jnode *s = node(P, N_SLICE, line);
    if (!s)
        return -1;
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    *out = s;
    return 0;
}

static int parse_subscript(parser *P, jnode **io)
{
    int line = cur(P)->line;
    if (at_op(P, OP_DOT)) {
        P->pos++;
        const jtok *t = cur(P);
        jnode *n = node(P, t->kind == TK_NAME ? N_ATTR : N_ITEM, line);
        if (!n)
            return -1;
        if (t->kind == TK_NAME) {
            n->val = jv_str(t->s.p, t->s.n);
        } else if (t->kind == TK_INT) {
            if (!(n->b = node(P, N_CONST, line)))
                return -1;
            n->b->val = jv_int(t->i);
        } else {
            return unexpected(P, "a name or a number after '.'");
        }
        P->pos++;
        n->a = *io;
        *io = n;
        return 0;
    }
    P->pos++; /* [ */
    jnode *key = NULL;
    if (parse_subscribed(P, &key) != 0)
        return -1;
    if (at_op(P, OP_COMMA))
        return fail_at(P, line, "a tuple as a subscript is not supported%s", "");
    if (expect_op(P, OP_RBRACKET, "']'") != 0)
        return -1;
    if (key->kind == N_SLICE) {
        key->a = *io;
        *io = key;
        return 0;
    }
    jnode *n = node(P, N_ITEM, line);
    if (!n)
        return -1;
    n->a = *io;
    n->b = key;
    *io = n;
    return 0;
}

static int parse_postfix(parser *P, jnode **io)
{
    for (int k = 0;;) {
        if (chain(P, &k) != 0)
            return -1;
        int rc;
        if (at_op(P, OP_DOT) || at_op(P, OP_LBRACKET)) {
            rc = parse_subscript(P, io);
        } else if (at_op(P, OP_LPAREN)) {
            jnode *c = node(P, N_CALL, cur(P)->line);
            rc = c ? parse_call_args(P, c) : -1;
            if (c)
                c->a = *io, *io = c;
        } else {
            P->depth -= k;
            return 0;
        }
        if (rc != 0)
            return rc;
    }
}

/* [a, b] or {k: v, ...} after the opening bracket. */
static int parse_list_or_dict(parser *P, bool dict, jnode *n)
{
    nvec keys = {0}, vals = {0};
    int rc = 0;
    int close = dict ? OP_RBRACE : OP_RBRACKET;
    while (rc == 0 && !at_op(P, close)) {
        if (keys.n && ((rc = expect_op(P, OP_COMMA, dict ? "',' or '}'" : "',' or ']'")) != 0 || at_op(P, close)))
            break;
        jnode *k = NULL, *v = NULL;
        rc = parse_expression(P, true, &k);
        rc = rc ? rc : nv_push(P, &keys, k);
        if (rc == 0 && dict) {
            rc = expect_op(P, OP_COLON, "':'");
            rc = rc ? rc : parse_expression(P, true, &v);
            rc = rc ? rc : nv_push(P, &vals, v);
        }
    }
    rc = rc ? rc : expect_op(P, close, dict ? "'}'" : "']'");
    int rc2 = nv_done(P, &keys, &n->v, &n->n);
    int rc3 = nv_done(P, &vals, &n->kw, &n->n_kw);
    return rc ? rc : rc2 ? rc2 : rc3;
}

static int parse_literal_name(parser *P, const jtok *t, jnode **out)
{
    static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
    for (int k = 0; k < 6; k++)
        if (tok_is(t, consts[k])) {
            if (!(*out = node(P, N_CONST, t->line)))
                return -1;
            (*out)->val = k < 4 ? jv_bool(k < 2) : jv_none();
            P->pos++;
            return 0;
        }
    P->pos++;
    return (*out = name_node(P, t)) ? 0 : -1;
}

/* Adjacent string literals join, as in Python. */
static int parse_strings(parser *P, jnode *n)
{
    size_t total = 0;
    size_t from = P->pos;
    while (cur(P)->kind == TK_STRING)
        total += cur(P)->s.n, P->pos++;
    if (P->pos - from == 1) {
        n->val = jv_str(P->tok[from].s.p, P->tok[from].s.n);
        return 0;
    }
    char *p = ja_alloc(&P->t->ar, total + 1);
    if (!p)
        return cv_errf(P->err, P->errlen, "out of memory reading the template");
    size_t o = 0;
    for (size_t i = from; i < P->pos; i++) {
        memcpy(p + o, P->tok[i].s.p, P->tok[i].s.n);
        o += P->tok[i].s.n;
    }
    n->val = jv_str(p, total);
    return 0;
}

static int parse_primary(parser *P, jnode **out)
{
    const jtok *t = cur(P);
    if (enter(P) != 0)
        return -1;
    int rc;
    if (t->kind == TK_NAME) {
        rc = parse_literal_name(P, t, out);
    } else if (t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT) {
        rc = (*out = node(P, N_CONST, t->line)) ? 0 : -1;
        if (rc == 0 && t->kind == TK_STRING)
            rc = parse_strings(P, *out);
        else if (rc == 0)
            (*out)->val = t->kind == TK_INT ? jv_int(t->i) : jv_float(t->f), P->pos++;
    } else if (at_op(P, OP_LPAREN)) {
        P->pos++;
        rc = parse_tuple(P, false, true, true, false, out);
        rc = rc ? rc : expect_op(P, OP_RPAREN, "')'");
    } else if (at_op(P, OP_LBRACKET) || at_op(P, OP_LBRACE)) {
        bool dict = at_op(P, OP_LBRACE);
        rc = (*out = node(P, dict ? N_DICT : N_LIST, t->line)) ? 0 : -1;
        P->pos++;
        rc = rc ? rc : parse_list_or_dict(P, dict, *out);
    } else {
        rc = unexpected(P, "an expression");
    }
    P->depth--;
    return rc;
}

static int parse_unary(parser *P, bool with_filter, jnode **out)
{
    if (enter(P) != 0)
        return -1;
    int rc;
    if (at_op(P, OP_SUB) || at_op(P, OP_ADD)) {
        jnode *n = node(P, at_op(P, OP_SUB) ? N_NEG : N_POS, cur(P)->line);
        P->pos++;
        rc = n ? parse_unary(P, false, &n->a) : -1;
        *out = n;
    } else {
        rc = parse_primary(P, out);
    }
    rc = rc ? rc : parse_postfix(P, out);
    if (rc == 0 && with_filter)
        rc = parse_filter_expr(P, out);
    P->depth--;
    return rc;
}

static int binary(parser *P, int kind, int op, jnode **io, jnode *right, int line)
{
    jnode *n = node(P, kind, line);
    if (!n)
        return -1;
    n->op = (uint8_t)op;
    n->a = *io;
    n->b = right;
    *io = n;
    return 0;
}

/* Operand parsers of the binary levels, and the operators of each. */
typedef int (*operand_fn)(parser *P, jnode **out);
static int unary_filtered(parser *P, jnode **out) { return parse_unary(P, true, out); }
static bool at_pow(parser *P) { return at_op(P, OP_POW); }
static bool at_mul(parser *P)
{
    return at_op(P, OP_MUL) || at_op(P, OP_DIV) || at_op(P, OP_FLOORDIV) || at_op(P, OP_MOD);
}
static bool at_add(parser *P) { return at_op(P, OP_ADD) || at_op(P, OP_SUB); }
static bool at_and(parser *P) { return at_name(P, "and"); }
static bool at_or(parser *P) { return at_name(P, "or"); }

/* One left-associative level: operands parsed by next, joined by the
 * operators at() accepts into nodes of kind (N_BIN nodes keep the token's
 * operator). */
static int parse_left(parser *P, operand_fn next, bool (*at)(parser *), int kind, jnode **out)
{
    if (next(P, out) != 0)
        return -1;
    int k = 0;
    while (at(P)) {
        if (chain(P, &k) != 0)
            return -1;
        const int op = kind == N_BIN ? cur(P)->op : OP_NONE, line = cur(P)->line;
        jnode *r = NULL;
        P->pos++;
        if (next(P, &r) != 0 || binary(P, kind, op, out, r, line) != 0)
            return -1;
    }
    P->depth -= k;
    return 0;
}

static int parse_pow(parser *P, jnode **out) { return parse_left(P, unary_filtered, at_pow, N_BIN, out); }
static int parse_math2(parser *P, jnode **out) { return parse_left(P, parse_pow, at_mul, N_BIN, out); }

static int parse_concat(parser *P, jnode **out)
{
    if (parse_math2(P, out) != 0)
        return -1;
    if (!at_op(P, OP_TILDE))
        return 0;
    jnode *n = node(P, N_CONCAT, cur(P)->line);
    nvec parts = {0};
    int rc = n ? nv_push(P, &parts, *out) : -1;
    while (rc == 0 && at_op(P, OP_TILDE)) {
        jnode *r = NULL;
        P->pos++;
        rc = parse_math2(P, &r);
        rc = rc ? rc : nv_push(P, &parts, r);
    }
    int rc2 = n ? nv_done(P, &parts, &n->v, &n->n) : (cv_free(parts.v), -1);
    *out = n;
    return rc ? rc : rc2;
}

static int parse_math1(parser *P, jnode **out) { return parse_left(P, parse_concat, at_add, N_BIN, out); }

/* The comparison operator at the cursor (consumed), or OP_NONE. */
static int compare_op(parser *P)
{
    const jtok *t = cur(P);
    if (t->kind == TK_OP && t->op >= OP_EQ && t->op <= OP_LE) {
        P->pos++;
        return t->op;
    }
    if (tok_is(t, "in")) {
        P->pos++;
        return OP_IN;
    }
    if (tok_is(t, "not") && tok_is(look(P), "in")) {
        P->pos += 2;
        return OP_NOTIN;
    }
    return OP_NONE;
}

static int parse_compare(parser *P, jnode **out)
{
    int line = cur(P)->line;
    if (parse_math1(P, out) != 0)
        return -1;
    nvec ops = {0};
    int op, rc = 0;
    while (rc == 0 && (op = compare_op(P)) != OP_NONE) {
        jnode *o = node(P, N_CMP, cur(P)->line);
        rc = o ? parse_math1(P, &o->a) : -1;
        if (rc == 0)
            o->op = (uint8_t)op, rc = nv_push(P, &ops, o);
    }
    if (rc != 0 || ops.n == 0) {
        cv_free(ops.v);
        return rc;
    }
    jnode *n = node(P, N_CMP, line);
    if (!n) {
        cv_free(ops.v);
        return -1;
    }
    n->a = *out;
    *out = n;
    return nv_done(P, &ops, &n->v, &n->n);
}

static int parse_not(parser *P, jnode **out)
{
    if (!at_name(P, "not"))
        return parse_compare(P, out);
    if (enter(P) != 0)
        return -1;
    jnode *n = node(P, N_NOT, cur(P)->line);
    P->pos++;
    int rc = n ? parse_not(P, &n->a) : -1;
    *out = n;
    P->depth--;
    return rc;
}

static int parse_and(parser *P, jnode **out) { return parse_left(P, parse_not, at_and, N_AND, out); }

static int parse_or(parser *P, jnode **out) { return parse_left(P, parse_and, at_or, N_OR, out); }

static int parse_expression(parser *P, bool with_cond, jnode **out)
{
    if (enter(P) != 0)
        return -1;
    int rc = parse_or(P, out), k = 0;
    while (rc == 0 && with_cond && at_name(P, "if")) {
        if (chain(P, &k) != 0)
            return -1;
        jnode *n = node(P, N_COND, cur(P)->line);
        P->pos++;
        rc = n ? parse_or(P, &n->b) : -1;
        if (rc == 0 && at_name(P, "else")) {
            P->pos++;
            rc = parse_expression(P, true, &n->c);
        }
        if (n)
            n->a = *out, *out = n;
    }
    P->depth -= k + 1;
    return rc;
}

static bool tuple_end(const parser *P, bool in_ends)
{
    const jtok *t = cur(P);
    return t->kind == TK_VAR_END || t->kind == TK_BLOCK_END || (t->kind == TK_OP && t->op == OP_RPAREN) ||
           (in_ends && tok_is(t, "in"));
}

/* Jinja2's parse_tuple: one expression, or a tuple when commas follow. */
static int parse_tuple(parser *P, bool simplified, bool with_cond, bool parens, bool in_ends, jnode **out)
{
    int line = cur(P)->line;
    nvec items = {0};
    bool is_tuple = false;
    int rc = 0;
    for (;;) {
        if (items.n && (rc = expect_op(P, OP_COMMA, "','")) != 0)
            break;
        if (tuple_end(P, in_ends))
            break;
        jnode *e = NULL;
        rc = simplified ? parse_primary(P, &e) : parse_expression(P, with_cond, &e);
        if (rc != 0 || (rc = nv_push(P, &items, e)) != 0)
            break;
        if (!at_op(P, OP_COMMA))
            break;
        is_tuple = true;
    }
    if (rc == 0 && !is_tuple && items.n == 1) {
        *out = items.v[0];
        cv_free(items.v);
        return 0;
    }
    if (rc == 0 && !is_tuple && !parens)
        rc = unexpected(P, "an expression");
    jnode *n = rc == 0 ? node(P, N_TUPLE, line) : NULL;
    if (rc != 0 || !n) {
        cv_free(items.v);
        return -1;
    }
    *out = n;
    return nv_done(P, &items, &n->v, &n->n);
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
        jnode *n = node(P, N_ATTR, cur(P)->line);
        if (!n || !(n->a = name_node(P, cur(P))))
            return -1;
        P->pos += 2;
        if (cur(P)->kind != TK_NAME)
            return unexpected(P, "an attribute name");
        n->val = jv_str(cur(P)->s.p, cur(P)->s.n);
        P->pos++;
        *out = n;
        return 0;
    }
    if (parse_tuple(P, true, false, false, true, out) != 0)
        return -1;
    bool ok = (*out)->kind == N_NAME;
    if ((*out)->kind == N_TUPLE) {
        ok = true;
        for (int i = 0; i < (*out)->n; i++)
            ok = ok && (*out)->v[i]->kind == N_NAME;
    }
    return ok ? 0 : fail_at(P, (*out)->line, "cannot assign to this expression%s", "");
}

static int parse_if(parser *P, int line, jnode **out)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    jnode *n = node(P, N_IF, line);
    if (!n || parse_tuple(P, false, false, false, false, &n->a) != 0 || expect_end(P) != 0)
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
        if (enter(P) != 0 || parse_if(P, t->line, &n->b) != 0)
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
    jnode *n = node(P, N_FOR, line);
    if (!n || parse_target(P, false, &n->a) != 0)
        return -1;
    if (!at_name(P, "in"))
        return unexpected(P, "'in'");
    P->pos++;
    if (parse_tuple(P, false, false, false, false, &n->b) != 0)
        return -1;
    if (at_name(P, "if")) {
        P->pos++;
        if (parse_expression(P, true, &n->c) != 0)
            return -1;
    }
    if (at_name(P, "recursive"))
        return fail_at(P, cur(P)->line, "recursive for loops are not supported%s", "");
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
        jnode *n = node(P, N_SET, line);
        if (!n)
            return -1;
        n->a = target;
        P->pos++;
        *out = n;
        if (parse_tuple(P, false, true, false, false, &n->b) != 0)
            return -1;
        return expect_end(P);
    }
    if (at_op(P, OP_PIPE))
        return fail_at(P, line, "a filtered block set is not supported%s", "");
    if (target->kind == N_TUPLE)
        return fail_at(P, line, "a block set needs one name%s", "");
    jnode *n = node(P, N_SETBLOCK, line), *body = NULL;
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
    int rc = expect_op(P, OP_LPAREN, "'('");
    while (rc == 0 && !at_op(P, OP_RPAREN)) {
        if (ps.n && ((rc = expect_op(P, OP_COMMA, "',' or ')'")) != 0 || at_op(P, OP_RPAREN)))
            break;
        if (cur(P)->kind != TK_NAME) {
            rc = unexpected(P, "a parameter name");
            break;
        }
        jnode *p = node(P, N_PARAM, cur(P)->line);
        if (!p || (p->sym = intern(P, cur(P)->s)) < 0) {
            rc = -1;
            break;
        }
        p->val = jv_str(cur(P)->s.p, cur(P)->s.n);
        P->pos++;
        if (at_op(P, OP_ASSIGN)) {
            P->pos++;
            rc = parse_expression(P, true, &p->a);
        } else if (ps.n && ps.v[ps.n - 1]->a) {
            rc = fail_at(P, p->line, "a parameter without a default after one with a default%s", "");
        }
        rc = rc ? rc : nv_push(P, &ps, p);
    }
    rc = rc ? rc : expect_op(P, OP_RPAREN, "')'");
    int rc2 = nv_done(P, &ps, &n->kw, &n->n_kw);
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
    jnode *n = node(P, N_MACRO, line);
    if (!n)
        return -1;
    if (cur(P)->kind != TK_NAME)
        return unexpected(P, "a macro name");
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
    jnode *n = node(P, N_CALLBLOCK, line);
    if (!n)
        return -1;
    *out = n;
    if (at_op(P, OP_LPAREN) && parse_params(P, n) != 0)
        return -1;
    if (parse_expression(P, true, &n->a) != 0)
        return -1;
    if (n->a->kind != N_CALL)
        return fail_at(P, line, "a call block needs a call%s", "");
    return parse_macro_body(P, n, "call", "endcall");
}

static int parse_filter_block(parser *P, int line, jnode **out)
{
    static const char *const end[] = {"endfilter", NULL};
    jnode *n = node(P, N_FILTERBLOCK, line), *body = NULL;
    if (!n || parse_filters(P, &n->a, true) != 0)
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
        return fail_at(P, line, "'%s' outside a for loop", is_break ? "break" : "continue");
    if (!(*out = node(P, is_break ? N_BREAK : N_CONTINUE, line)))
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
        return unexpected(P, "a tag name");
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
            return fail_at(P, line, "the tag '%s' is not supported", nm);
    return fail_at(P, line, "unexpected tag '%s'", nm);
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
    return fail_at(P, cur(P)->line, "%s", msg);
}

/* One item of a body: text, {{ expr }} or a statement (NULL for a stop tag). */
static int parse_item(parser *P, const stop_set *stop, jnode **out)
{
    const jtok *t = cur(P);
    *out = NULL;
    if (t->kind == TK_TEXT) {
        P->pos++;
        if (!(*out = node(P, N_TEXT, t->line)))
            return -1;
        (*out)->val = jv_str(t->s.p, t->s.n);
        return 0;
    }
    if (t->kind == TK_VAR_BEGIN) {
        P->pos++;
        if (!(*out = node(P, N_OUT, t->line)) || parse_tuple(P, false, true, false, false, &(*out)->a) != 0)
            return -1;
        return cur(P)->kind == TK_VAR_END ? (P->pos++, 0) : unexpected(P, "'}}'");
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
    if (enter(P) != 0)
        return -1;
    jnode *body = node(P, N_BODY, cur(P)->line);
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
        rc = rc ? rc : nv_push(P, &items, item);
    }
    int rc2 = body ? nv_done(P, &items, &body->v, &body->n) : (cv_free(items.v), -1);
    *out = body;
    P->depth--;
    return rc ? rc : rc2;
}

/* ---- the template ---- */

/* The source with \r\n and \r read as \n and one trailing newline dropped. */
static char *normalize(jarena *ar, const char *src, size_t len, size_t *out_len)
{
    char *s = ja_alloc(ar, len + 1);
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
    t->names = ja_alloc(&t->ar, (size_t)P->n_names * sizeof *t->names);
    t->global_of = ja_alloc(&t->ar, (size_t)P->n_names);
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
    int rc = jx_lex(&lx, s, n);
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
    ja_release(&t->ar);
    cv_free(t);
}
