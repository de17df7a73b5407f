#!/usr/bin/env bash
# The test command: installs what it needs, builds tandem twice (plain, and
# with AddressSanitizer + UndefinedBehaviorSanitizer) and runs every test in
# both builds, runs every libFuzzer harness for a bounded time
# (TANDEM_TEST_FUZZ_SECONDS each, default 15; 0 skips them; each harness
# counts as one test), and builds the Release configuration (warnings are
# errors in every one; -O3 warns where -O2 does not). Ends with one summary
# line over all of it.
#
# The service tests leave part of the cores idle (processes that wait on
# each other): the builds after the plain one (sanitized, fuzz harnesses,
# Release) run beside the tests at the lowest priority (nice 19), in that
# order, so they take what the tests leave; each suite starts once its build
# is done.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/deps.sh" || exit 1
jobs="$(nproc)"
status=0
pass=0
fail=0
fuzz_secs="${TANDEM_TEST_FUZZ_SECONDS:-15}"
# Each section's start, with the minutes and seconds since the command began.
mark() { printf '== %s (at %dm%02ds)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }

mark "build (plain)"
mkdir -p "$root/build"
"$root/scripts/build.sh" "$root/build" || { echo "build (plain) failed"; exit 1; }

# The later builds, one after the other at the lowest priority; each leaves
# its output in <dir>.out and its exit status in <dir>.rc when it is done.
bg_build() {
  local dir="$1"
  shift
  rm -f "$dir.rc"
  mkdir -p "$dir"
  nice -n 19 "$@" >"$dir.out" 2>&1
  echo $? >"$dir.rc"
}
rm -f "$root/build-asan.rc" "$root/build-fuzz.rc" "$root/build-release.rc"
(
  bg_build "$root/build-asan" "$root/scripts/build.sh" "$root/build-asan" -DTANDEM_SANITIZE=ON
  [ "$fuzz_secs" -gt 0 ] && bg_build "$root/build-fuzz" "$root/scripts/fuzz.sh" 0
  bg_build "$root/build-release" "$root/scripts/build.sh" "$root/build-release" \
    -DCMAKE_BUILD_TYPE=Release
) &
builds=$!
# Waits for a background build; its output and 0 when it succeeded.
await() {
  while [ ! -f "$1.rc" ]; do
    kill -0 "$builds" 2>/dev/null || break
    sleep 2
  done
  local rc
  rc="$(cat "$1.rc" 2>/dev/null || echo 1)"
  [ "$rc" -eq 0 ] || cat "$1.out" 2>/dev/null
  return "$rc"
}

# ctest over one build; adds its counts to the summary.
suite() {
  local variant="$1" dir="$2"
  mark "tests ($variant)"
  local log="$dir/ctest.log"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 600 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && status=1
  local line total failed
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$log" | tail -1)
  total=$(echo "$line" | sed -E 's/.* out of ([0-9]+).*/\1/')
  failed=$(echo "$line" | sed -E 's/.*tests passed, ([0-9]+) tests failed.*/\1/')
  if [ -n "$total" ] && [ -n "$failed" ]; then
    pass=$((pass + total - failed))
    fail=$((fail + failed))
  else
    status=1
  fi
}

suite plain "$root/build"
mark "build (asan): waiting"
if await "$root/build-asan"; then
  suite asan "$root/build-asan"
else
  echo "build (asan) failed"
  status=1
fi
# Bounded fuzzing: every harness from its committed corpus, under ASan+UBSan.
if [ "$fuzz_secs" -gt 0 ]; then
  mark "fuzz (${fuzz_secs} s a harness)"
  log="$root/build-fuzz.log"
  await "$root/build-fuzz" || echo "build (fuzz) failed"
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
await "$root/build-release" || { echo "build (Release) failed"; status=1; }
wait "$builds"
mark "done"
echo
echo "all: $pass passed, $fail failed"
exit $status
