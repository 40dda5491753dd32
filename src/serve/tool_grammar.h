/* tool_grammar.h: tool_choice read, and a forced tool call held to a GBNF
 * grammar in the model's own call format.
 *
 * Contract: cv_tool_choice_read checks a chat request's tools (a list of
 * {"type": "function", "function": {"name", "description", "parameters"}})
 * and its tool_choice: absent, "auto", "none", "required", or a named
 * function, {"type": "function", "function": {"name": X}} (chat) or
 * {"type": "function", "name": X} (the Responses API). A tool without a
 * string name, or a named function that is not among the tools, fails
 * with a message naming it; out->name then points into choice.
 *
 * cv_tool_grammar builds the grammar that forces a call: of the function
 * named (name not NULL) or of any of the tools, in format f:
 *   Hermes   <tool_call>\n{"name": "X", "arguments": {...}}\n</tool_call>,
 *            several separated by "\n" when parallel
 *   Mistral  [TOOL_CALLS][{"name": "X", "arguments": {...}}, ...]
 *            (one element unless parallel)
 *   Llama 3  {"name": "X", "parameters": {...}} (always one)
 * from the answer's first byte (no text, and no <think> block, before the
 * call).
 * Each call's arguments follow its function's "parameters" JSON schema
 * (absent: any object; with "properties" and no "additionalProperties",
 * only the properties listed, as llama.cpp holds calls; "#..." $refs
 * within it keep pointing into it), compiled by
 * serve/schema.h (its JSON shape: one optional space after ':' and ','),
 * so cv_tools_parse reads every
 * sentence back as calls of the tools with valid arguments. Markers are
 * matched as text: a vocabulary where `<tool_call>` is a plain or
 * user-defined token lets the model write it as one token; one where it
 * is a control token (whose piece is empty, always masked by a grammar)
 * has it spelled in text pieces, which the server's text shows and
 * cv_tools_parse reads. Returns the NUL-terminated grammar (release with
 * cv_free), or NULL with a message in err: CV_TOOLS_NONE, a parameters
 * schema the grammar cannot hold output to (naming the tool and why), out
 * of memory. */
#ifndef CONVOY_SERVE_TOOL_GRAMMAR_H
#define CONVOY_SERVE_TOOL_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "serve/tools.h"

typedef enum cv_tool_mode { CV_TOOL_AUTO, CV_TOOL_NONE, CV_TOOL_REQUIRED, CV_TOOL_NAMED } cv_tool_mode;

typedef struct cv_tool_choice {
    cv_tool_mode mode;
    const char *name; /* CV_TOOL_NAMED: the function */
} cv_tool_choice;

int cv_tool_choice_read(const json_t *tools, const json_t *choice, cv_tool_choice *out, char *err, size_t errlen);
char *cv_tool_grammar(cv_tool_format f, const json_t *tools, const char *name, bool parallel, char *err,
                      size_t errlen);

#endif
