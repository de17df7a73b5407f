#!/usr/bin/python3
"""Speculative decoding end to end on this machine's CPU with the bundled demo
pair: tokens/s with and without speculation (model and n-gram drafters),
mean accepted draft tokens per round, and the drafter<->verifier exchange
overhead per round on loopback (median and p99, from the verifier's
counters), side by side.

With --mtp-vocab FILE...: the demo target's MTP head at block 3 with the
whole vocabulary and with each draft vocabulary (draft_vocab) instead, beside
plain decoding: what a smaller draft vocabulary costs in acceptance.

usage: bench/e2e_bench.py --build BUILD_DIR [--prompts N] [--tokens N] [--concurrency C ...]
                          [--repeat R] [--mtp-vocab FILE ...]
"""
import argparse
import concurrent.futures
import os
import time

from harness import e2e, st, use_build


def counter(target, path, name):
    code, _, resp = st.unary(target, path)
    for c in (resp or {}).get("counters", []):
        if c["name"] == name:
            return float(c["value"])
    return 0.0


def run(label, gw, v, ps, tokens, conc, mode, block=0, fixed=False, quiet=False):
    t0 = time.time()

    def one(p):
        return e2e.generate(gw, p, max_tokens=tokens, mode=mode, block=block, fixed=fixed,
                            ignore_eos=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=conc) as ex:
        res = list(ex.map(one, ps))
    wall = time.time() - t0
    gen = sum(len(r[2]) for r in res)
    bad = [r for r in res if r[0] != "OK"]
    rounds = sum(int(r[4]["stats"]["speculative_rounds"]) for r in res if r[4])
    acc = sum(int(r[4]["stats"]["accepted_tokens"]) for r in res if r[4])
    p50 = counter(v.addr(), "/tandem.v1.Verifier/Describe", "draft_exchange_overhead_p50_us")
    p99 = counter(v.addr(), "/tandem.v1.Verifier/Describe", "draft_exchange_overhead_p99_us")
    row = (label, conc, gen / wall, acc / rounds if rounds else 0.0, rounds, p50, p99, len(bad))
    if not quiet:
        print("| %-34s | %2d | %8.1f | %5.2f | %6d | %7.0f | %7.0f | %d |" % row, flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mtp-vocab", nargs="+", default=[])
    a = ap.parse_args()
    use_build(a.build, "tandem-bench-")
    ps = e2e.prompts(a.prompts)
    print("| configuration | conc | tokens/s median (min-max) | accepted/round | spec rounds | "
          "exchange p50 us | exchange p99 us | errors |")
    print("|---|---|---|---|---|---|---|---|")
    configs = [("plain (no speculation)", "model", "SPECULATION_MODE_OFF", 0, False),
               ("model drafter, k=4 fixed", "model", "SPECULATION_MODE_ON", 4, True),
               ("model drafter, adaptive (k<=4)", "model", "SPECULATION_MODE_ON", 4, False),
               ("n-gram drafter, k=4 fixed", "ngram", "SPECULATION_MODE_ON", 4, True)]
    if a.mtp_vocab:
        configs = [("plain (no speculation)", "mtp", "SPECULATION_MODE_OFF", 0, False, ()),
                   ("MTP head, k=3 fixed", "mtp", "SPECULATION_MODE_ON", 3, True, ())]
        configs += [("MTP head, k=3 fixed, %s" % os.path.basename(f), "mtp",
                     "SPECULATION_MODE_ON", 3, True, ("--draft-vocab", os.path.abspath(f)))
                    for f in a.mtp_vocab]
    else:
        configs = [c + ((),) for c in configs]
    try:
        for conc in a.concurrency:
            # This machine's speed drifts from minute to minute: the
            # configurations take turns, --repeat times, and the median counts.
            results = {c[0]: [] for c in configs}
            for rep in range(a.repeat):
                for label, drafter, mode, block, fixed, dargs in configs:
                    gw, v, d = e2e.stack("extra_buffer", drafter, block=4,
                                         extra_drafter_args=dargs)
                    results[label].append(run(label, gw, v, ps, a.tokens, conc, mode, block,
                                              fixed, quiet=True))
                    e2e.stop_all()
            for label, *_ in configs:
                rows = sorted(results[label], key=lambda r: r[2])
                m = rows[len(rows) // 2]
                print("| %-34s | %2d | %8.1f (%.0f-%.0f) | %5.2f | %6d | %7.0f | %7.0f | %d |" %
                      (m[0], m[1], m[2], rows[0][2], rows[-1][2], m[3], m[4], m[5], m[6], m[7]),
                      flush=True)
    finally:
        e2e.stop_all()


if __name__ == "__main__":
    main()
