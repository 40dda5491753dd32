/* test_serve_tools.c: tool calls parsed from canned model outputs
 * (serve/tools.h) in each format: one and several calls, text before and
 * after, arguments as an object or a string, malformed calls kept as
 * content; and streaming: for every split of each output, the bytes
 * sv_tools_safe lets out are a prefix of the final content and never
 * shrink, so streamed and whole answers agree. */
#include <string.h>

#include "serve/tools.h"
#include "test.h"

typedef struct canned {
    sv_tool_format f;
    const char *text;
    const char *content;
    int n;
    const char *name0, *args0, *name1;
} canned;

static const canned cases[] = {
    {SV_TOOLS_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "", 1, "get_weather", "{\"city\":\"Paris\"}", NULL},
    {SV_TOOLS_HERMES,
     "Let me check.\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\","
     "\"arguments\":\"{\\\"x\\\":1}\"}</tool_call> done",
     "Let me check.\n\n done", 2, "a", "{}", "b"},
    {SV_TOOLS_HERMES, "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>", "<tool_call>{\"name\": \"a\", "
                                                                                  "\"arguments\": {</tool_call>",
     0, NULL, NULL, NULL},
    {SV_TOOLS_HERMES, "x <tool_call>{\"name\":\"a\"}", "x <tool_call>{\"name\":\"a\"}", 0, NULL, NULL, NULL},
    {SV_TOOLS_HERMES, "<tool_call>{\"arguments\":{}}</tool_call>", "<tool_call>{\"arguments\":{}}</tool_call>", 0, NULL,
     NULL, NULL},
    {SV_TOOLS_HERMES, "just text < tool", "just text < tool", 0, NULL, NULL, NULL},
    {SV_TOOLS_MISTRAL,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", "
     "\"arguments\": {\"n\": [1, 2]}}]",
     "", 2, "get_weather", "{\"city\":\"Paris\"}", "b"},
    {SV_TOOLS_MISTRAL, "Sure. [TOOL_CALLS] [{\"name\":\"a\",\"arguments\":{\"q\":\"\xc3\xa9t\xc3\xa9\"}}]", "Sure. ", 1,
     "a", "{\"q\":\"\xc3\xa9t\xc3\xa9\"}", NULL},
    {SV_TOOLS_MISTRAL, "[TOOL_CALLS][{\"name\":\"a\",", "[TOOL_CALLS][{\"name\":\"a\",", 0, NULL, NULL, NULL},
    {SV_TOOLS_MISTRAL, "[TOOL_CALLS][]", "[TOOL_CALLS][]", 0, NULL, NULL, NULL},
    {SV_TOOLS_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", 1, "get_weather",
     "{\"city\":\"Paris\"}", NULL},
    {SV_TOOLS_LLAMA3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}", "", 1, "a", "{}", NULL},
    {SV_TOOLS_LLAMA3, " \n{\"name\": \"a\"}\n", "", 1, "a", "{}", NULL},
    {SV_TOOLS_LLAMA3, "{\"name\": \"a\", \"parameters\": {}} and more", "{\"name\": \"a\", \"parameters\": {}} and more",
     0, NULL, NULL, NULL},
    {SV_TOOLS_LLAMA3, "The answer is {\"name\": \"a\"}", "The answer is {\"name\": \"a\"}", 0, NULL, NULL, NULL},
    {SV_TOOLS_LLAMA3, "{not json", "{not json", 0, NULL, NULL, NULL},
    {SV_TOOLS_NONE, "<tool_call>{\"name\":\"a\"}</tool_call>", "<tool_call>{\"name\":\"a\"}</tool_call>", 0, NULL,
     NULL, NULL},
};

static void test_parse(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const canned *c = &cases[k];
        sv_tool_calls out;
        CHECK(sv_tools_parse(c->f, c->text, strlen(c->text), 7, &out) == 0);
        CHECKF(out.n == c->n, "case %zu: %d calls", k, out.n);
        CHECKF(!strcmp(out.content.p, c->content), "case %zu: content '%s'", k, out.content.p);
        if (c->n > 0) {
            CHECK(!strcmp(out.calls[0].name, c->name0));
            CHECKF(!strcmp(out.calls[0].arguments, c->args0), "case %zu: args %s", k, out.calls[0].arguments);
            CHECK(!strncmp(out.calls[0].id, "call_", 5) && strlen(out.calls[0].id) == 29);
        }
        if (c->n > 1) {
            CHECK(!strcmp(out.calls[1].name, c->name1));
            CHECK(strcmp(out.calls[0].id, out.calls[1].id));
        }
        sv_tool_calls_free(&out);
    }
}

static void test_stream(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const canned *c = &cases[k];
        const size_t len = strlen(c->text), want = strlen(c->content);
        size_t sent = 0;
        for (size_t cut = 0; cut <= len; cut++) {
            const size_t safe = sv_tools_safe(c->f, c->text, cut);
            CHECKF(safe <= cut && safe <= want && !memcmp(c->text, c->content, safe), "case %zu cut %zu", k, cut);
            if (safe > sent)
                sent = safe;
        }
        if (!strcmp(c->text, "just text < tool"))
            CHECKF(sent == len, "case %zu: plain text held back (%zu of %zu)", k, sent, len);
    }
}

static void test_detect(void)
{
    CHECK(sv_tools_detect("{% for t in tools %}<tool_call>{{ t }}</tool_call>{% endfor %}") == SV_TOOLS_HERMES);
    CHECK(sv_tools_detect("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]") == SV_TOOLS_MISTRAL);
    CHECK(sv_tools_detect("<|start_header_id|>ipython<|end_header_id|><|python_tag|>") == SV_TOOLS_LLAMA3);
    CHECK(sv_tools_detect("{{ messages }}") == SV_TOOLS_NONE);
    CHECK(sv_tools_detect(NULL) == SV_TOOLS_NONE);
}

int main(void)
{
    TEST_RUN(test_parse);
    TEST_RUN(test_stream);
    TEST_RUN(test_detect);
    return test_summary();
}
