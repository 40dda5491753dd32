/* log.c: see log.h. */
#include "serve/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Set once before the server's threads start, read by all of them. */
static bool verbose;

void cv_log_set_verbose(bool on) { verbose = on; }

void cv_log(cv_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    if (level == CV_LOG_DEBUG && !verbose)
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    size_t at = strftime(line, sizeof line, "%Y-%m-%d %H:%M:%S", &tm);
    at += (size_t)snprintf(line + at, sizeof line - at, ".%03ld %s ", ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + at, sizeof line - at - 1, fmt, ap);
    va_end(ap);
    at = strlen(line);
    line[at] = '\n';
    line[at + 1] = 0;
    fputs(line, stderr);
}

void cv_log_engine(void *user, const char *line)
{
    (void)user;
    cv_log(CV_LOG_INFO, "%s", line);
}
