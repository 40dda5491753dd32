/* jinja_impl.h: the insides of the Jinja engine (jinja.h is its contract),
 * shared by src/chat/jinja_*.c and by nothing else.
 *
 *   jinja_lex.c         template text -> tokens (tags, whitespace control)
 *   jinja_parse.c       tokens -> syntax tree (jnode): statements, cv_jinja_parse
 *   jinja_parse_expr.c  its expressions (jinja_parser.h: the parser's own state)
 *   jinja_eval.c        statements, scopes, macros, cv_jinja_render
 *   jinja_expr.c        expressions, calls, attribute and item access
 *   jinja_value.c       the arena, values, equality, order, str(), repr(), JSON
 *   jinja_text.c        UTF-8 and Unicode helpers, number text, strftime
 *   jinja_filters.c     filters and tests
 *   jinja_methods.c     str/list/dict methods, globals, % formatting
 *
 * Memory: a template's tree, names and literal strings live in the
 * template's arena; every value a render makes lives in the render's arena,
 * released at once when the render ends, so values are plain structs and
 * pointers with no ownership (lists, dicts and namespaces are shared by
 * reference, as in Python). Strings are immutable byte slices that may
 * point into the template, the JSON context or the arena. Output and
 * captured text build in heap buffers (jbuf) that a render frees.
 *
 * Errors: a function that can fail returns -1 after cv_jr_fail wrote the
 * first message ("line N: ...") into the render; the render then stops. */
#ifndef CONVOY_CHAT_JINJA_IMPL_H
#define CONVOY_CHAT_JINJA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/jinja.h"
#include "core/err.h"

/* ---- arena ---- */

typedef struct ja_chunk ja_chunk;
typedef struct jarena {
    ja_chunk *first;
    size_t used, limit; /* bytes taken from the heap, and the most allowed */
    cv_budget *pool;    /* shared with other renders, or NULL */
    size_t held;        /* the render's bytes, chunks and text buffers: beyond CV_JINJA_OWN_BYTES the pool's */
    bool pool_spent;    /* a take from the pool failed */
} jarena;

/* Zeroed, 16-byte aligned; NULL when the limit is reached, the pool is
 * spent or the heap is out. */
void *cv_ja_alloc(jarena *a, size_t n);
void cv_ja_release(jarena *a);
/* Counts n more (fewer) bytes the render holds, taking (giving) the part
 * beyond its own from the pool; cv_ja_hold is false when the pool is spent. */
bool cv_ja_hold(jarena *a, size_t n);
void cv_ja_unhold(jarena *a, size_t n);

/* ---- values ---- */

typedef struct jstr {
    const char *p;
    size_t n;
} jstr;

enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR,
    JV_LIST,  /* list or tuple (jlist.tuple) */
    JV_DICT,
    JV_NS,    /* namespace(): a dict reached by attribute */
    JV_MACRO, /* a macro, or the caller of a call block */
    JV_FUNC,  /* a global function or a bound method */
    JV_LOOP,  /* a for loop's `loop` */
};

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t t;
    /* JV_UNDEF: the type of the object that lacked an attribute (JV_UNDEF
     * for a missing variable), for messages. */
    uint8_t aux;
    union {
        bool b;
        int64_t i;
        double f;
        jstr s; /* JV_STR; JV_UNDEF: the missing name (may be empty) */
        jlist *l;
        jdict *d;
        jmacro *m;
        jfunc *fn;
        jloop *lp;
    } u;
} jv;

struct jlist {
    jv *v;
    size_t n, cap;
    bool tuple;
};

struct jdict { /* insertion-ordered; keys are strings or other scalars */
    jv *k, *v;
    size_t n, cap;
};

typedef struct jnode jnode;
typedef struct jscope jscope;

struct jmacro {
    const jnode *def; /* N_MACRO, or N_CALLBLOCK for a caller */
    jscope *closure;  /* where it was defined: names resolve there */
};

struct jfunc {
    int id;  /* JM_* */
    jv self; /* the object of a bound method */
};

struct jloop {
    const jlist *items;
    size_t i;
};

static inline jv jv_undef(void) { jv v = {JV_UNDEF, 0, {0}}; return v; }
static inline jv jv_none(void) { jv v = {JV_NONE, 0, {0}}; return v; }
static inline jv jv_bool(bool b) { jv v = {JV_BOOL, 0, {.b = b}}; return v; }
static inline jv jv_int(int64_t i) { jv v = {JV_INT, 0, {.i = i}}; return v; }
static inline jv jv_float(double f) { jv v = {JV_FLOAT, 0, {.f = f}}; return v; }
static inline jv jv_str(const char *p, size_t n) { jv v = {JV_STR, 0, {.s = {p, n}}}; return v; }
static inline jv jv_list(jlist *l) { jv v = {JV_LIST, 0, {.l = l}}; return v; }
static inline jv jv_dict(jdict *d) { jv v = {JV_DICT, 0, {.d = d}}; return v; }
static inline bool jv_is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }

/* ---- syntax tree ---- */

enum {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BIN, N_CMP, N_COND, N_CONCAT, N_KWARG, N_PARAM,
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE,
};

/* Operators (tokens, N_BIN and N_CMP). */
enum {
    OP_NONE, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE,
    OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE, OP_IN, OP_NOTIN,
    OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
};

/* Macro flags (jnode.flag of N_MACRO and N_CALLBLOCK): names its body reads. */
enum { MF_VARARGS = 1, MF_KWARGS = 2, MF_CALLER = 4 };

/* One node; which fields mean what depends on kind:
 *   N_CONST val | N_NAME sym, val (the name) | N_LIST, N_TUPLE v
 *   N_DICT v (keys), kw (values) | N_ATTR a, val (name) | N_ITEM a, b
 *   N_SLICE a, b c d (start stop step, each may be NULL)
 *   N_CALL a, v (positional), kw (N_KWARG: val name, a value)
 *   N_FILTER a (NULL in a filter block), op (JF_*), val (name), v, kw
 *   N_TEST a, op (JT_*), flag (negated), val (name), v, kw
 *   N_NEG N_POS N_NOT a | N_AND N_OR a b | N_BIN op a b
 *   N_CMP a, v (N_CMP nodes with op and a: the operands in order)
 *   N_COND a (value), b (condition), c (else value or NULL) | N_CONCAT v
 *   N_PARAM val, sym, a (default or NULL)
 *   N_BODY v | N_TEXT val | N_OUT a | N_IF a, v (then), b (N_BODY or N_IF, or NULL)
 *   N_FOR a (target), b (iterable), c (filter or NULL), v (body), d (else N_BODY or NULL)
 *   N_SET a (target: N_NAME, N_TUPLE of names, or N_ATTR of a name), b
 *   N_SETBLOCK a (N_NAME), v | N_MACRO val, sym, kw (N_PARAMs), v, flag
 *   N_CALLBLOCK a (the N_CALL), kw (N_PARAMs), v, flag | N_FILTERBLOCK a (filters), v */
struct jnode {
    uint8_t kind;
    uint8_t op;
    uint8_t flag;
    int line;
    int sym;
    jv val;
    jnode *a, *b, *c, *d;
    jnode **v;
    int n;
    jnode **kw;
    int n_kw;
};

/* Builtin globals, resolved by name when no variable has it. */
enum { JG_RANGE, JG_NAMESPACE, JG_DICT, JG_RAISE, JG_STRFTIME, JG_COUNT };

struct cv_jinja {
    jarena ar;
    jnode *root; /* N_BODY */
    jstr *names; /* interned names by symbol */
    int n_names;
    int8_t *global_of; /* per symbol: JG_* or -1 */
    int sym_loop, sym_caller, sym_varargs, sym_kwargs;
};

/* ---- lexer (jinja_lex.c) ---- */

enum { TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME, TK_INT, TK_FLOAT,
       TK_STRING, TK_OP };

typedef struct jtok {
    uint8_t kind;
    uint8_t op; /* TK_OP */
    int line;
    jstr s;     /* TK_TEXT, TK_NAME, TK_STRING (decoded) */
    int64_t i;
    double f;
} jtok;

typedef struct jlex {
    jarena *ar;
    jtok *tok;
    size_t n, cap;
    char *err;
    size_t errlen;
} jlex;

/* Tokenizes src into lx->tok (ending with TK_EOF). */
int cv_jx_lex(jlex *lx, const char *src, size_t len);

/* ---- render state ---- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
    size_t *held; /* the render's count of bytes in all its buffers */
    jarena *ar;   /* the render's, which holds cap bytes for it */
} jbuf;

struct jscope {
    jscope *parent;
    int *sym;
    jv *val;
    int n, cap;
};

enum { JC_NONE, JC_BREAK, JC_CONTINUE };

typedef struct jrender {
    const cv_jinja *t;
    jarena ar;
    jbuf *out;   /* where text goes now: the result, or a capture */
    size_t held; /* bytes in all text buffers: at most twice max_output */
    cv_jinja_limits lim;
    uint64_t steps, iterations;
    bool (*stop)(void *user); /* cv_jinja_env's */
    void *stop_user;
    int depth;
    int year, month, day;
    int ctl; /* JC_*: a break or continue on its way to its loop */
    bool failed;
    char *err;
    size_t errlen;
} jrender;

/* The arguments of a call, a filter or a test, for the function called. */
typedef struct jargs {
    const jv *pos;
    int n_pos;
    const jstr *kw_name;
    const jv *kw;
    int n_kw;
    uint32_t kw_used; /* bit k: keyword k was taken */
    const char *what; /* "filter 'join'", for messages */
    int line;
} jargs;

int cv_jr_fail(jrender *r, int line, const char *fmt, ...) CV_PRINTF(3, 4);
/* Counts n steps of work; fails past the limit. */
int cv_jr_work(jrender *r, int line, uint64_t n);
/* Appends to b (NULL: the current output), within the output limit. */
int cv_jb_put(jrender *r, jbuf *b, int line, const char *p, size_t n);
static inline int jb_puts(jrender *r, jbuf *b, int line, const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return cv_jb_put(r, b, line, s, n);
}
/* Moves b's text into the arena as a string (b is emptied and freed). */
int cv_jb_take(jrender *r, jbuf *b, int line, jv *out);
void cv_jb_free(jbuf *b);

/* ---- values (jinja_value.c) ---- */

void *cv_jr_alloc(jrender *r, int line, size_t n);
/* Fails the render for memory: the pool's if it is spent, else the render's limit. */
int cv_jr_no_memory(jrender *r, int line);
int cv_jv_str_dup(jrender *r, int line, const char *p, size_t n, jv *out);
jlist *cv_jl_new(jrender *r, int line, size_t cap);
int cv_jl_push(jrender *r, int line, jlist *l, jv v);
jdict *cv_jd_new(jrender *r, int line, size_t cap);
int cv_jd_set(jrender *r, int line, jdict *d, jv k, jv v);
/* Looks k up (a step per 16 keys); NULL when absent or when the render failed. */
jv *cv_jd_get(jrender *r, int line, const jdict *d, jv k);
jv *cv_jd_get_str(const jdict *d, const char *p, size_t n);
bool cv_jv_truthy(jv v);
/* Python's a == b, a step per pair of values compared; past the step limit
 * the render fails (r->failed) and the answer is false. */
bool cv_jv_equal(jrender *r, int line, jv a, jv b);
/* Python's order of a and b: *out < 0, 0 or > 0; fails for types Python
 * does not order (and lower-cases strings first when fold). */
int cv_jv_cmp(jrender *r, int line, jv a, jv b, bool fold, int *out);
const char *cv_jv_type_name(jv v);
/* Python's str(v) and repr(v), appended to b. */
int cv_jv_write_str(jrender *r, jbuf *b, int line, jv v);
int cv_jv_write_repr(jrender *r, jbuf *b, int line, jv v, int depth);
/* Python's str(v) as a string value (strings as they are). */
int cv_jv_to_str(jrender *r, int line, jv v, jv *out);

typedef struct jjson_opts {
    int indent; /* < 0: none */
    jstr item_sep, key_sep;
    bool sort_keys;
    bool ascii; /* ensure_ascii: other code points as \uXXXX */
} jjson_opts;
/* json.dumps(v, ...) as transformers' tojson calls it. */
int cv_jv_write_json(jrender *r, jbuf *b, int line, jv v, const jjson_opts *o, int depth);
/* A jansson value as a value: its strings are copied into the arena, or
 * point into j (which then outlives the render) when copy is false. */
int cv_jv_from_json(jrender *r, int line, const struct json_t *j, bool copy, jv *out, int depth);

/* ---- text (jinja_text.c) ---- */

uint32_t cv_jt_decode(const char *p, size_t n, size_t *len);
size_t cv_jt_encode(uint32_t cp, char *out);
size_t cv_jt_count(jstr s); /* code points */
/* Byte offset of code point k (k <= cv_jt_count(s)). */
size_t cv_jt_offset(jstr s, size_t k);
bool cv_jt_is_space(uint32_t cp); /* Python's str.isspace() */
bool cv_jt_is_alpha(uint32_t cp);
bool cv_jt_is_digit(uint32_t cp);
uint32_t cv_jt_upper(uint32_t cp);
uint32_t cv_jt_lower(uint32_t cp);
/* Length of the Python whitespace that starts at / ends before p. */
size_t cv_jt_space_at(const char *p, const char *end);
size_t cv_jt_space_before(const char *start, const char *end);
jstr cv_jt_strip(jstr s, bool left, bool right);
/* Python's repr(f) ("1.0", "1e-05", "inf"); buf holds 32 bytes. */
void cv_jt_float_repr(double f, char *buf);
/* Python's int(s) and float(s) of a string; false when it is not one. */
bool cv_jt_parse_int(jstr s, int base, int64_t *out);
bool cv_jt_parse_float(jstr s, double *out);
/* strftime of a date at 00:00:00 (English names, as Python's C locale). */
int cv_jt_strftime(jrender *r, jbuf *b, int line, jstr fmt, int year, int month, int day);

/* ---- expressions (jinja_expr.c), statements (jinja_eval.c) ---- */

int cv_je_expr(jrender *r, jscope *s, const jnode *n, jv *out);
int cv_je_body(jrender *r, jscope *s, const jnode *body);
/* Evaluates a node's arguments (n->v, n->kw) into a (arrays from the arena). */
int cv_je_args(jrender *r, jscope *s, const jnode *n, const char *what, jargs *a);
/* Calls a callable value. */
int cv_je_call(jrender *r, int line, jv fn, jargs *a, jv *out);
int cv_je_call_macro(jrender *r, int line, const jmacro *m, jargs *a, jv *out);
jv *cv_js_find(jscope *s, int sym);
int cv_js_set(jrender *r, int line, jscope *s, int sym, jv v);
/* getattr(obj, name) and obj[key] with Jinja's sandbox rules. */
int cv_je_getattr(jrender *r, int line, jv obj, jstr name, jv *out);
int cv_je_getitem(jrender *r, int line, jv obj, jv key, jv *out);
/* A dotted attribute path ("a.b.0") as filters' attribute= reads it. */
int cv_je_getpath(jrender *r, int line, jv obj, jstr path, jv *out);
/* Fails with Jinja's UndefinedError for using the undefined u ("'x' is
 * undefined", "'dict object' has no attribute 'x'"). */
int cv_je_undefined(jrender *r, int line, jv u);
/* Python's item in seq. */
int cv_je_contains(jrender *r, int line, jv item, jv seq, bool *out);
/* What a for loop or list() iterates: list items, dict keys, characters. */
int cv_je_iterate(jrender *r, int line, jv v, jlist **out);

/* ---- filters and tests (jinja_filters.c) ---- */

int cv_jf_filter_id(jstr name);
int cv_jf_test_id(jstr name);
int cv_jf_filter(jrender *r, int id, jv operand, jargs *a, jv *out);
int cv_jf_test(jrender *r, int id, jv operand, jargs *a, bool *out);
/* Argument i (positional) or name (keyword): true when given. */
bool cv_ja_arg(jargs *a, int i, const char *name, jv *out);
/* Fails for more than n_pos positional arguments or an unused keyword. */
int cv_ja_done(jrender *r, jargs *a, int n_pos);
/* Like cv_ja_arg, with a type check: want is a JV_* type (JV_INT accepts
 * bool). */
int cv_ja_typed(jrender *r, jargs *a, int i, const char *name, int want, jv *out, bool *given);

/* ---- methods and globals (jinja_methods.c) ---- */

enum {
    JM_RANGE, JM_NAMESPACE, JM_DICT, JM_RAISE, JM_STRFTIME, JM_CYCLE,
    JM_S_CAPITALIZE, JM_S_COUNT, JM_S_ENDSWITH, JM_S_FIND, JM_S_FORMAT, JM_S_ISALNUM, JM_S_ISALPHA,
    JM_S_ISDIGIT, JM_S_ISLOWER, JM_S_ISSPACE, JM_S_ISUPPER, JM_S_JOIN, JM_S_LOWER, JM_S_LSTRIP,
    JM_S_REPLACE, JM_S_RFIND, JM_S_RSPLIT, JM_S_RSTRIP, JM_S_SPLIT, JM_S_SPLITLINES, JM_S_STARTSWITH,
    JM_S_STRIP, JM_S_TITLE, JM_S_UPPER,
    JM_L_APPEND, JM_L_COUNT, JM_L_EXTEND, JM_L_INDEX, JM_L_INSERT, JM_L_POP,
    JM_D_GET, JM_D_ITEMS, JM_D_KEYS, JM_D_VALUES,
};

/* The method name of obj as a bound method; false when it has none. */
bool cv_jm_method(jrender *r, int line, jv obj, jstr name, jv *out);
int cv_jm_call(jrender *r, int line, const jfunc *fn, jargs *a, jv *out);
/* Python's fmt % args (args a tuple, a dict or one value). */
int cv_jm_percent(jrender *r, int line, jstr fmt, jv args, jv *out);
/* Text helpers shared with the filters. */
int cv_jm_replace(jrender *r, int line, jstr s, jstr old, jstr rep, int64_t count, jv *out);
int cv_jm_split(jrender *r, int line, jstr s, const jv *sep, int64_t maxsplit, bool from_right, jv *out);
int cv_jm_case(jrender *r, int line, jstr s, int mode, jv *out);
enum { JCASE_UPPER, JCASE_LOWER, JCASE_TITLE, JCASE_CAPITALIZE, JCASE_JTITLE };
int cv_jm_strip(jrender *r, int line, jstr s, const jv *chars, bool left, bool right, jv *out);
/* Python's str.splitlines(keepends) (in jinja_filters.c, beside indent). */
int cv_jm_splitlines(jrender *r, int line, jstr s, bool keepends, jlist **out);

#endif
