/* tools.h: tool calls read back out of a model's generated text.
 *
 * Contract: cv_tools_detect names the format a chat template teaches its
 * model, from the template's text: Hermes/Qwen (`<tool_call>` JSON
 * `</tool_call>`, one or more, text around them), Mistral (`[TOOL_CALLS]`
 * then a JSON array of calls, text before it) or Llama 3.x (the whole
 * output one JSON object {"name", "parameters"}, optionally after
 * `<|python_tag|>`); CV_TOOLS_NONE when it recognizes none (then nothing
 * is parsed).
 *
 * cv_tools_parse splits text into content (the text outside the calls;
 * Hermes: whitespace alone after a call, the calls' separator, is left
 * out) and calls {id "call_" and 24 characters drawn from seed, name,
 * arguments as a JSON text}. A call's "arguments" (Llama: "parameters")
 * may be an object or a string holding JSON; missing, it is "{}". A call
 * that does not parse (bad JSON, no string name, no closing marker) stays
 * in content as it was written: malformed output is text, never an error.
 * Returns 0, or -1 when out of memory (out then holds nothing).
 *
 * cv_tools_markers lists the strings that mark a format's calls, which a
 * vocabulary may hold as control tokens (Mistral's [TOOL_CALLS], Llama's
 * <|python_tag|>): the server shows those tokens as their text
 * (cv_text_show) so that the calls can be read back. NULL-terminated;
 * empty for CV_TOOLS_NONE.
 *
 * Streaming: cv_tools_safe gives how many leading bytes of the text so far
 * are content whatever comes next: those before the first place a call
 * starts or may start (a prefix of a start marker at the end; for Llama,
 * anything once the output opens with `{` or only whitespace so far). The
 * server sends those as content deltas and holds the rest; at the end
 * cv_tools_parse of the whole text gives content that begins with every
 * byte already sent, and the calls. */
#ifndef CONVOY_SERVE_TOOLS_H
#define CONVOY_SERVE_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "serve/buf.h"

typedef enum cv_tool_format { CV_TOOLS_NONE, CV_TOOLS_HERMES, CV_TOOLS_MISTRAL, CV_TOOLS_LLAMA3 } cv_tool_format;

typedef struct cv_tool_call {
    char id[32];
    char *name;      /* malloc'd, NUL-terminated */
    char *arguments; /* malloc'd JSON text */
} cv_tool_call;

typedef struct cv_tool_calls {
    cv_buf content;
    cv_tool_call *calls;
    int n;
} cv_tool_calls;

cv_tool_format cv_tools_detect(const char *template_text);
int cv_tools_parse(cv_tool_format f, const char *text, size_t len, uint64_t seed, cv_tool_calls *out);
size_t cv_tools_safe(cv_tool_format f, const char *text, size_t len);
const char *const *cv_tools_markers(cv_tool_format f);
void cv_tool_calls_free(cv_tool_calls *c);

#endif
