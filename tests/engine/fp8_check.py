#!/usr/bin/env python3
"""`tandem logits --weights fp8` against the same model with its matrices
rounded here, independently of the engine: numpy rounds every projection
matrix (and the LM head: a tied one is the embedding's table, so the
embedding is rounded with it; and an MTP head's: mtp.fc's two halves, each
on its own scale, and its layer's) to the nearest FP8 E4M3 value (the OCP
table, ties to the even code) under the least power-of-two scale that keeps
the largest magnitude within 448, writes the rounded values as a bf16
checkpoint, and the engine's logits (and its MTP head's logits and drafts)
from the original checkpoint with --weights fp8 must be those of the rounded
checkpoint, bit for bit. Where the model has an MTP head, a checkpoint with
the target's matrices rounded but not the head's gives other MTP logits
(the head is rounded too). Bad values get a clear error.

    fp8_check.py TANDEM MODEL_DIR
    fp8_check.py TANDEM --make BENCH_MAKE_MODEL   (a tiny random checkpoint of
        the release layout: untied LM head, MTP head, a shard and its index)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

# The 127 non-negative finite E4M3 magnitudes by code (0x7f is NaN).
CODES = np.array([(c & 7) * 2.0**-9 if c < 8 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7)
                  for c in range(127)])
PRODUCTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
            "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
            "linear_attn.out_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight")


def rounded(w):
    """w (float64) as the values of its FP8 codes times the matrix's scale."""
    amax = float(np.abs(w).max())
    e = -100
    while amax * 2.0**-e > 448:
        e += 1
    a = np.abs(w) * 2.0**-e
    hi = np.clip(np.searchsorted(CODES, a), 1, 126)  # CODES[hi - 1] <= a <= CODES[hi] mostly
    lo = hi - 1
    dl, dh = a - CODES[lo], CODES[hi] - a
    code = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= CODES[126], 126, code)
    return np.sign(w) * CODES[code] * 2.0**e, e


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return head, raw[8 + n:]


def write_st(path, head, tensors):
    meta = {k: v for k, v in head.items() if k == "__metadata__"}
    blob, off = bytearray(), 0
    for name, (dtype, shape, data) in tensors.items():
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blob += data
        off += len(data)
    h = json.dumps(meta).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def round_bf16(buf, shape, cols=None):
    """bf16 bytes of a [rows, cols] matrix rounded (in column blocks of
    `cols`, each on its own scale); the scales used."""
    w = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
    w = w.reshape(shape[0], shape[1]).astype(np.float64)
    cols = cols or shape[1]
    out, es = np.empty_like(w), []
    for c in range(0, shape[1], cols):
        out[:, c:c + cols], e = rounded(w[:, c:c + cols])
        es.append(e)
    r32 = out.astype(np.float32)
    assert (r32.astype(np.float64) == out).all()  # exact in f32
    bits = r32.view(np.uint32)
    assert (bits & 0xFFFF == 0).all(), "a rounded value is not a bf16"
    return (bits >> 16).astype(np.uint16).tobytes(), es


def rounded_copy(model, rdir, which=lambda name: True):
    """model's checkpoint into rdir with its matrices rounded (those whose
    names `which` takes; a tied LM head is the embedding's table, taken as
    "lm_head.weight"); how many matrices and which scales. A draft
    vocabulary's rows are rows of the rounded LM head."""
    os.makedirs(rdir)
    cfg = json.load(open(os.path.join(model, "config.json")))
    tied = cfg.get("text_config", cfg).get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
    nround, scales = 0, set()
    for f in os.listdir(model):
        src = os.path.join(model, f)
        if not os.path.isfile(src):
            continue
        if not f.endswith(".safetensors"):
            shutil.copy(src, rdir)
            continue
        head, data = read_st(src)
        tensors = {}
        for name, t in head.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            buf = data[a:b]
            as_head = "lm_head.weight" if tied and name.endswith("embed_tokens.weight") \
                and not name.startswith("mtp.") else name
            product = as_head.endswith(PRODUCTS + ("lm_head.weight",)) or name == "mtp.fc.weight"
            if t["dtype"] == "BF16" and product and which(as_head) \
                    and not name.startswith(("model.visual.", "visual.")) \
                    and t["shape"][1] % 64 == 0:
                half = t["shape"][1] // 2 if name == "mtp.fc.weight" else None
                buf, es = round_bf16(buf, t["shape"], half)
                nround += len(es)
                scales.update(es)
            tensors[name] = (t["dtype"], t["shape"], bytes(buf))
        write_st(os.path.join(rdir, f), head, tensors)
    return nround, scales


def logits(tandem, tmp, mdir, extra, mtp=False):
    out = os.path.join(tmp, "l.npy")
    mout = os.path.join(tmp, "m.npy")
    p = subprocess.run([tandem, "logits", "--model", mdir, "--ids", "1,5,9,14,2,7",
                        "--then", "3,8", "--out", out] + extra +
                       (["--mtp-out", mout, "--mtp-draft", "4"] if mtp else []),
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"FAIL: tandem logits {extra}: rc {p.returncode}\n{p.stderr}")
    if not mtp:
        return np.load(out)
    return np.load(out), np.load(mout), p.stdout.strip()


def same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main():
    tandem = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        if sys.argv[2] == "--make":
            model = os.path.join(tmp, "tiny-release")
            subprocess.run([sys.argv[3], "--shape", "tiny", "--out", model, "--layout", "release"],
                           check=True, capture_output=True)
        else:
            model = sys.argv[2]
        cfg = json.load(open(os.path.join(model, "config.json")))
        cfg = cfg.get("text_config", cfg)
        names = set()
        for f in os.listdir(model):
            if f.endswith(".safetensors"):
                names.update(read_st(os.path.join(model, f))[0])
        has_mtp = "mtp.fc.weight" in names
        rdir = os.path.join(tmp, "rounded")
        nround, scales = rounded_copy(model, rdir)
        assert nround >= 4 * cfg["num_hidden_layers"], nround

        ref = logits(tandem, tmp, rdir, [])
        got = logits(tandem, tmp, model, ["--weights", "fp8"])
        plain = logits(tandem, tmp, model, [])
        assert same(got, ref), \
            f"fp8 logits differ from the rounded checkpoint's: max|d| {np.abs(got - ref).max()}"
        assert not np.array_equal(got, plain), \
            "fp8 logits equal the checkpoint's: nothing was rounded"
        d = float(np.abs(got - plain).max() / np.abs(plain).max())
        agree = float((got.argmax(1) == plain.argmax(1)).mean())
        print(f"{os.path.basename(model)}: --weights fp8 == numpy's rounding of {nround} matrices "
              f"(scales 2^{min(scales)}..2^{max(scales)}) bit for bit; against the checkpoint "
              f"max|d|/max {d:.3g}, argmax agreement {agree:.2f}")

        if has_mtp:
            _, mref, dref = logits(tandem, tmp, rdir, [], mtp=True)
            _, mgot, dgot = logits(tandem, tmp, model, ["--weights", "fp8"], mtp=True)
            assert same(mgot, mref), "fp8 MTP logits differ from the rounded checkpoint's: " \
                f"max|d| {np.abs(mgot - mref).max()}"
            assert dgot == dref, (dgot, dref)
            tdir = os.path.join(tmp, "target-rounded")
            rounded_copy(model, tdir, lambda name: not name.startswith("mtp."))
            _, mtarget, _ = logits(tandem, tmp, tdir, [], mtp=True)
            assert not same(mgot, mtarget), "fp8 MTP logits: the head's matrices were not rounded"
            d = float(np.abs(mgot - mtarget).max() / np.abs(mref).max())
            print(f"{os.path.basename(model)}: the MTP head's logits with --weights fp8 == the "
                  f"rounded checkpoint's bit for bit ({dgot}); rounding the target alone gives "
                  f"others (max|d|/max {d:.3g})")

        p = subprocess.run([tandem, "logits", "--model", model, "--ids", "1", "--weights", "fp4"],
                           capture_output=True, text=True)
        assert p.returncode == 2 and "--weights is checkpoint or fp8" in p.stderr, p.stderr
    print("fp8 weights: ok")


if __name__ == "__main__":
    main()
