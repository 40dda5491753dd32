/* fuzz_rans.c: libFuzzer target for convoy's lossless coder.
 *
 * The first byte picks what the rest is: (0) a rANS stream to decode, (1)
 * a coded tensor of a type and length taken from the next bytes, (2) a
 * packed file, each of which must decode or be refused with a message,
 * never touching memory outside the input and the output (AddressSanitizer);
 * or (3) bytes to encode with a lane count from the next byte, which must
 * decode to themselves. Lengths stay under 1 MiB so that no input asks for
 * more memory than the fuzzer allows. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/pack.h"
#include "codec/planes.h"
#include "codec/rans.h"
#include "core/err.h"

#define CAP (1u << 20)

static uint8_t out[CAP], coded[CAP + 64];

static void must_fail_cleanly(int rc, const char *err, const char *prefix)
{
    if (rc && strncmp(err, prefix, strlen(prefix)) != 0)
        abort();
}

static void decode_stream(const uint8_t *d, size_t n)
{
    cv_cursor c;
    uint64_t got;
    char err[CV_ERRLEN] = "";
    cv_cursor_init(&c, d, n);
    must_fail_cleanly(cv_rans_decode(&c, out, CAP, &got, err, sizeof err), err, "rans: ");
}

static void decode_tensor(const uint8_t *d, size_t n)
{
    static const uint32_t types[] = {0, 1, 30, 2, 8, 12, 13, 14, 15};
    if (n < 3)
        return;
    const uint32_t type = types[d[0] % (sizeof types / sizeof types[0])];
    const uint64_t len = (uint64_t)d[1] << 8 | d[2];
    cv_cursor c;
    char err[CV_ERRLEN] = "";
    cv_cursor_init(&c, d + 3, n - 3);
    const int rc = cv_planes_decode(type, &c, out, len * 16, err, sizeof err);
    if (rc && strncmp(err, "rans: ", 6) && strncmp(err, "planes: ", 8))
        abort();
}

static void decode_pack(const uint8_t *d, size_t n)
{
    static FILE *sink;
    uint64_t total = 0, size, n_tensors;
    char err[CV_ERRLEN] = "";
    for (int i = 0; i < 8 && 8 + i < (int)n; i++)
        total |= (uint64_t)d[8 + i] << (8 * i);
    if (total > CAP)
        return;
    if (!sink)
        sink = fopen("/dev/null", "wb");
    const int rc = cv_pack_read(d, n, sink, &size, &n_tensors, err, sizeof err);
    if (rc && strncmp(err, "unpack: ", 8) && strncmp(err, "rans: ", 6) && strncmp(err, "planes: ", 8))
        abort();
}

static void round_trip(const uint8_t *d, size_t n)
{
    if (n < 1 || n - 1 > CAP)
        return;
    const int lanes = d[0] % CV_RANS_MAX_LANES + 1;
    uint64_t len, got;
    cv_cursor c;
    if (cv_rans_encode(d + 1, n - 1, lanes, coded, sizeof coded, &len, NULL, 0))
        abort();
    cv_cursor_init(&c, coded, len);
    if (cv_rans_decode(&c, out, CAP, &got, NULL, 0) || got != n - 1 || memcmp(out, d + 1, n - 1) ||
        cv_cursor_left(&c))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    switch (data[0] & 3) {
    case 0: decode_stream(data + 1, size - 1); break;
    case 1: decode_tensor(data + 1, size - 1); break;
    case 2: decode_pack(data + 1, size - 1); break;
    default: round_trip(data + 1, size - 1); break;
    }
    return 0;
}
