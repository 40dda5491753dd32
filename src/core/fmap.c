/* fmap.c: read-only shared mmap of a whole file (fmap.h).
 *
 * The cv_fmap owns the mapping and the open descriptor until cv_fmap_close,
 * which also resets the struct (data NULL, fd -1) so closing twice is
 * harmless. An empty file is opened without a mapping (data NULL, size 0);
 * parsers then see zero bytes. cv_fmap_release drops only whole pages that
 * lie inside the range, so pages shared with neighbouring data stay. */
#include "core/fmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"

static const char *kind_of(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
                                             : "not a plain file";
}

int cv_open_regular(const char *path, struct stat *st, char *err, size_t errlen)
{
    /* O_NONBLOCK: opening a FIFO would otherwise wait for its writer. */
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        const int e = errno;
        cv_errf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        errno = e; /* the caller may tell a missing file apart */
        return -1;
    }
    int rc = 0;
    if (fstat(fd, st) != 0)
        rc = cv_errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st->st_mode))
        rc = cv_errf(err, errlen, "%s is %s, not a regular file", path, kind_of(st->st_mode));
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = cv_errf(err, errlen, "%s: %s", path, strerror(errno));
    if (rc)
        close(fd);
    return rc ? -1 : fd;
}

int cv_fmap_open(cv_fmap *m, const char *path, char *err, size_t errlen)
{
    m->data = NULL;
    m->size = 0;
    struct stat st;
    m->fd = cv_open_regular(path, &st, err, errlen);
    if (m->fd < 0)
        return -1;
    if ((uint64_t)st.st_size > SIZE_MAX) {
        cv_fmap_close(m);
        return cv_errf(err, errlen, "%s: file too large to map (%lld bytes)", path, (long long)st.st_size);
    }
    if (st.st_size == 0)
        return 0;
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, m->fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        cv_fmap_close(m);
        return cv_errf(err, errlen, "%s: cannot map %lld bytes: %s", path, (long long)st.st_size, strerror(e));
    }
    m->data = p;
    m->size = (size_t)st.st_size;
    return 0;
}

void cv_fmap_release(cv_fmap *m, size_t off, size_t n)
{
    if (!m->data || off >= m->size)
        return;
    if (n > m->size - off)
        n = m->size - off;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t lo = (off + page - 1) / page * page;
    size_t hi = (off + n) / page * page;
    if (off + n == m->size)
        hi = m->size; /* the file's last partial page holds nothing else */
    if (hi > lo)
        madvise((void *)(m->data + lo), hi - lo, MADV_DONTNEED);
}

int cv_fmap_read(const cv_fmap *m, size_t off, size_t n, void *dst, char *err, size_t errlen)
{
    if (off > m->size || n > m->size - off)
        return cv_errf(err, errlen, "bytes [%zu, %zu) lie past the file's end (%zu)", off, off + n, m->size);
    for (size_t done = 0; done < n;) {
        const ssize_t r = pread(m->fd, (uint8_t *)dst + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return cv_errf(err, errlen, "cannot read bytes [%zu, %zu): %s", off + done, off + n,
                           r < 0 ? strerror(errno) : "the file shrank");
        done += (size_t)r;
    }
    return 0;
}

void cv_fmap_close(cv_fmap *m)
{
    if (m->data)
        munmap((void *)m->data, m->size);
    if (m->fd >= 0)
        close(m->fd);
    m->data = NULL;
    m->size = 0;
    m->fd = -1;
}

int cv_make_dirs(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return cv_errf(err, errlen, "%.200s...: the path is too long", dir);
    for (char *q = path + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            if (mkdir(path, 0755) && errno != EEXIST)
                return cv_errf(err, errlen, "%s: cannot create %s: %s", dir, path, strerror(errno));
            *q = '/';
        }
    if (mkdir(path, 0755) && errno != EEXIST)
        return cv_errf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
    if (stat(path, &st) || !S_ISDIR(st.st_mode) || access(path, W_OK))
        return cv_errf(err, errlen, "%s: not a directory this process can write", dir);
    return 0;
}
