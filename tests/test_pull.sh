#!/usr/bin/env bash
# test_pull.sh: `convoy pull` and -hf against a stand-in of the Hugging
# Face hub (tests/test_pull/hub.py: its URL shapes, the redirect of LFS
# files to another host with X-Linked-Size and X-Linked-Etag, ranges,
# a token for a private repository, a transfer cut once per file):
# a download cut midway resumes with a range and gives the file byte for
# byte; a second pull downloads nothing; OWNER/REPO[:QUANT] picks the GGUF
# of that quantization (Q4_K_M by default; mmproj files aside) and names
# the candidates when none matches; a part left by an earlier run is
# resumed; a wrong SHA-256 is refused and the download deleted; a private
# repository needs HF_TOKEN, which the redirect does not carry to the
# other host; without the hub a cached file is used; `convoy run -hf`
# generates what -m on the same file does.
#
# Usage (CTest passes these): test_pull.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
need_stories
need python3 "for the hub stand-in"

make_tmp

# the repositories
mkdir -p "$tmp/root/owner/tiny" "$tmp/root/owner/bad" "$tmp/root/owner/private"
cp "$model" "$tmp/root/owner/tiny/tiny-Q4_K_M.gguf"
"$convoy" quantize "$model" "$tmp/root/owner/tiny/tiny-Q8_0.gguf" Q8_0 >/dev/null 2>&1 ||
    die "convoy quantize"
head -c 4096 "$model" >"$tmp/root/owner/tiny/mmproj-tiny-Q4_K_M.gguf"
echo "# tiny" >"$tmp/root/owner/tiny/README.md"
cp "$model" "$tmp/root/owner/bad/m.gguf"
cp "$model" "$tmp/root/owner/private/m.gguf"

python3 "$src/tests/test_pull/hub.py" "$tmp/root" "$tmp/hub.log" "$tmp/port" --cut 300000 &
pids+=($!)
for _ in $(seq 100); do [[ -f "$tmp/port" ]] && break; sleep 0.1; done
[[ -f "$tmp/port" ]] || die "the hub stand-in did not start"
export HF_ENDPOINT="http://127.0.0.1:$(cat "$tmp/port")" CONVOY_MODELS="$tmp/cache"
unset HF_TOKEN
cache="$tmp/cache"

# pull ARGS...: convoy pull, stdout in $tmp/out, stderr in $tmp/err, status in rc
pull() {
    "$convoy" pull "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}
# cdn_gets: the GETs of file bytes so far
cdn_gets() { grep -c "^GET /cdn/" "$tmp/hub.log"; }

# 1. a download cut midway, resumed
pull hf://owner/tiny/tiny-Q4_K_M.gguf
expect "pull hf://owner/tiny/tiny-Q4_K_M.gguf: exit 0, the path printed" \
    test "$rc" = 0 -a "$(cat "$tmp/out")" = "$cache/owner/tiny/tiny-Q4_K_M.gguf"
expect "the file is the hub's byte for byte" cmp -s "$cache/owner/tiny/tiny-Q4_K_M.gguf" "$model"
expect "the cut transfer was resumed with a range from 300000" \
    grep -q "^GET /cdn/owner/tiny/tiny-Q4_K_M.gguf range=bytes=300000- " "$tmp/hub.log"
expect "stderr tells of the resumption" grep -q "resuming at 0.3 MB" "$tmp/err"
expect "its SHA-256 is recorded beside it" \
    test "$(cat "$cache/owner/tiny/tiny-Q4_K_M.gguf.sha256")" = "$(sha256sum "$model" | cut -d' ' -f1)"
expect "no part file is left" test ! -e "$cache/owner/tiny/tiny-Q4_K_M.gguf.part"

# 2. the same revision again: nothing downloaded
before="$(cdn_gets)"
pull hf://owner/tiny/tiny-Q4_K_M.gguf
expect "a second pull downloads nothing and says so" \
    test "$rc" = 0 -a "$(cdn_gets)" = "$before" -a -n "$(grep "up to date" "$tmp/err")"

# 3. OWNER/REPO[:QUANT]
pull owner/tiny:q8_0
expect "owner/tiny:q8_0 is tiny-Q8_0.gguf (any case)" \
    test "$rc" = 0 -a "$(cat "$tmp/out")" = "$cache/owner/tiny/tiny-Q8_0.gguf"
expect "... byte for byte" cmp -s "$cache/owner/tiny/tiny-Q8_0.gguf" "$tmp/root/owner/tiny/tiny-Q8_0.gguf"
pull owner/tiny
expect "owner/tiny is its Q4_K_M file (not the mmproj one)" \
    test "$rc" = 0 -a "$(cat "$tmp/out")" = "$cache/owner/tiny/tiny-Q4_K_M.gguf"
pull owner/tiny:Q2_K
expect "owner/tiny:Q2_K: exit 1, the candidates named" \
    test "$rc" = 1 -a -n "$(grep "no GGUF file named for Q2_K (its GGUF files: tiny-Q4_K_M.gguf, tiny-Q8_0.gguf)" \
    "$tmp/err")"

# 4. a part left by an earlier run, into -o's new folder
mkdir -p "$tmp/o/new"
head -c 100000 "$tmp/root/owner/tiny/tiny-Q8_0.gguf" >"$tmp/o/new/x.gguf.part"
pull hf://owner/tiny/tiny-Q8_0.gguf -o "$tmp/o/new/x.gguf"
expect "a part left behind is resumed from its size (-o PATH)" \
    grep -q "^GET /cdn/owner/tiny/tiny-Q8_0.gguf range=bytes=100000- " "$tmp/hub.log"
expect "... and the file is whole" cmp -s "$tmp/o/new/x.gguf" "$tmp/root/owner/tiny/tiny-Q8_0.gguf"
pull hf://owner/tiny/tiny-Q8_0.gguf -o "$tmp/o/made/here/y.gguf"
expect "-o into folders that do not exist yet" cmp -s "$tmp/o/made/here/y.gguf" "$tmp/root/owner/tiny/tiny-Q8_0.gguf"

# 5. a wrong SHA-256
pull hf://owner/bad/m.gguf
expect "a SHA-256 other than the hub's: exit 1, both hashes named" \
    test "$rc" = 1 -a -n "$(grep "SHA-256 $(sha256sum "$model" | cut -d' ' -f1), the hub states" "$tmp/err")"
expect "... and nothing is left" test ! -e "$cache/owner/bad/m.gguf" -a ! -e "$cache/owner/bad/m.gguf.part"

# 6. a private repository
pull hf://owner/private/m.gguf
expect "a private repository without HF_TOKEN: exit 1, HF_TOKEN named" \
    test "$rc" = 1 -a -n "$(grep "HTTP 401.*HF_TOKEN" "$tmp/err")"
HF_TOKEN=s3cret pull hf://owner/private/m.gguf
expect "with HF_TOKEN: exit 0" test "$rc" = 0
expect "... and the file" cmp -s "$cache/owner/private/m.gguf" "$model"
expect "the token went to the hub" grep -q "^HEAD /owner/private/resolve/main/m.gguf .*auth=Bearer s3cret" "$tmp/hub.log"
expect "... and not to the host the redirect named" \
    test -z "$(grep "^GET /cdn/owner/private/" "$tmp/hub.log" | grep -v "auth=-$")"

# 7. errors
pull hf://owner/none/m.gguf
expect "an unknown repository: exit 1, HTTP 404 named" test "$rc" = 1 -a -n "$(grep "HTTP 404" "$tmp/err")"
pull owner
expect "'owner' is not a reference: exit 1, the forms named" \
    test "$rc" = 1 -a -n "$(grep "not a model reference: give hf://OWNER/REPO/FILE.gguf or OWNER/REPO\[:QUANT\]" "$tmp/err")"
pull hf://owner/tiny/../x.gguf
expect "a path with .. is refused" test "$rc" = 1 -a -n "$(grep "not a model reference" "$tmp/err")"

# 8. without the hub
stop_pids
pull owner/tiny:Q8_0
expect "the hub gone, OWNER/REPO:QUANT cannot be chosen: exit 1" test "$rc" = 1
pull hf://owner/tiny/tiny-Q8_0.gguf
expect "the hub gone, a cached file is used and said so" \
    test "$rc" = 0 -a -n "$(grep "using the cached file" "$tmp/err")"

# 9. run -hf
"$convoy" run -hf hf://owner/tiny/tiny-Q8_0.gguf -p "Once upon a time" -n 16 --temp 0 --ids >"$tmp/hf.ids" 2>"$tmp/err"
"$convoy" run -m "$tmp/root/owner/tiny/tiny-Q8_0.gguf" -p "Once upon a time" -n 16 --temp 0 --ids >"$tmp/m.ids" \
    2>/dev/null
expect "run -hf generates ids" test -s "$tmp/hf.ids"
expect "... those -m on the same file gives" cmp -s "$tmp/hf.ids" "$tmp/m.ids"
"$convoy" run -p hi 2>"$tmp/err" >/dev/null
rc=$?
expect "run without -m or -hf: exit 2, both named" test "$rc" = 2 -a -n "$(grep -- "-m PATH or -hf" "$tmp/err")"

checks_summary
