/* proto.h: the convoy wire protocol between the head and its stages,
 * version 11 (CV_PROTO_VERSION).
 *
 * This comment is the specification. All integers and floats are
 * little-endian; floats are IEEE-754 binary32. Offsets are in bytes.
 * Section 1 is the frame, section 2 every message, section 3 the course
 * of a session (sealed links, the handshake, FETCH and SHIP, the steps,
 * pulses, takeover), section 4 versioning. The head is the process that
 * drives a chain; a node (a stage) serves a span of its layers. Messages
 * that open a session (HELLO, HELLO_OK, FETCH, SHIP) and ERROR are coded
 * in proto.c, those of a running session (FORWARD, RESULT, SEQ_OP, PING,
 * PONG, BYE, STATS, STATS_OK) in proto_step.c.
 *
 * 1. Frames. A link carries frames, each a 24-byte header and a payload:
 *
 *      off size field
 *        0    4 magic        bytes "CVY1" (u32 0x31595643)
 *        4    2 version      frame format version, CV_FRAME_VERSION (1); it
 *                            changes only if this header's layout changes
 *        6    2 type         message type (section 2)
 *        8    4 flags        frame-level flags; none are defined in version
 *                            1, senders write 0 and receivers reject others
 *       12    4 id           request / batch id: chosen by the sender of a
 *                            request, copied into the frame that answers it
 *                            (RESULT answers FORWARD, PONG answers PING,
 *                            HELLO_OK or ERROR answer whatever they answer)
 *       16    4 payload_len  bytes of payload after the header
 *       20    4 checksum     CRC32C (Castagnoli, reflected, init and final
 *                            xor 0xFFFFFFFF) of the payload; 0 when empty
 *
 *    A receiver rejects a frame with another magic or version, an unknown
 *    type, unknown flags, payload_len above the cap, or a checksum that
 *    does not match. On a keyed link (seal.h) a key handshake comes first,
 *    and every frame is sealed: checksum 0, the payload encrypted, a tag
 *    after it (section 3). The cap is CV_PROTO_DEFAULT_MAX_PAYLOAD (64 MiB)
 *    on every link, both ways, from the first frame: HELLO and HELLO_OK
 *    announce it (max_payload), nothing negotiates another; except that a
 *    node receives no larger frame than its state can carry: a HELLO
 *    during the handshake (CV_SHIP_PAYLOAD_MAX while it takes SHIPs),
 *    then, once assigned, a FORWARD of n_batch_max rows of the agreed
 *    act_type on the link FORWARDs arrive by, and
 *    CV_PROTO_MIN_MAX_PAYLOAD on the head's when they come from the
 *    previous node; HELLO_OK announces that cap.
 *
 * 2. Messages. Type values are append-only. Every payload is parsed
 *    exactly: a count is checked against the bytes present and against
 *    the limits below before anything is read, reserved bytes must be zero,
 *    and trailing bytes are an error.
 *
 *    HELLO = 1 (head -> node, or node -> next node): 86 + addr_len + 32 *
 *       n_hashes bytes
 *       u16 proto_version (CV_PROTO_VERSION), u8 role (CV_ROLE_*),
 *       u8 act_type (CV_ACT_*), u32 features (CV_FEAT_*),
 *       u32 l0, u32 l1 (the layers [l0, l1) this node serves),
 *       u32 n_layer, u32 n_ctx, u32 n_slot, u32 n_batch_max, u32 n_embd,
 *       u32 max_payload (the sender's receive cap, announced),
 *       u64 cluster_id, 32 bytes model_hash (the metadata hash of the
 *       model: model/fingerprint.h), u32 n_hashes, u16 addr_len,
 *       addr_len bytes next_addr ("host:port" of the next node, empty for
 *       the last stage; no NUL or control bytes; at most
 *       CV_PROTO_ADDR_MAX), then n_hashes tensor hashes of 32 bytes: in an
 *       assignment from the head, the content hashes of the tensors the
 *       node will read, in cv_llama_span_tensors' order (model/llama.h),
 *       which the node compares with its own before it binds anything.
 *       Rules: l0 <= l1 <= n_layer <= CV_PROTO_MAX_LAYER; n_slot,
 *       n_batch_max >= 1; n_embd <= CV_PROTO_MAX_EMBD; max_payload >=
 *       CV_PROTO_MIN_MAX_PAYLOAD; an act_type other than F32 needs
 *       CV_FEAT_LOSSY_ACT; n_hashes <= (l1 - l0) * CV_PROTO_HASHES_PER_LAYER
 *       + CV_PROTO_HASHES_EXTRA in an assignment from the head (role HEAD,
 *       l0 < l1), 0 in any other HELLO. Unknown feature bits are carried,
 *       not rejected (the node answers ERROR if it needs one it lacks).
 *       Features bits 4 and 5 are not a flag but a number, the pooling
 *       type of the embeddings the last stage pools (CV_FEAT_POOLING_*:
 *       llama.cpp's pooling_type, 0 none, 1 mean, 2 cls, 3 last).
 *       A node refuses (TOO_LARGE) n_slot > CV_PROTO_MAX_SLOT, n_ctx
 *       outside [1, CV_PROTO_MAX_CTX], n_batch_max > CV_PROTO_MAX_BATCH
 *       or over the node's own limit of rows (a FORWARD's compute is the
 *       node's to bound: pipe/node.h), a FORWARD of n_batch_max rows over
 *       the payload cap, (RATE) more HELLOs from one address than it
 *       takes, and
 *       (NO_MEMORY) a session over its budget, before it allocates.
 *    HELLO_OK = 2 (node -> whoever sent HELLO): 44 bytes
 *       u16 proto_version, u16 reserved, u32 us_per_layer_token (speed
 *       probe: microseconds per layer per token, 0 = not measured),
 *       u64 mem_budget (bytes the node may use), u64 layer_bytes (bytes
 *       the node needs for the layers asked; to a query, what it needs
 *       for the session asked besides any layer: pipe/plan.h), u32
 *       max_payload (the node's receive cap, announced), u32 held_l0,
 *       u32 held_l1 (the layers [held_l0, held_l1) its model file holds:
 *       all of them for a whole model, a shard's range (model/shard.h);
 *       the head assigns it layers only inside them), u32 flags
 *       (CV_HOK_*), u32 n_threads (the node's compute threads).
 *       With CV_HOK_RECEIVES the node has no model file: it takes any
 *       layers [0, n_layer) and receives them from the head (FETCH,
 *       SHIP); to a query, its layer_bytes is then its process's own
 *       bytes alone, from which the head counts the rest with n_threads
 *       (plan.h's cv_plan_received_bytes), and it measures no speed.
 *       Rule: held_l0 < held_l1 <= CV_PROTO_MAX_LAYER; unknown flags are
 *       refused.
 *    ERROR = 3 (either way): u32 code (CV_PERR_*, unknown codes are
 *       accepted and shown as numbers), u16 len, len bytes message (no NUL
 *       or control bytes, at most CV_PROTO_ERRMSG_MAX).
 *    FORWARD = 4 (head -> first node -> ... -> last node): 16 bytes, then
 *       16 bytes per token, then the activations, then the trail:
 *       u32 n_tokens (>= 1), u32 n_embd, u8 act_type, u8 flags
 *       (CV_FWD_*), u8 n_trail (< CV_TRAIL_MAX), 5 reserved bytes;
 *       n_tokens records {i32 token, i32 seq, i32 pos, u8 want, 3 reserved}
 *       with token, seq, pos >= 0 and want 0 to 4 (CV_WANT_*). 1: this
 *       row's output is wanted: sampled at the last stage and returned in
 *       RESULT. 2 (speculation): the token is a draft, a guess of what the
 *       previous record of the same seq (wanted, at pos - 1) will sample;
 *       the row is wanted too. 3 (embeddings): the last stage adds the
 *       row's final hidden state to the seq's pool (infer/span.h: rows in
 *       position order; a row at pos 0 starts the pool anew, a rollback or
 *       TRUNCATE below the rows pooled and FREE empty it); no logits, no
 *       sampling, no RESULT row. 4: the same, and RESULT returns the seq's
 *       embedding in an embedding row. The last stage verifies a seq's drafts in
 *       order (stage.h) and returns rows up to the first rejected one: the
 *       rows after it are left out of RESULT.
 *       A seq's first record at a pos below the length the stage holds for
 *       it rolls the seq back to pos first (KV and sampler history), on
 *       every stage: this is how rejected drafts are undone without a
 *       message of their own.
 *       with CV_FWD_HAS_HIDDEN: n_tokens rows of n_embd activations of
 *       act_type (F32: 4 bytes each; F16: 2; Q8_0: n_embd/32 blocks of 34
 *       bytes, n_embd a multiple of 32), 1 <= n_embd <= CV_PROTO_MAX_EMBD;
 *       without it (the first stage embeds the token ids): nothing, and
 *       n_embd = 0, act_type = F32.
 *       Records start at offset 16 and activations at 16 + 16 * n_tokens,
 *       so both are 16-byte aligned inside an aligned payload.
 *       The trail, n_trail u32 after the activations, is the time each
 *       stage the batch has passed spent computing it (microseconds,
 *       saturated at 2^32 - 1), in chain order, the head's own layers
 *       first when it runs some: a node adds its own before it sends the
 *       batch on, and the last node returns the whole trail in RESULT, so
 *       the head learns every stage's cost of every batch (chain.h).
 *    RESULT = 5 (last node -> head): 12 bytes (16 with logits, 4 more with
 *       embeddings), the trail, then rows (one per wanted record, want 1,
 *       2 or 4, in record order, less the rows that a rejected draft left
 *       out):
 *       u32 n_rows, u32 flags (CV_RES_*), u32 n_trail (1..CV_TRAIL_MAX),
 *       [u32 n_vocab: only with CV_RES_HAS_LOGITS, 1..CV_PROTO_MAX_VOCAB],
 *       [u32 n_embd: only with CV_RES_HAS_EMBD, 1..CV_PROTO_MAX_EMBD];
 *       n_trail u32: the FORWARD's trail and the last node's own time;
 *       n_rows rows {i32 seq, i32 pos, i32 token, u16 n_top, u16 kind,
 *       n_top pairs (i32 id, f32 logprob)}, seq, pos and ids >= 0 (ids
 *       below n_vocab when it is known), logprob not NaN, n_top <=
 *       CV_PROTO_MAX_TOP; kind 0 (a sampled row, want 1 or 2): token >= 0
 *       (and below n_vocab when it is known); kind 1 (CV_ROW_EMBD, an
 *       embedding row, want 4): token -1, n_top 0, and only with
 *       CV_RES_HAS_EMBD, which is set when a row is an embedding row and
 *       not otherwise; then with CV_RES_HAS_LOGITS n_rows * n_vocab f32
 *       logits, row after row (an embedding row's are zeros); then with
 *       CV_RES_HAS_EMBD n_embd f32 for each embedding row, in row order:
 *       the seq's embedding (its pool L2-normalized, infer/span.h).
 *       Everything is 4-byte aligned.
 *       A row's pairs are the seq's n_probs (SET_SAMPLER) log-probabilities
 *       as cv_logprobs_row (infer/logprobs.h) gives them for the row's
 *       logits: the sampled token's first, then the n_probs - 1 most likely
 *       ids, most likely first; so one machine and a chain give the same
 *       bits.
 *    SEQ_OP = 6 (head -> first node -> ... -> last node, in order with the
 *       FORWARDs): 12 bytes, 68 + 8 * n_bias for SET_SAMPLER:
 *       u8 op (CV_SEQ_*), 3 reserved, i32 seq (>= 0), i32 len (TRUNCATE:
 *       the new length >= 0; other ops: 0); SET_SAMPLER adds f32 temp,
 *       i32 top_k, f32 top_p, f32 min_p, f32 repeat_penalty,
 *       i32 penalty_last_n (>= 0), f32 freq_penalty, f32 presence_penalty,
 *       u64 seed, u32 n_probs (log-probabilities in each of the seq's
 *       RESULT rows: 0 for none, else 1 + k for the sampled token's and the
 *       k most likely ids', k <= CV_MAX_TOP_LOGPROBS, so n_probs <=
 *       CV_PROTO_MAX_TOP), u64 n_draws (RNG draws the seq's sampler made
 *       before: a head replaying a seq onto a new chain goes on with the
 *       same draws), u32 n_bias (<= CV_PROTO_MAX_BIAS), then n_bias pairs
 *       {i32 id, f32 bias}: the logit bias (infer/sampler.h), ids >= 0 (the
 *       last stage refuses ids past its vocabulary), bias finite or -inf;
 *       so 68 + 8 * n_bias bytes; every other float finite. FREE resets
 *       n_probs to 0.
 *       SET_GRAMMAR holds the seq's output to a GBNF grammar
 *       (infer/constraint.h) from position len (the first generated
 *       position) until the next SET_SAMPLER or FREE: it adds u32
 *       text_len (1..CV_PROTO_MAX_GRAMMAR) and the grammar's text_len
 *       bytes (UTF-8, no NUL), so 16 + text_len bytes; it follows the
 *       seq's SET_SAMPLER, and len is at least the seq's length.
 *       COPY empties seq dst (i32 after len: >= 0, not seq; 16 bytes in
 *       all) and gives it seq's first len positions (at most seq's
 *       length): every stage copies its layers' KV rows, so dst holds the
 *       bits seq computed, at the same positions (a prompt cache).
 *    PING = 7, PONG = 8: 16 bytes: u64 nonce, u64 timestamp (sender's
 *       clock, opaque to the receiver; PONG copies both from the PING).
 *       The pulse: a node computing a FORWARD for longer than CV_PULSE_MS
 *       sends the head an unasked PONG (id 0, nonce 0, its clock) every
 *       CV_PULSE_MS until it is done, so that the head times out silence,
 *       not work.
 *    BYE = 9: empty; the sender closes after it.
 *    STATS = 10 (head -> node): empty; asks for the node's counters.
 *    STATS_OK = 11 (node -> head): 32 bytes: u64 compute_ns (time spent in
 *       its forward passes this session), u64 steps (FORWARDs run),
 *       u64 tokens (rows run), u64 bytes_sent (on its links, headers
 *       included).
 *    FETCH = 12 (node -> head, answering an assignment HELLO with its id,
 *       in place of HELLO_OK, by a CV_HOK_RECEIVES node that does not hold
 *       the layers asked): 8 bytes: u64 have (bytes of the layers' shard
 *       file the node holds already, from its start: a transfer cut
 *       before resumes; 0 for none). The shard file of an assignment is
 *       the file `convoy split` writes for its layers [l0, l1) of the
 *       head's model (model/shard.h): the same bytes every time. The head
 *       answers with SHIP frames from the largest segment boundary
 *       (codec/pack.h) not above `have` to the end; the node then checks
 *       the file as any model (the metadata hash and the assignment's
 *       tensor hashes) and answers the assignment: HELLO_OK, ERROR, or
 *       once, when a resumed file fails the check, FETCH with have 0.
 *    SHIP = 13 (head -> node, the assignment's id): 16 bytes, then one
 *       segment as codec/pack.h encodes it (at most CV_PACK_SEGMENT_MAX
 *       bytes of the file, a tensor's coded by codec/planes.h): u64
 *       offset (where the segment's bytes go in the shard file), u64 size
 *       (the shard file's bytes). Rules: offset < size, offset +
 *       the segment's bytes <= size, each SHIP starts where the last
 *       ended; the segment itself is decoded (and refused when malformed)
 *       by the codec. A frame holds at most CV_SHIP_PAYLOAD_MAX bytes.
 *
 * 3. A session. A node serves one head at a time; the head's link to it
 *    carries the session, and each node but the first has a second link,
 *    from the previous node of the chain.
 *    Connecting. With the cluster key (a keyed link), the first bytes of
 *    a connection are seal.h's key handshake (36 bytes from the client,
 *    64 back, 32 more: X25519 ephemeral keys, proofs keyed by the cluster
 *    key), and every frame after it is sealed: the header as above
 *    (checksum 0, payload_len the plaintext's) as additional data, the
 *    payload under ChaCha20-Poly1305 with the direction's key and frame
 *    counter, then a 16-byte tag; a frame that fails its tag fails the
 *    link. Without a key the first bytes must be a frame header ("CVY1").
 *    A node's gate (gate.h) refuses, without an answer, a connection that
 *    does neither within its deadline.
 *    The handshake (head -> node, on the head's link). Up to 4 query
 *    HELLOs (l0 == l1, no hashes), each answered HELLO_OK with the node's
 *    budget, speed probe and own bytes for the session asked; then one
 *    assignment HELLO (l0 < l1, the tensor hashes of its layers). The
 *    node checks the HELLO's sizes (TOO_LARGE, ACT_TYPE), the model
 *    (FINGERPRINT: the metadata hash, then every tensor hash in order),
 *    the range (BAD_RANGE) and its budget (NO_MEMORY) before it binds the
 *    layers. A receiving node (CV_HOK_RECEIVES) that lacks the shard of
 *    its layers answers FETCH instead; the head sends the SHIP frames, and
 *    the node checks the file it received and answers the assignment (a
 *    resumed file that fails the check is FETCHed again, once, whole).
 *    With next_addr, the node connects to the next node and sends it a
 *    HELLO of role PREV_NODE (no hashes, answered HELLO_OK) before it
 *    answers the head; the head assigns the nodes from the last to the
 *    first, so each finds its next one ready. With CV_FEAT_FROM_PREV, the
 *    node then waits, within its handshake timeout, for the previous
 *    node's HELLO (same cluster_id and model_hash) and answers it
 *    HELLO_OK.
 *    Steps. The head sends FORWARD and SEQ_OP to the first node (on its
 *    link), each node passes them to the next in order, and the last
 *    node answers RESULT to the head; a node refuses a FORWARD it cannot
 *    run with ERROR (the session goes on) and ends the session when a
 *    link fails. Besides them the head may send PING (answered PONG) and
 *    STATS (answered STATS_OK) on its link to any node.
 *    Pulses. A node computing a FORWARD for longer than CV_PULSE_MS sends
 *    the head an unasked PONG (id 0) every CV_PULSE_MS, so the head's
 *    timeout measures silence, not work.
 *    The end. BYE from either side; a link that fails; ERROR TIMEOUT from
 *    the node when no frame came from the head or the previous node for
 *    its session timeout; or a takeover: while a head holds the node,
 *    proven connections are parked and their first frame read; a parked
 *    head's HELLO takes the node once the current head has been silent
 *    for 1 s (queries do not count, computing is not silence), the
 *    current head is told (ERROR TIMEOUT) and the newcomer's handshake
 *    begins; a parked head is refused (BAD_STATE) as soon as the current
 *    head speaks. A node counts HELLOs per source address and refuses
 *    those beyond a few a second (RATE) before any work (node.h).
 *
 * 4. Versioning. proto_version in HELLO names the message set; a node that
 *    cannot speak it answers ERROR{CV_PERR_VERSION}. Adding a message type
 *    or an error code keeps the version; changing any payload layout, or
 *    what a field means, bumps it. This is version 11: CV_PROTO_VERSION's
 *    comment says what each version changed.
 *
 * API contract: encoders write into a caller buffer (no allocation) and
 * fail with a message if it is too small or the message breaks a rule
 * above, so a peer never receives what its decoder would reject. Decoders
 * read through a cv_cursor and name the offending field in the message.
 * Decoded pointers (FORWARD records and activations, RESULT top pairs and
 * logits) point into the payload, which must stay alive and be 4-byte
 * aligned (link buffers are 64-byte aligned; decode refuses a misaligned
 * buffer); the records are the wire bytes themselves, so this code builds
 * only on little-endian hosts. */
#ifndef CONVOY_PIPE_PROTO_H
#define CONVOY_PIPE_PROTO_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/pack.h"
#include "infer/constraint.h"
#include "infer/forward.h"
#include "infer/logprobs.h"
#include "infer/sampler.h"

#define CV_FRAME_MAGIC 0x31595643u /* "CVY1" */
#define CV_FRAME_VERSION 1
#define CV_FRAME_HEADER_SIZE 24
#define CV_PROTO_VERSION 11 /* 3: CV_FEAT_KV_F16, which a node must honour; 4: n_probs counts the sampled token's;
                              5: SET_SAMPLER's n_draws, HELLO's content hashes; 6: HELLO_OK's held layers;
                              7: HELLO_OK's flags and n_threads, FETCH and SHIP; 8: SET_GRAMMAR; 9: COPY;
                              10: the stages' times in FORWARD and RESULT; 11: SET_SAMPLER's logit bias;
                              embeddings: FORWARD's want 3 and 4, RESULT's embedding rows, HELLO's pooling type */

#define CV_PROTO_DEFAULT_MAX_PAYLOAD (64u << 20)
#define CV_PROTO_MIN_MAX_PAYLOAD (64u << 10)
#define CV_PROTO_ADDR_MAX 255
#define CV_PROTO_ERRMSG_MAX 511
#define CV_PROTO_MAX_LAYER 65536
#define CV_PROTO_MAX_EMBD (1u << 20)
#define CV_PROTO_MAX_VOCAB (1u << 24)
#define CV_PROTO_MAX_TOP (1 + CV_MAX_TOP_LOGPROBS) /* the sampled token's, then the top alternatives */
#define CV_PROTO_MAX_SLOT 4096      /* a node refuses a HELLO over these (TOO_LARGE) */
#define CV_PROTO_MAX_CTX (1 << 24)
#define CV_PROTO_MAX_BATCH (1 << 16)
#define CV_PROTO_MAX_GRAMMAR CV_CONSTRAINT_TEXT_MAX
#define CV_PROTO_MAX_BIAS 4096 /* logit bias pairs of a SET_SAMPLER */
#define CV_PROTO_HASH_BYTES 32
#define CV_PROTO_HASHES_PER_LAYER 31 /* the most tensors a layer has (every name of llama.c's list) */
#define CV_PROTO_HASHES_EXTRA 5      /* rope_freqs, rope_factors_long and _short, output_norm, output */

/* Not a wire field: the most nodes of a chain ("local" included), the one
 * bound by which the head, its inbox and the planner size their tables. */
#define CV_CHAIN_MAX_NODES 16
/* The most stage times a trail holds (FORWARD, RESULT): one per stage. */
#define CV_TRAIL_MAX CV_CHAIN_MAX_NODES

typedef enum cv_msg_type {
    CV_MSG_HELLO = 1,
    CV_MSG_HELLO_OK = 2,
    CV_MSG_ERROR = 3,
    CV_MSG_FORWARD = 4,
    CV_MSG_RESULT = 5,
    CV_MSG_SEQ_OP = 6,
    CV_MSG_PING = 7,
    CV_MSG_PONG = 8,
    CV_MSG_BYE = 9,
    CV_MSG_STATS = 10,
    CV_MSG_STATS_OK = 11,
    CV_MSG_FETCH = 12,
    CV_MSG_SHIP = 13,
    CV_MSG_COUNT /* one past the last type; not a type */
} cv_msg_type;

/* "HELLO", "FORWARD", ...; "unknown" outside the enum. */
const char *cv_msg_type_name(uint32_t type);

/* The header as a struct. Its in-memory layout equals the wire layout (no
 * padding; the asserts below pin it), but encode/decode go field by field
 * at these offsets, so neither the host's byte order nor alignment matters
 * for frames. */
typedef struct cv_frame_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t flags;
    uint32_t id;
    uint32_t payload_len;
    uint32_t checksum;
} cv_frame_header;

#define CV_FRAME_OFF_MAGIC 0
#define CV_FRAME_OFF_VERSION 4
#define CV_FRAME_OFF_TYPE 6
#define CV_FRAME_OFF_FLAGS 8
#define CV_FRAME_OFF_ID 12
#define CV_FRAME_OFF_PAYLOAD_LEN 16
#define CV_FRAME_OFF_CHECKSUM 20
static_assert(offsetof(cv_frame_header, magic) == CV_FRAME_OFF_MAGIC, "frame magic offset");
static_assert(offsetof(cv_frame_header, version) == CV_FRAME_OFF_VERSION, "frame version offset");
static_assert(offsetof(cv_frame_header, type) == CV_FRAME_OFF_TYPE, "frame type offset");
static_assert(offsetof(cv_frame_header, flags) == CV_FRAME_OFF_FLAGS, "frame flags offset");
static_assert(offsetof(cv_frame_header, id) == CV_FRAME_OFF_ID, "frame id offset");
static_assert(offsetof(cv_frame_header, payload_len) == CV_FRAME_OFF_PAYLOAD_LEN, "frame payload_len offset");
static_assert(offsetof(cv_frame_header, checksum) == CV_FRAME_OFF_CHECKSUM, "frame checksum offset");
static_assert(sizeof(cv_frame_header) == CV_FRAME_HEADER_SIZE, "frame header size");

/* CRC32C of n bytes, continuing from crc (start with 0). */
uint32_t cv_crc32c(uint32_t crc, const void *data, size_t n);

/* A header for a payload: magic, versions, flags 0, length and the
 * checksum of the payload filled in. */
cv_frame_header cv_frame_header_make(uint16_t type, uint32_t id, const void *payload, uint32_t payload_len);
void cv_frame_header_encode(const cv_frame_header *h, uint8_t out[CV_FRAME_HEADER_SIZE]);
/* Parses and validates a header (everything but the checksum, which needs
 * the payload) against the payload cap max_payload. */
int cv_frame_header_decode(const uint8_t in[CV_FRAME_HEADER_SIZE], uint32_t max_payload, cv_frame_header *h,
                           char *err, size_t errlen);
/* Compares the payload's CRC32C with the header's checksum. */
int cv_frame_check_payload(const cv_frame_header *h, const void *payload, char *err, size_t errlen);

/* Activation types on the wire (values are the HELLO/FORWARD act_type). */
typedef enum cv_act_type {
    CV_ACT_F32 = 0,
    CV_ACT_F16 = 1,  /* lossy: needs CV_FEAT_LOSSY_ACT */
    CV_ACT_Q8_0 = 2, /* lossy: needs CV_FEAT_LOSSY_ACT */
    CV_ACT_COUNT
} cv_act_type;

const char *cv_act_type_name(uint32_t act_type); /* "f32", "f16", "q8_0", "unknown" */
/* Bytes of n_rows rows of n_embd activations; 0 for an unknown type or,
 * for Q8_0, an n_embd that is not a multiple of 32. */
uint64_t cv_act_bytes(uint32_t act_type, uint64_t n_rows, uint64_t n_embd);
/* Converts n floats (a whole number of rows) to act_type / back. Q8_0 and
 * F16 use the kernels' conversions (cv_kernels_init must have run); for
 * F32 both are a copy. n must be a multiple of 32 for Q8_0. */
int cv_act_from_f32(uint32_t act_type, const float *x, uint64_t n, void *out, char *err, size_t errlen);
int cv_act_to_f32(uint32_t act_type, const void *in, uint64_t n, float *out, char *err, size_t errlen);

/* ---- HELLO / HELLO_OK ---- */

enum { CV_ROLE_HEAD = 0, CV_ROLE_PREV_NODE = 1 };
enum {
    CV_FEAT_LOSSY_ACT = 1u << 0,
    /* head -> node: this node's input comes from a previous node, which
     * connects to it after the handshake (without it, FORWARDs come from
     * the head on this link) */
    CV_FEAT_FROM_PREV = 1u << 1,
    /* head -> node: keep this node's KV cache in F16 (`--kv-type f16`)
     * instead of F32, as the head's own layers do */
    CV_FEAT_KV_F16 = 1u << 2,
    /* head -> node, in a query: a speed measured before will do (the head
     * reopens a chain after a failure): the node answers its last probe
     * however old, and probes only when it has none, so that a failover
     * waits for no probe */
    CV_FEAT_ANY_SPEED = 1u << 3,
};
/* head -> node: the pooling type of the embeddings the last stage pools
 * (bits 4 and 5: a number, not flags; see section 2). */
#define CV_FEAT_POOLING_SHIFT 4
#define CV_FEAT_POOLING_MASK (3u << CV_FEAT_POOLING_SHIFT)

typedef struct cv_msg_hello {
    uint16_t proto_version;
    uint8_t role;
    uint8_t act_type;
    uint32_t features;
    uint32_t l0, l1;
    uint32_t n_layer;
    uint32_t n_ctx;
    uint32_t n_slot;
    uint32_t n_batch_max;
    uint32_t n_embd;
    uint32_t max_payload;
    uint64_t cluster_id;
    uint8_t model_hash[CV_PROTO_HASH_BYTES];
    uint32_t n_hashes;
    const uint8_t *hashes; /* n_hashes * CV_PROTO_HASH_BYTES; after decode, in the payload */
    char next_addr[CV_PROTO_ADDR_MAX + 1]; /* NUL-terminated, "" for the last stage */
} cv_msg_hello;

/* HELLO's wire offsets: the u32 fields run from l0 to max_payload, and each
 * field below starts where the one before ends. */
#define CV_HELLO_OFF_L0 8
#define CV_HELLO_OFF_CLUSTER_ID 40
#define CV_HELLO_OFF_MODEL_HASH 48
#define CV_HELLO_OFF_N_HASHES 80
#define CV_HELLO_OFF_ADDR_LEN 84
#define CV_HELLO_FIXED_SIZE 86 /* next_addr, then the tensor hashes, follow */
static_assert(CV_HELLO_OFF_CLUSTER_ID == CV_HELLO_OFF_L0 + 8 * 4, "HELLO: l0 .. max_payload are 8 u32");
static_assert(CV_HELLO_OFF_MODEL_HASH == CV_HELLO_OFF_CLUSTER_ID + 8, "HELLO: model_hash offset");
static_assert(CV_HELLO_OFF_N_HASHES == CV_HELLO_OFF_MODEL_HASH + CV_PROTO_HASH_BYTES, "HELLO: n_hashes offset");
static_assert(CV_HELLO_OFF_ADDR_LEN == CV_HELLO_OFF_N_HASHES + 4, "HELLO: addr_len offset");
static_assert(CV_HELLO_FIXED_SIZE == CV_HELLO_OFF_ADDR_LEN + 2, "HELLO: fixed size");
/* the largest HELLO fits the payload cap */
static_assert(CV_HELLO_FIXED_SIZE + CV_PROTO_ADDR_MAX +
                      ((uint64_t)CV_PROTO_MAX_LAYER * CV_PROTO_HASHES_PER_LAYER + CV_PROTO_HASHES_EXTRA) *
                          CV_PROTO_HASH_BYTES <=
                  CV_PROTO_DEFAULT_MAX_PAYLOAD,
              "HELLO: the most hashes fit a payload");

typedef struct cv_msg_hello_ok {
    uint16_t proto_version;
    uint32_t us_per_layer_token;
    uint64_t mem_budget;
    uint64_t layer_bytes;
    uint32_t max_payload;
    uint32_t held_l0, held_l1; /* the layers the node's file holds */
    uint32_t flags;            /* CV_HOK_* */
    uint32_t n_threads;
} cv_msg_hello_ok;

/* HELLO_OK flags */
enum { CV_HOK_RECEIVES = 1u << 0 /* no model file: the head ships the layers it assigns */ };

#define CV_HELLO_OK_OFF_MAX_PAYLOAD 24
#define CV_HELLO_OK_OFF_HELD_L0 28
#define CV_HELLO_OK_OFF_HELD_L1 32
#define CV_HELLO_OK_OFF_FLAGS 36
#define CV_HELLO_OK_OFF_N_THREADS 40
#define CV_MSG_HELLO_OK_SIZE 44
static_assert(CV_HELLO_OK_OFF_HELD_L0 == CV_HELLO_OK_OFF_MAX_PAYLOAD + 4, "HELLO_OK: held_l0 offset");
static_assert(CV_HELLO_OK_OFF_HELD_L1 == CV_HELLO_OK_OFF_HELD_L0 + 4, "HELLO_OK: held_l1 offset");
static_assert(CV_HELLO_OK_OFF_FLAGS == CV_HELLO_OK_OFF_HELD_L1 + 4, "HELLO_OK: flags offset");
static_assert(CV_HELLO_OK_OFF_N_THREADS == CV_HELLO_OK_OFF_FLAGS + 4, "HELLO_OK: n_threads offset");
static_assert(CV_MSG_HELLO_OK_SIZE == CV_HELLO_OK_OFF_N_THREADS + 4, "HELLO_OK: size");

/* The most tensor hashes m may carry (section 2's rule for n_hashes). */
uint64_t cv_msg_hello_max_hashes(const cv_msg_hello *m);
size_t cv_msg_hello_size(const cv_msg_hello *m);
int cv_msg_hello_encode(const cv_msg_hello *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
/* A HELLO of another proto_version is refused before the rest is read (its
 * layout may differ); m->proto_version then holds the peer's version, so
 * the node can answer ERROR{CV_PERR_VERSION}. */
int cv_msg_hello_decode(const void *payload, size_t len, cv_msg_hello *m, char *err, size_t errlen);
int cv_msg_hello_ok_encode(const cv_msg_hello_ok *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
int cv_msg_hello_ok_decode(const void *payload, size_t len, cv_msg_hello_ok *m, char *err, size_t errlen);

/* ---- ERROR ---- */

typedef enum cv_perr_code {
    CV_PERR_BAD_FRAME = 1,   /* a frame failed header, checksum or payload checks */
    CV_PERR_VERSION = 2,     /* protocol version not spoken */
    CV_PERR_FINGERPRINT = 3, /* the node's model (metadata, or a tensor it would read) differs from the head's */
    CV_PERR_NO_MEMORY = 4,   /* the layers asked do not fit the node's budget */
    CV_PERR_BAD_RANGE = 5,   /* layer range or model shape does not match */
    CV_PERR_BAD_BATCH = 6,   /* a FORWARD the node cannot run (slot, position, size) */
    CV_PERR_INTERNAL = 7,    /* the node failed on its own */
    CV_PERR_SHUTDOWN = 8,    /* the node is stopping */
    CV_PERR_CLUSTER = 9,     /* cluster id does not match */
    CV_PERR_BAD_STATE = 10,  /* a message not expected at this point */
    CV_PERR_NEXT_NODE = 11,  /* the node could not reach or lost the next node */
    CV_PERR_TOO_LARGE = 12,  /* a size over a protocol limit or over what HELLO agreed (slots, context, rows) */
    CV_PERR_ACT_TYPE = 13,   /* an activation type not taken, or not the one HELLO agreed */
    CV_PERR_TIMEOUT = 14,    /* the head was silent for the node's session timeout: the session ends */
    CV_PERR_RATE = 15,       /* the peer's address sent more HELLOs than the node takes from one: try later */
} cv_perr_code;

const char *cv_perr_name(uint32_t code); /* "BAD_FRAME", ...; "unknown" */

typedef struct cv_msg_error {
    uint32_t code;
    char message[CV_PROTO_ERRMSG_MAX + 1]; /* NUL-terminated */
} cv_msg_error;

/* Encodes code and message; a message longer than CV_PROTO_ERRMSG_MAX is
 * cut, and control bytes in it are sent as '?'. */
size_t cv_msg_error_size(const char *message);
int cv_msg_error_encode(uint32_t code, const char *message, void *buf, size_t cap, size_t *len, char *err,
                        size_t errlen);
int cv_msg_error_decode(const void *payload, size_t len, cv_msg_error *m, char *err, size_t errlen);

/* ---- FORWARD ---- */

enum {
    CV_FWD_WANT_LOGITS = 1u << 0, /* RESULT carries full logits rows of the wanted tokens */
    CV_FWD_HAS_HIDDEN = 1u << 1,  /* activations follow the records */
};

#define CV_FWD_FIXED_SIZE 16

/* One token record, exactly its 16 wire bytes. */
typedef struct cv_fwd_token {
    int32_t token;
    int32_t seq;
    int32_t pos;
    uint8_t want;
    uint8_t reserved[3];
} cv_fwd_token;
static_assert(sizeof(cv_fwd_token) == 16, "cv_fwd_token is its wire record");
static_assert(offsetof(cv_fwd_token, want) == 12, "cv_fwd_token want offset");

typedef struct cv_msg_forward {
    uint32_t n_tokens;
    uint32_t n_embd; /* 0 without CV_FWD_HAS_HIDDEN */
    uint8_t act_type;
    uint8_t flags;
    const cv_fwd_token *tokens; /* n_tokens records */
    const void *act;            /* n_tokens rows of activations, NULL without CV_FWD_HAS_HIDDEN */
    uint8_t n_trail;
    uint32_t trail[CV_TRAIL_MAX]; /* the stages' times so far (us), a copy: on the wire they may be unaligned */
} cv_msg_forward;

/* Bytes of the activation section, of the fixed part and records (what
 * precedes the activations), of the trail and of the whole payload. */
uint64_t cv_msg_forward_act_size(const cv_msg_forward *m);
uint64_t cv_msg_forward_header_size(const cv_msg_forward *m);
uint64_t cv_msg_forward_trail_size(const cv_msg_forward *m);
uint64_t cv_msg_forward_size(const cv_msg_forward *m);
/* Encodes the fixed part and the records only: a sender can put the
 * activations in a second iovec straight from its compute buffer, and the
 * trail in a third (cv_msg_forward_encode_trail). The message is fully
 * validated (m->act must be non-NULL with HAS_HIDDEN). */
int cv_msg_forward_encode_header(const cv_msg_forward *m, void *buf, size_t cap, size_t *len, char *err,
                                 size_t errlen);
/* Writes m's trail as the wire has it: cv_msg_forward_trail_size bytes. */
void cv_msg_forward_encode_trail(const cv_msg_forward *m, void *buf);
/* Encodes the whole payload, copying the activations from m->act. */
int cv_msg_forward_encode(const cv_msg_forward *m, void *buf, size_t cap, size_t *len, char *err,
                          size_t errlen);
/* Validates the payload; m->tokens and m->act point into it. */
int cv_msg_forward_decode(const void *payload, size_t len, cv_msg_forward *m, char *err, size_t errlen);

/* ---- RESULT ---- */

enum {
    CV_RES_HAS_LOGITS = 1u << 0,
    CV_RES_HAS_EMBD = 1u << 1, /* embedding rows, and their vectors after the logits */
};
/* A RESULT row's kind. */
enum { CV_ROW_SAMPLED = 0, CV_ROW_EMBD = 1 };

/* A RESULT pair is cv_logprobs_row's entry, so the last node writes the
 * rows where they are sent from and the head reads them as they came. */
typedef cv_logprob cv_top_entry;
static_assert(sizeof(cv_top_entry) == 8, "cv_top_entry is its wire pair");
static_assert(offsetof(cv_top_entry, id) == 0 && offsetof(cv_top_entry, logprob) == 4, "cv_top_entry pair offsets");

typedef struct cv_result_row {
    int32_t seq;
    int32_t pos;
    int32_t token;
    uint16_t n_top;
    const cv_top_entry *top; /* n_top entries (NULL when 0); in the payload after decode */
    uint16_t kind;           /* CV_ROW_* */
} cv_result_row;

typedef struct cv_msg_result {
    uint32_t n_rows;
    uint32_t flags;
    uint32_t n_vocab;     /* 0 without CV_RES_HAS_LOGITS */
    cv_result_row *rows;  /* caller's array: encode reads n_rows, decode fills them */
    const float *logits;  /* n_rows * n_vocab, NULL without CV_RES_HAS_LOGITS */
    uint32_t n_trail;     /* 1..CV_TRAIL_MAX */
    uint32_t trail[CV_TRAIL_MAX]; /* every stage's time of the batch (us), in chain order */
    uint32_t n_embd;      /* 0 without CV_RES_HAS_EMBD */
    const float *embd;    /* n_embd floats per embedding row, in row order; NULL without CV_RES_HAS_EMBD */
} cv_msg_result;

uint64_t cv_msg_result_size(const cv_msg_result *m);
int cv_msg_result_encode(const cv_msg_result *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
/* Decodes into m, filling the caller's rows[0 .. max_rows); more rows than
 * max_rows is an error. top and logits point into the payload. */
int cv_msg_result_decode(const void *payload, size_t len, cv_msg_result *m, cv_result_row *rows,
                         uint32_t max_rows, char *err, size_t errlen);

/* ---- SEQ_OP ---- */

typedef enum cv_seq_op_kind {
    CV_SEQ_TRUNCATE = 1,    /* keep the first len positions of seq */
    CV_SEQ_FREE = 2,        /* drop seq entirely */
    CV_SEQ_SET_SAMPLER = 3, /* the last stage samples seq with these params */
    CV_SEQ_SET_GRAMMAR = 4, /* ... and holds its output to this grammar */
    CV_SEQ_COPY = 5,        /* seq dst holds seq's first len positions */
} cv_seq_op_kind;

#define CV_SEQ_OP_SIZE 12
#define CV_SEQ_OP_SAMPLER_SIZE 68 /* and 8 bytes per bias pair */
#define CV_SEQ_OP_BIAS_PAIR_SIZE 8
#define CV_SEQ_OP_COPY_SIZE 16
#define CV_SEQ_OP_GRAMMAR_FIXED_SIZE 16
static_assert(CV_SEQ_OP_GRAMMAR_FIXED_SIZE + CV_PROTO_MAX_GRAMMAR <= CV_PROTO_MIN_MAX_PAYLOAD,
              "SET_GRAMMAR: the largest grammar fits the smallest receive cap");
static_assert(CV_SEQ_OP_SAMPLER_SIZE + CV_SEQ_OP_BIAS_PAIR_SIZE * CV_PROTO_MAX_BIAS <= CV_PROTO_MIN_MAX_PAYLOAD,
              "SET_SAMPLER: the largest logit bias fits the smallest receive cap");
static_assert(sizeof(cv_logit_bias) == CV_SEQ_OP_BIAS_PAIR_SIZE, "bias pairs are read in place");

typedef struct cv_msg_seq_op {
    uint8_t op;
    int32_t seq;
    int32_t len;
    int32_t dst;               /* COPY only */
    cv_sampler_params sampler; /* SET_SAMPLER only; decoded bias pairs point into the payload */
    uint32_t n_probs;          /* SET_SAMPLER only: log-probabilities per RESULT row, 0 or 1 + k */
    const char *grammar;       /* SET_GRAMMAR only: grammar_len bytes (in the payload after decode) */
    uint32_t grammar_len;
} cv_msg_seq_op;

/* Bytes of m's payload. */
size_t cv_msg_seq_op_size(const cv_msg_seq_op *m);

int cv_msg_seq_op_encode(const cv_msg_seq_op *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
int cv_msg_seq_op_decode(const void *payload, size_t len, cv_msg_seq_op *m, char *err, size_t errlen);

/* ---- PING / PONG / BYE ---- */

#define CV_MSG_PING_SIZE 16
#define CV_PULSE_MS 500

typedef struct cv_msg_ping {
    uint64_t nonce;
    uint64_t timestamp;
} cv_msg_ping;

int cv_msg_ping_encode(const cv_msg_ping *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
int cv_msg_ping_decode(const void *payload, size_t len, cv_msg_ping *m, char *err, size_t errlen);
int cv_msg_bye_decode(const void *payload, size_t len, char *err, size_t errlen);

/* ---- STATS / STATS_OK ---- */

#define CV_MSG_STATS_OK_SIZE 32

typedef struct cv_msg_stats {
    uint64_t compute_ns;
    uint64_t steps;
    uint64_t tokens;
    uint64_t bytes_sent;
} cv_msg_stats;

int cv_msg_stats_encode(const cv_msg_stats *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
int cv_msg_stats_decode(const void *payload, size_t len, cv_msg_stats *m, char *err, size_t errlen);

/* ---- FETCH / SHIP ---- */

#define CV_MSG_FETCH_SIZE 8
#define CV_SHIP_FIXED_SIZE 16
/* The largest SHIP: its fixed part and one encoded segment. */
#define CV_SHIP_PAYLOAD_MAX (CV_SHIP_FIXED_SIZE + CV_PACK_SEGMENT_BOUND)
static_assert(CV_SHIP_PAYLOAD_MAX <= CV_PROTO_DEFAULT_MAX_PAYLOAD, "SHIP fits a frame");

typedef struct cv_msg_ship {
    uint64_t offset, size;
    const uint8_t *segment; /* after decode, in the payload */
    size_t segment_len;
} cv_msg_ship;

int cv_msg_fetch_encode(uint64_t have, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
int cv_msg_fetch_decode(const void *payload, size_t len, uint64_t *have, char *err, size_t errlen);
/* Encodes the fixed part only: the segment follows it in a second part. */
int cv_msg_ship_encode_header(const cv_msg_ship *m, void *buf, size_t cap, size_t *len, char *err, size_t errlen);
/* Checks the fixed part; m->segment points to the segment, not decoded. */
int cv_msg_ship_decode(const void *payload, size_t len, cv_msg_ship *m, char *err, size_t errlen);

/* Validates a payload of any type as its decoder would (RESULT rows are
 * checked without being stored), for receivers that check a frame before
 * routing it, and for the fuzzer. */
int cv_msg_validate(uint16_t type, const void *payload, size_t len, char *err, size_t errlen);

#endif
