"""The MTP head of a Qwen3.5/3.6 checkpoint as a torch module: the math that
tools/mtp_reference.py checks the engine against and that tools/train_mtp.py
trains, in one place so that the two cannot drift apart.

One row at position p (engine/mtp.h; engine/README.md, MTP, gives the
sources of the convention):

    e = rmsnorm(embed(token[p+1])) * (1 + pre_fc_norm_embedding)
    g = rmsnorm(hidden[p]) * (1 + pre_fc_norm_hidden)
    x = fc(cat(e, g))                                     # [H, 2H], e first
    x = x + gated_attention(input_layernorm(x))           # layers.0, own KV, position p
    x = x + mlp(post_attention_layernorm(x))
    y = rmsnorm(x) * (1 + norm);  logits = lm_head(y)     # the target's head

`hidden` is the target's state after its final norm. Drafting feeds y back
as the next row's hidden state with the token just drafted.

Parameter names are the checkpoint's without the `mtp.` prefix
(`state_dict()` keys + "mtp." = what engine/mtp.c loads). The embedding and
LM head are the target's and are passed in, never owned.

Two ways to run rows:
  prime(hidden [B,T,H], tokens [B,T]) -> y, x, kv: rows at positions 0..T-1,
      causal over each other (row p attends to rows 0..p);
  chain(hidden [B,A,H], tokens [B,A], anchors [B,A], kv, past) -> y, x: one
      draft step for A chains at once; a chain anchored at primed row a is at
      depth d = len(past) + 1 and sits at position a + d; it attends to the
      primed rows 0..a and to its own earlier draft rows (past, which gets
      this step's keys appended). With anchors = every position this trains
      draft step d + 1 in parallel; with one anchor per sequence it drafts.
Padding on the right of a batch is harmless: a primed row never attends to
a later one, and a chain only to primed rows at or before its anchor.
"""
import torch
import torch.nn.functional as F
from torch import nn

TENSOR_NAMES = [
    "fc.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "norm.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.self_attn.q_norm.weight",
    "layers.0.self_attn.k_norm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
]


def head_config(c):
    """The head's shapes from a text config (a dict as in config.json, or a
    transformers config object): the target's full-attention layer shapes."""
    g = (lambda k, d=None: c.get(k, d)) if isinstance(c, dict) else \
        (lambda k, d=None: getattr(c, k, d))
    H, nH = g("hidden_size"), g("num_attention_heads", 16)
    D = g("head_dim") or H // nH
    rp = g("rope_parameters") or {}
    theta = rp.get("rope_theta", g("rope_theta", 10000.0))
    prf = rp.get("partial_rotary_factor", g("partial_rotary_factor", 0.25))
    return dict(H=H, I=g("intermediate_size"), nH=nH, nKV=g("num_key_value_heads", 4), D=D,
                rot=int(D * prf), theta=float(theta), eps=float(g("rms_norm_eps", 1e-6)))


class RMSNorm(nn.Module):
    """Qwen3.5's zero-centred RMSNorm: x / rms(x) * (1 + w), in fp32."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())
        return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nH, nKV, D = c["H"], c["nH"], c["nKV"], c["D"]
        self.q_proj = nn.Linear(H, 2 * nH * D, bias=False)   # per head: [query D, gate D]
        self.k_proj = nn.Linear(H, nKV * D, bias=False)
        self.v_proj = nn.Linear(H, nKV * D, bias=False)
        self.o_proj = nn.Linear(nH * D, H, bias=False)
        self.q_norm = RMSNorm(D, c["eps"])
        self.k_norm = RMSNorm(D, c["eps"])


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["H"], c["I"], bias=False)
        self.up_proj = nn.Linear(c["H"], c["I"], bias=False)
        self.down_proj = nn.Linear(c["I"], c["H"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["H"], c["eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["H"], c["eps"])
        self.mlp = MLP(c)


class MTPHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = dict(c)
        H = c["H"]
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(H, c["eps"])
        self.pre_fc_norm_hidden = RMSNorm(H, c["eps"])
        self.layers = nn.ModuleList([Layer(c)])
        self.norm = RMSNorm(H, c["eps"])
        rot = c["rot"]
        self.register_buffer("inv_freq", 1.0 / (c["theta"] ** (
            torch.arange(0, rot, 2, dtype=torch.float32) / rot)), persistent=False)

    # ---- pieces ---------------------------------------------------------

    def init_weights(self, std=0.02, generator=None):
        """transformers' initialisation for the target's layers: normal(std)
        matrices, zero norms (scale 1 + 0)."""
        for name, p in self.named_parameters():
            with torch.no_grad():
                if p.ndim == 2:
                    p.normal_(0.0, std, generator=generator)
                else:
                    p.zero_()

    def rope(self, x, pos):
        """Rotate-half RoPE on the first `rot` dims. x [..., P, D], pos [..., P]
        (broadcast against x's leading dims) in positions."""
        rot = self.c["rot"]
        f = pos.to(torch.float32).unsqueeze(-1) * self.inv_freq        # [..., P, rot/2]
        f = torch.cat([f, f], -1)
        cos, sin = f.cos(), f.sin()
        r = x[..., :rot].float()
        half = rot // 2
        rh = torch.cat([-r[..., half:], r[..., :half]], -1)
        return torch.cat([(r * cos + rh * sin).to(x.dtype), x[..., rot:]], -1)

    def _in(self, hidden, tokens, embed):
        dt = self.fc.weight.dtype   # the inputs in the head's dtype (autocast lowers it after)
        e = self.pre_fc_norm_embedding(F.embedding(tokens, embed).to(dt))
        g = self.pre_fc_norm_hidden(hidden.to(dt))
        return self.fc(torch.cat([e, g], -1))

    def _qkv(self, x, pos):
        """x [B, P, H] -> q [B, nH, P, D], gate [B, P, nH*D], k, v [B, nKV, P, D]."""
        c, a = self.c, self.layers[0].self_attn
        B, P, _ = x.shape
        nH, nKV, D = c["nH"], c["nKV"], c["D"]
        qg = a.q_proj(x).view(B, P, nH, 2 * D)
        q, gate = qg[..., :D], qg[..., D:]
        q = self.rope(a.q_norm(q).transpose(1, 2), pos[:, None, :])
        k = self.rope(a.k_norm(a.k_proj(x).view(B, P, nKV, D)).transpose(1, 2), pos[:, None, :])
        v = a.v_proj(x).view(B, P, nKV, D).transpose(1, 2)
        return q, gate.reshape(B, P, nH * D), k, v

    def _out(self, x, o, gate):
        """Gated attention output o [B, P, nH*D] -> the rest of the layer, y and x."""
        lay = self.layers[0]
        x = x + lay.self_attn.o_proj(o * torch.sigmoid(gate))
        x = x + lay.mlp(lay.post_attention_layernorm(x))
        return self.norm(x), x

    def _rep(self, t):
        r = self.c["nH"] // self.c["nKV"]
        return t if r == 1 else t.repeat_interleave(r, 1)

    # ---- rows -----------------------------------------------------------

    def prime(self, hidden, tokens, embed):
        """Rows at positions 0..T-1 of each sequence. Returns y, x [B, T, H]
        and kv = (k, v) [B, nKV, T, D] for chain()."""
        B, T = tokens.shape
        x = self._in(hidden, tokens, embed)
        pos = torch.arange(T, device=x.device)[None, :].expand(B, T)
        xn = self.layers[0].input_layernorm(x)
        q, gate, k, v = self._qkv(xn, pos)
        D = self.c["D"]
        s = (q @ self._rep(k).transpose(-1, -2)).float() * D ** -0.5      # [B, nH, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1).to(v.dtype)
        o = (p @ self._rep(v)).transpose(1, 2).reshape(B, T, -1)
        y, x = self._out(x, o, gate)
        return y, x, (k, v)

    def chain(self, hidden, tokens, anchors, embed, kv, past):
        """One draft step of chains anchored at primed rows `anchors` [B, A]
        (see the module doc). hidden: the previous step's y [B, A, H];
        tokens: the token each chain takes now [B, A]; past: list of (k, v)
        [B, nKV, A, D] of the chains' earlier draft steps, appended to."""
        B, A = tokens.shape
        D = self.c["D"]
        depth = len(past) + 1
        x = self._in(hidden, tokens, embed)
        xn = self.layers[0].input_layernorm(x)
        q, gate, k, v = self._qkv(xn, anchors + depth)
        past.append((k, v))
        K0, V0 = kv
        T = K0.shape[2]
        s0 = (q @ self._rep(K0).transpose(-1, -2)).float() * D ** -0.5      # [B, nH, A, T]
        seen = torch.arange(T, device=x.device)[None, None, :] <= anchors[:, :, None]
        s0 = s0.masked_fill(~seen[:, None], float("-inf"))
        Kc = self._rep(torch.stack([pk for pk, _ in past], -2))              # [B, nH, A, d, D]
        Vc = self._rep(torch.stack([pv for _, pv in past], -2))
        sc = (q.unsqueeze(-2) * Kc).sum(-1).float() * D ** -0.5              # [B, nH, A, d]
        p = torch.softmax(torch.cat([s0, sc], -1), -1).to(v.dtype)
        o = p[..., :T] @ self._rep(V0) + (p[..., T:].unsqueeze(-1) * Vc).sum(-2)
        o = o.transpose(1, 2).reshape(B, A, -1)
        return self._out(x, o, gate)

    def draft(self, hidden, tokens, lengths, embed, lm_head, k):
        """Greedy drafts for a batch of right-padded sequences, as a drafting
        round does (engine/mtp.h): hidden [B, T, H] the target's states of
        positions 0..T-1, tokens [B, T] the token after each (row p gets
        token p+1), lengths [B] primed rows per sequence. Returns drafts
        [B, k] (argmax; torch breaks ties by the lowest id too)."""
        y, _, kv = self.prime(hidden, tokens, embed)
        a = (lengths - 1).long()[:, None]                                    # [B, 1]
        yl = y.gather(1, a[:, :, None].expand(-1, -1, y.shape[-1]))         # [B, 1, H]
        out = [(yl[:, 0].float() @ lm_head.float().t()).argmax(-1)]
        past = []
        for _ in range(1, k):
            yl, _ = self.chain(yl, out[-1][:, None], a, embed, kv, past)
            out.append((yl[:, 0].float() @ lm_head.float().t()).argmax(-1))
        return torch.stack(out, 1)

    # ---- checkpoint -------------------------------------------------------

    def load_tensors(self, tensors, prefix="mtp."):
        """From a {name: tensor} map of the checkpoint (names with `prefix`)."""
        sd = {n: tensors[prefix + n] for n in TENSOR_NAMES if prefix + n in tensors}
        missing = [prefix + n for n in TENSOR_NAMES if prefix + n not in tensors]
        if missing:
            raise KeyError(f"no MTP head tensor {missing[0]}" +
                           (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        self.load_state_dict(sd, strict=True)
        return self

    def tensors(self, prefix="mtp.", dtype=torch.bfloat16):
        """{checkpoint name: tensor on the CPU} in `dtype`."""
        sd = self.state_dict()
        assert sorted(sd) == sorted(TENSOR_NAMES), sorted(set(sd) ^ set(TENSOR_NAMES))
        return {prefix + n: sd[n].detach().to("cpu", dtype).contiguous() for n in TENSOR_NAMES}


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def lm_logits(y, lm_head):
    return y @ lm_head.t().to(y.dtype)


def ce_loss(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def kl_loss(logits, teacher_logits):
    """KL(teacher || head) per row, mean over rows."""
    V = logits.shape[-1]
    return F.kl_div(F.log_softmax(logits.float().reshape(-1, V), -1),
                    F.log_softmax(teacher_logits.float().reshape(-1, V), -1),
                    log_target=True, reduction="batchmean")


def head_losses(head, hidden, ids, embed, depth=1, teacher=None, distill=0.0):
    """Teacher-forced losses of one window. hidden [B, T, H]: the target's
    states after its final norm at positions 0..T-1; ids [B, T+1] the tokens
    at positions 0..T; teacher: None or the target's logits [B, T, V] (row q
    predicts token q+1). Step 1: row p (hidden[p], ids[p+1]) predicts
    ids[p+2]; step d > 1: the chain anchored at p (y of step d-1, ids[p+d])
    predicts ids[p+d+1]. Returns a list of (ce, kl or None, top-1 agreement
    with the teacher or None), one per step; each step's loss is
    (1 - distill) * ce + distill * kl."""
    B, T = hidden.shape[:2]
    y, _, kv = head.prime(hidden[:, :T - 1], ids[:, 1:T], embed)
    out = []
    past = []
    anchors = torch.arange(T - 1, device=hidden.device)[None, :].expand(B, T - 1)
    for d in range(1, depth + 1):
        n = T - d                                # rows whose target ids[p+d+1] is in the window
        if d > 1:
            # Every chain runs (T - 1 of them, so that `past` keeps one
            # shape); the last d - 2 take a stand-in token and go unscored.
            tok = ids[:, d:]
            if tok.shape[1] < T - 1:
                tok = torch.cat([tok, tok[:, -1:].expand(B, T - 1 - tok.shape[1])], 1)
            y, _ = head.chain(y, tok, anchors, embed, kv, past)
        lg = lm_logits(y[:, :n], embed)
        ce = ce_loss(lg, ids[:, d + 1:d + 1 + n])
        kl = agree = None
        if teacher is not None:
            tl = teacher[:, d:d + n]
            if distill > 0:
                kl = kl_loss(lg, tl)
            with torch.no_grad():
                agree = (lg.argmax(-1) == tl.argmax(-1)).float().mean()
        out.append((ce, kl, agree))
    return out


def combine(losses, weights, distill):
    total = 0.0
    for (ce, kl, _), w in zip(losses, weights):
        step = ce if kl is None else (1.0 - distill) * ce + distill * kl
        total = total + w * step
    return total


def per_position(hist):
    """Acceptance per draft position from a histogram of accepted drafts per
    round (hist[a]: rounds that accepted a of k): position j's rate is
    P(draft j accepted | drafts 1..j-1 accepted); None where no round got
    that far."""
    k = len(hist) - 1
    out = []
    reach = sum(hist)
    for j in range(1, k + 1):
        ok = reach - hist[j - 1]
        out.append(ok / reach if reach else None)
        reach = ok
    return out


# ---- checkpoint files (no `safetensors` package needed) ------------------

ST_DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}
ST_NAMES = {v[0]: k for k, v in ST_DTYPES.items()}


def st_header(path):
    """(header dict without __metadata__, metadata or None, data start)."""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", None)
    return hdr, meta, 8 + n


def st_read(d, prefixes=None, dtype=torch.float32):
    """Tensors of the checkpoint folder d (one file or an index of shards) by
    name, as `dtype` (None: as stored); only names starting with one of
    `prefixes` when given."""
    import json
    import os
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    out = {}
    for fn in files:
        p = os.path.join(d, fn)
        hdr, _, base = st_header(p)
        with open(p, "rb") as f:
            for name, e in hdr.items():
                if prefixes and not name.startswith(tuple(prefixes)):
                    continue
                if e["dtype"] not in ST_DTYPES:
                    raise ValueError(f"{p}: {name}: dtype {e['dtype']}")
                a, b = e["data_offsets"]
                f.seek(base + a)
                raw = bytearray(f.read(b - a))
                tdt = ST_DTYPES[e["dtype"]][0]
                t = torch.frombuffer(raw, dtype=torch.int16 if tdt == torch.bfloat16 else tdt)
                if tdt == torch.bfloat16:
                    t = t.view(torch.bfloat16)
                t = t.reshape(e["shape"])
                out[name] = t if dtype is None else t.to(dtype)
    return out


def st_append(src, dst, tensors):
    """Writes dst = the safetensors file src with `tensors` ({name: CPU
    tensor}) added after its data. The old tensors' bytes are copied
    unchanged (same names, dtypes, shapes and data), the header keeps its
    metadata and is padded to 8 bytes as the safetensors library pads it.
    A name already in src is an error."""
    import json
    import struct
    hdr, meta, base = st_header(src)
    clash = sorted(set(hdr) & set(tensors))
    if clash:
        raise ValueError(f"{src} already holds {clash[0]}")
    end = max((e["data_offsets"][1] for e in hdr.values()), default=0)
    new = dict(hdr)
    blobs = []
    off = end
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        new[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape),
                     "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    full = dict(new)
    if meta is not None:
        full["__metadata__"] = meta
    h = json.dumps(full, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    tmp = dst + ".tmp"
    with open(src, "rb") as f, open(tmp, "wb") as g:
        g.write(struct.pack("<Q", len(h)))
        g.write(h)
        f.seek(base)
        left = end
        while left > 0:
            chunk = f.read(min(left, 1 << 24))
            if not chunk:
                raise IOError(f"{src}: data ends early")
            g.write(chunk)
            left -= len(chunk)
        for raw in blobs:
            g.write(raw)
    import os
    os.replace(tmp, dst)


def st_same_tensors(a, b, names=None):
    """Names (of `names`, default all of a's) whose dtype, shape or bytes
    differ between safetensors files a and b, or that b lacks."""
    ha, _, ba = st_header(a)
    hb, _, bb = st_header(b)
    bad = []
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for name in (names or sorted(ha)):
            ea, eb = ha[name], hb.get(name)
            if eb is None or ea["dtype"] != eb["dtype"] or ea["shape"] != eb["shape"]:
                bad.append(name)
                continue
            (a0, a1), (b0, b1) = ea["data_offsets"], eb["data_offsets"]
            fa.seek(ba + a0)
            fb.seek(bb + b0)
            if a1 - a0 != b1 - b0 or fa.read(a1 - a0) != fb.read(b1 - b0):
                bad.append(name)
    return bad
