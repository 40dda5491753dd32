/* link_test.h: a connected pair of plaintext links over loopback, for
 * tests of what travels on them (include after test.h). */
#ifndef CONVOY_TESTS_LINK_TEST_H
#define CONVOY_TESTS_LINK_TEST_H

#include "core/err.h"
#include "pipe/link.h"

/* *a from cv_link_connect, *b accepted; 0, or -1 with the reason printed. */
static inline int test_link_pair(const cv_link_opts *oa, const cv_link_opts *ob, cv_link **a, cv_link **b)
{
    char err[CV_ERRLEN];
    cv_listener *ls = NULL;
    if (cv_listener_open("127.0.0.1", 0, &ls, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    int rc = cv_link_connect("127.0.0.1", cv_listener_port(ls), 2000, oa, a, err, sizeof err);
    if (rc == 0 && cv_listener_accept(ls, 2000, ob, b, err, sizeof err) != 0) {
        cv_link_close(*a);
        rc = -1;
    }
    if (rc)
        fprintf(stderr, "%s\n", err);
    cv_listener_close(ls);
    return rc;
}

#endif
