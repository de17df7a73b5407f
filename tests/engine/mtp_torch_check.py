#!/usr/bin/env python3
"""The torch MTP head (tools/mtp_head.py: what tools/mtp_reference.py runs
and tools/train_mtp.py trains) against tools/mtp_reference_pure.py and the
engine, on tiny random checkpoints with a head (tied plain; untied sharded
release layout):

  - primed rows and draft rows (fed the engine's drafts) within 1e-4 x
    max|logit| of the plain-Python reference and of `tandem logits
    --mtp-out`, and the same greedy drafts;
  - drafting a right-padded batch gives each sequence's drafts alone;
  - the parallel training form (head_losses: step 2 as chains anchored at
    every position) equals running each chain row by row;
  - st_append keeps every old tensor byte-identical and st_read reads the
    added ones back;
  - a few optimiser steps on the engine's hidden states lower the loss.

Exits 77 (skipped) when torch is not installed.

    mtp_torch_check.py TANDEM BENCH_MAKE_MODEL TOOLS_DIR
"""
import os
import random
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: torch is not installed")
    sys.exit(77)

tandem, make_model, tools = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tools)
import mtp_head as mh  # noqa: E402
import mtp_reference_pure as ref  # noqa: E402

TOL = 1e-4
torch.manual_seed(0)


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} -> rc {p.returncode}\n{p.stdout}{p.stderr}")
    return p.stdout


def rel(got, want):
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    return float((got - want).abs().max() / want.abs().max())


def load(model):
    c = ref.text_config(model)
    t = mh.st_read(model)
    emb = t.get("model.language_model.embed_tokens.weight", t.get("model.embed_tokens.weight"))
    lm = emb if c["tie"] else t["lm_head.weight"]
    head = mh.MTPHead(mh.head_config(dict(
        hidden_size=c["H"], intermediate_size=c["I"], num_attention_heads=c["nH"],
        num_key_value_heads=c["nKV"], head_dim=c["D"], rms_norm_eps=c["eps"],
        rope_parameters=dict(rope_theta=c["theta"], partial_rotary_factor=c["rot"] / c["D"]))))
    head.load_tensors(t).double()
    return head, emb.double(), lm.double()


def check(name, layout_args, k):
    rnd = random.Random(name)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        sh([make_model, "--shape", "tiny", "--out", model] + layout_args)
        ids = [rnd.randrange(320) for _ in range(13)]
        f = {x: os.path.join(tmp, f"{x}.npy") for x in ("l", "h", "m")}
        so = sh([tandem, "logits", "--model", model, "--ids", ",".join(map(str, ids)),
                 "--out", f["l"], "--hidden-out", f["h"], "--mtp-out", f["m"],
                 "--mtp-draft", str(k)])
        drafts = [int(t) for t in [s for s in so.splitlines()
                                   if s.startswith("mtp drafts:")][0].split(":")[1].split()]

        def npy(p):
            shape, flat = ref.npy_read(p)
            return torch.tensor(flat, dtype=torch.float64).view(*shape)

        hidden, target, engine = npy(f["h"]), npy(f["l"]), npy(f["m"])
        T = len(ids)
        head, emb, lm = load(model)
        nxt = int(target[-1].argmax())
        follow = torch.tensor(ids[1:] + [nxt])
        with torch.no_grad():
            y, _, kv = head.prime(hidden[None], follow[None], emb)
            rows = [mh.lm_logits(y[0], lm)]
            past, yl = [], y[:, -1:]
            anchor = torch.tensor([[T - 1]])
            for j in range(1, k):
                yl, _ = head.chain(yl, torch.tensor([[drafts[j - 1]]]), anchor, emb, kv, past)
                rows.append(mh.lm_logits(yl[0], lm))
            mine = torch.cat(rows)
            own = head.draft(hidden[None], follow[None], torch.tensor([T]), emb, lm, k)[0].tolist()
        want, rnxt, rown = ref.run(model, [r.tolist() for r in hidden], ids, drafts)
        assert rnxt == nxt, (rnxt, nxt)
        e_ref, e_eng = rel(mine, want), rel(mine, engine)
        assert e_ref <= TOL, f"{name}: torch head vs plain-Python reference {e_ref:.3g} > {TOL}"
        assert e_eng <= TOL, f"{name}: torch head vs engine {e_eng:.3g} > {TOL}"
        assert own == drafts == rown, f"{name}: drafts torch {own} engine {drafts} reference {rown}"

        # A right-padded batch: each sequence's drafts as alone.
        with torch.no_grad():
            cut = T - 4
            hb = torch.zeros(2, T, hidden.shape[1], dtype=hidden.dtype)
            hb[0], hb[1, :cut] = hidden, hidden[:cut]
            tb = torch.zeros(2, T, dtype=torch.long)
            tb[0] = follow
            tb[1, :cut] = torch.tensor(ids[1:cut + 1])
            both = head.draft(hb, tb, torch.tensor([T, cut]), emb, lm, k).tolist()
            alone = head.draft(hidden[None, :cut], tb[1:, :cut], torch.tensor([cut]), emb, lm, k)
        assert both[0] == own and both[1] == alone[0].tolist(), (both, own, alone)

        # The parallel step-2 form = chains run one at a time.
        with torch.no_grad():
            win = torch.tensor(ids + [nxt])[None]                  # T + 1 tokens
            losses = mh.head_losses(head, hidden[None], win, emb, depth=3)
            y1, _, kv1 = head.prime(hidden[None, :T - 1], win[:, 1:T], emb)
            ce = [0.0, 0.0]
            for d in (2, 3):
                lg = []
                for p in range(T - d):
                    past, yl = [], y1[:, p:p + 1]
                    for dd in range(2, d + 1):
                        yl, _ = head.chain(yl, win[:, p + dd:p + dd + 1], torch.tensor([[p]]),
                                           emb, kv1, past)
                    lg.append(mh.lm_logits(yl[0], emb))
                ce[d - 2] = float(mh.ce_loss(torch.cat(lg), win[0, d + 1:T + 1]))
        for d in (2, 3):
            got = float(losses[d - 1][0])
            assert abs(got - ce[d - 2]) <= 1e-9 * max(1.0, abs(got)), (d, got, ce[d - 2])

        # Writing a head beside the tensors: the old bytes stay.
        src = os.path.join(model, "model.safetensors")
        if os.path.exists(src):
            dst = os.path.join(tmp, "out.safetensors")
            old = mh.st_read(model, dtype=None)
            base = {n: t for n, t in old.items() if not n.startswith("mtp.")}
            only = os.path.join(tmp, "base.safetensors")
            # the file without its head, then the head appended again
            _write_plain(only, base)
            mh.st_append(only, dst, {n: t for n, t in old.items() if n.startswith("mtp.")})
            assert mh.st_same_tensors(only, dst) == [], "old tensors changed"
            assert mh.st_same_tensors(src, dst) == [], "tensors differ from the original"

        # Training moves the loss down (fp32, the engine's hidden states).
        head.float()
        torch.manual_seed(1)
        head.init_weights()
        opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
        h32, e32, w32 = hidden[None].float(), emb.float(), win
        first = None
        for step in range(30):
            loss = mh.combine(mh.head_losses(head, h32, w32, e32, depth=2), [1.0, 0.5], 0.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = float(loss) if first is None else first
        last = float(loss)
        assert last < 0.5 * first, f"{name}: loss {first:.3f} -> {last:.3f}"
        print(f"{name}: torch head vs reference {e_ref:.2g}, vs engine {e_eng:.2g}, drafts {own}; "
              f"30 steps on one window: loss {first:.3f} -> {last:.3f}")


def _write_plain(path, tensors):
    """A safetensors file holding `tensors` (no metadata), for st_append."""
    import json
    import struct
    hdr, blobs, off = {}, [], 0
    for n in sorted(tensors):
        t = tensors[n].contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        hdr[n] = {"dtype": mh.ST_NAMES[t.dtype], "shape": list(t.shape),
                  "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


check("tied", ["--mtp"], 4)
check("release", ["--layout", "release"], 3)
print("ok: the torch MTP head matches the plain-Python reference and the engine")
