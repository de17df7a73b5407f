#!/usr/bin/env bash
# timing_overlap.sh - how much a verifier's and a drafter's timing before
# serving overlap when started together (as a colocated pair is), with the
# host's timing lock (service/timing_lock.h) and without it (each process in
# a mount namespace with a /dev/shm of its own, so neither sees the other's
# lock). Prints per start: the overlap, each side's timing, and the
# one-sequence plain step / draft pass each measured.
#   bench/timing_overlap.sh [BUILD_DIR] [STARTS]   (needs unshare for `nolock`)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
b="${1:-$root/build}" n="${2:-5}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
one() { # one lock|nolock
  local pre=() gp vp dp port
  [ "$1" = nolock ] && pre=(unshare -rm sh -c 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"')
  "$b/services/gateway/tandem-gateway" --listen 127.0.0.1:0 --health-listen 127.0.0.1:0 \
    >"$work/g.log" 2>&1 & gp=$!
  until grep -q "bound port" "$work/g.log"; do sleep 0.02; done
  port=$(grep -o "bound port [0-9]*" "$work/g.log" | awk '{print $3}')
  for r in verifier:demo-target drafter:demo-drafter; do
    "${pre[@]}" "$b/services/${r%%:*}/tandem-${r%%:*}" --listen 127.0.0.1:0 \
      --health-listen 127.0.0.1:0 --gateway "127.0.0.1:$port" --model "$root/models/${r#*:}" \
      >"$work/${r%%:*}.log" 2>&1 &
    [ "${r%%:*}" = verifier ] && vp=$! || dp=$!
  done
  local t=0
  until grep -q "pair formed" "$work/g.log" || [ $t -ge 1500 ]; do sleep 0.02; t=$((t + 1)); done
  kill "$vp" "$dp" "$gp"; wait 2>/dev/null
  [ $t -ge 1500 ] && { echo "$1: no pair formed within 30 s (logs in $work)"; return; }
  python3 - "$1" "$work" <<'PY'
import datetime, re, sys
def timed(path, pat, one):
    t = open(path, errors="replace").read()
    m = re.search(r"(\S+Z) INFO  \w+: " + pat + r" timed in (\d+) ms", t)
    v = re.search(one, t)
    e = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    return e - int(m.group(2)) / 1e3, e, v.group(1) if v else "?"
v = timed(sys.argv[2] + "/verifier.log", "steps", r"draft\): 1: ([0-9.]+) ms")
d = timed(sys.argv[2] + "/drafter.log", r"draft passes of \d+ tokens", r"a pass\): 1: ([0-9.]+) ms")
ov = max(0.0, min(v[1], d[1]) - max(v[0], d[0]))
print("%-6s overlap %4.0f ms; verifier timed %4.0f ms (1 sequence: %s ms), drafter %4.0f ms "
      "(1 sequence: %s ms)" % (sys.argv[1], ov * 1e3, (v[1] - v[0]) * 1e3, v[2],
                               (d[1] - d[0]) * 1e3, d[2]))
PY
}
for _ in $(seq "$n"); do one lock; one nolock; done
