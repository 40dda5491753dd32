/* tools.h: tool calls read back out of a model's generated text.
 *
 * Contract: sv_tools_detect names the format a chat template teaches its
 * model, from the template's text: Hermes/Qwen (`<tool_call>` JSON
 * `</tool_call>`, one or more, text around them), Mistral (`[TOOL_CALLS]`
 * then a JSON array of calls, text before it) or Llama 3.x (the whole
 * output one JSON object {"name", "parameters"}, optionally after
 * `<|python_tag|>`); SV_TOOLS_NONE when it recognizes none (then nothing
 * is parsed).
 *
 * sv_tools_parse splits text into content (the text outside the calls;
 * Hermes: whitespace alone after a call, the calls' separator, is left
 * out) and calls {id "call_" and 24 characters drawn from seed, name,
 * arguments as a JSON text}. A call's "arguments" (Llama: "parameters")
 * may be an object or a string holding JSON; missing, it is "{}". A call
 * that does not parse (bad JSON, no string name, no closing marker) stays
 * in content as it was written: malformed output is text, never an error.
 * Returns 0, or -1 when out of memory (out then holds nothing).
 *
 * Streaming: sv_tools_safe gives how many leading bytes of the text so far
 * are content whatever comes next: those before the first place a call
 * starts or may start (a prefix of a start marker at the end; for Llama,
 * anything once the output opens with `{` or only whitespace so far). The
 * server sends those as content deltas and holds the rest; at the end
 * sv_tools_parse of the whole text gives content that begins with every
 * byte already sent, and the calls. */
#ifndef CONVOY_SERVE_TOOLS_H
#define CONVOY_SERVE_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "serve/buf.h"

typedef enum sv_tool_format { SV_TOOLS_NONE, SV_TOOLS_HERMES, SV_TOOLS_MISTRAL, SV_TOOLS_LLAMA3 } sv_tool_format;

typedef struct sv_tool_call {
    char id[32];
    char *name;      /* malloc'd, NUL-terminated */
    char *arguments; /* malloc'd JSON text */
} sv_tool_call;

typedef struct sv_tool_calls {
    sv_buf content;
    sv_tool_call *calls;
    int n;
} sv_tool_calls;

sv_tool_format sv_tools_detect(const char *template_text);
int sv_tools_parse(sv_tool_format f, const char *text, size_t len, uint64_t seed, sv_tool_calls *out);
size_t sv_tools_safe(sv_tool_format f, const char *text, size_t len);
void sv_tool_calls_free(sv_tool_calls *c);

#endif
