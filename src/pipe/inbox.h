/* inbox.h: waiting on several links at once.
 *
 * Contract: cv_inbox_add registers a link under a source index and makes
 * its reader thread signal the inbox's pipe after each frame it
 * queues (and when its receiving side ends). cv_inbox_next waits up to
 * timeout_ms for the next frame of any link, taking the links in turn so
 * none starves, and returns it tagged with its source; when a link's
 * receiving side has ended it returns one event with ok = 0 and the
 * link's message (once per link). CV_LINK_TIMEOUT when nothing came. The
 * consumer gives each frame back with cv_link_release on its link. No
 * thread of its own: frames go from a link's reader to the consumer with
 * one wake-up, and nothing is allocated per frame. A waiting consumer
 * spins (yielding its core) for up to CV_INBOX_SPIN_US before it sleeps. cv_inbox_stop detaches
 * the links (call it before closing them) and closes the pipe. */
#ifndef CONVOY_PIPE_INBOX_H
#define CONVOY_PIPE_INBOX_H

#include <stdbool.h>

#include "pipe/link.h"

#define CV_INBOX_MAX_LINKS 8
#define CV_INBOX_SPIN_US 2000L

typedef struct cv_inbox_event {
    int source;  /* index given to cv_inbox_add */
    bool ok;     /* false: the link's receiving side ended; err says why */
    cv_frame frame;
    char err[256];
} cv_inbox_event;

typedef struct cv_inbox {
    int pipe_r, pipe_w; /* the links' readers write a byte, the consumer reads */
    int n_links;
    int next;    /* link to look at first */
    struct cv_inbox_link {
        cv_link *link;
        int source;
        bool ended;
    } links[CV_INBOX_MAX_LINKS];
} cv_inbox;

int cv_inbox_init(cv_inbox *in, char *err, size_t errlen);
int cv_inbox_add(cv_inbox *in, cv_link *link, int source, char *err, size_t errlen);
int cv_inbox_next(cv_inbox *in, int timeout_ms, cv_inbox_event *ev);
void cv_inbox_stop(cv_inbox *in);

#endif
