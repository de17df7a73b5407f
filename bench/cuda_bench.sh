#!/usr/bin/env bash
# cuda_bench.sh - GPU tests, memcheck and benchmarks of the CUDA backend in
# one go on the GPU machine, from binaries built here.
#
#   bench/cuda_bench.sh pack BUILD_DIR   # here: copy binaries + their shared
#                                        # libraries into .carry/ (ignored)
#   bench/cuda_bench.sh run              # there (run tool, carry [".carry"]):
#                                        # everything, logs under $OUT
#
# The GPU machine lacks the gRPC/protobuf-c/cJSON dev packages, so the CMake
# project does not configure there; the binaries need only libcjson and the
# CUDA runtime beside glibc. Environment for `run`: SHAPES (default
# "0.8b 4b"), CONTEXTS (default "100 1000 4000": batch-1 replay steps each
# timed from that many positions; "" for none), HF=0 to skip the
# transformers counterpart, MEMCHECK=0 to skip compute-sanitizer, OPS=0 to
# skip the matmul and op benchmarks. The GPU machine has no
# flash-linear-attention; a copy of its gated delta rule kernels placed in
# .carry/pylib (package `fla`)
# makes transformers run its Triton kernels instead of the torch loops, and
# the transformers part then runs on it; FALLBACK=1 also runs it once
# without (the torch reference path). HF_TIMEOUT (default 300 s) bounds each
# transformers run: the first fla run autotunes its Triton kernels.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
case "${1:-}" in
pack)
    b="${2:?usage: cuda_bench.sh pack BUILD_DIR}"
    rm -rf .carry/bin .carry/lib
    mkdir -p .carry/bin .carry/lib
    cp "$b"/tests/cuda/cuda_test_* "$b"/bench/bench_cuda_* .carry/bin/ || exit 1
    strip --strip-debug .carry/bin/* # the device's working tree is size-limited
    # the shared-library closure minus glibc, the loader, the C++ runtime
    # (Debian 12's libstdc++ needs glibc 2.36; the GPU machine's own works),
    # cuBLAS (hundreds of MB; the GPU machine's CUDA has it) and NCCL (as big;
    # the GPU machine has its own in the system's library folder)
    ldd .carry/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcublas|libcublasLt|libnccl|ld-linux[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" .carry/lib/; done
    du -sh .carry
    ;;
run)
    : "${OUT:?run on the GPU machine, where OUT is set}"
    export LD_LIBRARY_PATH="$root/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export PYTHONUNBUFFERED=1
    B="$root/.carry/bin"
    # the tests find the fixtures at the checkout path they were built in
    mkdir -p /work && { [ -e /work/main ] || ln -s "$root" /work/main; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.log"
    for t in "$B"/cuda_test_*; do
        echo "== $(basename "$t")"
        timeout 300 "$t" 2>&1 | tee "$OUT/$(basename "$t").log" | grep -vE " ok$" | tail -20
    done
    if [ "${MEMCHECK:-1}" = 1 ]; then
        for t in ops model graph gdn; do
            [ -x "$B/cuda_test_$t" ] || continue
            echo "== memcheck $t"
            timeout 300 compute-sanitizer --tool memcheck --leak-check full "$B/cuda_test_$t" \
                >"$OUT/memcheck_$t.log" 2>&1
            echo "rc=$?"
            tail -3 "$OUT/memcheck_$t.log"
        done
    fi
    if [ "${OPS:-1}" = 1 ]; then
        echo "== matmul against cuBLAS"
        timeout 200 "$B/bench_cuda_matmul_bench" --rows 1,9,17,72 2>&1 | tee "$OUT/bench_matmul.log"
        echo "== ops"
        timeout 200 "$B/bench_cuda_ops_bench" --shape 4b 2>&1 | tee "$OUT/bench_ops.log"
        echo "== kernel boundaries"
        timeout 60 "$B/bench_cuda_ops_bench" --launch 2>&1 | tee "$OUT/bench_launch.log"
    fi
    for s in ${SHAPES:-0.8b 4b}; do
        echo "== bench $s"
        timeout 300 "$B/bench_cuda_bench" --shape "$s" --batch 1,8 --steps 20 --out logits,argmax \
            --stats 2>&1 |
            tee "$OUT/bench_$s.log"
        # decode against verify from one context (each timed step from the same positions)
        for c in ${CONTEXTS-100 1000 4000}; do
            echo "== bench $s from $c positions"
            timeout 200 "$B/bench_cuda_bench" --shape "$s" --batch 1 --steps 20 --out argmax \
                --strategy replay --context "$c" 2>&1 | tee "$OUT/bench_${s}_ctx$c.log"
        done
    done
    if [ "${HF:-1}" = 1 ]; then
        hf=(timeout "${HF_TIMEOUT:-300}" python3 bench/cuda_bench_hf.py
            --shapes "$(echo ${SHAPES:-0.8b 4b} | tr ' ' ,)" --batch "1,8" --steps 10)
        if [ -d "$root/.carry/pylib" ]; then
            echo "== transformers (fla from .carry/pylib)"
            PYTHONPATH="$root/.carry/pylib${PYTHONPATH:+:$PYTHONPATH}" "${hf[@]}" --require-fla 2>&1 |
                tee "$OUT/bench_hf.log" | grep -v "falling back"
        fi
        if [ ! -d "$root/.carry/pylib" ] || [ "${FALLBACK:-0}" = 1 ]; then
            echo "== transformers (torch fallback)"
            "${hf[@]}" 2>&1 | tee "$OUT/bench_hf_fallback.log" | grep -v "falling back"
        fi
    fi
    ;;
*)
    echo "usage: bench/cuda_bench.sh pack BUILD_DIR | run" >&2
    exit 2
    ;;
esac
