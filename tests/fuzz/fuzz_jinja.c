/* fuzz_jinja.c: libFuzzer target for the Jinja engine (src/chat/jinja.h).
 *
 * The input is a template. It must parse or be refused with a message that
 * names a line (or the template's size); a parsed template is rendered
 * twice with a small chat context (messages with a tool call, tools, the
 * usual variables) under tight bounds, and both renders must agree: the
 * same verdict, the same text (NUL-terminated at its length) or the same
 * message, which names a line; the renders share a pool of 4 MiB beyond
 * their own MiB (jinja.h), which holds nothing once each has ended, and
 * comparisons count as steps, so that no input takes more than the
 * fuzzer's -timeout. AddressSanitizer and UBSan watch every
 * byte. Seeds: the real templates (../shared/reference/chat-templates);
 * tests/fuzz/jinja.dict holds the language's tokens. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "chat/jinja.h"

static const char CONTEXT[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": \"Hi {{ x }} \\u00e9\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": 2}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"18 C\"},"
    "{\"role\": \"user\", \"content\": \"ok\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"},"
    " \"days\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}},"
    " \"required\": [\"location\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false}";

static json_t *context;

static bool names_a_line(const char *err) { return strncmp(err, "line ", 5) == 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!context && !(context = json_loads(CONTEXT, 0, NULL)))
        abort();
    cv_jinja *t;
    char err[CV_ERRLEN] = "", err2[CV_ERRLEN] = "";
    if (cv_jinja_parse((const char *)data, size, &t, err, sizeof err) != 0) {
        if (!names_a_line(err) && !strstr(err, "template is"))
            abort();
        return 0;
    }
    const cv_jinja_limits lim = {.max_output = 1 << 16, .max_memory = 8 << 20, .max_steps = 200000,
                                 .max_iterations = 20000, .max_depth = 100};
    /* a pool that runs out before the render's own bound; every byte taken
     * must come back to it */
    static cv_budget pool;
    cv_budget_init(&pool, 4 << 20);
    const cv_jinja_env env = {.year = 2026, .month = 12, .day = 1, .limits = &lim, .pool = &pool};
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int ra = cv_jinja_render(t, context, &env, &a, &na, err, sizeof err);
    int rb = cv_jinja_render(t, context, &env, &b, &nb, err2, sizeof err2);
    if (ra != rb)
        abort();
    if (ra == 0 && (na != nb || memcmp(a, b, na) != 0 || a[na] != '\0' || nb > lim.max_output))
        abort();
    if (ra != 0 && (strcmp(err, err2) != 0 || !names_a_line(err) || a || b))
        abort();
    if (atomic_load(&pool.used) != 0)
        abort();
    free(a);
    free(b);
    cv_jinja_free(t);
    return 0;
}
