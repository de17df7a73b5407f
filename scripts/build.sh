#!/usr/bin/env bash
# Configures and builds tandem into a build folder.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/build}"
shift || true
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir.cmake.log" 2>&1 \
  || { cat "$dir.cmake.log"; exit 1; }
cmake --build "$dir" -j"$(nproc)" 2>&1 | grep -vE '^\[ *[0-9]+%\]' || true
test "${PIPESTATUS[0]}" -eq 0
