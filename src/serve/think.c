/* think.c: reasoning and content apart (see think.h). */
#include "serve/think.h"

#include <string.h>

#define OPEN "<think>"
#define CLOSE "</think>"

static bool space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The length of p's longest tail (of n bytes) that begins tag without holding it all. */
static size_t tag_start_tail(const char *p, size_t n, const char *tag)
{
    const size_t len = strlen(tag);
    for (size_t k = len - 1 < n ? len - 1 : n; k > 0; k--)
        if (!memcmp(p + n - k, tag, k))
            return k;
    return 0;
}

void cv_think_init(cv_think *t, bool open) { *t = (cv_think){.state = open ? CV_THINK_IN : CV_THINK_START}; }

void cv_think_free(cv_think *t) { cv_buf_free(&t->held); }

bool cv_think_opens(const char *prompt, size_t n)
{
    while (n > 0 && space(prompt[n - 1]))
        n--;
    return n >= strlen(OPEN) && !memcmp(prompt + n - strlen(OPEN), OPEN, strlen(OPEN));
}

/* START: a block opens, or the text is content; false while it cannot tell. */
static bool start(cv_think *t, bool over)
{
    const char *p = t->held.p ? t->held.p : ""; /* memcmp wants a pointer even for 0 bytes */
    size_t ws = 0;
    while (ws < t->held.n && space(p[ws]))
        ws++;
    const size_t rest = t->held.n - ws, len = strlen(OPEN);
    if (rest >= len && !memcmp(p + ws, OPEN, len)) {
        cv_buf_consume(&t->held, ws + len);
        t->state = CV_THINK_IN;
        return true;
    }
    if (!over && rest < len && !memcmp(p + ws, OPEN, rest))
        return false;
    t->state = CV_THINK_CONTENT;
    return true;
}

/* IN: the reasoning up to </think> (or as far as it is known); *more
 * false while the rest may still be a tag or trimmed. */
static int in_block(cv_think *t, bool over, cv_buf *reasoning, bool *more)
{
    const char *p = t->held.p ? t->held.p : "";
    size_t n = t->held.n, from = 0;
    const char *close = memmem(p, n, CLOSE, strlen(CLOSE));
    const size_t end = close ? (size_t)(close - p) : over ? n : n - tag_start_tail(p, n, CLOSE);
    size_t upto = end;
    while (upto > 0 && space(p[upto - 1])) /* trailing whitespace: told once text follows it */
        upto--;
    if (!t->told)
        while (from < upto && space(p[from]))
            from++;
    if (upto > from && cv_buf_append(reasoning, p + from, upto - from))
        return -1;
    t->told |= upto > from;
    if (close || over) {
        cv_buf_consume(&t->held, close ? end + strlen(CLOSE) : n);
        t->state = CV_THINK_AFTER;
        *more = true;
        return 0;
    }
    /* keep the trailing whitespace (it may end the block) and a possible tag's start */
    cv_buf_consume(&t->held, upto);
    *more = false;
    return 0;
}

int cv_think_push(cv_think *t, const char *p, size_t n, bool over, cv_buf *reasoning, cv_buf *content)
{
    if (cv_buf_append(&t->held, p, n))
        return -1;
    for (bool more = true; more;) {
        switch (t->state) {
        case CV_THINK_START:
            more = start(t, over);
            break;
        case CV_THINK_IN:
            if (in_block(t, over, reasoning, &more))
                return -1;
            break;
        case CV_THINK_AFTER: {
            size_t ws = 0;
            while (ws < t->held.n && space(t->held.p[ws]))
                ws++;
            cv_buf_consume(&t->held, ws);
            more = t->held.n > 0;
            if (more)
                t->state = CV_THINK_CONTENT;
            break;
        }
        case CV_THINK_CONTENT:
            if (t->held.n && cv_buf_append(content, t->held.p, t->held.n))
                return -1;
            cv_buf_consume(&t->held, t->held.n);
            more = false;
            break;
        }
    }
    return 0;
}
