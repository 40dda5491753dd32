#!/usr/bin/env bash
# run.sh: the main job. Installs what is missing, builds the release convoy
# binary in build/, and generates 64 tokens from the stories260K model for
# "Once upon a time". Extra arguments are appended to the `convoy run`
# command line. The model is read from ../shared, or from $CONVOY_SHARED
# when set.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
model="${CONVOY_SHARED:-../shared}/models/stories260K.gguf"
if [[ ! -r "$model" ]]; then
    echo "run.sh: $model not found (clone shared/ beside the repo, or set CONVOY_SHARED)" >&2
    exit 1
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make --no-print-directory -C build -j2 convoy >/dev/null
exec build/convoy run -m "$model" -p "Once upon a time" -n 64 "$@"
