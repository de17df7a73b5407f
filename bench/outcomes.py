#!/usr/bin/python3
"""What a block drafted ahead of its verdict could stand on: the verdicts of a
drafter/target pair, by outcome, and how many rounds each outcome a drafter
might prepare ahead would cover.

The target's greedy continuations come from the real services (plain
decoding through a gateway and a CPU verifier); the drafter's view of each
position from one pass of the drafter model over prompt + continuation
(`tandem logits`): along the accepted prefix of a block the drafter's context
is the target's own tokens, so its greedy drafts are the argmaxes of those
rows until the first one the verifier rejects. Greedy verification of a
block of k drafts from position s then gives the verdict (a accepted, the
target's token at s + a), and the outcomes are:

  whole, guess right    a = k and the target's next token is the drafter's
                        argmax there: the block drafted ahead today stands
  whole, runner-up      a = k and it is the drafter's second choice there
  reject at j, runner-up
                        a = j < k and the target's token at s + j is the
                        drafter's second choice there (its first choice was
                        the rejected draft)

A drafter that prepared the blocks of further outcomes (each a chain of
k + 1 from its own state) would have the next block ready in the rounds
those outcomes cover, at the price of one more chain a round each.

usage: bench/outcomes.py --build BUILD_DIR [--prompts N] [--tokens N] [--block K ...]
"""
import argparse
import os
import subprocess

import numpy as np

from harness import e2e, st, use_build


def continuations(ps, tokens):
    """(prompt ids, greedy continuation ids) of each prompt, from the services."""
    gw, v, _ = e2e.stack("extra_buffer", None)
    out = []
    for p in ps:
        code, details, resp = st.unary(gw.addr(), "/tandem.v1.Gateway/Tokenize", {"text": p})
        if code != "OK":
            raise SystemExit("Tokenize: %s %s" % (code, details))
        ids = [int(x) for x in resp["ids"]]
        r = e2e.generate(gw, p, max_tokens=tokens, mode="SPECULATION_MODE_OFF", ignore_eos=True)
        if r[0] != "OK":
            raise SystemExit("Generate: %s %s" % (r[0], r[1]))
        out.append((ids, [int(x) for x in r[2]]))
    e2e.stop_all()
    return out


def top2(cli, model, ids, tmp):
    """The drafter's first and second choices after each position of ids."""
    path = os.path.join(tmp, "logits.npy")
    subprocess.run([cli, "logits", "--model", model, "--ids", ",".join(map(str, ids)),
                    "--out", path], check=True, stdout=subprocess.DEVNULL)
    lg = np.load(path)
    order = np.argsort(-lg, axis=1, kind="stable")[:, :2]
    return order[:, 0], order[:, 1]


def tally(seqs, k):
    """Rounds of greedy verification with blocks of k, by outcome."""
    n = {"rounds": 0, "whole, guess right": 0, "whole, runner-up": 0}
    for j in range(k):
        n["reject at %d, runner-up" % j] = 0
    for plen, ids, first, second in seqs:
        s = plen  # the position of the round's first draft
        while s + k < len(ids):
            a = 0
            while a < k and first[s + a - 1] == ids[s + a]:
                a += 1
            n["rounds"] += 1
            nxt = ids[s + a]  # the verifier's token after the accepted drafts
            if a == k:
                if first[s + k - 1] == nxt:
                    n["whole, guess right"] += 1
                elif second[s + k - 1] == nxt:
                    n["whole, runner-up"] += 1
            elif second[s + a - 1] == nxt:
                n["reject at %d, runner-up" % a] += 1
            s += a + 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--block", type=int, nargs="+", default=[2, 4, 8])
    a = ap.parse_args()
    cli = use_build(a.build, "tandem-outcomes-").cli
    try:
        pairs = continuations(e2e.prompts(a.prompts), a.tokens)
    finally:
        e2e.stop_all()
    seqs = []
    for ids, gen in pairs:
        full = ids + gen
        first, second = top2(cli, e2e.DRAFTER, full, st.TMP)
        seqs.append((len(ids), full, first, second))
    print("%d prompts, %d greedy tokens each (%s drafting for %s)" %
          (len(pairs), a.tokens, os.path.basename(e2e.DRAFTER), os.path.basename(e2e.TARGET)))
    print("| outcome | " + " | ".join("k = %d" % k for k in a.block) + " |")
    print("|---|" + "---|" * len(a.block))
    tallies = [tally(seqs, k) for k in a.block]
    keys = [x for x in tallies[-1] if x != "rounds"]
    for key in keys:
        cells = []
        for k, t in zip(a.block, tallies):
            cells.append("%.1f %%" % (100.0 * t[key] / t["rounds"]) if key in t else "-")
        print("| %s | %s |" % (key, " | ".join(cells)))
    print("| none of these | %s |" % " | ".join(
        "%.1f %%" % (100.0 * (t["rounds"] - sum(v for x, v in t.items() if x != "rounds")) /
                     t["rounds"]) for t in tallies))
    print("| rounds | %s |" % " | ".join(str(t["rounds"]) for t in tallies))


if __name__ == "__main__":
    main()
