/* bpe.c: byte-level BPE as llama.cpp runs it for Llama 3, Qwen2/3, GPT-2
 * and the o200k vocabularies (gpt-oss, GPT-4o).
 *
 * Tokenizing one raw fragment (cv_bpe_tokenize):
 * 1. Decode the UTF-8 into code points (cv_utf8_decode) with their classes
 *    (letter, number, white space; unicode.h).
 * 2. Split into pre-tokens with a hand-written matcher of the model's
 *    regex, tried at each position in the regex's order of alternatives,
 *    with its backtracking worked out by hand:
 *    Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
 *             \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *    Qwen2:   the same with \p{N} instead of \p{N}{1,3}
 *    GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
 *             \s+(?!\S)|\s+
 *    GPT-4o:  [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,3}|
 *             ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *             where C is (?i:'s|'t|'re|'ve|'m|'ll|'d) (ASCII case only).
 *             o200k's U is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and W
 *             [\p{Ll}\p{Lm}\p{Lo}\p{M}]; llama.cpp runs them as "a letter
 *             but not a-z" and "a letter but not A-Z", so every non-ASCII
 *             letter is both and a mark is neither (it splits a word:
 *             "x\u0303y" is "x" "\u0303y"). convoy does as llama.cpp.
 *    Every code point is a letter, a number, white space or none of these,
 *    so some alternative always matches and the pre-tokens tile the text.
 * 3. Each pre-token is re-encoded as UTF-8 and every byte is written as its
 *    GPT-2 code point (bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF stand for
 *    themselves; the other 68 bytes, in order, become U+0100..U+0143). With
 *    "ignore merges" (Llama 3) a pre-token that is a token is emitted as is.
 * 4. Otherwise its mapped characters are symbols; every adjacent pair that
 *    is a merge goes into a min-heap by (rank, position of the left
 *    symbol). The best pair is merged, pairs whose symbols have changed
 *    since they were pushed are skipped, and the new symbol's pairs with
 *    its neighbours are pushed, until the heap is empty.
 * 5. Each final symbol is the token of that text; if there is none, each
 *    byte of the symbol's (mapped) text that is itself a token is emitted
 *    and the others are dropped, as llama.cpp does.
 *
 * Merges: tokenizer.ggml.merges[i] = "left right" (split at the first space
 * after the first byte, as llama.cpp splits it) has rank i. They are kept as
 * the concatenated text plus the split point in one blob, with an
 * open-addressing hash map from (text, split) to rank; pairs of adjacent
 * symbols are contiguous in the pre-token, so a lookup hashes one run of bytes.
 *
 * Direction: the vocabulary (vocab.c) calls this file, never the reverse.
 * BPE knows no cv_vocab: it finds the id of a symbol's text through the
 * cv_bpe_lookup the caller passes to cv_bpe_tokenize.
 *
 * Ownership: cv_bpe owns its blob and map; scratch memory lives for one
 * cv_bpe_tokenize call. Owner of this file: the BPE helper. */
#include "model/bpe.h"

#include <limits.h>
#include <string.h>

#include "core/alloc.h"
#include "core/heap.h"
#include "core/err.h"
#include "core/unicode.h"

/* The pre-tokenizer split, named by tokenizer.ggml.pre (bpe.h). */
typedef enum bpe_pre { BPE_PRE_GPT2, BPE_PRE_LLAMA3, BPE_PRE_QWEN2, BPE_PRE_GPT4O } bpe_pre;

struct cv_bpe {
    bpe_pre pre;
    bool ignore_merges;
    uint32_t n_merges;
    char *blob;          /* left+right texts of every merge */
    uint32_t *off, *len; /* per rank: offset in blob, length of left+right */
    uint32_t *split;     /* per rank: length of left */
    uint32_t map_mask;
    int32_t *map;        /* rank per slot, -1 when empty */
};

/* ---- the GPT-2 byte <-> code point mapping ---- */

static uint32_t byte_to_cp(uint8_t b)
{
    if (b <= 0x20)
        return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100u + 33 + (b - 0x7Fu);
    if (b == 0xAD)
        return 0x143;
    return b;
}

/* The byte a code point stands for, or -1. */
static int cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp < 0x100 + 33)
        return (int)(cp - 0x100);
    if (cp >= 0x100 + 33 && cp < 0x100 + 67)
        return (int)(0x7F + cp - (0x100 + 33));
    if (cp == 0x143)
        return 0xAD;
    return -1;
}

uint32_t cv_bpe_decode_text(const char *s, uint32_t n, char *dst)
{
    uint32_t out = 0;
    for (uint32_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = cv_utf8_decode((const uint8_t *)s + i, n - i, &k);
        int b = cp_to_byte(cp);
        if (b >= 0) {
            if (dst)
                dst[out] = (char)b;
            out++;
        } else {
            if (dst)
                memcpy(dst + out, s + i, k);
            out += (uint32_t)k;
        }
        i += (uint32_t)k;
    }
    return out;
}

/* ---- merges ---- */

static uint64_t hash_span(const char *s, size_t n, uint32_t split)
{
    uint64_t h = 1469598103934665603ull ^ split; /* FNV-1a, seeded with the split */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

/* Rank of merging the symbols s[0..split) and s[split..n), or -1. */
static int32_t merge_rank(const cv_bpe *b, const char *s, uint32_t n, uint32_t split)
{
    uint32_t slot = (uint32_t)hash_span(s, n, split) & b->map_mask;
    for (;;) {
        int32_t r = b->map[slot];
        if (r < 0)
            return -1;
        if (b->len[r] == n && b->split[r] == split && memcmp(b->blob + b->off[r], s, n) == 0)
            return r;
        slot = (slot + 1) & b->map_mask;
    }
}

static const struct {
    const char *name;
    bpe_pre pre;
} pre_names[] = {
    {"llama-bpe", BPE_PRE_LLAMA3}, {"llama3", BPE_PRE_LLAMA3}, {"llama-v3", BPE_PRE_LLAMA3},
    {"qwen2", BPE_PRE_QWEN2},      {"deepseek-r1-qwen", BPE_PRE_QWEN2},
    {"gpt-2", BPE_PRE_GPT2},       {"gpt2", BPE_PRE_GPT2},
    /* llama.cpp splits all five with the same regex, without BOS or ignore-merges */
    {"gpt-4o", BPE_PRE_GPT4O},     {"llama4", BPE_PRE_GPT4O},          {"minimax-m2", BPE_PRE_GPT4O},
    {"kanana2", BPE_PRE_GPT4O},    {"talkie", BPE_PRE_GPT4O},
};

static int read_pre(cv_bpe *b, const gguf_file *f, char *err, size_t errlen)
{
    b->pre = BPE_PRE_GPT2;
    if (!cv_gguf_find_kv(f, "tokenizer.ggml.pre"))
        return 0;
    gguf_str name;
    if (cv_gguf_get_str(f, "tokenizer.ggml.pre", &name, err, errlen) != 0)
        return -1;
    for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]); i++) {
        if (cv_gguf_str_eq(name, pre_names[i].name)) {
            b->pre = pre_names[i].pre;
            return 0;
        }
    }
    return cv_errf(err, errlen,
                   "%s: unsupported BPE pre-tokenizer '%.*s' "
                   "(tokenizer.ggml.pre; supported: llama-bpe, qwen2, gpt-2, gpt-4o)",
                   f->name, (int)(name.len > 64 ? 64 : name.len), name.ptr);
}

int cv_bpe_load(cv_bpe **out, const gguf_file *f, char *err, size_t errlen)
{
    *out = NULL;
    const gguf_kv *merges = cv_gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!merges)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.merges is missing (a 'gpt2' tokenizer needs its merges)",
                       f->name);
    if (merges->type != GGUF_ARRAY || merges->arr_type != GGUF_STRING)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.merges is not an array of strings", f->name);
    if (merges->arr_n > INT32_MAX / 4)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.merges has %llu entries, too many", f->name,
                       (unsigned long long)merges->arr_n);
    uint32_t n = (uint32_t)merges->arr_n;
    uint64_t blob_len = 0;
    for (uint32_t i = 0; i < n; i++)
        blob_len += merges->arr_strs[i].len;
    if (blob_len > UINT32_MAX)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.merges holds %llu bytes, too many", f->name,
                       (unsigned long long)blob_len);

    cv_bpe *b = cv_calloc(1, sizeof(cv_bpe));
    if (!b)
        return cv_errf(err, errlen, "%s: out of memory loading %u merges", f->name, n);
    if (read_pre(b, f, err, errlen) != 0) {
        cv_bpe_free(b);
        return -1;
    }
    b->ignore_merges = b->pre == BPE_PRE_LLAMA3;
    uint32_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    b->map_mask = cap - 1;
    size_t count = n ? n : 1;
    b->blob = cv_malloc(blob_len ? blob_len : 1);
    b->off = cv_malloc(sizeof(uint32_t) * count);
    b->len = cv_malloc(sizeof(uint32_t) * count);
    b->split = cv_malloc(sizeof(uint32_t) * count);
    b->map = cv_malloc(sizeof(int32_t) * cap);
    if (!b->blob || !b->off || !b->len || !b->split || !b->map) {
        cv_bpe_free(b);
        return cv_errf(err, errlen, "%s: out of memory loading %u merges", f->name, n);
    }
    memset(b->map, 0xff, sizeof(int32_t) * cap);

    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        gguf_str s = merges->arr_strs[i];
        const char *space = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        /* No separator or an empty right side: a pair no text can form. */
        b->off[i] = at;
        b->len[i] = 0;
        b->split[i] = 0;
        if (!space || (uint64_t)(space - s.ptr) + 1 == s.len)
            continue;
        uint32_t left = (uint32_t)(space - s.ptr), right = (uint32_t)s.len - left - 1;
        memcpy(b->blob + at, s.ptr, left);
        memcpy(b->blob + at + left, space + 1, right);
        b->len[i] = left + right;
        b->split[i] = left;
        at += left + right;
        if (merge_rank(b, b->blob + b->off[i], b->len[i], left) >= 0)
            continue; /* a repeated pair keeps its first rank */
        uint32_t slot = (uint32_t)hash_span(b->blob + b->off[i], b->len[i], left) & b->map_mask;
        while (b->map[slot] >= 0)
            slot = (slot + 1) & b->map_mask;
        b->map[slot] = (int32_t)i;
    }
    b->n_merges = n;
    *out = b;
    return 0;
}

void cv_bpe_free(cv_bpe *b)
{
    if (!b)
        return;
    cv_free(b->blob);
    cv_free(b->off);
    cv_free(b->len);
    cv_free(b->split);
    cv_free(b->map);
    cv_free(b);
}

bool cv_bpe_adds_bos(const cv_bpe *b)
{
    return b->pre == BPE_PRE_LLAMA3;
}

/* ---- pre-tokenizer ---- */

/* Code points of the fragment with their classes (unicode.h). */
typedef struct text_cps {
    const uint32_t *cp;
    const uint8_t *cls;
    size_t n;
} text_cps;

static bool is_letter(const text_cps *t, size_t i)
{
    return i < t->n && (t->cls[i] & CV_UC_LETTER);
}

static bool is_number(const text_cps *t, size_t i)
{
    return i < t->n && (t->cls[i] & CV_UC_NUMBER);
}

static bool is_space(const text_cps *t, size_t i)
{
    return i < t->n && (t->cls[i] & CV_UC_SPACE);
}

/* [^\s\p{L}\p{N}] */
static bool is_other(const text_cps *t, size_t i)
{
    return i < t->n && !(t->cls[i] & (CV_UC_LETTER | CV_UC_NUMBER | CV_UC_SPACE));
}

static bool is_cr_lf(const text_cps *t, size_t i)
{
    return i < t->n && (t->cp[i] == '\r' || t->cp[i] == '\n');
}

static uint32_t ascii_lower(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d at p (ASCII case-insensitive if fold): end or 0. */
static size_t match_contraction(const text_cps *t, size_t p, bool fold)
{
    if (p + 1 >= t->n || t->cp[p] != '\'')
        return 0;
    uint32_t c1 = fold ? ascii_lower(t->cp[p + 1]) : t->cp[p + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        return p + 2;
    if (p + 2 >= t->n)
        return 0;
    uint32_t c2 = fold ? ascii_lower(t->cp[p + 2]) : t->cp[p + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return p + 3;
    return 0;
}

/* \s+(?!\S)|\s+ at p (a white space code point): end of the match. The
 * first alternative backtracks to leave one white space code point before
 * a non-space, unless the run is only one long. */
static size_t match_spaces(const text_cps *t, size_t p)
{
    size_t r = p;
    while (is_space(t, r))
        r++;
    if (r < t->n && r - p >= 2)
        return r - 1;
    return r;
}

/* Start of the letters after [^\r\n\p{L}\p{N}]? at p: p or p + 1. */
static size_t skip_word_prefix(const text_cps *t, size_t p)
{
    return p + (!is_letter(t, p) && !is_number(t, p) && !is_cr_lf(t, p) && is_letter(t, p + 1));
}

/* \p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ at p:
 * the end. With slash, '/' may follow the run as CR and LF do (GPT-4o's
 * [\r\n/]*). */
static size_t next_nonword(const text_cps *t, size_t p, size_t max_digits, bool slash)
{
    size_t q;
    if (is_number(t, p)) {
        q = p + 1;
        while (q - p < max_digits && is_number(t, q))
            q++;
        return q;
    }
    q = p + (t->cp[p] == ' ' && is_other(t, p + 1));
    if (is_other(t, q)) {
        while (is_other(t, q))
            q++;
        while (is_cr_lf(t, q) || (slash && q < t->n && t->cp[q] == '/'))
            q++;
        return q;
    }
    /* \s*[\r\n]+: through the last CR or LF of the white space run */
    size_t last_crlf = 0;
    for (q = p; is_space(t, q); q++)
        if (is_cr_lf(t, q))
            last_crlf = q + 1;
    if (last_crlf)
        return last_crlf;
    return match_spaces(t, p);
}

/* End of the pre-token starting at p, Llama 3 / Qwen2 regex. */
static size_t next_llama3(const text_cps *t, size_t p, size_t max_digits)
{
    size_t q = match_contraction(t, p, true);
    if (q)
        return q;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    q = skip_word_prefix(t, p);
    if (is_letter(t, q)) {
        while (is_letter(t, q))
            q++;
        return q;
    }
    return next_nonword(t, p, max_digits, false);
}

/* GPT-4o's U and W as llama.cpp reads them (design comment). */
static bool is_upper(const text_cps *t, size_t i)
{
    return is_letter(t, i) && !(t->cp[i] >= 'a' && t->cp[i] <= 'z');
}

static bool is_lower(const text_cps *t, size_t i)
{
    return is_letter(t, i) && !(t->cp[i] >= 'A' && t->cp[i] <= 'Z');
}

/* [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C? at p: end or 0. The
 * first alternative takes the U run and the W run after it; when no W
 * follows, U* gives back letters up to the last one that is also W (a
 * non-ASCII letter), which W+ then takes alone. With no such letter the
 * second alternative takes the whole U run. */
static size_t match_cased_word(const text_cps *t, size_t p)
{
    size_t q = skip_word_prefix(t, p);
    if (!is_letter(t, q))
        return 0;
    size_t end = q;
    while (is_upper(t, end))
        end++;
    if (is_lower(t, end)) {
        while (is_lower(t, end))
            end++;
    } else {
        for (size_t k = end; k > q; k--)
            if (is_lower(t, k - 1)) {
                end = k;
                break;
            }
    }
    size_t c = match_contraction(t, end, true);
    return c ? c : end;
}

/* End of the pre-token starting at p, GPT-4o (o200k) regex. */
static size_t next_gpt4o(const text_cps *t, size_t p)
{
    size_t q = match_cased_word(t, p);
    return q ? q : next_nonword(t, p, 3, true);
}

/* End of the pre-token starting at p, GPT-2 regex. */
static size_t next_gpt2(const text_cps *t, size_t p)
{
    size_t q = match_contraction(t, p, false);
    if (q)
        return q;
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the space joins a run
     * of the class that follows it. */
    q = p + (t->cp[p] == ' ' && p + 1 < t->n);
    bool (*same)(const text_cps *, size_t) =
        is_letter(t, q) ? is_letter : is_number(t, q) ? is_number : is_other(t, q) ? is_other : NULL;
    if (same) {
        while (same(t, q))
            q++;
        return q;
    }
    return match_spaces(t, p);
}

/* End of the pre-token starting at p (< t->n) in the split of pre. */
static size_t next_pretoken(bpe_pre pre, const text_cps *t, size_t p)
{
    switch (pre) {
    case BPE_PRE_GPT2:
        return next_gpt2(t, p);
    case BPE_PRE_LLAMA3:
        return next_llama3(t, p, 3);
    case BPE_PRE_QWEN2:
        return next_llama3(t, p, 1);
    case BPE_PRE_GPT4O:
        return next_gpt4o(t, p);
    }
    return t->n;
}

/* ---- BPE over one pre-token ---- */

typedef struct symbol {
    int32_t prev, next;
    uint32_t off, n; /* bytes of the mapped text; n == 0 once merged away */
} symbol;

typedef struct pair {
    int32_t rank, left, right;
    uint32_t size;
} pair;

typedef struct scratch {
    char *text; /* mapped pre-token */
    size_t text_cap;
    symbol *sym;
    size_t sym_cap;
    cv_heap heap; /* of pair */
    const cv_bpe_lookup *tokens;
    int32_t **ids;
    size_t *n_ids, *ids_cap;
    bool oom;
} scratch;

static bool reserve(void **p, size_t *cap, size_t need, size_t elem, bool *oom)
{
    if (!cv_reserve(p, cap, need, elem))
        *oom = true;
    return !*oom;
}

static void emit(scratch *s, int32_t id)
{
    if (reserve((void **)s->ids, s->ids_cap, *s->n_ids + 1, sizeof(int32_t), &s->oom))
        (*s->ids)[(*s->n_ids)++] = id;
}

/* a comes out of the heap before b: lower rank, then the leftmost pair. */
static bool pair_before(const void *a, const void *b)
{
    const pair *x = a, *y = b;
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static void push_pair(const cv_bpe *b, scratch *s, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return;
    const symbol *l = &s->sym[left], *r = &s->sym[right];
    int32_t rank = merge_rank(b, s->text + l->off, l->n + r->n, l->n);
    if (rank >= 0)
        if (!cv_heap_push(&s->heap, &(pair){rank, left, right, l->n + r->n}))
            s->oom = true;
}

static int32_t token_id(const scratch *s, const char *text, size_t n)
{
    return s->tokens->token_id(s->tokens->ctx, text, n);
}

static void emit_symbol(scratch *s, const char *text, uint32_t n)
{
    int32_t id = token_id(s, text, n);
    if (id >= 0) {
        emit(s, id);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        id = token_id(s, text + i, 1);
        if (id >= 0)
            emit(s, id);
    }
}

/* Steps 3-5 of the design comment for the code points cp[0..n). */
static void bpe_word(const cv_bpe *b, scratch *s, const uint32_t *cp, size_t n)
{
    if (!reserve((void **)&s->text, &s->text_cap, 8 * n, 1, &s->oom) ||
        !reserve((void **)&s->sym, &s->sym_cap, 4 * n, sizeof(symbol), &s->oom))
        return;
    uint32_t len = 0;
    int32_t n_sym = 0;
    for (size_t i = 0; i < n; i++) {
        char utf8[4];
        size_t k = cv_utf8_encode(cp[i], utf8);
        for (size_t j = 0; j < k; j++) {
            uint32_t m = (uint32_t)cv_utf8_encode(byte_to_cp((uint8_t)utf8[j]), s->text + len);
            s->sym[n_sym] = (symbol){n_sym - 1, n_sym + 1, len, m};
            len += m;
            n_sym++;
        }
    }
    s->sym[n_sym - 1].next = -1;

    if (b->ignore_merges) {
        int32_t id = token_id(s, s->text, len);
        if (id >= 0) {
            emit(s, id);
            return;
        }
    }
    s->heap.n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        push_pair(b, s, i - 1, i);
    while (s->heap.n > 0 && !s->oom) {
        pair p;
        cv_heap_pop(&s->heap, &p);
        symbol *l = &s->sym[p.left], *r = &s->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->sym[r->next].prev = p.left;
        push_pair(b, s, l->prev, p.left);
        push_pair(b, s, p.left, l->next);
    }
    for (int32_t i = 0; i >= 0 && !s->oom; i = s->sym[i].next)
        emit_symbol(s, s->text + s->sym[i].off, s->sym[i].n);
}

int cv_bpe_tokenize(const cv_bpe *b, const cv_bpe_lookup *tokens, const char *text, size_t len, int32_t **ids,
                    size_t *n_ids, size_t *cap)
{
    if (len == 0)
        return 0;
    uint32_t *cp = cv_malloc(sizeof(uint32_t) * len);
    uint8_t *cls = cv_malloc(len);
    scratch s = {.heap = {.elem = sizeof(pair), .before = pair_before}, .tokens = tokens, .ids = ids, .n_ids = n_ids,
                 .ids_cap = cap};
    if (!cp || !cls) {
        cv_free(cp);
        cv_free(cls);
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; n++) {
        size_t k;
        cp[n] = cv_utf8_decode((const uint8_t *)text + i, len - i, &k);
        cls[n] = (uint8_t)cv_unicode_class(cp[n]);
        i += k;
    }
    text_cps t = {cp, cls, n};
    for (size_t p = 0; p < n && !s.oom;) {
        size_t end = next_pretoken(b->pre, &t, p);
        bpe_word(b, &s, cp + p, end - p);
        p = end;
    }
    cv_free(cp);
    cv_free(cls);
    cv_free(s.text);
    cv_free(s.sym);
    cv_heap_free(&s.heap);
    return s.oom ? -1 : 0;
}
