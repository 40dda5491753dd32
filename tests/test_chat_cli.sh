#!/usr/bin/env bash
# test_chat_cli.sh: `convoy chat` in a terminal (tmux): a 5-turn
# conversation, a message over two lines (a line ending with \), /clear;
# each greedy reply equals what `convoy serve` answers on
# /v1/chat/completions for the conversation up to it (so the KV a turn
# keeps from the turns before gives a cold prompt's bits); Ctrl-C stops a
# reply and not the program, which goes on and leaves with /exit, exit
# status 0. The transcript is printed.
#
# Usage (CTest passes these): test_chat_cli.sh PATH/TO/convoy SOURCE_DIR
# Skips without tmux or python3, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
need tmux "to drive the terminal"
need python3 "to read the transcript"

make_tmp
sock="convoy-test-$$"
at_exit 'tmux -L "$sock" kill-server 2>/dev/null'

# screen NAME: the session's whole transcript, wrapped lines joined
screen() { tmux -L "$sock" capture-pane -p -J -S - -t "$1"; }
# prompts NAME: the prompt lines so far
prompts() { screen "$1" | grep -c '^> '; }
# wait_prompts NAME N: until N prompts are on the screen (at most 30 s)
wait_prompts() {
    for _ in $(seq 300); do
        [[ "$(prompts "$1")" -ge "$2" ]] && return 0
        sleep 0.1
    done
    return 1
}
# say NAME TEXT: types TEXT and Enter, waits for the next prompt
say() {
    local n
    n="$(prompts "$1")"
    tmux -L "$sock" send-keys -t "$1" -l "$2"
    tmux -L "$sock" send-keys -t "$1" Enter
    wait_prompts "$1" $((n + 1))
}

# 1. five turns (the third over two lines), then /clear and one more
tmux -L "$sock" new-session -d -s chat -x 250 -y 60 \
    "'$convoy' chat -m '$model' --temp 0 -n 24; echo EXITED \$?; sleep 60"
wait_prompts chat 1 || { echo "FAIL: convoy chat did not prompt: $(screen chat)"; exit 1; }
say chat "Hello there"
say chat "Tell me about the dog"
n="$(prompts chat)"
tmux -L "$sock" send-keys -t chat -l 'What did the cat do\'
tmux -L "$sock" send-keys -t chat Enter
tmux -L "$sock" send-keys -t chat -l 'in the garden?'
tmux -L "$sock" send-keys -t chat Enter
wait_prompts chat $((n + 1))
say chat "And then?"
say chat "Thank you"
say chat "/clear"
say chat "Hello there"
tmux -L "$sock" send-keys -t chat -l "/exit"
tmux -L "$sock" send-keys -t chat Enter
for _ in $(seq 100); do screen chat | grep -q "^EXITED" && break; sleep 0.1; done
screen chat | awk 'NF { last = NR } { line[NR] = $0 } END { for (i = 1; i <= last; i++) print line[i] }' \
    >"$tmp/transcript"
echo "---- transcript"
cat "$tmp/transcript"
echo "----"
expect "/exit: exit status 0" grep -q "^EXITED 0" "$tmp/transcript"

# every reply against the server's answer to the conversation before it
start_serve "$convoy" "$tmp/serve.log" -m "$model"
python3 - "$tmp/transcript" "$base" <<'PY'
import json, sys, urllib.request
lines = open(sys.argv[1]).read().split("\n")
turns, msg, cont = [], None, False   # (user text, reply) per turn; /clear as None
i = 0
while i < len(lines):
    l = lines[i]
    if l.startswith("> ") or (cont and l.startswith(". ")):
        text = l[2:]
        cont = text.endswith("\\")
        msg = (msg + "\n" if msg is not None and l.startswith(". ") else "") + (text[:-1] if cont else text)
        i += 1
        if cont:
            continue
        if msg == "/clear":
            turns.append(None); msg = None
            while i < len(lines) and not lines[i].startswith("> "): i += 1
            continue
        if msg == "/exit":
            break
        reply = []
        while i < len(lines) and not lines[i].startswith("> "):
            reply.append(lines[i]); i += 1
        turns.append((msg, "\n".join(reply)))
        msg = None
    else:
        i += 1
conv, ok, n = [], True, 0
for t in turns:
    if t is None:
        conv = []; continue
    user, reply = t
    conv.append({"role": "user", "content": user})
    body = json.dumps({"messages": conv, "temperature": 0, "max_tokens": 24}).encode()
    req = urllib.request.Request(sys.argv[2] + "/v1/chat/completions", body, {"content-type": "application/json"})
    want = json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"]
    same = want == reply
    ok &= same; n += 1
    print(("ok   " if same else "FAIL ") + f"turn {n} ({user!r}): the server's reply to the conversation so far"
          + ("" if same else f": {want!r} != {reply!r}"))
    conv.append({"role": "assistant", "content": reply})
print(f"{n} turns compared")
sys.exit(0 if ok and n == 6 else 1)
PY
expect "six replies, each the server's for the conversation before it" test $? = 0

# 2. Ctrl-C stops a reply, not the program (a synthetic model, whose
# sampled replies run on: its end-of-turn token is one of 2048)
big="$(synth_1024x6 "$convoy")"
tmux -L "$sock" new-session -d -s stop -x 250 -y 60 \
    "'$convoy' chat -m '$big' --temp 1 --seed 1; echo EXITED \$?; sleep 60"
wait_prompts stop 1
tmux -L "$sock" send-keys -t stop -l "Tell me a very long story"
tmux -L "$sock" send-keys -t stop Enter
# Ctrl-C as soon as the reply shows (it runs about 1000 tokens)
for _ in $(seq 200); do
    [[ "$(screen stop | grep -A1 "^> Tell me" | grep -c tok)" -gt 0 ]] && break
    sleep 0.05
done
tmux -L "$sock" send-keys -t stop C-c
expect "Ctrl-C: the reply stops and a prompt comes back" wait_prompts stop 2
expect "... saying it was stopped" bash -c "tmux -L '$sock' capture-pane -p -J -S - -t stop | grep -q '\[stopped\]'"
say stop "Hello there"
tmux -L "$sock" send-keys -t stop -l "/exit"
tmux -L "$sock" send-keys -t stop Enter
for _ in $(seq 100); do screen stop | grep -q "^EXITED" && break; sleep 0.1; done
expect "... and the program goes on, then leaves with status 0" \
    bash -c "tmux -L '$sock' capture-pane -p -J -S - -t stop | grep -q '^EXITED 0'"

checks_summary
