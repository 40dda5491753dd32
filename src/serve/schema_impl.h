/* schema_impl.h: what the files of the schema compiler share, private to
 * them: the compilation's context, its rule table and $ref targets, and
 * the functions one file calls in another. schema.c holds the frame
 * (helpers, rules, primitives, $ref, one schema by keyword), schema_scalar.c
 * enum/const, strings and numbers, schema_compose.c objects, arrays and
 * allOf. Every cv_schema_gen_* returns a GBNF expression (malloc'd,
 * parenthesized when it has alternatives) or NULL after a failure, which
 * the context keeps (the first one wins). */
#ifndef CONVOY_SERVE_SCHEMA_IMPL_H
#define CONVOY_SERVE_SCHEMA_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"
#include "serve/buf.h"
#include "serve/schema.h"

typedef struct rule {
    char *name, *body; /* body NULL while a $ref target is being compiled */
    size_t body_len;   /* compared first when bodies are deduplicated */
} rule;

typedef struct ref {
    char *ptr, *name;
    int done, depth;
} ref;

typedef struct ctx {
    const json_t *root;
    rule *rules;
    int nrules, caprules;
    ref *refs;
    int nrefs, caprefs;
    int depth; /* structural characters consumed on the way here (for $ref cycles) */
    int nesting;  /* subschemas open on the way here */
    size_t text;  /* bytes of the rules so far */
    char path[1024];
    size_t plen;
    char *err;
    size_t errlen;
    bool failed;
} ctx;

/* schema.c: helpers */
char *cv_schema_xfmt(const char *fmt, ...) CV_PRINTF(1, 2);
char *cv_schema_xstrdup(const char *s);
/* Records the failure at the current path (the first one wins); returns NULL. */
void *cv_schema_fail(ctx *c, const char *fmt, ...) CV_PRINTF(2, 3);
void *cv_schema_oom(ctx *c);
char *cv_schema_chk(ctx *c, char *s);
bool cv_schema_within_budget(ctx *c, size_t more);
char *cv_schema_budget(ctx *c, char *expr);
size_t cv_schema_path_push(ctx *c, const char *tok);
size_t cv_schema_path_push_index(ctx *c, const char *tok, size_t i);
void cv_schema_path_pop(ctx *c, size_t old);
char *cv_schema_gbnf_lit(const char *s);
char *cv_schema_json_string_text(const char *s);
/* schema.c: the rule table and the primitives */
char *cv_schema_add_rule(ctx *c, const char *base, char *body);
char *cv_schema_share(ctx *c, const char *base, char *expr);
char *cv_schema_use_prim(ctx *c, const char *name);
/* schema.c: the compiler */
const char *cv_schema_other_key(const json_t *s, const char *const *allowed);
const json_t *cv_schema_resolve(const json_t *root, const char *ptr);
char *cv_schema_alts(ctx *c, char **e, int n);
char *cv_schema_gen(ctx *c, const json_t *s);

/* schema_scalar.c */
long long cv_schema_count_kw(ctx *c, const json_t *s, const char *kw);
char *cv_schema_rep(const char *atom, long long lo, long long hi /* -1: unbounded */);
char *cv_schema_gen_enum(ctx *c, const json_t *s);
char *cv_schema_gen_string(ctx *c, const json_t *s);
char *cv_schema_gen_integer(ctx *c, const json_t *s);
char *cv_schema_gen_number(ctx *c, const json_t *s);

/* schema_compose.c */
char *cv_schema_gen_object(ctx *c, const json_t *s);
char *cv_schema_gen_array(ctx *c, const json_t *s);
char *cv_schema_gen_allof(ctx *c, const json_t *s);

#endif
