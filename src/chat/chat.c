/* chat.c: native chat-template renderings (chat.h).
 *
 * Detection is a fixed sequence of substring tests on the template text,
 * the most specific first (the way llama.cpp's llm_chat_detect_template
 * works). Each rendering is a plain function that walks the messages once
 * and writes exactly what its Jinja template writes, checking first what
 * the template would reject with raise_exception, so that a refused
 * conversation writes nothing.
 *
 * Output goes through a `sink` that copies into the caller's buffer while
 * it fits and always counts, so one pass both measures and writes; text is
 * handled as (pointer, length) slices, and trimming only moves slice ends,
 * so rendering allocates nothing. Whitespace for |trim and str.strip() is
 * Python's (str.isspace): ASCII \t \n \v \f \r and space, U+001C..U+001F,
 * U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F,
 * U+3000. */
#include "chat/chat.h"

#include <stdint.h>
#include <string.h>

#include "core/err.h"

typedef struct slice {
    const char *p;
    size_t n;
} slice;

typedef struct sink {
    char *out;
    size_t cap;
    size_t len;
    bool overflow; /* the length itself no longer fits in size_t */
} sink;

static const char *const KIND_NAMES[CV_CHAT_KIND_COUNT] = {
    [CV_CHAT_LLAMA2] = "llama2",   [CV_CHAT_LLAMA3] = "llama3",   [CV_CHAT_LLAMA31] = "llama3.1",
    [CV_CHAT_CHATML] = "chatml",   [CV_CHAT_QWEN25] = "qwen2.5",  [CV_CHAT_QWEN3] = "qwen3",
    [CV_CHAT_MISTRAL] = "mistral", [CV_CHAT_GEMMA] = "gemma",     [CV_CHAT_PHI3] = "phi3",
};

static const char ALL_NAMES[] = "llama2, llama3, llama3.1, chatml, qwen2.5, qwen3, mistral, gemma, phi3";

static const char *const ROLE_NAMES[] = {
    [CV_CHAT_SYSTEM] = "system", [CV_CHAT_USER] = "user", [CV_CHAT_ASSISTANT] = "assistant"};

static const char QWEN25_DEFAULT_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char ALTERNATE_MSG[] = "Conversation roles must alternate user/assistant/user/assistant/...";

static slice sl(const char *s)
{
    slice r = {s ? s : "", s ? strlen(s) : 0};
    return r;
}

static void put_n(sink *s, const char *p, size_t n)
{
    if (s->overflow)
        return;
    if (n > SIZE_MAX - s->len) {
        s->overflow = true;
        return;
    }
    if (s->out && n <= s->cap && s->len <= s->cap - n)
        memcpy(s->out + s->len, p, n);
    s->len += n;
}

static void put(sink *s, const char *str) { put_n(s, str, strlen(str)); }
static void put_sl(sink *s, slice x) { put_n(s, x.p, x.n); }

/* ---- whitespace and slices ---- */

/* Length of the Python-whitespace character that starts at p (0 if none). */
static size_t ws_at(const unsigned char *p, const unsigned char *end)
{
    size_t left = (size_t)(end - p);
    if (left == 0)
        return 0;
    unsigned c = p[0];
    if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20))
        return 1;
    if (c == 0xc2 && left >= 2 && (p[1] == 0x85 || p[1] == 0xa0))
        return 2;
    if (left < 3)
        return 0;
    if (c == 0xe1 && p[1] == 0x9a && p[2] == 0x80) /* U+1680 */
        return 3;
    if (c == 0xe2 && p[1] == 0x80 && ((p[2] >= 0x80 && p[2] <= 0x8a) || p[2] == 0xa8 || p[2] == 0xa9 || p[2] == 0xaf))
        return 3; /* U+2000..200A, 2028, 2029, 202F */
    if (c == 0xe2 && p[1] == 0x81 && p[2] == 0x9f) /* U+205F */
        return 3;
    if (c == 0xe3 && p[1] == 0x80 && p[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

/* Length of the whitespace character that ends at end (0 if none). */
static size_t ws_before(const unsigned char *start, const unsigned char *end)
{
    for (size_t k = 1; k <= 3 && k <= (size_t)(end - start); k++)
        if (ws_at(end - k, end) == k)
            return k;
    return 0;
}

static slice lstrip_ws(slice x)
{
    const unsigned char *p = (const unsigned char *)x.p, *end = p + x.n;
    size_t k;
    while ((k = ws_at(p, end)) > 0)
        p += k;
    slice r = {(const char *)p, (size_t)(end - p)};
    return r;
}

static slice rstrip_ws(slice x)
{
    const unsigned char *start = (const unsigned char *)x.p, *end = start + x.n;
    size_t k;
    while ((k = ws_before(start, end)) > 0)
        end -= k;
    slice r = {x.p, (size_t)(end - start)};
    return r;
}

static slice trim_ws(slice x) { return rstrip_ws(lstrip_ws(x)); }

static slice lstrip_nl(slice x)
{
    while (x.n > 0 && x.p[0] == '\n') {
        x.p++;
        x.n--;
    }
    return x;
}

static slice rstrip_nl(slice x)
{
    while (x.n > 0 && x.p[x.n - 1] == '\n')
        x.n--;
    return x;
}

/* Python's str.strip() of the concatenation of parts[0..n): trims the
 * leading whitespace through the first non-empty part and the trailing
 * whitespace back to the last non-empty one. */
static void strip_parts(slice *parts, int n)
{
    for (int i = 0; i < n; i++) {
        parts[i] = lstrip_ws(parts[i]);
        if (parts[i].n > 0)
            break;
    }
    for (int i = n - 1; i >= 0; i--) {
        parts[i] = rstrip_ws(parts[i]);
        if (parts[i].n > 0)
            break;
    }
}

static const char *find_n(slice hay, const char *needle)
{
    size_t m = strlen(needle);
    if (m > hay.n)
        return NULL;
    for (size_t i = 0; i + m <= hay.n; i++)
        if (memcmp(hay.p + i, needle, m) == 0)
            return hay.p + i;
    return NULL;
}

static const char *find_last_n(slice hay, const char *needle)
{
    size_t m = strlen(needle);
    if (m > hay.n)
        return NULL;
    for (size_t i = hay.n - m + 1; i-- > 0;)
        if (memcmp(hay.p + i, needle, m) == 0)
            return hay.p + i;
    return NULL;
}

static bool starts_with(slice x, const char *pre)
{
    size_t m = strlen(pre);
    return x.n >= m && memcmp(x.p, pre, m) == 0;
}

static bool ends_with(slice x, const char *suf)
{
    size_t m = strlen(suf);
    return x.n >= m && memcmp(x.p + x.n - m, suf, m) == 0;
}

/* ---- names ---- */

const char *cv_chat_kind_name(cv_chat_kind k)
{
    return (unsigned)k < CV_CHAT_KIND_COUNT ? KIND_NAMES[k] : "?";
}

int cv_chat_kind_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int k = 0; k < CV_CHAT_KIND_COUNT; k++)
        if (strcmp(name, KIND_NAMES[k]) == 0)
            return k;
    return -1;
}

const char *cv_chat_kind_names(void) { return ALL_NAMES; }

const char *cv_chat_default_system(cv_chat_kind k) { return k == CV_CHAT_QWEN25 ? QWEN25_DEFAULT_SYSTEM : NULL; }

int cv_chat_role_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int r = 0; r < (int)(sizeof ROLE_NAMES / sizeof ROLE_NAMES[0]); r++)
        if (strcmp(name, ROLE_NAMES[r]) == 0)
            return r;
    return -1;
}

/* ---- detection ---- */

static bool has(const char *t, const char *s) { return strstr(t, s) != NULL; }

/* The template's first bytes for a message: newlines shown as \n, other
 * control characters as spaces, cut at a character boundary. */
static void snippet(const char *t, char *buf, size_t cap)
{
    size_t n = strlen(t), cut = n < 48 ? n : 48;
    while (cut < n && cut > 0 && ((unsigned char)t[cut] & 0xc0) == 0x80)
        cut--;
    size_t j = 0;
    for (size_t i = 0; i < cut && j + 3 < cap; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '\n') {
            buf[j++] = '\\';
            buf[j++] = 'n';
        } else {
            buf[j++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
        }
    }
    buf[j] = '\0';
}

static int unsupported(const char *what, char *err, size_t errlen)
{
    return cv_errf(err, errlen,
                   "chat template of %s is not supported by the native renderings; choose one with "
                   "--chat-template NAME (%s)",
                   what, ALL_NAMES);
}

int cv_chat_detect(const char *t, cv_chat_kind *out, char *err, size_t errlen)
{
    if (!t || !*t)
        return cv_errf(err, errlen, "empty chat template; choose one with --chat-template NAME (%s)", ALL_NAMES);
    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>"))
            return unsupported("Phi-4 (<|im_sep|>)", err, errlen);
        if (has(t, "<end_of_utterance>"))
            return unsupported("SmolVLM (<end_of_utterance>)", err, errlen);
        if (has(t, "enable_thinking"))
            *out = CV_CHAT_QWEN3;
        else if (has(t, QWEN25_DEFAULT_SYSTEM))
            *out = CV_CHAT_QWEN25;
        else
            *out = CV_CHAT_CHATML;
        return 0;
    }
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) {
        *out = has(t, "Cutting Knowledge Date") ? CV_CHAT_LLAMA31 : CV_CHAT_LLAMA3;
        return 0;
    }
    if (has(t, "<start_of_turn>")) {
        *out = CV_CHAT_GEMMA;
        return 0;
    }
    if (has(t, "[INST]")) {
        if (has(t, "<<SYS>>")) {
            *out = CV_CHAT_LLAMA2;
            return 0;
        }
        if (has(t, "[SYSTEM_PROMPT]"))
            return unsupported("Mistral v7 ([SYSTEM_PROMPT])", err, errlen);
        if (has(t, "[INST] ") || has(t, " [INST]"))
            return unsupported("Mistral v1-v3 (\"[INST] \" with a space)", err, errlen);
        *out = CV_CHAT_MISTRAL;
        return 0;
    }
    if (has(t, "<|assistant|>") && has(t, "<|end|>")) {
        *out = CV_CHAT_PHI3;
        return 0;
    }
    char snip[128];
    snippet(t, snip, sizeof snip);
    return cv_errf(err, errlen,
                   "unrecognized chat template (%zu bytes, begins \"%s\"); choose one with --chat-template "
                   "NAME (%s)",
                   strlen(t), snip, ALL_NAMES);
}

/* ---- renderings ---- */

typedef struct render_ctx {
    sink *s;
    const cv_chat_msg *m;
    int n;
    bool gen;
    const char *bos, *eos;
    const char *date;
    bool no_think;
    const char *tools; /* cv_chat_opts.tools */
    const char *name;  /* kind name for messages */
    char *err;
    size_t errlen;
} render_ctx;

static slice content(const render_ctx *c, int i) { return sl(c->m[i].content); }
static const char *role(const render_ctx *c, int i) { return ROLE_NAMES[c->m[i].role]; }

static int reject(const render_ctx *c, const char *msg)
{
    return cv_errf(c->err, c->errlen, "%s chat template: %s", c->name, msg);
}

/* Roles of m[from..n) alternate user, assistant, user, ...? Tool results
 * and tool calls are left out, as Mistral's template leaves them out. */
static bool alternates(const render_ctx *c, int from)
{
    int k = 0;
    for (int i = from; i < c->n; i++) {
        if (c->m[i].role >= CV_CHAT_TOOL)
            continue;
        if ((c->m[i].role == CV_CHAT_USER) != (k++ % 2 == 0))
            return false;
    }
    return true;
}

static int render_llama2(const render_ctx *c)
{
    int from = c->m[0].role == CV_CHAT_SYSTEM ? 1 : 0;
    if (!alternates(c, from))
        return reject(c, ALTERNATE_MSG);
    for (int i = from; i < c->n; i++) {
        slice parts[4];
        int np = 0;
        if (i == from && from == 1) {
            parts[np++] = sl("<<SYS>>\n");
            parts[np++] = content(c, 0);
            parts[np++] = sl("\n<</SYS>>\n\n");
        }
        parts[np++] = content(c, i);
        strip_parts(parts, np);
        if (c->m[i].role == CV_CHAT_USER) {
            put(c->s, c->bos);
            put(c->s, "[INST] ");
            for (int k = 0; k < np; k++)
                put_sl(c->s, parts[k]);
            put(c->s, " [/INST]");
        } else if (c->m[i].role == CV_CHAT_ASSISTANT) {
            put(c->s, " ");
            for (int k = 0; k < np; k++)
                put_sl(c->s, parts[k]);
            put(c->s, " ");
            put(c->s, c->eos);
        }
    }
    return 0;
}

/* A turn; a tool result is an "ipython" turn, a tool call's text is not trimmed. */
static void llama3_turn(const render_ctx *c, int i)
{
    put(c->s, "<|start_header_id|>");
    const cv_chat_role r = c->m[i].role;
    put(c->s, r == CV_CHAT_TOOL ? "ipython" : r == CV_CHAT_TOOL_CALL ? "assistant" : role(c, i));
    put(c->s, "<|end_header_id|>\n\n");
    put_sl(c->s, r >= CV_CHAT_TOOL ? content(c, i) : trim_ws(content(c, i)));
    put(c->s, "<|eot_id|>");
}

static int render_llama3(const render_ctx *c)
{
    put(c->s, c->bos);
    for (int i = 0; i < c->n; i++)
        llama3_turn(c, i);
    if (c->gen)
        put(c->s, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

static int render_llama31(const render_ctx *c)
{
    int from = c->m[0].role == CV_CHAT_SYSTEM ? 1 : 0;
    if (c->tools && from == c->n)
        return reject(c, "Cannot put tools in the first user message when there's no first user message!");
    put(c->s, c->bos);
    put(c->s, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (c->tools)
        put(c->s, "Environment: ipython\n");
    put(c->s, "Cutting Knowledge Date: December 2023\n");
    put(c->s, "Today Date: ");
    put(c->s, c->date);
    put(c->s, "\n\n");
    if (from == 1)
        put_sl(c->s, trim_ws(content(c, 0)));
    put(c->s, "<|eot_id|>");
    if (c->tools) {
        /* the tools go into the first message after the system one, as a user turn */
        put(c->s, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a "
                  "JSON for a function call with its proper arguments that best answers the given prompt.\n\n"
                  "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and "
                  "its value}.Do not use variables.\n\n");
        put(c->s, c->tools);
        put_sl(c->s, trim_ws(content(c, from++)));
        put(c->s, "<|eot_id|>");
    }
    for (int i = from; i < c->n; i++)
        llama3_turn(c, i);
    if (c->gen)
        put(c->s, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

static void chatml_turn(const render_ctx *c, int i)
{
    put(c->s, "<|im_start|>");
    put(c->s, role(c, i));
    put(c->s, "\n");
    put_sl(c->s, content(c, i));
    put(c->s, "<|im_end|>\n");
}

static int render_chatml(const render_ctx *c)
{
    for (int i = 0; i < c->n; i++)
        chatml_turn(c, i);
    if (c->gen)
        put(c->s, "<|im_start|>assistant\n");
    return 0;
}

static int render_qwen25(const render_ctx *c)
{
    put(c->s, "<|im_start|>system\n");
    put_sl(c->s, c->m[0].role == CV_CHAT_SYSTEM ? content(c, 0) : sl(QWEN25_DEFAULT_SYSTEM));
    put(c->s, "<|im_end|>\n");
    for (int i = 0; i < c->n; i++)
        if (!(i == 0 && c->m[i].role == CV_CHAT_SYSTEM))
            chatml_turn(c, i);
    if (c->gen)
        put(c->s, "<|im_start|>assistant\n");
    return 0;
}

/* Qwen3: an assistant message's text is split at "</think>" into its
 * reasoning and its answer; the reasoning is shown (in a <think> block)
 * only for the assistant turns after the last real user query. */
static int render_qwen3(const render_ctx *c)
{
    if (c->m[0].role == CV_CHAT_SYSTEM) {
        put(c->s, "<|im_start|>system\n");
        put_sl(c->s, content(c, 0));
        put(c->s, "<|im_end|>\n");
    }
    int last_query = c->n - 1;
    for (int i = c->n - 1; i >= 0; i--) {
        slice x = content(c, i);
        if (c->m[i].role == CV_CHAT_USER && !(starts_with(x, "<tool_response>") && ends_with(x, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < c->n; i++) {
        if (c->m[i].role != CV_CHAT_ASSISTANT) {
            if (i > 0 || c->m[i].role == CV_CHAT_USER)
                chatml_turn(c, i);
            continue;
        }
        slice text = content(c, i), answer = text, reasoning = {"", 0};
        const char *close_first = find_n(text, "</think>");
        if (close_first) {
            const char *close_last = find_last_n(text, "</think>");
            const char *after = close_last + strlen("</think>");
            answer = lstrip_nl((slice){after, (size_t)(text.p + text.n - after)});
            slice before = rstrip_nl((slice){text.p, (size_t)(close_first - text.p)});
            const char *open = find_last_n(before, "<think>");
            if (open) {
                const char *r = open + strlen("<think>");
                before = (slice){r, (size_t)(before.p + before.n - r)};
            }
            reasoning = lstrip_nl(before);
        }
        put(c->s, "<|im_start|>assistant\n");
        if (i > last_query && (i == c->n - 1 || reasoning.n > 0)) {
            put(c->s, "<think>\n");
            put_sl(c->s, rstrip_nl(lstrip_nl(reasoning)));
            put(c->s, "\n</think>\n\n");
            put_sl(c->s, lstrip_nl(answer));
        } else {
            put_sl(c->s, answer);
        }
        put(c->s, "<|im_end|>\n");
    }
    if (c->gen) {
        put(c->s, "<|im_start|>assistant\n");
        if (c->no_think)
            put(c->s, "<think>\n\n</think>\n\n");
    }
    return 0;
}

static int render_mistral(const render_ctx *c)
{
    int from = c->m[0].role == CV_CHAT_SYSTEM ? 1 : 0;
    if (!alternates(c, from))
        return reject(c, "After the optional system message, conversation roles must alternate "
                        "user/assistant/user/assistant/...");
    for (int i = from; i < c->n; i++)
        if (c->m[i].role == CV_CHAT_SYSTEM)
            return reject(c, "Only user and assistant roles are supported, with the exception of an initial "
                            "optional system message!");
    int last_user = -1;
    for (int i = from; i < c->n; i++)
        last_user = c->m[i].role == CV_CHAT_USER ? i : last_user;
    put(c->s, c->bos);
    for (int i = from; i < c->n; i++) {
        if (c->m[i].role == CV_CHAT_TOOL) {
            put(c->s, "[TOOL_RESULTS]");
            put_sl(c->s, content(c, i));
            put(c->s, "[/TOOL_RESULTS]");
        } else if (c->m[i].role == CV_CHAT_USER) {
            if (c->tools && i == last_user) {
                put(c->s, "[AVAILABLE_TOOLS]");
                put(c->s, c->tools);
                put(c->s, "[/AVAILABLE_TOOLS]");
            }
            put(c->s, "[INST]");
            if (i == c->n - 1 && from == 1) {
                put_sl(c->s, content(c, 0));
                put(c->s, "\n\n");
            }
            put_sl(c->s, content(c, i));
            put(c->s, "[/INST]");
        } else {
            put_sl(c->s, content(c, i));
            put(c->s, c->eos);
        }
    }
    return 0;
}

static int render_gemma(const render_ctx *c)
{
    if (c->m[0].role == CV_CHAT_SYSTEM)
        return reject(c, "System role not supported");
    if (!alternates(c, 0))
        return reject(c, ALTERNATE_MSG);
    put(c->s, c->bos);
    for (int i = 0; i < c->n; i++) {
        put(c->s, "<start_of_turn>");
        put(c->s, c->m[i].role == CV_CHAT_ASSISTANT ? "model" : role(c, i));
        put(c->s, "\n");
        put_sl(c->s, trim_ws(content(c, i)));
        put(c->s, "<end_of_turn>\n");
    }
    if (c->gen)
        put(c->s, "<start_of_turn>model\n");
    return 0;
}

static int render_phi3(const render_ctx *c)
{
    for (int i = 0; i < c->n; i++) {
        slice x = content(c, i);
        if (c->m[i].role == CV_CHAT_SYSTEM && x.n == 0)
            continue;
        put(c->s, "<|");
        put(c->s, role(c, i));
        put(c->s, "|>\n");
        put_sl(c->s, x);
        put(c->s, "<|end|>\n");
    }
    put(c->s, c->gen ? "<|assistant|>\n" : c->eos);
    return 0;
}

int cv_chat_render(cv_chat_kind k, const cv_chat_msg *msgs, int n, bool add_generation_prompt,
                   const char *bos_token, const char *eos_token, const cv_chat_opts *opts, char *out,
                   size_t cap, size_t *len, char *err, size_t errlen)
{
    *len = 0;
    if ((unsigned)k >= CV_CHAT_KIND_COUNT)
        return cv_errf(err, errlen, "unknown chat template kind %d", (int)k);
    if (n < 1 || !msgs)
        return cv_errf(err, errlen, "a chat needs at least one message");
    for (int i = 0; i < n; i++) {
        if ((unsigned)msgs[i].role > CV_CHAT_TOOL_CALL)
            return cv_errf(err, errlen, "message %d has an unknown role (%d)", i, (int)msgs[i].role);
        if (msgs[i].role >= CV_CHAT_TOOL && k != CV_CHAT_LLAMA31 && k != CV_CHAT_MISTRAL)
            return cv_errf(err, errlen, "message %d: the %s chat template renders no tool calls or results", i,
                           KIND_NAMES[k]);
    }
    sink s = {out, cap, 0, false};
    render_ctx c = {
        .s = &s,
        .m = msgs,
        .n = n,
        .gen = add_generation_prompt,
        .bos = bos_token ? bos_token : "",
        .eos = eos_token ? eos_token : "",
        .date = opts && opts->date_string ? opts->date_string : "26 Jul 2024",
        .no_think = opts && opts->disable_thinking,
        .tools = opts ? opts->tools : NULL,
        .name = KIND_NAMES[k],
        .err = err,
        .errlen = errlen,
    };
    int rc = 0;
    switch (k) {
    case CV_CHAT_LLAMA2: rc = render_llama2(&c); break;
    case CV_CHAT_LLAMA3: rc = render_llama3(&c); break;
    case CV_CHAT_LLAMA31: rc = render_llama31(&c); break;
    case CV_CHAT_CHATML: rc = render_chatml(&c); break;
    case CV_CHAT_QWEN25: rc = render_qwen25(&c); break;
    case CV_CHAT_QWEN3: rc = render_qwen3(&c); break;
    case CV_CHAT_MISTRAL: rc = render_mistral(&c); break;
    case CV_CHAT_GEMMA: rc = render_gemma(&c); break;
    case CV_CHAT_PHI3: rc = render_phi3(&c); break;
    case CV_CHAT_KIND_COUNT: break;
    }
    if (rc != 0)
        return rc;
    if (s.overflow)
        return cv_errf(err, errlen, "rendered chat prompt is too long");
    *len = s.len;
    if (!out && cap == 0)
        return 0;
    if (!out || s.len >= cap)
        return cv_errf(err, errlen, "rendered chat prompt needs %zu bytes, the buffer holds %zu", s.len + 1, cap);
    out[s.len] = '\0';
    return 0;
}

/* ---- end-of-turn texts ---- */

static const char *const STOP_LLAMA2[] = {"</s>", NULL};
static const char *const STOP_LLAMA3[] = {"<|eot_id|>", NULL};
static const char *const STOP_LLAMA31[] = {"<|eot_id|>", "<|eom_id|>", NULL};
static const char *const STOP_CHATML[] = {"<|im_end|>", NULL};
static const char *const STOP_GEMMA[] = {"<end_of_turn>", NULL};
static const char *const STOP_PHI3[] = {"<|end|>", "<|endoftext|>", NULL};

const char *const *cv_chat_stop_strings(cv_chat_kind k)
{
    switch (k) {
    case CV_CHAT_LLAMA2:
    case CV_CHAT_MISTRAL: return STOP_LLAMA2;
    case CV_CHAT_LLAMA3: return STOP_LLAMA3;
    case CV_CHAT_LLAMA31: return STOP_LLAMA31;
    case CV_CHAT_CHATML:
    case CV_CHAT_QWEN25:
    case CV_CHAT_QWEN3: return STOP_CHATML;
    case CV_CHAT_GEMMA: return STOP_GEMMA;
    case CV_CHAT_PHI3: return STOP_PHI3;
    case CV_CHAT_KIND_COUNT: break;
    }
    return NULL;
}
