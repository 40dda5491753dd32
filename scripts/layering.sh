#!/usr/bin/env bash
# layering.sh: checks that includes point one way through the house.
#
#   scripts/layering.sh [ROOT]     (default: the repository this script is in)
#
# Reads every `#include "..."` in ROOT's src/, app/ and include/ and prints
# each one the table below forbids, as FILE:LINE: includes X (RULE); exits 1
# when there is any. Standard headers (<...>) are always allowed, and so is
# a header of the including file's own folder.
#
# The house, lower floors first: core -> kernels -> model, codec, chat -> infer ->
# pipe -> engine -> serve -> app. A floor includes only floors below it (chat,
# the chat templates, stands on core alone), and the engine API
# (include/convoy.h) includes nothing of the project: serve and app reach the
# engine through it alone, and the chat templates through chat/.
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}

# RULES: "WHERE: ALLOWED...". WHERE is a folder (every file in it) or one
# file, which then also gets its folder's rule; an ALLOWED entry ending in /
# is a folder, any other one header. convoy.h is include/convoy.h.
RULES=(
    "src/core/:"
    "src/kernels/: core/"
    "src/codec/: core/ kernels/"
    "src/model/: core/ kernels/"
    "src/chat/: core/"
    "src/infer/: core/ kernels/ model/"
    "src/pipe/: core/ codec/ kernels/ model/ infer/"
    "src/engine/: core/ codec/ kernels/ model/ infer/ pipe/ convoy.h"
    "src/serve/: core/ chat/ convoy.h"
    "include/:"
    "app/: convoy.h core/clock.h"
    "app/cmd_serve.c: serve/ chat/template.h"
    "app/cmd_render_template.c: chat/ core/alloc.h"
    "app/cmd_chat.c: serve/"
    "app/cmd_stage.c: pipe/node.h"
    "app/cmd_keygen.c: pipe/seal.h"
    "app/hub.c: core/err.h core/fmap.h"
)

# allowed_for FILE: the allowed entries of every rule that covers FILE.
allowed_for() {
    local file=$1 rule where
    for rule in "${RULES[@]}"; do
        where=${rule%%:*}
        if [[ "$file" == "$where" || ("$where" == */ && "$file" == "$where"*) ]]; then
            echo "${rule#*:}"
        fi
    done
}

# permits ALLOWED TARGET: whether an allowed list lets a file include TARGET.
permits() {
    local entry
    for entry in $1; do
        if [[ "$TARGET" == "$entry" || ("$entry" == */ && "$TARGET" == "$entry"*) ]]; then
            return 0
        fi
    done
    return 1
}

violations=0
cd "$ROOT" || exit 2
while IFS= read -r file; do
    dir=$(dirname "$file")
    allowed=$(allowed_for "$file" | xargs)
    while IFS=: read -r line target; do
        TARGET=$target
        # A header beside the including file (app's args.h, a folder's own).
        [[ -f "$dir/$(basename "$TARGET")" && "$TARGET" != */* ]] && continue
        [[ "$TARGET" == */* && -f "src/$TARGET" && "src/$(dirname "$TARGET")" == "$dir" ]] && continue
        if ! permits "$allowed" "$TARGET"; then
            echo "$file:$line: includes \"$TARGET\" (allowed: ${allowed:-standard headers only})"
            violations=$((violations + 1))
        fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" |
             sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(find src app include -name '*.[ch]' | sort)

if [[ "$violations" -gt 0 ]]; then
    echo "layering: $violations forbidden include(s)"
    exit 1
fi
echo "layering: every include points down the house"
