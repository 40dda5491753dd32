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

. "$(dirname "$0")/lib.sh"
test_args "$@"
templates="$shared/reference/chat-templates"
need_stories
need_data "$templates"
need node

make_tmp
node "$src/tests/test_apply_template/check.mjs" "$convoy" "$model" "$templates" \
    "$src/tests/test_jinja/conversations.json" "$tmp"
