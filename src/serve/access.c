/* access.c: see access.h. Keys and origins are copied into arrays of
 * NUL-terminated strings, grown one at a time (there are a few). */
#include "serve/access.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/fmap.h"

enum { MAX_ITEM = 1024 };

/* Appends s[0, n) to list (*n_list items); what is refused says why. */
static int add_item(char ***list, int *n_list, const char *s, size_t n, const char *what, char *err, size_t errlen)
{
    if (n == 0 || n > MAX_ITEM)
        return cv_errf(err, errlen, "%s %d is %s", what, *n_list + 1, n ? "too long" : "empty");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || s[i] == 0x7F)
            return cv_errf(err, errlen, "%s %d has a space or a control character", what, *n_list + 1);
    char **grown = cv_realloc(*list, sizeof *grown * (size_t)(*n_list + 1));
    char *copy = cv_malloc(n + 1);
    if (grown)
        *list = grown;
    if (!grown || !copy) {
        cv_free(copy);
        return cv_errf(err, errlen, "out of memory");
    }
    memcpy(copy, s, n);
    copy[n] = 0;
    grown[(*n_list)++] = copy;
    return 0;
}

static int add_list(char ***list, int *n_list, const char *csv, const char *what, char *err, size_t errlen)
{
    for (const char *p = csv;;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (add_item(list, n_list, p, n, what, err, errlen))
            return -1;
        if (!end)
            return 0;
        p = end + 1;
    }
}

/* One key per line; blank lines and a trailing \r are skipped. */
static int read_key_file(cv_access *a, const char *path, char *err, size_t errlen)
{
    struct stat st;
    char why[CV_ERRLEN];
    const int fd = cv_open_regular(path, &st, why, sizeof why);
    if (fd < 0)
        return cv_errf(err, errlen, "the API key file: %s", why);
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return cv_errf(err, errlen, "cannot open the API key file %s", path);
    }
    if (st.st_mode & 077) {
        fclose(f);
        return cv_errf(err, errlen, "the API key file %s is readable by group or others: chmod 600 %s", path, path);
    }
    char line[MAX_ITEM + 2];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            rc = cv_errf(err, errlen, "%s: a line is longer than %d bytes", path, MAX_ITEM);
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
            n--;
        if (n > 0)
            rc = add_item(&a->keys, &a->n_keys, line, n, "API key", err, errlen);
    }
    fclose(f);
    if (rc == 0 && a->n_keys == 0)
        rc = cv_errf(err, errlen, "the API key file %s holds no key", path);
    return rc;
}

int cv_access_init(cv_access *a, const char *keys, const char *key_file, const char *cors, char *err,
                   size_t errlen)
{
    memset(a, 0, sizeof *a);
    int rc = 0;
    if (keys)
        rc = add_list(&a->keys, &a->n_keys, keys, "API key", err, errlen);
    if (rc == 0 && key_file)
        rc = read_key_file(a, key_file, err, errlen);
    if (rc == 0 && cors && !strcmp(cors, "*"))
        a->any_origin = true;
    else if (rc == 0 && cors && strcmp(cors, "none"))
        rc = add_list(&a->origins, &a->n_origins, cors, "origin", err, errlen);
    if (rc)
        cv_access_free(a);
    return rc;
}

void cv_access_free(cv_access *a)
{
    for (int i = 0; i < a->n_keys; i++) {
        memset(a->keys[i], 0, strlen(a->keys[i]));
        cv_free(a->keys[i]);
    }
    for (int i = 0; i < a->n_origins; i++)
        cv_free(a->origins[i]);
    cv_free(a->keys);
    cv_free(a->origins);
    memset(a, 0, sizeof *a);
}

bool cv_access_has_keys(const cv_access *a) { return a->n_keys > 0; }

/* Whether key equals given (given_len bytes), reading every byte of key
 * whatever the bytes are. */
static bool same_key(const char *key, const char *given, size_t given_len)
{
    const size_t n = strlen(key);
    unsigned diff = n != given_len;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < given_len ? given[i] : 0);
    return diff == 0;
}

bool cv_access_key_ok(const cv_access *a, const char *authorization)
{
    if (a->n_keys == 0)
        return true;
    if (!authorization || strncasecmp(authorization, "Bearer ", 7))
        return false;
    const char *given = authorization + 7;
    while (*given == ' ')
        given++;
    size_t n = strlen(given);
    while (n > 0 && given[n - 1] == ' ')
        n--;
    bool ok = false;
    for (int i = 0; i < a->n_keys; i++)
        ok |= same_key(a->keys[i], given, n);
    return ok;
}

bool cv_access_origin_ok(const cv_access *a, const char *origin)
{
    if (a->any_origin)
        return true;
    for (int i = 0; origin && i < a->n_origins; i++)
        if (!strcasecmp(a->origins[i], origin))
            return true;
    return false;
}

bool cv_is_json_type(const char *content_type)
{
    static const char json[] = "application/json";
    if (!content_type)
        return false;
    while (*content_type == ' ')
        content_type++;
    if (strncasecmp(content_type, json, sizeof json - 1))
        return false;
    const char next = content_type[sizeof json - 1];
    return next == 0 || next == ';' || next == ' ';
}

bool cv_is_loopback_host(const char *host)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    if (getaddrinfo(host, NULL, &hints, &ai))
        return false;
    bool loopback = true;
    for (const struct addrinfo *p = ai; p; p = p->ai_next) {
        if (p->ai_family == AF_INET)
            loopback &= (ntohl(((const struct sockaddr_in *)p->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (p->ai_family == AF_INET6)
            loopback &= IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)p->ai_addr)->sin6_addr);
        else
            loopback = false;
    }
    freeaddrinfo(ai);
    return loopback;
}
