/* ship.h: layers shipped from the head to a node that has no model file
 * (proto.h's FETCH and SHIP, `convoy stage --cache DIR`).
 *
 * What travels is the shard file of the node's layers (model/shard.h's
 * image: the file `convoy split` would write, the same bytes every time),
 * cut into segments and coded by codec/pack.h, one segment per SHIP frame.
 * The node appends each decoded segment to PATH.part and renames it to
 * PATH when the last has come; a transfer cut before resumes from what
 * the .part holds (rounded down to a segment boundary by the head). The
 * node then checks the file like any model (ship.c, for the node), so a corrupt
 * or forged segment is refused by the hashes, not trusted.
 *
 * Contract:
 * - cv_ship_send (head): sends the image of layers [l0, l1) of m (its
 *   whole file, mapped) on link l as SHIP frames of `id`, from the largest
 *   boundary not above `have` to the end. It codes one segment while the
 *   link sends the last, so the link stays busy, and releases the pages
 *   of m's mapping it has coded (the head keeps no more of the model
 *   resident than before). note (may be NULL) hears of the progress at
 *   most once a second, and once at the end.
 * - cv_ship_rx (node): rx_open starts receiving `path` (its .part kept
 *   from before: rx->have bytes of it); rx_take takes one SHIP payload:
 *   its offset must be a point not after rx->have (earlier truncates the
 *   .part there), its segment must decode (hostile input: the codec
 *   refuses any malformed one) and end inside the file; *done once the
 *   file is complete, flushed and renamed. rx_close keeps the .part of an
 *   unfinished transfer for the next one. A refusal leaves its ERROR code
 *   (proto.h) in rx->code.
 * - The size a head claims is believed only as far as it fits: the first
 *   SHIP of a file larger than max_size (the stage's memory budget, which
 *   must hold it; 0: none) or than what the disk has free for it is
 *   refused (NO_MEMORY) before the .part is even created.
 * - The cache's files: a .part or shard is used only if this process's
 *   user owns it, it is a regular file and it has no other name (no
 *   symbolic link is followed, no hard link written through); a new .part
 *   is created exclusively. cv_ship_cache_file says whether a path is
 *   such a file. cv_ship_sweep removes the files of dir whose names match
 *   pattern (fnmatch) that are the cache's by that rule and were last
 *   written more than age_s seconds ago. */
#ifndef CONVOY_PIPE_SHIP_H
#define CONVOY_PIPE_SHIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/llama.h"
#include "pipe/link.h"

/* One end's view of a transfer. */
typedef struct cv_ship_progress {
    uint64_t from;    /* the shard's byte the transfer started at */
    uint64_t at;      /* the bytes of the shard there now */
    uint64_t size;    /* the shard's bytes */
    uint64_t coded;   /* SHIP payload bytes of this transfer so far */
    double seconds;   /* since its first segment */
    bool finished;
} cv_ship_progress;

typedef void (*cv_ship_note_fn)(void *user, const cv_ship_progress *p);

int cv_ship_send(cv_link *l, uint32_t id, const cv_llama *m, int32_t l0, int32_t l1, uint64_t have,
                 cv_ship_note_fn note, void *user, char *err, size_t errlen);

typedef struct cv_ship_rx {
    char path[4096];
    char part[4096 + 8];
    FILE *fp;
    uint64_t have;     /* bytes of the .part */
    uint64_t size;     /* the shard's, known from the first SHIP */
    uint64_t max_size; /* the largest file taken, 0: any the disk holds */
    uint8_t *buf;      /* one decoded segment */
    cv_ship_progress progress;
    int64_t t0_ms;
    uint32_t code;     /* the ERROR code of a refusal (CV_PERR_*) */
} cv_ship_rx;

int cv_ship_rx_open(cv_ship_rx *rx, const char *path, uint64_t max_size, char *err, size_t errlen);
int cv_ship_rx_take(cv_ship_rx *rx, const void *payload, size_t len, bool *done, char *err, size_t errlen);
void cv_ship_rx_close(cv_ship_rx *rx);

/* 0 with *present false (nothing there) or true (a file of the cache's);
 * -1 with a message naming what the path is instead. */
int cv_ship_cache_file(const char *path, bool *present, char *err, size_t errlen);
void cv_ship_sweep(const char *dir, const char *pattern, int64_t age_s);

/* "12.3 of 612.0 MB (2%), 11.9 MB/s" / "612.0 MB from byte 0 as 590.1 MB
 * coded (96.4%) in 48.1 s, 12.27 MB/s coded": a progress line's tail. */
void cv_ship_describe(const cv_ship_progress *p, char *buf, size_t len);

#endif
