#!/usr/bin/env python3
"""stream_client.py: a fixed set of streaming completions, a few at a time
(bench/chaos.sh, tests/test_failover.sh).

    stream_client.py BASE REQUESTS.json OUT.json [--concurrency N] [--progress FILE]

Sends every request of REQUESTS.json (a list of /v1/completions bodies) to
BASE (http://host:port/v1) with "stream": true, at most N (default 8) at
once, and writes OUT.json: "texts" (each request's text, in order),
"errors" (each stream's error event, failure or end before
[DONE], or null), "tokens" (each
stream's completion_tokens), "wall_s" (first request sent to last one done),
"chunk_times" (the time.time() of every text chunk received, in order),
"first_chunk" (each request's first text chunk's time.time(), or null).
With --progress, FILE holds "CHUNKS DONE" (text chunks received in all,
requests finished), rewritten every 0.1 s, so that a script can time faults
to requests in flight.
"""
import concurrent.futures
import json
import os
import sys
import threading
import time
import urllib.request


class Progress:
    def __init__(self, path):
        self.path, self.chunks, self.done, self.lock = path, 0, 0, threading.Lock()
        self.times = []  # the wall-clock time of every chunk, in order
        self.stop = threading.Event()

    def add(self, chunks=0, done=0):
        with self.lock:
            self.chunks += chunks
            self.done += done
            if chunks:
                self.times.append(round(time.time(), 3))

    def write(self):
        if not self.path:
            return
        with self.lock:
            line = f"{self.chunks} {self.done}\n"
        with open(self.path + ".tmp", "w") as f:
            f.write(line)
        os.replace(self.path + ".tmp", self.path)

    def writer(self):
        while not self.stop.wait(0.1):
            self.write()
        self.write()


def stream(base, body, progress):
    req = urllib.request.Request(base + "/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    text, error, tokens, done, first = [], None, None, False, None
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                done = done or line == "data: [DONE]"
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    error = ev["error"]
                    continue
                if ev.get("usage"):
                    tokens = ev["usage"]["completion_tokens"]
                text.append(ev["choices"][0].get("text", ""))
                first = first or round(time.time(), 3)
                progress.add(chunks=1)
        if not done and error is None:
            error = "the stream ended without [DONE]"
    except Exception as e:  # a failed request is a result, not a crash of the driver
        error = str(e)
    progress.add(done=1)
    return {"text": "".join(text), "error": error, "tokens": tokens, "first": first}


def main():
    args = sys.argv[1:]
    base, requests, out_path = args[0], json.load(open(args[1])), args[2]
    opt = lambda name, default: args[args.index(name) + 1] if name in args else default
    concurrency = int(opt("--concurrency", 8))
    progress = Progress(opt("--progress", None))
    writer = threading.Thread(target=progress.writer)
    writer.start()
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda body: stream(base, body, progress), requests))
    wall = time.monotonic() - t0
    progress.stop.set()
    writer.join()
    report = {"texts": [r["text"] for r in results], "errors": [r["error"] for r in results],
              "tokens": [r["tokens"] for r in results], "wall_s": round(wall, 2),
              "chunk_times": progress.times, "first_chunk": [r["first"] for r in results]}
    with open(out_path, "w") as f:
        json.dump(report, f)


main()
