#!/usr/bin/env python3
"""chat.py: chats with `convoy serve` as an OpenAI client does, for bench/chat.sh.

    chat.py URL LABEL [--users U] [--turns T] [--user-tokens N] [--max-tokens M] [--no-cache]

Each user holds one conversation: every turn adds a user message of about
N tokens (words drawn from a fixed list, measured with /tokenize) and asks
for M tokens (greedy, ignore_eos), sending the whole history, its own
earlier answers included, to /v1/chat/completions with stream and
include_usage. The users chat at once, one thread each. Prints one line
per turn and user (time to first token, prompt tokens, cached tokens), then
a summary line "LABEL ttft1 S ttftT S ratio R kept K" where ratio is the
mean time to first token of the last turn over the first, and kept the
cached tokens over the history the server held before each later turn
(the previous turn's prompt and answer), summed over users and turns.
--no-cache sends cache_prompt: false.
"""
import argparse
import json
import random
import threading
import time
import urllib.request

WORDS = ("the river keeps a quiet record of every season it has carried past the old mill where the children "
         "used to count boats and name the clouds after animals they had never seen except in the thick "
         "yellow book their grandmother kept on the shelf above the stove beside a jar of buttons").split()


# A synthetic model draws token ids at random: bytes that are no UTF-8, and `convoy synth`'s filler
# pieces ("tok01234"), which come back as 8 tokens each when the client sends the answer as text. The
# answers are held to lowercase words (a grammar), text as a real model writes it, which a client
# sends back as about as many tokens as were generated.
WORDS_ONLY = 'root ::= [ a-z]*'


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def count_tokens(base, text):
    with post(base + "/tokenize", {"content": text}) as r:
        return len(json.load(r)["tokens"])


def user_message(base, rng, n_tokens):
    words = []
    text = ""
    while True:
        words.append(rng.choice(WORDS))
        text = " ".join(words)
        if len(words) % 16 == 0 and count_tokens(base, text) >= n_tokens:
            return text


def chat_turn(base, messages, max_tokens, cache):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "grammar": WORDS_ONLY}
    if not cache:
        body["cache_prompt"] = False
    t0 = time.monotonic()
    ttft = None
    text = []
    usage = None
    with post(base + "/v1/chat/completions", body) as r:
        for raw in r:
            if raw.startswith(b"data: {\"error\""):
                raise RuntimeError(raw.decode())
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    text.append(piece)
    return ttft, "".join(text), usage


def run_user(args, u, results):
    rng = random.Random(1000 + u)
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    held = 0  # tokens the server held for this user after its last turn
    for t in range(args.turns):
        messages.append({"role": "user", "content": user_message(args.url, rng, args.user_tokens)})
        ttft, text, usage = chat_turn(args.url, messages, args.max_tokens, not args.no_cache)
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        results.append((u, t, ttft, usage["prompt_tokens"], cached, held))
        held = usage["prompt_tokens"] + usage["completion_tokens"]
        messages.append({"role": "assistant", "content": text})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("label")
    ap.add_argument("--users", type=int, default=1)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--user-tokens", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-cache", action="store_true")
    args = ap.parse_args()
    results = []
    threads = [threading.Thread(target=run_user, args=(args, u, results)) for u in range(args.users)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    results.sort()
    for u, t, ttft, prompt, cached, held in results:
        print(f"  {args.label} user {u} turn {t + 1}: ttft {ttft:.3f} s, prompt {prompt}, cached {cached}")
    first = [r[2] for r in results if r[1] == 0]
    last = [r[2] for r in results if r[1] == args.turns - 1]
    kept = sum(r[4] for r in results if r[1] > 0) / max(1, sum(r[5] for r in results if r[1] > 0))
    t1, tn = sum(first) / len(first), sum(last) / len(last)
    print(f"{args.label} ttft1 {t1:.3f} s ttft{args.turns} {tn:.3f} s ratio {tn / t1:.2f} kept {kept:.3f}")


if __name__ == "__main__":
    main()
