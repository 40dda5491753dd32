/* ship.c: the head's sending and the node's receiving of a shard (see
 * ship.h), and a receiving node's layers (node_impl.h): the shard of its
 * assignment from its cache, else fetched from the head (FETCH, then SHIP
 * frames into a .part, resumed after a cut), then checked by the
 * assignment's hashes as any model. */
#include "pipe/ship.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "codec/pack.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/cursor.h"
#include "core/err.h"
#include "model/shard.h"
#include "pipe/node_impl.h"

#define NOTE_MS 1000

void cv_ship_describe(const cv_ship_progress *p, char *buf, size_t len)
{
    const double mb = 1e6, rate = p->seconds > 0 ? p->coded / mb / p->seconds : 0;
    if (!p->finished) {
        snprintf(buf, len, "%.1f of %.1f MB (%.0f%%), %.1f MB/s", p->at / mb, p->size / mb,
                 p->size ? 100.0 * (double)p->at / (double)p->size : 100.0, rate);
        return;
    }
    const uint64_t moved = p->at - p->from;
    snprintf(buf, len, "%.1f MB from byte %" PRIu64 " as %.1f MB coded (%.1f%%) in %.2f s, %.2f MB/s coded",
             moved / mb, p->from, p->coded / mb, moved ? 100.0 * (double)p->coded / (double)moved : 0.0, p->seconds,
             rate);
}

/* ---- sending ---- */

/* The image as codec/pack.h reads it: bytes from the header, from the
 * model's mapping, or zeros (the padding between tensors). */
typedef struct image_src {
    const cv_llama *m;
    cv_shard_image img;
    cv_pack_tensor *tensors; /* [img.n_tensors] places in the image */
    uint8_t *zeros;          /* [alignment] */
} image_src;

/* Index of the tensor holding off, or -1 (header or padding). */
static long tensor_at(const image_src *s, uint64_t off)
{
    size_t lo = 0, hi = s->img.n_tensors;
    while (lo < hi) { /* the first tensor starting after off */
        const size_t mid = (lo + hi) / 2;
        if (s->tensors[mid].offset <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || off >= s->tensors[lo - 1].offset + s->tensors[lo - 1].size)
        return -1;
    return (long)lo - 1;
}

static const uint8_t *image_bytes(const void *user, uint64_t off, uint64_t n)
{
    const image_src *s = user;
    (void)n;
    if (off < s->img.layout.header_len)
        return s->img.layout.header + off;
    const long k = tensor_at(s, off);
    if (k < 0)
        return s->zeros;
    const gguf_tensor *t = &s->m->gguf.tensors[s->img.tensors[k]];
    return (const uint8_t *)t->data + (off - s->tensors[k].offset);
}

static int image_open(image_src *s, const cv_llama *m, int32_t l0, int32_t l1, cv_pack_src *src, char *err,
                      size_t errlen)
{
    *s = (image_src){.m = m};
    if (cv_shard_image_make(m, l0, l1, &s->img, err, errlen))
        return -1;
    s->tensors = cv_malloc(sizeof *s->tensors * (s->img.n_tensors ? s->img.n_tensors : 1));
    s->zeros = cv_calloc(1, s->img.layout.alignment);
    if (!s->tensors || !s->zeros)
        return cv_errf(err, errlen, "out of memory");
    for (uint64_t k = 0; k < s->img.n_tensors; k++) {
        const gguf_tensor *t = &m->gguf.tensors[s->img.tensors[k]];
        s->tensors[k] = (cv_pack_tensor){.offset = s->img.layout.offsets[k], .size = t->size, .type = t->type};
    }
    *src = (cv_pack_src){.size = s->img.layout.size, .tensors = s->tensors, .n_tensors = s->img.n_tensors,
                         .bytes = image_bytes, .user = s};
    return cv_pack_src_check(src, err, errlen);
}

static void image_close(image_src *s)
{
    cv_shard_image_free(&s->img);
    cv_free(s->tensors);
    cv_free(s->zeros);
}

/* Two frames in turn: one is coded while the link sends the other. */
typedef struct sender {
    cv_link *l;
    uint32_t id;
    uint8_t *buf[2];
    uint64_t ticket[2];
    bool live[2];
} sender;

/* Codes the segment at `at` into frame k and queues it; *coded gets its
 * payload bytes. The model pages it read are released. */
static int send_segment(sender *s, int k, const cv_pack_src *src, const image_src *img, uint64_t at,
                        uint64_t *next, uint64_t *coded, char *err, size_t errlen)
{
    if (s->live[k] && cv_link_wait_sent(s->l, s->ticket[k], err, errlen))
        return -1;
    s->live[k] = false;
    cv_pack_segment seg;
    cv_pack_segment_at(src, at, &seg);
    const cv_msg_ship m = {.offset = at, .size = src->size};
    size_t header;
    uint64_t len;
    if (cv_msg_ship_encode_header(&m, s->buf[k], CV_SHIP_FIXED_SIZE, &header, err, errlen) ||
        cv_pack_segment_encode(src, &seg, s->buf[k] + header, CV_PACK_SEGMENT_BOUND, &len, err, errlen))
        return -1;
    const long t = seg.kind == CV_PACK_TENSOR ? tensor_at(img, at) : -1;
    if (t >= 0) {
        const gguf_file *f = &img->m->gguf;
        const uint8_t *data = image_bytes(img, at, seg.len);
        cv_fmap_release((cv_fmap *)&f->map, (size_t)(data - f->map.data), (size_t)seg.len);
    }
    const struct iovec part = {.iov_base = s->buf[k], .iov_len = header + len};
    if (cv_link_sendv(s->l, CV_MSG_SHIP, s->id, &part, 1, &s->ticket[k], err, errlen))
        return -1;
    s->live[k] = true;
    *next = at + seg.len;
    *coded = header + len;
    return 0;
}

static int send_all(sender *s, const cv_pack_src *src, const image_src *img, uint64_t have, cv_ship_note_fn note,
                    void *user, char *err, size_t errlen)
{
    const int64_t t0 = cv_now_ms();
    int64_t noted = t0;
    cv_ship_progress p = {.from = cv_pack_boundary(src, have), .size = src->size};
    p.at = p.from;
    for (int k = 0; p.at < src->size; k = 1 - k) {
        uint64_t coded;
        if (send_segment(s, k, src, img, p.at, &p.at, &coded, err, errlen))
            return -1;
        p.coded += coded;
        p.seconds = (cv_now_ms() - t0) / 1e3;
        if (note && cv_now_ms() - noted >= NOTE_MS) {
            note(user, &p);
            noted = cv_now_ms();
        }
    }
    for (int k = 0; k < 2; k++)
        if (s->live[k] && cv_link_wait_sent(s->l, s->ticket[k], err, errlen))
            return -1;
    p.seconds = (cv_now_ms() - t0) / 1e3;
    p.finished = true;
    if (note)
        note(user, &p);
    return 0;
}

int cv_ship_send(cv_link *l, uint32_t id, const cv_llama *m, int32_t l0, int32_t l1, uint64_t have,
                 cv_ship_note_fn note, void *user, char *err, size_t errlen)
{
    image_src img;
    cv_pack_src src;
    sender s = {.l = l, .id = id};
    int rc = image_open(&img, m, l0, l1, &src, err, errlen);
    for (int k = 0; rc == 0 && k < 2; k++)
        if (!(s.buf[k] = cv_malloc(CV_SHIP_PAYLOAD_MAX)))
            rc = cv_errf(err, errlen, "out of memory");
    if (rc == 0 && have > src.size)
        rc = cv_errf(err, errlen, "%s: holds %" PRIu64 " bytes of layers [%d, %d), whose shard has %" PRIu64,
                     cv_link_name(l), have, l0, l1, src.size);
    if (rc == 0)
        rc = send_all(&s, &src, &img, have, note, user, err, errlen);
    for (int k = 0; k < 2; k++) {
        char ignored[CV_ERRLEN]; /* a failed send: the link reads the buffer until it gives up */
        if (s.live[k])
            cv_link_wait_sent(l, s.ticket[k], ignored, sizeof ignored);
        cv_free(s.buf[k]);
    }
    image_close(&img);
    return rc;
}

/* ---- receiving ---- */

/* The cache's rule for its files (ship.h): this user's, regular, one name. */
static int check_ours(const struct stat *st, const char *path, char *err, size_t errlen)
{
    if (S_ISLNK(st->st_mode))
        return cv_errf(err, errlen, "%s is a symbolic link, which the cache does not follow", path);
    if (!S_ISREG(st->st_mode) || st->st_uid != geteuid() || st->st_nlink != 1)
        return cv_errf(err, errlen, "%s is not a file the cache made (%s): refused, left as it is", path,
                       !S_ISREG(st->st_mode) ? "not a regular file"
                       : st->st_uid != geteuid() ? "another user's" : "it has other names (hard links)");
    return 0;
}

int cv_ship_cache_file(const char *path, bool *present, char *err, size_t errlen)
{
    struct stat st;
    *present = lstat(path, &st) == 0;
    if (!*present && errno != ENOENT)
        return cv_errf(err, errlen, "%s: %s", path, strerror(errno));
    return *present ? check_ours(&st, path, err, errlen) : 0;
}

void cv_ship_sweep(const char *dir, const char *pattern, int64_t age_s)
{
    DIR *d = opendir(dir);
    const time_t now = time(NULL);
    char path[4096 + 256], err[CV_ERRLEN];
    for (const struct dirent *e; d && (e = readdir(d)) != NULL;) {
        struct stat st;
        if (fnmatch(pattern, e->d_name, FNM_PATHNAME) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
            check_ours(&st, e->d_name, err, sizeof err) || now - st.st_mtime <= age_s)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            fprintf(stderr, "convoy stage: removed %s: left unfinished %lld minutes ago\n", path,
                    (long long)(now - st.st_mtime) / 60);
    }
    if (d)
        closedir(d);
}

/* Opens the .part that is there (O_NOFOLLOW: a symbolic link is refused,
 * O_NONBLOCK: a FIFO cannot hold this thread), a file of the cache's. */
static int open_part(cv_ship_rx *rx, char *err, size_t errlen)
{
    const int fd = open(rx->part, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) /* created by the first SHIP that fits */
        return 0;
    if (fd < 0)
        return errno == ELOOP ? cv_errf(err, errlen, "%s is a symbolic link, which the cache does not follow", rx->part)
                              : cv_errf(err, errlen, "%s: cannot open: %s", rx->part, strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) ? cv_errf(err, errlen, "%s: %s", rx->part, strerror(errno))
                            : check_ours(&st, rx->part, err, errlen);
    if (rc == 0 && !(rx->fp = fdopen(fd, "ab")))
        rc = cv_errf(err, errlen, "%s: %s", rx->part, strerror(errno));
    if (rc) {
        close(fd);
        return -1;
    }
    rx->have = (uint64_t)st.st_size;
    return 0;
}

int cv_ship_rx_open(cv_ship_rx *rx, const char *path, uint64_t max_size, char *err, size_t errlen)
{
    memset(rx, 0, sizeof *rx);
    rx->max_size = max_size;
    rx->code = CV_PERR_INTERNAL;
    if (snprintf(rx->path, sizeof rx->path, "%s", path) >= (int)sizeof rx->path)
        return cv_errf(err, errlen, "%s: path too long", path);
    snprintf(rx->part, sizeof rx->part, "%s.part", path);
    if (open_part(rx, err, errlen))
        return -1;
    if (!(rx->buf = cv_malloc(CV_PACK_SEGMENT_MAX)))
        return cv_errf(err, errlen, "out of memory");
    return 0;
}

/* Whether a file of m->size bytes may come: within max_size, and what it
 * adds to the .part within the disk's free space (statvfs). */
static int rx_room(const cv_ship_rx *rx, const cv_msg_ship *m, char *err, size_t errlen)
{
    if (rx->max_size && m->size > rx->max_size)
        return cv_errf(err, errlen, "SHIP claims a shard of %" PRIu64 " bytes, more than this stage's memory budget "
                                    "of %" PRIu64 " bytes, which must hold it",
                       m->size, rx->max_size);
    char dir[sizeof rx->path];
    snprintf(dir, sizeof dir, "%s", rx->path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = 0; /* "/x": "/" */
    else
        snprintf(dir, sizeof dir, ".");
    struct statvfs vfs;
    if (statvfs(dir, &vfs))
        return cv_errf(err, errlen, "%s: cannot tell its free space: %s", dir, strerror(errno));
    const uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    const uint64_t more = m->size > rx->have ? m->size - rx->have : 0;
    if (more > free_bytes)
        return cv_errf(err, errlen, "SHIP claims a shard of %" PRIu64 " bytes, %" PRIu64 " more than %s holds, and "
                                    "%s has %" PRIu64 " bytes free",
                       m->size, more, rx->part, dir, free_bytes);
    return 0;
}

/* The .part of a new transfer: made here, by this process alone. */
static int create_part(cv_ship_rx *rx, char *err, size_t errlen)
{
    const int fd = open(rx->part, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || !(rx->fp = fdopen(fd, "ab"))) {
        const int e = errno;
        if (fd >= 0)
            close(fd);
        return cv_errf(err, errlen, "%s: cannot create: %s", rx->part, strerror(e));
    }
    return 0;
}

/* The first SHIP may start before the end of the .part (at the boundary
 * below it): the rest of the .part goes. Its size is checked first, so a
 * claim that does not fit writes nothing. */
static int rx_start(cv_ship_rx *rx, const cv_msg_ship *m, char *err, size_t errlen)
{
    rx->code = CV_PERR_NO_MEMORY;
    if (rx_room(rx, m, err, errlen))
        return -1;
    rx->code = CV_PERR_INTERNAL;
    if (!rx->fp && create_part(rx, err, errlen))
        return -1;
    if (fflush(rx->fp) || ftruncate(fileno(rx->fp), (off_t)m->offset))
        return cv_errf(err, errlen, "%s: cannot truncate: %s", rx->part, strerror(errno));
    rx->have = m->offset;
    rx->size = m->size;
    rx->progress = (cv_ship_progress){.from = m->offset, .at = m->offset, .size = m->size};
    rx->t0_ms = cv_now_ms();
    return 0;
}

/* Whether m starts where it must: the first at or before the end of the
 * .part, the others where the last ended, in a file of the same size. */
static int rx_follows(const cv_ship_rx *rx, const cv_msg_ship *m, char *err, size_t errlen)
{
    if (rx->size == 0)
        return m->offset <= rx->have ? 0
                                     : cv_errf(err, errlen, "SHIP at byte %" PRIu64 ", but %s holds %" PRIu64,
                                               m->offset, rx->part, rx->have);
    if (m->offset != rx->have || m->size != rx->size)
        return cv_errf(err, errlen, "SHIP of bytes at %" PRIu64 " of %" PRIu64 ", expected at %" PRIu64 " of %" PRIu64,
                       m->offset, m->size, rx->have, rx->size);
    return 0;
}

/* Flushes the complete file to disk and gives it its name. */
static int rx_finish(cv_ship_rx *rx, char *err, size_t errlen)
{
    const int failed = fflush(rx->fp) || fsync(fileno(rx->fp));
    const int e = errno;
    fclose(rx->fp);
    rx->fp = NULL;
    if (failed)
        return cv_errf(err, errlen, "%s: write failed: %s", rx->part, strerror(e));
    if (rename(rx->part, rx->path))
        return cv_errf(err, errlen, "%s: cannot rename to %s: %s", rx->part, rx->path, strerror(errno));
    rx->progress.finished = true;
    return 0;
}

int cv_ship_rx_take(cv_ship_rx *rx, const void *payload, size_t len, bool *done, char *err, size_t errlen)
{
    cv_msg_ship m;
    cv_cursor c;
    uint64_t n;
    *done = false;
    rx->code = CV_PERR_BAD_FRAME;
    if (cv_msg_ship_decode(payload, len, &m, err, errlen) || rx_follows(rx, &m, err, errlen))
        return -1;
    cv_cursor_init(&c, m.segment, m.segment_len);
    if (cv_pack_segment_decode(&c, rx->buf, CV_PACK_SEGMENT_MAX, &n, NULL, NULL, err, errlen))
        return -1;
    if (cv_cursor_left(&c) || n > m.size - m.offset)
        return cv_errf(err, errlen, "SHIP: a segment of %" PRIu64 " bytes (%zu bytes after it) at %" PRIu64
                                    " of a %" PRIu64 "-byte file",
                       n, cv_cursor_left(&c), m.offset, m.size);
    if (rx->size == 0 && rx_start(rx, &m, err, errlen))
        return -1;
    rx->code = CV_PERR_INTERNAL;
    if (fwrite(rx->buf, 1, n, rx->fp) != n)
        return cv_errf(err, errlen, "%s: write failed: %s", rx->part, strerror(errno));
    rx->have += n;
    rx->progress.at = rx->have;
    rx->progress.coded += len;
    rx->progress.seconds = (cv_now_ms() - rx->t0_ms) / 1e3;
    if (rx->have < rx->size)
        return 0;
    *done = true;
    return rx_finish(rx, err, errlen);
}

void cv_ship_rx_close(cv_ship_rx *rx)
{
    if (rx->fp)
        fclose(rx->fp);
    cv_free(rx->buf);
    rx->fp = NULL;
    rx->buf = NULL;
}

/* ---- a receiving node's layers (node_impl.h) ---- */

/* A .part not written for PART_KEEP_S was left: a head whose transfer was
 * cut comes back within seconds (its chain reopens), so half an hour
 * keeps every resume worth having, while transfers left by peers that
 * invent models (each claim fits the free disk, ship.h) go. The cache is
 * swept at start and whenever a transfer is left unfinished. */
#define PART_KEEP_S (30 * 60)
#define HEX4 "[0-9a-f][0-9a-f][0-9a-f][0-9a-f]"
#define PART_PATTERN HEX4 HEX4 HEX4 HEX4 ".layers-[0-9]*-[0-9]*.gguf.part"

/* Loads the shard at path and checks it against the assignment; a file
 * that fails is removed (with its hashes' cache). */
static int take_shard(node *n, const char *path, char *err, size_t errlen)
{
    if (cv_node_load_model(n, path, err, errlen) == 0 && cv_node_check_model(n, err, errlen) == 0)
        return 0;
    char hashes[sizeof n->model_path + 16];
    snprintf(hashes, sizeof hashes, "%s.convoy-hashes", path);
    cv_node_unload_model(n);
    unlink(path);
    unlink(hashes);
    return -1;
}

static void note_receiving(void *user, const cv_ship_progress *p)
{
    const node *n = user;
    char line[256];
    cv_ship_describe(p, line, sizeof line);
    fprintf(stderr, "convoy stage: %s layers [%u, %u): %s\n", p->finished ? "received" : "receiving", n->hello.l0,
            n->hello.l1, line);
}

/* FETCH: asks the head for the shard from what rx's .part holds. */
static int ask_shard(node *n, uint32_t id, const cv_ship_rx *rx, char *err, size_t errlen)
{
    uint8_t buf[CV_MSG_FETCH_SIZE];
    size_t len;
    if (rx->have)
        fprintf(stderr, "convoy stage: resuming layers [%u, %u) after byte %llu of %s\n", n->hello.l0, n->hello.l1,
                (unsigned long long)rx->have, rx->part);
    const uint32_t cap = cv_node_hello_cap(n);
    cv_link_set_max_payload(n->head_link, CV_SHIP_PAYLOAD_MAX > cap ? CV_SHIP_PAYLOAD_MAX : cap);
    return cv_msg_fetch_encode(rx->have, buf, sizeof buf, &len, err, errlen) ||
                   cv_link_send(n->head_link, CV_MSG_FETCH, id, buf, len, err, errlen)
               ? -1
               : 0;
}

/* Takes SHIP frames until the shard is complete, telling its progress;
 * on failure *code is the ERROR the head is owed (0: it was told). */
static int take_ships(node *n, cv_ship_rx *rx, uint32_t *code, char *err, size_t errlen)
{
    int64_t noted = cv_now_ms();
    for (bool done = false; !done;) {
        cv_frame f;
        if (cv_node_head_frame(n, &f, code, err, errlen))
            return -1;
        const bool ship = f.h.type == CV_MSG_SHIP;
        const int rc = ship ? cv_ship_rx_take(rx, f.payload, f.h.payload_len, &done, err, errlen)
                            : cv_errf(err, errlen, "expected SHIP, got %s", cv_msg_type_name(f.h.type));
        *code = ship ? rx->code : CV_PERR_BAD_STATE;
        cv_link_release(n->head_link, &f);
        n->heard = cv_now_ms();
        if (rc)
            return -1;
        if (done || n->heard - noted >= 1000) {
            note_receiving(n, &rx->progress);
            noted = n->heard;
        }
    }
    return 0;
}

/* Removes the .part files of transfers left unfinished PART_KEEP_S ago. */
void cv_node_sweep_parts(const node *n) { cv_ship_sweep(n->o->cache_dir, PART_PATTERN, PART_KEEP_S); }

/* Receives the shard into path (*code: the ERROR owed on failure). The
 * stage's budget bounds the size it believes (ship.h); a transfer left
 * unfinished sweeps the cache of older ones. */
static int fetch_shard(node *n, uint32_t id, const char *path, uint32_t *code, char *err, size_t errlen)
{
    cv_ship_rx rx;
    *code = CV_PERR_INTERNAL;
    const int rc = cv_ship_rx_open(&rx, path, n->budget, err, errlen) || ask_shard(n, id, &rx, err, errlen) ||
                           take_ships(n, &rx, code, err, errlen)
                       ? -1
                       : 0;
    cv_ship_rx_close(&rx);
    cv_link_set_max_payload(n->head_link, cv_node_hello_cap(n));
    if (rc)
        cv_node_sweep_parts(n);
    return rc;
}

/* Where the shard of the assignment's layers of the head's model is kept:
 * DIR/HASH.layers-L0-L1.gguf (HASH: the model's metadata hash, 16 hex);
 * PART_PATTERN matches the .part files of such names. */
static void shard_path(const node *n, char *path, size_t len)
{
    char hex[17];
    cv_hash_hex8(n->hello.model_hash, hex);
    snprintf(path, len, "%s/%s.layers-%u-%u.gguf", n->o->cache_dir, hex, n->hello.l0, n->hello.l1);
}

/* A receiving node's layers: the shard it has when it checks, else from
 * the cache, else fetched from the head (resumed from a .part; a resumed
 * file that fails the check is fetched again, whole). */
int cv_node_receive_layers(node *n, uint32_t id, uint32_t *code, char *err, size_t errlen)
{
    char path[sizeof n->model_path], part[sizeof path + 8];
    shard_path(n, path, sizeof path);
    snprintf(part, sizeof part, "%s.part", path);
    *code = CV_PERR_FINGERPRINT;
    if (n->has_model && !strcmp(n->model_path, path) && cv_node_check_model(n, err, errlen) == 0)
        return 0;
    bool present;
    *code = CV_PERR_INTERNAL;
    if (cv_ship_cache_file(path, &present, err, errlen)) /* named in the message, for the operator */
        return -1;
    if (present) {
        if (take_shard(n, path, err, errlen) == 0) {
            fprintf(stderr, "convoy stage: layers [%u, %u) from the cache: %s\n", n->hello.l0, n->hello.l1, path);
            return 0;
        }
        fprintf(stderr, "convoy stage: the cached layers do not check: %s; fetching them\n", err);
    }
    struct stat st;
    const bool resumed = lstat(part, &st) == 0 && st.st_size > 0;
    for (int attempt = 0; attempt < 1 + resumed; attempt++) {
        if (attempt > 0)
            unlink(part);
        if (fetch_shard(n, id, path, code, err, errlen))
            return -1;
        *code = CV_PERR_FINGERPRINT;
        if (take_shard(n, path, err, errlen) == 0)
            return 0;
        fprintf(stderr, "convoy stage: the layers received do not check: %s%s\n", err,
                attempt + 1 < 1 + resumed ? "; fetching them whole" : "");
    }
    return -1;
}
