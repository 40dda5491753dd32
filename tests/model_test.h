/* model_test.h: the stories260K model for tests that need one (include
 * after test.h). test_load_stories (test_load_stories_path: also giving
 * its path) loads ../shared/models/stories260K.gguf;
 * when the file is absent it records the skip (a failure under CI=true) as
 * a test of its own and returns NULL, so main returns test_summary(). A
 * file that is present but does not load ends the program with status 1. */
#ifndef CONVOY_TESTS_MODEL_TEST_H
#define CONVOY_TESTS_MODEL_TEST_H

#include "convoy.h"

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

static inline convoy_model *test_load_stories(void)
{
    char path[1024];
    return test_load_stories_path(path, sizeof path);
}

#endif
