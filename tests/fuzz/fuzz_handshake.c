/* fuzz_handshake.c: libFuzzer target for the key handshake (seal.h).
 *
 * The first input byte picks the path:
 * 0: the server meets arbitrary bytes: the next 36 are HELLO, the 32 after
 *    them PROOF (zero-padded); a PROOF that verifies would be a forgery
 *    of a BLAKE2b MAC under a key the input cannot know: abort.
 * 1: the client meets an arbitrary 64-byte REPLY: it must be refused.
 * 2: a man in the middle: a real handshake between a client and a server
 *    holding the same key, whose three messages are XORed with the next
 *    36 + 64 + 32 input bytes; it must succeed, with matching keys, exactly
 *    when every mask byte is 0, and fail at some step otherwise.
 * Any message a step writes must be non-empty. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "pipe/seal.h"

static const cv_seal_key key = {{0x5a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}};

/* The next n input bytes into out, zero-padded when the input ends. */
static void take(const uint8_t **data, size_t *size, uint8_t *out, size_t n)
{
    const size_t k = *size < n ? *size : n;
    memcpy(out, *data, k);
    memset(out + k, 0, n - k);
    *data += k;
    *size -= k;
}

static void xor_in(uint8_t *msg, const uint8_t *mask, size_t n, int *changed)
{
    for (size_t i = 0; i < n; i++) {
        msg[i] ^= mask[i];
        *changed |= mask[i] != 0;
    }
}

static void check_err(int rc, const char *err)
{
    if (rc != 0 && err[0] == 0)
        abort();
}

static void server_side(const uint8_t *data, size_t size)
{
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    char err[CV_ERRLEN] = "";
    cv_seal_hs s;
    take(&data, &size, hello, sizeof hello);
    take(&data, &size, proof, sizeof proof);
    int rc = cv_seal_server_reply(&s, &key, hello, reply, err, sizeof err);
    check_err(rc, err);
    if (rc == 0 && cv_seal_server_finish(&s, proof, err, sizeof err) == 0)
        abort();
}

static void client_side(const uint8_t *data, size_t size)
{
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    char err[CV_ERRLEN] = "";
    cv_seal_hs c;
    take(&data, &size, reply, sizeof reply);
    if (cv_seal_client_hello(&c, hello, err, sizeof err) || memcmp(hello, CV_SEAL_MAGIC, 4))
        abort();
    if (cv_seal_client_finish(&c, &key, reply, proof, err, sizeof err) == 0)
        abort();
    check_err(-1, err);
}

static void in_the_middle(const uint8_t *data, size_t size)
{
    uint8_t hello[CV_SEAL_HELLO_BYTES], reply[CV_SEAL_REPLY_BYTES], proof[CV_SEAL_PROOF_BYTES];
    uint8_t m_hello[CV_SEAL_HELLO_BYTES], m_reply[CV_SEAL_REPLY_BYTES], m_proof[CV_SEAL_PROOF_BYTES];
    take(&data, &size, m_hello, sizeof m_hello);
    take(&data, &size, m_reply, sizeof m_reply);
    take(&data, &size, m_proof, sizeof m_proof);
    char err[CV_ERRLEN] = "";
    cv_seal_hs c, s;
    int changed = 0, rc = cv_seal_client_hello(&c, hello, err, sizeof err);
    xor_in(hello, m_hello, sizeof hello, &changed);
    if (rc == 0 && (rc = cv_seal_server_reply(&s, &key, hello, reply, err, sizeof err)) == 0) {
        xor_in(reply, m_reply, sizeof reply, &changed);
        if ((rc = cv_seal_client_finish(&c, &key, reply, proof, err, sizeof err)) == 0) {
            xor_in(proof, m_proof, sizeof proof, &changed);
            rc = cv_seal_server_finish(&s, proof, err, sizeof err);
        }
    }
    check_err(rc, err);
    if ((rc == 0) != !changed)
        abort();
    if (rc == 0 && (memcmp(c.session.tx.key, s.session.rx.key, CV_SEAL_KEY_BYTES) ||
                    memcmp(c.session.rx.key, s.session.tx.key, CV_SEAL_KEY_BYTES)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t mode = data[0];
    if (mode == 0)
        server_side(data + 1, size - 1);
    else if (mode == 1)
        client_side(data + 1, size - 1);
    else if (mode == 2)
        in_the_middle(data + 1, size - 1);
    return 0;
}
