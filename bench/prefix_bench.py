#!/usr/bin/python3
"""Time to first token with and without a prefix-cache hit, on this
machine's CPU with the bundled demo target: a gateway and a verifier
(prefix_cache on) as processes on loopback; for each of R rounds a new
shared prompt of P tokens, sent once (a miss: the whole prompt prefilled)
then with another last few tokens (a hit: the cached blocks restored, the
rest prefilled); the same requests against a verifier with prefix_cache off
for reference. Prints the medians (and ranges) of the time to first token
the verifier reports (RequestStats.time_to_first_token_ms) and the prompt
tokens the hits restored.

usage: bench/prefix_bench.py --build BUILD_DIR [--prompt-tokens P] [--rounds R]
                             [--block B]
"""
import argparse
import os
import random
import statistics
import sys

from harness import ROOT, e2e, st, use_build

sys.path.insert(0, os.path.join(ROOT, "tests", "prefix"))
import prefix_test as pt  # noqa: E402  (its Generate by token ids)


def generate(gw, ids):
    _, stats = pt.generate(gw, ids, False, max_tokens=4)
    return float(stats["time_to_first_token_ms"]), int(stats.get("cached_prompt_tokens", 0))


def summary(xs):
    return "%.0f ms (%.0f-%.0f)" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=256)
    a = ap.parse_args()
    use_build(a.build, "tandem-bench-")
    rng = random.Random(7)
    vocab = 4000
    rounds = []
    for _ in range(a.rounds):
        shared = [rng.randrange(10, vocab) for _ in range(a.prompt_tokens - 8)]
        rounds.append((shared + [rng.randrange(10, vocab) for _ in range(8)],
                       shared + [rng.randrange(10, vocab) for _ in range(8)]))
    out = {}
    try:
        for cache in ("off", "on"):
            gw = st.gateway("--tokenizer", e2e.TOKENIZER)
            st.replica("verifier", gw, "--model", e2e.TARGET, "--prefix-cache", cache,
                       "--prefix-cache-block", str(a.block))
            st.wait_status(gw, lambda s: len(s.get("replicas", [])) >= 1, "verifier registered")
            generate(gw, rounds[0][0][:64])  # warm-up, shares nothing with the rounds' blocks
            first, second, cached = [], [], []
            for p1, p2 in rounds:
                t1, _ = generate(gw, p1)
                t2, c2 = generate(gw, p2)
                first.append(t1)
                second.append(t2)
                cached.append(c2)
            out[cache] = (first, second, cached)
            e2e.stop_all()
    finally:
        e2e.stop_all()
    print("prompt %d tokens, prefix_cache_block %d, %d rounds (median, range)" %
          (a.prompt_tokens, a.block, a.rounds))
    print("| prefix_cache | first request (miss) TTFT | same prefix again TTFT | prompt tokens "
          "restored |")
    print("|---|---|---|---|")
    for cache in ("off", "on"):
        first, second, cached = out[cache]
        print("| %s | %s | %s | %d |" % (cache, summary(first), summary(second),
                                         statistics.median(cached)))


if __name__ == "__main__":
    main()
