/* native_tools.h: tools, tool calls and tool results in a conversation
 * rendered by a built-in chat family (chat/chat.h), whose renderers take
 * plain messages and, for llama3.1 and mistral, tool texts the caller
 * writes.
 *
 * Contract: cv_native_tool_format names the call format a family's
 * reference template teaches: Hermes for chatml, qwen2.5 and qwen3 (as
 * Qwen2.5's and Qwen3's templates write tools), Llama 3 for llama3.1,
 * Mistral for mistral; CV_TOOLS_NONE for the families that render no
 * tools (the server refuses tools with them). cv_native_tools_needed says
 * whether a conversation needs the rewrite: tools, a tool message, or an
 * assistant message with tool_calls.
 *
 * cv_native_tool_msgs rewrites a conversation into the messages whose
 * native render (with out->tools as cv_chat_opts.tools) is what the
 * family's reference template writes for the conversation with its tools.
 * Hermes families (Qwen2.5's and Qwen3's templates): the tools in the
 * system message ("# Tools", the <tools></tools> list of each tool's JSON,
 * the <tool_call> instructions; qwen2.5's default system prompt when none
 * is given), an assistant message's tool_calls after its content as
 * <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, each run of
 * tool messages one user message of <tool_response> blocks. llama3.1:
 * out->tools each tool's indented JSON, a call {"name": ..., "parameters":
 * ...} (one per message, as the template demands), a result its content
 * as a JSON string. mistral: out->tools the [AVAILABLE_TOOLS] list, calls
 * [TOOL_CALLS][{"name", "arguments", "id"}, ...], a result {"content":
 * ..., "call_id": ...}. Arguments are written as the JSON object a string
 * holds (qwen3 writes a string as it is). A message's content is
 * msgs[i].content (the text, or the marker render.c puts in its place;
 * msgs[i].empty says whether the message's own content is empty, left out
 * where the template leaves it out). tools may be NULL (history with calls
 * and results only). out's messages point into its texts; release with
 * cv_native_chat_free. Returns 0, or -1 with a message (out of memory, a
 * tool call without a name, several calls in one llama3.1 message). */
#ifndef CONVOY_SERVE_NATIVE_TOOLS_H
#define CONVOY_SERVE_NATIVE_TOOLS_H

#include <stdbool.h>

#include <jansson.h>

#include "chat/chat.h"
#include "serve/buf.h"
#include "serve/tools.h"

typedef struct cv_native_chat {
    cv_chat_msg *msgs;
    cv_buf *texts;
    int n;
    cv_buf tools; /* cv_chat_opts.tools (llama3.1, mistral), empty when not needed */
} cv_native_chat;

/* One message of the conversation: its role and the request's message
 * (for tool_calls; may be NULL). */
typedef struct cv_native_msg {
    const char *role;
    const char *content; /* what the content stands for, or the marker in its place */
    bool empty;          /* the message's own content is empty */
    const json_t *json;
} cv_native_msg;

cv_tool_format cv_native_tool_format(cv_chat_kind k);
bool cv_native_tools_needed(const cv_native_msg *msgs, int n, const json_t *tools);
int cv_native_tool_msgs(cv_chat_kind k, const cv_native_msg *msgs, int n, const json_t *tools, cv_native_chat *out,
                        char *err, size_t errlen);
void cv_native_chat_free(cv_native_chat *c);

#endif
