#!/usr/bin/env bash
# The test command: installs what it needs, builds tandem twice (plain, and
# with AddressSanitizer + UndefinedBehaviorSanitizer) and runs every test in
# both builds, runs every libFuzzer harness for a bounded time
# (TANDEM_TEST_FUZZ_SECONDS each, default 30; 0 skips them; each harness
# counts as one test), then builds the Release configuration (warnings are
# errors in every one; -O3 warns where -O2 does not). Ends with one summary
# line over all of it.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/deps.sh" || exit 1
jobs="$(nproc)"
status=0
pass=0
fail=0
# Each section's start, with the minutes and seconds since the command began.
mark() { printf '== %s (at %dm%02ds)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }
for variant in plain asan; do
  dir="$root/build"
  args=()
  if [ "$variant" = asan ]; then
    dir="$root/build-asan"
    args=(-DTANDEM_SANITIZE=ON)
  fi
  mark "build ($variant)"
  mkdir -p "$dir"
  "$root/scripts/build.sh" "$dir" "${args[@]}" || { echo "build ($variant) failed"; exit 1; }
  mark "tests ($variant)"
  log="$dir/ctest.log"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 600 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && status=1
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$log" | tail -1)
  total=$(echo "$line" | sed -E 's/.* out of ([0-9]+).*/\1/')
  failed=$(echo "$line" | sed -E 's/.*tests passed, ([0-9]+) tests failed.*/\1/')
  if [ -n "$total" ] && [ -n "$failed" ]; then
    pass=$((pass + total - failed))
    fail=$((fail + failed))
  else
    status=1
  fi
done
# Bounded fuzzing: every harness from its committed corpus, under ASan+UBSan.
fuzz_secs="${TANDEM_TEST_FUZZ_SECONDS:-30}"
if [ "$fuzz_secs" -gt 0 ]; then
  mark "fuzz (${fuzz_secs} s a harness)"
  log="$root/build-fuzz.log"
  FUZZ_JOBS="$jobs" "$root/scripts/fuzz.sh" "$fuzz_secs" 2>&1 | tee "$log"
  [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
  ran=$(grep -cE '^fuzz_[a-z_]+: ' "$log")
  bad=$(grep -cE '^  fuzz_[a-z_]+ failed|^fuzz_[a-z_]+: no result' "$log")
  if [ "$ran" -eq 0 ]; then
    status=1
    fail=$((fail + 1))
  else
    pass=$((pass + ran - bad))
    fail=$((fail + bad))
  fi
fi
# Release compiles too: -O3 warns where the tested -O2 builds do not.
mark "build (Release)"
mkdir -p "$root/build-release"
"$root/scripts/build.sh" "$root/build-release" -DCMAKE_BUILD_TYPE=Release ||
  { echo "build (Release) failed"; status=1; }
mark "done"
echo
echo "all: $pass passed, $fail failed"
exit $status
