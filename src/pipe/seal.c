/* seal.c: see seal.h. */
#include "pipe/seal.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/err.h"
#include "core/fmap.h"
#include "core/utf8.h"

#define HEX_LEN (2 * CV_SEAL_KEY_BYTES)

static const char auth_failed[] = "frame failed authentication (tampered, replayed or out of order)";

int cv_seal_init(char *err, size_t errlen)
{
    /* sodium_init is thread-safe and returns 1 once it already ran */
    if (sodium_init() < 0)
        return cv_errf(err, errlen, "libsodium failed to initialize");
    return 0;
}

/* ---- key files ---- */

/* Parses the file's bytes: 64 hex digits and an optional newline. */
static int parse_key(const char *path, const char *text, size_t n, cv_seal_key *key, char *err, size_t errlen)
{
    if (n != HEX_LEN && !(n == HEX_LEN + 1 && text[HEX_LEN] == '\n'))
        return cv_errf(err, errlen, "key file %s: expected %d hex digits and a newline, found %zu bytes", path,
                       HEX_LEN, n);
    for (int i = 0; i < CV_SEAL_KEY_BYTES; i++) {
        const int hi = cv_hex_digit(text[2 * i]), lo = cv_hex_digit(text[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return cv_errf(err, errlen, "key file %s: byte %d is not a hex digit", path, hi < 0 ? 2 * i : 2 * i + 1);
        key->k[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int cv_seal_key_load(const char *path, cv_seal_key *key, char *err, size_t errlen)
{
    struct stat st;
    char why[CV_ERRLEN];
    const int fd = cv_open_regular(path, &st, why, sizeof why); /* a FIFO must not hang the start */
    if (fd < 0)
        return cv_errf(err, errlen, "key file: %s", why);
    char text[HEX_LEN + 2];
    int rc = 0;
    if (st.st_mode & 077) /* a key others can read is no secret */
        rc = cv_errf(err, errlen, "key file %s is readable by others (mode %04o); chmod 600 it", path,
                     (unsigned)(st.st_mode & 07777));
    ssize_t n = 0;
    if (rc == 0 && (n = read(fd, text, sizeof text)) < 0)
        rc = cv_errf(err, errlen, "key file %s: %s", path, strerror(errno));
    close(fd);
    if (rc == 0)
        rc = parse_key(path, text, (size_t)n, key, err, errlen);
    sodium_memzero(text, sizeof text);
    return rc;
}

int cv_seal_key_generate(const char *path, char *err, size_t errlen)
{
    if (cv_seal_init(err, errlen))
        return -1;
    const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == EEXIST ? cv_errf(err, errlen, "%s exists; refusing to overwrite a key file", path)
                               : cv_errf(err, errlen, "%s: %s", path, strerror(errno));
    uint8_t k[CV_SEAL_KEY_BYTES];
    char text[HEX_LEN + 2];
    randombytes_buf(k, sizeof k);
    sodium_bin2hex(text, sizeof text, k, sizeof k);
    text[HEX_LEN] = '\n';
    /* O_CREAT's mode went through the umask, which can only have removed bits */
    int rc = fchmod(fd, 0600) != 0 || write(fd, text, HEX_LEN + 1) != HEX_LEN + 1 || fsync(fd) != 0;
    const int e = errno;
    rc |= close(fd) != 0;
    sodium_memzero(k, sizeof k);
    sodium_memzero(text, sizeof text);
    if (rc) {
        unlink(path);
        return cv_errf(err, errlen, "%s: writing the key failed: %s", path, strerror(e ? e : errno));
    }
    return 0;
}

/* ---- the handshake ---- */

/* KDF(label) of seal.h section 2 into out. */
static void kdf(const cv_seal_key *key, const char *label, const uint8_t dh[32], const cv_seal_hs *hs,
                uint8_t out[32])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, key->k, sizeof key->k, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
    crypto_generichash_update(&st, dh, 32);
    crypto_generichash_update(&st, hs->cpk, 32);
    crypto_generichash_update(&st, hs->spk, 32);
    crypto_generichash_final(&st, out, 32);
}

/* A role's proof: keyed BLAKE2b over its label and the transcript. */
static void proof(const uint8_t proof_key[32], const char *role, const cv_seal_hs *hs, uint8_t out[32])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, proof_key, 32, 32);
    crypto_generichash_update(&st, (const uint8_t *)role, strlen(role));
    crypto_generichash_update(&st, (const uint8_t *)CV_SEAL_MAGIC, 4);
    crypto_generichash_update(&st, hs->cpk, 32);
    crypto_generichash_update(&st, hs->spk, 32);
    crypto_generichash_final(&st, out, 32);
}

/* Derives both frame keys (as the client or the server sees them), both
 * proof keys, and this side's expected or own server proof. */
static int derive(cv_seal_hs *hs, const cv_seal_key *key, const uint8_t *peer_pk, bool server, uint8_t proof_s[32],
                  char *err, size_t errlen)
{
    uint8_t dh[32], c2s[32], s2c[32], proof_s_key[32];
    if (crypto_scalarmult(dh, hs->sk, peer_pk) != 0)
        return cv_errf(err, errlen, "key handshake: the peer's public key is of low order");
    kdf(key, "convoy c2s", dh, hs, c2s);
    kdf(key, "convoy s2c", dh, hs, s2c);
    kdf(key, "convoy proof s", dh, hs, proof_s_key);
    kdf(key, "convoy proof c", dh, hs, hs->proof_c_key);
    proof(proof_s_key, "server", hs, proof_s);
    memcpy(hs->session.tx.key, server ? s2c : c2s, 32);
    memcpy(hs->session.rx.key, server ? c2s : s2c, 32);
    hs->session.tx.counter = hs->session.rx.counter = 0;
    sodium_memzero(dh, sizeof dh);
    sodium_memzero(c2s, sizeof c2s);
    sodium_memzero(s2c, sizeof s2c);
    sodium_memzero(proof_s_key, sizeof proof_s_key);
    return 0;
}

static int fail_wiped(cv_seal_hs *hs)
{
    cv_seal_hs_wipe(hs);
    return -1;
}

int cv_seal_client_hello(cv_seal_hs *hs, uint8_t out[CV_SEAL_HELLO_BYTES], char *err, size_t errlen)
{
    if (cv_seal_init(err, errlen))
        return -1;
    memset(hs, 0, sizeof *hs);
    crypto_box_keypair(hs->pk, hs->sk);
    memcpy(hs->cpk, hs->pk, 32);
    memcpy(out, CV_SEAL_MAGIC, 4);
    memcpy(out + 4, hs->pk, 32);
    return 0;
}

int cv_seal_server_reply(cv_seal_hs *hs, const cv_seal_key *key, const uint8_t in[CV_SEAL_HELLO_BYTES],
                         uint8_t out[CV_SEAL_REPLY_BYTES], char *err, size_t errlen)
{
    if (cv_seal_init(err, errlen))
        return -1;
    memset(hs, 0, sizeof *hs);
    if (memcmp(in, CV_SEAL_MAGIC, 4) != 0)
        return cv_errf(err, errlen, "key handshake: the peer did not begin with \"%s\"", CV_SEAL_MAGIC);
    crypto_box_keypair(hs->pk, hs->sk);
    memcpy(hs->cpk, in + 4, 32);
    memcpy(hs->spk, hs->pk, 32);
    if (derive(hs, key, hs->cpk, true, out + 32, err, errlen))
        return fail_wiped(hs);
    memcpy(out, hs->pk, 32);
    return 0;
}

int cv_seal_client_finish(cv_seal_hs *hs, const cv_seal_key *key, const uint8_t in[CV_SEAL_REPLY_BYTES],
                          uint8_t out[CV_SEAL_PROOF_BYTES], char *err, size_t errlen)
{
    uint8_t want[32];
    memcpy(hs->spk, in, 32);
    if (derive(hs, key, hs->spk, false, want, err, errlen))
        return fail_wiped(hs);
    const int same = crypto_verify_32(want, in + 32) == 0;
    sodium_memzero(want, sizeof want);
    if (!same) {
        cv_errf(err, errlen, "key handshake: the node did not prove the cluster key (does it have this --key?)");
        return fail_wiped(hs);
    }
    proof(hs->proof_c_key, "client", hs, out);
    return 0;
}

int cv_seal_server_finish(cv_seal_hs *hs, const uint8_t in[CV_SEAL_PROOF_BYTES], char *err, size_t errlen)
{
    uint8_t want[32];
    proof(hs->proof_c_key, "client", hs, want);
    const int same = crypto_verify_32(want, in) == 0;
    sodium_memzero(want, sizeof want);
    if (!same) {
        cv_errf(err, errlen, "key proof did not verify");
        return fail_wiped(hs);
    }
    return 0;
}

void cv_seal_hs_wipe(cv_seal_hs *hs) { sodium_memzero(hs, sizeof *hs); }

void cv_seal_session_wipe(cv_seal_session *s) { sodium_memzero(s, sizeof *s); }

void cv_seal_key_wipe(cv_seal_key *key) { sodium_memzero(key, sizeof *key); }

/* ---- frames ---- */

static void nonce_of(uint64_t counter, uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES])
{
    memset(nonce, 0, crypto_aead_chacha20poly1305_IETF_NPUBBYTES);
    for (int i = 0; i < 8; i++)
        nonce[4 + i] = (uint8_t)(counter >> (8 * i));
}

int cv_seal_frame(cv_seal_dir *d, const uint8_t hdr[CV_FRAME_HEADER_SIZE], uint8_t *payload, size_t len,
                  uint8_t tag[CV_SEAL_TAG_BYTES], char *err, size_t errlen)
{
    if (d->counter == UINT64_MAX)
        return cv_errf(err, errlen, "sealed link: frame counter exhausted");
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES], none;
    nonce_of(d->counter++, nonce);
    payload = len ? payload : &none; /* an empty frame may have no buffer; libsodium wants one */
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(payload, tag, NULL, payload, len, hdr, CV_FRAME_HEADER_SIZE,
                                                       NULL, nonce, d->key);
    return 0;
}

int cv_seal_open(cv_seal_dir *d, const uint8_t hdr[CV_FRAME_HEADER_SIZE], uint8_t *payload, size_t len,
                 const uint8_t tag[CV_SEAL_TAG_BYTES], char *err, size_t errlen)
{
    uint8_t nonce[crypto_aead_chacha20poly1305_IETF_NPUBBYTES], none;
    nonce_of(d->counter, nonce);
    payload = len ? payload : &none; /* as in cv_seal_frame */
    if (d->counter == UINT64_MAX ||
        crypto_aead_chacha20poly1305_ietf_decrypt_detached(payload, NULL, payload, len, tag, hdr,
                                                           CV_FRAME_HEADER_SIZE, nonce, d->key) != 0)
        return cv_errf(err, errlen, "%s", auth_failed);
    d->counter++;
    return 0;
}
