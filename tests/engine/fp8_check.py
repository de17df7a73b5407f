#!/usr/bin/env python3
"""`tandem logits --weights fp8` against the same model with its matrices
rounded here, independently of the engine: numpy rounds every projection
matrix (and an untied LM head) to the nearest FP8 E4M3 value (the OCP table,
ties to the even code) under the least power-of-two scale that keeps the
largest magnitude within 448, writes the rounded values as a bf16 checkpoint,
and the engine's logits from the original checkpoint with --weights fp8 must
be those of the rounded checkpoint, bit for bit. Bad values get a clear error."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

tandem, model = sys.argv[1], sys.argv[2]

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


def logits(mdir, extra):
    out = os.path.join(tmp, "l.npy")
    p = subprocess.run([tandem, "logits", "--model", mdir, "--ids", "1,5,9,14,2,7",
                        "--then", "3,8", "--out", out] + extra, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"FAIL: tandem logits {extra}: rc {p.returncode}\n{p.stderr}")
    return np.load(out)


with tempfile.TemporaryDirectory() as tmp:
    head, data = read_st(os.path.join(model, "model.safetensors"))
    cfg = json.load(open(os.path.join(model, "config.json")))
    tensors, nround, scales = {}, 0, set()
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = data[a:b]
        if t["dtype"] == "BF16" and name.endswith(PRODUCTS + ("lm_head.weight",)) \
                and t["shape"][1] % 64 == 0:
            w = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
            r, e = rounded(w.astype(np.float64))
            r32 = r.astype(np.float32)
            assert (r32.astype(np.float64) == r).all(), name  # exact in f32
            bits = r32.view(np.uint32)
            assert (bits & 0xFFFF == 0).all(), f"{name}: a rounded value is not a bf16"
            buf = (bits >> 16).astype(np.uint16).tobytes()
            nround += 1
            scales.add(e)
        tensors[name] = (t["dtype"], t["shape"], bytes(buf))
    assert nround >= 4 * cfg["num_hidden_layers"], nround
    rdir = os.path.join(tmp, "rounded")
    os.makedirs(rdir)
    for f in os.listdir(model):
        if f != "model.safetensors" and os.path.isfile(os.path.join(model, f)):
            shutil.copy(os.path.join(model, f), rdir)
    write_st(os.path.join(rdir, "model.safetensors"), head, tensors)

    ref = logits(rdir, [])
    got = logits(model, ["--weights", "fp8"])
    plain = logits(model, [])
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
        f"fp8 logits differ from the rounded checkpoint's: max|d| {np.abs(got - ref).max()}"
    assert not np.array_equal(got, plain), "fp8 logits equal the checkpoint's: nothing was rounded"
    d = float(np.abs(got - plain).max() / np.abs(plain).max())
    agree = float((got.argmax(1) == plain.argmax(1)).mean())
    print(f"{os.path.basename(model)}: --weights fp8 == numpy's rounding of {nround} matrices "
          f"(scales 2^{min(scales)}..2^{max(scales)}) bit for bit; against the checkpoint "
          f"max|d|/max {d:.3g}, argmax agreement {agree:.2f}")

    p = subprocess.run([tandem, "logits", "--model", model, "--ids", "1", "--weights", "fp4"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--weights is checkpoint or fp8" in p.stderr, p.stderr
print("fp8 weights: ok")
