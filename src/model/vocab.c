/* vocab.c: the vocabulary and its tokenizers, as llama.cpp runs them:
 * SentencePiece ("llama", below) and byte-level BPE ("gpt2", whose merges
 * and pre-tokenizer live in bpe.c; see "BPE" at the end of this comment).
 * This file is the loader and front end: it calls bpe.c, which never calls
 * back; BPE finds token ids through the cv_bpe_lookup given to it.
 *
 * Load: cv_vocab_load runs one function per phase, in this order:
 * 1. read_model_kind: tokenizer.ggml.model, "llama" (SPM) or "gpt2" (BPE).
 * 2. find_token_arrays: the token list, its scores and token types (both
 *    optional), checked against the token count, and the text blob's size.
 * 3. alloc_tokens, read_tokens: tokenizer.ggml.tokens copied into one text
 *    blob (an empty token becomes "[EMPTY_<id>]", as in llama.cpp; two
 *    tokens with the same text are an error) and entered in the private
 *    index's open-addressing hash map from token text to id; scores and
 *    types default to 0.0 / NORMAL, unknown type values become UNDEFINED.
 *    find_byte_tokens notes the <0xXX> token of every byte.
 * 4. set_defaults: llama.cpp's special ids and flags (SPM: BOS 1, EOS 2,
 *    UNK 0; BPE: see below, after its merges are loaded). Then
 *    cv_vocab_read_special_keys (vocab_special.c, like every finder of
 *    special tokens) reads the special ids (a key whose id lies outside
 *    the vocabulary is ignored, as llama.cpp does, so the default stays)
 *    and the add_* flags.
 * 5. cv_vocab_find_eog_by_text: like llama.cpp, it finds an EOT / EOM token
 *    by its text when the GGUF names none ("<|eot_id|>", "<|im_end|>", ...),
 *    and forces every end-of-generation token found by text to CONTROL type;
 *    cv_vocab_find_fim_tokens finds the FIM tokens.
 * 6. build_tables: the rest of the index, once types are final: the
 *    rendered piece of every token (what cv_token_piece gives with special
 *    = true), the list of "special" tokens (CONTROL, USER_DEFINED, UNKNOWN)
 *    ordered longest text first (ties: lower id first) and the
 *    end-of-generation ids.
 *
 * Tokenize (llama.cpp's tokenize_impl for SPM):
 * 1. Partition the text on special tokens, in the order above: every
 *    occurrence (leftmost first, non-overlapping) of a special token's text
 *    in a still-raw fragment becomes that token. With parse_special false
 *    only USER_DEFINED tokens take part, so "<s>" stays plain text.
 * 2. BOS first when add_special and add_bos. Each raw fragment gets a ' '
 *    in front when add_space_prefix and it is the first fragment or follows
 *    a special token; then every ' ' becomes U+2581.
 * 3. The fragment is split into UTF-8 characters (length from the lead
 *    byte alone, cut at the end of the text). Adjacent pairs whose
 *    concatenation is a token go into a max-heap by that token's score,
 *    ties to the leftmost pair. The best pair is merged, stale pairs (one
 *    side already merged away or grown) are skipped, and the new symbol's
 *    pairs with its neighbours are pushed, until the heap is empty.
 * 4. Each final symbol is its token; a merged symbol always is one, a single
 *    character not in the vocabulary becomes one byte token per byte
 *    (<0xXX>, else the token whose text is that byte, else UNK). This is
 *    what llama.cpp's resegment does: its reverse-merge path can only apply
 *    to symbols that are not tokens, and merged symbols always are.
 * 5. EOS last when add_special and add_eos. The empty text gives only
 *    BOS/EOS (so [] without add_special), as in llama.cpp.
 *
 * Pieces: NORMAL tokens with U+2581 turned back into ' ', BYTE tokens as
 * their byte, CONTROL / UNKNOWN / USER_DEFINED as their text (the first
 * two only when `special`), UNUSED / UNDEFINED as "".
 *
 * Detok: cv_detok_push appends the piece (special = false) to the bytes held
 * back from earlier tokens and emits every complete UTF-8 character; a
 * valid but unfinished character at the end (at most 3 bytes) is held. Each
 * maximal ill-formed subpart (Unicode's "substitution of maximal subparts")
 * becomes U+FFFD. It is a plain concatenation of pieces: unlike
 * llama_detokenize it does not drop the leading space that the space prefix
 * put on the first piece, so that a stream of generated ids reads exactly
 * as llama.cpp prints it token by token.
 *
 * BPE ("gpt2"): loading also reads the merges and tokenizer.ggml.pre
 * (cv_bpe_load, in set_defaults); the defaults are llama.cpp's for BPE:
 * BOS = EOS = 11 (when the vocabulary is that large), no UNK, no EOS
 * added, BOS added only for the Llama 3 pre-tokenizer, no space prefix (the
 * key is read but BPE ignores it, as llama.cpp does). Step 1 (special
 * tokens) and BOS/EOS are as for SPM; each raw fragment goes to
 * cv_bpe_tokenize. Pieces: NORMAL tokens are byte-decoded
 * (cv_bpe_decode_text), USER_DEFINED / CONTROL / UNKNOWN as for SPM, every
 * other type (BYTE included) as "".
 *
 * Not done (llama.cpp applies these by model name or for other vocab
 * types): the lstrip/rstrip attributes of Phi-3 and Jina special tokens,
 * FIM tokens as end of generation. Ownership: the vocab owns every array
 * it points to; cv_vocab_free releases them. */
#include "model/vocab.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/heap.h"
#include "core/err.h"
#include "model/bpe.h"
#include "model/vocab_special.h"

struct cv_vocab_index {
    uint32_t map_mask;   /* capacity - 1 (capacity a power of two) */
    int32_t *map;        /* token id per slot, -1 when empty */
    char *text_blob;     /* all token texts, each NUL-terminated */
    char *piece_blob;    /* all rendered pieces, back to back */
    uint32_t *piece_off;
    uint32_t *piece_len;
    int32_t *special;    /* CONTROL / USER_DEFINED / UNKNOWN ids, longest text first */
    int32_t n_special;
    int32_t *eog;        /* end-of-generation ids */
    int32_t n_eog;
    cv_bpe *bpe;         /* merges and pre-tokenizer (BPE only) */
};

#define SPACE_ESCAPE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
#define TOKENIZE_MAX_BYTES (1u << 28)

/* ---- hash map from token text to id ---- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int32_t text_to_token(const cv_vocab *v, const char *s, size_t n)
{
    const cv_vocab_index *ix = v->index;
    uint32_t slot = (uint32_t)hash_bytes(s, n) & ix->map_mask;
    for (;;) {
        int32_t id = ix->map[slot];
        if (id < 0)
            return -1;
        if (v->text_len[id] == n && memcmp(v->text[id], s, n) == 0)
            return id;
        slot = (slot + 1) & ix->map_mask;
    }
}

int32_t cv_token_from_text(const cv_vocab *v, const char *text, size_t len)
{
    return text_to_token(v, text, len);
}

/* The lookup BPE tokenizes with (bpe.h): ctx is the cv_vocab. */
static int32_t bpe_token_id(const void *ctx, const char *text, size_t len)
{
    return text_to_token(ctx, text, len);
}

/* Inserts id; returns the id already holding the same text, or -1. */
static int32_t map_insert(cv_vocab *v, int32_t id)
{
    cv_vocab_index *ix = v->index;
    uint32_t slot = (uint32_t)hash_bytes(v->text[id], v->text_len[id]) & ix->map_mask;
    for (;;) {
        int32_t other = ix->map[slot];
        if (other < 0) {
            ix->map[slot] = id;
            return -1;
        }
        if (v->text_len[other] == v->text_len[id] && memcmp(v->text[other], v->text[id], v->text_len[id]) == 0)
            return other;
        slot = (slot + 1) & ix->map_mask;
    }
}

/* ---- loading ---- */

/* Finds the array key `key` of n_vocab numeric elements; NULL if absent. */
static int find_numeric_array(const gguf_file *f, const char *key, int32_t n_vocab, bool integer,
                              const gguf_kv **out, char *err, size_t errlen)
{
    const gguf_kv *kv = cv_gguf_find_kv(f, key);
    *out = NULL;
    if (!kv)
        return 0;
    if (kv->type != GGUF_ARRAY)
        return cv_errf(err, errlen, "%s: %s is not an array", f->name, key);
    bool is_int = kv->arr_type <= GGUF_INT32 || kv->arr_type == GGUF_UINT64 || kv->arr_type == GGUF_INT64;
    bool is_float = kv->arr_type == GGUF_FLOAT32 || kv->arr_type == GGUF_FLOAT64;
    if (!is_int && (integer || !is_float))
        return cv_errf(err, errlen, "%s: %s has elements of type %u, expected %s", f->name, key,
                       (unsigned)kv->arr_type, integer ? "integers" : "numbers");
    if (kv->arr_n != (uint64_t)n_vocab)
        return cv_errf(err, errlen, "%s: %s has %llu elements but there are %d tokens", f->name, key,
                       (unsigned long long)kv->arr_n, (int)n_vocab);
    *out = kv;
    return 0;
}

static int32_t normalize_type(int64_t t)
{
    return t >= CV_TOKEN_UNDEFINED && t <= CV_TOKEN_BYTE ? (int32_t)t : CV_TOKEN_UNDEFINED;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xXX>" text, or -1. */
static int byte_token_value(const char *s, uint32_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Writes the special = true piece of token id into dst (NULL: just measure). */
static uint32_t render_piece(const cv_vocab *v, int32_t id, char *dst)
{
    const char *s = v->text[id];
    uint32_t n = v->text_len[id];
    switch (v->type[id]) {
    case CV_TOKEN_CONTROL:
    case CV_TOKEN_UNKNOWN:
    case CV_TOKEN_USER_DEFINED:
        if (dst)
            memcpy(dst, s, n);
        return n;
    case CV_TOKEN_NORMAL: {
        if (v->kind == CV_VOCAB_BPE)
            return cv_bpe_decode_text(s, n, dst);
        uint32_t out = 0;
        for (uint32_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, SPACE_ESCAPE, 3) == 0) {
                if (dst)
                    dst[out] = ' ';
                out++;
                i += 3;
            } else {
                if (dst)
                    dst[out] = s[i];
                out++;
                i++;
            }
        }
        return out;
    }
    case CV_TOKEN_BYTE:
        if (v->kind == CV_VOCAB_BPE)
            return 0;
        if (dst)
            dst[0] = (char)byte_token_value(s, n);
        return 1;
    default:
        return 0;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool is_special_type(int32_t t)
{
    return t == CV_TOKEN_CONTROL || t == CV_TOKEN_USER_DEFINED || t == CV_TOKEN_UNKNOWN;
}

/* Builds the pieces, the special list and the EOG set (after types are final). */
static int build_tables(cv_vocab *v, int32_t eom, char *err, size_t errlen)
{
    cv_vocab_index *ix = v->index;
    int32_t n = v->n_vocab;
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += render_piece(v, i, NULL);
    if (total > UINT32_MAX)
        return cv_errf(err, errlen, "vocabulary pieces total %llu bytes, too many", (unsigned long long)total);
    ix->piece_blob = cv_malloc(total);
    ix->piece_off = cv_malloc(sizeof(uint32_t) * (size_t)n);
    ix->piece_len = cv_malloc(sizeof(uint32_t) * (size_t)n);
    ix->special = cv_malloc(sizeof(int32_t) * (size_t)n);
    ix->eog = cv_malloc(sizeof(int32_t) * CV_VOCAB_EOG_MAX);
    if (!ix->piece_blob || !ix->piece_off || !ix->piece_len || !ix->special || !ix->eog)
        return cv_errf(err, errlen, "out of memory building the vocabulary index (%d tokens)", (int)n);
    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        ix->piece_off[i] = off;
        ix->piece_len[i] = render_piece(v, i, ix->piece_blob + off);
        off += ix->piece_len[i];
        if (is_special_type(v->type[i]))
            ix->special[ix->n_special++] = i;
    }
    /* Longest text first, then lower id: sort keys (UINT32_MAX - len) << 32 | id. */
    uint64_t *keys = cv_malloc(sizeof(uint64_t) * (size_t)(ix->n_special ? ix->n_special : 1));
    if (!keys)
        return cv_errf(err, errlen, "out of memory sorting %d special tokens", (int)ix->n_special);
    for (int32_t i = 0; i < ix->n_special; i++)
        keys[i] = (uint64_t)(UINT32_MAX - v->text_len[ix->special[i]]) << 32 | (uint32_t)ix->special[i];
    qsort(keys, (size_t)ix->n_special, sizeof(uint64_t), cmp_u64);
    for (int32_t i = 0; i < ix->n_special; i++)
        ix->special[i] = (int32_t)(keys[i] & 0xffffffffu);
    cv_free(keys);

    ix->n_eog = cv_vocab_eog_ids(v, eom, ix->eog);
    return 0;
}

/* Reads tokenizer.ggml.model: which tokenizer runs (SPM or BPE). */
static int read_model_kind(cv_vocab *v, const gguf_file *f, char *err, size_t errlen)
{
    gguf_str model;
    if (!cv_gguf_find_kv(f, "tokenizer.ggml.model"))
        return cv_errf(err, errlen, "%s: no tokenizer (tokenizer.ggml.model is missing)", f->name);
    if (cv_gguf_get_str(f, "tokenizer.ggml.model", &model, err, errlen) != 0)
        return -1;
    if (cv_gguf_str_eq(model, "llama"))
        v->kind = CV_VOCAB_SPM;
    else if (cv_gguf_str_eq(model, "gpt2"))
        v->kind = CV_VOCAB_BPE;
    else
        return cv_errf(err, errlen, "%s: unknown tokenizer model '%.*s' (supported: 'llama', 'gpt2')", f->name,
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);
    return 0;
}

/* The per-token arrays of the GGUF, checked against each other before
 * anything is allocated. */
typedef struct token_arrays {
    const gguf_kv *tokens;
    const gguf_kv *scores, *types; /* NULL when absent */
    int32_t n;
    uint64_t blob_len;             /* bytes of the text blob, NULs and "[EMPTY_<id>]" texts included */
} token_arrays;

/* Finds the token list, the scores and the types, and sizes the text blob. */
static int find_token_arrays(const gguf_file *f, token_arrays *a, char *err, size_t errlen)
{
    const gguf_kv *tokens = cv_gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!tokens)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.tokens is missing", f->name);
    if (tokens->type != GGUF_ARRAY || tokens->arr_type != GGUF_STRING)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.tokens is not an array of strings", f->name);
    if (tokens->arr_n == 0 || tokens->arr_n > INT32_MAX / 2)
        return cv_errf(err, errlen, "%s: tokenizer.ggml.tokens has %llu tokens", f->name,
                       (unsigned long long)tokens->arr_n);
    a->tokens = tokens;
    a->n = (int32_t)tokens->arr_n;
    if (find_numeric_array(f, "tokenizer.ggml.scores", a->n, false, &a->scores, err, errlen) != 0 ||
        find_numeric_array(f, "tokenizer.ggml.token_type", a->n, true, &a->types, err, errlen) != 0)
        return -1;

    a->blob_len = 0;
    for (int32_t i = 0; i < a->n; i++) {
        uint64_t len = tokens->arr_strs[i].len;
        if (len > UINT32_MAX / 2)
            return cv_errf(err, errlen, "%s: token %d is %llu bytes long", f->name, (int)i, (unsigned long long)len);
        a->blob_len += (len ? len : 24) + 1;
    }
    if (a->blob_len > UINT32_MAX)
        return cv_errf(err, errlen, "%s: token texts total %llu bytes, too many", f->name,
                       (unsigned long long)a->blob_len);
    return 0;
}

/* Allocates the per-token arrays and the index with its empty map and text blob. */
static int alloc_tokens(cv_vocab *v, const gguf_file *f, const token_arrays *a, char *err, size_t errlen)
{
    int32_t n = a->n;
    v->n_vocab = n;
    v->index = cv_calloc(1, sizeof(cv_vocab_index));
    v->text = cv_malloc(sizeof(char *) * (size_t)n);
    v->text_len = cv_malloc(sizeof(uint32_t) * (size_t)n);
    v->score = cv_malloc(sizeof(float) * (size_t)n);
    v->type = cv_malloc(sizeof(int32_t) * (size_t)n);
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)n)
        cap <<= 1;
    int32_t *map = cv_malloc(sizeof(int32_t) * cap);
    char *blob = cv_malloc(a->blob_len);
    if (v->index) {
        v->index->map = map;
        v->index->map_mask = cap - 1;
        v->index->text_blob = blob;
    }
    if (!v->index || !v->text || !v->text_len || !v->score || !v->type || !map || !blob) {
        if (!v->index) { /* cv_vocab_free finds them only through the index */
            cv_free(map);
            cv_free(blob);
        }
        return cv_errf(err, errlen, "%s: out of memory loading %d tokens", f->name, (int)n);
    }
    memset(map, 0xff, sizeof(int32_t) * cap);
    return 0;
}

/* Copies every token's text into the blob with its score and type, and
 * enters it in the map; a repeated text or a BYTE token that is not
 * <0xXX> is an error. */
static int read_tokens(cv_vocab *v, const gguf_file *f, const token_arrays *a, char *err, size_t errlen)
{
    char *p = v->index->text_blob;
    for (int32_t i = 0; i < a->n; i++) {
        gguf_str s = a->tokens->arr_strs[i];
        v->text[i] = p;
        if (s.len == 0) {
            v->text_len[i] = (uint32_t)sprintf(p, "[EMPTY_%d]", (int)i);
        } else {
            memcpy(p, s.ptr, s.len);
            p[s.len] = '\0';
            v->text_len[i] = (uint32_t)s.len;
        }
        p += v->text_len[i] + 1;
        v->score[i] = a->scores ? (float)cv_gguf_arr_f64(a->scores, (uint64_t)i) : 0.0f;
        v->type[i] = a->types ? normalize_type(cv_gguf_arr_i64(a->types, (uint64_t)i)) : CV_TOKEN_NORMAL;
        int32_t dup = map_insert(v, i);
        if (dup >= 0)
            return cv_errf(err, errlen, "%s: tokens %d and %d have the same text '%.*s'", f->name, (int)dup, (int)i,
                           (int)(v->text_len[i] > 64 ? 64 : v->text_len[i]), v->text[i]);
        if (v->type[i] == CV_TOKEN_BYTE && byte_token_value(v->text[i], v->text_len[i]) < 0)
            return cv_errf(err, errlen, "%s: token %d has type BYTE but its text '%.*s' is not <0xXX>", f->name,
                           (int)i, (int)(v->text_len[i] > 64 ? 64 : v->text_len[i]), v->text[i]);
    }
    return 0;
}

/* The <0xXX> token of every byte, for SPM's byte fallback. */
static void find_byte_tokens(cv_vocab *v)
{
    for (int b = 0; b < 256; b++) {
        char hex[7];
        snprintf(hex, sizeof(hex), "<0x%02X>", b);
        v->byte_token[b] = text_to_token(v, hex, 6);
    }
}

/* llama.cpp's defaults for the special ids and flags, before the keys
 * override them; BPE's depend on the pre-tokenizer, so the merges are
 * loaded first. */
static int set_defaults(cv_vocab *v, const gguf_file *f, char *err, size_t errlen)
{
    int32_t n = v->n_vocab;
    if (v->kind == CV_VOCAB_BPE) {
        if (cv_bpe_load(&v->index->bpe, f, err, errlen) != 0)
            return -1;
        v->bos = v->eos = n > 11 ? 11 : -1;
        v->unk = -1;
        v->add_bos = cv_bpe_adds_bos(v->index->bpe);
        v->add_space_prefix = false;
    } else {
        v->bos = n > 1 ? 1 : -1;
        v->eos = n > 2 ? 2 : -1;
        v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
    }
    v->add_eos = false;
    return 0;
}

/* The phases of "Load" in the design comment, in order; any failure
 * leaves v empty. */
int cv_vocab_load(cv_vocab *v, const gguf_file *f, char *err, size_t errlen)
{
    memset(v, 0, sizeof(*v));
    v->bos = v->eos = v->unk = v->pad = v->eot = -1;
    token_arrays arrays;
    int32_t eom = -1;
    if (read_model_kind(v, f, err, errlen) != 0 ||
        find_token_arrays(f, &arrays, err, errlen) != 0 ||
        alloc_tokens(v, f, &arrays, err, errlen) != 0 ||
        read_tokens(v, f, &arrays, err, errlen) != 0)
        goto fail;
    find_byte_tokens(v);
    if (set_defaults(v, f, err, errlen) != 0 ||
        cv_vocab_read_special_keys(v, f, &eom, err, errlen) != 0)
        goto fail;
    cv_vocab_find_eog_by_text(v, &eom);
    if (cv_vocab_find_fim_tokens(v, f, err, errlen) != 0 || build_tables(v, eom, err, errlen) != 0)
        goto fail;
    return 0;
fail:
    cv_vocab_free(v);
    return -1;
}

void cv_vocab_free(cv_vocab *v)
{
    if (!v)
        return;
    if (v->index) {
        cv_vocab_index *ix = v->index;
        cv_free(ix->map);
        cv_free(ix->text_blob);
        cv_free(ix->piece_blob);
        cv_free(ix->piece_off);
        cv_free(ix->piece_len);
        cv_free(ix->special);
        cv_free(ix->eog);
        cv_bpe_free(ix->bpe);
        cv_free(ix);
    }
    cv_free(v->text);
    cv_free(v->text_len);
    cv_free(v->score);
    cv_free(v->type);
    memset(v, 0, sizeof(*v));
    v->bos = v->eos = v->unk = v->pad = v->eot = -1;
}

/* ---- tokenization ---- */

typedef struct symbol {
    int32_t prev, next;
    uint32_t off, n; /* bytes [off, off+n) of the escaped fragment; n == 0 once merged away */
} symbol;

typedef struct bigram {
    int32_t left, right;
    float score;
    uint32_t size;
} bigram;

/* Growable scratch, reused across the fragments of one cv_tokenize call. */
typedef struct session {
    char *esc;
    size_t esc_cap;
    symbol *sym;
    size_t sym_cap;
    cv_heap heap; /* of bigram */
    int32_t *ids;
    size_t n_ids, ids_cap;
    bool oom;
} session;

static bool reserve(void **p, size_t *cap, size_t need, size_t elem, bool *oom)
{
    if (!cv_reserve(p, cap, need, elem))
        *oom = true;
    return !*oom;
}

static void push_id(session *s, int32_t id)
{
    if (!reserve((void **)&s->ids, &s->ids_cap, s->n_ids + 1, sizeof(int32_t), &s->oom))
        return;
    s->ids[s->n_ids++] = id;
}

/* a ranks above b: higher score, then the leftmost pair. */
static bool bigram_above(const void *a, const void *b)
{
    const bigram *x = a, *y = b;
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void try_add_bigram(const cv_vocab *v, session *s, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return;
    uint32_t size = s->sym[left].n + s->sym[right].n;
    int32_t id = text_to_token(v, s->esc + s->sym[left].off, size);
    if (id < 0)
        return;
    bigram b = {left, right, v->score[id], size};
    if (!cv_heap_push(&s->heap, &b))
        s->oom = true;
}

static void push_byte(const cv_vocab *v, session *s, uint8_t byte)
{
    int32_t id = v->byte_token[byte];
    if (id < 0) {
        char c = (char)byte;
        id = text_to_token(v, &c, 1);
    }
    push_id(s, id >= 0 ? id : v->unk);
}

static size_t utf8_len_from_lead(uint8_t c)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* Tokenizes one raw fragment (steps 2-4 of the design comment). */
static void tokenize_fragment(const cv_vocab *v, session *s, const char *text, size_t len, bool space_prefix)
{
    size_t n_spaces = space_prefix;
    for (size_t i = 0; i < len; i++)
        n_spaces += text[i] == ' ';
    size_t esc_len = len + space_prefix + 2 * n_spaces;
    if (!reserve((void **)&s->esc, &s->esc_cap, esc_len, 1, &s->oom) ||
        !reserve((void **)&s->sym, &s->sym_cap, esc_len, sizeof(symbol), &s->oom))
        return;
    size_t e = 0;
    if (space_prefix) {
        memcpy(s->esc, SPACE_ESCAPE, 3);
        e = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->esc + e, SPACE_ESCAPE, 3);
            e += 3;
        } else {
            s->esc[e++] = text[i];
        }
    }

    int32_t n_sym = 0;
    for (size_t off = 0; off < esc_len;) {
        size_t n = utf8_len_from_lead((uint8_t)s->esc[off]);
        if (n > esc_len - off)
            n = esc_len - off;
        symbol *sym = &s->sym[n_sym];
        sym->off = (uint32_t)off;
        sym->n = (uint32_t)n;
        sym->prev = n_sym - 1;
        off += n;
        sym->next = off == esc_len ? -1 : n_sym + 1;
        n_sym++;
    }
    if (n_sym == 0)
        return;

    s->heap.n = 0;
    for (int32_t i = 1; i < n_sym; i++)
        try_add_bigram(v, s, i - 1, i);
    while (s->heap.n > 0 && !s->oom) {
        bigram b;
        cv_heap_pop(&s->heap, &b);
        symbol *l = &s->sym[b.left], *r = &s->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->sym[r->next].prev = b.left;
        try_add_bigram(v, s, l->prev, b.left);
        try_add_bigram(v, s, b.left, l->next);
    }

    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const symbol *sym = &s->sym[i];
        int32_t id = text_to_token(v, s->esc + sym->off, sym->n);
        if (id >= 0) {
            push_id(s, id);
        } else {
            for (uint32_t j = 0; j < sym->n; j++)
                push_byte(v, s, (uint8_t)s->esc[sym->off + j]);
        }
    }
}

typedef struct fragment {
    int32_t token; /* -1: raw text [off, off+len) */
    size_t off, len;
    bool plain; /* inside a plain range: only USER_DEFINED tokens are parsed */
} fragment;

static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m == 0 || m > n)
        return NULL;
    const char *end = hay + (n - m);
    for (const char *p = hay; p <= end;) {
        const char *q = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!q)
            return NULL;
        if (memcmp(q, needle, m) == 0)
            return q;
        p = q + 1;
    }
    return NULL;
}

/* The text as raw fragments, cut at the plain ranges (sorted, disjoint,
 * inside the text); SIZE_MAX when out of memory. */
static size_t initial_fragments(size_t len, const cv_text_range *plain, int n_plain, fragment **frags, size_t *cap)
{
    size_t need = 2 * (size_t)(n_plain > 0 ? n_plain : 0) + 1, n = 0, at = 0;
    fragment *f = cv_realloc(*frags, need * sizeof(fragment));
    if (!f) {
        cv_free(*frags);
        return SIZE_MAX;
    }
    for (int i = 0; i < n_plain; i++) {
        if (plain[i].off > at)
            f[n++] = (fragment){-1, at, plain[i].off - at, false};
        if (plain[i].len > 0)
            f[n++] = (fragment){-1, plain[i].off, plain[i].len, true};
        at = plain[i].off + plain[i].len;
    }
    if (len > at)
        f[n++] = (fragment){-1, at, len - at, false};
    *frags = f;
    *cap = need;
    return n;
}

/* Joins adjacent raw fragments, so that text the plain ranges cut but no
 * special token split is tokenized as one (as without them). Returns the count. */
static size_t merge_raw(fragment *f, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && f[i].token < 0 && f[m - 1].token < 0 && f[m - 1].off + f[m - 1].len == f[i].off)
            f[m - 1].len += f[i].len;
        else
            f[m++] = f[i];
    }
    return m;
}

/* Step 1: splits the text on special tokens. Returns the fragment count, or -1 when out of memory. */
static ptrdiff_t partition(const cv_vocab *v, const char *text, size_t len, bool parse_special,
                           const cv_text_range *plain, int n_plain, fragment **out)
{
    size_t cap = 1, n = 0;
    fragment *frags = cv_malloc(sizeof(fragment));
    if (!frags)
        return -1;
    n = initial_fragments(len, plain, n_plain, &frags, &cap);
    if (n == SIZE_MAX)
        return -1;
    const cv_vocab_index *ix = v->index;
    for (int32_t k = 0; k < ix->n_special; k++) {
        int32_t id = ix->special[k];
        const bool user = v->type[id] == CV_TOKEN_USER_DEFINED;
        if (!parse_special && !user)
            continue;
        const char *st = v->text[id];
        size_t sl = v->text_len[id];
        for (size_t i = 0; i < n; i++) {
            if (frags[i].token >= 0 || (frags[i].plain && !user))
                continue;
            const char *base = text + frags[i].off;
            const char *hit = find_bytes(base, frags[i].len, st, sl);
            if (!hit)
                continue;
            /* Replace fragment i by: [left] token [right], then continue on right. */
            size_t left = (size_t)(hit - base), right = frags[i].len - left - sl;
            size_t add = (left > 0) + 1 + (right > 0) - 1;
            if (n + add > cap) {
                size_t c = cap;
                while (c < n + add)
                    c *= 2;
                fragment *q = cv_realloc(frags, c * sizeof(fragment));
                if (!q) {
                    cv_free(frags);
                    return -1;
                }
                frags = q;
                cap = c;
            }
            fragment orig = frags[i];
            memmove(frags + i + 1 + add, frags + i + 1, (n - i - 1) * sizeof(fragment));
            n += add;
            size_t j = i;
            if (left > 0)
                frags[j++] = (fragment){-1, orig.off, left, orig.plain};
            frags[j] = (fragment){id, 0, 0, false};
            if (right > 0)
                frags[j + 1] = (fragment){-1, orig.off + left + sl, right, orig.plain};
            i = j; /* the loop's i++ moves onto the right part, if any */
        }
    }
    *out = frags;
    return (ptrdiff_t)merge_raw(frags, n);
}

int cv_tokenize(const cv_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                int32_t *out, int n_max)
{
    return cv_tokenize_plain(v, text, len, add_special, parse_special, NULL, 0, out, n_max);
}

int cv_tokenize_plain(const cv_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                      const cv_text_range *plain, int n_plain, int32_t *out, int n_max)
{
    if (len > TOKENIZE_MAX_BYTES)
        return INT_MIN;
    fragment *frags;
    ptrdiff_t n_frags = partition(v, text, len, parse_special, plain, n_plain, &frags);
    if (n_frags < 0)
        return INT_MIN;

    session s = {.heap = {.elem = sizeof(bigram), .before = bigram_above}};
    const cv_bpe_lookup bpe_tokens = {bpe_token_id, v};
    if (add_special && v->add_bos)
        push_id(&s, v->bos);
    bool prev_special = true;
    for (ptrdiff_t i = 0; i < n_frags && !s.oom; i++) {
        if (frags[i].token >= 0) {
            push_id(&s, frags[i].token);
            prev_special = true;
        } else if (v->kind == CV_VOCAB_BPE) {
            if (cv_bpe_tokenize(v->index->bpe, &bpe_tokens, text + frags[i].off, frags[i].len, &s.ids, &s.n_ids,
                                &s.ids_cap) != 0)
                s.oom = true;
        } else {
            tokenize_fragment(v, &s, text + frags[i].off, frags[i].len, v->add_space_prefix && prev_special);
            prev_special = false;
        }
    }
    if (add_special && v->add_eos)
        push_id(&s, v->eos);

    int result;
    if (s.oom)
        result = INT_MIN;
    else if (s.n_ids > (size_t)(n_max > 0 ? n_max : 0))
        result = -(int)s.n_ids;
    else {
        if (s.n_ids)
            memcpy(out, s.ids, s.n_ids * sizeof(int32_t));
        result = (int)s.n_ids;
    }
    cv_free(frags);
    cv_free(s.esc);
    cv_free(s.sym);
    cv_heap_free(&s.heap);
    cv_free(s.ids);
    return result;
}

/* ---- pieces ---- */

/* The piece of id (empty for ids outside the vocabulary). */
static const char *piece_of(const cv_vocab *v, int32_t id, bool special, uint32_t *len)
{
    *len = 0;
    if (id < 0 || id >= v->n_vocab)
        return "";
    if (!special && (v->type[id] == CV_TOKEN_CONTROL || v->type[id] == CV_TOKEN_UNKNOWN))
        return "";
    *len = v->index->piece_len[id];
    return v->index->piece_blob + v->index->piece_off[id];
}

int cv_token_piece(const cv_vocab *v, int32_t id, bool special, char *buf, int n)
{
    uint32_t len;
    const char *p = piece_of(v, id, special, &len);
    if (len > (uint32_t)INT_MAX)
        return INT_MIN;
    if ((int)len > n)
        return -(int)len;
    if (len)
        memcpy(buf, p, len);
    return (int)len;
}

bool cv_token_is_eog(const cv_vocab *v, int32_t id)
{
    if (id < 0)
        return false;
    for (int32_t i = 0; i < v->index->n_eog; i++)
        if (v->index->eog[i] == id)
            return true;
    return false;
}

/* ---- streaming detokenizer ---- */

void cv_detok_init(cv_detok *d, const cv_vocab *v)
{
    memset(d, 0, sizeof(*d));
    d->vocab = v;
}

enum { UTF8_VALID, UTF8_INVALID, UTF8_INCOMPLETE };

/* Classifies the sequence starting at byte 0 of s[0..n) (n >= 1) and sets
 * *adv: VALID (a whole character of *adv bytes), INVALID (a maximal
 * ill-formed subpart of *adv bytes, to become one U+FFFD) or INCOMPLETE (all
 * n bytes are a valid start of a longer character). */
static int utf8_classify(const uint8_t *s, size_t n, size_t *adv)
{
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) {
        *adv = 1;
        return UTF8_VALID;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *adv = 1;
        return UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *adv = n;
            return UTF8_INCOMPLETE;
        }
        uint8_t b = s[i];
        bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!ok) {
            *adv = i;
            return UTF8_INVALID;
        }
    }
    *adv = need;
    return UTF8_VALID;
}

/* Runs the validator over held ++ piece. With out == NULL only measures.
 * Returns the output byte count and leaves the bytes to hold in *hold_from
 * (an offset into the concatenation). */
static size_t detok_scan(const uint8_t *held, size_t n_held, const uint8_t *piece, size_t n_piece, char *out,
                         size_t *hold_from)
{
    size_t total = n_held + n_piece, pos = 0, o = 0;
    while (pos < total) {
        uint8_t bytes[4];
        size_t w = 0;
        for (; w < 4 && pos + w < total; w++)
            bytes[w] = pos + w < n_held ? held[pos + w] : piece[pos + w - n_held];
        size_t adv;
        int kind = utf8_classify(bytes, w, &adv);
        if (kind == UTF8_INCOMPLETE)
            break;
        if (kind == UTF8_VALID) {
            if (out)
                memcpy(out + o, bytes, adv);
            o += adv;
        } else {
            if (out)
                memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        pos += adv;
    }
    *hold_from = pos;
    return o;
}

int cv_detok_push(cv_detok *d, int32_t id, char *out, int n)
{
    uint32_t len;
    const uint8_t *piece = (const uint8_t *)piece_of(d->vocab, id, false, &len);
    const uint8_t *held = (const uint8_t *)d->held;
    size_t hold_from;
    size_t need = detok_scan(held, (size_t)d->n_held, piece, len, NULL, &hold_from);
    if (need > (size_t)INT_MAX)
        return INT_MIN;
    if ((int)need > n)
        return -(int)need;
    uint8_t old[sizeof(d->held)];
    size_t n_old = (size_t)d->n_held;
    memcpy(old, d->held, n_old);
    detok_scan(old, n_old, piece, len, out, &hold_from);
    size_t n_keep = n_old + len - hold_from;
    for (size_t i = 0; i < n_keep; i++) {
        size_t k = hold_from + i;
        d->held[i] = (char)(k < n_old ? old[k] : piece[k - n_old]);
    }
    d->n_held = (int)n_keep;
    return (int)need;
}

int cv_detok_flush(cv_detok *d, char *out, int n)
{
    if (d->n_held == 0)
        return 0;
    if (n < 3)
        return -3;
    memcpy(out, "\xef\xbf\xbd", 3);
    d->n_held = 0;
    return 3;
}
