#!/usr/bin/env bash
# gpu_smoke.sh - a short check of a build on the GPU machine, everything in
# $OUT/summary.txt as it goes (so a call cut short still brings back what
# ran): the CUDA tests, tandem doctor, the 27B shape's steps (replay, batch 1,
# 8 and 32) and plain decoding of it through the services with the capacity
# the verifier computed. Binaries from `bench/spec_bench.sh pack BUILD_DIR`.
#   bench/gpu_smoke.sh      (run tool, carry [".carry"])
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
: "${OUT:?run on the GPU machine, where OUT is set}"
C=/tmp/tandem-smoke
rm -rf "$C" && mkdir -p "$C"
xz -dc "$root/.carry/spec-bench.txz" | tar -C "$C" -xf - || exit 1
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
B="$C/bin"
mkdir -p /work && { [ -e /work/main ] || ln -s "$root" /work/main; }
S="$OUT/summary.txt"
say() { echo "$*" | tee -a "$S"; }
for t in ops model graph snapshot runtime; do
    timeout 120 "$B/cuda_test_$t" >"$C/t.log" 2>&1
    say "cuda_test_$t rc=$? $(grep -cE 'FAIL|differ' "$C/t.log") failing lines; $(tail -1 "$C/t.log")"
    grep -E 'FAIL|differ' "$C/t.log" | head -5 >>"$S"
done
printf 'backend: cuda\nmodel: %s\n' "$root/models/demo-target" >"$C/v.yaml"
timeout 30 "$B/tandem" doctor --config "$C/v.yaml" --role verifier >>"$S" 2>&1
say "doctor rc=$?"
M=/dev/shm/t27b
timeout 90 "$B/bench_make_model" --shape 27b --layout release --out "$M" | tee -a "$S"
timeout 150 "$B/bench_cuda_bench" --model "$M" --shape 27b --batch 1,8,32 --k 0,4,8 --steps 8 \
    --out argmax --strategy replay 2>&1 | grep -E 'loaded|floor|^\|' >>"$S"
GW=127.0.0.1:7700
"$B/tandem-gateway" --listen $GW --health-listen 127.0.0.1:7701 >"$C/g.log" 2>&1 &
gp=$!
sleep 0.5
"$B/tandem-verifier" --backend cuda --model "$M" --listen 127.0.0.1:7710 \
    --health-listen 127.0.0.1:7711 --gateway $GW --max-draft-tokens 8 --max-context 4096 \
    >"$C/v.log" 2>&1 &
vp=$!
for _ in $(seq 1 150); do
    "$B/tandem" status --gateway $GW --json --timeout 1s 2>/dev/null | grep -q 7710 && break
    sleep 0.2
done
grep -E 'capacity|max_sequences|gpu_memory' "$C/v.log" | cut -c1-330 >>"$S"
for c in 1 32 64; do
    say "27b plain b$c: $(timeout 60 "$B/bench_spec_client" --gateway $GW --verifier 127.0.0.1:7710 \
        --concurrency $c --requests $((c == 1 ? 3 : 64)) --tokens 64 --prompt-len 64 --mode off \
        --vocab 248320 2>&1 | tr '\n' ' ' | cut -c1-400)"
done
"$B/tandem" status --gateway $GW 2>&1 | grep -iE 'capacity|max_sequences' >>"$S"
kill $vp $gp
wait
rm -rf "$M"
