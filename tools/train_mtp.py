#!/usr/bin/env python3
"""Train the MTP head of the demo target (models/demo-target): one
multi-token-prediction layer (`mtp.*` tensors, `mtp_num_hidden_layers: 1`)
that the `drafter_kind: mtp` drafter runs on the target's hidden states.

The target is frozen. Its hidden states after the final norm (what its LM
head reads) come from transformers, on the same Python sources the demo pair
was trained on (tools/train_demo.py's corpus, split and tokenizer). The head
is tools/mtp_head.py's module (the math tools/mtp_reference.py checks the
engine against): row p takes hidden[p] and token[p+1] and predicts
token[p+2]; the embedding and the tied LM head are the target's.

Several variants of the objective train side by side on the same batches
and from the same initial weights (--variants, default all three):
  ce      cross-entropy against token[p+2] (teacher forcing: the target's
          hidden states, the data's tokens);
  ce+d2   plus half the cross-entropy of draft step 2 (y fed back as the
          hidden state with token[p+2], predicting token[p+3]), since
          drafting re-applies the head;
  kd+d2   as ce+d2 with each step's loss half CE, half KL(target || head)
          (the target's distribution for the same token).
Each is measured by greedy speculative acceptance on held-out prompts (as
tools/train_demo.py measured the demo drafter: same prompts, 128 new tokens,
blocks of 4, everything recomputed); the best mean accepted length at block
4 is shipped, and block 8 is measured for it.

One run on the GPU machine (torch, transformers 5.17, tokenizers, the same
site-packages as the demo training), from the repository root:

    python3 tools/train_mtp.py --out $OUT/mtp

writes into --out (nothing under models/ changes):
  model.safetensors   models/demo-target/model.safetensors with the mtp.* tensors
                      (bf16) added; every old tensor byte-identical (checked)
  config.json         the target's config.json with "mtp_num_hidden_layers": 1
  mtp_metrics.json    everything measured (the "mtp_head" section of
                      models/train_metrics.json)
  train_mtp.log       the console output
  card.md             the models/README.md section, numbers filled in
Then, here: `python3 tools/train_mtp.py --install DIR` copies the first two
into models/demo-target, merges the metrics into models/train_metrics.json,
puts the log at models/train_mtp.log and the section into models/README.md,
and checks models/ stays within 16,000,000 bytes.

Time: --max-seconds (default 285) bounds the whole run; training gets what
is left after the set-up minus a reserve for measuring and writing, the
step count comes from a throughput probe (or --steps), and training stops at
the deadline whatever the plan, the head still written.

Local check without transformers (no GPU): --engine-check DIR trains on
hidden states from the engine (`tandem logits --hidden-out`): see
`engine_check`.
"""

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_demo as td  # noqa: E402

SEED = td.SEED + 2
VARIANTS = {
    # name: (step weights, distillation weight)
    "ce": ([1.0], 0.0),
    "ce+d2": ([1.0, 0.5], 0.0),
    "kd+d2": ([1.0, 0.5], 0.5),
}
README_BEGIN = "<!-- mtp-head: begin (tools/train_mtp.py --install) -->"
README_END = "<!-- mtp-head: end -->"
MODELS_BUDGET = 16_000_000

T0 = time.time()
_LOG = None


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    if _LOG:
        _LOG.write(line + "\n")
        _LOG.flush()


def fail(msg):
    log(f"FAILED: {msg}")
    sys.exit(f"train_mtp: {msg}")


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------ measuring ---

def mtp_proposer(tgt, head, embed, pad, dev, deadline=None):
    """Drafts by the MTP head, as a drafting round (engine/mtp.h): the
    target's states of the sequence's positions but the last (recomputed, no
    cache), each with the token after it, then k greedy drafts. The head
    computes in fp32 from its (bf16-rounded) weights, as the engine does."""
    import torch
    lm = tgt.lm_head.weight.float()

    def propose(cur, k):
        if deadline and time.time() > deadline:
            raise TimeoutError("out of time")
        _, hid = td.padded_forward(tgt, cur, pad, dev, hidden=True)
        B, L = len(cur), max(len(c) for c in cur)
        nxt = torch.full((B, L - 1), pad, dtype=torch.long)
        for i, c in enumerate(cur):
            nxt[i, :len(c) - 1] = torch.tensor(c[1:], dtype=torch.long)
        lengths = torch.tensor([len(c) - 1 for c in cur], device=dev)
        with torch.no_grad():
            d = head.draft(hid[:, :L - 1].float(), nxt.to(dev), lengths, embed, lm, k)
        return d.tolist()
    return propose


def teacher_forced(head, tgt, chunks, embed, depth, dev, bs=16):
    """Held-out windows: per draft step d = 1..depth, CE against the data and
    top-1 agreement with the target's argmax for the same token (the head
    fed the data's tokens)."""
    import torch
    import mtp_head as mh
    ce = [0.0] * depth
    agree = [0.0] * depth
    n = 0
    with torch.no_grad():
        for i in range(0, chunks.shape[0], bs):
            b = chunks[i:i + bs].long()
            T = b.shape[1] - 1
            out = tgt.model(input_ids=b[:, :T], use_cache=False).last_hidden_state
            teacher = tgt.lm_head(out)
            res = mh.head_losses(head, out.float(), b, embed, depth=depth, teacher=teacher)
            for d, (c, _, a) in enumerate(res):
                ce[d] += float(c) * b.shape[0]
                agree[d] += float(a) * b.shape[0]
            n += b.shape[0]
    return {"ce": [round(c / n, 4) for c in ce], "top1_agreement_with_target": [round(a / n, 4) for a in agree]}


# ---------------------------------------------------------------- install ---

def card(m):
    """The models/README.md section, from the metrics."""
    def fmt(x):
        return "—" if x is None or x != x else f"{x:.3f}"
    tr, acc, dr = m["training"], m["acceptance"], m.get("drafter_reference") or {}
    best = m["chosen_variant"]
    lines = [README_BEGIN, "", "## MTP head (`mtp.*` in demo-target)", ""]
    lines += [
        "`demo-target/model.safetensors` also carries a multi-token-prediction head "
        "(`config.json`: `mtp_num_hidden_layers: 1`): one gated-attention decoder layer "
        "shaped like the target's full-attention layers, `mtp.fc` [256, 512] and three "
        f"norms, {m['params']['head']:,} parameters, {m['files']['head_bytes']:,} bytes in "
        "bf16 (the embedding and LM head are the target's). It follows engine/mtp.h: row p "
        "takes the target's hidden state after its final norm at p and token p+1 and "
        "predicts token p+2; drafting feeds its output y back with the drafted token. "
        "transformers ignores the `mtp.*` tensors when it loads the target "
        f"(checked: the reloaded target's logits are {m.get('checks', {}).get('target_logits_unchanged', 'NOT CHECKED')}).",
        "",
        f"Trained by `tools/train_mtp.py` (`{m['command']}`), {m['environment']['device']}, "
        f"torch {m['environment']['torch']}, transformers {m['environment']['transformers']}: "
        f"{m['total_seconds']:.0f} s of wall time in all, {tr['seconds']:.0f} s of it training. "
        "The target is frozen (bf16, as shipped); its hidden states come from transformers "
        "on the demo corpus (same files, split and tokenizer: manifest "
        f"`{m['corpus']['manifest_sha256'][:16]}`, tokenizer `{m['tokenizer_sha256'][:16]}`).",
        "",
        "| setting | value |",
        "|---|---|",
        f"| steps | {tr['steps_run']:,} of {tr['batch']} windows × {tr['seq']} tokens "
        f"({tr['tokens_seen']:,} tokens, {tr['epochs']} epoch) |",
        f"| optimiser | AdamW β = (0.9, 0.95), weight decay 0.1 on matrices, clip 1.0; "
        f"lr {tr['lr']:g}, {tr['warmup']} warm-up steps, cosine to 10% |",
        "| precision | bf16 autocast, fp32 master weights; saved as bf16 |",
        f"| initialisation | normal(0, 0.02) matrices, zero norms, after `torch.manual_seed({SEED})` |",
        "",
        "Objectives, trained side by side on the same batches from the same initial weights "
        "(held out: teacher-forced on 64 held-out windows; acceptance: below):",
        "",
        "| variant | objective | held-out CE step 1 / 2 | agreement with target step 1 / 2 "
        "| block 4: mean accepted | block 4: per position |",
        "|---|---|---|---|---|---|",
    ]
    desc = {"ce": "CE(token p+2)", "ce+d2": "CE + 0.5 · CE of draft step 2",
            "kd+d2": "as ce+d2, each step ½ CE + ½ KL(target ‖ head)"}
    for v, r in m["variants"].items():
        h = r["heldout"]
        b4 = r.get("block4", {})
        mark = " **(shipped)**" if v == best else ""
        lines.append(f"| {v}{mark} | {desc.get(v, v)} | {h['ce'][0]:.3f} / {h['ce'][1]:.3f} | "
                     f"{100 * h['top1_agreement_with_target'][0]:.1f}% / "
                     f"{100 * h['top1_agreement_with_target'][1]:.1f}% | "
                     f"{b4.get('mean_accepted', float('nan')):.3f} | "
                     f"{' / '.join(fmt(x) for x in b4.get('per_position', [])) or '—'} |")
    curve = [r for r in tr.get("curve", []) if best in r]
    if curve:
        pick = curve[::max(1, len(curve) // 6)]
        if pick[-1] is not curve[-1]:
            pick.append(curve[-1])
        lines += ["", "Training curve of the shipped variant (means over the 50 steps before each "
                  "point; CE of step 1 in nats per token, agreement = the head's argmax is the "
                  "target's):", "",
                  "| step | " + " | ".join(str(r["step"]) for r in pick) + " |",
                  "|---|" + "---|" * len(pick),
                  "| CE | " + " | ".join(f"{r[best]['ce']:.3f}" for r in pick) + " |",
                  "| agreement | " + " | ".join(f"{100 * r[best]['agreement']:.1f}%" for r in pick) + " |"]
    lines += [
        "",
        "### Acceptance: MTP head beside the demo drafter",
        "",
        f"Greedy speculative decoding measured as for the drafter above (the same "
        f"{acc.get('prompts', 64)} held-out prompts, 128 new tokens, bf16 target, everything recomputed each round): "
        "the head drafts k tokens from the target's hidden states of the accepted text, one "
        "target pass checks them. Per position j: the probability that draft j is accepted "
        "given that drafts 1..j−1 were (from the histogram of accepted drafts per round).",
        "",
        "| | MTP head | demo drafter |",
        "|---|---:|---:|",
    ]
    b4, b8 = acc.get("block4") or {}, acc.get("block8") or {}
    if not b4:
        b4 = {"per_position": [float("nan")] * 4, "mean_accepted": float("nan"),
              "histogram": ["not measured"]}
    db4, db8 = dr.get("block4") or {}, dr.get("block8") or {}
    for j in range(4):
        lines.append(f"| position {j + 1} (block 4) | {fmt(b4['per_position'][j])} | "
                     f"{fmt(db4['per_position'][j]) if db4 else '—'} |")
    for name, a, d in (("block 4", b4, db4), ("block 8", b8, db8)):
        if not a:
            continue
        lines.append(f"| {name}: mean accepted per round | {a['mean_accepted']:.3f} | "
                     f"{d['mean_accepted']:.3f} |" if d else
                     f"| {name}: mean accepted per round | {a['mean_accepted']:.3f} | — |")
        lines.append(f"| {name}: histogram 0…k | {', '.join(map(str, a['histogram']))} | "
                     f"{', '.join(map(str, d['histogram']))} |" if d else
                     f"| {name}: histogram 0…k | {', '.join(map(str, a['histogram']))} | — |")
    src = dr.get("source", "")
    lines += ["", f"Drafter column: {src}." if src else "",
              "Both columns share the caveat of the drafter's numbers: greedy continuations of "
              "models this small repeat, and on repeated text drafts agree almost always.",
              "", "Reproduce (on the GPU machine, from the repository root; then install "
              "the outputs here):", "", "```sh",
              "python3 tools/train_mtp.py --out /tmp/mtp",
              "python3 tools/train_mtp.py --install /tmp/mtp   # copies into models/", "```",
              "", README_END]
    return "\n".join(x for x in lines) + "\n"


def install(src, models):
    """Puts a run's outputs (src = its --out) into the models folder."""
    need = ["model.safetensors", "config.json", "mtp_metrics.json", "train_mtp.log", "card.md"]
    miss = [f for f in need if not os.path.exists(os.path.join(src, f))]
    if miss:
        sys.exit(f"install: {src} lacks {', '.join(miss)}")
    import mtp_head as mh
    tdir = os.path.join(models, "demo-target")
    old, new = os.path.join(tdir, "model.safetensors"), os.path.join(src, "model.safetensors")
    bad = mh.st_same_tensors(old, new, [n for n in mh.st_header(old)[0] if not n.startswith("mtp.")])
    if bad:
        sys.exit(f"install: {new} changes {len(bad)} of the target's tensors ({bad[0]} ...)")
    names = set(mh.st_header(new)[0])
    want = {"mtp." + n for n in mh.TENSOR_NAMES}
    if not want <= names:
        sys.exit(f"install: {new} lacks {sorted(want - names)[0]}")
    cfg = json.load(open(os.path.join(src, "config.json")))
    if cfg.get("mtp_num_hidden_layers") != 1:
        sys.exit("install: config.json lacks mtp_num_hidden_layers: 1")
    metrics = json.load(open(os.path.join(src, "mtp_metrics.json")))
    allm = json.load(open(os.path.join(models, "train_metrics.json")))
    allm["mtp_head"] = metrics
    readme = open(os.path.join(models, "README.md")).read()
    section = open(os.path.join(src, "card.md")).read()
    if README_BEGIN in readme:
        a = readme.index(README_BEGIN)
        b = readme.index(README_END) + len(README_END) + 1
        readme = readme[:a] + section + readme[b:]
    else:
        readme = readme.rstrip("\n") + "\n\n" + section
    shutil.copyfile(new, old)
    shutil.copyfile(os.path.join(src, "config.json"), os.path.join(tdir, "config.json"))
    shutil.copyfile(os.path.join(src, "train_mtp.log"), os.path.join(models, "train_mtp.log"))
    with open(os.path.join(models, "train_metrics.json"), "w") as f:
        json.dump(allm, f, indent=1, sort_keys=True, default=str)
    with open(os.path.join(models, "README.md"), "w") as f:
        f.write(readme)
    # As `du -sb`: files and folders.
    total = sum(os.path.getsize(dp) + sum(os.path.getsize(os.path.join(dp, fn)) for fn in fns)
                for dp, _, fns in os.walk(models))
    print(f"installed into {models}: {total:,} bytes (du -sb) in all (budget {MODELS_BUDGET:,})")
    if total > MODELS_BUDGET:
        sys.exit(f"install: {models} holds {total:,} bytes, over {MODELS_BUDGET:,}")


# ---------------------------------------------------------- engine check ---

def engine_check(d, steps, seed):
    """A CPU run of the training step on the engine's hidden states of the
    demo target: d holds ids.txt (comma-separated), hidden.npy [N, H] and
    logits.npy [N, V] from `tandem logits --model models/demo-target --ids
    ... --hidden-out hidden.npy --out logits.npy`, plus config.json and
    model.safetensors of the target (or a link to its folder as `model`).
    Trains on windows of the first 80% and reports the held-out loss and
    agreement on the rest, before and after."""
    import numpy as np
    import torch
    import mtp_head as mh
    torch.manual_seed(seed)
    model = os.path.join(d, "model")
    cfg = json.load(open(os.path.join(model, "config.json")))
    emb = mh.st_read(model, prefixes=["model.embed_tokens."])["model.embed_tokens.weight"]
    ids = torch.tensor([int(x) for x in open(os.path.join(d, "ids.txt")).read().split(",")])
    hid = torch.from_numpy(np.load(os.path.join(d, "hidden.npy")))
    lg = torch.from_numpy(np.load(os.path.join(d, "logits.npy")))
    N, W = ids.numel(), 128
    cut = int(N * 0.8) // W * W
    head = mh.MTPHead(mh.head_config(cfg))
    head.init_weights()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)

    def evaluate():
        with torch.no_grad():
            r = mh.head_losses(head, hid[None, cut:N - 1], ids[None, cut:N], emb, depth=2,
                               teacher=lg[None, cut:N - 1])
        return [(round(float(c), 3), round(float(a), 3)) for c, _, a in r]

    before = evaluate()
    starts = list(range(0, cut - W - 1, W // 2))
    log(f"engine check: {N} tokens ({cut} train), {len(starts)} windows of {W}; "
        f"held out before: (CE, agreement) per step {before}")
    curve = []
    for step in range(steps):
        s0 = starts[torch.randint(len(starts), (1,)).item()]
        sel = [starts[(starts.index(s0) + j) % len(starts)] for j in range(8)]
        h = torch.stack([hid[s:s + W] for s in sel])
        x = torch.stack([ids[s:s + W + 1] for s in sel])
        t = torch.stack([lg[s:s + W] for s in sel])
        loss = mh.combine(mh.head_losses(head, h, x, emb, depth=2, teacher=t, distill=0.5),
                          [1.0, 0.5], 0.5)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        curve.append(float(loss))
        if (step + 1) % max(1, steps // 8) == 0:
            log(f"engine check: step {step + 1}/{steps} loss {sum(curve[-10:]) / len(curve[-10:]):.3f}")
    after = evaluate()
    log(f"engine check: held out after {steps} steps: (CE, agreement) per step {after}")
    return before, after


# -------------------------------------------------------------------- run ---

def main():
    global _LOG
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (created; see the module doc)")
    ap.add_argument("--model", default="models/demo-target", help="the target's folder")
    ap.add_argument("--reference-metrics", default="models/train_metrics.json",
                    help="the demo training's metrics (expected corpus and tokenizer hashes, "
                         "the drafter's acceptance)")
    ap.add_argument("--max-seconds", type=float, default=285.0, help="wall-clock bound of the whole run")
    ap.add_argument("--reserve", type=float, default=75.0,
                    help="seconds kept for measuring and writing after training")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (else from a throughput probe)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--prompts", type=int, default=64,
                    help="held-out prompts for acceptance (64: the drafter's measurement)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--expect-loss", default="1.0,3.0",
                    help="range the target's held-out CE must fall in (the demo target's: 1.93)")
    ap.add_argument("--device", default="cuda", help="cuda (the run) or cpu (a smoke test only)")
    ap.add_argument("--install", metavar="DIR", help="install a run's outputs into models/ and stop")
    ap.add_argument("--models", default="models", help="for --install: the models folder")
    ap.add_argument("--engine-check", metavar="DIR", help="CPU check on engine hidden states and stop")
    ap.add_argument("--engine-check-steps", type=int, default=40)
    args = ap.parse_args()

    if args.install:
        install(args.install, args.models)
        return
    if args.engine_check:
        engine_check(args.engine_check, args.engine_check_steps, SEED)
        return
    if not args.out:
        ap.error("--out is required")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        ap.error(f"unknown variant {bad}; known: {', '.join(VARIANTS)}")

    # ---- fail early: inputs and libraries
    for fn in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.exists(os.path.join(args.model, fn)):
            fail(f"{args.model}/{fn} is missing (run from the repository root, or pass --model)")
    os.makedirs(args.out, exist_ok=True)
    _LOG = open(os.path.join(args.out, "train_mtp.log"), "w")
    log(f"argv: {sys.argv[1:]}")
    try:
        import numpy as np
        import torch
        import tokenizers
        import transformers
    except ImportError as e:
        fail(f"missing a library: {e} (needs torch, numpy, tokenizers, transformers)")
    import mtp_head as mh
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        fail("no CUDA device visible to torch (use --device cpu only for a smoke test)")
    ref_metrics = {}
    if os.path.exists(args.reference_metrics):
        ref_metrics = json.load(open(args.reference_metrics))
    else:
        log(f"warning: {args.reference_metrics} not found: no expected hashes, no drafter column")
    src_st = os.path.join(args.model, "model.safetensors")
    src_hdr = mh.st_header(src_st)[0]
    if any(n.startswith("mtp.") for n in src_hdr):
        fail(f"{src_st} already has mtp.* tensors; start from the target without a head")
    with open(os.path.join(args.model, "config.json")) as f:
        src_cfg = json.load(f)
    env = {"python": sys.version.split()[0], "torch": torch.__version__,
           "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}
    log(f"env: {env}")
    out_metrics = td.Metrics(os.path.join(args.out, "mtp_metrics.json"))
    M = out_metrics.data
    M.pop("argv", None)
    M["seed"] = SEED
    M["command"] = "python3 tools/train_mtp.py " + " ".join(sys.argv[1:])
    out_metrics.set("environment", env)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    # ---- corpus and tokens: exactly the demo training's
    docs, corpus = td.collect_corpus()
    want = (ref_metrics.get("corpus") or {}).get("manifest_sha256")
    corpus_ok = want is None or want == corpus["manifest_sha256"]
    log(f"corpus: {corpus['files']} files, {corpus['heldout_files']} held out, manifest "
        f"{corpus['manifest_sha256'][:16]} ({'as the demo training' if corpus_ok and want else 'DIFFERENT from ' + str(want)[:16]})")
    out_metrics.set("corpus", {k: corpus[k] for k in ("manifest_sha256", "files", "bytes", "heldout_files")}
                    | {"same_as_demo_training": corpus_ok if want else None})
    tok_path = os.path.join(args.model, "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(tok_path)
    tok_sha = sha256_file(tok_path)
    M["tokenizer_sha256"] = tok_sha
    want_tok = (ref_metrics.get("tokenizer") or {}).get("sha256")
    log(f"tokenizer: {tok_path} sha256 {tok_sha[:16]}" +
        ("" if not want_tok else " (as the demo training)" if want_tok == tok_sha else
         f" (DIFFERENT from the demo training's {want_tok[:16]})"))
    eot = tok.token_to_id("<|endoftext|>")
    if eot is None:
        fail(f"{tok_path} has no <|endoftext|>")
    t = time.time()
    train_ids, held_ids, held_docs = td.encode_docs(tok, docs, eot)
    del docs
    log(f"encode: {train_ids.size / 1e6:.2f} M train tokens, {held_ids.size / 1e6:.3f} M held out "
        f"({time.time() - t:.1f} s)")
    out_metrics.set("tokens", {"train": int(train_ids.size), "heldout": int(held_ids.size)})

    # ---- the target, frozen, loaded as train_demo reloads it
    tgt = td.model_class().from_pretrained(args.model, dtype=torch.bfloat16).to(dev).eval()
    for p in tgt.parameters():
        p.requires_grad_(False)
    embed = tgt.get_input_embeddings().weight
    if tgt.get_output_embeddings().weight.data_ptr() != embed.data_ptr():
        fail("the target's embeddings are not tied; this script expects the demo target")
    hc = mh.head_config(tgt.config)
    V, B, T = tgt.config.vocab_size, args.batch, args.seq
    log(f"target: {sum(p.numel() for p in tgt.parameters()):,} params, head config {hc}")

    def chunks_of(arr):
        n = arr.size // (T + 1)
        return torch.from_numpy(arr[: n * (T + 1)].astype(np.int64)).view(n, T + 1).to(dev)

    train_chunks = chunks_of(train_ids)
    held_chunks = chunks_of(held_ids)[:64]
    n_chunks = train_chunks.shape[0]
    # Sanity: the target's two halves give its logits; the held-out loss is
    # the demo training's.
    with torch.no_grad():
        b = held_chunks[:8]
        full = tgt(input_ids=b[:, :T], use_cache=False).logits
        h = tgt.model(input_ids=b[:, :T], use_cache=False).last_hidden_state
        split = tgt.lm_head(h)
        d = (full.float() - split.float()).abs().max().item()
        loss = torch.nn.functional.cross_entropy(full.float().reshape(-1, V), b[:, 1:].reshape(-1)).item()
    log(f"sanity: lm_head(last_hidden_state) vs logits max|d| {d:.3g}; held-out CE on 8 windows {loss:.4f}")
    if d > 1e-2 * full.float().abs().max().item():
        fail("last_hidden_state is not what the LM head reads")
    lo, hi = (float(x) for x in args.expect_loss.split(","))
    if not (lo < loss < hi):
        fail(f"the target's held-out loss {loss:.3f} is outside {lo:g}..{hi:g} "
             "(the demo target's is about 1.93): wrong model, corpus or tokenizer?")

    # ---- heads: the same initial weights for every variant
    torch.manual_seed(SEED)
    base = mh.MTPHead(hc)
    base.init_weights()
    heads = {v: copy.deepcopy(base).to(dev) for v in variants}
    n_head = mh.n_params(base)
    out_metrics.set("params", {"head": n_head, "target": sum(p.numel() for p in tgt.parameters())})
    log(f"head: {n_head:,} params; variants {variants}")

    def make_opt(m):
        dec = [p for p in m.parameters() if p.ndim == 2]
        nodec = [p for p in m.parameters() if p.ndim != 2]
        return torch.optim.AdamW([{"params": dec, "weight_decay": 0.1},
                                  {"params": nodec, "weight_decay": 0.0}],
                                 lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                 **({"fused": True} if dev.type == "cuda" else {}))

    opts = {v: make_opt(heads[v]) for v in variants}
    rng = np.random.default_rng(SEED)
    order = torch.from_numpy(rng.permutation(n_chunks)).to(dev)
    emb_train = embed.detach()

    def step_all(batch, lr):
        with torch.no_grad():
            hid = tgt.model(input_ids=batch[:, :T], use_cache=False).last_hidden_state
            teacher = tgt.lm_head(hid)
        res = []
        for v in variants:
            weights, distill = VARIANTS[v]
            for g in opts[v].param_groups:
                g["lr"] = lr
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                losses = mh.head_losses(heads[v], hid, batch, emb_train, depth=len(weights),
                                        teacher=teacher, distill=distill)
                loss = mh.combine(losses, weights, distill)
            opts[v].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(heads[v].parameters(), 1.0)
            opts[v].step()
            res.append(torch.stack([losses[0][0].detach(), losses[0][2].detach()]))
        return torch.stack(res)

    # ---- plan: warm-up is fixed; the cosine length comes from the probe
    warmup = 30
    deadline = T0 + args.max_seconds
    t_train = time.time()
    train_budget = deadline - args.reserve - t_train
    if train_budget < 20:
        fail(f"only {train_budget:.0f} s left for training (set-up took {t_train - T0:.0f} s; "
             f"--max-seconds {args.max_seconds:g}, --reserve {args.reserve:g})")
    steps = args.steps or 10 ** 9
    curve, acc = [], []
    done, probe = 0, None
    stop_at = t_train + train_budget
    log(f"train: budget {train_budget:.0f} s, batch {B} x {T}, lr {args.lr:g}")
    step = 0
    while step < steps:
        if time.time() > stop_at:
            log(f"train: stopping at step {step} (time budget)")
            break
        if step < warmup:
            f = (step + 1) / warmup
        else:
            p = (step - warmup) / max(1, steps - warmup)
            f = 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, p)))
        start = (step * B) % (order.numel() - B)
        batch = train_chunks[order[start:start + B]]
        acc.append(step_all(batch, args.lr * f))
        step += 1
        done = step
        if step == 5 and dev.type == "cuda":
            torch.cuda.synchronize()
            t5 = time.time()
        if step == 20 and not args.steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
                sps = (time.time() - t5) / 15
            else:
                sps = (time.time() - t_train) / 20
            steps = max(warmup + 10, int((stop_at - t_train) / sps * 0.97))
            probe = {"seconds_per_step": round(sps, 4), "steps": steps,
                     "tokens_per_second": round(B * T / sps)}
            log(f"probe: {sps * 1000:.1f} ms/step ({len(variants)} heads) -> {steps} steps")
        if step % 50 == 0 or step == steps:
            m = torch.stack(acc).mean(0).tolist()
            acc = []
            el = time.time() - t_train
            row = {"step": step, "seconds": round(el, 1)}
            for v, (ce, ag) in zip(variants, m):
                row[v] = {"ce": round(ce, 4), "agreement": round(ag, 4)}
            curve.append(row)
            log(f"train: step {step}/{steps if steps < 10 ** 9 else '?'} lr {args.lr * f:.2e} " +
                " ".join(f"{v}: ce {ce:.4f} agree {ag:.3f}" for v, (ce, ag) in zip(variants, m)) +
                f" ({step * B * T / el / 1e3:.0f} k tok/s)")
    if dev.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - t_train
    out_metrics.set("probe", probe)
    out_metrics.set("training", {
        "steps_planned": steps if steps < 10 ** 9 else None, "steps_run": done,
        "stopped_early": done < steps, "batch": B, "seq": T, "tokens_seen": done * B * T,
        "epochs": round(done * B / n_chunks, 3), "seconds": round(train_s, 1), "lr": args.lr,
        "warmup": warmup, "variants": {v: {"step_weights": VARIANTS[v][0], "distill": VARIANTS[v][1]}
                                       for v in variants},
        "curve": curve})

    # ---- round to bf16 (what ships) and measure teacher-forced on held-out windows
    for v in variants:
        heads[v] = heads[v].to(torch.bfloat16).float().eval()
    emb32 = embed.float()
    results = {}
    for v in variants:
        results[v] = {"heldout": teacher_forced(heads[v], tgt, held_chunks, emb32, 4, dev)}
        log(f"held out {v}: {results[v]['heldout']}")
    out_metrics.set("variants", results)
    best = max(variants, key=lambda v: results[v]["heldout"]["top1_agreement_with_target"][0])

    # ---- write the outputs (provisional pick first, so a cut run leaves a head)
    out_st = os.path.join(args.out, "model.safetensors")

    def write(v):
        mh.st_append(src_st, out_st, heads[v].tensors())
        cfg = dict(src_cfg)
        cfg["mtp_num_hidden_layers"] = 1
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        M["chosen_variant"] = v
        old_names = sorted(src_hdr)
        bad = mh.st_same_tensors(src_st, out_st, old_names)
        new_names = set(mh.st_header(out_st)[0])
        extra = sorted(new_names - set(old_names))
        if bad or extra != sorted("mtp." + n for n in mh.TENSOR_NAMES):
            fail(f"written file is wrong: changed {bad[:3]}, added {extra[:3]}...")
        # The head reads back bit for bit.
        back = mh.MTPHead(hc).load_tensors(mh.st_read(args.out, prefixes=["mtp."]))
        same = all(torch.equal(a.float().cpu(), b.float().cpu())
                   for a, b in zip(back.state_dict().values(), heads[v].state_dict().values()))
        if not same:
            fail("the head read back from the file differs from the trained one")
        size = os.path.getsize(out_st)
        out_metrics.set("files", {"model.safetensors": size,
                                  "head_bytes": size - os.path.getsize(src_st),
                                  "target_tensors_byte_identical": True,
                                  "mtp_tensors": len(extra)})
        log(f"wrote {out_st} ({size:,} B, +{size - os.path.getsize(src_st):,}) with variant {v}; "
            f"{len(old_names)} target tensors byte-identical, head reads back exactly")

    write(best)

    # ---- acceptance, measured as train_demo measured the drafter
    prompts = td.acceptance_prompts(held_docs, args.prompts)
    phash = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()
    accept = {"prompts": len(prompts), "new_tokens": 128, "prompts_sha256": phash}

    def measure(v, k):
        t = time.time()
        try:
            res, _ = td.speculate_greedy(mtp_proposer(tgt, heads[v], emb32, eot, dev, deadline - 12),
                                         tgt, prompts, k, 128, eot, dev)
        except TimeoutError:
            log(f"accept {v} block {k}: cut at the deadline after {time.time() - t:.0f} s, not recorded")
            return None
        res["seconds"] = round(time.time() - t, 1)
        res["per_position"] = [None if x is None else round(x, 4) for x in mh.per_position(res["histogram"])]
        log(f"accept {v} block {k}: mean accepted {res['mean_accepted']:.3f} over {res['rounds']} "
            f"rounds, hist {res['histogram']}, per position {res['per_position']} ({res['seconds']} s)")
        return res

    for v in variants:
        if time.time() > deadline - 25:
            log(f"accept: no time left for {v}")
            continue
        r = measure(v, 4)
        if r:
            results[v]["block4"] = r
        out_metrics.set("variants", results)
    measured = [v for v in variants if "block4" in results[v]]
    if measured:
        best = max(measured, key=lambda v: (results[v]["block4"]["mean_accepted"],
                                            results[v]["heldout"]["top1_agreement_with_target"][0]))
        if best != M["chosen_variant"]:
            write(best)
    accept["block4"] = results[best].get("block4")
    out_metrics.set("chosen_variant", best)
    out_metrics.set("acceptance", accept)
    if time.time() < deadline - 25:
        r = measure(best, 8)
        if r:
            accept["block8"] = r
        out_metrics.set("acceptance", accept)

    # ---- the drafter's column: the demo training's numbers, same protocol
    dref = {}
    ra = ref_metrics.get("acceptance") or {}
    for k in (4, 8):
        r = ra.get(f"block{k}")
        if r:
            dref[f"block{k}"] = {"mean_accepted": r["mean_accepted"], "histogram": r["histogram"],
                                 "rounds": r["rounds"],
                                 "per_position": [None if x is None else round(x, 4)
                                                  for x in mh.per_position(r["histogram"])]}
    if dref:
        dref["source"] = ("the demo training's measurement (models/train_metrics.json, "
                          "\"acceptance\"), same prompts" + ("" if corpus_ok else
                                                            " if the corpus were the same (it is not here)"))
    out_metrics.set("drafter_reference", dref)

    # ---- transformers still loads the target, ignoring the head
    checks = {}
    try:
        t2 = td.model_class().from_pretrained(args.out, dtype=torch.bfloat16).to(dev).eval()
        with torch.no_grad():
            b = held_chunks[:8, :T]
            a1 = tgt(input_ids=b, use_cache=False).logits
            a2 = t2(input_ids=b, use_cache=False).logits
        checks["target_logits_unchanged"] = "identical" if torch.equal(a1, a2) else \
            f"max|d| {(a1.float() - a2.float()).abs().max().item():.3g}"
        checks["config_mtp_num_hidden_layers"] = getattr(t2.config, "mtp_num_hidden_layers", None)
        del t2
    except Exception as e:
        checks["transformers_reload_error"] = repr(e)
    out_metrics.set("checks", checks)
    log(f"checks: {checks}")

    M["total_seconds"] = round(time.time() - T0, 1)
    out_metrics.write()
    try:
        with open(os.path.join(args.out, "card.md"), "w") as f:
            f.write(card(M))
    except Exception as e:  # the card is a convenience; the metrics hold every number
        log(f"card.md not written: {e!r}")
    b4 = (accept.get("block4") or {})
    dr4 = dref.get("block4") or {}
    log(f"SUMMARY: MTP head ({best}, {n_head:,} params, {done} steps, {train_s:.0f} s training, "
        f"{M['total_seconds']:.0f} s in all): block-4 acceptance per position "
        f"{b4.get('per_position')} mean accepted {b4.get('mean_accepted', float('nan')):.3f} "
        f"(demo drafter {dr4.get('per_position')} {dr4.get('mean_accepted', float('nan')):.3f}); "
        f"files in {args.out}: {', '.join(sorted(os.listdir(args.out)))}")


if __name__ == "__main__":
    main()
