#!/usr/bin/env bash
# function_length.sh: lists the functions of src/ and app/ longer than a
# limit (default 80 lines, from the line that starts the signature to the
# closing brace) and exits 1 when there is any.
#
#   scripts/function_length.sh [ROOT] [LIMIT]
#
# It reads the house style: a function's body opens with `{` and closes
# with `}` alone at the start of a line, its signature starts at column 0.
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
LIMIT=${2:-80}
cd "$ROOT" || exit 2
find src app -name '*.c' | sort | xargs awk -v limit="$LIMIT" '
    FNR == 1 { sig = 0; open = 0 }
    /^[A-Za-z_]/ && !open { sig = FNR; name = $0 }
    /^\{/ && !open { open = 1 }
    /^\}/ && open {
        open = 0
        if (FNR - sig + 1 > limit) {
            printf "%s:%d: %d lines: %s\n", FILENAME, sig, FNR - sig + 1, substr(name, 1, 90)
            long++
        }
    }
    END { if (long) { printf "function_length: %d function(s) over %d lines\n", long, limit; exit 1 } }'
