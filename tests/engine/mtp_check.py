#!/usr/bin/env python3
"""The engine's MTP head against an independent implementation: `tandem
logits --mtp-out` on tiny random checkpoints with an MTP head (the release
layout: untied, sharded; and a tied plain one) against
tools/mtp_reference_pure.py, plain Python in double precision, sharing no
code with the engine. Within 1e-4 x max|logit| (fp32 against double), the
same drafts wherever the reference's top-2 margin is clear, and the hidden
states the engine hands the head are what its LM head reads (lm_head(hidden)
gives the target's logits back). No numpy: the reference reads the files
itself.

    mtp_check.py TANDEM BENCH_MAKE_MODEL TOOLS_DIR
"""
import os
import random
import subprocess
import sys
import tempfile

tandem, make_model, tools = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tools)
import mtp_reference_pure as ref  # noqa: E402

TOL = 1e-4


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} -> rc {p.returncode}\n{p.stdout}{p.stderr}")
    return p.stdout


def rows(path):
    shape, flat = ref.npy_read(path)
    n = shape[1]
    return [flat[i * n:(i + 1) * n] for i in range(shape[0])]


def rel_err(got, want):
    big = max(abs(v) for r in want for v in r)
    return max(abs(a - b) for r, s in zip(got, want) for a, b in zip(r, s)) / big


def check(name, layout_args, k, strategy):
    rnd = random.Random(name)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        sh([make_model, "--shape", "tiny", "--out", model] + layout_args)
        ids = [[rnd.randrange(320) for _ in range(n)] for n in (9, 3, 2)]
        tokens = [t for c in ids for t in c]
        base = ["logits", "--model", model, "--ids", ",".join(map(str, ids[0]))]
        for c in ids[1:]:
            base += ["--then", ",".join(map(str, c))]
        outs = {}
        for strat in ([], ["--strategy", strategy]):
            tag = "plain" if not strat else strategy
            f = {x: os.path.join(tmp, f"{x}_{tag}.npy") for x in ("l", "h", "m")}
            so = sh([tandem] + base + strat + ["--out", f["l"], "--hidden-out", f["h"],
                                               "--mtp-out", f["m"], "--mtp-draft", str(k)])
            line = [s for s in so.splitlines() if s.startswith("mtp drafts:")]
            assert line, so
            drafts = [int(t) for t in line[0].split(":")[1].split()]
            assert len(drafts) == k, line
            outs[tag] = (open(f["m"], "rb").read(), drafts, f)
        # The verify path (a strategy) gives the head the same hidden states.
        assert outs["plain"][0] == outs[strategy][0], f"{name}: MTP logits differ under {strategy}"
        _, drafts, f = outs["plain"]
        hidden, target, mtp = rows(f["h"]), rows(f["l"]), rows(f["m"])
        assert len(hidden) == len(tokens) and len(mtp) == len(tokens) + k - 1, \
            (len(hidden), len(mtp))

        want, nxt, own = ref.run(model, hidden, tokens, drafts)
        head = ref.MTPHead(model)
        from_hidden = [head.logits(h) for h in hidden]
        e_head = rel_err(target, from_hidden)
        assert e_head <= 1e-5, f"{name}: lm_head(hidden) is not the target's logits ({e_head:.3g})"
        assert nxt == ref.argmax(target[-1]), f"{name}: target argmax {nxt}"
        err = rel_err(mtp, want)
        assert err <= TOL, f"{name}: MTP logits max|d|/max|ref| = {err:.3g} > {TOL}"
        for j, (d, o) in enumerate(zip(drafts, own)):
            row = want[len(tokens) - 1 + j]
            top = sorted(row, reverse=True)
            if top[0] - top[1] > 1e-3 * abs(top[0]):
                assert d == o, f"{name}: draft {j + 1} is {d}, the reference's {o}"
        print(f"{name}: {len(tokens)} positions + {k - 1} draft rows, max|d|/max|ref| = {err:.3g} "
              f"(<= {TOL}); drafts {drafts}")
        return err


def no_head():
    """A checkpoint without mtp.*: tandem logits --mtp-out fails naming the tensor."""
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        sh([make_model, "--shape", "tiny", "--out", model])
        p = subprocess.run([tandem, "logits", "--model", model, "--ids", "1,2,3", "--mtp-out",
                            os.path.join(tmp, "m.npy")], capture_output=True, text=True)
        assert p.returncode == 1 and "mtp.fc.weight" in p.stderr, (p.returncode, p.stderr)
        p = subprocess.run([tandem, "logits", "--model", model, "--ids", "1", "--mtp-draft", "0"],
                           capture_output=True, text=True)
        assert p.returncode == 2 and "--mtp-draft" in p.stderr, (p.returncode, p.stderr)


no_head()
worst = max(check("release", ["--layout", "release", "--shard-gb", "0.0001"], 4, "replay"),
            check("tied", ["--mtp"], 3, "extra_buffer"))
print(f"mtp reference: ok (max relative error {worst:.3g})")
