/* test_chat.c: native chat-template renderings (src/chat/chat.h) against
 * the real Jinja templates.
 *
 * The main test renders a set of conversations (with and without a system
 * message, multi-turn, ending with either role, add_generation_prompt
 * true/false, Unicode, empty and whitespace-only content, special-token
 * look-alikes, Qwen3 <think> blocks, role orders the templates reject, a
 * long message) three ways (template defaults, a date_string, Qwen3's
 * enable_thinking=false) with every template: the 7 of
 * ../shared/reference/chat-templates and 3 well-known ones kept in
 * tests/test_chat/ (Llama-2-chat, Meta-Llama-3-Instruct, OpenHermes ChatML).
 * Each rendering is compared byte for byte with what the npm package
 * @huggingface/jinja (installed by this test into BUILD_DIR/npm) makes of
 * the template, driven by tests/test_chat/render.mjs; where the template
 * raises an exception, convoy must refuse with a message that contains the
 * template's. Without node/npm (or without network for the install) the
 * test is skipped with a message; under CI=true that is a failure.
 * Tool calls and results are refused by the families without them, placed
 * as Mistral's template places them, and Llama 3.1's tools without a
 * message to hold them are refused (test_buffers_and_bad_calls; whole
 * conversations with tools are test_serve_tool_calls.sh's). The plain
 * ranges of a rendering (src/chat/plain_ranges.h) are found where a family
 * keeps contents as they are (ChatML) and not where it trims them (Gemma)
 * (test_plain_ranges).
 *
 * Excluded input: @huggingface/jinja 0.5.11 ignores the argument of
 * str.strip/lstrip/rstrip and strips all whitespace, where Python (and
 * convoy) strip only the characters given. Only Qwen3's template calls
 * them (with '\n'), so for Qwen3 a conversation is left out when one of its
 * assistant messages has other whitespace where those calls look (after
 * any newlines at the message's start or end or beside a <think> or
 * </think> tag). The package also compares with JavaScript's loose !=, so
 * in Llama 2's `system_message != false` an empty or whitespace-only
 * system message (which JavaScript's Number() reads as 0) counts as false,
 * where Python keeps the <<SYS>> block (and convoy does): for Llama 2,
 * conversations whose system message reads as the number 0 are left out.
 * Likewise the characters on which Python's and JavaScript's
 * whitespace differ (U+001C..U+001F, U+0085, U+FEFF) appear only in
 * test_trim_is_python, which checks Python's rule directly. */
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>

#include "chat/chat.h"
#include "chat/plain_ranges.h"
#include "core/alloc.h"
#include "core/err.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "test.h"

#define SYS CV_CHAT_SYSTEM
#define USR CV_CHAT_USER
#define AST CV_CHAT_ASSISTANT

/* Skips the current test with a message, or fails it under CI=true. */
static void skip_or_fail(const char *why)
{
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) {
        fprintf(stderr, "%s (CI=true: this is a failure)\n", why);
        test_failures_in_current++;
    } else {
        fprintf(stderr, "SKIP: %s\n", why);
        test_skipped_current = 1;
    }
}

/* ---- templates ---- */

typedef struct tmpl_ref {
    const char *file;  /* under shared/reference/chat-templates, or tests/test_chat when local */
    bool local;
    cv_chat_kind kind;
    const char *bos, *eos;
} tmpl_ref;

static const tmpl_ref TEMPLATES[] = {
    {"Qwen-Qwen2.5-7B-Instruct.jinja", false, CV_CHAT_QWEN25, "", "<|im_end|>"},
    {"Qwen-Qwen3-0.6B.jinja", false, CV_CHAT_QWEN3, "", "<|im_end|>"},
    {"google-gemma-2-2b-it.jinja", false, CV_CHAT_GEMMA, "<bos>", "<eos>"},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", false, CV_CHAT_LLAMA31, "<|begin_of_text|>", "<|eot_id|>"},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", false, CV_CHAT_LLAMA31, "<|begin_of_text|>", "<|eot_id|>"},
    {"microsoft-Phi-3.5-mini-instruct.jinja", false, CV_CHAT_PHI3, "<s>", "<|endoftext|>"},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", false, CV_CHAT_MISTRAL, "<s>", "</s>"},
    {"meta-llama-Llama-2-7b-chat-hf.jinja", true, CV_CHAT_LLAMA2, "<s>", "</s>"},
    {"meta-llama-Meta-Llama-3-8B-Instruct.jinja", true, CV_CHAT_LLAMA3, "<|begin_of_text|>", "<|eot_id|>"},
    {"teknium-OpenHermes-2.5-Mistral-7B.jinja", true, CV_CHAT_CHATML, "<s>", "<|im_end|>"},
};
#define N_TEMPLATES ((int)(sizeof TEMPLATES / sizeof TEMPLATES[0]))

/* Path of template t in buf; 0 (with the test skipped or failed) if absent. */
static int template_path(const tmpl_ref *t, char *buf, size_t n)
{
    if (t->local) {
        snprintf(buf, n, "%s/tests/test_chat/%s", CONVOY_SOURCE_DIR, t->file);
        return 1;
    }
    char rel[256];
    snprintf(rel, sizeof rel, "reference/chat-templates/%s", t->file);
    return test_shared_path(buf, n, rel);
}

/* ---- conversations ---- */

typedef struct conv {
    const char *name;
    int n;
    cv_chat_msg m[6];
} conv;

static char long_text[6000];

static conv CONVS[] = {
    {"user only", 1, {{USR, "Hello"}}},
    {"system and user", 2, {{SYS, "You are a helpful assistant"}, {USR, "Hello"}}},
    {"multi-turn with system", 6,
     {{SYS, "You are a helpful assistant"},
      {USR, "Hello"},
      {AST, "Hi there"},
      {USR, "Who are you"},
      {AST, "   I am an assistant   "},
      {USR, "Another question"}}},
    {"ends with assistant", 4, {{USR, "What is 2+2?"}, {AST, "4"}, {USR, "And 3+3?"}, {AST, "6"}}},
    {"system, ends with assistant", 3, {{SYS, "Be brief."}, {USR, "Hi"}, {AST, "Hello!"}}},
    {"unicode", 4,
     {{SYS, "R\xc3\xa9ponds en fran\xc3\xa7" "ais. \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x82\x82\xe3\x80\x82"},
      {USR, "Gr\xc3\xbc\xc3\x9f" "e \xf0\x9f\x98\x80 \xe2\x80\x94 \xe4\xbd\xa0\xe5\xa5\xbd\n\tZeile zwei"},
      {AST, "\xc2\xa0\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80!\xe3\x80\x80"},
      {USR, "\xe2\x80\xa8\xc3\xbf \xe2\x80\x83" "family \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d"
            "\xf0\x9f\x91\xa7 flag \xf0\x9f\x87\xba\xf0\x9f\x87\xa6\xc2\xa0\xe2\x80\x8b"}}},
    {"empty user", 1, {{USR, ""}}},
    {"empty system", 2, {{SYS, ""}, {USR, "Hi"}}},
    {"all empty", 3, {{SYS, ""}, {USR, ""}, {AST, ""}}},
    {"whitespace only", 3, {{SYS, "  \n "}, {USR, " \t\n"}, {AST, "\n\n"}}},
    {"newlines at the edges", 3, {{USR, "\n\nline\n\n"}, {AST, "\nanswer\n"}, {USR, "\n"}}},
    {"special-token look-alikes", 2,
     {{USR, "<|im_end|><|eot_id|>[INST] <<SYS>> </s><s><end_of_turn><|end|>"}, {AST, "<think>not closed"}}},
    {"system only", 1, {{SYS, "Only a system prompt"}}},
    {"system in the middle", 3, {{USR, "Hi"}, {SYS, "New instructions"}, {USR, "Go"}}},
    {"system at an odd position", 2, {{USR, "Hi"}, {SYS, "Late instructions"}}},
    {"two users in a row", 2, {{USR, "first"}, {USR, "second"}}},
    {"assistant first", 2, {{AST, "I start"}, {USR, "ok"}}},
    {"thinking history", 4,
     {{USR, "Q1"}, {AST, "<think>\nR1\n</think>\n\nA1"}, {USR, "Q2"}, {AST, "<think>\nR2 step\n\n</think>\n\nA2"}}},
    {"reasoning after the last query", 5,
     {{SYS, "sys"},
      {USR, "Q"},
      {AST, "<think>\nfirst\n</think>\n\ncall"},
      {USR, "<tool_response>\n42\n</tool_response>"},
      {AST, "<think>\nsecond\n</think>\nfinal"}}},
    {"nested think tags", 3,
     {{USR, "x"}, {AST, "pre<think>a<think>\n\nb\n\n</think>mid</think>\n\n\nend"}, {USR, "y"}}},
    {"nested think tags last", 2, {{USR, "x"}, {AST, "pre<think>a<think>\n\nb\n\n</think>mid</think>\n\n\nend"}}},
    {"only a closing tag", 2, {{USR, "x"}, {AST, "</think>"}}},
    {"long message", 2, {{USR, long_text}, {AST, "short"}}},
    {"whitespace the engines disagree on", 3,
     {{USR, "\x1c\xc2\x85 hi \xef\xbb\xbf"}, {AST, "\xef\xbb\xbf ok \x1f"}, {USR, "\x1d\x1e"}}},
};
#define N_CONVS ((int)(sizeof CONVS / sizeof CONVS[0]))

static void fill_long_text(void)
{
    static const char unit[] = "word \xc3\xa9t\xc3\xa9 \xe6\xbc\xa2\xe5\xad\x97 ";
    size_t n = 0, u = strlen(unit);
    while (n + u < sizeof long_text) {
        memcpy(long_text + n, unit, u);
        n += u;
    }
    long_text[n] = '\0';
}

typedef struct opt_set {
    const char *name;
    cv_chat_opts opts;
} opt_set;

static const opt_set OPTS[] = {
    {"defaults", {NULL, false, NULL}},
    {"date_string 05 Mar 2025", {"05 Mar 2025", false, NULL}},
    {"enable_thinking false", {NULL, true, NULL}},
};
#define N_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

/* ---- the Qwen3 exclusion (see the top comment) ---- */

/* Whitespace in Python's or JavaScript's sense starting at p (length) / ending at end. */
static size_t any_ws_at(const unsigned char *p, const unsigned char *end)
{
    size_t left = (size_t)(end - p);
    if (left == 0)
        return 0;
    if ((p[0] >= 0x09 && p[0] <= 0x0d) || (p[0] >= 0x1c && p[0] <= 0x20))
        return 1;
    if (left >= 2 && p[0] == 0xc2 && (p[1] == 0x85 || p[1] == 0xa0))
        return 2;
    if (left < 3)
        return 0;
    uint32_t cp = ((uint32_t)(p[0] & 0x0f) << 12) | ((uint32_t)(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
    if ((p[0] & 0xf0) != 0xe0 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
        return 0;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
        cp == 0x205f || cp == 0x3000 || cp == 0xfeff)
        return 3;
    return 0;
}

/* Is there whitespace other than '\n' after the newlines that follow p
 * (forward) or precede p (backward), within [start, end)? */
static bool other_ws_beyond_newlines(const char *start, const char *end, const char *p, bool forward)
{
    const unsigned char *s = (const unsigned char *)start, *e = (const unsigned char *)end,
                        *q = (const unsigned char *)p;
    if (forward) {
        while (q < e && *q == '\n')
            q++;
        return any_ws_at(q, e) > 0;
    }
    while (q > s && q[-1] == '\n')
        q--;
    for (size_t k = 1; k <= 3 && k <= (size_t)(q - s); k++)
        if (any_ws_at(q - k, q) == k)
            return true;
    return false;
}

static bool qwen3_strip_sensitive(const conv *cv)
{
    static const char *const tags[] = {"<think>", "</think>"};
    for (int i = 0; i < cv->n; i++) {
        if (cv->m[i].role != AST)
            continue;
        const char *c = cv->m[i].content, *end = c + strlen(c);
        if (other_ws_beyond_newlines(c, end, c, true) || other_ws_beyond_newlines(c, end, end, false))
            return true;
        for (int t = 0; t < 2; t++)
            for (const char *p = strstr(c, tags[t]); p; p = strstr(p + 1, tags[t]))
                if (other_ws_beyond_newlines(c, end, p, false) ||
                    other_ws_beyond_newlines(c, end, p + strlen(tags[t]), true))
                    return true;
    }
    return false;
}

/* Would JavaScript's loose `system_message != false` be false, i.e. does
 * Number(system content) give 0 (empty, whitespace-only or a zero)? */
static bool llama2_loose_false(const conv *cv)
{
    if (cv->m[0].role != SYS)
        return false;
    const char *c = cv->m[0].content, *end = c + strlen(c);
    const unsigned char *p = (const unsigned char *)c;
    size_t k;
    while ((k = any_ws_at(p, (const unsigned char *)end)) > 0)
        p += k;
    if (*p == '\0')
        return true;
    char *stop;
    double v = strtod((const char *)p, &stop);
    while ((k = any_ws_at((const unsigned char *)stop, (const unsigned char *)end)) > 0)
        stop += k;
    return stop != (const char *)p && *stop == '\0' && v == 0.0;
}

/* Does a message contain whitespace in only one of Python's and
 * JavaScript's senses (U+001C..U+001F, U+0085, U+FEFF)? */
static bool has_disputed_ws(const conv *cv)
{
    for (int i = 0; i < cv->n; i++) {
        const char *c = cv->m[i].content;
        for (const char *p = c; *p; p++)
            if ((*p >= 0x1c && *p <= 0x1f))
                return true;
        if (strstr(c, "\xc2\x85") || strstr(c, "\xef\xbb\xbf"))
            return true;
    }
    return false;
}

/* ---- helpers ---- */

/* Renders into a fresh malloc'ed string (NULL on failure, message in err). */
static char *render(cv_chat_kind k, const conv *cv, bool gen, const char *bos, const char *eos,
                    const cv_chat_opts *o, size_t *len, char *err, size_t errlen)
{
    if (cv_chat_render(k, cv->m, cv->n, gen, bos, eos, o, NULL, 0, len, err, errlen) != 0)
        return NULL;
    char *out = malloc(*len + 1);
    size_t len2 = 0;
    if (!out || cv_chat_render(k, cv->m, cv->n, gen, bos, eos, o, out, *len + 1, &len2, err, errlen) != 0 ||
        len2 != *len) {
        free(out);
        return NULL;
    }
    return out;
}

/* Prints up to 60 bytes of s from offset `at`, escaped, after a label. */
static void show(const char *label, const char *s, size_t n, size_t at)
{
    fprintf(stderr, "    %s (%zu bytes) @%zu: \"", label, n, at);
    for (size_t i = at; i < n && i < at + 60; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c < 0x20 || c == '"' || c == '\\')
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

/* ---- tests ---- */

static void test_names(void)
{
    for (int k = 0; k < CV_CHAT_KIND_COUNT; k++) {
        const char *name = cv_chat_kind_name((cv_chat_kind)k);
        CHECKF(cv_chat_kind_from_name(name) == k, "%s", name);
        CHECKF(strstr(cv_chat_kind_names(), name) != NULL, "%s missing from the list", name);
    }
    CHECK(cv_chat_kind_from_name("Llama3") == -1);
    CHECK(cv_chat_kind_from_name("llama") == -1);
    CHECK(cv_chat_kind_from_name("") == -1);
    CHECK(cv_chat_kind_from_name(NULL) == -1);
    CHECK(strcmp(cv_chat_kind_name(CV_CHAT_KIND_COUNT), "?") == 0);
    CHECK(cv_chat_role_from_name("system") == CV_CHAT_SYSTEM);
    CHECK(cv_chat_role_from_name("user") == CV_CHAT_USER);
    CHECK(cv_chat_role_from_name("assistant") == CV_CHAT_ASSISTANT);
    CHECK(cv_chat_role_from_name("tool") == -1);
    CHECK(cv_chat_role_from_name("developer") == -1);
    CHECK(cv_chat_role_from_name(NULL) == -1);
}

static void test_detect_templates(void)
{
    char path[1024], err[CV_ERRLEN];
    for (int t = 0; t < N_TEMPLATES; t++) {
        if (!template_path(&TEMPLATES[t], path, sizeof path))
            return;
        char *text = test_read_file(path, NULL);
        CHECKF(text != NULL, "cannot read %s", path);
        if (!text)
            continue;
        cv_chat_kind k = CV_CHAT_KIND_COUNT;
        int rc = cv_chat_detect(text, &k, err, sizeof err);
        CHECKF(rc == 0 && k == TEMPLATES[t].kind, "%s: rc %d, kind %s (want %s): %s", TEMPLATES[t].file, rc,
               cv_chat_kind_name(k), cv_chat_kind_name(TEMPLATES[t].kind), rc ? err : "");
        free(text);
    }
}

static void expect_refusal(const char *tmpl, const char *want1, const char *want2)
{
    char err[CV_ERRLEN] = "";
    cv_chat_kind k;
    int rc = cv_chat_detect(tmpl, &k, err, sizeof err);
    CHECKF(rc == -1, "template accepted as %s: %.40s", cv_chat_kind_name(k), tmpl ? tmpl : "(null)");
    CHECKF(strstr(err, want1) && strstr(err, want2), "message \"%s\" lacks \"%s\" / \"%s\"", err, want1, want2);
    CHECKF(strstr(err, "--chat-template") && strstr(err, "llama3.1"), "message \"%s\" does not list the names",
           err);
}

static void test_detect_refusals(void)
{
    expect_refusal(NULL, "empty", "");
    expect_refusal("", "empty", "");
    expect_refusal("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", "unrecognized",
                   "begins \"{{ bos_token }}{% for m in messages %}{{ m.conte\"");
    /* Newlines are shown escaped, and the quote is cut at a character
     * boundary (the 48th byte falls inside the 3-byte U+2014). */
    expect_refusal("### Instruction:\n{{ messages[0].content }}\n\xe2\x80\x94\xe2\x80\x94 more text here",
                   "begins \"### Instruction:\\n{{ messages[0].content }}\\n\xe2\x80\x94\"", "(");
    expect_refusal("{% for m in messages %}<|im_start|>{{ m.role }}<|im_sep|>{{ m.content }}{% endfor %}",
                   "Phi-4", "<|im_sep|>");
    expect_refusal("{{ bos_token }}[SYSTEM_PROMPT]{{ s }}[/SYSTEM_PROMPT][INST]{{ u }}[/INST]", "Mistral v7", "");
    expect_refusal("{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endfor %}",
                   "Mistral v1-v3", "");
    expect_refusal("<|im_start|>User:<end_of_utterance>", "SmolVLM", "");
    expect_refusal("<|user|>{{ content }}", "unrecognized", "<|user|>");
}

/* A GGUF holding tmpl as tokenizer.chat_template (none when NULL), read
 * back as the engine reads it (convoy_model_chat_template): the key's text,
 * or NULL. *ok is false when the file could not be written or read. */
static char *gguf_template(const char *tmpl, bool *ok)
{
    char path[512], err[CV_ERRLEN];
    snprintf(path, sizeof path, "%s/test_chat_select.gguf", CONVOY_BINARY_DIR);
    gguf_writer *w = cv_gguf_writer_create();
    cv_gguf_set_str(w, "general.architecture", "llama");
    if (tmpl)
        cv_gguf_set_str(w, "tokenizer.chat_template", tmpl);
    *ok = cv_gguf_write(w, path, err, sizeof err) == 0;
    cv_gguf_writer_free(w);
    gguf_file f;
    if (!*ok || cv_gguf_open(&f, path, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        *ok = false;
        return NULL;
    }
    const gguf_kv *kv = cv_gguf_find_kv(&f, "tokenizer.chat_template");
    char *text = kv && kv->type == GGUF_STRING ? cv_gguf_str_dup(kv->v.str) : NULL;
    cv_gguf_close(&f);
    remove(path);
    return text;
}

/* Choosing a family as the server does: a --chat-template NAME, else the
 * family detected in the model's template text. */
static void test_select(void)
{
    char err[CV_ERRLEN];
    bool ok;
    char *t = gguf_template("{{ '<start_of_turn>user\\n' }}", &ok);
    cv_chat_kind k = CV_CHAT_KIND_COUNT;
    CHECK(ok && cv_chat_detect(t, &k, err, sizeof err) == 0 && k == CV_CHAT_GEMMA);
    cv_free(t);
    CHECK(cv_chat_kind_from_name("qwen3") == CV_CHAT_QWEN3);
    CHECK(cv_chat_kind_from_name("gemma2") == -1);
    CHECKF(strstr(cv_chat_kind_names(), "phi3"), "%s", cv_chat_kind_names());

    t = gguf_template(NULL, &ok);
    CHECK(ok && !t && cv_chat_detect(t, &k, err, sizeof err) == -1);
    CHECKF(strstr(err, "--chat-template NAME"), "%s", err);
    CHECK(cv_chat_kind_from_name("chatml") == CV_CHAT_CHATML);

    t = gguf_template("{{ unknown }}", &ok);
    CHECK(ok && cv_chat_detect(t, &k, err, sizeof err) == -1);
    CHECKF(strstr(err, "unrecognized"), "%s", err);
    cv_free(t);
}

static void test_buffers_and_bad_calls(void)
{
    char err[CV_ERRLEN], buf[1024];
    const conv *cv = &CONVS[2];
    size_t len = 0, len2 = 0;
    for (int k = 0; k < CV_CHAT_KIND_COUNT; k++) {
        if (k == CV_CHAT_GEMMA)
            continue; /* refuses the system message; see the Jinja comparison */
        CHECKF(cv_chat_render((cv_chat_kind)k, cv->m, cv->n, true, "<s>", "</s>", NULL, NULL, 0, &len, err,
                              sizeof err) == 0, "%s: %s", cv_chat_kind_name((cv_chat_kind)k), err);
        CHECK(len > 0 && len < sizeof buf);
        memset(buf, 'x', sizeof buf);
        CHECK(cv_chat_render((cv_chat_kind)k, cv->m, cv->n, true, "<s>", "</s>", NULL, buf, len, &len2, err,
                             sizeof err) == -1);
        CHECK(len2 == len && strstr(err, "needs"));
        CHECK(buf[len] == 'x'); /* nothing written past cap */
        CHECK(cv_chat_render((cv_chat_kind)k, cv->m, cv->n, true, "<s>", "</s>", NULL, buf, len + 1, &len2, err,
                             sizeof err) == 0);
        CHECK(len2 == len && buf[len] == '\0' && strlen(buf) == len);
        CHECK(cv_chat_render((cv_chat_kind)k, cv->m, cv->n, true, "<s>", "</s>", NULL, NULL, 10, &len2, err,
                             sizeof err) == -1);
    }
    CHECK(cv_chat_render(CV_CHAT_CHATML, cv->m, 0, true, "", "", NULL, buf, sizeof buf, &len, err, sizeof err) == -1);
    CHECKF(strstr(err, "at least one message"), "%s", err);
    CHECK(cv_chat_render(CV_CHAT_CHATML, NULL, 1, true, "", "", NULL, buf, sizeof buf, &len, err, sizeof err) == -1);
    cv_chat_msg bad[2] = {{USR, "hi"}, {(cv_chat_role)7, "x"}};
    CHECK(cv_chat_render(CV_CHAT_CHATML, bad, 2, true, "", "", NULL, buf, sizeof buf, &len, err, sizeof err) == -1);
    CHECKF(strstr(err, "message 1") && strstr(err, "role"), "%s", err);
    CHECK(cv_chat_render(CV_CHAT_KIND_COUNT, bad, 1, true, "", "", NULL, buf, sizeof buf, &len, err, sizeof err) ==
          -1);
    /* tool calls and results: llama3.1 and mistral only; llama3.1's tools need a message to go into */
    const cv_chat_msg tool[3] = {{USR, "q"}, {CV_CHAT_TOOL_CALL, "[TOOL_CALLS][]"}, {CV_CHAT_TOOL, "r"}};
    CHECK(cv_chat_render(CV_CHAT_CHATML, tool, 3, true, "", "", NULL, buf, sizeof buf, &len, err, sizeof err) == -1);
    CHECKF(strstr(err, "message 1") && strstr(err, "tool"), "%s", err);
    const cv_chat_opts with_tools = {.tools = "[T]"};
    CHECK(cv_chat_render(CV_CHAT_MISTRAL, tool, 3, false, "<s>", "</s>", &with_tools, buf, sizeof buf, &len, err,
                         sizeof err) == 0);
    CHECKF(!strcmp(buf, "<s>[AVAILABLE_TOOLS][T][/AVAILABLE_TOOLS][INST]q[/INST][TOOL_CALLS][]</s>"
                        "[TOOL_RESULTS]r[/TOOL_RESULTS]"), "%s", buf);
    const cv_chat_msg sys_only[1] = {{SYS, "s"}};
    CHECK(cv_chat_render(CV_CHAT_LLAMA31, sys_only, 1, true, "", "", &with_tools, buf, sizeof buf, &len, err,
                         sizeof err) == -1);
    CHECKF(strstr(err, "no first user message"), "%s", err);
    /* NULL content counts as "", NULL tokens as "". */
    cv_chat_msg nul[2] = {{USR, NULL}, {AST, NULL}};
    CHECK(cv_chat_render(CV_CHAT_MISTRAL, nul, 2, false, NULL, NULL, NULL, buf, sizeof buf, &len, err, sizeof err) ==
          0);
    CHECKF(strcmp(buf, "[INST][/INST]") == 0, "%s", buf);
    CHECK(cv_chat_stop_strings(CV_CHAT_KIND_COUNT) == NULL);
}

/* Bytes that are not valid UTF-8, or whitespace cut short, at the edges
 * of trimmed text: rendered as they are, never read past (ASan build). */
static void test_broken_utf8(void)
{
    static const char *const texts[] = {"\xe3\x80", "\xe2", "\xc2", "\xff\xfe", "a\xe2\x80", "\x80\x80\x80 "};
    char err[CV_ERRLEN];
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        char *copy = malloc(strlen(texts[t]) + 1); /* exact size, so ASan sees an over-read */
        strcpy(copy, texts[t]);
        conv cv = {"broken", 2, {{USR, copy}, {AST, copy}}};
        for (int k = 0; k < CV_CHAT_KIND_COUNT; k++) {
            size_t len;
            char *out = render((cv_chat_kind)k, &cv, true, "<s>", "</s>", NULL, &len, err, sizeof err);
            CHECKF(out != NULL, "%s: %s", cv_chat_kind_name((cv_chat_kind)k), err);
            free(out);
        }
        free(copy);
    }
}

/* |trim and str.strip follow Python: U+001C..U+001F and U+0085 are
 * whitespace, U+FEFF and U+200B are not. */
static void test_trim_is_python(void)
{
    char err[CV_ERRLEN];
    size_t len;
    conv cv = {"python whitespace", 1, {{USR, "\x1c\x1f\xc2\x85 \xe3\x80\x80hi\xef\xbb\xbf\xe2\x80\x8b\xc2\x85\x1d"}}};
    char *out = render(CV_CHAT_GEMMA, &cv, false, "", "", NULL, &len, err, sizeof err);
    CHECKF(out && strcmp(out, "<start_of_turn>user\nhi\xef\xbb\xbf\xe2\x80\x8b<end_of_turn>\n") == 0, "%s",
           out ? out : err);
    free(out);
    conv cv2 = {"python whitespace", 2, {{SYS, "S\xe2\x80\xaf"}, {USR, "\xe1\x9a\x80\xe2\x81\x9f"}}};
    out = render(CV_CHAT_LLAMA2, &cv2, false, "<s>", "</s>", NULL, &len, err, sizeof err);
    CHECKF(out && strcmp(out, "<s>[INST] <<SYS>>\nS\xe2\x80\xaf\n<</SYS>> [/INST]") == 0, "%s", out ? out : err);
    free(out);
}

/* The first stop string of each kind is what its template writes after an
 * assistant message (up to whitespace). */
static void test_stop_strings(void)
{
    char err[CV_ERRLEN];
    conv cv = {"stop", 2, {{USR, "hi"}, {AST, "xyz"}}};
    for (int k = 0; k < CV_CHAT_KIND_COUNT; k++) {
        const char *const *stops = cv_chat_stop_strings((cv_chat_kind)k);
        CHECK(stops && stops[0]);
        if (!stops || !stops[0])
            continue;
        size_t len;
        char *out = render((cv_chat_kind)k, &cv, false, "<s>", "</s>", NULL, &len, err, sizeof err);
        CHECKF(out != NULL, "%s", err);
        if (!out)
            continue;
        const char *p = strstr(out, "xyz");
        CHECK(p != NULL);
        if (p) {
            p += 3;
            while (*p == ' ' || *p == '\n')
                p++;
            CHECKF(strncmp(p, stops[0], strlen(stops[0])) == 0, "%s: \"%s\" not after the answer in \"%s\"",
                   cv_chat_kind_name((cv_chat_kind)k), stops[0], out);
        }
        free(out);
    }
}

/* npm prefix with @huggingface/jinja installed, or 0 (test skipped or failed). */
static int setup_npm(char *prefix, size_t n)
{
    char marker[1200], cmd[4096];
    snprintf(prefix, n, "%s/npm", CONVOY_BINARY_DIR);
    snprintf(marker, sizeof marker, "%s/node_modules/@huggingface/jinja/package.json", prefix);
    if (system("command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1") != 0) {
        skip_or_fail("node and npm are needed to render the Jinja templates (not found)");
        return 0;
    }
    if (access(marker, R_OK) == 0)
        return 1;
    snprintf(cmd, sizeof cmd,
             "npm install --prefix '%s' --no-audit --no-fund @huggingface/jinja@0.5.11 >'%s/npm-install.log' 2>&1",
             prefix, CONVOY_BINARY_DIR);
    fprintf(stderr, "installing @huggingface/jinja into %s\n", prefix);
    if (system(cmd) != 0 || access(marker, R_OK) != 0) {
        char why[1200];
        snprintf(why, sizeof why, "npm install @huggingface/jinja failed (see %s/npm-install.log)", CONVOY_BINARY_DIR);
        skip_or_fail(why);
        return 0;
    }
    return 1;
}

typedef struct jcase {
    int t, c, o;
    bool gen;
    bool js_excluded; /* see the top comment */
    char *text;       /* native rendering, or NULL */
    size_t len;
    char err[CV_ERRLEN];
} jcase;

static jcase *g_cases;
static int g_n_cases;
static char g_paths[N_TEMPLATES][1024];

static json_t *messages_json(const conv *cv)
{
    static const char *const roles[] = {"system", "user", "assistant"};
    json_t *arr = json_array();
    for (int i = 0; i < cv->n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:s}", "role", roles[cv->m[i].role], "content",
                                             cv->m[i].content));
    return arr;
}

/* Renders every (template, conversation, options, add_generation_prompt)
 * natively once; 0 (test skipped or failed) if a template is missing. */
static int build_cases(void)
{
    if (g_cases)
        return 1;
    for (int t = 0; t < N_TEMPLATES; t++)
        if (!template_path(&TEMPLATES[t], g_paths[t], sizeof g_paths[t]))
            return 0;
    fill_long_text();
    g_cases = calloc((size_t)(N_TEMPLATES * N_CONVS * N_OPTS * 2), sizeof *g_cases);
    for (int t = 0; t < N_TEMPLATES; t++)
        for (int c = 0; c < N_CONVS; c++) {
            bool excl = (TEMPLATES[t].kind == CV_CHAT_QWEN3 && qwen3_strip_sensitive(&CONVS[c])) ||
                        (TEMPLATES[t].kind == CV_CHAT_LLAMA2 && llama2_loose_false(&CONVS[c])) ||
                        has_disputed_ws(&CONVS[c]);
            for (int o = 0; o < N_OPTS; o++)
                for (int gen = 0; gen < 2; gen++) {
                    jcase *jc = &g_cases[g_n_cases++];
                    jc->t = t;
                    jc->c = c;
                    jc->o = o;
                    jc->gen = gen;
                    jc->js_excluded = excl;
                    jc->text = render(TEMPLATES[t].kind, &CONVS[c], gen, TEMPLATES[t].bos, TEMPLATES[t].eos,
                                      &OPTS[o].opts, &jc->len, jc->err, sizeof jc->err);
                }
        }
    return 1;
}

/* Writes the cases (all, or those not excluded for @huggingface/jinja) for
 * an oracle script. */
static int write_cases(const char *path, bool for_js)
{
    json_t *arr = json_array();
    for (int i = 0; i < g_n_cases; i++) {
        const jcase *jc = &g_cases[i];
        if (for_js && jc->js_excluded)
            continue;
        const tmpl_ref *t = &TEMPLATES[jc->t];
        json_t *j = json_pack("{s:s, s:o, s:b, s:s, s:s}", "template", g_paths[jc->t], "messages",
                              messages_json(&CONVS[jc->c]), "add_generation_prompt", jc->gen, "bos_token", t->bos,
                              "eos_token", t->eos);
        if (OPTS[jc->o].opts.date_string)
            json_object_set_new(j, "date_string", json_string(OPTS[jc->o].opts.date_string));
        if (OPTS[jc->o].opts.disable_thinking)
            json_object_set_new(j, "enable_thinking", json_false());
        json_array_append_new(arr, j);
    }
    json_t *root = json_pack("{s:o}", "cases", arr);
    int rc = json_dump_file(root, path, JSON_COMPACT);
    json_decref(root);
    return rc;
}

/* Compares the oracle's results with the native renderings. */
static void compare_results(const char *oracle, const char *results_path, bool for_js)
{
    json_error_t jerr;
    json_t *results = json_load_file(results_path, 0, &jerr);
    CHECKF(results && json_is_array(results), "results from %s: %s", results_path, results ? "not an array" : jerr.text);
    if (!results || !json_is_array(results)) {
        json_decref(results);
        return;
    }
    int n_compared = 0, n_equal = 0, n_raised = 0, n_bad = 0;
    size_t r_i = 0;
    for (int i = 0; i < g_n_cases; i++) {
        const jcase *jc = &g_cases[i];
        if (for_js && jc->js_excluded)
            continue;
        json_t *r = json_array_get(results, r_i++);
        if (!r)
            break;
        n_compared++;
        bool ok = json_is_true(json_object_get(r, "ok"));
        json_t *jv = json_object_get(r, ok ? "text" : "error");
        const char *jtext = json_string_value(jv);
        size_t jlen = json_string_length(jv), at = 0;
        bool same;
        if (ok && jc->text) {
            while (at < jlen && at < jc->len && jtext[at] == jc->text[at])
                at++;
            same = jlen == jc->len && at == jlen;
        } else {
            same = !ok && !jc->text && jtext && jtext[0] && strstr(jc->err, jtext);
        }
        if (same) {
            n_equal++;
            n_raised += !ok;
            continue;
        }
        if (++n_bad > 20)
            continue;
        fprintf(stderr, "MISMATCH (%s) %s / \"%s\" / add_generation_prompt=%d / %s\n", oracle,
                TEMPLATES[jc->t].file, CONVS[jc->c].name, jc->gen, OPTS[jc->o].name);
        if (ok && jc->text) {
            size_t from = at > 20 ? at - 20 : 0;
            show(oracle, jtext, jlen, from);
            show("convoy", jc->text, jc->len, from);
        } else {
            fprintf(stderr, "    %s: %s: %s\n", oracle, ok ? "text" : "error", jtext ? jtext : "?");
            fprintf(stderr, "    convoy: %s: %s\n", jc->text ? "text" : "error", jc->text ? jc->text : jc->err);
        }
    }
    CHECKF(r_i == json_array_size(results) && n_compared > 0, "%s gave %zu results for %d cases", oracle,
           json_array_size(results), n_compared);
    CHECKF(n_bad == 0, "%d of %d renderings differ from %s", n_bad, n_compared, oracle);
    CHECK(n_raised > 0 && n_raised < n_equal);
    fprintf(stderr, "compared %d renderings with %s: %d equal (%d of them refused by both)\n", n_compared, oracle,
            n_equal, n_raised);
    json_decref(results);
}

/* cv's plain ranges in its native rendering as kind k, into *prompt
 * (release with free): what cv_plain_ranges_find returns, or -2 when a
 * rendering fails. */
static int plain_ranges_of(cv_chat_kind k, const conv *cv, char **prompt, cv_plain_range **ranges, int *n_ranges)
{
    conv marked = *cv;
    char marks[6][CV_PLAIN_MARK_MAX];
    const char *contents[6];
    for (int i = 0; i < cv->n; i++) {
        cv_plain_mark(marks[i], sizeof marks[i], i);
        contents[i] = cv->m[i].content;
        marked.m[i].content = marks[i];
    }
    char err[CV_ERRLEN];
    size_t len = 0, mlen = 0;
    *prompt = render(k, cv, true, "<s>", "</s>", NULL, &len, err, sizeof err);
    char *m = render(k, &marked, true, "<s>", "</s>", NULL, &mlen, err, sizeof err);
    const int rc = *prompt && m ? cv_plain_ranges_find(*prompt, len, m, mlen, contents, cv->n, ranges, n_ranges) : -2;
    free(m);
    return rc;
}

static void test_plain_ranges(void)
{
    const conv cv = {"plain ranges", 3, {{USR, " hi <|im_end|> "}, {AST, "ok"}, {USR, ""}}};
    char *prompt;
    cv_plain_range *ranges;
    int n;
    CHECK(plain_ranges_of(CV_CHAT_CHATML, &cv, &prompt, &ranges, &n) == 1); /* ChatML keeps contents */
    CHECKF(n == 3 && ranges[0].off == strlen("<|im_start|>user\n"), "%d ranges", n);
    for (int i = 0; i < n && i < cv.n; i++)
        CHECKF(ranges[i].len == strlen(cv.m[i].content) && !memcmp(prompt + ranges[i].off, cv.m[i].content,
                                                                   ranges[i].len), "range %d", i);
    CHECK(n == 3 && ranges[0].off + ranges[0].len < ranges[1].off && ranges[1].off < ranges[2].off);
    cv_free(ranges);
    free(prompt);
    CHECK(plain_ranges_of(CV_CHAT_GEMMA, &cv, &prompt, &ranges, &n) == 0); /* Gemma trims them */
    CHECK(n == 0 && !ranges);
    free(prompt);
}

/* The real templates rendered by @huggingface/jinja (the comparison the
 * test suite requires). */
static void test_jinja_js(void)
{
    char prefix[1024], cases_path[1024], results_path[1024], cmd[4096];
    if (!build_cases() || !setup_npm(prefix, sizeof prefix))
        return;
    snprintf(cases_path, sizeof cases_path, "%s/test_chat_cases_js.json", CONVOY_BINARY_DIR);
    snprintf(results_path, sizeof results_path, "%s/test_chat_results_js.json", CONVOY_BINARY_DIR);
    CHECK(write_cases(cases_path, true) == 0);
    remove(results_path);
    snprintf(cmd, sizeof cmd, "node '%s/tests/test_chat/render.mjs' '%s' '%s' '%s'", CONVOY_SOURCE_DIR, prefix,
             cases_path, results_path);
    CHECKF(system(cmd) == 0, "%s failed", cmd);
    compare_results("@huggingface/jinja", results_path, true);
    int n_excl = 0;
    for (int i = 0; i < g_n_cases; i++)
        n_excl += g_cases[i].js_excluded;
    fprintf(stderr, "%d renderings left out for @huggingface/jinja (Qwen3 strip, Llama 2 loose !=, disputed whitespace)\n", n_excl);
}

/* The same templates rendered by Python's Jinja2 as transformers does,
 * including the inputs left out above: where the two engines disagree,
 * this shows convoy follows Python. Runs when python3 has jinja2; it is an
 * addition to the required comparison, so without it the test only says so. */
static void test_jinja_python(void)
{
    char cases_path[1024], results_path[1024], cmd[4096];
    if (!build_cases())
        return;
    if (system("python3 -c 'import jinja2' >/dev/null 2>&1") != 0)
        SKIP("python3 with jinja2 not found: the comparison with Python's Jinja2 is not run");
    snprintf(cases_path, sizeof cases_path, "%s/test_chat_cases_py.json", CONVOY_BINARY_DIR);
    snprintf(results_path, sizeof results_path, "%s/test_chat_results_py.json", CONVOY_BINARY_DIR);
    CHECK(write_cases(cases_path, false) == 0);
    remove(results_path);
    snprintf(cmd, sizeof cmd, "python3 '%s/tests/test_chat/render.py' '%s' '%s'", CONVOY_SOURCE_DIR, cases_path,
             results_path);
    CHECKF(system(cmd) == 0, "%s failed", cmd);
    compare_results("jinja2", results_path, false);
}

int main(void)
{
    TEST_RUN(test_names);
    TEST_RUN(test_detect_templates);
    TEST_RUN(test_detect_refusals);
    TEST_RUN(test_select);
    TEST_RUN(test_buffers_and_bad_calls);
    TEST_RUN(test_broken_utf8);
    TEST_RUN(test_trim_is_python);
    TEST_RUN(test_stop_strings);
    TEST_RUN(test_plain_ranges);
    TEST_RUN(test_jinja_js);
    TEST_RUN(test_jinja_python);
    for (int i = 0; i < g_n_cases; i++)
        free(g_cases[i].text);
    free(g_cases);
    return test_summary();
}
