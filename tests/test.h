/* test.h: a minimal test harness.
 *
 * Each test program defines test functions and runs them with TEST_RUN;
 * CHECK records a failure with file, line and the expression (or a printf
 * message with CHECKF) and continues. The program prints one line
 * "N passed, N failed" (and ", N skipped") and exits non-zero on any
 * failure. test_shared_path finds ../shared data: when it is missing the
 * test is skipped with a message, unless CI=true, when it fails. */
#ifndef CONVOY_TESTS_TEST_H
#define CONVOY_TESTS_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int test_failures_in_current;
static int test_n_pass, test_n_fail, test_n_skip;
static int test_skipped_current;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            test_failures_in_current++;                                              \
        }                                                                            \
    } while (0)

#define CHECKF(cond, ...)                                                  \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            test_failures_in_current++;                                    \
        }                                                                  \
    } while (0)

/* Marks the current test skipped (with a reason) and returns from it. */
#define SKIP(...)                                   \
    do {                                            \
        fprintf(stderr, "SKIP: ");                  \
        fprintf(stderr, __VA_ARGS__);               \
        fputc('\n', stderr);                        \
        test_skipped_current = 1;                   \
        return;                                     \
    } while (0)

static inline void test_run_one(const char *name, void (*fn)(void))
{
    test_failures_in_current = 0;
    test_skipped_current = 0;
    fn();
    if (test_failures_in_current) {
        test_n_fail++;
        fprintf(stderr, "FAIL %s\n", name);
    } else if (test_skipped_current) {
        test_n_skip++;
        fprintf(stderr, "skip %s\n", name);
    } else {
        test_n_pass++;
        fprintf(stderr, "ok   %s\n", name);
    }
}

#define TEST_RUN(fn) test_run_one(#fn, fn)

static inline int test_summary(void)
{
    printf("%d passed, %d failed, %d skipped\n", test_n_pass, test_n_fail, test_n_skip);
    return test_n_fail ? 1 : 0;
}

/* The whole file, NUL-terminated (malloc'ed; *len, when not NULL, gets its
 * length without the NUL), or NULL when it cannot be read. */
static inline char *test_read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

/* Path of a file under ../shared (relative to the source tree), in buf.
 * Returns 1 if it exists. When it does not: returns 0 after printing why;
 * under CI=true that counts as a failure of the current test. */
static inline int test_shared_path(char *buf, size_t n, const char *rel)
{
    const char *root = getenv("CONVOY_SHARED");
    snprintf(buf, n, "%s/%s", root ? root : CONVOY_SOURCE_DIR "/../shared", rel);
    if (access(buf, R_OK) == 0)
        return 1;
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) {
        fprintf(stderr, "missing test data %s (CI=true: this is a failure)\n", buf);
        test_failures_in_current++;
    } else {
        fprintf(stderr, "SKIP: test data %s not found (clone ../shared beside the repo)\n", buf);
        test_skipped_current = 1;
    }
    return 0;
}

#endif
