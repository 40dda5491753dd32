/* schema_compose.c: the schema compiler's composite values (see schema.c
 * for the compiler, schema_impl.h for what it shares): objects (listed
 * members in order, then extra keys, which a trie of the listed names
 * keeps apart), arrays (prefix items, then the rest within the count
 * bounds), and allOf, whose object schemas merge into one. */
#include "serve/schema_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/utf8.h"

#define MAX_MERGE_DEPTH 32

/* Extra keys: strings written without escapes that differ from every listed name. One rule per
 * node of the names' trie (by UTF-8 character). */
typedef struct trie {
    char ch[5];
    bool end;
    struct trie *kid;
    int nkid;
} trie;

static void trie_free(trie *t)
{
    for (int i = 0; i < t->nkid; i++)
        trie_free(&t->kid[i]);
    cv_free(t->kid);
}

static int trie_add(trie *t, const char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i < n; i++) /* names needing escapes cannot be written by an extra key */
        if ((unsigned char)s[i] < 0x20 || s[i] == '"' || s[i] == '\\' || s[i] == 0x7F)
            return 0;
    for (size_t i = 0; i < n;) {
        size_t l = cv_utf8_len(s + i, n - i);
        if (!l)
            l = 1;
        int j = 0;
        while (j < t->nkid && (strlen(t->kid[j].ch) != l || memcmp(t->kid[j].ch, s + i, l)))
            j++;
        if (j == t->nkid) {
            trie *k = cv_realloc(t->kid, (size_t)(t->nkid + 1) * sizeof *k);
            if (!k)
                return -1;
            t->kid = k;
            t->kid[t->nkid] = (trie){{0}, false, NULL, 0};
            memcpy(t->kid[t->nkid].ch, s + i, l);
            t->nkid++;
        }
        t = &t->kid[j];
        i += l;
    }
    t->end = true;
    return 0;
}

static char *trie_rule(ctx *c, const trie *t)
{
    cv_buf b = {0};
    int bad = 0;
    char *kc = cv_schema_use_prim(c, "kchar");
    if (!kc)
        return NULL;
    bad |= cv_buf_puts(&b, "[^\"\\\\\\x7F\\x00-\\x1F");
    for (int i = 0; i < t->nkid && !bad; i++) {
        const unsigned char ch = (unsigned char)t->kid[i].ch[0];
        char tmp[8];
        if (ch < 0x80 && !((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
            snprintf(tmp, sizeof tmp, "\\x%02X", ch);
        else
            snprintf(tmp, sizeof tmp, "%s", t->kid[i].ch);
        bad |= cv_buf_puts(&b, tmp);
    }
    bad |= cv_buf_puts(&b, "] ") || cv_buf_puts(&b, kc) || cv_buf_puts(&b, "* \"\\\"\"");
    cv_free(kc);
    if (!t->end)
        bad |= cv_buf_puts(&b, " | \"\\\"\"");
    for (int i = 0; i < t->nkid && !bad; i++) {
        char *sub = trie_rule(c, &t->kid[i]);
        char *lit = cv_schema_gbnf_lit(t->kid[i].ch);
        bad |= !sub || !lit || cv_buf_puts(&b, " | ") || cv_buf_puts(&b, lit) || cv_buf_puts(&b, " ") ||
               cv_buf_puts(&b, sub);
        cv_free(sub);
        cv_free(lit);
    }
    if (bad || c->failed) {
        cv_buf_free(&b);
        return c->failed ? NULL : cv_schema_oom(c);
    }
    return cv_schema_add_rule(c, "xkey", b.p);
}

typedef struct member {
    const char *name;
    const json_t *schema;
    bool required;
    char *kv; /* rule name */
} member;

/* The rule "name": value for one listed member. */
static char *member_kv(ctx *c, const member *mi)
{
    const size_t old = cv_schema_path_push(c, "properties");
    cv_schema_path_push(c, mi->name);
    c->depth++;
    char *v = cv_schema_gen(c, mi->schema);
    c->depth--;
    cv_schema_path_pop(c, old);
    if (!v)
        return NULL;
    char *js = cv_schema_json_string_text(mi->name);
    char *lit = js ? cv_schema_xfmt("%s:", js) : NULL;
    char *klit = lit ? cv_schema_gbnf_lit(lit) : NULL;
    char *ws = cv_schema_use_prim(c, "ws");
    char *body = klit && ws ? cv_schema_xfmt("%s %s %s", klit, ws, v) : NULL;
    cv_free(js);
    cv_free(lit);
    cv_free(klit);
    cv_free(ws);
    cv_free(v);
    if (!body)
        return c->failed ? NULL : cv_schema_oom(c);
    char base[64];
    snprintf(base, sizeof base, "%s-kv", mi->name);
    return cv_schema_add_rule(c, base, body);
}

/* The value expression of extra members (additionalProperties absent, true or a schema). */
static char *extra_value(ctx *c, const json_t *addl)
{
    char *v;
    c->depth++;
    if (!addl || json_is_true(addl)) {
        v = cv_schema_use_prim(c, "value");
    } else {
        const size_t old = cv_schema_path_push(c, "additionalProperties");
        v = cv_schema_gen(c, addl);
        cv_schema_path_pop(c, old);
    }
    c->depth--;
    return v;
}

/* The key expression of extra members: any string, or one that differs from every listed name. */
static char *extra_key(ctx *c, const member *m, int n)
{
    if (!n)
        return cv_schema_use_prim(c, "string");
    int bad = 0;
    trie t = {{0}, false, NULL, 0};
    for (int i = 0; i < n && !bad; i++)
        bad |= trie_add(&t, m[i].name);
    char *node = bad ? NULL : trie_rule(c, &t);
    trie_free(&t);
    char *key = node ? cv_schema_xfmt("\"\\\"\" %s", node) : NULL;
    cv_free(node);
    return key;
}

/* The rule key: value for extra members. */
static char *extra_kv(ctx *c, const member *m, int n, const json_t *addl)
{
    char *v = extra_value(c, addl);
    if (!v)
        return NULL;
    char *key = extra_key(c, m, n);
    char *ws = cv_schema_use_prim(c, "ws");
    char *body = key && ws ? cv_schema_xfmt("%s \":\" %s %s", key, ws, v) : NULL;
    cv_free(key);
    cv_free(ws);
    cv_free(v);
    if (!body)
        return c->failed ? NULL : cv_schema_oom(c);
    return cv_schema_add_rule(c, "extra-kv", body);
}

/* The braces around the members in order (required ones always, optional ones maybe) then extras
 * (extra: a rule name or NULL). */
static char *member_sequence(ctx *c, const member *m, int n, const char *extra)
{
    /* F(i): members from i on, none written yet; A(i): members from i on, each after a comma.
     * F(i) and A(i) both write A(i+1), F(i) also F(i+1): shared, so the text grows linearly with n
     * and parentheses do not nest n deep. */
    char *f = extra ? cv_schema_xfmt("( %s ( \",\" ws %s )* )?", extra, extra) : cv_schema_xstrdup("");
    char *a = cv_schema_share(c, "rest", extra ? cv_schema_xfmt("( \",\" ws %s )*", extra) : cv_schema_xstrdup(""));
    for (int i = n - 1; i >= 0 && f && a; i--) {
        char *nf = m[i].required ? cv_schema_xfmt("%s %s", m[i].kv, a)
                                 : cv_schema_xfmt("( %s %s | %s )", m[i].kv, a, f);
        char *na = m[i].required ? cv_schema_xfmt("\",\" ws %s %s", m[i].kv, a)
                                 : cv_schema_xfmt("( \",\" ws %s )? %s", m[i].kv, a);
        cv_free(f);
        cv_free(a);
        f = cv_schema_share(c, "members", cv_schema_budget(c, nf));
        a = cv_schema_share(c, "rest", cv_schema_budget(c, na));
    }
    char *r = f && a ? cv_schema_xfmt("\"{\" %s \"}\"", f) : NULL;
    cv_free(f);
    cv_free(a);
    return r;
}

/* Object of listed members (in order) then extras (extra: a value expression or NULL for none). */
static char *gen_object_members(ctx *c, member *m, int n, const json_t *addl)
{
    for (int i = 0; i < n && !c->failed; i++) {
        m[i].kv = member_kv(c, &m[i]);
        if (!m[i].kv)
            return NULL;
    }
    if (c->failed)
        return NULL;
    char *extra = NULL;
    if (!json_is_false(addl)) {
        extra = extra_kv(c, m, n, addl);
        if (!extra)
            return NULL;
    }
    char *r = member_sequence(c, m, n, extra);
    cv_free(extra);
    return r ? r : (c->failed ? NULL : cv_schema_oom(c));
}

char *cv_schema_gen_object(ctx *c, const json_t *s)
{
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return cv_schema_fail(c, "properties must be an object");
    if (req && !json_is_array(req))
        return cv_schema_fail(c, "required must be an array of strings");
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return cv_schema_fail(c, "additionalProperties must be a schema");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i)))
            return cv_schema_fail(c, "required must be an array of strings");
    const size_t cap = json_object_size(props) + json_array_size(req);
    member *m = cv_calloc(cap ? cap : 1, sizeof *m);
    if (!m)
        return cv_schema_oom(c);
    int n = 0;
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)props, k, v) {
        bool required = false;
        for (size_t i = 0; i < json_array_size(req); i++)
            required |= !strcmp(json_string_value(json_array_get(req, i)), k);
        if (json_is_false(v)) {
            if (required) {
                cv_free(m);
                return cv_schema_fail(c, "required property \"%s\" has the schema false", k);
            }
            continue;
        }
        m[n++] = (member){k, v, required, NULL};
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        bool seen = json_object_get(props, name) != NULL;
        for (int j = 0; j < n; j++)
            seen |= !strcmp(m[j].name, name);
        if (seen)
            continue;
        if (json_is_false(addl)) {
            cv_free(m);
            return cv_schema_fail(c, "required property \"%s\" is not allowed by additionalProperties false", name);
        }
        m[n++] = (member){name, addl ? addl : json_true(), true, NULL};
    }
    char *r = gen_object_members(c, m, n, addl);
    for (int i = 0; i < n; i++)
        cv_free(m[i].kv);
    cv_free(m);
    return r;
}

/* An array schema read: the prefix items (under prefix_kw, the first k of them used), the schema of
 * the items after them (under rest_kw; has_rest: whether any may follow) and the count bounds. */
typedef struct array_shape {
    const json_t *prefix, *rest;
    const char *prefix_kw, *rest_kw;
    long long mn, mx /* -1: unbounded */, k;
    bool has_rest;
} array_shape;

/* The prefix and rest keywords: prefixItems and items, or a draft-07 items array and additionalItems. */
static int array_items(ctx *c, const json_t *s, array_shape *a)
{
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    a->prefix = prefix;
    a->rest = items;
    a->prefix_kw = "prefixItems";
    a->rest_kw = "items";
    if (json_is_array(items)) {
        if (prefix) {
            cv_schema_fail(c, "prefixItems next to an items array is not supported");
            return -1;
        }
        a->prefix = items;
        a->prefix_kw = "items";
        a->rest = json_object_get(s, "additionalItems");
        a->rest_kw = "additionalItems";
    } else if (json_object_get(s, "additionalItems")) {
        /* additionalItems without an items array has no effect */
    }
    if (a->prefix && !json_is_array(a->prefix)) {
        cv_schema_fail(c, "prefixItems must be an array of schemas");
        return -1;
    }
    if (a->rest && !json_is_object(a->rest) && !json_is_boolean(a->rest)) {
        cv_schema_fail(c, "%s must be a schema", a->rest_kw);
        return -1;
    }
    const json_t *uniq = json_object_get(s, "uniqueItems");
    if (uniq && !json_is_false(uniq)) {
        cv_schema_fail(c, "uniqueItems true is not supported");
        return -1;
    }
    return 0;
}

/* minItems and maxItems, then how many prefix items are used and whether more may follow. */
static int array_bounds(ctx *c, const json_t *s, array_shape *a)
{
    const long long mn0 = cv_schema_count_kw(c, s, "minItems"), mx = cv_schema_count_kw(c, s, "maxItems");
    if (mn0 == -2 || mx == -2)
        return -1;
    const long long mn = mn0 < 0 ? 0 : mn0;
    if (mx >= 0 && mn > mx) {
        cv_schema_fail(c, "minItems %lld exceeds maxItems %lld", mn, mx);
        return -1;
    }
    long long k = (long long)json_array_size(a->prefix);
    if (mx >= 0 && mx < k)
        k = mx;
    /* a prefix item with the schema false ends the array there */
    for (long long i = 0; i < k; i++)
        if (json_is_false(json_array_get(a->prefix, (size_t)i))) {
            k = i;
            a->rest = json_false();
            break;
        }
    a->mn = mn;
    a->mx = mx;
    a->k = k;
    a->has_rest = !json_is_false(a->rest) && !(mx >= 0 && mx <= k);
    if (!a->has_rest && mn > k) {
        cv_schema_fail(c, "minItems %lld cannot be met: at most %lld items are allowed", mn, k);
        return -1;
    }
    return 0;
}

/* The expression of the items after the prefix (NULL when none may follow or on failure). */
static char *array_item_rule(ctx *c, const array_shape *a)
{
    if (!a->has_rest)
        return NULL;
    if (!a->rest || json_is_true(a->rest))
        return cv_schema_use_prim(c, "value");
    const size_t old = cv_schema_path_push(c, a->rest_kw);
    char *r = cv_schema_gen(c, a->rest);
    cv_schema_path_pop(c, old);
    return r;
}

/* The expressions of the k prefix items (NULL when out of memory; entries NULL after a failure). */
static char **array_prefix_rules(ctx *c, const array_shape *a)
{
    char **p = cv_calloc(a->k ? (size_t)a->k : 1, sizeof *p);
    for (long long i = 0; p && i < a->k && !c->failed; i++) {
        const size_t old = cv_schema_path_push_index(c, a->prefix_kw, (size_t)i);
        p[i] = cv_schema_gen(c, json_array_get(a->prefix, (size_t)i));
        cv_schema_path_pop(c, old);
    }
    return p;
}

/* Items without a prefix: r_expr repeated within the count bounds. */
static char *array_rest_only(const array_shape *a, const char *r_expr)
{
    if (!a->has_rest)
        return cv_schema_xstrdup("");
    const long long mn = a->mn, mx = a->mx;
    char *cur = NULL;
    char *sep = cv_schema_xfmt("( \",\" ws %s )", r_expr);
    char *more = sep ? cv_schema_rep(sep, mn > 0 ? mn - 1 : 0, mx < 0 ? -1 : mx - 1) : NULL;
    if (more)
        cur = mn > 0 ? cv_schema_xfmt("%s %s", r_expr, more) : cv_schema_xfmt("( %s %s )?", r_expr, more);
    cv_free(sep);
    cv_free(more);
    return cur;
}

/* The prefix items (those from minItems on optional, each only after the one before), then the rest. */
static char *array_prefixed(ctx *c, const array_shape *a, char **p, const char *r_expr)
{
    const long long mn = a->mn, mx = a->mx, k = a->k;
    char *cur;
    if (a->has_rest) {
        char *sep = cv_schema_xfmt("( \",\" ws %s )", r_expr);
        cur = sep ? cv_schema_rep(sep, mn > k ? mn - k : 0, mx < 0 ? -1 : mx - k) : NULL;
        cv_free(sep);
    } else {
        cur = cv_schema_xstrdup("");
    }
    for (long long j = k - 1; j >= 0 && cur; j--) {
        char *item = cv_schema_xfmt("%s%s %s", j ? "\",\" ws " : "", p[j], cur);
        cv_free(cur);
        cur = item && j >= mn ? cv_schema_xfmt("( %s )?", item) : item;
        if (item && j >= mn)
            cv_free(item);
        cur = cv_schema_share(c, "items", cv_schema_budget(c, cur)); /* each item's text once, parentheses not k deep */
    }
    return cur;
}

char *cv_schema_gen_array(ctx *c, const json_t *s)
{
    array_shape a;
    if (array_items(c, s, &a) || array_bounds(c, s, &a))
        return NULL;
    c->depth++;
    char *r_expr = cv_schema_share(c, "item", array_item_rule(c, &a));
    char **p = array_prefix_rules(c, &a);
    c->depth--;
    char *cur = NULL;
    char *ws = cv_schema_use_prim(c, "ws");
    if (!p)
        cv_schema_oom(c);
    if (!c->failed && (!a.has_rest || r_expr)) {
        cur = a.k == 0 ? array_rest_only(&a, r_expr) : array_prefixed(c, &a, p, r_expr);
        if (!cur)
            cv_schema_oom(c);
    }
    for (long long i = 0; p && i < a.k; i++)
        cv_free(p[i]);
    cv_free(p);
    cv_free(r_expr);
    cv_free(ws);
    if (c->failed) {
        cv_free(cur);
        return NULL;
    }
    char *r = cv_schema_chk(c, cv_schema_xfmt("\"[\" %s \"]\"", cur));
    cv_free(cur);
    return r;
}

/* ---- allOf: object schemas merged ------------------------------------------------------------------ */

/* Adds sub (after $ref) into the merged parts: props (name -> schema, first wins if equal), req,
 * the closed sets (arrays of property-name objects of subschemas with additionalProperties false). */
static int merge_into(ctx *c, const json_t *sub, json_t *props, json_t *req, json_t *closed, int depth)
{
    if (depth > MAX_MERGE_DEPTH)
        return cv_schema_fail(c, "allOf / $ref nesting too deep (a cycle?)"), -1;
    if (json_is_true(sub))
        return 0;
    if (!json_is_object(sub))
        return cv_schema_fail(c, "allOf members must be object schemas"), -1;
    const json_t *r = json_object_get(sub, "$ref");
    if (r) {
        if (!json_is_string(r))
            return cv_schema_fail(c, "$ref must be a string"), -1;
        const char *other = cv_schema_other_key(sub, (const char *const[]){"$ref", NULL});
        if (other)
            return cv_schema_fail(c, "\"%s\" next to $ref is not supported", other), -1;
        const json_t *t = cv_schema_resolve(c->root, json_string_value(r));
        if (!t)
            return cv_schema_fail(c, "$ref \"%s\" cannot be resolved", json_string_value(r)), -1;
        return merge_into(c, t, props, req, closed, depth + 1);
    }
    const json_t *all = json_object_get(sub, "allOf");
    if (all) {
        if (!json_is_array(all))
            return cv_schema_fail(c, "allOf must be an array"), -1;
        for (size_t i = 0; i < json_array_size(all); i++)
            if (merge_into(c, json_array_get(all, i), props, req, closed, depth + 1))
                return -1;
    }
    const char *other = cv_schema_other_key(sub, (const char *const[]){"type", "properties", "required",
                                                                       "additionalProperties", "allOf", NULL});
    if (other)
        return cv_schema_fail(c, "allOf is supported for object schemas only (\"%s\" found)", other), -1;
    const json_t *type = json_object_get(sub, "type");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "object")))
        return cv_schema_fail(c, "allOf is supported for object schemas only (type is not \"object\")"), -1;
    const json_t *p = json_object_get(sub, "properties"), *rq = json_object_get(sub, "required");
    const json_t *addl = json_object_get(sub, "additionalProperties");
    if (p && !json_is_object(p))
        return cv_schema_fail(c, "properties must be an object"), -1;
    if (rq && !json_is_array(rq))
        return cv_schema_fail(c, "required must be an array of strings"), -1;
    if (addl && !json_is_boolean(addl))
        return cv_schema_fail(c, "additionalProperties with a schema inside allOf is not supported"), -1;
    const char *k;
    const json_t *v;
    json_object_foreach ((json_t *)p, k, v) {
        const json_t *have = json_object_get(props, k);
        if (have && !json_equal((json_t *)have, (json_t *)v) && !json_is_true(have) && !json_is_true(v))
            return cv_schema_fail(c, "allOf gives property \"%s\" two different schemas", k), -1;
        if (!have || json_is_true(have))
            json_object_set(props, k, (json_t *)v);
    }
    for (size_t i = 0; i < json_array_size(rq); i++) {
        const json_t *name = json_array_get(rq, i);
        if (!json_is_string(name))
            return cv_schema_fail(c, "required must be an array of strings"), -1;
        json_array_append(req, (json_t *)name);
    }
    if (json_is_false(addl)) {
        json_t *names = json_object();
        json_object_foreach ((json_t *)p, k, v) json_object_set_new(names, k, json_true());
        json_array_append_new(closed, names);
    }
    return 0;
}

char *cv_schema_gen_allof(ctx *c, const json_t *s)
{
    json_t *props = json_object(), *req = json_array(), *closed = json_array();
    char *r = NULL;
    if (!props || !req || !closed) {
        cv_schema_oom(c);
        goto out;
    }
    if (merge_into(c, s, props, req, closed, 0))
        goto out;
    /* with any closed member, only names every closed member lists may appear */
    json_t *merged = json_object();
    json_t *mprops = json_object(), *mreq = json_array();
    const char *k;
    json_t *v;
    json_object_foreach (props, k, v) {
        bool ok = true;
        for (size_t i = 0; i < json_array_size(closed); i++)
            ok &= json_object_get(json_array_get(closed, i), k) != NULL;
        if (ok)
            json_object_set(mprops, k, v);
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        bool ok = true;
        for (size_t j = 0; j < json_array_size(closed); j++)
            ok &= json_object_get(json_array_get(closed, j), name) != NULL;
        if (!ok) {
            cv_schema_fail(c, "allOf requires property \"%s\" that additionalProperties false excludes", name);
            json_decref(merged);
            json_decref(mprops);
            json_decref(mreq);
            goto out;
        }
        json_array_append(mreq, json_array_get(req, i));
    }
    json_object_set_new(merged, "type", json_string("object"));
    json_object_set_new(merged, "properties", mprops);
    json_object_set_new(merged, "required", mreq);
    if (json_array_size(closed))
        json_object_set_new(merged, "additionalProperties", json_false());
    r = cv_schema_gen_object(c, merged);
    json_decref(merged);
out:
    json_decref(props);
    json_decref(req);
    json_decref(closed);
    return r;
}
