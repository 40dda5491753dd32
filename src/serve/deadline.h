/* deadline.h: connections must send their requests in time.
 *
 * libmicrohttpd's connection timeout counts silence, so a client that
 * sends one byte every few seconds holds its connection (and a place in
 * its address's connection cap) for ever. A cv_deadlines watches each
 * connection from its accept, and again from the end of each of its
 * requests, until the next request is in, headers and body: past limit_s
 * its socket is shut down (the connection's thread then reads the end of
 * the stream and closes the connection) and a line is logged. Answers are
 * not watched: they have the idle timeout.
 *
 * Contract: cv_deadline_add watches a connection's socket and returns its
 * entry (NULL when out of memory: that connection is not watched); the
 * caller calls cv_deadline_remove before the socket is closed. All calls
 * are thread-safe; cv_deadlines_stop removes nothing: every entry must be
 * removed first. */
#ifndef CONVOY_SERVE_DEADLINE_H
#define CONVOY_SERVE_DEADLINE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cv_deadlines cv_deadlines;
typedef struct cv_deadline cv_deadline;

/* Starts the watching thread; NULL with err filled. */
cv_deadlines *cv_deadlines_start(double limit_s, char *err, size_t errlen);
void cv_deadlines_stop(cv_deadlines *d);

/* who names the peer in the log line (copied). */
cv_deadline *cv_deadline_add(cv_deadlines *d, int fd, const char *who);
/* waiting: the next request is due within limit_s from now; false: it is
 * in (it is being answered). */
void cv_deadline_wait(cv_deadlines *d, cv_deadline *e, bool waiting);
void cv_deadline_remove(cv_deadlines *d, cv_deadline *e);

#endif
