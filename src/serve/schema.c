/* schema.c: see schema.h.
 *
 * The compiler walks the schema and returns, for each subschema, a GBNF
 * expression (malloc'd text, parenthesized when it has alternatives);
 * named rules (primitives, object members, $ref targets) collect in a
 * table, deduplicated by body. Errors: the first one wins, written with
 * the JSON pointer of the place (ctx.path) into the caller's buffer.
 *
 * The schema is untrusted, so the work is bounded as it goes, not at the
 * end: an expression written twice (an array's item, an object's optional
 * tail) becomes a rule and is written by name (cv_schema_share), so the
 * text grows with the schema, never by doubling per level; every
 * subschema's expression and every rule count against the grammar's byte
 * limit the moment they exist (cv_schema_budget); and schemas nest at
 * most MAX_NESTING deep.
 *
 * This file holds the compiler's frame: the helpers, the rule table, the
 * primitives, $ref resolution, and one schema's dispatch by keyword
 * family and type. The values of scalar types (enum/const, strings,
 * numbers) are schema_scalar.c's; objects, arrays and allOf's merge are
 * schema_compose.c's; what they share, schema_impl.h. */
#include "serve/schema_impl.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "serve/buf.h"
#include "serve/regex.h"
#include "convoy.h"

#define MAX_NESTING 64  /* subschemas inside subschemas */
#define SHARE_BYTES 32  /* an expression written twice becomes a rule from this length on */

/* ---- small helpers ---------------------------------------------------------------------------- */

static char *xvfmt(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    const int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return NULL;
    char *s = cv_malloc((size_t)n + 1);
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

char *cv_schema_xfmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = xvfmt(fmt, ap);
    va_end(ap);
    return s;
}

char *cv_schema_xstrdup(const char *s) { return cv_schema_xfmt("%s", s); }

void *cv_schema_fail(ctx *c, const char *fmt, ...)
{
    if (c->failed)
        return NULL;
    c->failed = true;
    char msg[CV_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cv_errf(c->err, c->errlen, "response_format schema at \"#%s\": %s", c->path, msg);
    return NULL;
}

void *cv_schema_oom(ctx *c) { return cv_schema_fail(c, "out of memory"); }

/* Checks an allocation: NULL reports out of memory. */
char *cv_schema_chk(ctx *c, char *s)
{
    if (!s)
        cv_schema_oom(c);
    return s;
}

/* Whether the rules so far and more bytes stay within the grammar's byte limit (fails if not). */
bool cv_schema_within_budget(ctx *c, size_t more)
{
    if (c->text + more <= CONVOY_GRAMMAR_TEXT_MAX)
        return true;
    cv_schema_fail(c, "the grammar passes %u bytes, the most a request may use", CONVOY_GRAMMAR_TEXT_MAX);
    return false;
}

/* expr, or NULL (expr freed) when it would not fit beside the rules so far. */
char *cv_schema_budget(ctx *c, char *expr)
{
    if (expr && !cv_schema_within_budget(c, strlen(expr))) {
        cv_free(expr);
        return NULL;
    }
    return expr;
}

/* Appends a JSON pointer token (escaped ~0 ~1); returns the old length for path_pop. */
size_t cv_schema_path_push(ctx *c, const char *tok)
{
    const size_t old = c->plen;
    size_t n = c->plen;
    if (n + 1 < sizeof c->path)
        c->path[n++] = '/';
    for (const char *p = tok; *p && n + 3 < sizeof c->path; p++) {
        if (*p == '~' || *p == '/') {
            c->path[n++] = '~';
            c->path[n++] = *p == '~' ? '0' : '1';
        } else {
            c->path[n++] = *p;
        }
    }
    c->path[n] = 0;
    c->plen = n;
    return old;
}

size_t cv_schema_path_push_index(ctx *c, const char *tok, size_t i)
{
    char buf[32];
    const size_t old = cv_schema_path_push(c, tok);
    snprintf(buf, sizeof buf, "%zu", i);
    cv_schema_path_push(c, buf);
    return old;
}

void cv_schema_path_pop(ctx *c, size_t old)
{
    c->plen = old;
    c->path[old] = 0;
}

char *cv_schema_gbnf_lit(const char *s) { return cv_gbnf_literal(s, strlen(s)); }

/* The JSON text of a string (compact, UTF-8 as is). */
char *cv_schema_json_string_text(const char *s)
{
    json_t *j = json_string(s);
    if (!j)
        return NULL;
    char *t = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(j);
    if (!t)
        return NULL;
    char *r = cv_schema_xstrdup(t);
    free(t);
    return r;
}

/* ---- the rule table ----------------------------------------------------------------------------- */

static rule *find_rule(ctx *c, const char *name)
{
    for (int i = 0; i < c->nrules; i++)
        if (!strcmp(c->rules[i].name, name))
            return &c->rules[i];
    return NULL;
}

/* Gives rule r its body (taken over), counted against the byte limit; false after a failure. */
static bool set_body(ctx *c, rule *r, char *body)
{
    if (body && !cv_schema_within_budget(c, strlen(body))) {
        cv_free(body);
        return false;
    }
    r->body = body;
    r->body_len = body ? strlen(body) : 0;
    c->text += r->body_len;
    return !c->failed;
}

/* Appends the rule name ::= body (both taken over; body NULL reserves the
 * name), counted against the byte limit; returns a copy of its name. */
static char *append_rule(ctx *c, char *name, char *body)
{
    if (!name || c->nrules == c->caprules) {
        const int cap = c->caprules ? c->caprules * 2 : 32;
        rule *r = name ? cv_realloc(c->rules, (size_t)cap * sizeof *r) : NULL;
        if (!r) {
            cv_free(name);
            cv_free(body);
            return cv_schema_oom(c);
        }
        c->rules = r;
        c->caprules = cap;
    }
    c->rules[c->nrules++] = (rule){name, NULL, 0};
    c->text += strlen(name) + sizeof " ::= \n" - 1;
    if (!set_body(c, &c->rules[c->nrules - 1], body))
        return NULL;
    return cv_schema_chk(c, cv_schema_xstrdup(name));
}

/* Adds a rule named after base (made unique) with body (taken over; NULL reserves the name) and
 * returns a copy of its name; an existing rule with the same body is reused. */
char *cv_schema_add_rule(ctx *c, const char *base, char *body)
{
    if (c->failed) {
        cv_free(body);
        return NULL;
    }
    const size_t len = body ? strlen(body) : 0;
    for (int i = 0; body && i < c->nrules; i++)
        if (c->rules[i].body && c->rules[i].body_len == len && !memcmp(c->rules[i].body, body, len)) {
            cv_free(body);
            return cv_schema_chk(c, cv_schema_xstrdup(c->rules[i].name));
        }
    char clean[48];
    size_t n = 0;
    for (const char *p = base; *p && n + 1 < sizeof clean; p++) {
        const char ch = *p;
        const bool word = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (word)
            clean[n++] = ch;
        else if (n && clean[n - 1] != '-')
            clean[n++] = '-';
    }
    while (n && clean[n - 1] == '-')
        n--;
    clean[n] = 0;
    if (!n)
        snprintf(clean, sizeof clean, "r");
    char *name = cv_schema_xstrdup(clean);
    /* numbered from the rule count, so a base met n times is not probed n times */
    for (int k = c->nrules + 1; name && find_rule(c, name); k++) {
        cv_free(name);
        name = cv_schema_xfmt("%s-%d", clean, k);
    }
    return append_rule(c, name, body);
}

/* expr itself when short, else the name of a rule holding it (expr taken over): for an expression
 * the caller writes more than once. */
char *cv_schema_share(ctx *c, const char *base, char *expr)
{
    if (!expr || strlen(expr) < SHARE_BYTES)
        return expr;
    return cv_schema_add_rule(c, base, expr);
}

/* ---- primitives ----------------------------------------------------------------------------------- */

typedef struct prim {
    const char *name, *body;
} prim;

static const prim prims[] = {
    {"ws", "\" \"?"},
    {"hex", "[0-9a-fA-F]"},
    /* \uXXXX without U+0000 and without surrogates (D800-DFFF) */
    {"uesc", "\"0\" \"0\" \"0\" [1-9a-fA-F] | \"0\" \"0\" [1-9a-fA-F] hex | \"0\" [1-9a-fA-F] hex hex | "
             "[1-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex"},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )"},
    {"kchar", "[^\"\\\\\\x7F\\x00-\\x1F]"},
    {"string", "\"\\\"\" char* \"\\\"\""},
    {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )"},
    {"number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?"},
    {"boolean", "\"true\" | \"false\""},
    {"null", "\"null\""},
    {"value", "object | array | string | number | boolean | null"},
    {"member", "string \":\" ws value"},
    {"object", "\"{\" ( member ( \",\" ws member )* )? \"}\""},
    {"array", "\"[\" ( value ( \",\" ws value )* )? \"]\""},
    {"year", "[0-9]{4}"},
    {"leap", "[0-9] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( \"0\" [048] | [2468] [048] | [13579] "
             "[26] ) \"00\""},
    {"date", "year \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" "
             "[469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | "
             "\"2\" [0-8] ) ) | leap \"-02-29\""},
    {"hour", "[01] [0-9] | \"2\" [0-3]"},
    {"time", "hour \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [-+] hour \":\" [0-5] [0-9] )"},
    {"date-time", "date \"T\" time"},
    {"uuid", "hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}"},
};

/* The primitive's name, its rule (and those it uses) added on first use. */
char *cv_schema_use_prim(ctx *c, const char *name)
{
    if (c->failed)
        return NULL;
    if (find_rule(c, name))
        return cv_schema_chk(c, cv_schema_xstrdup(name));
    for (size_t i = 0; i < sizeof prims / sizeof prims[0]; i++) {
        if (strcmp(prims[i].name, name))
            continue;
        char *body = cv_schema_chk(c, cv_schema_xstrdup(prims[i].body));
        if (!body)
            return NULL;
        cv_free(append_rule(c, cv_schema_xstrdup(name), body));
        if (c->failed)
            return NULL;
        /* the rules this body names */
        static const char *const deps[][4] = {
            {"uesc", "hex"},          {"char", "uesc"},          {"string", "char"},
            {"value", "object", "array", "string"}, {"member", "string", "ws", "value"},
            {"object", "member", "ws"}, {"array", "value", "ws"}, {"date", "year", "leap"},
            {"time", "hour"},         {"date-time", "date", "time"}, {"uuid", "hex"},
        };
        for (size_t d = 0; d < sizeof deps / sizeof deps[0]; d++)
            if (!strcmp(deps[d][0], name))
                for (int k = 1; k < 4 && deps[d][k]; k++)
                    cv_free(cv_schema_use_prim(c, deps[d][k]));
        if (!strcmp(name, "value")) {
            cv_free(cv_schema_use_prim(c, "number"));
            cv_free(cv_schema_use_prim(c, "boolean"));
            cv_free(cv_schema_use_prim(c, "null"));
        }
        return c->failed ? NULL : cv_schema_chk(c, cv_schema_xstrdup(name));
    }
    return cv_schema_fail(c, "internal: no primitive '%s'", name);
}

/* ---- the compiler --------------------------------------------------------------------------------- */

static char *gen_schema(ctx *c, const json_t *s);

static const char *const annotations[] = {"title",    "description", "examples",        "default",
                                          "$schema",  "$id",         "$anchor",         "$comment",
                                          "deprecated", "readOnly",  "writeOnly",       "contentEncoding",
                                          "contentMediaType", "$defs", "definitions"};

static bool is_annotation(const char *k)
{
    for (size_t i = 0; i < sizeof annotations / sizeof annotations[0]; i++)
        if (!strcmp(annotations[i], k))
            return true;
    return false;
}

static const char *const handled[] = {
    "type",      "enum",     "const",    "properties", "required",  "additionalProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "minimum",
    "maximum",   "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "format",
    "uniqueItems", "pattern"};

static bool is_handled(const char *k)
{
    for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
        if (!strcmp(handled[i], k))
            return true;
    return false;
}

/* The first key of s other than annotations and those listed (NULL-terminated), or NULL. */
const char *cv_schema_other_key(const json_t *s, const char *const *allowed)
{
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)s, k, v) {
        if (is_annotation(k))
            continue;
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok |= !strcmp(*a, k);
        if (!ok)
            return k;
    }
    return NULL;
}

/* Resolves "#..." against the root; NULL when it names nothing. */
const json_t *cv_schema_resolve(const json_t *root, const char *ptr)
{
    if (ptr[0] != '#')
        return NULL;
    const json_t *cur = root;
    const char *p = ptr + 1;
    while (*p) {
        if (*p != '/')
            return NULL;
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p == '0')
                    ch = '~';
                else if (*p == '1')
                    ch = '/';
                else
                    return NULL;
                p++;
            }
            if (n + 1 >= sizeof tok)
                return NULL;
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            const unsigned long i = strtoul(tok, &end, 10);
            if (!n || *end)
                return NULL;
            cur = json_array_get(cur, i);
        } else {
            return NULL;
        }
        if (!cur)
            return NULL;
    }
    return cur;
}

static char *gen_ref(ctx *c, const char *ptr)
{
    for (int i = 0; i < c->nrefs; i++) {
        ref *r = &c->refs[i];
        if (strcmp(r->ptr, ptr))
            continue;
        if (!r->done && r->depth == c->depth)
            return cv_schema_fail(c, "$ref \"%s\" leads back to itself without consuming input", ptr);
        return cv_schema_chk(c, cv_schema_xstrdup(r->name));
    }
    const json_t *target = cv_schema_resolve(c->root, ptr);
    if (!target)
        return cv_schema_fail(c, "$ref \"%s\" cannot be resolved (only \"#\" and \"#/...\" pointers into this schema)",
                              ptr);
    const char *base = strrchr(ptr, '/');
    base = base ? base + 1 : "root-ref";
    char *name = cv_schema_add_rule(c, base, NULL);
    if (!name)
        return NULL;
    if (c->nrefs == c->caprefs) {
        const int cap = c->caprefs ? c->caprefs * 2 : 8;
        ref *nr = cv_realloc(c->refs, (size_t)cap * sizeof *nr);
        if (!nr) {
            cv_free(name);
            return cv_schema_oom(c);
        }
        c->refs = nr;
        c->caprefs = cap;
    }
    char *pcopy = cv_schema_chk(c, cv_schema_xstrdup(ptr));
    char *ncopy = cv_schema_chk(c, cv_schema_xstrdup(name));
    if (!pcopy || !ncopy) {
        cv_free(pcopy);
        cv_free(ncopy);
        cv_free(name);
        return NULL;
    }
    const int idx = c->nrefs++;
    c->refs[idx] = (ref){pcopy, ncopy, 0, c->depth};
    /* compile the target with its own path */
    char saved[sizeof c->path];
    const size_t saved_len = c->plen;
    memcpy(saved, c->path, sizeof saved);
    snprintf(c->path, sizeof c->path, "%s", ptr + 1);
    c->plen = strlen(c->path);
    char *body = cv_schema_gen(c, target);
    memcpy(c->path, saved, sizeof saved);
    c->plen = saved_len;
    c->refs[idx].done = 1;
    if (!body) {
        cv_free(name);
        return NULL;
    }
    if (!set_body(c, find_rule(c, name), body)) {
        cv_free(name);
        return NULL;
    }
    return name;
}

static const char *const type_names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};

static bool known_type(const char *t)
{
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (!strcmp(type_names[i], t))
            return true;
    return false;
}

/* Joins n expressions as alternatives (frees them). */
char *cv_schema_alts(ctx *c, char **e, int n)
{
    cv_buf b = {0};
    int bad = 0;
    if (n == 1) {
        char *r = e[0];
        return r;
    }
    bad |= cv_buf_puts(&b, "(");
    for (int i = 0; i < n; i++) {
        bad |= cv_buf_puts(&b, i ? " | " : " ");
        bad |= cv_buf_puts(&b, e[i]);
        cv_free(e[i]);
    }
    bad |= cv_buf_puts(&b, " )");
    if (bad) {
        cv_buf_free(&b);
        return cv_schema_oom(c);
    }
    return b.p;
}

/* ---- one schema ------------------------------------------------------------------------------------- */

static char *gen_type(ctx *c, const json_t *s, const char *t)
{
    if (!strcmp(t, "null"))
        return cv_schema_use_prim(c, "null");
    if (!strcmp(t, "boolean"))
        return cv_schema_use_prim(c, "boolean");
    if (!strcmp(t, "integer"))
        return cv_schema_gen_integer(c, s);
    if (!strcmp(t, "number"))
        return cv_schema_gen_number(c, s);
    if (!strcmp(t, "string"))
        return cv_schema_gen_string(c, s);
    if (!strcmp(t, "array"))
        return cv_schema_gen_array(c, s);
    return cv_schema_gen_object(c, s);
}

/* Refuses the first keyword that is neither an annotation nor handled (0: none). */
static int check_keywords(ctx *c, const json_t *s)
{
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)s, k, v) {
        if (is_annotation(k))
            continue;
        if (!is_handled(k)) {
            const size_t old = cv_schema_path_push(c, k);
            cv_schema_fail(c, "keyword \"%s\" is not supported", k);
            cv_schema_path_pop(c, old);
            return -1;
        }
    }
    return 0;
}

/* $ref alone. */
static char *gen_ref_kw(ctx *c, const json_t *s, const json_t *ref)
{
    if (!json_is_string(ref))
        return cv_schema_fail(c, "$ref must be a string");
    const char *other = cv_schema_other_key(s, (const char *const[]){"$ref", NULL});
    if (other)
        return cv_schema_fail(c, "\"%s\" next to $ref is not supported", other);
    return gen_ref(c, json_string_value(ref));
}

/* allOf: a single subschema alone is that subschema, else the object schemas merged. */
static char *gen_allof_kw(ctx *c, const json_t *s, const json_t *all)
{
    if (!json_is_array(all) || !json_array_size(all))
        return cv_schema_fail(c, "allOf must be a non-empty array");
    if (json_array_size(all) == 1 && !cv_schema_other_key(s, (const char *const[]){"allOf", NULL})) {
        const size_t old = cv_schema_path_push_index(c, "allOf", 0);
        char *r = cv_schema_gen(c, json_array_get(all, 0));
        cv_schema_path_pop(c, old);
        return r;
    }
    return cv_schema_gen_allof(c, s);
}

/* anyOf or oneOf (any, under any_kw) alone: the alternatives of the branches that are not false. */
static char *gen_anyof(ctx *c, const json_t *s, const json_t *any, const char *any_kw)
{
    if (!json_is_array(any) || !json_array_size(any))
        return cv_schema_fail(c, "%s must be a non-empty array", any_kw);
    const char *other = cv_schema_other_key(s, (const char *const[]){"anyOf", "oneOf", NULL});
    if (other)
        return cv_schema_fail(c, "\"%s\" next to %s is not supported", other, any_kw);
    const size_t n = json_array_size(any);
    char **e = cv_calloc(n, sizeof *e);
    if (!e)
        return cv_schema_oom(c);
    int k2 = 0;
    for (size_t i = 0; i < n; i++) {
        if (json_is_false(json_array_get(any, i)))
            continue;
        const size_t old = cv_schema_path_push_index(c, any_kw, i);
        e[k2] = cv_schema_gen(c, json_array_get(any, i));
        cv_schema_path_pop(c, old);
        if (!e[k2])
            break;
        k2++;
    }
    if (c->failed || !k2) {
        for (int i = 0; i < k2; i++)
            cv_free(e[i]);
        cv_free(e);
        return c->failed ? NULL : cv_schema_fail(c, "every branch of %s is false", any_kw);
    }
    char *r = cv_schema_alts(c, e, k2);
    cv_free(e);
    return r;
}

/* The names of the type keyword (a name or a list of at most 7), without duplicates: their count,
 * or -1 when it is not such a list. */
static int type_list(const json_t *type, const char **types)
{
    if (json_is_string(type)) {
        types[0] = json_string_value(type);
        return 1;
    }
    if (!json_is_array(type) || !json_array_size(type) || json_array_size(type) > 7)
        return -1;
    int nt = 0;
    for (size_t i = 0; i < json_array_size(type); i++) {
        const json_t *t = json_array_get(type, i);
        if (!json_is_string(t))
            return -1;
        bool dup = false;
        for (int j = 0; j < nt; j++)
            dup |= !strcmp(types[j], json_string_value(t));
        if (!dup)
            types[nt++] = json_string_value(t);
    }
    return nt;
}

/* The valid names of the type keyword, at #/.../type: their count, or -1 after a failure. */
static int checked_type_names(ctx *c, const json_t *type, const char **types)
{
    const int nt = type_list(type, types);
    if (nt < 0) {
        cv_schema_fail(c, "type must be a type name or a non-empty array of them");
        return -1;
    }
    for (int i = 0; i < nt; i++)
        if (!known_type(types[i])) {
            cv_schema_fail(c, "unknown type \"%s\"", types[i]);
            return -1;
        }
    return nt;
}

/* The types the type keyword lists ("number" covers "integer"): their count, or -1 after a failure. */
static int explicit_types(ctx *c, const json_t *type, const char **types)
{
    const size_t old = cv_schema_path_push(c, "type");
    int nt = checked_type_names(c, type, types);
    cv_schema_path_pop(c, old);
    if (nt < 0)
        return -1;
    bool has_number = false;
    for (int i = 0; i < nt; i++)
        has_number |= !strcmp(types[i], "number");
    if (has_number) {
        int w = 0;
        for (int i = 0; i < nt; i++)
            if (strcmp(types[i], "integer"))
                types[w++] = types[i];
        nt = w;
    }
    return nt;
}

/* The types that a schema without "type" implies by its keywords: their count (0: any value). */
static int implied_types(const json_t *s, const char **types)
{
    static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const arr[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                      "uniqueItems", NULL};
    static const char *const str[] = {"minLength", "maxLength", "format", "pattern", NULL};
    static const char *const num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    static const char *const *const kws[] = {obj, arr, str, num};
    static const char *const names[] = {"object", "array", "string", "number"};
    int nt = 0;
    for (int g = 0; g < 4; g++)
        for (const char *const *p = kws[g]; *p; p++)
            if (json_object_get(s, *p)) {
                types[nt++] = names[g];
                break;
            }
    return nt;
}

/* The schema by its types, explicit or implied: the alternatives of one expression per type. */
static char *gen_types(ctx *c, const json_t *s)
{
    const char *types[8];
    const json_t *type = json_object_get(s, "type");
    const int nt = type ? explicit_types(c, type, types) : implied_types(s, types);
    if (nt < 0)
        return NULL;
    if (!nt)
        return cv_schema_use_prim(c, "value");
    char *e[8];
    for (int i = 0; i < nt; i++) {
        e[i] = gen_type(c, s, types[i]);
        if (!e[i]) {
            for (int j = 0; j < i; j++)
                cv_free(e[j]);
            return NULL;
        }
    }
    return cv_schema_alts(c, e, nt);
}

/* One schema, nested at most MAX_NESTING deep, its expression within the byte limit. */
char *cv_schema_gen(ctx *c, const json_t *s)
{
    if (c->failed)
        return NULL;
    if (c->nesting == MAX_NESTING)
        return cv_schema_fail(c, "subschemas nest more than %d deep", MAX_NESTING);
    c->nesting++;
    char *r = cv_schema_budget(c, gen_schema(c, s));
    c->nesting--;
    return r;
}

/* One schema: boolean schemas, then by keyword family ($ref, allOf, anyOf/oneOf, enum/const, types). */
static char *gen_schema(ctx *c, const json_t *s)
{
    if (json_is_true(s))
        return cv_schema_use_prim(c, "value");
    if (json_is_false(s))
        return cv_schema_fail(c, "the schema false admits no value");
    if (!json_is_object(s))
        return cv_schema_fail(c, "a schema must be an object or a boolean");
    if (check_keywords(c, s))
        return NULL;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref)
        return gen_ref_kw(c, s, ref);
    const json_t *all = json_object_get(s, "allOf");
    if (all)
        return gen_allof_kw(c, s, all);
    const json_t *any = json_object_get(s, "anyOf");
    const char *any_kw = "anyOf";
    if (json_object_get(s, "oneOf")) {
        if (any)
            return cv_schema_fail(c, "anyOf and oneOf together are not supported");
        any = json_object_get(s, "oneOf");
        any_kw = "oneOf";
    }
    if (any)
        return gen_anyof(c, s, any, any_kw);
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return cv_schema_gen_enum(c, s);
    return gen_types(c, s);
}

static char *assemble(ctx *c)
{
    cv_buf b = {0};
    int bad = 0;
    for (int i = 0; i < c->nrules && !bad; i++) {
        bad |= cv_buf_puts(&b, c->rules[i].name) || cv_buf_puts(&b, " ::= ") ||
               cv_buf_puts(&b, c->rules[i].body ? c->rules[i].body : "") || cv_buf_puts(&b, "\n");
    }
    if (bad) {
        cv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

static void ctx_free(ctx *c)
{
    for (int i = 0; i < c->nrules; i++) {
        cv_free(c->rules[i].name);
        cv_free(c->rules[i].body);
    }
    cv_free(c->rules);
    for (int i = 0; i < c->nrefs; i++) {
        cv_free(c->refs[i].ptr);
        cv_free(c->refs[i].name);
    }
    cv_free(c->refs);
}

char *cv_schema_grammar(const json_t *schema, char *err, size_t errlen)
{
    ctx c = {0};
    c.root = schema;
    c.err = err;
    c.errlen = errlen;
    if (!schema) {
        cv_errf(err, errlen, "response_format schema: missing");
        return NULL;
    }
    char *root = cv_schema_add_rule(&c, "root", NULL);
    char *body = root ? cv_schema_gen(&c, schema) : NULL;
    char *out = NULL;
    if (body && set_body(&c, find_rule(&c, "root"), body)) {
        out = assemble(&c);
        if (!out)
            cv_schema_oom(&c);
    }
    cv_free(root);
    ctx_free(&c);
    return out;
}

char *cv_schema_any_object_grammar(void)
{
    ctx c = {0};
    char *root = cv_schema_add_rule(&c, "root", NULL);
    char *obj = root ? cv_schema_use_prim(&c, "object") : NULL;
    char *out = NULL;
    if (obj) {
        find_rule(&c, "root")->body = obj;
        out = assemble(&c);
    }
    cv_free(root);
    ctx_free(&c);
    return out;
}
