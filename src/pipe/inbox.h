/* inbox.h: one queue fed by several links, so that one thread can wait on
 * all of them at once.
 *
 * Contract: cv_inbox_add starts a feeder thread for a link; it moves each
 * received frame into the inbox, tagged with the link's index, and when the
 * link's receiving side ends it queues one final event with ok = 0 and the
 * link's message. cv_inbox_next waits up to timeout_ms (CV_LINK_TIMEOUT
 * when nothing came). The consumer gives each frame back with
 * cv_link_release on its link. cv_inbox_stop joins the feeders: call it
 * before closing the links (closing a link ends its feeder). The queue is
 * a fixed ring: feeders block while it is full, so nothing is allocated per
 * frame. */
#ifndef CONVOY_PIPE_INBOX_H
#define CONVOY_PIPE_INBOX_H

#include <pthread.h>
#include <stdbool.h>

#include "pipe/link.h"

#define CV_INBOX_MAX_LINKS 8
#define CV_INBOX_CAP 128

typedef struct cv_inbox_event {
    int source;  /* index given to cv_inbox_add */
    bool ok;     /* false: the link's receiving side ended; err says why */
    cv_frame frame;
    char err[256];
} cv_inbox_event;

typedef struct cv_inbox {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    cv_inbox_event ring[CV_INBOX_CAP];
    int head, count;
    bool stopping;
    int n_feeders;
    struct cv_inbox_feeder {
        struct cv_inbox *inbox;
        cv_link *link;
        int source;
        pthread_t thread;
    } feeders[CV_INBOX_MAX_LINKS];
} cv_inbox;

void cv_inbox_init(cv_inbox *in);
int cv_inbox_add(cv_inbox *in, cv_link *link, int source, char *err, size_t errlen);
int cv_inbox_next(cv_inbox *in, int timeout_ms, cv_inbox_event *ev);
/* Stops and joins every feeder, releasing frames still queued. */
void cv_inbox_stop(cv_inbox *in);

#endif
