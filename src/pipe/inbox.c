/* inbox.c: feeder threads that move frames from links into one ring (see
 * inbox.h). A feeder polls its link with a short timeout so that
 * cv_inbox_stop can end it without closing the link. */
#include "pipe/inbox.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "core/err.h"

#define FEEDER_POLL_MS 50

void cv_inbox_init(cv_inbox *in)
{
    memset(in, 0, sizeof *in);
    pthread_mutex_init(&in->mu, NULL);
    pthread_cond_init(&in->cond, NULL);
}

/* Appends an event, waiting while the ring is full; false when stopping. */
static bool push(cv_inbox *in, const cv_inbox_event *ev)
{
    pthread_mutex_lock(&in->mu);
    while (in->count == CV_INBOX_CAP && !in->stopping)
        pthread_cond_wait(&in->cond, &in->mu);
    bool ok = !in->stopping;
    if (ok) {
        in->ring[(in->head + in->count) % CV_INBOX_CAP] = *ev;
        in->count++;
        pthread_cond_broadcast(&in->cond);
    }
    pthread_mutex_unlock(&in->mu);
    return ok;
}

static bool stopping(cv_inbox *in)
{
    pthread_mutex_lock(&in->mu);
    bool s = in->stopping;
    pthread_mutex_unlock(&in->mu);
    return s;
}

static void *feeder_main(void *arg)
{
    struct cv_inbox_feeder *fd = arg;
    cv_inbox_event ev;
    while (!stopping(fd->inbox)) {
        memset(&ev, 0, sizeof ev);
        ev.source = fd->source;
        int rc = cv_link_recv(fd->link, FEEDER_POLL_MS, &ev.frame, ev.err, sizeof ev.err);
        if (rc == CV_LINK_TIMEOUT)
            continue;
        ev.ok = rc == 0;
        if (!push(fd->inbox, &ev)) {
            if (ev.ok)
                cv_link_release(fd->link, &ev.frame);
            break;
        }
        if (!ev.ok)
            break;
    }
    return NULL;
}

int cv_inbox_add(cv_inbox *in, cv_link *link, int source, char *err, size_t errlen)
{
    if (in->n_feeders == CV_INBOX_MAX_LINKS)
        return cv_errf(err, errlen, "too many links for one inbox");
    struct cv_inbox_feeder *fd = &in->feeders[in->n_feeders];
    *fd = (struct cv_inbox_feeder){.inbox = in, .link = link, .source = source};
    if (pthread_create(&fd->thread, NULL, feeder_main, fd) != 0)
        return cv_errf(err, errlen, "%s: cannot start a receiving thread", cv_link_name(link));
    in->n_feeders++;
    return 0;
}

int cv_inbox_next(cv_inbox *in, int timeout_ms, cv_inbox_event *ev)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    if (timeout_ms >= 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&in->mu);
    while (in->count == 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&in->cond, &in->mu);
        else if (pthread_cond_timedwait(&in->cond, &in->mu, &deadline) == ETIMEDOUT && in->count == 0) {
            pthread_mutex_unlock(&in->mu);
            return CV_LINK_TIMEOUT;
        }
    }
    *ev = in->ring[in->head];
    in->head = (in->head + 1) % CV_INBOX_CAP;
    in->count--;
    pthread_cond_broadcast(&in->cond);
    pthread_mutex_unlock(&in->mu);
    return 0;
}

void cv_inbox_stop(cv_inbox *in)
{
    pthread_mutex_lock(&in->mu);
    in->stopping = true;
    pthread_cond_broadcast(&in->cond);
    pthread_mutex_unlock(&in->mu);
    for (int i = 0; i < in->n_feeders; i++)
        pthread_join(in->feeders[i].thread, NULL);
    while (in->count > 0) {
        cv_inbox_event *ev = &in->ring[in->head];
        if (ev->ok)
            for (int i = 0; i < in->n_feeders; i++)
                if (in->feeders[i].source == ev->source)
                    cv_link_release(in->feeders[i].link, &ev->frame);
        in->head = (in->head + 1) % CV_INBOX_CAP;
        in->count--;
    }
    in->n_feeders = 0;
    in->stopping = false;
}
