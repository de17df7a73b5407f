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
if ! cmake --build "$dir" -j"$(nproc)" >"$dir.build.log" 2>&1; then
  grep -vE '^\[ *[0-9]+%\]' "$dir.build.log" | tail -60
  echo "build failed: full log in $dir.build.log"
  exit 1
fi
