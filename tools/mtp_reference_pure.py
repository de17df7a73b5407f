#!/usr/bin/env python3
"""The MTP head of a Qwen3.5/3.6 checkpoint in plain Python: no numpy, no
torch, so that CI can check the engine's MTP logits (engine/mtp.h) against an
implementation that shares no code with it. Meant for tiny random models
(hidden <= 64): every product is a Python loop in double precision.

It reads the checkpoint itself (config.json, safetensors with or without an
index; F32, BF16, F16) and takes the target's hidden states after the final
norm as input (the engine's `tandem logits --hidden-out`), because the target
model is not its subject: the engine's target logits are checked against
transformers elsewhere (tools/engine_fixtures.py), and lm_head(hidden) must
give them back (checked by the caller).

One row at position p (the convention of vLLM's qwen3_5_mtp.py and
qwen3_next_mtp.py; engine/README.md, MTP):
    e = rmsnorm(embed[token[p+1]]) * (1 + pre_fc_norm_embedding)
    g = rmsnorm(hidden[p]) * (1 + pre_fc_norm_hidden)
    x = fc @ cat(e, g)
    x = x + attn(input_layernorm(x));  x = x + mlp(post_attention_layernorm(x))
    y = rmsnorm(x) * (1 + mtp.norm);  logits = lm_head @ y
and draft rows feed y back as the next row's hidden state.

Usage (what tests/engine/mtp_check.py does):
    mtp_reference_pure.py --model DIR --hidden H.npy --drafts 5,7,9 --out REF.npy
writes float32 [T + k - 1, vocab]: rows 0..T-1 the head primed at every
position with the next token (the target's argmax after the last, from
lm_head(hidden[T-1])), rows T.. the draft rows fed the given drafts (the
engine's, so that a near-tie cannot send the two chains apart), and prints
the target argmax it used and its own greedy drafts.
"""
import json
import math
import os
import struct
import sys


# ---- files --------------------------------------------------------------

def npy_read(path):
    """A little-endian float32 C-order .npy: (shape, flat list)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not an .npy file")
    major = data[6]
    hl = struct.unpack("<H", data[8:10])[0] if major == 1 else struct.unpack("<I", data[8:12])[0]
    start = 10 if major == 1 else 12
    header = data[start:start + hl].decode("latin1")
    d = eval(header, {"__builtins__": {}}, {"True": True, "False": False})  # a dict literal
    if d["descr"] not in ("<f4", "=f4") or d["fortran_order"]:
        raise ValueError(f"{path}: expected little-endian float32 in C order, got {d}")
    shape = tuple(d["shape"])
    n = 1
    for s in shape:
        n *= s
    body = data[start + hl:]
    return shape, list(struct.unpack("<%df" % n, body[:4 * n]))


def npy_write(path, rows):
    """rows: a list of equal-length lists -> float32 [len(rows), len(rows[0])]."""
    shape = (len(rows), len(rows[0]))
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % shape
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        for r in rows:
            f.write(struct.pack("<%df" % len(r), *r))


def half_to_float(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


class Checkpoint:
    """Tensors of a safetensors checkpoint by name, read on demand."""

    def __init__(self, d):
        self.dir = d
        self.where = {}  # name -> (file, header entry, data start)
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            files = sorted(set(json.load(open(idx))["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for fn in files:
            p = os.path.join(d, fn)
            with open(p, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                hdr = json.loads(f.read(n))
            for name, e in hdr.items():
                if name != "__metadata__":
                    self.where[name] = (p, e, 8 + n)

    def has(self, name):
        return name in self.where

    def get(self, name, shape=None):
        """The tensor as a flat list of floats (a list of rows for 2-D)."""
        p, e, base = self.where[name]
        if shape is not None and list(e["shape"]) != list(shape):
            raise ValueError(f"{name}: shape {e['shape']}, expected {shape}")
        a, b = e["data_offsets"]
        with open(p, "rb") as f:
            f.seek(base + a)
            raw = f.read(b - a)
        dt = e["dtype"]
        if dt == "F32":
            vals = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif dt == "BF16":
            hs = struct.unpack("<%dH" % (len(raw) // 2), raw)
            vals = list(struct.unpack("<%df" % len(hs), struct.pack("<%dI" % len(hs),
                                                                     *[h << 16 for h in hs])))
        elif dt == "F16":
            vals = [half_to_float(h) for h in struct.unpack("<%dH" % (len(raw) // 2), raw)]
        else:
            raise ValueError(f"{name}: dtype {dt}")
        if len(e["shape"]) == 2:
            cols = e["shape"][1]
            return [vals[i * cols:(i + 1) * cols] for i in range(e["shape"][0])]
        return vals

    def find(self, name):
        """name under the text model's prefixes (model.language_model., model.)."""
        for pre in ("model.language_model.", "model."):
            if self.has(pre + name):
                return pre + name
        raise KeyError(f"{self.dir}: no tensor {name}")


def text_config(d):
    c = json.load(open(os.path.join(d, "config.json")))
    t = c.get("text_config", c) if c.get("model_type") == "qwen3_5" else c
    tie = c.get("tie_word_embeddings", t.get("tie_word_embeddings", False))
    rp = t.get("rope_parameters") or {}
    theta = rp.get("rope_theta", t.get("rope_theta", 10000.0))
    prf = rp.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    H = t["hidden_size"]
    nH = t.get("num_attention_heads", 16)
    D = t.get("head_dim", H // nH)
    return dict(H=H, I=t["intermediate_size"], V=t["vocab_size"], nH=nH,
                nKV=t.get("num_key_value_heads", 4), D=D, rot=int(D * prf), theta=float(theta),
                eps=float(t.get("rms_norm_eps", 1e-6)), tie=bool(tie))


# ---- math ---------------------------------------------------------------

def matvec(w, x):
    return [sum(a * b for a, b in zip(row, x)) for row in w]


def rmsnorm(x, w, eps):
    """Qwen3.5's zero-centred RMSNorm: x / rms(x) * (1 + w)."""
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * (1.0 + wi) for v, wi in zip(x, w)]


def silu(v):
    return v / (1.0 + math.exp(-v))


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def rope(x, pos, rot, theta):
    """Rotate-half on the first rot dims of one head."""
    half = rot // 2
    out = list(x)
    for i in range(half):
        f = pos * (1.0 / theta ** (2 * i / rot))
        c, s = math.cos(f), math.sin(f)
        x1, x2 = x[i], x[i + half]
        out[i] = x1 * c - x2 * s
        out[i + half] = x2 * c + x1 * s
    return out


class MTPHead:
    def __init__(self, d):
        self.c = c = text_config(d)
        ck = Checkpoint(d)
        H, I, V, nH, nKV, D = c["H"], c["I"], c["V"], c["nH"], c["nKV"], c["D"]
        self.embed = ck.get(ck.find("embed_tokens.weight"), [V, H])
        self.lm_head = self.embed if c["tie"] else ck.get("lm_head.weight", [V, H])
        if not ck.has("mtp.fc.weight"):
            raise KeyError(f"{d}: the checkpoint has no mtp.fc.weight")
        self.fc = ck.get("mtp.fc.weight", [H, 2 * H])
        self.ne = ck.get("mtp.pre_fc_norm_embedding.weight", [H])
        self.nh = ck.get("mtp.pre_fc_norm_hidden.weight", [H])
        self.norm = ck.get("mtp.norm.weight", [H])
        p = "mtp.layers.0."
        self.in_norm = ck.get(p + "input_layernorm.weight", [H])
        self.post_norm = ck.get(p + "post_attention_layernorm.weight", [H])
        self.q_proj = ck.get(p + "self_attn.q_proj.weight", [2 * nH * D, H])
        self.k_proj = ck.get(p + "self_attn.k_proj.weight", [nKV * D, H])
        self.v_proj = ck.get(p + "self_attn.v_proj.weight", [nKV * D, H])
        self.o_proj = ck.get(p + "self_attn.o_proj.weight", [H, nH * D])
        self.q_norm = ck.get(p + "self_attn.q_norm.weight", [D])
        self.k_norm = ck.get(p + "self_attn.k_norm.weight", [D])
        self.gate = ck.get(p + "mlp.gate_proj.weight", [I, H])
        self.up = ck.get(p + "mlp.up_proj.weight", [I, H])
        self.down = ck.get(p + "mlp.down_proj.weight", [H, I])
        self.keys, self.vals = [], []  # per position: [nKV][D]

    def logits(self, y):
        return matvec(self.lm_head, y)

    def row(self, hidden, token):
        """The row at the next position: returns y (after mtp.norm)."""
        c = self.c
        H, nH, nKV, D, eps = c["H"], c["nH"], c["nKV"], c["D"], c["eps"]
        pos = len(self.keys)
        e = rmsnorm(self.embed[token], self.ne, eps)
        g = rmsnorm(hidden, self.nh, eps)
        x = matvec(self.fc, e + g)  # cat(e, g): embedding first
        xn = rmsnorm(x, self.in_norm, eps)
        qg = matvec(self.q_proj, xn)
        kk = matvec(self.k_proj, xn)
        vv = matvec(self.v_proj, xn)
        q = [rope(rmsnorm(qg[h * 2 * D:h * 2 * D + D], self.q_norm, eps), pos, c["rot"], c["theta"])
             for h in range(nH)]
        gate = [qg[h * 2 * D + D:h * 2 * D + 2 * D] for h in range(nH)]
        self.keys.append([rope(rmsnorm(kk[j * D:(j + 1) * D], self.k_norm, eps), pos, c["rot"],
                               c["theta"]) for j in range(nKV)])
        self.vals.append([vv[j * D:(j + 1) * D] for j in range(nKV)])
        o = []
        for h in range(nH):
            j = h // (nH // nKV)
            s = [sum(a * b for a, b in zip(q[h], self.keys[t][j])) / math.sqrt(D)
                 for t in range(pos + 1)]
            mx = max(s)
            ex = [math.exp(v - mx) for v in s]
            z = sum(ex)
            oh = [sum(ex[t] / z * self.vals[t][j][d] for t in range(pos + 1)) for d in range(D)]
            o += [v * sigmoid(gv) for v, gv in zip(oh, gate[h])]
        x = [a + b for a, b in zip(x, matvec(self.o_proj, o))]
        xn = rmsnorm(x, self.post_norm, eps)
        hmid = [silu(a) * b for a, b in zip(matvec(self.gate, xn), matvec(self.up, xn))]
        x = [a + b for a, b in zip(x, matvec(self.down, hmid))]
        return rmsnorm(x, self.norm, eps)


def argmax(v):
    return max(range(len(v)), key=lambda i: (v[i], -i))


def run(model, hidden_rows, tokens, drafts):
    """Rows of logits [T + len(drafts) - 1, V] (see the module doc), the
    target's argmax after the last position and the head's own drafts."""
    head = MTPHead(model)
    T = len(hidden_rows)
    nxt = argmax(head.logits(hidden_rows[-1]))
    follow = list(tokens[1:T]) + [nxt]
    out, y = [], None
    for p in range(T):
        y = head.row(hidden_rows[p], follow[p])
        out.append(head.logits(y))
    own = [argmax(out[-1])]
    for j in range(1, len(drafts)):
        y = head.row(y, drafts[j - 1])
        out.append(head.logits(y))
        own.append(argmax(out[-1]))
    return out, nxt, own


def main():
    a = sys.argv[1:]
    opt = {a[i]: a[i + 1] for i in range(0, len(a) - 1, 2)}
    if not {"--model", "--hidden", "--tokens", "--drafts", "--out"} <= set(opt):
        sys.exit("usage: mtp_reference_pure.py --model DIR --hidden H.npy --tokens 1,2,3 "
                 "--drafts 5,7 --out REF.npy")
    shape, flat = npy_read(opt["--hidden"])
    H = shape[1]
    hidden = [flat[i * H:(i + 1) * H] for i in range(shape[0])]
    tokens = [int(t) for t in opt["--tokens"].split(",")]
    drafts = [int(t) for t in opt["--drafts"].split(",")]
    if len(tokens) != len(hidden):
        sys.exit(f"{len(tokens)} tokens for {len(hidden)} hidden states")
    out, nxt, own = run(opt["--model"], hidden, tokens, drafts)
    npy_write(opt["--out"], out)
    print("target argmax after the last position:", nxt)
    print("reference drafts:", " ".join(map(str, own)))


if __name__ == "__main__":
    main()
