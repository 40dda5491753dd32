/* hub.c: see hub.h. One pull, in phases: the reference parsed
 * (parse_ref), the file chosen from the repository's listing for a QUANT
 * reference (choose_file), the file's size and hash asked of the hub
 * (stat_remote), the cache consulted (cached_is_current), the bytes
 * downloaded into PATH.part with retries that resume (download), and the
 * result checked and moved into place (finish). */
#include "hub.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "convoy.h"
#include "core/clock.h"
#include "core/err.h"
#include "core/fmap.h"

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define HUB_DEFAULT_QUANT "Q4_K_M"
#define HUB_ATTEMPTS 4        /* tries of one download, each resuming the last */
#define HUB_LISTING_MAX (16u << 20)
#define HUB_STALL_S 60        /* a transfer below 1 byte/s this long fails (and is retried) */
#define HUB_PROGRESS_S 2.0    /* seconds between progress lines */
#define HUB_SHA_HEX (2 * crypto_hash_sha256_BYTES)

typedef struct hub_ref {
    char repo[256];  /* OWNER/REPO */
    char file[512];  /* PATH in the repository; empty until chosen for a QUANT reference */
    char quant[64];  /* a QUANT reference's tag; empty for hf:// */
} hub_ref;

typedef struct hub_remote {
    uint64_t size;              /* 0: not stated */
    char sha256[HUB_SHA_HEX + 1]; /* lower-case hex; empty: not stated (a file outside LFS) */
} hub_remote;

/* ---- the reference ---- */

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || (n <= 2 && s[0] == '.' && (n == 1 || s[1] == '.')))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return false;
    return true;
}

/* Every '/'-separated part of path is a name (no "", ".", ".."). */
static bool path_ok(const char *path)
{
    for (const char *p = path;;) {
        const char *slash = strchr(p, '/');
        const size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (!name_ok(p, n))
            return false;
        if (!slash)
            return true;
        p = slash + 1;
    }
}

static int parse_ref(const char *ref, hub_ref *r, char *err, size_t errlen)
{
    *r = (hub_ref){0};
    const bool file_ref = strncmp(ref, "hf://", 5) == 0;
    const char *s = file_ref ? ref + 5 : ref, *slash = strchr(s, '/');
    const char *end = slash ? strchr(slash + 1, file_ref ? '/' : ':') : NULL; /* the repository's end */
    const char *tail = end ? end + 1 : "";
    const size_t repo_len = end ? (size_t)(end - s) : strlen(s);
    bool ok = slash && repo_len < sizeof r->repo && strlen(tail) < sizeof r->file && strlen(tail) < sizeof r->quant;
    if (ok) {
        memcpy(r->repo, s, repo_len);
        snprintf(file_ref ? r->file : r->quant, file_ref ? sizeof r->file : sizeof r->quant, "%s", tail);
        ok = path_ok(r->repo) && strchr(r->repo, '/') == strrchr(r->repo, '/') &&
             (file_ref ? end && path_ok(r->file) : !end || name_ok(r->quant, strlen(r->quant)));
    }
    return ok ? 0
              : cv_errf(err, errlen, "'%s' is not a model reference: give hf://OWNER/REPO/FILE.gguf or "
                                     "OWNER/REPO[:QUANT]", ref);
}

static const char *endpoint(void)
{
    const char *e = getenv("HF_ENDPOINT");
    return e && *e ? e : HUB_DEFAULT_ENDPOINT;
}

/* The cache folder: $CONVOY_MODELS, $XDG_CACHE_HOME/convoy/models or ~/.cache/convoy/models. */
static int cache_dir(char *out, size_t n, char *err, size_t errlen)
{
    const char *own = getenv("CONVOY_MODELS"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (own && *own)
        w = snprintf(out, n, "%s", own);
    else if (xdg && *xdg)
        w = snprintf(out, n, "%s/convoy/models", xdg);
    else if (home && *home)
        w = snprintf(out, n, "%s/.cache/convoy/models", home);
    else
        return cv_errf(err, errlen, "no cache folder: set CONVOY_MODELS or HOME");
    return w > 0 && (size_t)w < n ? 0 : cv_errf(err, errlen, "the cache folder's path is too long");
}

/* ---- HTTP ---- */

typedef struct hub_http {
    CURL *h;
    struct curl_slist *headers;
    char why[CURL_ERROR_SIZE];
} hub_http;

/* A request to url with the token (when set), redirects followed or not. */
static int http_open(hub_http *x, const char *url, bool follow, char *err, size_t errlen)
{
    *x = (hub_http){.h = curl_easy_init()};
    if (!x->h)
        return cv_errf(err, errlen, "cannot start an HTTP transfer (libcurl)");
    const char *token = getenv("HF_TOKEN");
    if (token && *token) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        x->headers = curl_slist_append(NULL, auth);
    }
    curl_easy_setopt(x->h, CURLOPT_URL, url);
    curl_easy_setopt(x->h, CURLOPT_USERAGENT, "convoy/" CONVOY_VERSION);
    curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(x->h, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(x->h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(x->h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(x->h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(x->h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(x->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(x->h, CURLOPT_LOW_SPEED_TIME, (long)HUB_STALL_S);
    curl_easy_setopt(x->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(x->h, CURLOPT_ERRORBUFFER, x->why);
    return 0;
}

static void http_close(hub_http *x)
{
    curl_easy_cleanup(x->h);
    curl_slist_free_all(x->headers);
}

/* Why a transfer failed: curl's words, or the hub's status. */
static int http_failure(const hub_http *x, CURLcode rc, long code, const char *url, char *err, size_t errlen)
{
    if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR)
        return cv_errf(err, errlen, "%s: %s", url, x->why[0] ? x->why : curl_easy_strerror(rc));
    if (code == 401 || code == 403)
        return cv_errf(err, errlen, "%s: HTTP %ld: the repository needs a token with access to it (HF_TOKEN)", url,
                       code);
    if (code == 404)
        return cv_errf(err, errlen, "%s: HTTP 404: no such repository or file", url);
    return cv_errf(err, errlen, "%s: HTTP %ld", url, code);
}

typedef struct body {
    char *data;
    size_t len;
    bool too_long;
} body;

static size_t on_body(char *p, size_t size, size_t n, void *user)
{
    body *b = user;
    const size_t len = size * n;
    if (b->len + len > HUB_LISTING_MAX) {
        b->too_long = true;
        return 0;
    }
    char *grown = realloc(b->data, b->len + len + 1);
    if (!grown)
        return 0;
    memcpy(grown + b->len, p, len);
    b->data = grown;
    b->len += len;
    b->data[b->len] = '\0';
    return len;
}

/* GET url as JSON. */
static json_t *get_json(const char *url, char *err, size_t errlen)
{
    hub_http x;
    body b = {0};
    long code = 0;
    json_t *j = NULL;
    if (http_open(&x, url, true, err, errlen))
        return NULL;
    curl_easy_setopt(x.h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(x.h, CURLOPT_WRITEDATA, &b);
    const CURLcode rc = curl_easy_perform(x.h);
    curl_easy_getinfo(x.h, CURLINFO_RESPONSE_CODE, &code);
    if (rc != CURLE_OK || code != 200)
        http_failure(&x, b.too_long ? CURLE_OK : rc, b.too_long ? 413 : code, url, err, errlen);
    else if (!(j = json_loadb(b.data ? b.data : "", b.len, 0, NULL)))
        cv_errf(err, errlen, "%s: the answer is not JSON", url);
    http_close(&x);
    free(b.data);
    return j;
}

/* ---- the file of a QUANT reference ---- */

/* Whether name holds tag as a word (not inside a longer one), any case. */
static bool has_tag(const char *name, const char *tag)
{
    const size_t n = strlen(tag);
    for (const char *p = name; *p; p++)
        if (strncasecmp(p, tag, n) == 0 && (p == name || !isalnum((unsigned char)p[-1])) &&
            !isalnum((unsigned char)p[n]))
            return true;
    return false;
}

static bool is_model_gguf(const char *name)
{
    const size_t n = strlen(name);
    return n > 5 && strcasecmp(name + n - 5, ".gguf") == 0 && !strcasestr(name, "mmproj");
}

/* The repository's GGUF for r->quant (default Q4_K_M, or the only one). */
static int choose_file(hub_ref *r, char *err, size_t errlen)
{
    char url[1024], found[1024] = "";
    snprintf(url, sizeof url, "%s/api/models/%s", endpoint(), r->repo);
    json_t *j = get_json(url, err, errlen), *sib;
    const json_t *siblings = json_object_get(j, "siblings");
    const char *tag = r->quant[0] ? r->quant : HUB_DEFAULT_QUANT, *only = NULL;
    int n_gguf = 0, n_match = 0;
    size_t i;
    json_array_foreach(siblings, i, sib)
    {
        const char *name = json_string_value(json_object_get(sib, "rfilename"));
        if (!name || !is_model_gguf(name) || !path_ok(name))
            continue;
        n_gguf++;
        only = name;
        if (has_tag(name, tag) && ++n_match == 1)
            snprintf(r->file, sizeof r->file, "%s", name);
        if (strlen(found) + strlen(name) + 3 < sizeof found)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s", found[0] ? ", " : "", name);
    }
    if (n_match == 0 && !r->quant[0] && n_gguf == 1)
        snprintf(r->file, sizeof r->file, "%s", only), n_match = 1;
    int rc = 0;
    if (!j)
        rc = -1;
    else if (n_match != 1)
        rc = cv_errf(err, errlen, "%s: %s GGUF file named for %s (its GGUF files: %s)", r->repo,
                     n_match ? "more than one" : "no", tag, n_gguf ? found : "none");
    json_decref(j);
    return rc;
}

/* ---- the file's size and hash, as the hub states them ---- */

static void header_value(const char *line, size_t len, const char *name, char *out, size_t n)
{
    const size_t k = strlen(name);
    if (len <= k || strncasecmp(line, name, k) != 0)
        return;
    const char *v = line + k;
    size_t m = len - k;
    while (m && (*v == ' ' || *v == '"'))
        v++, m--;
    while (m && strchr("\r\n\" ", v[m - 1]))
        m--;
    snprintf(out, n, "%.*s", (int)(m < n ? m : n - 1), v);
}

typedef struct header_fields {
    char linked_etag[128], linked_size[32], etag[128], length[32];
} header_fields;

static size_t on_header(char *line, size_t size, size_t n, void *user)
{
    header_fields *h = user;
    const size_t len = size * n;
    if (len > 5 && strncmp(line, "HTTP/", 5) == 0)
        *h = (header_fields){0}; /* each response of a redirect starts afresh */
    header_value(line, len, "x-linked-etag:", h->linked_etag, sizeof h->linked_etag);
    header_value(line, len, "x-linked-size:", h->linked_size, sizeof h->linked_size);
    header_value(line, len, "etag:", h->etag, sizeof h->etag);
    header_value(line, len, "content-length:", h->length, sizeof h->length);
    return len;
}

static bool is_sha256_hex(const char *s)
{
    if (strlen(s) != HUB_SHA_HEX)
        return false;
    for (const char *p = s; *p; p++)
        if (!isxdigit((unsigned char)*p))
            return false;
    return true;
}

/* HEAD of the file's URL, its redirect not followed: a file in LFS answers
 * with a redirect that states X-Linked-Size and X-Linked-Etag (its SHA-256). */
static int stat_remote(const char *url, hub_remote *out, char *err, size_t errlen)
{
    hub_http x;
    header_fields h = {0};
    long code = 0;
    *out = (hub_remote){0};
    if (http_open(&x, url, false, err, errlen))
        return -1;
    curl_easy_setopt(x.h, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(x.h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(x.h, CURLOPT_HEADERDATA, &h);
    const CURLcode rc = curl_easy_perform(x.h);
    curl_easy_getinfo(x.h, CURLINFO_RESPONSE_CODE, &code);
    int ret = 0;
    if (rc != CURLE_OK || code < 200 || code >= 400)
        ret = http_failure(&x, rc, code, url, err, errlen);
    else {
        /* a redirect without the linked fields states nothing of the file */
        const bool linked = h.linked_size[0] != '\0', direct = code == 200;
        out->size = linked || direct ? strtoull(linked ? h.linked_size : h.length, NULL, 10) : 0;
        const char *sha = linked ? h.linked_etag : direct ? h.etag : "";
        if (is_sha256_hex(sha))
            for (size_t i = 0; i <= HUB_SHA_HEX; i++)
                out->sha256[i] = (char)tolower((unsigned char)sha[i]);
    }
    http_close(&x);
    return ret;
}

/* ---- the cache ---- */

static int read_sidecar(const char *path, char *sha, size_t n)
{
    char side[4096];
    snprintf(side, sizeof side, "%s.sha256", path);
    FILE *f = fopen(side, "r");
    const int got = f && fscanf(f, "%64s", sha) == 1 && n > HUB_SHA_HEX ? 0 : -1;
    if (f)
        fclose(f);
    return got;
}

/* Whether path holds the remote's file: its recorded hash is the one the
 * hub states, or (no hash stated) its size is. */
static bool cached_is_current(const char *path, const hub_remote *rem)
{
    struct stat st;
    char sha[HUB_SHA_HEX + 1] = "";
    if (stat(path, &st) != 0)
        return false;
    if (rem->sha256[0])
        return read_sidecar(path, sha, sizeof sha) == 0 && strcmp(sha, rem->sha256) == 0;
    return rem->size == 0 || (uint64_t)st.st_size == rem->size;
}

/* ---- the download ---- */

typedef struct transfer {
    CURL *h;
    FILE *f;
    crypto_hash_sha256_state sha;
    uint64_t have, total;  /* bytes in the part file; the file's size (0: unknown) */
    uint64_t resumed_at;
    bool checked;          /* the response's status was looked at */
    long code;
    const char *what;      /* OWNER/REPO/FILE, for errors */
    const char *say;       /* "convoy CMD: OWNER/REPO/FILE", for progress lines */
    double t0, last;
} transfer;

/* The part file's bytes so far into the hash; a part longer than the file is dropped. */
static int hash_part(transfer *t, char *err, size_t errlen, const char *part)
{
    unsigned char buf[1 << 16];
    size_t n;
    crypto_hash_sha256_init(&t->sha);
    t->have = 0;
    fseek(t->f, 0, SEEK_SET);
    while ((n = fread(buf, 1, sizeof buf, t->f)) > 0) {
        crypto_hash_sha256_update(&t->sha, buf, n);
        t->have += n;
    }
    if (ferror(t->f))
        return cv_errf(err, errlen, "%s: cannot read: %s", part, strerror(errno));
    if (t->total && t->have > t->total) {
        if (ftruncate(fileno(t->f), 0) != 0)
            return cv_errf(err, errlen, "%s: cannot truncate: %s", part, strerror(errno));
        crypto_hash_sha256_init(&t->sha);
        t->have = 0;
    }
    fseek(t->f, 0, SEEK_END); /* appending from here */
    return 0;
}

static void progress(transfer *t, bool last)
{
    const double now = cv_now_s();
    if (!last && now - t->last < HUB_PROGRESS_S)
        return;
    t->last = now;
    const double mb = t->have / 1e6, rate = (t->have - t->resumed_at) / 1e6 / (now - t->t0 + 1e-9);
    if (t->total)
        fprintf(stderr, "%s: %.1f of %.1f MB (%.0f%%), %.1f MB/s\n", t->say, mb, t->total / 1e6,
                100.0 * t->have / t->total, rate);
    else
        fprintf(stderr, "%s: %.1f MB, %.1f MB/s\n", t->say, mb, rate);
}

static size_t on_data(char *p, size_t size, size_t n, void *user)
{
    transfer *t = user;
    const size_t len = size * n;
    if (!t->checked) {
        t->checked = true;
        curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &t->code);
        if (t->code == 200 && t->have > 0) { /* the range was not honoured: from the start */
            if (ftruncate(fileno(t->f), 0) != 0)
                return 0;
            crypto_hash_sha256_init(&t->sha);
            t->have = t->resumed_at = 0;
        } else if (t->code != 200 && t->code != 206)
            return 0;
    }
    if (fwrite(p, 1, len, t->f) != len)
        return 0;
    crypto_hash_sha256_update(&t->sha, (const unsigned char *)p, len);
    t->have += len;
    progress(t, false);
    return len;
}

/* One GET of url from t->have on. 1: failed in a way a retry may mend. */
static int fetch_once(transfer *t, const char *url, char *err, size_t errlen)
{
    hub_http x;
    char range[64];
    if (http_open(&x, url, true, err, errlen))
        return -1;
    t->h = x.h;
    t->checked = false;
    t->code = 0;
    t->resumed_at = t->have;
    t->t0 = t->last = cv_now_s();
    snprintf(range, sizeof range, "%llu-", (unsigned long long)t->have);
    if (t->have > 0)
        curl_easy_setopt(x.h, CURLOPT_RANGE, range);
    curl_easy_setopt(x.h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(x.h, CURLOPT_WRITEDATA, t);
    const CURLcode rc = curl_easy_perform(x.h);
    long code = 0;
    curl_easy_getinfo(x.h, CURLINFO_RESPONSE_CODE, &code);
    int ret = 0;
    const bool whole_already = code == 416 && t->total && t->have == t->total;
    if (fflush(t->f) != 0)
        ret = cv_errf(err, errlen, "%s: cannot write: %s", t->what, strerror(errno));
    else if ((rc != CURLE_OK || (code != 200 && code != 206)) && !whole_already) {
        const bool wrote_badly = rc == CURLE_WRITE_ERROR && (code == 200 || code == 206);
        if (wrote_badly)
            cv_errf(err, errlen, "%s: cannot write: %s", t->what, strerror(errno));
        else
            http_failure(&x, rc, code, url, err, errlen);
        const bool transient = rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR ||
                               rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_COULDNT_CONNECT ||
                               rc == CURLE_GOT_NOTHING || code >= 500;
        ret = transient && !wrote_badly ? 1 : -1;
    }
    http_close(&x);
    return ret;
}

/* The file into part, resuming what part holds, HUB_ATTEMPTS tries. */
static int download(const char *url, const char *part, transfer *t, char *err, size_t errlen)
{
    if (!(t->f = fopen(part, "a+b")))
        return cv_errf(err, errlen, "%s: cannot open: %s", part, strerror(errno));
    int rc = hash_part(t, err, errlen, part);
    if (rc == 0 && t->have > 0)
        fprintf(stderr, "%s: resuming at %.1f MB\n", t->say, t->have / 1e6);
    for (int attempt = 1; rc == 0; attempt++) {
        if (t->total && t->have == t->total)
            break;
        rc = fetch_once(t, url, err, errlen);
        if (rc == 1 && attempt < HUB_ATTEMPTS) {
            fprintf(stderr, "%s: %s; resuming at %.1f MB in %d s\n", t->say, err, t->have / 1e6, 1 << (attempt - 1));
            sleep(1u << (attempt - 1));
            rc = 0;
        } else if (rc == 0)
            break;
    }
    fclose(t->f);
    t->f = NULL;
    return rc ? -1 : 0;
}

/* The part checked against the hub's size and hash, then moved to path. */
static int finish(transfer *t, const hub_remote *rem, const char *part, const char *path, char *err, size_t errlen)
{
    unsigned char digest[crypto_hash_sha256_BYTES];
    char hex[HUB_SHA_HEX + 1], side[4096];
    crypto_hash_sha256_final(&t->sha, digest);
    sodium_bin2hex(hex, sizeof hex, digest, sizeof digest);
    if (rem->size && t->have != rem->size) {
        unlink(part);
        return cv_errf(err, errlen, "%s: %llu bytes arrived, the hub states %llu; deleted", t->what,
                       (unsigned long long)t->have, (unsigned long long)rem->size);
    }
    if (rem->sha256[0] && strcmp(hex, rem->sha256) != 0) {
        unlink(part);
        return cv_errf(err, errlen, "%s: SHA-256 %s, the hub states %s; the download is deleted", t->what, hex,
                       rem->sha256);
    }
    if (rename(part, path) != 0)
        return cv_errf(err, errlen, "%s: cannot rename %s: %s", t->what, part, strerror(errno));
    snprintf(side, sizeof side, "%s.sha256", path);
    FILE *f = fopen(side, "w");
    if (!f || fprintf(f, "%s\n", hex) < 0 || fclose(f) != 0)
        return cv_errf(err, errlen, "%s: cannot write", side);
    if (!rem->sha256[0])
        fprintf(stderr, "%s: the hub states no SHA-256 for this file: only its size was checked\n", t->say);
    return 0;
}

/* ---- a pull ---- */

/* The local path of r: out_path, or CACHE/OWNER/REPO/FILE, its folder made. */
static int local_path(const hub_ref *r, const hub_pull_params *p, char *path, size_t n, char *err, size_t errlen)
{
    char dir[4096];
    int w;
    if (p->out_path)
        w = snprintf(path, n, "%s", p->out_path);
    else {
        if (cache_dir(dir, sizeof dir, err, errlen))
            return -1;
        w = snprintf(path, n, "%s/%s/%s", dir, r->repo, r->file);
    }
    if (w <= 0 || (size_t)w >= n)
        return cv_errf(err, errlen, "the path for %s is too long", r->file);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return 0;
    *slash = '\0';
    return dir[0] ? cv_make_dirs(dir, err, errlen) : 0;
}

int hub_pull(const char *ref, const hub_pull_params *p, char *path, size_t path_len, char *err, size_t errlen)
{
    hub_ref r;
    hub_remote rem;
    char url[2048], part[4200], what[800], say[900], why[CONVOY_ERR_MAX];
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return cv_errf(err, errlen, "cannot start libsodium or libcurl");
    if (parse_ref(ref, &r, err, errlen) || (!r.file[0] && choose_file(&r, err, errlen)) ||
        local_path(&r, p, path, path_len, err, errlen))
        return -1;
    snprintf(url, sizeof url, "%s/%s/resolve/main/%s", endpoint(), r.repo, r.file);
    snprintf(what, sizeof what, "%s/%s", r.repo, r.file);
    snprintf(say, sizeof say, "convoy %s: %s", p->cmd, what);
    if (stat_remote(url, &rem, why, sizeof why)) {
        if (access(path, R_OK) != 0)
            return cv_errf(err, errlen, "%s", why);
        fprintf(stderr, "%s: the hub did not answer (%s): using the cached file\n", say, why);
        return 0;
    }
    if (cached_is_current(path, &rem)) {
        fprintf(stderr, "%s: up to date in %s\n", say, path);
        return 0;
    }
    snprintf(part, sizeof part, "%s.part", path);
    fprintf(stderr, "%s: downloading %.1f MB into %s\n", say, rem.size / 1e6, path);
    transfer t = {.total = rem.size, .what = what, .say = say};
    if (download(url, part, &t, err, errlen) || finish(&t, &rem, part, path, err, errlen))
        return -1;
    progress(&t, true);
    return 0;
}

int hub_model_option(const char *cmd, const char *hf, const char **model_path, char *buf, size_t n)
{
    char err[CONVOY_ERR_MAX];
    if (!hf == !*model_path) {
        fprintf(stderr, "convoy %s: give the model as -m PATH or -hf OWNER/REPO[:QUANT], one of them\n", cmd);
        return 2;
    }
    if (!hf)
        return 0;
    if (hub_pull(hf, &(hub_pull_params){.cmd = cmd}, buf, n, err, sizeof err)) {
        fprintf(stderr, "convoy %s: %s\n", cmd, err);
        return 1;
    }
    *model_path = buf;
    return 0;
}
