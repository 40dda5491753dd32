/* inbox.c: see inbox.h. The consumer looks at every link without
 * waiting (each look reads what the socket holds), keeps looking (yielding
 * the core between looks) for CV_INBOX_SPIN_US, and only then sleeps in
 * poll on the sockets of the links still open, so a frame that arrives
 * between the look and the poll still wakes it.
 *
 * Why spin: a core that sleeps is halted, and on virtual machines waking a
 * halted core and switching to the waiting thread costs tens of
 * microseconds per hop, more than the rest of a hop; while nothing sleeps
 * on the socket, the sender does not pay for a wake-up either. While a
 * pipeline decodes, the next frame comes well within the spin; an idle
 * consumer spins once and then sleeps. sched_yield lets any other thread
 * of the core (a link's writer, a server's HTTP threads) run first. */
#include "pipe/inbox.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"

void cv_inbox_init(cv_inbox *in) { memset(in, 0, sizeof *in); }

int cv_inbox_add(cv_inbox *in, cv_link *link, int source, char *err, size_t errlen)
{
    if (in->n_links == CV_INBOX_MAX_LINKS)
        return cv_errf(err, errlen, "too many links for one inbox");
    in->links[in->n_links++] = (struct cv_inbox_link){.link = link, .source = source};
    return 0;
}

/* One look at every link, starting after the last one served. */
static bool take(cv_inbox *in, cv_inbox_event *ev)
{
    for (int k = 0; k < in->n_links; k++) {
        const int i = (in->next + k) % in->n_links;
        struct cv_inbox_link *l = &in->links[i];
        if (l->ended)
            continue;
        memset(ev, 0, sizeof *ev);
        ev->source = l->source;
        const int rc = cv_link_recv(l->link, 0, &ev->frame, ev->err, sizeof ev->err);
        if (rc == CV_LINK_TIMEOUT)
            continue;
        ev->ok = rc == 0;
        l->ended = !ev->ok;
        in->next = (i + 1) % in->n_links;
        return true;
    }
    return false;
}

static long us_since(uint64_t t0_ns) { return (long)((cv_now_ns() - t0_ns) / 1000u); }

int cv_inbox_next(cv_inbox *in, int timeout_ms, cv_inbox_event *ev)
{
    const uint64_t t0 = cv_now_ns();
    const long spin_us = timeout_ms >= 0 && timeout_ms * 1000L < CV_INBOX_SPIN_US ? timeout_ms * 1000L
                                                                                 : CV_INBOX_SPIN_US;
    for (;;) {
        if (take(in, ev))
            return 0;
        while (us_since(t0) < spin_us) {
            sched_yield();
            if (take(in, ev))
                return 0;
        }
        int wait = -1;
        if (timeout_ms >= 0) {
            const long left = timeout_ms - us_since(t0) / 1000L;
            if (left <= 0)
                return CV_LINK_TIMEOUT;
            wait = (int)left;
        }
        struct pollfd p[CV_INBOX_MAX_LINKS];
        nfds_t n = 0;
        for (int i = 0; i < in->n_links; i++)
            if (!in->links[i].ended)
                p[n++] = (struct pollfd){.fd = cv_link_poll_fd(in->links[i].link), .events = POLLIN};
        if (poll(p, n, wait) < 0 && errno != EINTR)
            return CV_LINK_TIMEOUT;
    }
}
