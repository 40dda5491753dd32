/* model_test.h: the stories260K model for tests that need one (include
 * after test.h). test_load_stories (test_load_stories_path: also giving
 * its path) loads ../shared/models/stories260K.gguf;
 * when the file is absent it records the skip (a failure under CI=true) as
 * a test of its own and returns NULL, so main returns test_summary(). A
 * file that is present but does not load ends the program with status 1.
 * test_make_q4_0_draft writes a Q4_0 self-draft of it for speculation. */
#ifndef CONVOY_TESTS_MODEL_TEST_H
#define CONVOY_TESTS_MODEL_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "convoy.h"
#include "model/quantize.h"

static void test_model_present(void)
{
    char path[1024];
    test_shared_path(path, sizeof path, "models/stories260K.gguf");
}

/* The same, also giving the model's path. */
static inline convoy_model *test_load_stories_path(char *path, size_t path_size)
{
    char err[512];
    if (!test_shared_path(path, path_size, "models/stories260K.gguf")) {
        TEST_RUN(test_model_present);
        return NULL;
    }
    convoy_model *m = convoy_model_load(path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return m;
}

/* A Q4_0 self-draft of the model at model_path, written to a file of this
 * process in /tmp (its path into path, named after tag); exits the program
 * with status 1 when it cannot be made. The caller unlinks it. */
static inline void test_make_q4_0_draft(const char *model_path, const char *tag, char *path, size_t path_size)
{
    char err[512];
    snprintf(path, path_size, "/tmp/convoy-test-%s-%d-q4_0.gguf", tag, (int)getpid());
    const cv_quantize_params qp = {.type = CV_TYPE_Q4_0, .output_type = CV_TYPE_COUNT, .n_threads = 1};
    if (cv_quantize_file(model_path, path, &qp, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "cannot make the Q4_0 draft: %s\n", err);
        exit(1);
    }
}

static inline convoy_model *test_load_stories(void)
{
    char path[1024];
    return test_load_stories_path(path, sizeof path);
}

#endif
