#!/usr/bin/env bash
# The main command: installs the Debian packages tandem needs, builds it into
# build/, starts tandem-gateway, tandem-verifier and tandem-drafter as separate
# processes on loopback (with the bundled demo models when models/ has them),
# waits until both replicas are registered and paired, prints `tandem status`,
# then runs until Ctrl-C / SIGTERM and stops all three cleanly.
#
#   scripts/run.sh [--no-build] [--build-dir DIR] [--port-base N] [--once]
#                  [--prompt TEXT] [--max-tokens N]
#
# Once the pair is formed it generates from a sample prompt twice, plain and
# speculative, printing the text and the request's stats.
#
# --port-base N   gateway on N (health N+1), verifier N+10 (N+11), drafter
#                 N+20 (N+21); default 7700, the services' own defaults.
# --once          stop right after the sample generation (for tests and CI).
# --prompt TEXT   the sample prompt (default: the start of a Python class).
# Logs go to BUILD_DIR/run/<service>.log.
# On a machine with an NVIDIA GPU the verifier and the drafter share GPU 0;
# they run as clients of one MPS server (started for the stack and stopped
# with it, or the one already serving), so that their kernels run at once
# instead of taking turns. TANDEM_MPS=0 leaves MPS alone.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="$root/build"
do_build=1
once=0
base=7700
prompt=$'import torch\nfrom torch import nn\n\n\nclass MLP(nn.Module):\n    def __init__(self'
max_tokens=96
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) do_build=0 ;;
    --build-dir) build_dir="$2"; shift ;;
    --port-base) base="$2"; shift ;;
    --once) once=1 ;;
    --prompt) prompt="$2"; shift ;;
    --max-tokens) max_tokens="$2"; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$do_build" = 1 ]; then
  "$root/scripts/deps.sh" || exit 1
  mkdir -p "$build_dir"
  echo "== building into $build_dir"
  "$root/scripts/build.sh" "$build_dir" || exit 1
fi

bin="$build_dir/services"
for b in gateway/tandem-gateway verifier/tandem-verifier drafter/tandem-drafter cli/tandem; do
  [ -x "$bin/$b" ] || { echo "run.sh: $bin/$b is missing; build first" >&2; exit 1; }
done
logs="$build_dir/run"
mkdir -p "$logs"
gw="127.0.0.1:$base"

# Model directories: the bundled demo pair when present.
verifier_model=()
drafter_model=()
gateway_tokenizer=()
if [ -f "$root/models/demo-target/config.json" ] && [ -f "$root/models/demo-drafter/config.json" ]; then
  verifier_model=(--model "$root/models/demo-target")
  drafter_model=(--model "$root/models/demo-drafter")
  gateway_tokenizer=(--tokenizer "$root/models/demo-target/tokenizer.json")
fi

pids=()
names=()
start() { # name, then the command
  local name="$1"; shift
  "$@" >"$logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
  echo "started $name (pid $!, log $logs/$name.log)"
}

# One MPS server for the verifier and the drafter on a GPU (see the head).
mps_dir=""
if [ "${TANDEM_MPS:-1}" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  if [ -S "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then
    echo "== MPS: the control daemon at ${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps} serves the GPU"
  else
    mps_dir="$(mktemp -d /tmp/tandem-mps.XXXXXX)"
    export CUDA_MPS_PIPE_DIRECTORY="$mps_dir" CUDA_MPS_LOG_DIRECTORY="$logs"
    if nvidia-cuda-mps-control -d; then
      echo "== MPS: control daemon started for this stack (pipe $mps_dir, log $logs/control.log)"
    else
      echo "== MPS: the control daemon did not start; the services take turns on the GPU"
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      rm -rf "$mps_dir"
      mps_dir=""
    fi
  fi
fi

stop_all() {
  local rc=0
  # Replicas first (they deregister), then the gateway.
  for i in 2 1 0; do
    [ -n "${pids[$i]:-}" ] || continue
    kill -TERM "${pids[$i]}" 2>/dev/null
    wait "${pids[$i]}"
    local r=$?
    [ $r -eq 0 ] || { echo "${names[$i]} exited with status $r (see $logs/${names[$i]}.log)"; rc=1; }
  done
  if [ -n "$mps_dir" ]; then
    echo quit | nvidia-cuda-mps-control
    rm -rf "$mps_dir"
    mps_dir=""
  fi
  return $rc
}

on_signal() {
  echo
  echo "stopping..."
  stop_all
  local rc=$?
  [ $rc -eq 0 ] && echo "stopped."
  exit $rc
}
trap on_signal INT TERM

start gateway "$bin/gateway/tandem-gateway" --listen "$gw" --health-listen "127.0.0.1:$((base + 1))" \
  "${gateway_tokenizer[@]}"
# Replicas retry until the gateway answers, but start them once it does so
# that they register at once.
for _ in $(seq 1 50); do
  "$bin/cli/tandem" status --gateway "$gw" --timeout 1s >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.1
done
start verifier "$bin/verifier/tandem-verifier" --listen "127.0.0.1:$((base + 10))" \
  --health-listen "127.0.0.1:$((base + 11))" --gateway "$gw" "${verifier_model[@]}"
start drafter "$bin/drafter/tandem-drafter" --listen "127.0.0.1:$((base + 20))" \
  --health-listen "127.0.0.1:$((base + 21))" --gateway "$gw" "${drafter_model[@]}"

# Ready when the gateway answers and reports the pair formed.
ready=0
for _ in $(seq 1 150); do
  for i in 0 1 2; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "${names[$i]} exited during start-up:"; tail -20 "$logs/${names[$i]}.log"
      pids[$i]=""
      stop_all
      exit 1
    fi
  done
  # Captured first: grep -q closing the pipe early would fail the pipeline.
  st_json="$("$bin/cli/tandem" status --gateway "$gw" --json --timeout 1s 2>/dev/null)"
  if grep -q '"compatible":[[:space:]]*true' <<<"$st_json"; then
    ready=1
    break
  fi
  sleep 0.2
done
echo
"$bin/cli/tandem" status --gateway "$gw"
if [ "$ready" != 1 ]; then
  echo "run.sh: the verifier and drafter did not form a pair within 30 s (see $logs/)"
  stop_all
  exit 1
fi
echo
gen_rc=0
if [ ${#gateway_tokenizer[@]} -gt 0 ]; then
  for mode in --no-spec --spec; do
    echo "== tandem generate $mode --max-tokens $max_tokens (prompt below, then the continuation)"
    printf '%s' "$prompt"
    "$bin/cli/tandem" generate --gateway "$gw" $mode --max-tokens "$max_tokens" "$prompt" || gen_rc=1
    echo
  done
fi
echo "tandem is running: gateway $gw. '$bin/cli/tandem generate \"...\"' and"
echo "'$bin/cli/tandem status' talk to it; Ctrl-C stops."

if [ "$once" = 1 ]; then
  stop_all || gen_rc=1
  exit $gen_rc
fi
# Wait for a signal, watching for a service that dies on its own.
while true; do
  sleep 1 &
  wait $!
  for i in 0 1 2; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      wait "${pids[$i]}"
      echo "${names[$i]} exited unexpectedly (status $?); see $logs/${names[$i]}.log"
      pids[$i]=""
      stop_all
      exit 1
    fi
  done
done
