#!/usr/bin/env python3
"""`tandem logits` end to end: its .npy against transformers' logits of the
fixtures (numpy does the comparison, independently of the engine's tests),
the strategies give the same bytes, and bad input gets a clear error."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

tandem, fixtures = sys.argv[1], sys.argv[2]


def run(args, expect_rc=0):
    p = subprocess.run([tandem, "logits"] + args, capture_output=True, text=True)
    if p.returncode != expect_rc:
        sys.exit(f"FAIL: tandem logits {' '.join(args)} -> rc {p.returncode}\n{p.stdout}{p.stderr}")
    return p


with tempfile.TemporaryDirectory() as tmp:
    for name in ("f32_gqa", "f32_sharded"):
        d = os.path.join(fixtures, name)
        calls = json.load(open(os.path.join(d, "meta.json")))["calls"]
        args = ["--model", os.path.join(d, "model"), "--ids", ",".join(map(str, calls[0]))]
        for c in calls[1:]:
            args += ["--then", ",".join(map(str, c))]
        ref = np.load(os.path.join(d, "cached.npy"))
        outs = []
        for extra in ([], ["--strategy", "extra_buffer"], ["--strategy", "no_buffer"],
                      ["--strategy", "replay"]):
            out = os.path.join(tmp, f"{name}{len(outs)}.npy")
            run(args + ["--out", out] + extra)
            got = np.load(out)
            assert got.shape == ref.shape, (got.shape, ref.shape)
            err = float(np.abs(got - ref).max())
            tol = 1e-4 * float(np.abs(ref).max())
            assert err <= tol, f"{name}: max|d| {err} > {tol}"
            assert (got.argmax(1) == ref.argmax(1)).all(), f"{name}: argmax differs"
            outs.append(got)
        assert all((o == outs[0]).all() for o in outs), f"{name}: strategies differ"
        print(f"{name}: tandem logits matches transformers (max|d| {err:.3g} <= {tol:.3g})")
        top = run(args[:4] + ["--top", "3"]).stdout.splitlines()
        assert len(top) == len(calls[0]), top
        best = int(top[-1].split()[2])
        assert best == int(ref[len(calls[0]) - 1].argmax()), top[-1]

    m = os.path.join(fixtures, "f32_tied", "model")
    p = run(["--model", m, "--ids", "1,x"], 2)
    assert "comma-separated" in p.stderr, p.stderr
    p = run(["--model", m, "--ids", "1,99999"], 1)
    assert "vocabulary" in p.stderr, p.stderr
    p = run(["--model", os.path.join(tmp, "nope"), "--ids", "1"], 1)
    assert "config.json" in p.stderr, p.stderr
    p = run(["--model", m, "--ids", "1", "--strategy", "fast"], 2)
    assert "strategy" in p.stderr, p.stderr
print("tandem logits: ok")
