/* log.h: the server's lines on stderr.
 *
 * Contract: sv_log writes one line, "2026-01-02 03:04:05.678 INFO  text"
 * (local time to the millisecond, then DEBUG, INFO, WARN or ERROR), with
 * one locked stdio call, so that lines of different threads never mix.
 * DEBUG lines are written only after sv_log_set_verbose(true), which is
 * called before the server starts its threads. The text is written as
 * given: what a client chose (a path, a header) goes through cv_escape
 * (core/utf8.h) first.
 * sv_log_engine has the shape of convoy_ctx_params.log: the engine's lines
 * (a pipeline's plan, failovers) as INFO lines. */
#ifndef CONVOY_SERVE_LOG_H
#define CONVOY_SERVE_LOG_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"

typedef enum sv_log_level { SV_LOG_DEBUG, SV_LOG_INFO, SV_LOG_WARN, SV_LOG_ERROR } sv_log_level;

void sv_log_set_verbose(bool on);
void sv_log(sv_log_level level, const char *fmt, ...) CV_PRINTF(2, 3);
void sv_log_engine(void *user, const char *line);

#endif
