/* fuzz_sealed.c: libFuzzer target for sealed frames (seal.h section 3).
 *
 * The first input byte picks the path:
 * 0: the rest is a received frame: a 24-byte header, the bytes up to the
 *    last 16 as its payload and those as its tag; opening it under a key
 *    the input cannot know must fail (a success is a forged tag: abort),
 *    and must not advance the counter.
 * 1: a sender seals up to 8 frames cut from the input (each: a length
 *    byte, then that many payload bytes); then each of the next input
 *    bytes is an edit of the stream (op in the top 2 bits: flip a bit of a
 *    frame's header, payload or tag; swap two frames; replay one), and the
 *    receiver opens the stream in order. Every frame before the first
 *    position whose bytes differ from what was sealed there must open to
 *    its exact plaintext, and the first that differs must fail (after
 *    which the link would have failed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "pipe/seal.h"

#define MAX_FRAMES 8
#define MAX_PAYLOAD 255

typedef struct frame {
    uint8_t hdr[CV_FRAME_HEADER_SIZE];
    uint8_t p[MAX_PAYLOAD];
    size_t len;
    uint8_t tag[CV_SEAL_TAG_BYTES];
    uint8_t plain[MAX_PAYLOAD];
} frame;

static cv_seal_dir dir_of(void)
{
    cv_seal_dir d = {.counter = 0};
    for (int i = 0; i < CV_SEAL_KEY_BYTES; i++)
        d.key[i] = (uint8_t)(0xa0 + i);
    return d;
}

static void open_raw(const uint8_t *data, size_t size)
{
    if (size < CV_FRAME_HEADER_SIZE + CV_SEAL_TAG_BYTES)
        return;
    const size_t len = size - CV_FRAME_HEADER_SIZE - CV_SEAL_TAG_BYTES;
    uint8_t *p = malloc(len ? len : 1);
    memcpy(p, data + CV_FRAME_HEADER_SIZE, len);
    cv_seal_dir d = dir_of();
    char err[CV_ERRLEN];
    if (cv_seal_open(&d, data, p, len, data + size - CV_SEAL_TAG_BYTES, err, sizeof err) == 0 || d.counter != 0)
        abort();
    free(p);
}

/* Cuts and seals the frames; returns how many, and the input used. */
static int seal_frames(frame *f, const uint8_t **data, size_t *size)
{
    cv_seal_dir tx = dir_of();
    char err[CV_ERRLEN];
    int n = 0;
    while (n < MAX_FRAMES && *size >= 1) {
        size_t len = (*data)[0];
        if (len > *size - 1)
            len = *size - 1;
        frame *fr = &f[n];
        memset(fr, 0, sizeof *fr);
        const cv_frame_header h = {.magic = CV_FRAME_MAGIC, .version = CV_FRAME_VERSION, .type = CV_MSG_FORWARD,
                                   .id = (uint32_t)n, .payload_len = (uint32_t)len};
        cv_frame_header_encode(&h, fr->hdr);
        memcpy(fr->p, *data + 1, len);
        memcpy(fr->plain, *data + 1, len);
        fr->len = len;
        if (cv_seal_frame(&tx, fr->hdr, fr->p, len, fr->tag, err, sizeof err))
            abort();
        *data += 1 + len;
        *size -= 1 + len;
        n++;
    }
    return n;
}

/* Applies one edit byte to the stream of n frames. */
static void edit(frame *f, int n, uint8_t e)
{
    const int op = e >> 6, a = (e >> 3) % n, b = e % n;
    if (op == 0) { /* flip a bit: where from b's low bit, which byte from e */
        uint8_t *where = (b & 1) ? f[a].tag : f[a].hdr;
        where[e % ((b & 1) ? CV_SEAL_TAG_BYTES : CV_FRAME_HEADER_SIZE)] ^= (uint8_t)(1u << (e & 7));
    } else if (op == 1 && f[a].len) {
        f[a].p[e % f[a].len] ^= (uint8_t)(1u << (b & 7));
    } else if (op == 2) { /* swap */
        frame t = f[a];
        f[a] = f[b];
        f[b] = t;
    } else if (op == 3) { /* replay a in b's place */
        f[b] = f[a];
    }
}

/* Whether the frame at a position is not the one sealed there (edits can
 * undo each other). */
static int differs(const frame *x, const frame *orig)
{
    return x->len != orig->len || memcmp(x->hdr, orig->hdr, sizeof x->hdr) || memcmp(x->p, orig->p, x->len) ||
           memcmp(x->tag, orig->tag, sizeof x->tag);
}

static void stream(const uint8_t *data, size_t size)
{
    frame f[MAX_FRAMES], orig[MAX_FRAMES];
    const int n = seal_frames(f, &data, &size);
    if (n == 0)
        return;
    memcpy(orig, f, sizeof f);
    for (size_t i = 0; i < size; i++)
        edit(f, n, data[i]);
    cv_seal_dir rx = dir_of();
    char err[CV_ERRLEN];
    for (int i = 0; i < n; i++) {
        const int spoiled = differs(&f[i], &orig[i]); /* before the payload is opened in place */
        const int rc = cv_seal_open(&rx, f[i].hdr, f[i].p, f[i].len, f[i].tag, err, sizeof err);
        if (spoiled) {
            if (rc == 0)
                abort();
            return;
        }
        if (rc != 0 || memcmp(f[i].p, f[i].plain, f[i].len))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] == 0)
        open_raw(data + 1, size - 1);
    else if (data[0] == 1)
        stream(data + 1, size - 1);
    return 0;
}
