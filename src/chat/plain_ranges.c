/* plain_ranges.c: the plain ranges of a rendered chat (plain_ranges.h). The
 * marked rendering is walked once, marker by marker, against the prompt:
 * the text before a marker and then the marker's content must be the
 * prompt's next bytes, and nothing of the prompt may be left at the end. */
#include "chat/plain_ranges.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

/* Private-use characters around a message's index: no template writes them. */
#define MARK_OPEN "\xee\x80\x80"
#define MARK_CLOSE "\xee\x80\x81"

void cv_plain_mark(char *out, size_t n, int i) { snprintf(out, n, MARK_OPEN "%d" MARK_CLOSE, i); }

/* Whether the n bytes of s are the prompt's next ones, those from *at;
 * when they are, *at moves past them. */
static bool next_is(const char *prompt, size_t len, size_t *at, const char *s, size_t n)
{
    if (n > len - *at || memcmp(prompt + *at, s, n))
        return false;
    *at += n;
    return true;
}

int cv_plain_ranges_find(const char *prompt, size_t len, const char *marked, size_t mlen, const char *const *contents,
                         int n, cv_plain_range **ranges, int *n_ranges)
{
    *ranges = NULL;
    *n_ranges = 0;
    const char *p = marked, *end = marked + mlen;
    size_t at = 0;
    int rc = 1;
    while (rc == 1 && p < end) {
        const char *o = strstr(p, MARK_OPEN);
        char *after;
        const long i = o ? strtol(o + strlen(MARK_OPEN), &after, 10) : -1;
        if (!o || i < 0 || i >= n || strncmp(after, MARK_CLOSE, strlen(MARK_CLOSE))) {
            /* No marker here: the text up to the next one is the template's. */
            const char *stop = o ? o + strlen(MARK_OPEN) : end;
            rc = next_is(prompt, len, &at, p, (size_t)(stop - p));
            p = stop;
            continue;
        }
        if (!next_is(prompt, len, &at, p, (size_t)(o - p))) {
            rc = 0;
            break;
        }
        cv_plain_range *grown = cv_realloc(*ranges, sizeof **ranges * (size_t)(*n_ranges + 1));
        if (!grown) {
            rc = -1;
            break;
        }
        *ranges = grown;
        const size_t clen = strlen(contents[i]);
        grown[(*n_ranges)++] = (cv_plain_range){at, clen};
        rc = next_is(prompt, len, &at, contents[i], clen);
        p = after + strlen(MARK_CLOSE);
    }
    if (rc == 1 && at != len)
        rc = 0;
    if (rc != 1) {
        cv_free(*ranges);
        *ranges = NULL;
        *n_ranges = 0;
    }
    return rc;
}
