/* test_serve_tools.c: tool calls parsed from canned model outputs
 * (serve/tools.h) in each format: one and several calls, text before and
 * after, arguments as an object or a string, malformed calls kept as
 * content; and streaming: for every split of each output, the bytes
 * cv_tools_safe lets out are a prefix of the final content and never
 * shrink, so streamed and whole answers agree. The forced call's grammar
 * (serve/tool_grammar.h) in each format: calls of the tools with valid
 * arguments are sentences and read back as those calls; another function
 * than the one named, an enum value outside the enum, a missing required
 * or an unlisted property, a second call when parallel_tool_calls is
 * false are not; $refs inside parameters still resolve; tool_choice read
 * in both APIs' shapes and refused by name. */
#include <string.h>

#include <jansson.h>

#include "core/alloc.h"
#include "infer/grammar.h"
#include "serve/tool_grammar.h"
#include "serve/tools.h"
#include "test.h"

typedef struct canned {
    cv_tool_format f;
    const char *text;
    const char *content;
    int n;
    const char *name0, *args0, *name1;
} canned;

static const canned cases[] = {
    {CV_TOOLS_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "", 1, "get_weather", "{\"city\":\"Paris\"}", NULL},
    {CV_TOOLS_HERMES,
     "Let me check.\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\","
     "\"arguments\":\"{\\\"x\\\":1}\"}</tool_call> done",
     "Let me check.\n done", 2, "a", "{}", "b"},
    {CV_TOOLS_HERMES, "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>",
     "<tool_call>{\"name\": \"a\", "
     "\"arguments\": {</tool_call>",
     0, NULL, NULL, NULL},
    {CV_TOOLS_HERMES, "x <tool_call>{\"name\":\"a\"}", "x <tool_call>{\"name\":\"a\"}", 0, NULL, NULL, NULL},
    {CV_TOOLS_HERMES, "<tool_call>{\"arguments\":{}}</tool_call>", "<tool_call>{\"arguments\":{}}</tool_call>", 0, NULL,
     NULL, NULL},
    {CV_TOOLS_HERMES, "just text < tool", "just text < tool", 0, NULL, NULL, NULL},
    {CV_TOOLS_MISTRAL,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", "
     "\"arguments\": {\"n\": [1, 2]}}]",
     "", 2, "get_weather", "{\"city\":\"Paris\"}", "b"},
    {CV_TOOLS_MISTRAL, "Sure. [TOOL_CALLS] [{\"name\":\"a\",\"arguments\":{\"q\":\"\xc3\xa9t\xc3\xa9\"}}]", "Sure. ", 1,
     "a", "{\"q\":\"\xc3\xa9t\xc3\xa9\"}", NULL},
    {CV_TOOLS_MISTRAL, "[TOOL_CALLS][{\"name\":\"a\",", "[TOOL_CALLS][{\"name\":\"a\",", 0, NULL, NULL, NULL},
    {CV_TOOLS_MISTRAL, "[TOOL_CALLS][]", "[TOOL_CALLS][]", 0, NULL, NULL, NULL},
    {CV_TOOLS_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", 1, "get_weather",
     "{\"city\":\"Paris\"}", NULL},
    {CV_TOOLS_LLAMA3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}", "", 1, "a", "{}", NULL},
    {CV_TOOLS_LLAMA3, " \n{\"name\": \"a\"}\n", "", 1, "a", "{}", NULL},
    {CV_TOOLS_LLAMA3, "{\"name\": \"a\", \"parameters\": {}} and more",
     "{\"name\": \"a\", \"parameters\": {}} and more", 0, NULL, NULL, NULL},
    {CV_TOOLS_LLAMA3, "The answer is {\"name\": \"a\"}", "The answer is {\"name\": \"a\"}", 0, NULL, NULL, NULL},
    {CV_TOOLS_LLAMA3, "{not json", "{not json", 0, NULL, NULL, NULL},
    {CV_TOOLS_NONE, "<tool_call>{\"name\":\"a\"}</tool_call>", "<tool_call>{\"name\":\"a\"}</tool_call>", 0, NULL, NULL,
     NULL},
};

static void test_parse(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const canned *c = &cases[k];
        cv_tool_calls out;
        CHECK(cv_tools_parse(c->f, c->text, strlen(c->text), 7, &out) == 0);
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
        cv_tool_calls_free(&out);
    }
}

static void test_stream(void)
{
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const canned *c = &cases[k];
        const size_t len = strlen(c->text), want = strlen(c->content);
        size_t sent = 0;
        for (size_t cut = 0; cut <= len; cut++) {
            const size_t safe = cv_tools_safe(c->f, c->text, cut);
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
    CHECK(cv_tools_detect("{% for t in tools %}<tool_call>{{ t }}</tool_call>{% endfor %}") == CV_TOOLS_HERMES);
    CHECK(cv_tools_detect("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]") == CV_TOOLS_MISTRAL);
    CHECK(cv_tools_detect("<|start_header_id|>ipython<|end_header_id|><|python_tag|>") == CV_TOOLS_LLAMA3);
    CHECK(cv_tools_detect("{{ messages }}") == CV_TOOLS_NONE);
    CHECK(cv_tools_detect(NULL) == CV_TOOLS_NONE);
}

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"c\", "
    "\"f\"]}, \"days\": {\"type\": \"number\"}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"root\", \"parameters\": {\"properties\": "
    "{\"tool-call\": {\"type\": \"integer\"}, \"root\": {\"type\": \"boolean\"}}}}}]";

/* Whether grammar g takes text whole. */
static bool sentence(const char *g, const char *text)
{
    char err[256];
    cv_grammar *gr = cv_grammar_parse(g, strlen(g), err, sizeof err);
    CHECKF(gr != NULL, "%s\n%s", err, g);
    cv_grammar_state *st = gr ? cv_grammar_state_create(gr) : NULL;
    const bool ok = st && cv_grammar_accept(st, text, strlen(text)) == 0 && cv_grammar_complete(st);
    cv_grammar_state_free(st);
    cv_grammar_free(gr);
    return ok;
}

typedef struct forced {
    cv_tool_format f;
    const char *name; /* the function named, or NULL */
    bool parallel;
    const char *text;
    int n;                      /* calls read back; -1: not a sentence */
    const char *name0, *args0;
} forced;

static const forced forced_cases[] = {
    {CV_TOOLS_HERMES, NULL, true,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\", "
     "\"days\": 2.5}}\n</tool_call>", 1, "get_weather", "{\"city\":\"Paris\",\"unit\":\"c\",\"days\":2.5}"},
    {CV_TOOLS_HERMES, NULL, true,
     "<tool_call>\n{\"name\":\"root\",\"arguments\":{\"tool-call\":3,\"root\":true}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n</tool_call>",
     2, "root", "{\"tool-call\":3,\"root\":true}"},
    {CV_TOOLS_HERMES, NULL, false,
     "<tool_call>\n{\"name\":\"root\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\":\"root\","
     "\"arguments\":{}}\n</tool_call>", -1, NULL, NULL},
    {CV_TOOLS_HERMES, "root", true, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}"
     "\n</tool_call>", -1, NULL, NULL},
    {CV_TOOLS_HERMES, NULL, true, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\", "
     "\"unit\": \"k\"}}\n</tool_call>", -1, NULL, NULL},
    {CV_TOOLS_HERMES, NULL, true, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}"
     "\n</tool_call>", -1, NULL, NULL},
    {CV_TOOLS_HERMES, NULL, true, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\", "
     "\"country\": \"y\"}}\n</tool_call>", -1, NULL, NULL},
    {CV_TOOLS_HERMES, NULL, true, "Sure. <tool_call>\n{\"name\": \"root\", \"arguments\": {}}\n</tool_call>", -1,
     NULL, NULL},
    {CV_TOOLS_MISTRAL, NULL, true,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"root\", "
     "\"arguments\": {}}]", 2, "get_weather", "{\"city\":\"Rome\"}"},
    {CV_TOOLS_MISTRAL, "get_weather", false,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": -1}}]", 1,
     "get_weather", "{\"city\":\"Rome\",\"days\":-1}"},
    {CV_TOOLS_MISTRAL, NULL, false,
     "[TOOL_CALLS][{\"name\": \"root\", \"arguments\": {}}, {\"name\": \"root\", \"arguments\": {}}]", -1, NULL,
     NULL},
    {CV_TOOLS_MISTRAL, NULL, true, "[TOOL_CALLS][]", -1, NULL, NULL},
    {CV_TOOLS_LLAMA3, "get_weather", true, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"\u00e9\"}}", 1,
     "get_weather", "{\"city\":\"\xc3\xa9\"}"},
    {CV_TOOLS_LLAMA3, NULL, true, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}", -1, NULL,
     NULL},
};

static void test_forced(void)
{
    json_t *tools = json_loads(TOOLS, 0, NULL);
    CHECK(tools != NULL);
    for (size_t k = 0; k < sizeof forced_cases / sizeof forced_cases[0]; k++) {
        const forced *c = &forced_cases[k];
        char err[256];
        char *g = cv_tool_grammar(c->f, tools, c->name, c->parallel, err, sizeof err);
        CHECKF(g != NULL, "case %zu: %s", k, err);
        if (!g)
            continue;
        CHECKF(sentence(g, c->text) == (c->n >= 0), "case %zu: %s\n%s", k, c->text, g);
        cv_tool_calls out;
        CHECK(cv_tools_parse(c->f, c->text, strlen(c->text), 1, &out) == 0);
        if (c->n >= 0) {
            CHECKF(out.n == c->n && out.content.n == 0, "case %zu: %d calls, content '%s'", k, out.n, out.content.p);
            CHECKF(out.n > 0 && !strcmp(out.calls[0].name, c->name0) && !strcmp(out.calls[0].arguments, c->args0),
                   "case %zu: %s", k, out.n ? out.calls[0].arguments : "");
        }
        cv_tool_calls_free(&out);
        cv_free(g);
    }
    char err[256];
    CHECK(!cv_tool_grammar(CV_TOOLS_NONE, tools, NULL, true, err, sizeof err) && strstr(err, "not recognized"));
    /* $refs inside parameters point at their place in the whole calls' schema */
    json_t *refs = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                              "{\"$defs\": {\"u\": {\"enum\": [\"c\", \"f\"]}}, \"properties\": {\"u\": "
                              "{\"$ref\": \"#/$defs/u\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": "
                              "\"g\"}}]", 0, NULL);
    for (int f = CV_TOOLS_HERMES; f <= CV_TOOLS_LLAMA3; f++) {
        char *g = cv_tool_grammar((cv_tool_format)f, refs, NULL, false, err, sizeof err);
        CHECKF(g != NULL, "format %d: %s", f, err);
        const char *ok[] = {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"u\": \"f\"}}\n</tool_call>",
                            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"u\": \"c\"}}]",
                            "{\"name\": \"g\", \"parameters\": {\"any\": [1]}}"};
        CHECKF(g && sentence(g, ok[f - CV_TOOLS_HERMES]), "format %d", f);
        CHECKF(g && !sentence(g, f == CV_TOOLS_LLAMA3 ? "{\"name\": \"f\", \"parameters\": {\"u\": \"k\"}}"
                                                       : ok[f - CV_TOOLS_HERMES] + 1),
               "format %d", f);
        cv_free(g);
    }
    json_decref(refs);
    json_t *bad = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                             "{\"type\": \"object\", \"not\": {}}}}]", 0, NULL);
    CHECK(!cv_tool_grammar(CV_TOOLS_HERMES, bad, NULL, true, err, sizeof err) && strstr(err, "tools[0] (f)"));
    json_decref(bad);
    json_decref(tools);
}

/* tool_choice's text read against TOOLS: 0 with the mode and name, or -1 with err holding want. */
static void choice_case(const char *choice, int rc, cv_tool_mode mode, const char *name, const char *want)
{
    json_t *tools = json_loads(TOOLS, 0, NULL), *c = choice ? json_loads(choice, JSON_DECODE_ANY, NULL) : NULL;
    cv_tool_choice out;
    char err[256] = "";
    CHECKF(cv_tool_choice_read(tools, c, &out, err, sizeof err) == rc, "%s: %s", choice, err);
    if (rc == 0)
        CHECKF(out.mode == mode && (!name || (out.name && !strcmp(out.name, name))), "%s", choice);
    else
        CHECKF(strstr(err, want), "%s: %s", choice, err);
    json_decref(c);
    json_decref(tools);
}

static void test_choice(void)
{
    choice_case(NULL, 0, CV_TOOL_AUTO, NULL, NULL);
    choice_case("\"auto\"", 0, CV_TOOL_AUTO, NULL, NULL);
    choice_case("\"none\"", 0, CV_TOOL_NONE, NULL, NULL);
    choice_case("\"required\"", 0, CV_TOOL_REQUIRED, NULL, NULL);
    choice_case("{\"type\": \"function\", \"function\": {\"name\": \"root\"}}", 0, CV_TOOL_NAMED, "root", NULL);
    choice_case("{\"type\": \"function\", \"name\": \"get_weather\"}", 0, CV_TOOL_NAMED, "get_weather", NULL);
    choice_case("{\"type\": \"function\", \"function\": {\"name\": \"nope\"}}", -1, 0, NULL, "'nope'");
    choice_case("\"always\"", -1, 0, NULL, "'tool_choice' must be");
    choice_case("{\"type\": \"web_search\"}", -1, 0, NULL, "'tool_choice' must be");
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {}}]", 0, NULL);
    cv_tool_choice out;
    char err[256];
    CHECK(cv_tool_choice_read(tools, NULL, &out, err, sizeof err) == -1 && strstr(err, "tools[0]"));
    json_decref(tools);
}

int main(void)
{
    TEST_RUN(test_parse);
    TEST_RUN(test_stream);
    TEST_RUN(test_detect);
    TEST_RUN(test_forced);
    TEST_RUN(test_choice);
    return test_summary();
}
