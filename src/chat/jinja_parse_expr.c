/* jinja_parse_expr.c: the Jinja parser's expressions (jinja_parser.h).
 *
 * A recursive-descent parser with Jinja2's grammar and precedence, loosest
 * first: a if c else b; or; and; not; comparisons (chained) and in/not in;
 * + -; ~; * / // %; **; unary - +; then primaries with their postfixes
 * (.name, [index], [a:b:c], calls) and their filters (|f) and tests
 * (is [not] t). Filters and tests are resolved here, so an unknown one is a
 * parse error naming it and its line, as in Jinja2. Every recursion counts
 * against the nesting bound (cv_jp_enter). */
#include <stdio.h>
#include <string.h>

#include "chat/jinja_parser.h"
#include "core/alloc.h"

/* Each link of a chain (a + b + c, x.a.b, x|f|g) makes the tree one level
 * deeper: it counts as nesting until the chain ends (*k links so far). */
static int chain(parser *P, int *k)
{
    (*k)++;
    return cv_jp_enter(P);
}

static int parse_unary(parser *P, bool with_filter, jnode **out);
static int parse_primary(parser *P, jnode **out);
static int parse_postfix(parser *P, jnode **io);

/* (args): positional into v, name=value into kw. */
static int parse_call_args(parser *P, jnode *n)
{
    nvec pos = {0}, kw = {0};
    int rc = cv_jp_expect_op(P, OP_LPAREN, "'('");
    while (rc == 0 && !at_op(P, OP_RPAREN)) {
        if ((pos.n || kw.n) && ((rc = cv_jp_expect_op(P, OP_COMMA, "',' or ')'")) != 0 || at_op(P, OP_RPAREN)))
            break;
        if (at_op(P, OP_MUL) || at_op(P, OP_POW)) {
            rc = cv_jp_fail_at(P, cur(P)->line, "%s in a call is not supported",
                               at_op(P, OP_MUL) ? "*args" : "**kwargs");
        } else if (cur(P)->kind == TK_NAME && look(P)->kind == TK_OP && look(P)->op == OP_ASSIGN) {
            jnode *k = cv_jp_node(P, N_KWARG, cur(P)->line);
            rc = k ? 0 : -1;
            if (k) {
                k->val = jv_str(cur(P)->s.p, cur(P)->s.n);
                P->pos += 2;
                rc = cv_jp_parse_expression(P, true, &k->a);
            }
            rc = rc ? rc : cv_jp_nv_push(P, &kw, k);
        } else if (kw.n) {
            rc = cv_jp_fail_at(P, cur(P)->line, "a positional argument after a keyword argument%s", "");
        } else {
            jnode *e = NULL;
            rc = cv_jp_parse_expression(P, true, &e);
            rc = rc ? rc : cv_jp_nv_push(P, &pos, e);
        }
    }
    rc = rc ? rc : cv_jp_expect_op(P, OP_RPAREN, "')'");
    int rc2 = cv_jp_nv_done(P, &pos, &n->v, &n->n);
    int rc3 = cv_jp_nv_done(P, &kw, &n->kw, &n->n_kw);
    return rc ? rc : rc2 ? rc2 : rc3;
}

/* A filter's or a test's node (kind) named name, whose id is the engine's
 * (negative: unknown, refused naming it; NULL then, or out of memory). */
static jnode *named_node(parser *P, int kind, int line, jstr name, int id, const char *what)
{
    if (id < 0) {
        char msg[80];
        snprintf(msg, sizeof msg, "unknown %s '%.*s'", what, name.n > 40 ? 40 : (int)name.n, name.p);
        cv_jp_fail_at(P, line, "%s", msg);
        return NULL;
    }
    jnode *n = cv_jp_node(P, kind, line);
    if (n) {
        n->op = (uint8_t)id;
        n->val = jv_str(name.p, name.n);
    }
    return n;
}

static int parse_dotted_name(parser *P, jstr *out)
{
    if (cur(P)->kind != TK_NAME)
        return cv_jp_unexpected(P, "a name");
    *out = cur(P)->s;
    P->pos++;
    if (at_op(P, OP_DOT))
        return cv_jp_fail_at(P, cur(P)->line, "dotted filter and test names are not supported%s", "");
    return 0;
}

/* |name(args)|name... applied to *io (NULL in a filter block). */
int cv_jp_parse_filters(parser *P, jnode **io, bool first_inline)
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
        jnode *f = named_node(P, N_FILTER, line, name, cv_jf_filter_id(name), "filter");
        if (!f)
            return -1;
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
    jnode *t = named_node(P, N_TEST, line, name, cv_jf_test_id(name), "test");
    if (!t)
        return -1;
    t->flag = negated;
    t->a = *io;
    if (at_op(P, OP_LPAREN)) {
        if (parse_call_args(P, t) != 0)
            return -1;
    } else if (starts_test_arg(P)) {
        jnode *arg = NULL;
        if (parse_primary(P, &arg) != 0 || parse_postfix(P, &arg) != 0)
            return -1;
        if (!(t->v = cv_ja_alloc(&P->t->ar, sizeof *t->v)))
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
            rc = cv_jp_parse_filters(P, io, false);
        } else if (at_name(P, "is")) {
            rc = parse_test(P, io);
        } else if (at_op(P, OP_LPAREN)) {
            jnode *c = cv_jp_node(P, N_CALL, cur(P)->line);
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
        if (cv_jp_parse_expression(P, true, &parts[0]) != 0)
            return -1;
        if (!at_op(P, OP_COLON)) {
            *out = parts[0];
            return 0;
        }
    }
    for (int k = 1; k < 3 && at_op(P, OP_COLON); k++) {
        P->pos++;
        if (!at_op(P, OP_COLON) && !at_op(P, OP_RBRACKET) && !at_op(P, OP_COMMA) &&
            cv_jp_parse_expression(P, true, &parts[k]) != 0)
            return -1;
    }
    jnode *s = cv_jp_node(P, N_SLICE, line);
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
        jnode *n = cv_jp_node(P, t->kind == TK_NAME ? N_ATTR : N_ITEM, line);
        if (!n)
            return -1;
        if (t->kind == TK_NAME) {
            n->val = jv_str(t->s.p, t->s.n);
        } else if (t->kind == TK_INT) {
            if (!(n->b = cv_jp_node(P, N_CONST, line)))
                return -1;
            n->b->val = jv_int(t->i);
        } else {
            return cv_jp_unexpected(P, "a name or a number after '.'");
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
        return cv_jp_fail_at(P, line, "a tuple as a subscript is not supported%s", "");
    if (cv_jp_expect_op(P, OP_RBRACKET, "']'") != 0)
        return -1;
    if (key->kind == N_SLICE) {
        key->a = *io;
        *io = key;
        return 0;
    }
    jnode *n = cv_jp_node(P, N_ITEM, line);
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
            jnode *c = cv_jp_node(P, N_CALL, cur(P)->line);
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
        if (keys.n && ((rc = cv_jp_expect_op(P, OP_COMMA, dict ? "',' or '}'" : "',' or ']'")) != 0 || at_op(P, close)))
            break;
        jnode *k = NULL, *v = NULL;
        rc = cv_jp_parse_expression(P, true, &k);
        rc = rc ? rc : cv_jp_nv_push(P, &keys, k);
        if (rc == 0 && dict) {
            rc = cv_jp_expect_op(P, OP_COLON, "':'");
            rc = rc ? rc : cv_jp_parse_expression(P, true, &v);
            rc = rc ? rc : cv_jp_nv_push(P, &vals, v);
        }
    }
    rc = rc ? rc : cv_jp_expect_op(P, close, dict ? "'}'" : "']'");
    int rc2 = cv_jp_nv_done(P, &keys, &n->v, &n->n);
    int rc3 = cv_jp_nv_done(P, &vals, &n->kw, &n->n_kw);
    return rc ? rc : rc2 ? rc2 : rc3;
}

static int parse_literal_name(parser *P, const jtok *t, jnode **out)
{
    static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
    for (int k = 0; k < 6; k++)
        if (tok_is(t, consts[k])) {
            if (!(*out = cv_jp_node(P, N_CONST, t->line)))
                return -1;
            (*out)->val = k < 4 ? jv_bool(k < 2) : jv_none();
            P->pos++;
            return 0;
        }
    P->pos++;
    return (*out = cv_jp_name_node(P, t)) ? 0 : -1;
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
    char *p = cv_ja_alloc(&P->t->ar, total + 1);
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
    if (cv_jp_enter(P) != 0)
        return -1;
    int rc;
    if (t->kind == TK_NAME) {
        rc = parse_literal_name(P, t, out);
    } else if (t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT) {
        rc = (*out = cv_jp_node(P, N_CONST, t->line)) ? 0 : -1;
        if (rc == 0 && t->kind == TK_STRING)
            rc = parse_strings(P, *out);
        else if (rc == 0)
            (*out)->val = t->kind == TK_INT ? jv_int(t->i) : jv_float(t->f), P->pos++;
    } else if (at_op(P, OP_LPAREN)) {
        P->pos++;
        rc = cv_jp_parse_tuple(P, false, true, true, false, out);
        rc = rc ? rc : cv_jp_expect_op(P, OP_RPAREN, "')'");
    } else if (at_op(P, OP_LBRACKET) || at_op(P, OP_LBRACE)) {
        bool dict = at_op(P, OP_LBRACE);
        rc = (*out = cv_jp_node(P, dict ? N_DICT : N_LIST, t->line)) ? 0 : -1;
        P->pos++;
        rc = rc ? rc : parse_list_or_dict(P, dict, *out);
    } else {
        rc = cv_jp_unexpected(P, "an expression");
    }
    P->depth--;
    return rc;
}

static int parse_unary(parser *P, bool with_filter, jnode **out)
{
    if (cv_jp_enter(P) != 0)
        return -1;
    int rc;
    if (at_op(P, OP_SUB) || at_op(P, OP_ADD)) {
        jnode *n = cv_jp_node(P, at_op(P, OP_SUB) ? N_NEG : N_POS, cur(P)->line);
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
    jnode *n = cv_jp_node(P, kind, line);
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
    jnode *n = cv_jp_node(P, N_CONCAT, cur(P)->line);
    nvec parts = {0};
    int rc = n ? cv_jp_nv_push(P, &parts, *out) : -1;
    while (rc == 0 && at_op(P, OP_TILDE)) {
        jnode *r = NULL;
        P->pos++;
        rc = parse_math2(P, &r);
        rc = rc ? rc : cv_jp_nv_push(P, &parts, r);
    }
    int rc2 = n ? cv_jp_nv_done(P, &parts, &n->v, &n->n) : (cv_free(parts.v), -1);
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
        jnode *o = cv_jp_node(P, N_CMP, cur(P)->line);
        rc = o ? parse_math1(P, &o->a) : -1;
        if (rc == 0)
            o->op = (uint8_t)op, rc = cv_jp_nv_push(P, &ops, o);
    }
    if (rc != 0 || ops.n == 0) {
        cv_free(ops.v);
        return rc;
    }
    jnode *n = cv_jp_node(P, N_CMP, line);
    if (!n) {
        cv_free(ops.v);
        return -1;
    }
    n->a = *out;
    *out = n;
    return cv_jp_nv_done(P, &ops, &n->v, &n->n);
}

static int parse_not(parser *P, jnode **out)
{
    if (!at_name(P, "not"))
        return parse_compare(P, out);
    if (cv_jp_enter(P) != 0)
        return -1;
    jnode *n = cv_jp_node(P, N_NOT, cur(P)->line);
    P->pos++;
    int rc = n ? parse_not(P, &n->a) : -1;
    *out = n;
    P->depth--;
    return rc;
}

static int parse_and(parser *P, jnode **out) { return parse_left(P, parse_not, at_and, N_AND, out); }

static int parse_or(parser *P, jnode **out) { return parse_left(P, parse_and, at_or, N_OR, out); }

int cv_jp_parse_expression(parser *P, bool with_cond, jnode **out)
{
    if (cv_jp_enter(P) != 0)
        return -1;
    int rc = parse_or(P, out), k = 0;
    while (rc == 0 && with_cond && at_name(P, "if")) {
        if (chain(P, &k) != 0)
            return -1;
        jnode *n = cv_jp_node(P, N_COND, cur(P)->line);
        P->pos++;
        rc = n ? parse_or(P, &n->b) : -1;
        if (rc == 0 && at_name(P, "else")) {
            P->pos++;
            rc = cv_jp_parse_expression(P, true, &n->c);
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
int cv_jp_parse_tuple(parser *P, bool simplified, bool with_cond, bool parens, bool in_ends, jnode **out)
{
    int line = cur(P)->line;
    nvec items = {0};
    bool is_tuple = false;
    int rc = 0;
    for (;;) {
        if (items.n && (rc = cv_jp_expect_op(P, OP_COMMA, "','")) != 0)
            break;
        if (tuple_end(P, in_ends))
            break;
        jnode *e = NULL;
        rc = simplified ? parse_primary(P, &e) : cv_jp_parse_expression(P, with_cond, &e);
        if (rc != 0 || (rc = cv_jp_nv_push(P, &items, e)) != 0)
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
        rc = cv_jp_unexpected(P, "an expression");
    jnode *n = rc == 0 ? cv_jp_node(P, N_TUPLE, line) : NULL;
    if (rc != 0 || !n) {
        cv_free(items.v);
        return -1;
    }
    *out = n;
    return cv_jp_nv_done(P, &items, &n->v, &n->n);
}
