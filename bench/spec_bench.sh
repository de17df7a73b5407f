#!/usr/bin/env bash
# spec_bench.sh - speculative decoding through the real services on the GPU
# machine, in one go: gateway, verifier and drafter as processes on the CUDA
# backend, driven over gRPC by bench_spec_client.
#
#   bench/spec_bench.sh pack BUILD_DIR   # here: services, CLI, bench tools and
#                                        # their shared libraries into .carry/
#   bench/spec_bench.sh run              # there (run tool, carry [".carry"]):
#                                        # everything below, summary and logs under $OUT
#
# What `run` measures (each line of $OUT/summary.txt is one bench_spec_client
# run: tokens/s, acceptance, and the verifier's round timeline over it):
#  - a 4B-shaped target (random bf16 weights) with a 0.8B-shaped drafter:
#    plain decoding at batch 1, 8 and 32 (recorded: the oracle's truth);
#    the real drafter (random weights: it proposes almost nothing the target
#    accepts, so these rows are the cost of trying) adaptive at 1, 8, 32 and
#    fixed blocks 2, 4, 8 at batch 1; the controlled-acceptance drafter
#    (bench_drafter_oracle) at a = 0.6, 0.8, 0.9, 1.0, block 4, with and
#    without run-ahead, adaptive at a = 0.8, blocks 2 and 8 at a = 0.8, and
#    a = 0.8 block 4 at batch 8 and 32;
#  - the demo pair (models/demo-*): plain, then DEMO_PAIRS times adaptive and
#    plain again, and fixed block 4, at batch 1, 8 and 32; each adaptive load
#    against the plain loads beside it, and the median of those ratios;
#  - the engine's own steps (bench_cuda_bench: 4B verify k = 0, 2, 4, 8 and
#    0.8B decode and draft chains after one lead row and after two, the round
#    after a block accepted whole; with DRAFT_VOCABS, again each after a verify
#    step of the 4B target's, as the services run it), the upper bound of a round (the 4b part
#    prints each a = 1.0 block 4 load against it), and a request's
#    sequence created, prefilled (4B: 64 and 512 tokens, with prompt
#    prefill's cuBLAS matmuls off and on; 0.8B: 3 and 64) and destroyed.
# PARTS may add "demoahead" (the demo pair at controlled acceptance, block
# 4 at batch 1, run-ahead off and on: what drafting ahead of verdicts buys;
# on the CPU with VCORES and DCORES, the cores of the verifier and of the
# drafter, as taskset lists; on two GPUs with VGPU and DGPU), "27b" (the
# Qwen3.6-27B shape in the release layout: engine steps under each
# strategy, the verifier's capacity, plain decoding through the services),
# "drain" (32 sequences of the 4B shape moved to a second
# verifier by SIGTERM: time to drained, bytes and time a move), "doctor"
# (tandem doctor on this machine), "sampled" (the 4B target's plain decoding
# of sampled requests against greedy at batch 1, 8 and 32, and speculated
# by the 0.8B-shaped drafter at fixed block 4; SAMPLING sets
# temperature,top_p,top_k, default 1.0,0.95,0), DRAFT_VOCABS (the 4b part's drafter, and
# the engine part's 0.8B draft rounds, with draft vocabularies of the N lowest
# ids too; 0: the whole vocabulary), "mtp" (the 4B shape with a random MTP head
# drafting for it: a = 0.6, 0.8, 1.0 at block 3, blocks 2 and 4 and batch 8
# at a = 0.8, the feature stream's counters; the real head greedy and sampled
# at fixed block 3; MTP_HEADBENCH=0 skips the head's own steps), "demomtp" (the demo target's
# MTP head against plain decoding), "nopoll" (a = 0.8 and 1.0 with busy polling off), "rpc" (bench_rpc_bench: the transport's own round trip, the
# exchange's floor; bench_exchange_bench: the exchange's transport by part, on gRPC and on
# the exchange lane, threaded as the
# services thread it), "share" (the 4B target and the 0.8B drafter on one GPU under MPS,
# a = 0.8 and 1.0 at fixed block 4, run-ahead off and on, with the two held to shares of the
# multiprocessors: SHARES, VERIFIER:DRAFTER percentages, default "100:100 50:50 65:35") and
# "cudatests" (the CUDA tests).
# Environment: PARTS (default "engine 4b demo"), REQ1 (requests at batch 1,
# default 12), TOKENS (default 128), PROMPT_LEN (default 64), ACCEPTS (default "0.6 0.8 0.9 1.0"),
# BACKEND (default cuda; cpu tries the script out on a machine without a GPU),
# DRAIN_MODEL and DRAIN_TOKENS (the drain part's model and request length),
# MTP_SHAPE (the mtp part's target shape, default 4b), MTP_ACCEPTS and
# VFLAGS (more verifier flags for the 4b and demo parts), DRAFTER_FLAGS (more
# flags for every drafter, e.g. "--log-level debug": its sequences' model state
# created, prefilled and freed, timed), DEMO_SCALE (the demo
# part's requests a load, as a multiple of its batch; default 4), DEMO_PAIRS (its
# adaptive loads at each batch, each followed by a plain one; default 1), DEMO_FIXED_FIRST (1:
# its fixed block 4 load also before them, so that they start from what it measured),
# DEMO_PROMPTS (text: prompts cut from tools/*.py and tokenized; default random ids), MTP_TRANSPORTS (default "shm grpc"), MTP_VOCABS (draft vocabularies of the
# N lowest ids, default "0": the whole vocabulary), MTP_WEIGHTS (the MTP head's
# weights, default "checkpoint"; "checkpoint fp8" runs the head's own steps and
# its oracle loads with both), MTP_VFLAGS and MTP_DFLAGS
# (more verifier and drafter flags for the mtp part), REAL (0: the 4b part skips the real
# drafter's rows), DRAFT_WEIGHTS (the 4b part's drafter weights, default
# "checkpoint"; "checkpoint fp8" runs its oracle loads with both, the engine
# part's draft rows too), RUNAHEAD (default "off on"; "auto": the verifier decides whether
# the drafter drafts ahead, as in serving; "on" makes it), MPS (1: every process of the
# run joins one CUDA MPS server started for it, so the verifier's and the
# drafter's kernels share the GPU at once instead of taking turns as two
# contexts), TANDEM_EXCHANGE_TRANSPORT (every service's exchange_transport:
# the default auto puts a Draft stream's messages on the shared-memory lane;
# grpc keeps them on the stream; the client prints exchange_streams) and TAG (names this run's summary-TAG.txt and logs-TAG.txz, so
# that several runs of one call come back side by side) and PACK (the packed
# binaries' archive under .carry/, without .txz; default spec-bench: one
# call may compare two trees packed and renamed beside each other).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
case "${1:-}" in
pack)
    b="${2:?usage: spec_bench.sh pack BUILD_DIR}"
    rm -rf .carry/bin .carry/lib
    mkdir -p .carry/bin .carry/lib
    cp "$b"/services/gateway/tandem-gateway "$b"/services/verifier/tandem-verifier \
        "$b"/services/drafter/tandem-drafter "$b"/services/cli/tandem \
        "$b"/bench/bench_spec_client "$b"/bench/bench_make_model "$b"/bench/bench_drafter_oracle \
        "$b"/bench/bench_cuda_bench "$b"/bench/bench_rpc_bench "$b"/bench/bench_exchange_bench \
        "$b"/bench/bench_cuda_matmul_bench \
        "$b"/bench/bench_snapshot_bench "$b"/bench/bench_mtp_bench .carry/bin/ || exit 1
    cp "$b"/tests/cuda/cuda_test_* .carry/bin/ 2>/dev/null
    strip --strip-debug .carry/bin/*
    # the shared-library closure minus glibc, the loader, the C++ runtime,
    # cuBLAS and NCCL (bench/cuda_bench.sh says why)
    ldd .carry/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcublas|libcublasLt|libnccl|ld-linux[^/]*)\.so' |
        while read -r lib; do cp -L "$lib" .carry/lib/; done
    # compressed: the device's working tree is size-limited (the CUDA code in
    # every binary compresses about 7:1)
    tar -C .carry -cf - bin lib | xz -6 -T0 >.carry/spec-bench.txz
    rm -rf .carry/bin .carry/lib
    du -sh .carry/spec-bench.txz
    ;;
run)
    : "${OUT:?run on the GPU machine, where OUT is set}"
    C=/tmp/tandem-spec-bench-bin
    rm -rf "$C"
    mkdir -p "$C"
    xz -dc "$root/.carry/${PACK:-spec-bench}.txz" | tar -C "$C" -xf - || exit 1
    export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    B="$C/bin"
    mkdir -p /work && { [ -e /work/main ] || ln -s "$root" /work/main; }
    W=/dev/shm/tandem-spec-bench
    rm -rf "$W"
    mkdir -p "$W"
    # Logs gather outside $OUT and come back as one archive at the end, so a
    # call cut short still brings back summary.txt (the run tool returns at
    # most 8 files).
    LOGS=/tmp/tandem-spec-bench-logs
    rm -rf "$LOGS"
    mkdir -p "$LOGS"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$LOGS/env.log"
    SUM="$OUT/summary${TAG:+-$TAG}.txt"
    : >"$SUM"
    mps_quit() { :; }
    if [ "${MPS:-0}" = 1 ]; then
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/tandem-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/tandem-mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        if nvidia-cuda-mps-control -d 2>&1 | tee -a "$SUM"; then
            echo "MPS: control daemon started" | tee -a "$SUM"
            mps_quit() { echo quit | nvidia-cuda-mps-control; sleep 1; cp -r "$CUDA_MPS_LOG_DIRECTORY" "$LOGS/mps"; }
        else
            echo "MPS: no control daemon; the run goes on without it" | tee -a "$SUM"
            unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
        fi
    fi
    REQ1="${REQ1:-12}"
    TOKENS="${TOKENS:-128}"
    GW=127.0.0.1:7700
    VER=127.0.0.1:7710
    port=7720 # the next drafter's port
    DFLAGS="" # more drafter flags
    vpid="" dpid="" gpid=""
    stop() { # pid... (in order: drafter, verifier, gateway deregister cleanly)
        for p in "$@"; do [ -n "$p" ] && { kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; }; done
    }
    cleanup() {
        stop "$dpid" "$vpid" "$gpid"
        mps_quit
    }
    trap cleanup EXIT
    # one line per run on stdout too, shortened
    short() { sed -E 's/ (request_tps_p50|spec_round_share|requests|failed|wall_s|admit_us|send_us|draft_token_p99_us|step_p99_us)=[^ ]*//g'; }
    # Waits until the gateway lists the replica at addr (a drafter: paired).
    wait_ready() { # pid addr name
        for _ in $(seq 1 300); do
            kill -0 "$1" 2>/dev/null || { echo "spec_bench: $3 exited" | tee -a "$SUM"; return 1; }
            st="$("$B/tandem" status --gateway "$GW" --json --timeout 1s 2>/dev/null)"
            if grep -q "\"address\":[[:space:]]*\"$2\"" <<<"$st"; then
                [ "$2" = "$VER" ] && return 0
                grep -q '"compatible":[[:space:]]*true' <<<"$st" && return 0
            fi
            sleep 0.2
        done
        echo "spec_bench: $2 not ready after 60 s" | tee -a "$SUM"
        return 1
    }
    start_stack() { # tag target_dir [verifier flags...]
        local tag="$1" dir="$2"
        shift 2
        stop "$dpid" "$vpid" "$gpid"
        dpid="" vpid=""
        "$B/tandem-gateway" --listen "$GW" --health-listen 127.0.0.1:7701 \
            >"$LOGS/gateway-$tag.log" 2>&1 &
        gpid=$!
        sleep 0.5
        $VPIN "$B/tandem-verifier" --backend "${BACKEND:-cuda}" --model "$dir" --listen "$VER" \
            --health-listen 127.0.0.1:7711 --gateway "$GW" --max-sequences 40 \
            --max-draft-tokens 8 "$@" >"$LOGS/verifier-$tag.log" 2>&1 &
        vpid=$!
        wait_ready "$vpid" "$VER" "verifier ($tag)"
    }
    # Replaces the drafter: start_drafter tag binary model run_ahead block [env...]
    start_drafter() {
        local tag="$1" bin="$2" model="$3" ra="$4" blk="$5"
        shift 5
        stop "$dpid"
        dpid=""
        sleep 0.3
        port=$((port + 2))
        env "$@" $DPIN "$B/$bin" --backend "${BACKEND:-cuda}" --model "$model" --listen "127.0.0.1:$port" \
            --health-listen "127.0.0.1:$((port + 1))" --gateway "$GW" --max-sequences 40 \
            --run-ahead "$ra" --draft-block-size "$blk" $DFLAGS ${DRAFTER_FLAGS:-} \
            >"$LOGS/drafter-$tag.log" 2>&1 &
        dpid=$!
        wait_ready "$dpid" "127.0.0.1:$port" "drafter $tag"
    }
    # load tag concurrency requests mode [client args...]
    load() {
        local tag="$1" c="$2" n="$3" mode="$4"
        shift 4
        local line
        local dr=""
        [ -n "$dpid" ] && dr="--drafter 127.0.0.1:$port"
        line="$(timeout 300 "$B/bench_spec_client" --gateway "$GW" --verifier "$VER" $dr \
            --concurrency "$c" --requests "$n" --tokens "$TOKENS" --prompt-len "${PROMPT_LEN:-64}" --mode "$mode" \
            "$@" 2>>"$LOGS/client.log" | tr '\n' ' ')"
        printf '%-34s %s\n' "$tag" "$line" >>"$SUM"
        printf '%-30s %s\n' "$tag" "$line" | short
    }
    # A drafter's draft vocabulary of the N lowest ids (draft_vocab): its
    # flag in DFLAGS and " vN" in vt for the loads' tags; 0 or empty: the
    # whole vocabulary, no flag.
    draft_vocab() { # N
        DFLAGS="" vt=""
        [ -n "$1" ] && [ "$1" != 0 ] || return 0
        seq 0 $(($1 - 1)) >"$W/dvocab-$1.txt"
        DFLAGS="--draft-vocab $W/dvocab-$1.txt" vt=" v$1"
    }
    # The demo part's adaptive loads at batch $1 against the plain loads on
    # their two sides: each ratio, and their median.
    demo_verdict() {
        grep -E "^demo (plain|adaptive) b$1( |$)" "$SUM" | grep -v "fixed" |
            sed -E 's/^demo (plain|adaptive) .*tokens_per_s=([0-9.]+).*/\1 \2/' |
            awk -v c="$1" '{ kind[NR] = $1; tps[NR] = $2 }
                END {
                    n = 0
                    for (i = 2; i < NR; i++)
                        if (kind[i] == "adaptive" && kind[i - 1] == "plain" && kind[i + 1] == "plain")
                            r[++n] = tps[i] / ((tps[i - 1] + tps[i + 1]) / 2)
                    if (!n) exit
                    line = ""
                    for (i = 1; i <= n; i++) line = line sprintf(" %.3f", r[i])
                    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
                    m = n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
                    printf "demo adaptive b%d x plain beside it: median %.3f of%s\n", c, m, line
                }' | tee -a "$SUM"
    }
    # Each a = 1.0, block 4 load of the 4b part against the engine's bound
    # of its round, where this call's engine part timed it: the drafter's
    # chain of 4 after two lead rows (the block before was accepted whole:
    # its last draft and the bonus token) with its commit, plus the 4B
    # verify step of 4 drafts, for 5 tokens. Two readings: the load's
    # tokens/s (its requests' prompts prefilled too, which the bound has
    # not) and its mean round without the prompts' prefill share.
    bound_verdict() {
        local v4 line tag nv elog chain after
        [ -f "$LOGS/engine_4b.log" ] || return 0
        v4="$(grep -E '\| 4b \| 1 \| verify k=4 \|' "$LOGS/engine_4b.log" | tail -1 |
            awk -F'|' '{ gsub(/ /, "", $7); print $7 }')"
        [ -n "$v4" ] || return 0
        grep -E '^a=1\.0 fixed 4 ahead=[a-z]+( v[0-9]+)?( fp8)? b1 ' "$SUM" | while read -r line; do
            tag="$(sed -E 's/ +tokens_per_s=.*//' <<<"$line")"
            nv="$(sed -nE 's/.* v([0-9]+)( fp8)? b1$/\1/p' <<<"$tag")"
            wl="" && grep -q ' fp8 b1$' <<<"$tag" && wl="_fp8"
            elog="$LOGS/engine_0.8b${nv:+_v$nv}$wl.log"
            [ -f "$elog" ] || continue
            chain="$(grep -E '\| draft k=4 after 2 \+ commit \|' "$elog" | tail -1 |
                awk -F'|' '{ split($7, a, " "); print a[1] }')"
            [ -n "$chain" ] || continue
            # the same chain timed after a verify step of the 4B target's
            # (--between): the drafter's part as it starts in the services
            after="$(grep -E '\| draft k=4 after 2, after a verify \+ commit \|' "$elog" | tail -1 |
                awk -F'|' '{ split($7, a, " "); print a[1] }')"
            awk -v tag="$tag" -v c="$chain" -v a="${after:-0}" -v v="$v4" -v line="$line" 'BEGIN {
                n = split(line, f, " ")
                for (i = 1; i <= n; i++) { split(f[i], kv, "="); val[kv[1]] = kv[2] }
                b = 5 / (c + v) * 1e3
                printf "%s x engine bound (chain of 4 after 2 lead rows %.3f + verify k=4 %.3f = %.3f ms: %.1f tok/s): tokens/s %.3f; rounds without the prompts prefill %.3f (round %.0f us, prefill share %.0f)\n",
                    tag, c, v, c + v, b, val["tokens_per_s"] / b,
                    (c + v) * 1e3 / (val["round_us"] - val["prefill_us"]), val["round_us"], val["prefill_us"]
                if (a > 0)
                    printf "%s x the bound with the chain timed after a verify step (%.3f ms: %.1f tok/s): tokens/s %.3f; rounds without the prompts prefill %.3f\n",
                        tag, a, 5 / (a + v) * 1e3, val["tokens_per_s"] / (5 / (a + v) * 1e3),
                        (a + v) * 1e3 / (val["round_us"] - val["prefill_us"])
            }' | tee -a "$SUM"
        done
    }
    # VCORES, DCORES: the cores the verifier and the drafter run on (taskset
    # lists); on the CPU backend, a drafter on cores of its own is what a
    # drafter on its own GPU is on the GPU machine
    # VGPU, DGPU: the GPUs (CUDA_VISIBLE_DEVICES) of the verifier and of
    # the drafter, on a machine with two: the drafter on its own device, where
    # run-ahead is meant to pay
    VPIN="${VCORES:+taskset -c $VCORES}${VGPU:+ env CUDA_VISIBLE_DEVICES=$VGPU}"
    DPIN="${DCORES:+taskset -c $DCORES}${DGPU:+ env CUDA_VISIBLE_DEVICES=$DGPU}"
    # ahead=on: the oracle drafter hides its GPU and its passes' times, so
    # that the verifier, which could tell neither that it shares its GPU nor
    # whether drafting ahead pays, always asks for it (what drafting ahead
    # does where the verifier would not ask); ahead=auto: the drafter hides
    # nothing and the verifier decides, as in serving
    HIDE=TANDEM_BENCH_HIDE_DEVICE=1
    PARTS="${PARTS:-engine 4b demo}"
    for part in $PARTS; do
        case "$part" in
        engine)
            echo "== engine upper bound" | tee -a "$SUM"
            timeout 300 "$B/bench_cuda_bench" --shape 4b --batch 1 --k 0,2,4,8 --steps 20 \
                --prefill 64,512 --variants "TANDEM_CUDA_BULK=0;TANDEM_CUDA_BULK=1" \
                --out argmax --strategy replay --dir "$W/engine" 2>&1 |
                tee "$LOGS/engine_4b.log" | tee -a "$SUM" | tail -20
            timeout 300 "$B/bench_cuda_bench" --shape 0.8b --batch 1 --k 0,4 --draft 2,4 \
                --draft-lead 1,2 --prefill 3,64 --steps 20 --out argmax --strategy replay --dir "$W/engine" 2>&1 |
                tee "$LOGS/engine_0.8b.log" | tee -a "$SUM" | tail -14
            for nv in ${DRAFT_VOCABS:-}; do
                [ "$nv" = 0 ] && continue
                # the 4B target's verify before each chain (--between): the
                # chain as the services run it, after the verifier's step
                [ -d "$W/t4b" ] || "$B/bench_make_model" --shape 4b --out "$W/t4b" >/dev/null
                for wt in ${DRAFT_WEIGHTS:-checkpoint}; do
                    wl="" && [ "$wt" = checkpoint ] || wl="_$wt"
                    timeout 300 "$B/bench_cuda_bench" --shape 0.8b --batch 1 --k 0 --draft 2,4 \
                        --draft-lead 1,2 --draft-vocab "$nv" --weights "$wt" --between "$W/t4b" --steps 20 --out argmax --strategy replay --dir "$W/engine" 2>&1 |
                        tee "$LOGS/engine_0.8b_v$nv$wl.log" | tee -a "$SUM" | tail -8
                done
            done
            ;;
        4b)
            echo "== 4B target, 0.8B drafter" | tee -a "$SUM"
            [ -d "$W/t4b" ] || "$B/bench_make_model" --shape 4b --out "$W/t4b" | tee -a "$SUM"
            "$B/bench_make_model" --shape 0.8b --out "$W/d08" | tee -a "$SUM"
            start_stack 4b "$W/t4b" --max-context 8192 ${VFLAGS:-} || continue
            V="--vocab 248320"
            load "plain b1" 1 "$REQ1" off $V
            load "plain b8" 8 32 off $V
            load "plain b32" 32 64 off $V --record "$W/truth.txt"
            load "plain b1 (again)" 1 "$REQ1" off $V --check "$W/truth.txt"
            [ "${REAL:-1}" = 1 ] && start_drafter real tandem-drafter "$W/d08" on 8 &&
                {
                    load "real adaptive b1" 1 "$REQ1" auto $V --check "$W/truth.txt"
                    load "real adaptive b8" 8 32 auto $V
                    load "real adaptive b32" 32 64 auto $V
                    for k in 2 4 8; do
                        load "real fixed $k b1" 1 "$REQ1" on $V --block $k --fixed
                    done
                }
            # DRAFT_VOCABS: the drafter's draft vocabularies (draft_vocab) of the
            # N lowest ids; 0: the whole vocabulary.
            for nv in ${DRAFT_VOCABS:-0}; do
            for wt in ${DRAFT_WEIGHTS:-checkpoint}; do
            draft_vocab "$nv"
            [ "$wt" = checkpoint ] || DFLAGS="$DFLAGS --weights $wt" vt="$vt $wt"
            for a in ${ACCEPTS:-0.6 0.8 0.9 1.0}; do
                for ra in ${RUNAHEAD:-off on}; do
                    start_drafter "oracle-$a-$ra-$nv" bench_drafter_oracle "$W/d08" "$ra" 8 \
                        TANDEM_BENCH_ORACLE="$W/truth.txt" TANDEM_BENCH_ACCEPT="$a" \
                        $([ "$ra" = on ] && echo $HIDE) || continue
                    load "a=$a fixed 4 ahead=$ra$vt b1" 1 "$REQ1" on $V --block 4 --fixed \
                        --check "$W/truth.txt"
                    if [ "$a" = 0.8 ]; then
                        load "a=$a adaptive ahead=$ra$vt b1" 1 "$REQ1" auto $V --check "$W/truth.txt"
                        for k in 2 8; do
                            load "a=$a fixed $k ahead=$ra$vt b1" 1 "$REQ1" on $V --block $k --fixed
                        done
                        [ "$nv" = 0 ] || continue
                        load "a=$a fixed 4 ahead=$ra b8" 8 32 on $V --block 4 --fixed
                        load "a=$a fixed 4 ahead=$ra b32" 32 64 on $V --block 4 --fixed
                        load "a=$a adaptive ahead=$ra b32" 32 64 auto $V
                    fi
                done
            done
            done
            done
            DFLAGS=""
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            bound_verdict
            ;;
        mtp)
            # The 4B shape with a random MTP head (bench_make_model --mtp):
            # the drafter is the head itself (drafter_kind mtp), fed the
            # verifier's hidden states; at controlled acceptance through the
            # oracle build, which still runs the head for every draft.
            echo "== 4B target with an MTP head" | tee -a "$SUM"
            "$B/bench_make_model" --shape "${MTP_SHAPE:-4b}" --mtp --out "$W/t4bm" | tee -a "$SUM"
            # the head's own steps first (prime 3 rows, draft 3), graphs on and off
            # the whole vocabulary, then each of MTP_VOCABS once
            vl="$(echo 0 ${MTP_VOCABS:-0} | tr ' ' '\n' | awk '!seen[$0]++' | paste -sd,)"
            for wt in ${MTP_WEIGHTS:-checkpoint}; do
            for g in on off; do
                [ "${MTP_HEADBENCH:-1}" = 1 ] || break
                timeout 120 "$B/bench_mtp_bench" --model "$W/t4bm" --graphs $g --backend \
                    "${BACKEND:-cuda}" --vocab "$vl" --weights "$wt" 2>&1 |
                    sed 's/^/mtp head: /' | tee -a "$SUM"
            done
            done
            start_stack mtp "$W/t4bm" --max-context 8192 ${MTP_VFLAGS:-} || continue
            V="--vocab $(grep -o '"vocab_size": *[0-9]*' "$W/t4bm/config.json" | head -1 | grep -o '[0-9]*$')"
            load "mtp: plain b1" 1 "$REQ1" off $V --record "$W/truth-m.txt"
            load "mtp: plain b8" 8 32 off $V --record "$W/truth-m8.txt"
            # the oracle looks runs up by their prompt; --check goes by request
            cat "$W/truth-m.txt" "$W/truth-m8.txt" >"$W/truth-mall.txt"
            DFLAGS="--drafter-kind mtp"
            # the real head adaptive, then at fixed block 3 greedy and sampled
            # (SAMPLING): what drawing a sampled request's drafts costs the head
            start_drafter mtp-real tandem-drafter "$W/t4bm" off 8 &&
                load "mtp: real head adaptive b1" 1 "$REQ1" auto $V --check "$W/truth-m.txt" &&
                load "mtp: real head fixed 3 b1" 1 "$REQ1" on $V --block 3 --fixed &&
                load "mtp: real head fixed 3 sampled b1" 1 "$REQ1" on $V --block 3 --fixed \
                    --sampling "${SAMPLING:-1.0,0.95,0}"
            # how the pair shares the GPU, as status and doctor see it
            "$B/tandem" status --gateway "$GW" >"$LOGS/status-mtp.log" 2>&1
            grep -E 'GPU' "$LOGS/status-mtp.log" | sed 's/^ */mtp: status: /' | tee -a "$SUM"
            "$B/tandem" doctor --gateway "$GW" 2>&1 | grep -E 'GPU|MPS' | sed 's/^/mtp: doctor: /' |
                tee -a "$SUM"
            # MTP_VOCABS: draft vocabularies (draft_vocab) of the N lowest ids
            # (a byte-level BPE's merge order, roughly by frequency); 0: all.
            # MTP_WEIGHTS: the head's weights (weights), each a run of its own.
            for nv in ${MTP_VOCABS:-0}; do
            for wt in ${MTP_WEIGHTS:-checkpoint}; do
                vflag="" vt=""
                if [ "$nv" != 0 ]; then
                    seq 0 $((nv - 1)) >"$W/vocab-$nv.txt"
                    vflag="--draft-vocab $W/vocab-$nv.txt" vt=" v$nv"
                fi
                [ "$wt" = checkpoint ] || vflag="$vflag --weights $wt" vt="$vt $wt"
            for a in ${MTP_ACCEPTS:-0.6 0.8 1.0}; do
                # the feature stream through shared memory (colocated: what
                # auto picks on one host) and through gRPC messages
                for tr in ${MTP_TRANSPORTS:-shm grpc}; do
                    DFLAGS="--drafter-kind mtp --feature-transport $tr $vflag ${MTP_DFLAGS:-}"
                    start_drafter "mtp-$a-$tr-$nv-$wt" bench_drafter_oracle "$W/t4bm" off 8 \
                        TANDEM_BENCH_ORACLE="$W/truth-mall.txt" TANDEM_BENCH_ACCEPT="$a" || continue
                    load "mtp: a=$a fixed 3 $tr$vt b1" 1 "$REQ1" on $V --block 3 --fixed \
                        --check "$W/truth-m.txt"
                    # the drafter's side of those rounds (metrics above its health port): a block's time
                    # against its draft pass's (the head's own work)
                    curl -s "127.0.0.1:$((port + 2))/metrics" |
                        grep -E '^tandem_drafter_(block|pass|block_write)_duration_seconds_(sum|count)' |
                        tr '\n' ' ' | sed "s/^/mtp: drafter a=$a $tr$vt b1: /; s/\$/\n/" |
                        tee -a "$SUM"
                    [ "$a" = 0.8 ] && [ "$tr" = shm ] || continue
                    for k in 2 4; do
                        load "mtp: a=$a fixed $k $tr$vt b1" 1 "$REQ1" on $V --block $k --fixed
                    done
                    load "mtp: a=$a adaptive $tr$vt b1" 1 "$REQ1" auto $V --check "$W/truth-m.txt"
                    load "mtp: a=$a fixed 3 $tr$vt b8" 8 32 on $V --block 3 --fixed \
                        --check "$W/truth-m8.txt"
                done
            done
            done
            done
            curl -s 127.0.0.1:7712/metrics | grep -E '^tandem_spec_decode_feature' |
                sed 's/^/mtp: /' | tee -a "$SUM"
            grep -E "MPS server|shares this verifier's GPU" "$LOGS/verifier-mtp.log" "$LOGS"/drafter-mtp-*.log |
                head -4 | sed 's/^/mtp: log: /' | tee -a "$SUM"
            DFLAGS=""
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        demomtp)
            # The demo target's own MTP head against the demo drafter.
            echo "== demo target, its MTP head" | tee -a "$SUM"
            dv="$(grep -o '"vocab_size": *[0-9]*' models/demo-target/config.json | grep -o '[0-9]*$')"
            start_stack demomtp "$root/models/demo-target" || continue
            DFLAGS="--drafter-kind mtp"
            start_drafter demomtp tandem-drafter "$root/models/demo-target" off 8 || {
                DFLAGS=""
                continue
            }
            DFLAGS=""
            for c in 1 8 32; do
                n=$((c == 1 ? 4 * REQ1 : 4 * c))
                load "demo mtp: plain b$c" "$c" "$n" off --vocab "$dv" --record "$W/demom-b$c.txt"
                load "demo mtp: adaptive b$c" "$c" "$n" auto --vocab "$dv" \
                    --check "$W/demom-b$c.txt"
                for k in 2 3 4; do
                    load "demo mtp: fixed $k b$c" "$c" "$n" on --vocab "$dv" --block $k --fixed \
                        --check "$W/demom-b$c.txt"
                done
            done
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        sampled)
            # plain decoding of sampled requests (SAMPLING: temperature,top_p,top_k;
            # default 1.0,0.95,0) beside greedy: what a sampled row costs the
            # verifier a round (its distribution and its draw)
            echo "== 4B target, sampled (${SAMPLING:-1.0,0.95,0}) against greedy" | tee -a "$SUM"
            [ -d "$W/t4b" ] || "$B/bench_make_model" --shape 4b --out "$W/t4b" >/dev/null
            start_stack sampled "$W/t4b" --max-context 8192 ${VFLAGS:-} || continue
            V="--vocab 248320"
            for c in 1 8 32; do
                n=$((c == 1 ? REQ1 : 2 * c))
                load "greedy plain b$c" "$c" "$n" off $V
                load "sampled plain b$c" "$c" "$n" off $V --sampling "${SAMPLING:-1.0,0.95,0}"
            done
            # the same sampled requests speculated, fixed block 4, by the
            # 0.8B-shaped drafter (its first DRAFT_VOCABS vocabulary): what
            # drawing each draft costs the drafter
            [ -d "$W/d08" ] || "$B/bench_make_model" --shape 0.8b --out "$W/d08" >/dev/null
            draft_vocab ${DRAFT_VOCABS:-0} # the first entry
            start_drafter sampled tandem-drafter "$W/d08" off 8 &&
                for c in 1 8 32; do
                    n=$((c == 1 ? REQ1 : 2 * c))
                    load "sampled fixed 4 b$c" "$c" "$n" on $V --block 4 --fixed \
                        --sampling "${SAMPLING:-1.0,0.95,0}"
                done
            DFLAGS=""
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        nopoll)
            # the exchange without busy polling (busy_poll 0ms on both sides)
            echo "== 4B target, 0.8B drafter, busy_poll 0ms" | tee -a "$SUM"
            [ -d "$W/t4b" ] || "$B/bench_make_model" --shape 4b --out "$W/t4b" >/dev/null
            [ -d "$W/d08" ] || "$B/bench_make_model" --shape 0.8b --out "$W/d08" >/dev/null
            start_stack nopoll "$W/t4b" --busy-poll 0ms --max-context 8192 || continue
            V="--vocab 248320"
            [ -f "$W/truth.txt" ] || load "plain b1" 1 "$REQ1" off $V --record "$W/truth.txt"
            DFLAGS="--busy-poll 0ms"
            for a in 0.8 1.0; do
                start_drafter "nopoll-$a" bench_drafter_oracle "$W/d08" off 8 \
                    TANDEM_BENCH_ORACLE="$W/truth.txt" TANDEM_BENCH_ACCEPT="$a" || continue
                load "a=$a fixed 4 nopoll b1" 1 "$REQ1" on $V --block 4 --fixed
            done
            DFLAGS=""
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        demo)
            echo "== demo pair" | tee -a "$SUM"
            dv="$(grep -o '"vocab_size": *[0-9]*' models/demo-target/config.json | grep -o '[0-9]*$')"
            start_stack demo "$root/models/demo-target" ${VFLAGS:-} || continue
            start_drafter demo tandem-drafter "$root/models/demo-drafter" on 8 || continue
            # DEMO_PROMPTS=text: prompts cut from this repository's Python
            # sources and tokenized (the demo pair was trained on Python),
            # instead of random ids, after which the two models rarely agree
            dp=""
            if [ "${DEMO_PROMPTS:-random}" = text ]; then
                python3 - "$root" "$B/tandem" "$root/models/demo-target/tokenizer.json" \
                    >"$W/demo-prompts.txt" <<'PY' || continue
import glob, os, subprocess, sys
root, cli, tok = sys.argv[1:4]
text = "".join(open(p, encoding="utf-8").read()
               for p in sorted(glob.glob(os.path.join(root, "tools", "*.py"))))
step = max(1, (len(text) - 400) // 64)
for i in range(64):
    cut = text[i * step:i * step + 160 + (i * 37) % 160]
    ids = subprocess.run([cli, "tokenize", "--tokenizer", tok, "-"], input=cut,
                         capture_output=True, text=True, check=True).stdout.split()
    print(" ".join(ids))
PY
                dp="--prompts $W/demo-prompts.txt"
                echo "demo prompts: 64 cuts of tools/*.py, $(wc -w <"$W/demo-prompts.txt") tokens" |
                    tee -a "$SUM"
            fi
            # the demo pair is fast: more requests, for steadier numbers
            # (DEMO_SCALE times the batch, default 4)
            ds="${DEMO_SCALE:-4}"
            for c in 1 8 32; do
                n=$((c == 1 ? ds * REQ1 : ds * c))
                # plain on both sides of each adaptive load: the loads are short
                # (0.3 s at b32, DEMO_SCALE 4) and drift by a few % between runs,
                # about the 3 % the adaptive rule may lose at most; DEMO_PAIRS
                # (default 1) adaptive loads, each against the mean of the plain
                # loads beside it, and the median of those ratios
                load "demo plain b$c" "$c" "$n" off --vocab "$dv" $dp --record "$W/demo-b$c.txt"
                # DEMO_FIXED_FIRST=1: the fixed block's load first, so that the
                # adaptive loads start from what it measured (the verifier
                # remembers a drafter's acceptance by position), as where
                # fixed-block and adaptive requests share a drafter
                [ "${DEMO_FIXED_FIRST:-0}" = 1 ] &&
                    load "demo fixed 4 b$c (first)" "$c" "$n" on --vocab "$dv" $dp --block 4 --fixed \
                        --check "$W/demo-b$c.txt"
                for i in $(seq 1 "${DEMO_PAIRS:-1}"); do
                    load "demo adaptive b$c" "$c" "$n" auto --vocab "$dv" $dp --check "$W/demo-b$c.txt"
                    load "demo plain b$c (again)" "$c" "$n" off --vocab "$dv" $dp --check "$W/demo-b$c.txt"
                done
                demo_verdict "$c"
                load "demo fixed 4 b$c" "$c" "$n" on --vocab "$dv" $dp --block 4 --fixed \
                    --check "$W/demo-b$c.txt"
            done
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        demoahead)
            # The demo pair at controlled acceptance (the oracle build of the
            # demo drafter), block 4 at batch 1, run-ahead off and on: what
            # drafting ahead of verdicts buys where the drafter has a device
            # (or, on the CPU, cores: VCORES, DCORES) of its own.
            echo "== demo pair, run-ahead" | tee -a "$SUM"
            dv="$(grep -o '"vocab_size": *[0-9]*' models/demo-target/config.json | grep -o '[0-9]*$')"
            start_stack demoahead "$root/models/demo-target" ${VFLAGS:-} || continue
            n=$((${DEMO_SCALE:-4} * REQ1))
            load "demo plain b1" 1 "$n" off --vocab "$dv" --record "$W/demo-ahead.txt"
            for a in ${ACCEPTS:-0.6 0.8 0.9 1.0}; do
                for ra in ${RUNAHEAD:-off on}; do
                    start_drafter "demo-oracle-$a-$ra" bench_drafter_oracle \
                        "$root/models/demo-drafter" "$ra" 8 TANDEM_BENCH_ORACLE="$W/demo-ahead.txt" \
                        TANDEM_BENCH_ACCEPT="$a" $([ "$ra" = on ] && echo $HIDE) || continue
                    load "demo a=$a fixed 4 ahead=$ra b1" 1 "$n" on --vocab "$dv" --block 4 --fixed \
                        --check "$W/demo-ahead.txt"
                done
            done
            load "demo plain b1 (again)" 1 "$n" off --vocab "$dv" --check "$W/demo-ahead.txt"
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        share)
            # The 4B target and the 0.8B oracle drafter on one GPU (run with
            # MPS=1), a = ACCEPTS (default 0.8 1.0), fixed block 4 at batch 1,
            # run-ahead off and on, each process held to a percentage of the
            # multiprocessors (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): SHARES is a
            # list of VERIFIER:DRAFTER percentages (default "100:100 50:50
            # 65:35"), each with its own plain load. Whether drafting ahead
            # pays on a GPU the two share once neither can take all of it.
            # The first DRAFT_VOCABS entry is the drafter's.
            echo "== one GPU: run-ahead with shares of the multiprocessors" | tee -a "$SUM"
            [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] ||
                echo "share: no MPS server: the shares are not enforced" | tee -a "$SUM"
            [ -d "$W/t4b" ] || "$B/bench_make_model" --shape 4b --out "$W/t4b" | tee -a "$SUM"
            [ -d "$W/d08" ] || "$B/bench_make_model" --shape 0.8b --out "$W/d08" | tee -a "$SUM"
            V="--vocab 248320"
            draft_vocab ${DRAFT_VOCABS:-0} # the first entry
            vpin0="$VPIN"
            for sh in ${SHARES:-100:100 50:50 65:35}; do
                vp="${sh%%:*}" dp="${sh##*:}"
                VPIN="$vpin0 env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$vp"
                start_stack "share-$vp" "$W/t4b" --max-context 8192 ${VFLAGS:-} || continue
                load "share $vp:$dp: plain b1" 1 "$REQ1" off $V --record "$W/truth-share.txt"
                for a in ${ACCEPTS:-0.8 1.0}; do
                    for ra in ${RUNAHEAD:-off on}; do
                        start_drafter "share-$vp-$dp-$a-$ra" bench_drafter_oracle "$W/d08" "$ra" 8 \
                            TANDEM_BENCH_ORACLE="$W/truth-share.txt" TANDEM_BENCH_ACCEPT="$a" \
                            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$dp" \
                            $([ "$ra" = on ] && echo $HIDE) || continue
                        load "share $vp:$dp: a=$a fixed 4 ahead=$ra$vt b1" 1 "$REQ1" on $V \
                            --block 4 --fixed --check "$W/truth-share.txt"
                    done
                done
            done
            VPIN="$vpin0"
            DFLAGS=""
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            ;;
        drain)
            # 32 sequences of a 4B-shaped target running on verifier A when
            # A gets SIGTERM: each moves to verifier B (same GPU) through a
            # snapshot; the time to a drained A, and what the moves cost.
            echo "== drain: 32 sequences moved by SIGTERM" | tee -a "$SUM"
            DM="${DRAIN_MODEL:-$W/t4b}"
            [ -d "$DM" ] || "$B/bench_make_model" --shape 4b --out "$DM" | tee -a "$SUM"
            start_stack drain "$DM" --state-strategy replay --shutdown-grace 60s \
                --max-context 4096 || continue
            V="--vocab $(grep -o '"vocab_size": *[0-9]*' "$DM/config.json" | head -1 | grep -o '[0-9]*$')"
            TOKENS="${DRAIN_TOKENS:-2000}" load "drain: 32 x ${DRAIN_TOKENS:-2000} tokens" 32 32 off $V &
            lpid=$!
            sleep 4
            "$B/tandem-verifier" --backend "${BACKEND:-cuda}" --model "$DM" \
                --listen 127.0.0.1:7730 --health-listen 127.0.0.1:7731 --gateway "$GW" \
                --max-sequences 40 --max-draft-tokens 8 --max-context 4096 \
                >"$LOGS/verifier-drain-b.log" 2>&1 &
            bpid=$!
            for _ in $(seq 1 300); do
                st="$("$B/tandem" status --gateway "$GW" --json --timeout 1s 2>/dev/null)"
                grep -q '"address":[[:space:]]*"127.0.0.1:7730"' <<<"$st" && break
                sleep 0.2
            done
            t0=$(date +%s.%N)
            kill -TERM "$vpid"
            wait "$vpid"
            rc=$?
            t1=$(date +%s.%N)
            vpid=""
            echo "A exited $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s" \
                "after SIGTERM;" \
                "$(grep -o 'drained in .*' "$LOGS/verifier-drain.log")" | tee -a "$SUM"
            grep ' -> .*: snapshot (drain' "$LOGS/gateway-drain.log" |
                grep -o 'snapshot (drain; [0-9.]* MB in [0-9]* ms)' |
                awk '{mb+=$3; ms+=$6; n++; if ($6>mx) mx=$6} END {printf "moves: %d, %.1f MB each, %.0f ms mean, %d ms max\n", n, mb/n, ms/n, mx}' |
                tee -a "$SUM"
            wait "$lpid"
            tail -1 "$SUM"
            stop "$bpid" "$gpid"
            gpid=""
            ;;
        27b)
            # The Qwen3.6-27B shape as released (bench_make_model --layout
            # release: shards named by an index, text_config, the vision
            # tower and the MTP head beside the text model), written to
            # memory-backed storage (/dev/shm; on disk when it is too small).
            echo "== 27B shape" | tee -a "$SUM"
            M27="$W/t27b"
            if [ "$(df -k --output=avail /dev/shm | tail -1)" -lt $((60 * 1024 * 1024)) ]; then
                M27=/tmp/tandem-t27b
            fi
            df -h "$(dirname "$M27")" | tail -1 | tee -a "$SUM"
            rm -rf "$M27"
            "$B/bench_make_model" --shape 27b --layout release --out "$M27" | tee -a "$SUM"
            echo "$(ls "$M27" | grep -c safetensors$) shards, $(du -sh "$M27" | cut -f1)" | tee -a "$SUM"
            # host memory the load takes beyond the checkpoint: the largest
            # AnonPages while loading, against before
            anon() { awk '/^AnonPages:/ {print $2}' /proc/meminfo; }
            for st in ${STRATEGIES27:-replay extra_buffer no_buffer}; do
                a0=$(anon) amax=$a0
                bs=1,8,32
                [ "$st" = replay ] || bs=1,8
                more=()
                # replay: also from one context, and where a step's GPU time goes
                [ "$st" = replay ] && more=(--stats)
                timeout 400 "$B/bench_cuda_bench" --model "$M27" --shape 27b --batch "$bs" \
                    --k 0,4,8 --steps 10 --out argmax --strategy "$st" "${more[@]}" \
                    >"$LOGS/engine_27b_$st.log" 2>&1 &
                bp=$!
                while kill -0 "$bp" 2>/dev/null; do
                    a=$(anon)
                    [ "$a" -gt "$amax" ] && amax=$a
                    sleep 0.2
                done
                wait "$bp"
                tee -a "$SUM" <"$LOGS/engine_27b_$st.log" | grep -E 'loaded|floor|^\|' | head -14
                [ "$st" = replay ] && timeout 200 "$B/bench_cuda_bench" --model "$M27" --shape 27b \
                    --batch 1 --k 0,8 --steps 10 --out argmax --strategy replay --context 1000 2>&1 |
                    tee "$LOGS/engine_27b_context.log" | grep -E '^\|' | tee -a "$SUM"
                echo "27b $st: host anonymous memory during the run +$(((amax - a0) / 1024)) MB" |
                    tee -a "$SUM"
            done
            # the capacity arithmetic per strategy and context, for the memory
            # this H200 has free beside the weights (check-config touches no GPU)
            for ctx in 4096 32768; do
                for st in replay extra_buffer no_buffer; do
                    "$B/tandem-verifier" --check-config --backend cuda --model "$M27" \
                        --state-strategy "$st" --max-draft-tokens 8 --max-context "$ctx" \
                        --gpu-memory 130GiB >"$LOGS/check27-$st-$ctx.log" 2>&1
                    echo "check-config 27b $st context $ctx rc=$?" | tee -a "$SUM"
                    grep -E '^#  ' "$LOGS/check27-$st-$ctx.log" | tee -a "$SUM"
                done
            done
            # the verifier's own accounting (gpu_memory auto), then the largest
            # batch it runs: 64 requests at once
            start_stack 27b "$M27" --max-context 4096 || continue
            "$B/tandem" status --gateway "$GW" >"$LOGS/status-27b.log" 2>&1
            V="--vocab 248320"
            load "27b plain b1" 1 4 off $V
            load "27b plain b32" 32 64 off $V
            (sleep 4; "$B/tandem" status --gateway "$GW" >>"$LOGS/status-27b.log" 2>&1) &
            load "27b plain b64" 64 64 off $V
            wait
            curl -s "127.0.0.1:7712/metrics" >"$LOGS/metrics-27b.log" 2>&1
            stop "$dpid" "$vpid" "$gpid"
            dpid="" vpid="" gpid=""
            grep -iE 'capacity|sequences|gpu_memory' "$LOGS/verifier-27b.log" | head -30 | tee -a "$SUM"
            grep -E 'capacity|running|reserved' "$LOGS/status-27b.log" | tee -a "$SUM"
            rm -rf "$M27"
            ;;
        doctor)
            echo "== tandem doctor" | tee -a "$SUM"
            printf 'backend: cuda\nmodel: %s\n' "$root/models/demo-target" >"$W/doctor-v.yaml"
            "$B/tandem" doctor --config "$W/doctor-v.yaml" --role verifier 2>&1 | tee -a "$SUM"
            echo "doctor rc=${PIPESTATUS[0]}" | tee -a "$SUM"
            ;;
        rpc)
            # the transport's own round trip on this host: the floor of the exchange
            echo "== gRPC layer over loopback" | tee -a "$SUM"
            timeout 120 "$B/bench_rpc_bench" --iters 3000 2>/dev/null | tee -a "$SUM"
            # the exchange's transport alone, threaded as the services thread
            # it (bench/exchange_bench.c): idle rounds, then rounds shaped as
            # the 4B pair's (4 drafts of the 0.8B model, a verify step), on
            # the gRPC stream and on the exchange lane (shared memory)
            for transport in grpc lane; do
                for busy in 0 50000; do
                    for shape in "0 0" "4000 3300"; do
                        set -- $shape
                        timeout 120 "$B/bench_exchange_bench" --iters "${XITERS:-1500}" \
                            --busy-us "$busy" --draft-us "$1" --verify-us "$2" \
                            --transport "$transport" 2>/dev/null | tee -a "$SUM"
                    done
                done
            done
            ;;
        cudatests)
            for t in "$B"/cuda_test_*; do
                echo "== $(basename "$t")"
                timeout 300 "$t" >"$LOGS/$(basename "$t").log" 2>&1
                echo "$(basename "$t") rc=$? $(tail -1 "$LOGS/$(basename "$t").log")" | tee -a "$SUM"
            done
            ;;
        esac
    done
    rm -rf "$W"
    mps_quit
    mps_quit() { :; }
    # what comes back from the GPU machine is a few files: the summary and
    # every log in one archive
    tar -C "$LOGS" -cJf "$OUT/logs${TAG:+-$TAG}.txz" .
    rm -rf "$LOGS"
    ;;
*)
    echo "usage: bench/spec_bench.sh pack BUILD_DIR | run" >&2
    exit 2
    ;;
esac
