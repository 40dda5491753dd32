/* test_serve_text.c: stop strings over a token stream (serve/text.h) on
 * stories260K's tokenizer: for stop strings cut from many places of a text
 * (inside one token, across tokens, at the start, absent), the emitted
 * text is exactly the text before the first occurrence of any stop string,
 * no emitted byte is ever taken back, and nothing after a match is
 * emitted; split UTF-8 characters come out whole; a held prefix that turns
 * out not to be a stop string is released, also at the end of the stream. */
#include <stdint.h>
#include <stdlib.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "serve/text.h"
#include "test.h"
#include "model_test.h"

static convoy_model *model;

static const char *const story =
    "Once upon a time, there was a little girl named Lily. She loved to play outside. "
    "One day, she saw a big red ball and said, \"Wow, caf\xc3\xa9 ball!\" The end.";

/* Streams the tokens of text through an cv_text with these stop strings;
 * returns the emitted text (caller frees) and whether a stop matched. */
static char *stream(const char *text, const char *const *stop, int n_stop, int *stopped)
{
    int32_t ids[512];
    const int n = convoy_tokenize(model, text, strlen(text), false, false, ids, 512);
    CHECK(n > 0);
    cv_text t;
    cv_buf out = {0};
    CHECK(cv_text_init(&t, model, stop, n_stop) == 0);
    *stopped = 0;
    for (int i = 0; i < n && !*stopped; i++) {
        const size_t before = out.n;
        char *copy = before ? strndup(out.p, before) : NULL;
        const int rc = cv_text_push(&t, ids[i], &out);
        CHECK(rc >= 0);
        CHECK(out.n >= before && (!before || !memcmp(copy, out.p, before)));
        free(copy);
        *stopped = rc == 1;
    }
    if (!*stopped) {
        const int rc = cv_text_finish(&t, &out);
        CHECK(rc >= 0);
        *stopped = rc == 1;
    }
    if (*stopped) {
        const size_t n_out = out.n;
        CHECK(cv_text_push(&t, ids[0], &out) == 1 && out.n == n_out);
    }
    cv_text_free(&t);
    char *res = strdup(out.p ? out.p : "");
    cv_buf_free(&out);
    return res;
}

/* The text all tokens decode to (SPM adds a leading space). */
static char *decoded(const char *text)
{
    int stopped;
    return stream(text, NULL, 0, &stopped);
}

static void test_no_stop(void)
{
    char *full = decoded(story);
    CHECKF(!strcmp(full, story) || (full[0] == ' ' && !strcmp(full + 1, story)), "got '%s'", full);
    CHECK(strstr(full, "caf\xc3\xa9"));
    free(full);
}

static void test_stop_everywhere(void)
{
    char *full = decoded(story);
    const size_t n = strlen(full);
    int checked = 0;
    for (size_t at = 0; at < n; at += 3)
        for (size_t len = 1; len <= 7 && at + len <= n; len += 2) {
            char stop[16];
            memcpy(stop, full + at, len);
            stop[len] = 0;
            const char *stops[] = {"zzz-not-there", stop};
            int stopped;
            char *got = stream(story, stops, 2, &stopped);
            const size_t want = (size_t)(strstr(full, stop) - full);
            CHECKF(stopped && strlen(got) == want && !strncmp(got, full, want), "stop '%s': got '%s'", stop, got);
            free(got);
            checked++;
        }
    CHECK(checked > 100);
    free(full);
}

static void test_first_of_several(void)
{
    const char *stops[] = {"ball", "girl", "", "Lily"};
    int stopped;
    char *got = stream(story, stops, 4, &stopped);
    CHECK(stopped);
    CHECKF(!strcmp(got, " Once upon a time, there was a little "), "got '%s'", got);
    free(got);
}

static void test_held_prefix_released(void)
{
    /* "The end!" never comes: " The end." is held as a possible prefix
     * until the stream ends, then released. */
    const char *stops[] = {"end!", ". The end!"};
    int stopped;
    char *got = stream(story, stops, 2, &stopped);
    char *full = decoded(story);
    CHECK(!stopped);
    CHECK(!strcmp(got, full));
    free(got);
    free(full);
}

static void test_utf8_stop(void)
{
    const char *stops[] = {"\xc3\xa9"};
    int stopped;
    char *got = stream(story, stops, 1, &stopped);
    CHECK(stopped);
    const size_t len = strlen(got);
    CHECKF(len >= 3 && !strcmp(got + len - 3, "caf"), "got '%s'", got);
    free(got);
}

int main(void)
{
    cv_kernels_init(0);
    if (!(model = test_load_stories()))
        return test_summary();
    TEST_RUN(test_no_stop);
    TEST_RUN(test_stop_everywhere);
    TEST_RUN(test_first_of_several);
    TEST_RUN(test_held_prefix_released);
    TEST_RUN(test_utf8_stop);
    convoy_model_free(model);
    return test_summary();
}
