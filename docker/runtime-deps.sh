#!/bin/sh
# Prints, one a line, the packages that hold the shared libraries the given
# binaries load (ldd, then dpkg -S), on the distribution they were built on.
# The images install exactly these in their runtime stage, so that no list of
# library packages is written twice or drifts from what the build linked.
# Libraries of the CUDA toolkit are left out: the CUDA runtime base image
# carries them.
#   docker/runtime-deps.sh BINARY...
set -eu
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
for b in "$@"; do
  [ -x "$b" ] || { echo "runtime-deps: $b is not an executable" >&2; exit 1; }
  if ldd "$b" | grep -q "not found"; then
    echo "runtime-deps: $b has libraries that are not found:" >&2
    ldd "$b" | grep "not found" >&2
    exit 1
  fi
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done | sort -u | while read -r lib; do
  real=$(readlink -f "$lib")
  pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null || true)
  [ -n "$pkg" ] || { echo "runtime-deps: no package holds $lib" >&2; exit 1; }
  echo "$pkg" | head -1 | cut -d: -f1
done | grep -Ev '^(cuda-|libcu|libnccl|libnv)' | sort -u
