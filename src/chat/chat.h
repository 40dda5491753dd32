/* chat.h: chat prompts rendered natively (no Jinja engine) for the chat
 * template families convoy knows.
 *
 * Contract. cv_chat_detect recognizes a model's tokenizer.chat_template by
 * distinctive substrings (as llama.cpp's llm_chat_detect_template does) and
 * names the rendering that reproduces it. The text is the caller's (serve
 * passes the GGUF's, convoy_model_chat_template): chat/ reads no model file.
 *
 *   name       kind             reproduces (the Hugging Face template of)
 *   llama2     CV_CHAT_LLAMA2   Llama-2-chat: <s>[INST] <<SYS>>\n..\n<</SYS>>\n\n.. [/INST]
 *   llama3     CV_CHAT_LLAMA3   Meta-Llama-3-Instruct: <|start_header_id|>role<|end_header_id|>
 *   llama3.1   CV_CHAT_LLAMA31  Llama 3.1 / 3.2 / 3.3 Instruct: the same with the
 *                               "Cutting Knowledge Date ... Today Date" system block
 *   chatml     CV_CHAT_CHATML   plain ChatML: <|im_start|>role\n..<|im_end|>\n
 *   qwen2.5    CV_CHAT_QWEN25   Qwen2.5-Instruct: ChatML with its default system prompt
 *   qwen3      CV_CHAT_QWEN3    Qwen3: ChatML with <think> blocks and enable_thinking
 *   mistral    CV_CHAT_MISTRAL  Mistral-Nemo-Instruct-2407 ("v3 Tekken"): [INST]..[/INST]
 *   gemma      CV_CHAT_GEMMA    Gemma 2 it: <start_of_turn>user|model\n..<end_of_turn>\n
 *   phi3       CV_CHAT_PHI3     Phi-3 / Phi-3.5-mini-instruct: <|user|>\n..<|end|>\n
 *
 * The output is byte for byte what the model's own template gives in a
 * Python Jinja environment (as Hugging Face transformers renders it) for the
 * same messages, add_generation_prompt, bos_token, eos_token, date_string
 * and enable_thinking, including the conversations a template rejects with
 * raise_exception (Gemma: a system message, or roles that do not alternate;
 * Llama 2 and Mistral: roles that do not alternate): cv_chat_render then
 * fails with the template's own message. Whitespace trimming (Jinja's
 * |trim and str.strip) follows Python: it removes the Unicode whitespace
 * that Python's str.isspace() accepts.
 *
 * Scope: messages are plain strings with the roles system, user and
 * assistant. Tools are placed where Llama 3.1's and Mistral Nemo's
 * templates place them, as texts the caller writes from the JSON
 * (cv_chat_opts.tools), with their tool results (CV_CHAT_TOOL) and
 * assistant messages that are tool calls (CV_CHAT_TOOL_CALL, the calls
 * written by the caller), which the templates' alternation checks skip;
 * other families refuse both roles (a caller writes their tools into
 * plain messages). Qwen3's
 * reasoning_content field and multimodal content lists are not rendered;
 * the caller rejects such requests. Templates of other families, or of
 * variants these renderings would get wrong (Phi-4's <|im_sep|>, Mistral v7
 * [SYSTEM_PROMPT], Mistral v1-v3 "[INST] " with spaces), are refused by
 * cv_chat_detect with a message that names what was found; the user may
 * then pick a rendering with --chat-template NAME (cv_chat_kind_from_name).
 *
 * Errors: functions that can fail return 0 or -1 with a message in err. */
#ifndef CONVOY_CHAT_CHAT_H
#define CONVOY_CHAT_CHAT_H

#include <stdbool.h>
#include <stddef.h>

typedef enum cv_chat_kind {
    CV_CHAT_LLAMA2,
    CV_CHAT_LLAMA3,
    CV_CHAT_LLAMA31,
    CV_CHAT_CHATML,
    CV_CHAT_QWEN25,
    CV_CHAT_QWEN3,
    CV_CHAT_MISTRAL,
    CV_CHAT_GEMMA,
    CV_CHAT_PHI3,
    CV_CHAT_KIND_COUNT
} cv_chat_kind;

typedef enum cv_chat_role {
    CV_CHAT_SYSTEM,
    CV_CHAT_USER,
    CV_CHAT_ASSISTANT,
    CV_CHAT_TOOL,     /* a tool's result: llama3.1 (an "ipython" turn) and mistral ([TOOL_RESULTS]) only */
    CV_CHAT_TOOL_CALL /* an assistant message that is tool calls, as the family writes them (llama3.1:
                         {"name": ..., "parameters": ...}; mistral: [TOOL_CALLS][...]): llama3.1 and mistral only */
} cv_chat_role;

/* One message. content is NUL-terminated UTF-8; NULL counts as "". */
typedef struct cv_chat_msg {
    cv_chat_role role;
    const char *content;
} cv_chat_msg;

/* Template variables besides the messages. A zeroed struct (or NULL) means
 * the templates' defaults. */
typedef struct cv_chat_opts {
    /* Llama 3.1+: the "Today Date: " line, e.g. "26 Jul 2024" (the Llama
     * 3.1 template's default, used when NULL). Llama 3.2's template asks
     * strftime_now("%d %b %Y"): a caller that wants today's date passes it. */
    const char *date_string;
    /* Qwen3: true renders enable_thinking=false (an empty <think></think>
     * after the generation prompt); false leaves enable_thinking undefined,
     * which the template treats as thinking on. */
    bool disable_thinking;
    /* The tools, or NULL for none: llama3.1: each tool's JSON (Python's
     * json.dumps indent=4) followed by "\n\n", written with the template's
     * instructions into the first message after the system one (then a
     * user turn; the system turn gets "Environment: ipython"); mistral: the
     * list written between [AVAILABLE_TOOLS] and [/AVAILABLE_TOOLS] before
     * the last user message. Other families ignore it. */
    const char *tools;
} cv_chat_opts;

/* Name ("llama3.1") of a kind; "?" outside the enum. */
const char *cv_chat_kind_name(cv_chat_kind k);

/* The kind of a --chat-template NAME (see the table above), or -1. */
int cv_chat_kind_from_name(const char *name);

/* The list of names, comma-separated, for messages and --help. */
const char *cv_chat_kind_names(void);

/* Role of an OpenAI message role string ("system", "user", "assistant"),
 * or -1 for anything else ("tool", "developer", ...). */
int cv_chat_role_from_name(const char *name);

/* The system prompt kind k writes when a chat has none (qwen2.5's), or NULL. */
const char *cv_chat_default_system(cv_chat_kind k);

/* Recognizes a template text. Fails for NULL, an empty text or an
 * unrecognized one, naming the family found (if known) and quoting the
 * template's start. */
int cv_chat_detect(const char *tmpl, cv_chat_kind *out, char *err, size_t errlen);

/* Renders n messages into out (cap bytes, NUL-terminated on success) and
 * sets *len to the rendered length without the NUL. bos_token and
 * eos_token are the model's texts of those tokens ("<s>", "</s>",
 * "<|begin_of_text|>", ...), written where the template writes them; NULL
 * counts as "". If the text does not fit in cap bytes (cap must exceed
 * *len), it fails and *len still tells the length; with out NULL and cap 0
 * it only measures and succeeds. Fails (with the template's message where
 * the template raises one) for n < 1, a role outside the enum, or a
 * conversation the template rejects. */
int cv_chat_render(cv_chat_kind k, const cv_chat_msg *msgs, int n, bool add_generation_prompt,
                   const char *bos_token, const char *eos_token, const cv_chat_opts *opts, char *out,
                   size_t cap, size_t *len, char *err, size_t errlen);

/* The texts that end an assistant turn of kind k (NULL-terminated list; the
 * first is the one the template writes after an assistant message, e.g.
 * "<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "</s>"). The
 * server stops generation on the tokens with these texts, besides EOS.
 * NULL outside the enum. */
const char *const *cv_chat_stop_strings(cv_chat_kind k);

#endif
