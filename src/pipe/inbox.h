/* inbox.h: waiting on several links at once.
 *
 * Contract: cv_inbox_add registers a link under a source index.
 * cv_inbox_next waits up to timeout_ms for the next frame of any link,
 * taking the links in turn so none starves, and returns it tagged with its
 * source; when a link's receiving side has ended it returns one event with
 * ok = 0 and the link's message (once per link). CV_LINK_TIMEOUT when
 * nothing came. The consumer gives each frame back with cv_link_release on
 * its link. The inbox reads the links itself, on the consumer's thread (no
 * thread of its own, no hand-off, nothing allocated per frame). A waiting
 * consumer spins (yielding its core) for up to CV_INBOX_SPIN_US before it
 * sleeps in poll on the links' sockets. Links are the caller's: it closes
 * them when it no longer calls cv_inbox_next. */
#ifndef CONVOY_PIPE_INBOX_H
#define CONVOY_PIPE_INBOX_H

#include <stdbool.h>

#include "pipe/link.h"

#define CV_INBOX_MAX_LINKS CV_CHAIN_MAX_NODES /* a chain's nodes */
#define CV_INBOX_SPIN_US 2000L

typedef struct cv_inbox_event {
    int source;  /* index given to cv_inbox_add */
    bool ok;     /* false: the link's receiving side ended; err says why */
    cv_frame frame;
    char err[256];
} cv_inbox_event;

typedef struct cv_inbox {
    int n_links;
    int next;    /* link to look at first */
    struct cv_inbox_link {
        cv_link *link;
        int source;
        bool ended;
    } links[CV_INBOX_MAX_LINKS];
} cv_inbox;

void cv_inbox_init(cv_inbox *in);
int cv_inbox_add(cv_inbox *in, cv_link *link, int source, char *err, size_t errlen);
int cv_inbox_next(cv_inbox *in, int timeout_ms, cv_inbox_event *ev);

#endif
