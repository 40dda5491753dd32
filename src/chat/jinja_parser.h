/* jinja_parser.h: the parser's state and helpers, shared by the two halves
 * of the Jinja parser and by nothing else: jinja_parse.c (statements, the
 * template, cv_jinja_parse) and jinja_parse_expr.c (expressions). jinja_impl.h
 * is the engine's shared insides; this is the parser's alone.
 *
 * Errors: a function that can fail returns -1 (NULL for cv_jp_node and
 * cv_jp_name_node) after writing "line N: ..." into P->err. Every recursion
 * goes through cv_jp_enter, which fails past the nesting bound, and gives its
 * level back (P->depth--) when it returns. */
#ifndef CONVOY_CHAT_JINJA_PARSER_H
#define CONVOY_CHAT_JINJA_PARSER_H

#include <stdbool.h>
#include <string.h>

#include "chat/jinja_impl.h"

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

static inline const jtok *cur(const parser *P) { return &P->tok[P->pos]; }
static inline const jtok *look(const parser *P) { return cur(P)->kind == TK_EOF ? cur(P) : &P->tok[P->pos + 1]; }
static inline bool at_op(const parser *P, int op) { return cur(P)->kind == TK_OP && cur(P)->op == op; }

static inline bool tok_is(const jtok *t, const char *name)
{
    size_t n = strlen(name);
    return t->kind == TK_NAME && t->s.n == n && memcmp(t->s.p, name, n) == 0;
}

static inline bool at_name(const parser *P, const char *name) { return tok_is(cur(P), name); }

/* jinja_parse.c: errors, nesting, nodes and names. */
int cv_jp_fail_at(parser *P, int line, const char *fmt, const char *arg);
int cv_jp_unexpected(parser *P, const char *wanted);
int cv_jp_expect_op(parser *P, int op, const char *wanted);
int cv_jp_enter(parser *P);
jnode *cv_jp_node(parser *P, int kind, int line);
int cv_jp_nv_push(parser *P, nvec *v, jnode *n);
/* Moves v into the arena as (*out, *n); v is freed either way. */
int cv_jp_nv_done(parser *P, nvec *v, jnode ***out, int *n);
jnode *cv_jp_name_node(parser *P, const jtok *t);

/* jinja_parse_expr.c: an expression (with `a if c else b` when with_cond),
 * Jinja2's parse_tuple (one expression, or a tuple when commas follow), and
 * the filters |name(args)|name... applied to *io (NULL in a filter block). */
int cv_jp_parse_expression(parser *P, bool with_cond, jnode **out);
int cv_jp_parse_tuple(parser *P, bool simplified, bool with_cond, bool parens, bool in_ends, jnode **out);
int cv_jp_parse_filters(parser *P, jnode **io, bool first_inline);

#endif
