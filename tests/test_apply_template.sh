#!/usr/bin/env bash
# test_apply_template.sh: the prompt `convoy serve` feeds the model for a
# chat request equals `convoy render-template`'s, byte for byte, for every
# template of ../shared/reference/chat-templates and every conversation of
# tests/test_jinja/conversations.json (chat_template_kwargs, tools and
# add_generation_prompt included); tests/test_apply_template/check.mjs says
# how. Skips without ../shared or node, except under CI=true.
#
# Usage (CTest passes these): test_apply_template.sh PATH/TO/convoy SOURCE_DIR
set -uo pipefail

convoy="${1:?usage: test_apply_template.sh PATH/TO/convoy SOURCE_DIR}"
src="${2:?usage: test_apply_template.sh PATH/TO/convoy SOURCE_DIR}"
shared="${CONVOY_SHARED:-$src/../shared}"
templates="$shared/reference/chat-templates"
model="$shared/models/stories260K.gguf"

. "$src/tests/lib.sh"
[[ -d "$templates" && -f "$model" ]] || skip "test data under $shared not found"
command -v node >/dev/null || skip "node is needed"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
node "$src/tests/test_apply_template/check.mjs" "$convoy" "$model" "$templates" \
    "$src/tests/test_jinja/conversations.json" "$tmp"
