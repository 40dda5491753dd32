# stage_peer.py: raw frames to and from `convoy stage` for test_stage_limits.sh
# and test_split.sh (a helper, not a test). The wire format is src/pipe/proto.h's header comment.
#
#   stage_peer.py capture PORT OUT   act as a node for one head: answer its
#                                    query HELLO, save its assignment HELLO's
#                                    payload to OUT (then hang up)
#   stage_peer.py check PORT HELLO SCENARIO
#                                    send the saved HELLO (changed as the
#                                    scenario says) to the stage on PORT and
#                                    check its answers; prints what it saw,
#                                    exits 1 on a wrong answer
import socket
import struct
import sys
import time

MAGIC = 0x31595643
HELLO, HELLO_OK, ERROR, FORWARD, STATS, STATS_OK = 1, 2, 3, 4, 10, 11
CODES = {1: "BAD_FRAME", 4: "NO_MEMORY", 5: "BAD_RANGE", 12: "TOO_LARGE", 13: "ACT_TYPE", 14: "TIMEOUT"}
# the head of test_stage_limits.sh runs stories260K with --ctx 256 --batch 4
N_LAYER, N_CTX, N_SLOT, N_BATCH, N_EMBD = 5, 256, 1, 4, 64

_table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _table.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def frame(kind, fid, payload, length=None):
    n = len(payload) if length is None else length
    return struct.pack("<IHHIIII", MAGIC, 1, kind, 0, fid, n, crc32c(payload) if payload else 0) + payload


def read_exact(s, n):
    out = b""
    while len(out) < n:
        got = s.recv(n - len(out))
        if not got:
            raise EOFError("connection closed")
        out += got
    return out


def read_frame(s):
    magic, _, kind, _, fid, n, _ = struct.unpack("<IHHIIII", read_exact(s, 24))
    assert magic == MAGIC, "bad magic"
    return kind, fid, read_exact(s, n)


def sizes_at(hello):
    """Offset of l0 in a HELLO: l0, l1, n_layer, n_ctx, n_slot, n_batch_max
    are consecutive u32s wherever the layout puts them."""
    for off in range(0, len(hello) - 24, 1):
        l0, l1, nl, nc, ns, nb = struct.unpack_from("<6I", hello, off)
        if (nl, nc, ns, nb) == (N_LAYER, N_CTX, N_SLOT, N_BATCH) and l0 <= l1 <= nl:
            return off
    raise ValueError("no HELLO sizes found")


def capture(port, out):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1)
    ls.settimeout(20)
    s, _ = ls.accept()
    s.settimeout(20)
    while True:
        kind, fid, p = read_frame(s)
        if kind != HELLO:
            continue
        off = sizes_at(p)
        l0, l1 = struct.unpack_from("<2I", p, off)
        if l0 < l1:
            open(out, "wb").write(p)
            return
        version = struct.unpack_from("<H", p, 0)[0]
        ok = struct.pack("<HHIQQIIIII", version, 0, 100, 1 << 40, 0, 64 << 20, 0, N_LAYER, 0, 1)
        s.sendall(frame(HELLO_OK, fid, ok))


def with_sizes(hello, n_ctx, n_slot):
    p = bytearray(hello)
    struct.pack_into("<2I", p, sizes_at(hello) + 12, n_ctx, n_slot)
    return bytes(p)


def expect_error(s, code, words=()):
    kind, _, p = read_frame(s)
    assert kind == ERROR, f"expected ERROR {CODES[code]}, got frame type {kind}"
    got, n = struct.unpack_from("<IH", p, 0)
    msg = p[6:6 + n].decode()
    print(f"  ERROR {CODES.get(got, got)}: {msg}")
    assert got == code, f"expected ERROR {CODES[code]}, got code {got}"
    for w in words:
        assert w in msg, f"the message does not name '{w}'"


def forward(n_rows, act_type, act_bytes_per_row):
    recs = b"".join(struct.pack("<iiiB3x", 1, 0, i, 1) for i in range(n_rows))
    return struct.pack("<IIBB6x", n_rows, N_EMBD, act_type, 2) + recs + bytes(n_rows * act_bytes_per_row)


def session(port, hello):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(frame(HELLO, 1, hello))
    kind, _, p = read_frame(s)
    assert kind == HELLO_OK, f"expected HELLO_OK, got {kind}: {p[6:].decode(errors='replace')}"
    return s


def check(port, hello, scenario):
    if scenario == "huge":  # 4096 slots x 8192 positions: refused by its size, nothing allocated
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(frame(HELLO, 1, with_sizes(hello, 8192, 4096)))
        expect_error(s, 4, ("4096 slots", "8192 positions"))
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(frame(HELLO, 1, with_sizes(hello, 8192, 5000)))
        expect_error(s, 12, ("n_slot 5000",))
    elif scenario == "forwards":  # refused by size and type, no compute
        s = session(port, hello)
        s.sendall(frame(FORWARD, 2, forward(N_BATCH + 4, 0, 4 * N_EMBD)))
        expect_error(s, 12, ("n_batch_max 4",))
        s.sendall(frame(FORWARD, 3, forward(1, 1, 2 * N_EMBD)))
        expect_error(s, 13, ("f16", "f32"))
        s.sendall(frame(STATS, 4, b""))
        kind, _, p = read_frame(s)
        steps = struct.unpack_from("<QQ", p, 0)[1]
        print(f"  STATS: {steps} steps computed")
        assert kind == STATS_OK and steps == 0, "a refused FORWARD was computed"
        # a 64 MiB FORWARD: its header alone is refused, no payload is read
        s.sendall(struct.pack("<IHHIIII", MAGIC, 1, FORWARD, 0, 5, 64 << 20, 0))
        expect_error(s, 1, ("67108864",))
    elif scenario == "shard":  # an assignment of every layer to a stage serving a shard of [0, 2)
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(frame(HELLO, 1, hello))
        expect_error(s, 5, ("a shard of layers [0, 2)", "layers [0, 5)"))
    elif scenario == "silent":  # the stage ends a session whose head went silent
        s = session(port, hello)
        t0 = time.time()
        expect_error(s, 14)
        print(f"  ended after {time.time() - t0:.1f} s of silence")


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        capture(int(sys.argv[2]), sys.argv[3])
    else:
        check(int(sys.argv[2]), open(sys.argv[3], "rb").read(), sys.argv[4])
