/* jinja_lex.c: template text -> tokens (jinja_impl.h).
 *
 * As Jinja2's lexer with trim_blocks and lstrip_blocks: text runs up to the
 * next "{{", "{%" or "{#". A "-" after the opening strips the whitespace
 * before the tag, and one before the closing strips the whitespace after
 * it; "+" keeps them. Without a sign, a block or comment tag alone on its
 * line (only spaces and tabs before it) takes that indentation away
 * (lstrip_blocks), and the newline right after "%}" or "#}" goes
 * (trim_blocks). Inside a tag, the end "}}" / "%}" counts only outside
 * brackets, so a dict literal may close with "}}". Comments leave no token;
 * {% raw %}...{% endraw %} leaves its text as it is.
 * String literals are decoded as Python's unicode-escape codec reads them
 * (Jinja2 does the same): \n \t \r \\ \' \" \a \b \f \v, octal, \xhh,
 * \uXXXX, \UXXXXXXXX; any other backslash stays as it is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_impl.h"
#include "core/alloc.h"
#include "core/utf8.h"

#define MAX_BRACKETS 200

typedef struct lexer {
    jlex *lx;
    const char *s;
    size_t n, pos;
    int line;
    bool line_starting; /* the last tag ended with a newline (or none yet) */
    char brackets[MAX_BRACKETS];
    int depth;
} lexer;

static int fail(lexer *L, const char *what)
{
    return cv_errf(L->lx->err, L->lx->errlen, "line %d: %s", L->line, what);
}

static jtok *push(lexer *L, int kind)
{
    jlex *lx = L->lx;
    if (lx->n == lx->cap) {
        size_t cap = lx->cap ? 2 * lx->cap : 256;
        jtok *t = cv_realloc(lx->tok, cap * sizeof *t);
        if (!t) {
            fail(L, "out of memory reading the template");
            return NULL;
        }
        lx->tok = t;
        lx->cap = cap;
    }
    jtok *t = &lx->tok[lx->n++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    t->line = L->line;
    return t;
}

/* Moves pos to to, counting newlines. */
static void advance(lexer *L, size_t to)
{
    for (; L->pos < to; L->pos++)
        L->line += L->s[L->pos] == '\n';
}

/* ---- text and whitespace control ---- */

static size_t find_tag(const lexer *L, size_t from)
{
    for (size_t i = from; i + 1 < L->n; i++)
        if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' || L->s[i + 1] == '#'))
            return i;
    return L->n;
}

/* lstrip_blocks: the length text keeps when only spaces end its last line. */
static size_t lstrip_len(const lexer *L, const char *p, size_t n)
{
    size_t l = n;
    while (l > 0 && p[l - 1] != '\n')
        l--;
    if (l == 0 && !L->line_starting)
        return n;
    const char *q = p + l, *end = p + n;
    if (q == end)
        return n;
    size_t k;
    while (q < end && (k = cv_jt_space_at(q, end)) > 0)
        q += k;
    return q == end ? l : n;
}

static int emit_text(lexer *L, size_t from, size_t to, char kind, char sign)
{
    const char *p = L->s + from;
    size_t n = to - from;
    if (sign == '-')
        n = cv_jt_strip((jstr){p, n}, false, true).n;
    else if (sign != '+' && kind != '{')
        n = lstrip_len(L, p, n);
    if (n == 0)
        return 0;
    jtok *t = push(L, TK_TEXT);
    if (!t)
        return -1;
    t->s = (jstr){p, n};
    return 0;
}

/* After a tag's end: "-" strips the whitespace that follows, trim_blocks one newline. */
static void after_end(lexer *L, size_t end, char sign, bool trim)
{
    size_t to = end, k;
    if (sign == '-')
        while ((k = cv_jt_space_at(L->s + to, L->s + L->n)) > 0)
            to += k;
    else if (sign != '+' && trim && to < L->n && L->s[to] == '\n')
        to++;
    advance(L, to);
    L->line_starting = to > 0 && L->s[to - 1] == '\n';
}

static int lex_comment(lexer *L, size_t start)
{
    size_t j = start;
    while (j + 1 < L->n && !(L->s[j] == '#' && L->s[j + 1] == '}'))
        j++;
    if (j + 1 >= L->n)
        return fail(L, "missing the end of a comment (#})");
    char sign = j > start && (L->s[j - 1] == '-' || L->s[j - 1] == '+') ? L->s[j - 1] : 0;
    after_end(L, j + 2, sign, true);
    return 0;
}

/* ---- inside a tag ---- */

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int lex_name(lexer *L)
{
    size_t e = L->pos;
    while (e < L->n && (is_name_start(L->s[e]) || is_digit(L->s[e])))
        e++;
    jtok *t = push(L, TK_NAME);
    if (!t)
        return -1;
    t->s = (jstr){L->s + L->pos, e - L->pos};
    advance(L, e);
    return 0;
}

/* Digits (with single underscores between them) in base at s[*i]. */
static bool read_digits(lexer *L, size_t *i, int base, uint64_t *v, bool *overflow)
{
    size_t j = *i;
    bool any = false;
    while (j < L->n) {
        char c = L->s[j];
        const int next = j + 1 < L->n ? cv_hex_digit(L->s[j + 1]) : -1;
        if (c == '_' && any && next >= 0 && next < base) {
            j++;
            continue;
        }
        int d = cv_hex_digit(c);
        if (d < 0 || d >= base)
            break;
        if (*v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            *overflow = true;
        *v = *v * (uint64_t)base + (uint64_t)d;
        any = true;
        j++;
    }
    *i = j;
    return any;
}

/* A float's extent from pos (digits already seen up to i), or 0 if none. */
static size_t float_end(const lexer *L, size_t i)
{
    size_t j = i;
    if (j + 1 < L->n && L->s[j] == '.' && is_digit(L->s[j + 1])) {
        j++;
        while (j < L->n && (is_digit(L->s[j]) || (L->s[j] == '_' && j + 1 < L->n && is_digit(L->s[j + 1]))))
            j++;
    }
    if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
        size_t k = j + 1;
        if (k < L->n && (L->s[k] == '+' || L->s[k] == '-'))
            k++;
        if (k < L->n && is_digit(L->s[k])) {
            while (k < L->n && (is_digit(L->s[k]) || (L->s[k] == '_' && k + 1 < L->n && is_digit(L->s[k + 1]))))
                k++;
            j = k;
        }
    }
    return j > i ? j : 0;
}

static int lex_number(lexer *L, bool after_dot)
{
    size_t i = L->pos;
    int base = 10;
    if (L->s[i] == '0' && i + 1 < L->n && strchr("bBoOxX", L->s[i + 1]) && L->s[i + 1] != 0) {
        char c = L->s[i + 1];
        base = c == 'b' || c == 'B' ? 2 : c == 'o' || c == 'O' ? 8 : 16;
        i += 2;
    }
    uint64_t v = 0;
    bool overflow = false;
    if (!read_digits(L, &i, base, &v, &overflow))
        return fail(L, "a number prefix without digits");
    size_t fe = base == 10 && !after_dot ? float_end(L, i) : 0;
    jtok *t = push(L, fe ? TK_FLOAT : TK_INT);
    if (!t)
        return -1;
    if (fe) {
        char buf[128];
        size_t k = 0;
        for (size_t j = L->pos; j < fe && k + 1 < sizeof buf; j++)
            if (L->s[j] != '_')
                buf[k++] = L->s[j];
        buf[k] = '\0';
        t->f = strtod(buf, NULL);
        advance(L, fe);
        return 0;
    }
    if (overflow || v > INT64_MAX)
        return fail(L, "an integer literal larger than 64 bits");
    t->i = (int64_t)v;
    advance(L, i);
    return 0;
}

/* One escape at p[0] == '\\' (p < end - 1); appends its bytes to out. */
static size_t unescape_one(const char *p, const char *end, char *out, size_t *o, bool *bad)
{
    static const char simple_in[] = "\\'\"abfnrtv", simple_out[] = "\\'\"\a\b\f\n\r\t\v";
    char c = p[1];
    const char *hit = strchr(simple_in, c);
    if (hit && c) {
        out[(*o)++] = simple_out[hit - simple_in];
        return 2;
    }
    if (c == '\n')
        return 2;
    if (c >= '0' && c <= '7') {
        size_t k = 1;
        uint32_t v = 0;
        while (k < 4 && p + k < end && p[k] >= '0' && p[k] <= '7')
            v = v * 8 + (uint32_t)(p[k++] - '0');
        *o += cv_jt_encode(v, out + *o);
        return k;
    }
    int width = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (width == 0) {
        out[(*o)++] = '\\';
        return 1;
    }
    uint32_t v = 0;
    for (int k = 0; k < width; k++) {
        int d = p + 2 + k < end ? cv_hex_digit(p[2 + k]) : -1;
        if (d < 0) {
            *bad = true;
            return 2;
        }
        v = v * 16 + (uint32_t)d;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        v = 0xFFFD;
    *o += cv_jt_encode(v, out + *o);
    return (size_t)width + 2;
}

static int lex_string(lexer *L)
{
    char q = L->s[L->pos];
    size_t j = L->pos + 1;
    while (j < L->n && L->s[j] != q)
        j += L->s[j] == '\\' && j + 1 < L->n ? 2 : 1;
    if (j >= L->n)
        return fail(L, "a string literal without its closing quote");
    const char *p = L->s + L->pos + 1, *end = L->s + j;
    char *out = cv_ja_alloc(L->lx->ar, (size_t)(end - p) * 4 + 1);
    if (!out)
        return fail(L, "out of memory reading the template");
    size_t o = 0;
    bool bad = false;
    while (p < end) {
        if (*p == '\\' && p + 1 < end)
            p += unescape_one(p, end, out, &o, &bad);
        else
            out[o++] = *p++;
    }
    if (bad)
        return fail(L, "a truncated \\x, \\u or \\U escape in a string literal");
    jtok *t = push(L, TK_STRING);
    if (!t)
        return -1;
    t->s = (jstr){out, o};
    advance(L, j + 1);
    return 0;
}

static const struct {
    const char *text;
    uint8_t op;
} OPS[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GE}, {"<=", OP_LE},
    {"+", OP_ADD}, {"-", OP_SUB}, {"*", OP_MUL}, {"/", OP_DIV}, {"%", OP_MOD}, {"~", OP_TILDE},
    {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN}, {")", OP_RPAREN}, {"{", OP_LBRACE},
    {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT}, {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON},
    {"|", OP_PIPE}, {",", OP_COMMA}, {";", OP_SEMICOLON},
};

/* Keeps brackets balanced, as Jinja2 does. */
static int balance(lexer *L, char c)
{
    if (c == '(' || c == '[' || c == '{') {
        if (L->depth == MAX_BRACKETS)
            return fail(L, "brackets nested too deeply");
        L->brackets[L->depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        return 0;
    }
    if (c == ')' || c == ']' || c == '}') {
        if (L->depth == 0 || L->brackets[L->depth - 1] != c) {
            char msg[64];
            snprintf(msg, sizeof msg, "unexpected '%c'", c);
            return fail(L, msg);
        }
        L->depth--;
    }
    return 0;
}

static int lex_op(lexer *L)
{
    for (size_t k = 0; k < sizeof OPS / sizeof OPS[0]; k++) {
        size_t m = strlen(OPS[k].text);
        if (L->pos + m <= L->n && memcmp(L->s + L->pos, OPS[k].text, m) == 0) {
            if (balance(L, OPS[k].text[0]) != 0)
                return -1;
            jtok *t = push(L, TK_OP);
            if (!t)
                return -1;
            t->op = OPS[k].op;
            advance(L, L->pos + m);
            return 0;
        }
    }
    char msg[64];
    unsigned char c = (unsigned char)L->s[L->pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(msg, sizeof msg, "unexpected character '%c' in a tag", c);
    else
        snprintf(msg, sizeof msg, "unexpected byte 0x%02x in a tag", c);
    return fail(L, msg);
}

/* The closing of the tag at pos, if any: its length and sign. */
static size_t tag_end(const lexer *L, char kind, char *sign)
{
    const char *p = L->s + L->pos;
    size_t left = L->n - L->pos;
    char close = kind == '{' ? '}' : '%';
    *sign = 0;
    if (left >= 3 && (p[0] == '-' || (p[0] == '+' && kind == '%')) && p[1] == close && p[2] == '}') {
        *sign = p[0];
        return 3;
    }
    return left >= 2 && p[0] == close && p[1] == '}' ? 2 : 0;
}

static int lex_token(lexer *L)
{
    char c = L->s[L->pos];
    bool after_dot = L->lx->n > 0 && L->lx->tok[L->lx->n - 1].kind == TK_OP &&
                     L->lx->tok[L->lx->n - 1].op == OP_DOT;
    if (is_name_start(c))
        return lex_name(L);
    if (is_digit(c))
        return lex_number(L, after_dot);
    if (c == '\'' || c == '"')
        return lex_string(L);
    return lex_op(L);
}

/* Whether the text at p (after "{%" and its sign) is the word w followed by
 * a tag end; *end is set past the end (its sign in *sign). */
static bool is_tag_word(const lexer *L, size_t p, const char *w, size_t *end, char *sign)
{
    size_t k, n = strlen(w);
    while ((k = cv_jt_space_at(L->s + p, L->s + L->n)) > 0)
        p += k;
    if (p + n > L->n || memcmp(L->s + p, w, n) != 0)
        return false;
    p += n;
    while ((k = cv_jt_space_at(L->s + p, L->s + L->n)) > 0)
        p += k;
    *sign = p < L->n && (L->s[p] == '-' || L->s[p] == '+') ? L->s[p] : 0;
    p += *sign != 0;
    if (p + 2 > L->n || L->s[p] != '%' || L->s[p + 1] != '}')
        return false;
    *end = p + 2;
    return true;
}

/* {% raw %}...{% endraw %}: the text between as it is (whitespace control
 * at both tags as at any block tag). */
static int lex_raw(lexer *L, size_t after_open, int open_line)
{
    size_t body, end;
    char sign, end_sign;
    if (!is_tag_word(L, after_open, "raw", &body, &sign))
        return 1;
    after_end(L, body, sign, false); /* Jinja2 keeps the newline after {% raw %} */
    for (size_t q = L->pos; (q = find_tag(L, q)) < L->n; q++) {
        char open_sign = q + 2 < L->n && (L->s[q + 2] == '-' || L->s[q + 2] == '+') ? L->s[q + 2] : 0;
        if (L->s[q + 1] != '%' || !is_tag_word(L, q + 2 + (open_sign != 0), "endraw", &end, &end_sign))
            continue;
        if (emit_text(L, L->pos, q, '%', open_sign) != 0)
            return -1;
        advance(L, q);
        after_end(L, end, end_sign, true);
        return 0;
    }
    L->line = open_line;
    return fail(L, "a {% raw %} without its {% endraw %}");
}

static int lex_tag(lexer *L, char kind, int open_line)
{
    L->depth = 0;
    for (;;) {
        size_t k;
        while ((k = cv_jt_space_at(L->s + L->pos, L->s + L->n)) > 0)
            advance(L, L->pos + k);
        if (L->pos >= L->n) {
            L->line = open_line;
            return fail(L, kind == '{' ? "a {{ without its }}" : "a {% without its %}");
        }
        char sign;
        size_t m = L->depth == 0 ? tag_end(L, kind, &sign) : 0;
        if (m > 0) {
            if (!push(L, kind == '{' ? TK_VAR_END : TK_BLOCK_END))
                return -1;
            after_end(L, L->pos + m, sign, kind == '%');
            return 0;
        }
        if (lex_token(L) != 0)
            return -1;
    }
}

int cv_jx_lex(jlex *lx, const char *src, size_t len)
{
    lexer L = {.lx = lx, .s = src, .n = len, .line = 1, .line_starting = true};
    while (L.pos < L.n) {
        size_t q = find_tag(&L, L.pos);
        char kind = q < L.n ? L.s[q + 1] : 0;
        char sign = q + 2 < L.n && (L.s[q + 2] == '-' || L.s[q + 2] == '+') ? L.s[q + 2] : 0;
        if (emit_text(&L, L.pos, q, kind, sign) != 0)
            return -1;
        advance(&L, q);
        if (q == L.n)
            break;
        size_t body = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            if (lex_comment(&L, body) != 0)
                return -1;
            continue;
        }
        int open_line = L.line, raw = kind == '%' ? lex_raw(&L, body, open_line) : 1;
        if (raw <= 0) {
            if (raw < 0)
                return -1;
            continue;
        }
        if (!push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN))
            return -1;
        advance(&L, body);
        if (lex_tag(&L, kind, open_line) != 0)
            return -1;
    }
    return push(&L, TK_EOF) ? 0 : -1;
}
