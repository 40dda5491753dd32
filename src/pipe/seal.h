/* seal.h: the cluster key, the key handshake and sealed frames (libsodium).
 *
 * This comment is the specification of keyed links; link.h uses it when
 * cv_link_opts has a key, the node's gate (gate.h) on the accepting side.
 *
 * 1. The cluster key: 32 random bytes that every process of a cluster holds
 *    (`convoy keygen FILE`). Its file is exactly 64 lowercase or uppercase
 *    hex digits and an optional newline, readable by its owner only (no
 *    group or other permission bits): anything else is refused, naming
 *    the file and what is wrong with it.
 *
 * 2. The handshake: the first bytes of a keyed connection, before any frame.
 *      client -> server  HELLO  36 bytes: "CVK1", client ephemeral X25519
 *                               public key cpk (32)
 *      server -> client  REPLY  64 bytes: server ephemeral public key spk
 *                               (32), server proof (32)
 *      client -> server  PROOF  32 bytes: client proof
 *    Both sides make a fresh ephemeral key pair per connection, so no
 *    recorded session can be replayed to either. With dh the X25519 shared
 *    secret of the two ephemeral keys and K the cluster key, four keys are
 *      KDF(label) = BLAKE2b-256 keyed by K over label || dh || cpk || spk
 *    with the labels "convoy c2s", "convoy s2c" (frame keys of the two
 *    directions), "convoy proof s", "convoy proof c" (proof keys), and the
 *    proofs are
 *      proof_s = BLAKE2b-256 keyed by KDF("convoy proof s") over "server" || T
 *      proof_c = BLAKE2b-256 keyed by KDF("convoy proof c") over "client" || T
 *    with T = "CVK1" || cpk || spk: distinct keys and labels per role, so
 *    neither proof can be reflected as the other. A low-order public key
 *    (an all-zero dh) is refused. The client checks proof_s before it sends
 *    proof_c; the server takes nothing but these 68 bytes from a client
 *    until proof_c verifies, and a client without K learns from the REPLY
 *    only a MAC under a key it cannot derive.
 *
 * 3. Sealed frames: every frame after the handshake is the proto.h header
 *    (payload_len: the plaintext's length; checksum: 0, the tag covers the
 *    payload instead), the payload encrypted with ChaCha20-Poly1305 (IETF),
 *    then its 16-byte tag. The header is the additional data, so it is
 *    authenticated too. The nonce is 4 zero bytes and the direction's frame
 *    counter (u64 little-endian, from 0, one per frame, empty frames
 *    included); each direction has its own key, so a counter value never
 *    repeats under one key. A frame that fails its tag (tampered, replayed,
 *    dropped or reordered) fails the link.
 *
 * API contract: the handshake steps and seal/open are pure functions over
 * caller buffers (no sockets, no allocation), so they can be fuzzed;
 * ephemeral keys come from libsodium's random source. Functions return 0 or
 * -1 with a message in err (core/err.h); a failed step leaves nothing
 * usable in its handshake state, and cv_seal_hs_wipe clears the secrets. */
#ifndef CONVOY_PIPE_SEAL_H
#define CONVOY_PIPE_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipe/proto.h"

#define CV_SEAL_KEY_BYTES 32
#define CV_SEAL_TAG_BYTES 16
#define CV_SEAL_MAGIC "CVK1"
#define CV_SEAL_HELLO_BYTES 36 /* "CVK1" + client public key */
#define CV_SEAL_REPLY_BYTES 64 /* server public key + server proof */
#define CV_SEAL_PROOF_BYTES 32 /* client proof */

typedef struct cv_seal_key {
    uint8_t k[CV_SEAL_KEY_BYTES];
} cv_seal_key;

/* One direction of a sealed link: its key and next frame's counter. */
typedef struct cv_seal_dir {
    uint8_t key[CV_SEAL_KEY_BYTES];
    uint64_t counter;
} cv_seal_dir;

typedef struct cv_seal_session {
    cv_seal_dir tx, rx;
} cv_seal_session;

/* A handshake in progress, on either side. */
typedef struct cv_seal_hs {
    uint8_t sk[32], pk[32];       /* this side's ephemeral pair */
    uint8_t cpk[32], spk[32];     /* the transcript's public keys */
    uint8_t proof_c_key[32];      /* the server keeps it for the client's proof */
    cv_seal_session session;      /* ready once this side's last step succeeded */
} cv_seal_hs;

/* Initializes libsodium (once; safe from any thread). */
int cv_seal_init(char *err, size_t errlen);

/* Reads a key file (section 1). */
int cv_seal_key_load(const char *path, cv_seal_key *key, char *err, size_t errlen);
/* Writes a new random key to path (mode 0600); refuses an existing file. */
int cv_seal_key_generate(const char *path, char *err, size_t errlen);

/* Client, step 1: a fresh ephemeral pair; writes HELLO. */
int cv_seal_client_hello(cv_seal_hs *hs, uint8_t out[CV_SEAL_HELLO_BYTES], char *err, size_t errlen);
/* Server: checks HELLO, makes its pair and writes REPLY. */
int cv_seal_server_reply(cv_seal_hs *hs, const cv_seal_key *key, const uint8_t in[CV_SEAL_HELLO_BYTES],
                         uint8_t out[CV_SEAL_REPLY_BYTES], char *err, size_t errlen);
/* Client, step 2: checks REPLY's proof, writes PROOF; hs->session is the
 * client's (tx = c2s). */
int cv_seal_client_finish(cv_seal_hs *hs, const cv_seal_key *key, const uint8_t in[CV_SEAL_REPLY_BYTES],
                          uint8_t out[CV_SEAL_PROOF_BYTES], char *err, size_t errlen);
/* Server, last step: checks PROOF; hs->session is the server's (tx = s2c). */
int cv_seal_server_finish(cv_seal_hs *hs, const uint8_t in[CV_SEAL_PROOF_BYTES], char *err, size_t errlen);
void cv_seal_hs_wipe(cv_seal_hs *hs);
void cv_seal_session_wipe(cv_seal_session *s);
void cv_seal_key_wipe(cv_seal_key *key);

/* Encrypts payload[0..len) in place under hdr (the encoded header) and
 * writes the tag; uses and advances d's counter. */
int cv_seal_frame(cv_seal_dir *d, const uint8_t hdr[CV_FRAME_HEADER_SIZE], uint8_t *payload, size_t len,
                  uint8_t tag[CV_SEAL_TAG_BYTES], char *err, size_t errlen);
/* Checks the tag and decrypts in place; advances d's counter only on
 * success. The message: "frame failed authentication (tampered, replayed
 * or out of order)". */
int cv_seal_open(cv_seal_dir *d, const uint8_t hdr[CV_FRAME_HEADER_SIZE], uint8_t *payload, size_t len,
                 const uint8_t tag[CV_SEAL_TAG_BYTES], char *err, size_t errlen);

#endif
