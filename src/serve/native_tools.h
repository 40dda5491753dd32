/* native_tools.h: tools, tool calls and tool results in a conversation
 * rendered by a built-in chat family (model/chat.h), which renders plain
 * system, user and assistant messages only.
 *
 * Contract: sv_native_tool_format names the call format a family's
 * reference template teaches: Hermes for chatml, qwen2.5 and qwen3 (as
 * Qwen2.5's and Qwen3's templates write tools); SV_TOOLS_NONE for the
 * families that render no tools (the server refuses tools with them).
 *
 * sv_native_tool_msgs rewrites a conversation into the plain messages
 * whose native render is what the family's reference template writes for
 * the conversation with its tools: the tools in the system message
 * ("# Tools" and the <tools></tools> list, each tool as JSON, then the
 * <tool_call> instructions; qwen2.5's default system prompt when none is
 * given), an assistant message's tool_calls after its content as
 * <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> (arguments
 * as a JSON object: a string that holds one is written as that object;
 * qwen3 writes a string as it is), and each run of tool messages as one
 * user message of <tool_response> blocks. contents[i] stands for message
 * i's content (the text, or the marker render.c puts in its place; an
 * empty message content is left out as the template leaves it out). tools
 * may be NULL (history with calls and results only). out's messages point
 * into its texts; release with sv_native_chat_free. Returns 0, or -1 with
 * a message (out of memory, a tool call without a name). */
#ifndef CONVOY_SERVE_NATIVE_TOOLS_H
#define CONVOY_SERVE_NATIVE_TOOLS_H

#include <stdbool.h>

#include <jansson.h>

#include "model/chat.h"
#include "serve/buf.h"
#include "serve/tools.h"

typedef struct sv_native_chat {
    cv_chat_msg *msgs;
    sv_buf *texts;
    int n;
    sv_buf tools; /* cv_chat_opts.tools (llama3.1, mistral), empty when not needed */
} sv_native_chat;

/* One message of the conversation: its role and the request's message
 * (for tool_calls; may be NULL). */
typedef struct sv_native_msg {
    const char *role;
    const char *content; /* what the content stands for, or the marker in its place */
    bool empty;          /* the message's own content is empty */
    const json_t *json;
} sv_native_msg;

sv_tool_format sv_native_tool_format(cv_chat_kind k);
/* Whether the conversation needs the rewrite: tools, a tool message, or tool_calls. */
bool sv_native_tools_needed(const sv_native_msg *msgs, int n, const json_t *tools);
int sv_native_tool_msgs(cv_chat_kind k, const sv_native_msg *msgs, int n, const json_t *tools, sv_native_chat *out,
                        char *err, size_t errlen);
void sv_native_chat_free(sv_native_chat *c);

#endif
