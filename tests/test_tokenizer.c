/* test_tokenizer.c: the SPM tokenizer against llama.cpp's own outputs.
 *
 * Oracles (../shared/reference, see its README): the 200 strings of
 * stories260K-tokenize.jsonl and vocab/llama-spm-tokenize.jsonl (ids with
 * and without add_special), llama.cpp's test vectors
 * ggml-vocab-llama-spm.gguf.inp/.out, and the prompt ids and generated text
 * of stories260K-greedy.jsonl. Detokenization is checked by streaming every
 * reference id list through cv_detok: each chunk must be valid UTF-8 and the
 * chunks must add up to the text (with the space prefix in front and U+2581
 * read as a space, which is what SPM pieces give). Small synthetic
 * vocabularies written with gguf_writer cover load errors, special-token
 * partitioning, add_eos and add_space_prefix = false. */
#include <jansson.h>
#include <stdint.h>

#include "core/err.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/vocab.h"
#include "test.h"
#include "tok_test.h"

/* ---- helpers ---- */

/* Loads a shared vocabulary; 0 when skipped or failed (already reported). */
static int load_shared_vocab(const char *rel, cv_vocab *v)
{
    char path[1024], err[CV_ERRLEN];
    if (!test_shared_path(path, sizeof(path), rel))
        return 0;
    gguf_file f;
    if (cv_gguf_open(&f, path, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        return 0;
    }
    int rc = cv_vocab_load(v, &f, err, sizeof(err));
    cv_gguf_close(&f); /* the vocab must not keep pointers into the file */
    CHECKF(rc == 0, "%s", err);
    return rc == 0;
}

/* Strict UTF-8 check, written independently of vocab.c's decoder. */
static bool valid_utf8(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k;
        if (p[i] < 0x80) {
            i++;
            continue;
        } else if ((p[i] & 0xE0) == 0xC0) {
            k = 2;
            cp = p[i] & 0x1F;
        } else if ((p[i] & 0xF0) == 0xE0) {
            k = 3;
            cp = p[i] & 0x0F;
        } else if ((p[i] & 0xF8) == 0xF0) {
            k = 4;
            cp = p[i] & 0x07;
        } else {
            return false;
        }
        if (i + k > n)
            return false;
        for (size_t j = 1; j < k; j++) {
            if ((p[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + j] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

typedef struct text_buf {
    char *p;
    size_t n, cap;
} text_buf;

static void buf_add(text_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Streams ids through cv_detok; every chunk must be valid UTF-8. Returns
 * the text (caller frees) and counts the pushes that held bytes back. */
static char *detok_all(const cv_vocab *v, const int32_t *ids, int n, size_t *len, int *n_held_pushes)
{
    cv_detok d;
    cv_detok_init(&d, v);
    text_buf b = {0};
    buf_add(&b, "", 0);
    char chunk[256];
    for (int i = 0; i < n; i++) {
        int k = cv_detok_push(&d, ids[i], chunk, (int)sizeof(chunk));
        CHECKF(k >= 0, "push of id %d returned %d", (int)ids[i], k);
        if (k < 0)
            break;
        CHECKF(valid_utf8(chunk, (size_t)k), "chunk after id %d (index %d) is not valid UTF-8", (int)ids[i], i);
        buf_add(&b, chunk, (size_t)k);
        if (d.n_held > 0 && n_held_pushes)
            (*n_held_pushes)++;
    }
    int k = cv_detok_flush(&d, chunk, (int)sizeof(chunk));
    CHECK(k >= 0);
    if (k > 0)
        buf_add(&b, chunk, (size_t)k);
    *len = b.n;
    return b.p;
}

/* What SPM pieces of a text tokenized with the space prefix read back as:
 * " " + text, with every U+2581 in the text read as a space. */
static char *expected_detok(const char *text, size_t len, size_t *out_len)
{
    char *e = malloc(len + 2);
    size_t o = 0;
    if (len > 0)
        e[o++] = ' ';
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
            e[o++] = ' ';
            i += 3;
        } else {
            e[o++] = text[i++];
        }
    }
    e[o] = '\0';
    *out_len = o;
    return e;
}

static void check_roundtrip(const cv_vocab *v, const char *text, size_t len, const int32_t *ids, int n,
                            int *n_held_pushes)
{
    size_t got_len, want_len;
    char *got = detok_all(v, ids, n, &got_len, n_held_pushes);
    char *want = expected_detok(text, len, &want_len);
    CHECKF(got_len == want_len && memcmp(got, want, want_len) == 0, "detok of '%s' gave '%s'", text, got);
    free(got);
    free(want);
}

/* ---- reference sets ---- */

/* One jsonl file of {"text", "ids_special", "ids_plain"}; returns the string count. */
static int run_tokenize_jsonl(const cv_vocab *v, const char *rel, const char *label)
{
    char path[1024];
    if (!test_shared_path(path, sizeof(path), rel))
        return 0;
    size_t len;
    char *data = test_read_file(path, &len);
    CHECKF(data != NULL, "cannot read %s", path);
    if (!data)
        return 0;
    int n_strings = 0, n_bad = 0, n_held_pushes = 0;
    for (char *line = data; *line;) {
        char *end = strchr(line, '\n');
        size_t line_len = end ? (size_t)(end - line) : strlen(line);
        json_error_t jerr;
        json_t *obj = json_loadb(line, line_len, 0, &jerr);
        CHECKF(obj != NULL, "%s: %s", rel, jerr.text);
        if (obj) {
            json_t *jt = json_object_get(obj, "text");
            const char *text = json_string_value(jt);
            size_t text_len = json_string_length(jt);
            CHECK(text != NULL);
            if (text) {
                int n_sp, n_pl;
                int32_t *sp = tok_tokenize(v, text, text_len, true, false, &n_sp);
                int32_t *pl = tok_tokenize(v, text, text_len, false, false, &n_pl);
                bool ok_sp = sp && ids_equal_json(sp, n_sp, json_object_get(obj, "ids_special"));
                bool ok_pl = pl && ids_equal_json(pl, n_pl, json_object_get(obj, "ids_plain"));
                CHECKF(ok_sp && ok_pl, "%s: string %d '%s' (special %s, plain %s)", label, n_strings, text,
                       ok_sp ? "ok" : "WRONG", ok_pl ? "ok" : "WRONG");
                if (!(ok_sp && ok_pl)) {
                    if (n_bad++ < 5 && pl)
                        print_ids("got plain", pl, n_pl);
                } else {
                    check_roundtrip(v, text, text_len, pl, n_pl, &n_held_pushes);
                    size_t got_len;
                    char *got = detok_all(v, sp, n_sp, &got_len, NULL); /* BOS renders as "" */
                    size_t want_len;
                    char *want = expected_detok(text, text_len, &want_len);
                    CHECK(got_len == want_len && memcmp(got, want, want_len) == 0);
                    free(got);
                    free(want);
                }
                free(sp);
                free(pl);
                n_strings++;
            }
            json_decref(obj);
        }
        line = end ? end + 1 : line + line_len;
    }
    free(data);
    fprintf(stderr, "  %s: %d strings tokenized (with and without BOS) and detokenized, %d wrong; "
            "%d detok pushes held back a split character\n", label, n_strings, n_bad, n_held_pushes);
    CHECK(n_strings > 0);
    CHECK(n_held_pushes > 0);
    return n_strings;
}

static void test_stories260k_tokenize(void)
{
    cv_vocab v;
    if (!load_shared_vocab("models/stories260K.gguf", &v))
        return;
    CHECK(v.kind == CV_VOCAB_SPM);
    CHECK(v.bos == 1 && v.eos == 2 && v.unk == 0);
    CHECK(v.add_bos && !v.add_eos && v.add_space_prefix);
    run_tokenize_jsonl(&v, "reference/stories260K-tokenize.jsonl", "stories260K");
    cv_vocab_free(&v);
}

static void test_llama_spm_tokenize(void)
{
    cv_vocab v;
    if (!load_shared_vocab("reference/vocab/ggml-vocab-llama-spm.gguf", &v))
        return;
    CHECK(v.n_vocab == 32000);
    CHECK(v.byte_token[0x0A] == 13); /* <0x0A> */
    run_tokenize_jsonl(&v, "reference/vocab/llama-spm-tokenize.jsonl", "llama-spm");
    cv_vocab_free(&v);
}

static void test_llama_spm_test_vectors(void)
{
    cv_vocab v;
    if (!load_shared_vocab("reference/vocab/ggml-vocab-llama-spm.gguf", &v))
        return;
    char inp_path[1024], out_path[1024];
    if (!test_shared_path(inp_path, sizeof(inp_path), "reference/vocab/ggml-vocab-llama-spm.gguf.inp") ||
        !test_shared_path(out_path, sizeof(out_path), "reference/vocab/ggml-vocab-llama-spm.gguf.out")) {
        cv_vocab_free(&v);
        return;
    }
    size_t inp_len = 0, out_len = 0;
    char *inp = test_read_file(inp_path, &inp_len), *out = test_read_file(out_path, &out_len);
    CHECK(inp && out);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof(sep) - 1;
    int n_strings = 0, n_bad = 0, n_held_pushes = 0;
    char *ip = inp, *op = out;
    while (inp && out && (size_t)(ip - inp) < inp_len) {
        char *s_end = (char *)memmem(ip, inp_len - (size_t)(ip - inp), sep, sep_len);
        CHECKF(s_end != NULL, "string %d has no separator", n_strings);
        if (!s_end)
            break;
        char *o_end = strchr(op, '\n');
        CHECKF(o_end != NULL, ".out has fewer lines than .inp has strings (%d)", n_strings);
        if (!o_end)
            break;
        int32_t want[512];
        int n_want = 0;
        for (char *q = op; q < o_end;) {
            char *next;
            long id = strtol(q, &next, 10);
            if (next == q)
                break;
            if (n_want < 512)
                want[n_want++] = (int32_t)id;
            q = next;
        }
        size_t len = (size_t)(s_end - ip);
        int n_got;
        int32_t *got = tok_tokenize(&v, ip, len, false, false, &n_got);
        bool ok = got && n_got == n_want && memcmp(got, want, sizeof(int32_t) * (size_t)n_want) == 0;
        CHECKF(ok, "test vector %d '%.*s'", n_strings, (int)len, ip);
        if (!ok && n_bad++ < 5 && got) {
            print_ids("got ", got, n_got);
            print_ids("want", want, n_want);
        }
        if (ok)
            check_roundtrip(&v, ip, len, got, n_got, &n_held_pushes);
        free(got);
        n_strings++;
        ip = s_end + sep_len;
        op = o_end + 1;
    }
    CHECKF(out == NULL || *op == '\0', ".out has more lines than .inp has strings");
    fprintf(stderr, "  llama-spm .inp/.out: %d test vectors, %d wrong\n", n_strings, n_bad);
    CHECK(n_strings > 0);
    free(inp);
    free(out);
    cv_vocab_free(&v);
}

static void test_greedy_prompts(void)
{
    cv_vocab v;
    if (!load_shared_vocab("models/stories260K.gguf", &v))
        return;
    char path[1024];
    if (!test_shared_path(path, sizeof(path), "reference/stories260K-greedy.jsonl")) {
        cv_vocab_free(&v);
        return;
    }
    size_t len;
    char *data = test_read_file(path, &len);
    CHECK(data != NULL);
    int n_prompts = 0, n_held_pushes = 0;
    for (char *line = data; data && *line;) {
        char *end = strchr(line, '\n');
        size_t line_len = end ? (size_t)(end - line) : strlen(line);
        json_error_t jerr;
        json_t *obj = json_loadb(line, line_len, 0, &jerr);
        CHECKF(obj != NULL, "%s", jerr.text);
        if (obj) {
            json_t *jp = json_object_get(obj, "prompt");
            const char *prompt = json_string_value(jp);
            int n;
            int32_t *ids = prompt ? tok_tokenize(&v, prompt, json_string_length(jp), true, false, &n) : NULL;
            CHECKF(ids && ids_equal_json(ids, n, json_object_get(obj, "prompt_ids")), "prompt '%s'", prompt);
            if (ids)
                check_roundtrip(&v, prompt, json_string_length(jp), ids + 1, n - 1, &n_held_pushes);
            free(ids);

            /* `text` is the plain concatenation of the generated ids' pieces. */
            json_t *gen = json_object_get(obj, "generated_ids");
            json_t *jtext = json_object_get(obj, "text");
            size_t n_gen = json_array_size(gen);
            int32_t *gids = malloc(sizeof(int32_t) * (n_gen + 1));
            text_buf pieces = {0};
            buf_add(&pieces, "", 0);
            for (size_t i = 0; i < n_gen; i++) {
                gids[i] = (int32_t)json_integer_value(json_array_get(gen, i));
                char piece[64];
                int k = cv_token_piece(&v, gids[i], false, piece, (int)sizeof(piece));
                CHECK(k >= 0);
                if (k > 0)
                    buf_add(&pieces, piece, (size_t)k);
            }
            CHECK(pieces.n == json_string_length(jtext) && memcmp(pieces.p, json_string_value(jtext), pieces.n) == 0);
            size_t got_len;
            char *got = detok_all(&v, gids, (int)n_gen, &got_len, NULL);
            CHECKF(got_len == json_string_length(jtext) && memcmp(got, json_string_value(jtext), got_len) == 0,
                   "detok of the continuation of '%s'", prompt);
            free(got);
            free(pieces.p);
            free(gids);
            json_decref(obj);
            n_prompts++;
        }
        line = end ? end + 1 : line + line_len;
    }
    fprintf(stderr, "  stories260K greedy: %d prompts, %d detok pushes held back a split character\n", n_prompts,
            n_held_pushes);
    CHECK(n_prompts > 0);
    CHECK(n_held_pushes > 0); /* "naïve" and "Zoë" are byte tokens */
    free(data);
    cv_vocab_free(&v);
}

/* ---- pieces, EOG and the detokenizer on hand-made input ---- */

static void test_pieces(void)
{
    cv_vocab v;
    if (!load_shared_vocab("models/stories260K.gguf", &v))
        return;
    char buf[64];
    CHECK(cv_token_piece(&v, v.bos, false, buf, sizeof(buf)) == 0);
    CHECK(cv_token_piece(&v, v.bos, true, buf, sizeof(buf)) == 3 && memcmp(buf, "<s>", 3) == 0);
    CHECK(cv_token_piece(&v, v.unk, false, buf, sizeof(buf)) == 0);
    CHECK(cv_token_piece(&v, v.byte_token['\n'], false, buf, sizeof(buf)) == 1 && buf[0] == '\n');
    CHECK(cv_token_piece(&v, v.byte_token[0xC3], false, buf, sizeof(buf)) == 1 && (uint8_t)buf[0] == 0xC3);
    int32_t once[4];
    int n = cv_tokenize(&v, "Once", 4, false, false, once, 4);
    CHECK(n == 1);
    int k = cv_token_piece(&v, once[0], false, buf, sizeof(buf));
    CHECK(k == 5 && memcmp(buf, " Once", 5) == 0);
    CHECK(cv_token_piece(&v, once[0], false, buf, 2) == -5);
    CHECK(cv_token_piece(&v, once[0], false, NULL, 0) == -5);
    CHECK(cv_token_piece(&v, -1, true, buf, sizeof(buf)) == 0);
    CHECK(cv_token_piece(&v, v.n_vocab, true, buf, sizeof(buf)) == 0);
    CHECK(cv_token_is_eog(&v, v.eos));
    CHECK(!cv_token_is_eog(&v, v.bos));
    CHECK(!cv_token_is_eog(&v, once[0]));
    CHECK(!cv_token_is_eog(&v, -1));
    cv_vocab_free(&v);
}

/* Pushes byte tokens and returns the concatenated output (static buffer). */
static const char *detok_bytes(const cv_vocab *v, const uint8_t *bytes, int n, bool flush, int *chunks_ok)
{
    static char all[256];
    size_t o = 0;
    cv_detok d;
    cv_detok_init(&d, v);
    *chunks_ok = 1;
    for (int i = 0; i < n; i++) {
        char chunk[64];
        int k = cv_detok_push(&d, v->byte_token[bytes[i]], chunk, (int)sizeof(chunk));
        if (k < 0 || !valid_utf8(chunk, (size_t)k))
            *chunks_ok = 0;
        if (k > 0) {
            memcpy(all + o, chunk, (size_t)k);
            o += (size_t)k;
        }
    }
    if (flush) {
        int k = cv_detok_flush(&d, all + o, 16);
        if (k > 0)
            o += (size_t)k;
    }
    all[o] = '\0';
    return all;
}

static void test_detok_invalid_utf8(void)
{
    cv_vocab v;
    if (!load_shared_vocab("models/stories260K.gguf", &v))
        return;
    int ok;
#define FFFD "\xef\xbf\xbd"
    static const uint8_t emoji[] = {0xF0, 0x9F, 0x98, 0x80};
    CHECK(strcmp(detok_bytes(&v, emoji, 4, false, &ok), "\xF0\x9F\x98\x80") == 0 && ok);
    static const uint8_t cut[] = {0xC3, 'A'};
    CHECK(strcmp(detok_bytes(&v, cut, 2, false, &ok), FFFD "A") == 0 && ok);
    static const uint8_t lone[] = {0xFF, 0x80, 'b'};
    CHECK(strcmp(detok_bytes(&v, lone, 3, false, &ok), FFFD FFFD "b") == 0 && ok);
    static const uint8_t surrogate[] = {0xED, 0xA0, 0x80};
    CHECK(strcmp(detok_bytes(&v, surrogate, 3, false, &ok), FFFD FFFD FFFD) == 0 && ok);
    static const uint8_t overlong[] = {0xE0, 0x80, 0xAF};
    CHECK(strcmp(detok_bytes(&v, overlong, 3, false, &ok), FFFD FFFD FFFD) == 0 && ok);
    static const uint8_t truncated3[] = {0xE2, 0x82, 'x'};
    CHECK(strcmp(detok_bytes(&v, truncated3, 3, false, &ok), FFFD "x") == 0 && ok);
    static const uint8_t at_end[] = {'a', 0xE2, 0x82};
    CHECK(strcmp(detok_bytes(&v, at_end, 3, false, &ok), "a") == 0 && ok);
    CHECK(strcmp(detok_bytes(&v, at_end, 3, true, &ok), "a" FFFD) == 0 && ok);

    /* A buffer too small reports the size and consumes nothing. */
    cv_detok d;
    cv_detok_init(&d, &v);
    char small[8];
    CHECK(cv_detok_push(&d, v.byte_token[0xE2], small, sizeof(small)) == 0);
    CHECK(cv_detok_push(&d, v.byte_token[0x82], small, sizeof(small)) == 0);
    CHECK(cv_detok_push(&d, v.byte_token[0xAC], small, 2) == -3);
    CHECK(cv_detok_push(&d, v.byte_token[0xAC], small, 3) == 3 && memcmp(small, "\xe2\x82\xac", 3) == 0);
    CHECK(d.n_held == 0);
    CHECK(cv_detok_flush(&d, small, sizeof(small)) == 0);
    cv_vocab_free(&v);
#undef FFFD
}

/* ---- synthetic vocabularies (load errors, special tokens, flags) ---- */

typedef struct synth {
    const char *model;        /* NULL: no tokenizer.ggml.model key */
    const char *const *tokens;
    int n_tokens;
    const float *scores;
    int n_scores;
    const int32_t *types;
    int n_types;
    int add_eos;              /* -1: key absent */
    int add_space_prefix;     /* -1: key absent */
    int64_t eos_id;           /* -1: key absent */
} synth;

static int load_synth(const synth *s, cv_vocab *v, char *err, size_t errlen)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/test_tokenizer_synth_%d.gguf", CONVOY_BINARY_DIR, (int)getpid());
    gguf_writer *w = cv_gguf_writer_create();
    if (s->model)
        cv_gguf_set_str(w, "tokenizer.ggml.model", s->model);
    if (s->tokens)
        cv_gguf_set_arr_str(w, "tokenizer.ggml.tokens", s->tokens, (uint64_t)s->n_tokens);
    if (s->scores)
        cv_gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, s->scores, (uint64_t)s->n_scores);
    if (s->types)
        cv_gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, s->types, (uint64_t)s->n_types);
    if (s->add_eos >= 0)
        cv_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", s->add_eos != 0);
    if (s->add_space_prefix >= 0)
        cv_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", s->add_space_prefix != 0);
    if (s->eos_id >= 0)
        cv_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s->eos_id);
    return tok_load_written(w, path, v, err, errlen);
}

/* ids 0-2 specials, then "a" "b" "ab" "▁" "▁a", two user-defined tokens and
 * a single byte token (<0x63>, 'c'). */
static const char *const synth_tokens[] = {
    "<unk>", "<s>", "</s>", "a", "b", "ab", "\xe2\x96\x81", "\342\226\201a", "<|im_end|>", "<tag>", "<0x63>",
};
static const float synth_scores[] = {0, 0, 0, -1, -1, -2, -1, -3, 0, 0, 0};
static const int32_t synth_types[] = {
    CV_TOKEN_UNKNOWN, CV_TOKEN_CONTROL, CV_TOKEN_CONTROL, CV_TOKEN_NORMAL, CV_TOKEN_NORMAL, CV_TOKEN_NORMAL,
    CV_TOKEN_NORMAL, CV_TOKEN_NORMAL, CV_TOKEN_USER_DEFINED, CV_TOKEN_USER_DEFINED, CV_TOKEN_BYTE,
};
#define N_SYNTH ((int)(sizeof(synth_tokens) / sizeof(synth_tokens[0])))

static synth synth_default(void)
{
    synth s = {"llama", synth_tokens, N_SYNTH, synth_scores, N_SYNTH, synth_types, N_SYNTH, -1, -1, -1};
    return s;
}

static void expect_load_error(const synth *s, const char *needle)
{
    cv_vocab v;
    char err[CV_ERRLEN] = "";
    int rc = load_synth(s, &v, err, sizeof(err));
    CHECKF(rc == -1 && strstr(err, needle) != NULL, "expected an error containing '%s', got rc %d '%s'", needle,
           rc, err);
    if (rc == 0)
        cv_vocab_free(&v);
}

static void test_load_errors(void)
{
    synth s = synth_default();
    s.model = "gpt2";
    expect_load_error(&s, "tokenizer.ggml.merges");
    s.model = "bert";
    expect_load_error(&s, "'bert'");
    s.model = NULL;
    expect_load_error(&s, "tokenizer.ggml.model");
    s = synth_default();
    s.tokens = NULL;
    expect_load_error(&s, "tokenizer.ggml.tokens");
    s = synth_default();
    s.n_scores = N_SYNTH - 1;
    expect_load_error(&s, "tokenizer.ggml.scores");
    s = synth_default();
    s.n_types = N_SYNTH - 2;
    expect_load_error(&s, "tokenizer.ggml.token_type");
    static const char *const dup[] = {"<unk>", "<s>", "</s>", "a", "a"};
    s = synth_default();
    s.tokens = dup;
    s.n_tokens = s.n_scores = s.n_types = 5;
    expect_load_error(&s, "same text");
    static const int32_t bad_byte[] = {2, 3, 3, CV_TOKEN_BYTE, 1};
    static const char *const five[] = {"<unk>", "<s>", "</s>", "a", "b"};
    s.tokens = five;
    s.types = bad_byte;
    expect_load_error(&s, "BYTE");
}

static int synth_tokenize(const cv_vocab *v, const char *text, bool add_special, bool parse_special, int32_t *ids)
{
    return cv_tokenize(v, text, strlen(text), add_special, parse_special, ids, 32);
}

static void test_synthetic_vocab(void)
{
    synth s = synth_default();
    cv_vocab v;
    char err[CV_ERRLEN];
    if (load_synth(&s, &v, err, sizeof(err)) != 0)
        return;
    int32_t ids[32];
    int n;
    /* "▁ab": the pair "ab" (score -2) beats "▁a" (-3), and "▁ab" is no token. */
    n = synth_tokenize(&v, "ab", false, false, ids);
    CHECK(n == 2 && ids[0] == 6 && ids[1] == 5);
    n = synth_tokenize(&v, "a", true, false, ids);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 7);
    /* Byte fallback: 'c' via <0x63>; 'd' has neither a byte token nor a text token: UNK. */
    n = synth_tokenize(&v, "cd", false, false, ids);
    CHECK(n == 3 && ids[0] == 6 && ids[1] == 10 && ids[2] == 0);
    /* User-defined tokens split the text even without parse_special; the
     * fragment after one gets the space prefix again. */
    n = synth_tokenize(&v, "a<tag>a", false, false, ids);
    CHECK(n == 3 && ids[0] == 7 && ids[1] == 9 && ids[2] == 7);
    /* Control tokens only with parse_special. "<|im_end|>" is user-defined in
     * the file but an end-of-generation text, so it became CONTROL. */
    CHECK(v.type[8] == CV_TOKEN_CONTROL);
    CHECK(cv_token_is_eog(&v, 8) && v.eot == 8);
    n = synth_tokenize(&v, "<s>a", false, true, ids);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 7);
    n = synth_tokenize(&v, "<s>", false, false, ids);
    CHECK(n > 1 && ids[0] == 6);
    n = synth_tokenize(&v, "a<|im_end|>", false, true, ids);
    CHECK(n == 2 && ids[0] == 7 && ids[1] == 8);
    /* Empty text: BOS alone, or nothing. */
    CHECK(synth_tokenize(&v, "", true, false, ids) == 1 && ids[0] == 1);
    CHECK(synth_tokenize(&v, "", false, false, ids) == 0);
    cv_vocab_free(&v);

    s.add_eos = 1;
    s.add_space_prefix = 0;
    s.eos_id = 4; /* "b" */
    if (load_synth(&s, &v, err, sizeof(err)) != 0)
        return;
    CHECK(v.eos == 4 && v.add_eos && !v.add_space_prefix);
    CHECK(cv_token_is_eog(&v, 4) && !cv_token_is_eog(&v, 2));
    n = synth_tokenize(&v, "a", true, false, ids);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 3 && ids[2] == 4);
    CHECK(synth_tokenize(&v, "", true, false, ids) == 2);
    cv_vocab_free(&v);

    s = synth_default();
    s.eos_id = N_SYNTH; /* outside the vocabulary: ignored, the default stays */
    if (load_synth(&s, &v, err, sizeof(err)) != 0)
        return;
    CHECK(v.eos == 2);
    cv_vocab_free(&v);
}

int main(void)
{
    TEST_RUN(test_stories260k_tokenize);
    TEST_RUN(test_llama_spm_tokenize);
    TEST_RUN(test_llama_spm_test_vectors);
    TEST_RUN(test_greedy_prompts);
    TEST_RUN(test_pieces);
    TEST_RUN(test_detok_invalid_utf8);
    TEST_RUN(test_load_errors);
    TEST_RUN(test_synthetic_vocab);
    return test_summary();
}
