#!/usr/bin/env bash
# test_jinja.sh: convoy's Jinja engine against the real chat templates.
#
# Usage (CTest passes these): test_jinja.sh PATH/TO/convoy SOURCE_DIR
#
# Every template of ../shared/reference/chat-templates (44 real ones) is
# rendered with every conversation of tests/test_jinja/conversations.json
# (system/user/assistant turns, multi-turn, add_generation_prompt on and
# off, tool definitions, tool calls and results, content lists, non-ASCII
# text, text that looks like Jinja, chat_template_kwargs, role orders that
# templates refuse) through `convoy render-template`, and compared byte for
# byte with @huggingface/jinja (installed under BUILD_DIR/npm, as test_chat
# does) and with Python's Jinja2 (tests/test_jinja/check.mjs says how a case
# passes; the cases @huggingface/jinja cannot render, or renders otherwise
# than Jinja2, are printed with convoy's output). Skips without ../shared,
# node, npm or python3's jinja2, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
templates="$shared/reference/chat-templates"
need_data "$templates"
python3 -c 'import jinja2' 2>/dev/null || skip "python3 with jinja2 is needed for the Jinja2 oracle"
npm_need "$npm_dir" @huggingface/jinja@0.5.11

make_tmp
node "$src/tests/test_jinja/check.mjs" "$convoy" "$npm_dir" "$templates" "$src/tests/test_jinja/conversations.json" \
    "$tmp"
