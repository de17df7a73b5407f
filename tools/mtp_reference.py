#!/usr/bin/env python3
"""A torch reference of the MTP head of a Qwen3.5/3.6 checkpoint, against the
engine's (engine/mtp.h, `tandem logits --mtp-out`).

transformers (5.17) loads a Qwen3.5 checkpoint without its mtp.* tensors and
never runs the head, so this script does it by hand: the target through
transformers (Qwen3_5ForCausalLM, fp32, eager attention) for its hidden
states, then the MTP math in plain torch (tools/mtp_head.py, the module that
tools/train_mtp.py trains, so reference and trainer share one definition)
from the mtp.* tensors read with `safetensors`:

    e = rmsnorm(embed(token[p+1])) * (1 + pre_fc_norm_embedding)
    g = rmsnorm(hidden[p]) * (1 + pre_fc_norm_hidden)
    x = fc(cat(e, g))                      # [H, 2H], embedding half first
    x = x + gated_attention(input_layernorm(x))          # mtp.layers.0, own KV
    x = x + mlp(post_attention_layernorm(x))
    y = rmsnorm(x) * (1 + mtp.norm);  logits = lm_head(y)  # shared head

with hidden = the target's state after its final norm (what its LM head
reads) and y fed back with the drafted token on later draft steps: the
convention of vLLM's qwen3_5_mtp.py / qwen3_next_mtp.py and its proposer
(engine/README.md, MTP). The other readings (hidden before the final norm;
the head's x before mtp.norm fed back) are computed too and scored against
the target's own greedy choices: on a released checkpoint the right reading
is the one whose predictions agree with the target (on random weights the
scores mean nothing).

Output (--out DIR): ref_target_logits.npy [T, V], ref_hidden.npy [T, H],
ref_mtp_logits.npy [T + k - 1, V] (row r: the head's row at position r:
primed rows 0..T-1 with the next token, the target's argmax after the last;
then k - 1 draft rows), meta.json. With --tandem, the engine's CPU build runs
the same ids (`tandem logits --out --hidden-out --mtp-out --mtp-draft k`),
the reference's draft rows follow the engine's drafts (so a near-tie cannot
split the chains), and the script prints max|d|/max|ref| for the target's
logits, its hidden states and the MTP logits; it exits 1 when the MTP logits
differ by more than --tol (default 1e-4).

Run where torch and transformers are (the GPU machine), e.g.
    python3 tools/mtp_reference.py --model DIR --tandem build/services/cli/tandem \\
        --draft 4 --out /tmp/mtp_ref [--ids 1,2,3 | --text "..."] [--device cuda]
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np


def log(*a):
    print(*a, flush=True)


def read_config(d):
    c = json.load(open(os.path.join(d, "config.json")))
    t = dict(c["text_config"]) if c.get("model_type") == "qwen3_5" else dict(c)
    tie = c.get("tie_word_embeddings", t.get("tie_word_embeddings", False))
    t["tie_word_embeddings"] = bool(tie)
    return t


def read_tensors(d):
    """Every tensor of the checkpoint as fp32 torch tensors, by name."""
    import torch
    from safetensors import safe_open
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) \
        else ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(d, fn), "pt") as f:
            for k in f.keys():
                if not k.startswith("model.visual."):
                    out[k] = f.get_tensor(k).to(torch.float32)
    return out


def load_target(d, tensors, device):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    t = read_config(d)
    t.pop("model_type", None)
    t.pop("architectures", None)
    prf = (t.get("rope_parameters") or {}).get("partial_rotary_factor")
    try:  # as tools/engine_fixtures.py: some versions want it as a keyword too
        cfg = Qwen3_5TextConfig(**t) if prf is None or "partial_rotary_factor" in t \
            else Qwen3_5TextConfig(partial_rotary_factor=prf, **t)
    except Exception as e:
        log("config: partial_rotary_factor keyword refused:", repr(e))
        cfg = Qwen3_5TextConfig(**t)
    cfg._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(cfg).to(torch.float32)
    sd = {}
    for k, v in tensors.items():
        if k.startswith("mtp."):
            continue
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        sd[k] = v
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"target: missing {missing[:5]} unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval(), cfg


def target_states(model, ids, device):
    """Logits [T, V], hidden after the final norm [T, H], and before it."""
    import torch
    seen = {}
    hook = model.model.norm.register_forward_hook(
        lambda mod, inp, out: seen.update(pre=inp[0].detach()))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=False)
        base = model.model(input_ids=torch.tensor([ids], device=device))
    hook.remove()
    post = base.last_hidden_state[0].float()
    logits = out.logits[0].float()
    d = (model.lm_head(post) - logits).abs().max().item()
    assert d <= 1e-4 * logits.abs().max().item(), \
        f"last_hidden_state is not what the LM head reads (max|d| {d})"
    return logits, post, seen["pre"][0].float()


def make_head(cfg, tensors, device):
    """The checkpoint's head as tools/mtp_head.py's module (the math the
    trainer uses too), fp32."""
    import mtp_head
    head = mtp_head.MTPHead(mtp_head.head_config(cfg))
    try:
        head.load_tensors(tensors)
    except KeyError as e:
        sys.exit(f"the checkpoint has no complete MTP head: {e}")
    return head.float().to(device).eval()


def run_head(head, target, hidden, follow, drafts_in, k, feedback):
    """Primed rows then k - 1 draft rows; drafts from drafts_in when given,
    else the head's own argmax. feedback: 'post' (y) or 'pre' (x)."""
    import torch
    embed = target.model.embed_tokens.weight.float()
    lm_head = target.lm_head.weight.float()
    dev = hidden.device
    y, x, kv = head.prime(hidden[None].float(), torch.tensor([follow], device=dev), embed)
    rows = [y[0] @ lm_head.t()]
    last = y[:, -1:] if feedback == "post" else x[:, -1:]
    drafts = [int(rows[-1][-1].argmax())]
    anchor = torch.tensor([[hidden.shape[0] - 1]], device=dev)
    past = []
    for j in range(1, k):
        tok = drafts_in[j - 1] if drafts_in else drafts[j - 1]
        y, x = head.chain(last, torch.tensor([[tok]], device=dev), anchor, embed, kv, past)
        rows.append(y[0] @ lm_head.t())
        drafts.append(int(rows[-1][-1].argmax()))
        last = y if feedback == "post" else x
    return torch.cat(rows), drafts


def greedy(model, ids, n, device):
    import torch
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].argmax()))
    return ids


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", help="comma-separated token ids (default: 24 fixed pseudo-random ids)")
    ap.add_argument("--text", help="a prompt, tokenized with the checkpoint's tokenizer")
    ap.add_argument("--draft", type=int, default=4)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tandem", help="the tandem CLI: compare with the engine")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    import torch
    import transformers
    torch.manual_seed(0)
    os.makedirs(a.out, exist_ok=True)
    log(f"torch {torch.__version__} transformers {transformers.__version__} device {a.device}")
    tensors = read_tensors(a.model)
    target, cfg = load_target(a.model, tensors, a.device)
    V = cfg.vocab_size
    if a.text:
        from transformers import AutoTokenizer
        ids = AutoTokenizer.from_pretrained(a.model)(a.text)["input_ids"]
    elif a.ids:
        ids = [int(x) for x in a.ids.split(",")]
    else:
        ids = [(i * 7919 + 13) % V for i in range(24)]
    T, k = len(ids), a.draft
    logits, post, pre = target_states(target, ids, a.device)
    nxt = int(logits[-1].argmax())
    follow = ids[1:] + [nxt]
    head = make_head(cfg, tensors, a.device)

    engine = None
    if a.tandem:
        f = {n: os.path.join(a.out, f"engine_{n}.npy") for n in ("logits", "hidden", "mtp")}
        p = subprocess.run([a.tandem, "logits", "--model", a.model, "--ids", ",".join(map(str, ids)),
                            "--out", f["logits"], "--hidden-out", f["hidden"], "--mtp-out", f["mtp"],
                            "--mtp-draft", str(k)], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"tandem logits failed (rc {p.returncode}):\n{p.stdout}{p.stderr}")
        line = [s for s in p.stdout.splitlines() if s.startswith("mtp drafts:")][0]
        engine = dict(drafts=[int(x) for x in line.split(":")[1].split()],
                      **{n: np.load(v) for n, v in f.items()})

    with torch.no_grad():
        follow_drafts = engine["drafts"] if engine else None
        mtp, drafts = run_head(head, target, post, follow, follow_drafts, k, "post")
        # The readings scored against the target's own greedy choices.
        cont = greedy(target, ids, k + 1, a.device)[T:]  # x[T] .. x[T+k]
        scores = {}
        for hid_name, hid in (("post-norm hidden", post), ("pre-norm hidden", pre)):
            for fb in ("post", "pre"):
                m, d = run_head(head, target, hid, follow, None, k, fb)
                teacher = float((m[:T - 1].argmax(-1) == logits[1:].argmax(-1)).float().mean())
                chain = 0
                while chain < k and d[chain] == cont[chain + 1]:
                    chain += 1
                scores[f"{hid_name}, y {'after' if fb == 'post' else 'before'} mtp.norm fed back"] = \
                    (teacher, chain)
        if engine:
            mtp_on_engine, _ = run_head(head, target, torch.tensor(engine["hidden"], device=a.device),
                                        follow, engine["drafts"], k, "post")

    np.save(os.path.join(a.out, "ref_target_logits.npy"), logits.cpu().numpy())
    np.save(os.path.join(a.out, "ref_hidden.npy"), post.cpu().numpy())
    np.save(os.path.join(a.out, "ref_mtp_logits.npy"), mtp.cpu().numpy())
    meta = dict(ids=ids, next=nxt, draft=k, ref_drafts=drafts, target_greedy=cont,
                scores={n: dict(teacher_forced_agreement=s[0], chain_accepted=s[1])
                        for n, s in scores.items()})
    log(f"{T} positions, target argmax after them {nxt}, target greedy {cont}")
    log(f"reference drafts {drafts}")
    for n, (teacher, chain) in scores.items():
        log(f"  {n}: head agrees with the target at {100 * teacher:.1f}% of positions; "
            f"{chain}/{k} drafts accepted")
    rc = 0
    if engine:
        e_log = rel(engine["logits"], logits.cpu().numpy())
        e_hid = rel(engine["hidden"], post.cpu().numpy())
        e_mtp = rel(engine["mtp"], mtp.cpu().numpy())
        e_mtp_own = rel(engine["mtp"], mtp_on_engine.cpu().numpy())
        meta.update(engine_drafts=engine["drafts"], rel_target_logits=e_log, rel_hidden=e_hid,
                    rel_mtp=e_mtp, rel_mtp_on_engine_hidden=e_mtp_own)
        log(f"engine drafts {engine['drafts']}")
        log(f"max|d|/max|ref|: target logits {e_log:.3g}, hidden {e_hid:.3g}, MTP logits {e_mtp:.3g}"
            f" (on the engine's hidden states: {e_mtp_own:.3g}); tolerance {a.tol:g}")
        if e_mtp > a.tol:
            log("FAIL: the engine's MTP logits differ from the reference")
            rc = 1
        else:
            log("ok: the engine's MTP head matches the reference")
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1)
    sys.exit(rc)


if __name__ == "__main__":
    main()
