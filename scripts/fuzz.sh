#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer harnesses of tests/fuzz with clang (ASan +
# UBSan, TANDEM_FUZZ=ON) in build-fuzz/ and runs each for SECONDS (default
# 60; 0 only builds), FUZZ_JOBS of them at a time (default: one per core), from its seed
# corpus and crash reproducers. Prints
# one line per harness (executions, coverage, crashes) and fails if any
# harness crashed, leaked or broke an invariant; the input that did is kept
# in build-fuzz/fuzz/<harness>/artifacts/ (copy it to tests/fuzz/regress/
# <harness>/ once fixed, and ctest replays it from then on).
#   scripts/fuzz.sh [SECONDS] [HARNESS...]
# Inputs found along the way are kept in build-fuzz/fuzz/<harness>/corpus/
# and reused by the next run. FUZZ_BUILD overrides the build folder.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-60}"
shift || true
dir="${FUZZ_BUILD:-$root/build-fuzz}"
# Every harness is a tests/fuzz/fuzz_<name>.c.
all=()
for f in "$root"/tests/fuzz/fuzz_*.c; do
  h="$(basename "$f" .c)"
  all+=("${h#fuzz_}")
done
jobs="${FUZZ_JOBS:-$(nproc)}"
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=("${all[@]}")

"$root/scripts/deps.sh" || exit 1
# clang with libFuzzer (Debian's clang brings its runtime).
probe="$(mktemp -d)"
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
  >"$probe/p.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
  echo "tandem: installing clang (libFuzzer)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang >/dev/null
  clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" \
    || { echo "clang cannot build a libFuzzer binary"; rm -rf "$probe"; exit 1; }
fi
rm -rf "$probe"

mkdir -p "$dir"
cmake -S "$root" -B "$dir" -DCMAKE_C_COMPILER=clang -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$dir.cmake.log" 2>&1 \
  || { cat "$dir.cmake.log"; exit 1; }
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
if ! cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}" >"$dir.build.log" 2>&1; then
  grep -vE '^\[ *[0-9]+%\]' "$dir.build.log" | tail -60
  echo "build failed: full log in $dir.build.log"
  exit 1
fi

[ "$secs" -eq 0 ] && exit 0

# One harness: its run's log, then its summary line in $work/result.
fuzz_one() {
  local h="$1" work="$dir/fuzz/$1"
  mkdir -p "$work/corpus" "$work/artifacts"
  rm -f "$work/artifacts"/* "$work/result"
  local seeds=("$root/tests/fuzz/corpus/$h")
  [ -d "$root/tests/fuzz/regress/$h" ] && seeds+=("$root/tests/fuzz/regress/$h")
  local log="$work/fuzz.log"
  # The harness reads the bundled models relative to the source tree.
  (cd "$root" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout $((secs + 120)) "$dir/tests/fuzz/fuzz_$h" -max_total_time="$secs" \
      -print_final_stats=1 -timeout=20 -rss_limit_mb=2560 -artifact_prefix="$work/artifacts/" \
      "$work/corpus" "${seeds[@]}") >"$log" 2>&1
  local rc=$?
  local execs rate last cov ft corp crashes
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
  cov=$(echo "$last" | sed -nE 's/.*cov: ([0-9]+).*/\1/p')
  ft=$(echo "$last" | sed -nE 's/.* ft: ([0-9]+).*/\1/p')
  corp=$(echo "$last" | sed -nE 's/.* corp: ([0-9]+).*/\1/p')
  crashes=$(find "$work/artifacts" -type f | wc -l)
  {
    printf 'fuzz_%s: %s execs (%s/s) in %s s, cov %s ft %s, corpus %s, crashes %s\n' "$h" \
      "${execs:-?}" "${rate:-?}" "$secs" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ] || [ -z "$execs" ]; then
      echo "  fuzz_$h failed (exit $rc): $log"
      grep -E 'ERROR: |SUMMARY: |invariant failed|runtime error' "$log" | head -5 | sed 's/^/  /'
      find "$work/artifacts" -type f | sed 's/^/  input: /'
    fi
  } >"$work/result"
}

running=0
for h in "${harnesses[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$h" &
  running=$((running + 1))
done
wait

status=0
for h in "${harnesses[@]}"; do
  r="$dir/fuzz/$h/result"
  if [ -f "$r" ]; then
    cat "$r"
    grep -q "^  fuzz_$h failed" "$r" && status=1
  else
    echo "fuzz_$h: no result"
    status=1
  fi
done
exit $status
