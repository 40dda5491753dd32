/* tok_test.h: helpers the tokenizer tests share (include after test.h).
 *
 * tok_tokenize tokenizes into a malloc'ed array through cv_tokenize's
 * sizing protocol (n_max 0, then one short, then exact: each must return
 * what the contract says); ids_equal_json compares ids with a JSON list;
 * print_ids shows ids (at most 64) in a failure message; tok_load_written
 * writes a writer's keys to path (freeing the writer), loads the
 * vocabulary from that file into v and removes it. */
#ifndef CONVOY_TESTS_TOK_TEST_H
#define CONVOY_TESTS_TOK_TEST_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>

#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/vocab.h"

static inline int tok_load_written(gguf_writer *w, const char *path, cv_vocab *v, char *err, size_t errlen)
{
    int rc = cv_gguf_write(w, path, err, errlen);
    cv_gguf_writer_free(w);
    CHECKF(rc == 0, "%s", err);
    if (rc != 0)
        return -1;
    gguf_file f;
    rc = cv_gguf_open(&f, path, err, errlen);
    CHECKF(rc == 0, "%s", err);
    if (rc == 0) {
        rc = cv_vocab_load(v, &f, err, errlen);
        cv_gguf_close(&f);
    }
    remove(path);
    return rc;
}

static inline int32_t *tok_tokenize(const cv_vocab *v, const char *text, size_t len, bool add_special,
                                    bool parse_special, int *n_out)
{
    int n = cv_tokenize(v, text, len, add_special, parse_special, NULL, 0);
    CHECK(n != INT_MIN);
    *n_out = 0;
    if (n == INT_MIN)
        return NULL;
    int need = n < 0 ? -n : n;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(need + 1));
    if (need > 0) {
        CHECKF(n == -need, "n_max 0 gave %d for %d ids", n, need);
        int short_n = cv_tokenize(v, text, len, add_special, parse_special, ids, need - 1);
        CHECKF(short_n == -need, "n_max %d gave %d", need - 1, short_n);
    }
    *n_out = cv_tokenize(v, text, len, add_special, parse_special, ids, need);
    CHECK(*n_out == need);
    return ids;
}

static inline bool ids_equal_json(const int32_t *ids, int n, json_t *arr)
{
    if (!json_is_array(arr) || (size_t)n != json_array_size(arr))
        return false;
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, (size_t)i)) != ids[i])
            return false;
    return true;
}

static inline void print_ids(const char *what, const int32_t *ids, int n)
{
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n && i < 64; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

#endif
