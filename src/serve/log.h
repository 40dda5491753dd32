/* log.h: the server's lines on stderr.
 *
 * Contract: cv_log writes one line, "2026-01-02 03:04:05.678 INFO  text"
 * (local time to the millisecond, then DEBUG, INFO, WARN or ERROR), with
 * one locked stdio call, so that lines of different threads never mix.
 * DEBUG lines are written only after cv_log_set_verbose(true), which is
 * called before the server starts its threads. The text is written as
 * given: what a client chose (a path, a header) goes through cv_escape
 * (core/utf8.h) first.
 * cv_log_engine has the shape of convoy_ctx_params.log: the engine's lines
 * (a pipeline's plan, failovers) as INFO lines. */
#ifndef CONVOY_SERVE_LOG_H
#define CONVOY_SERVE_LOG_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"

typedef enum cv_log_level { CV_LOG_DEBUG, CV_LOG_INFO, CV_LOG_WARN, CV_LOG_ERROR } cv_log_level;

void cv_log_set_verbose(bool on);
void cv_log(cv_log_level level, const char *fmt, ...) CV_PRINTF(2, 3);
void cv_log_engine(void *user, const char *line);

#endif
