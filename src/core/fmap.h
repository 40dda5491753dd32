/* fmap.h: read-only memory mapping of a whole file.
 *
 * Contract: cv_fmap_open maps `path` read-only and shared; the mapping lives
 * until cv_fmap_close. Pages are loaded on first touch, so a process that
 * reads only some tensors keeps only those pages resident.
 * cv_fmap_release tells the kernel that the pages of [off, off+n) will not
 * be needed again (after a tensor has been repacked into private memory);
 * reading them later is still valid and faults them back in.
 * cv_open_regular is the open beneath it, for any file a user names.
 * cv_fmap_read copies bytes [off, off+n) of the file into dst with pread,
 * so the mapping's pages are not touched; an error names the file's range.
 * cv_make_dirs is mkdir -p, for the directories a user names for output. */
#ifndef CONVOY_CORE_FMAP_H
#define CONVOY_CORE_FMAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

typedef struct cv_fmap {
    const uint8_t *data;
    size_t size;
    int fd;
} cv_fmap;

/* Opens path read-only, refusing anything but a regular file (a FIFO, a
 * device, a directory) without waiting on it: returns the descriptor
 * (blocking, close-on-exec) with *st filled, or -1 after a message naming
 * path and what it is (errno is open's when the open failed). */
int cv_open_regular(const char *path, struct stat *st, char *err, size_t errlen);
int cv_fmap_open(cv_fmap *m, const char *path, char *err, size_t errlen);
void cv_fmap_release(cv_fmap *m, size_t off, size_t n);
int cv_fmap_read(const cv_fmap *m, size_t off, size_t n, void *dst, char *err, size_t errlen);
void cv_fmap_close(cv_fmap *m);
/* Creates dir and the directories above it that are missing (mode 0755);
 * returns 0 when dir is a directory this process can write, else -1 after a
 * message naming dir and why. */
int cv_make_dirs(const char *dir, char *err, size_t errlen);

#endif
