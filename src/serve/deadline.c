/* deadline.c: see deadline.h. The entries are a list under one mutex; a
 * thread looks at them every TICK_MS (a few hundred connections at most). */
#include "serve/deadline.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "serve/log.h"

enum { TICK_MS = 250 };

struct cv_deadline {
    cv_deadline *prev, *next;
    int fd;
    double due; /* 0: not waiting */
    bool cut;
    char who[64];
};

struct cv_deadlines {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t thread;
    cv_deadline *first;
    double limit_s;
    bool stopping;
};

/* Shuts down the sockets past their due time, once each; under mu. */
static void cut_late_locked(cv_deadlines *d, double now)
{
    for (cv_deadline *e = d->first; e; e = e->next)
        if (e->due > 0 && now > e->due && !e->cut) {
            e->cut = true;
            shutdown(e->fd, SHUT_RDWR);
            cv_log(CV_LOG_WARN, "closed a connection from %s: its request took over %.0f s to arrive", e->who,
                   d->limit_s);
        }
}

static void *watch(void *arg)
{
    cv_deadlines *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stopping) {
        const struct timespec until = cv_deadline_ms(TICK_MS);
        pthread_cond_timedwait(&d->wake, &d->mu, &until);
        cut_late_locked(d, cv_now_s());
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

cv_deadlines *cv_deadlines_start(double limit_s, char *err, size_t errlen)
{
    cv_deadlines *d = cv_calloc(1, sizeof *d);
    if (!d) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    d->limit_s = limit_s;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->wake, NULL);
    if (pthread_create(&d->thread, NULL, watch, d)) {
        pthread_cond_destroy(&d->wake);
        pthread_mutex_destroy(&d->mu);
        cv_free(d);
        cv_errf(err, errlen, "cannot start a thread");
        return NULL;
    }
    return d;
}

void cv_deadlines_stop(cv_deadlines *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stopping = true;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->mu);
    cv_free(d);
}

cv_deadline *cv_deadline_add(cv_deadlines *d, int fd, const char *who)
{
    cv_deadline *e = cv_calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->fd = fd;
    snprintf(e->who, sizeof e->who, "%s", who);
    pthread_mutex_lock(&d->mu);
    e->due = cv_now_s() + d->limit_s;
    e->next = d->first;
    if (d->first)
        d->first->prev = e;
    d->first = e;
    pthread_mutex_unlock(&d->mu);
    return e;
}

void cv_deadline_wait(cv_deadlines *d, cv_deadline *e, bool waiting)
{
    pthread_mutex_lock(&d->mu);
    e->due = waiting ? cv_now_s() + d->limit_s : 0;
    pthread_mutex_unlock(&d->mu);
}

void cv_deadline_remove(cv_deadlines *d, cv_deadline *e)
{
    pthread_mutex_lock(&d->mu);
    if (e->prev)
        e->prev->next = e->next;
    else
        d->first = e->next;
    if (e->next)
        e->next->prev = e->prev;
    pthread_mutex_unlock(&d->mu);
    cv_free(e);
}
