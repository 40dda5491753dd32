/* test_serve_think.c: a thinking model's <think> block apart from its
 * answer (serve/think.h): whole and streamed a byte at a time (the same
 * split), whitespace trimmed around the reasoning, a block the prompt
 * opened, one cut short, text that only looks like a tag, and output
 * without a block left byte for byte. */
#include <string.h>

#include "serve/think.h"
#include "test.h"

/* The split of out, given whole (step 0) or step bytes at a time. */
static void split(const char *out, bool open, size_t step, cv_buf *reasoning, cv_buf *content)
{
    cv_think t;
    cv_think_init(&t, open);
    const size_t n = strlen(out);
    *reasoning = (cv_buf){0}, *content = (cv_buf){0};
    for (size_t at = 0; step && at < n; at += step)
        CHECK(cv_think_push(&t, out + at, at + step < n ? step : n - at, false, reasoning, content) == 0);
    CHECK(cv_think_push(&t, step ? "" : out, step ? 0 : n, true, reasoning, content) == 0);
    cv_think_free(&t);
}

/* The output splits into want_reasoning and want_content, whole and streamed. */
static void expect(const char *out, bool open, const char *want_reasoning, const char *want_content)
{
    for (size_t step = 0; step <= 3; step++) {
        cv_buf r, c;
        split(out, open, step, &r, &c);
        CHECKF(r.n == strlen(want_reasoning) && (!r.n || !memcmp(r.p, want_reasoning, r.n)),
               "%s (step %zu): reasoning '%.*s', want '%s'", out, step, (int)r.n, r.p ? r.p : "", want_reasoning);
        CHECKF(c.n == strlen(want_content) && (!c.n || !memcmp(c.p, want_content, c.n)),
               "%s (step %zu): content '%.*s', want '%s'", out, step, (int)c.n, c.p ? c.p : "", want_content);
        cv_buf_free(&r);
        cv_buf_free(&c);
    }
}

static void test_block(void)
{
    expect("<think>\nThe user greets.\n</think>\n\nHello!", false, "The user greets.", "Hello!");
    expect("\n <think>a b</think>c", false, "a b", "c");
    expect("<think>\n\n</think>\n\nHi", false, "", "Hi");
    expect("<think>one\n\ntwo </think>", false, "one\n\ntwo", "");
}

static void test_no_block(void)
{
    expect("Hello <think>x</think>", false, "", "Hello <think>x</think>");
    expect("  plain\n", false, "", "  plain\n");
    expect("<thinking>x", false, "", "<thinking>x");
    expect("<thi", false, "", "<thi");
    expect("", false, "", "");
}

static void test_opened_by_prompt(void)
{
    expect("\nWhy.\n</think>\n\nBecause.", true, "Why.", "Because.");
    expect("cut short by max_tokens", true, "cut short by max_tokens", "");
    const char *open = "<|im_start|>assistant\n<think>\n", *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(cv_think_opens(open, strlen(open)));
    CHECK(!cv_think_opens(closed, strlen(closed)));
    CHECK(!cv_think_opens("", 0));
}

static void test_tag_lookalikes(void)
{
    expect("<think>a </thinker> b</think>c", false, "a </thinker> b", "c");
    expect("<think>a </thi", false, "a </thi", "");
    expect("<think>x</think>  <think>y</think>", false, "x", "<think>y</think>");
    expect("<think>caf\xc3\xa9 \xe2\x9c\x93</think>\xc3\xa9", false, "caf\xc3\xa9 \xe2\x9c\x93", "\xc3\xa9");
}

int main(void)
{
    TEST_RUN(test_block);
    TEST_RUN(test_no_block);
    TEST_RUN(test_opened_by_prompt);
    TEST_RUN(test_tag_lookalikes);
    return test_summary();
}
