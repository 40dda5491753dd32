/* access.h: who may use the server: API keys and browsers (CORS).
 *
 * Contract: an cv_access holds the API keys (none: every request may use
 * the server) and the web origins allowed to use it from a browser (CORS:
 * "*" any, else a list; none: no web page may). cv_access_init reads them
 * from --api-key (keys separated by commas), --api-key-file (one key per
 * line; blank lines are skipped; a file readable by group or others is
 * refused, as cluster keys are) and --cors ("*", "none", or origins such as
 * "https://app.example.com,http://localhost:3000" separated by commas;
 * NULL: the default, which the caller picks). A key or origin that is
 * empty, or has spaces or control bytes, is refused, naming it by position.
 *
 * cv_access_key_ok: whether an Authorization header value lets a request
 * in: "Bearer KEY" with one of the keys (the scheme in any case), compared
 * in time that does not depend on where a wrong key differs; true when
 * there are no keys. cv_access_origin_ok: whether a browser request or
 * preflight from origin may go on. cv_is_json_type: whether a Content-Type
 * is application/json (any case, parameters such as charset allowed).
 * cv_is_loopback_host: whether every address host resolves to is a
 * loopback one (127.0.0.0/8, ::1), so that only this machine reaches a
 * server listening there. */
#ifndef CONVOY_SERVE_ACCESS_H
#define CONVOY_SERVE_ACCESS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cv_access {
    char **keys;
    int n_keys;
    char **origins;
    int n_origins;
    bool any_origin;
} cv_access;

int cv_access_init(cv_access *a, const char *keys, const char *key_file, const char *cors, char *err,
                   size_t errlen);
void cv_access_free(cv_access *a);
bool cv_access_has_keys(const cv_access *a);
bool cv_access_key_ok(const cv_access *a, const char *authorization);
bool cv_access_origin_ok(const cv_access *a, const char *origin);
bool cv_is_json_type(const char *content_type);
bool cv_is_loopback_host(const char *host);

#endif
