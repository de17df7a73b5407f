#!/usr/bin/env python3
"""Train the bundled demo model pair: a tiny hybrid Qwen3.5 target, a smaller
hybrid Qwen3.5 drafter, and the byte-level BPE tokenizer they share.

Why: the default run and many tests need a real target/drafter pair in which
speculation pays (the drafter agrees with the target often enough), in the
exact HF layout that real Qwen3.5 checkpoints use. Real checkpoints cannot be
downloaded, so this script builds one from the Python sources of permissively
licensed packages installed next to the interpreter that runs it.

Runs on a machine with torch, transformers (5.17: Qwen3_5ForCausalLM with its
pure-torch Gated DeltaNet fallbacks) and tokenizers. One run:

  1. collects the corpus (fixed package list, filtered, capped, split into
     train / held-out by a hash of each file's content);
  2. trains the tokenizer (Qwen-style pre-tokenizer, NFC, byte level);
  3. encodes the corpus, sanity-checks both model configs with a tiny forward
     and probes training throughput to fix the step count for the budget;
  4. trains target and drafter together on the same batches (bf16 autocast,
     fp32 master weights, AdamW). The drafter also learns from the target's
     distribution (forward KL, ramped in), which raises its agreement;
  5. writes models/demo-target and models/demo-drafter (config.json,
     model.safetensors in bf16, tokenizer.json, tokenizer_config.json,
     generation_config.json);
  6. reloads them from disk and measures held-out loss, greedy speculative
     acceptance at blocks 4 and 8, and greedy continuations of Python prompts.

Every phase writes what it measured to the metrics JSON as soon as it has it,
so a run cut short still leaves its numbers (and, after phase 5, its models).

Reproduce the bundled models (recipe and expected spread in models/README.md):
  python3 tools/train_demo.py --out models --minutes 5.5 --steps 1240
Without --steps the step count comes from a throughput probe and the
--minutes budget, so it depends on the machine.

Local check without torch: `--corpus-only` runs phase 1 and prints a summary.
"""

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

SEED = 20261130

# (import name, distribution name). All permissively licensed (BSD-3-Clause or
# Apache-2.0); the licence each distribution declares is read from its metadata
# and recorded in the metrics.
PACKAGES = [
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("numpy", "numpy"),
    ("scipy", "scipy"),
    ("sympy", "sympy"),
    ("networkx", "networkx"),
    ("pandas", "pandas"),
    ("sklearn", "scikit-learn"),
]
PACKAGE_CAP_BYTES = 40 * 1024 * 1024   # per package, so no single one dominates
MAX_FILE_BYTES = 512 * 1024            # larger .py files are mostly generated tables
MAX_LINE_CHARS = 1000                  # longer lines: data blobs, not code
HELDOUT_PERCENT = 2                    # by content hash, so copies share a split

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 4096                      # BPE merges fill VOCAB_SIZE - len(SPECIAL_TOKENS)
# The Qwen2 / Qwen3 pre-tokenizer pattern.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

L, F = "linear_attention", "full_attention"
# Shapes: both hybrid with a full-attention layer every 4th layer, as in
# Qwen3.5. The target groups value heads (Hv = 2*Hk, as the 4B/9B do); the
# drafter does not, so both layouts are exercised.
TARGET_SPEC = dict(
    hidden_size=256, intermediate_size=384, num_hidden_layers=8,
    layer_types=[L, L, L, F, L, L, L, F],
    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    linear_num_key_heads=4, linear_num_value_heads=8,
    linear_key_head_dim=32, linear_value_head_dim=32,
)
DRAFTER_SPEC = dict(
    hidden_size=128, intermediate_size=320, num_hidden_layers=4,
    layer_types=[L, L, L, F],
    num_attention_heads=2, num_key_value_heads=1, head_dim=64,
    linear_num_key_heads=4, linear_num_value_heads=4,
    linear_key_head_dim=32, linear_value_head_dim=32,
)
ROPE = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,   # head_dim 64 -> 16 rotary dims, 8 frequencies
    "mrope_interleaved": True,
    "mrope_section": [3, 3, 2],      # sums to the 8 frequencies; text uses one stream
}

SAMPLE_PROMPTS = [
    "def fibonacci(n):\n",
    "import numpy as np\n\n\ndef normalize(x):\n",
    "class Stack:\n    def __init__(self):\n",
]

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


class Metrics:
    """The run's record: every phase adds its numbers and the file is rewritten
    at once, so a run cut short still leaves what it measured."""

    def __init__(self, path):
        self.path = path
        self.data = {"seed": SEED, "argv": sys.argv[1:]}

    def set(self, key, value):
        self.data[key] = value
        self.write()

    def write(self):
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, sort_keys=True, default=str)
        os.replace(tmp, self.path)


# ---------------------------------------------------------------- corpus ---

def _licence_of(dist):
    try:
        meta = importlib.metadata.metadata(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    out = {}
    if meta.get("License-Expression"):
        out["expression"] = meta.get("License-Expression")
    lic = meta.get("License")
    if lic:
        out["field"] = lic.strip().splitlines()[0][:120]
    cls = [c for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")]
    if cls:
        out["classifiers"] = cls
    return out


def collect_corpus():
    """Returns (docs, summary). docs: list of dicts {pkg, path, text, heldout}
    in a fixed order (package list order, then path)."""
    docs, summary = [], []
    for mod, dist in PACKAGES:
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.submodule_search_locations:
            log(f"corpus: package {mod} not installed, skipped")
            summary.append({"package": mod, "distribution": dist, "missing": True})
            continue
        root = list(spec.submodule_search_locations)[0]
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        skipped = {"too_large": 0, "not_utf8": 0, "long_lines": 0, "empty": 0, "over_cap": 0}
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    files.append(os.path.join(dirpath, name))
        kept = []
        for path in files:
            rel = os.path.join(mod, os.path.relpath(path, root))
            try:
                size = os.path.getsize(path)
                if size > MAX_FILE_BYTES:
                    skipped["too_large"] += 1
                    continue
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError:
                skipped["not_utf8"] += 1
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            text = text.replace("\r\n", "\n")
            if not text.strip():
                skipped["empty"] += 1
                continue
            if max(len(line) for line in text.split("\n")) > MAX_LINE_CHARS:
                skipped["long_lines"] += 1
                continue
            kept.append((rel, text))
        # Cap each package with a hash-ordered prefix: deterministic and spread
        # over the whole package rather than its alphabetically first folders.
        total = sum(len(t.encode()) for _, t in kept)
        if total > PACKAGE_CAP_BYTES:
            order = sorted(kept, key=lambda rt: hashlib.sha1(rt[0].encode()).hexdigest())
            chosen, acc = set(), 0
            for rel, text in order:
                n = len(text.encode())
                if acc + n > PACKAGE_CAP_BYTES:
                    skipped["over_cap"] += 1
                    continue
                chosen.add(rel)
                acc += n
            kept = [(r, t) for r, t in kept if r in chosen]
        nbytes = nheld = 0
        for rel, text in kept:
            h = hashlib.sha1(text.encode()).hexdigest()
            heldout = int(h[:8], 16) % 100 < HELDOUT_PERCENT
            nheld += heldout
            nbytes += len(text.encode())
            docs.append({"pkg": mod, "path": rel, "text": text, "heldout": heldout, "sha1": h})
        summary.append({
            "package": mod, "distribution": dist, "version": version,
            "licence": _licence_of(dist), "files": len(kept), "bytes": nbytes,
            "heldout_files": nheld, "skipped": skipped,
        })
        log(f"corpus: {mod} {version}: {len(kept)} files, {nbytes / 1e6:.1f} MB "
            f"({nheld} held out), skipped {skipped}")
    manifest = hashlib.sha256()
    for d in docs:
        manifest.update(f"{d['path']}\t{d['sha1']}\t{int(d['heldout'])}\n".encode())
    return docs, {"packages": summary, "manifest_sha256": manifest.hexdigest(),
                  "files": len(docs), "bytes": sum(s.get("bytes", 0) for s in summary),
                  "heldout_files": sum(d["heldout"] for d in docs)}


# ------------------------------------------------------------- tokenizer ---

def train_tokenizer(docs, out_path):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                            normalizers, pre_tokenizers, processors, trainers)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS), min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=[],
    )
    # A quarter of the training files (by content hash) is plenty for 4k merges.
    sample = [d["text"] for d in docs if not d["heldout"] and int(d["sha1"][8:10], 16) % 4 == 0]
    log(f"tokenizer: training BPE on {len(sample)} files, "
        f"{sum(len(t) for t in sample) / 1e6:.1f} M chars")
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    # Specials go after the merges, as in Qwen (ids vocab-3 .. vocab-1).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    if tok.get_vocab_size(with_added_tokens=True) > VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} entries, more than {VOCAB_SIZE}")
    tok.save(out_path, pretty=False)
    return tok


def tokenizer_config(ids):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[s]): {"content": s, "lstrip": False, "normalized": False,
                          "rstrip": False, "single_word": False, "special": True}
            for s in SPECIAL_TOKENS
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def encode_docs(tok, docs, eot):
    import numpy as np
    texts = [d["text"] for d in docs]
    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    arrays = []
    for i in range(0, len(texts), 512):
        for e in enc(texts[i:i + 512], add_special_tokens=False):
            arrays.append(np.asarray(e.ids, dtype=np.uint16))
    train = [a for a, d in zip(arrays, docs) if not d["heldout"]]
    held = [a for a, d in zip(arrays, docs) if d["heldout"]]
    sep = np.asarray([eot], dtype=np.uint16)

    def join(parts):
        out = []
        for a in parts:
            out.append(a)
            out.append(sep)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.uint16)

    return join(train), join(held), held


# ----------------------------------------------------------------- models ---

def make_config(spec, eot, metrics_key, metrics):
    from transformers import Qwen3_5TextConfig
    kw = dict(
        vocab_size=VOCAB_SIZE, hidden_act="silu", max_position_embeddings=4096,
        initializer_range=0.02, rms_norm_eps=1e-6, tie_word_embeddings=True,
        attention_bias=False, attention_dropout=0.0, linear_conv_kernel_dim=4,
        rope_parameters=dict(ROPE), bos_token_id=None, eos_token_id=eot,
        pad_token_id=eot, use_cache=True,
    )
    kw.update(spec)
    try:
        cfg = Qwen3_5TextConfig(**kw)
    except Exception as e:  # keep going with the plainest rope description
        log(f"config: full rope parameters refused ({e!r}); retrying without mrope keys")
        kw["rope_parameters"] = {k: ROPE[k] for k in ("rope_type", "rope_theta", "partial_rotary_factor")}
        cfg = Qwen3_5TextConfig(**kw)
    rp = cfg.rope_parameters
    if rp.get("partial_rotary_factor") != ROPE["partial_rotary_factor"]:
        rp["partial_rotary_factor"] = ROPE["partial_rotary_factor"]
    if cfg.model_type != "qwen3_5_text" or list(cfg.layer_types) != list(spec["layer_types"]):
        raise SystemExit(f"config came out wrong: {cfg.model_type} {cfg.layer_types}")
    metrics.set(metrics_key, {"rope_parameters": dict(rp)})
    return cfg


def model_class():
    try:
        from transformers import Qwen3_5ForCausalLM
        return Qwen3_5ForCausalLM
    except ImportError:
        from transformers import AutoModelForCausalLM
        return AutoModelForCausalLM


def make_model(cfg, seed, dev):
    import torch
    torch.manual_seed(seed)
    cls = model_class()
    m = cls.from_config(cfg) if cls.__name__ == "AutoModelForCausalLM" else cls(cfg)
    m = m.float().to(dev)
    emb = m.get_input_embeddings().weight
    head = m.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        log("model: embeddings were not tied by the library; tying them")
        m.get_output_embeddings().weight = emb
    return m


def n_params(m):
    return sum(p.numel() for p in m.parameters())


# ------------------------------------------ speculative acceptance (greedy) ---

def acceptance_prompts(held_docs, n=64):
    """The held-out prompts speculative acceptance is measured on: one window
    of 64..128 tokens from each of n held-out files with room (at a
    hash-chosen offset: file starts are mostly licence headers), the files
    ordered by a SHA-1 of their tokens so the prompts mix all packages."""
    cands = sorted((a for a in held_docs if a.size >= 320),
                   key=lambda a: hashlib.sha1(a.tobytes()).hexdigest())
    prompts = []
    for a in cands[:min(n, len(cands))]:
        h = int(hashlib.sha1(a[:32].tobytes()).hexdigest()[:8], 16)
        plen = 64 + h % 65
        off = (h // 65) % (a.size - plen - 1)
        prompts.append(a[off:off + plen].tolist())
    return prompts


def padded_forward(m, seqs, pad, dev, hidden=False):
    """m's logits [len(seqs), max len, V] for a batch of token lists, right
    padded with `pad` (exact for a causal model: positions before the pad
    never see it, and only those are read). hidden: also the states after
    the final norm (what the LM head reads), as (logits, hidden)."""
    import torch
    Lmax = max(len(s) for s in seqs)
    x = torch.full((len(seqs), Lmax), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    with torch.no_grad():
        if not hidden:
            return m(input_ids=x.to(dev), use_cache=False).logits
        # The causal LM's own two halves: the base model's last_hidden_state
        # (after the final norm) and the LM head on it.
        h = m.model(input_ids=x.to(dev), use_cache=False).last_hidden_state
        return m.lm_head(h), h


def greedy_decode(m, prompts, n_new, pad, dev, stop=()):
    """Greedy continuations (n_new tokens, or up to a stop token), recomputed
    without a cache, batched."""
    import torch
    seqs = [list(p) for p in prompts]
    live = list(range(len(seqs)))
    for _ in range(n_new):
        if not live:
            break
        lg = padded_forward(m, [seqs[i] for i in live], pad, dev)
        pos = torch.tensor([len(seqs[i]) - 1 for i in live], device=dev)
        nxt = lg[torch.arange(len(live), device=dev), pos].argmax(-1).tolist()
        for i, tkn in zip(live, nxt):
            seqs[i].append(tkn)
        live = [i for i, tkn in zip(live, nxt) if tkn not in stop]
    return [s[len(p):] for s, p in zip(seqs, prompts)]


def model_proposer(drf, pad, dev):
    """Drafts by a drafter model: k greedy tokens after each sequence."""
    import torch

    def propose(cur, k):
        drafts = [[] for _ in cur]
        for _ in range(k):
            ext = [c + d for c, d in zip(cur, drafts)]
            lg = padded_forward(drf, ext, pad, dev)
            pos = torch.tensor([len(e) - 1 for e in ext], device=dev)
            nxt = lg[torch.arange(len(ext), device=dev), pos].argmax(-1).tolist()
            for d, tkn in zip(drafts, nxt):
                d.append(tkn)
        return drafts
    return propose


def speculate_greedy(propose, tgt, prompts, k, n_new, pad, dev):
    """Greedy speculative decoding, everything recomputed: each round
    propose(sequences, k) gives k drafts per sequence, one target forward
    over sequence + drafts checks them, the longest matching prefix is
    accepted and the target's own next token appended. Returns the counts
    (rounds, accepted, histogram of accepted per round) and the outputs."""
    import torch
    seqs = [list(p) for p in prompts]
    made = [0] * len(seqs)
    live = list(range(len(seqs)))
    rounds = accepted = 0
    hist = [0] * (k + 1)
    while live:
        cur = [seqs[i] for i in live]
        drafts = propose(cur, k)
        lg = padded_forward(tgt, [c + d for c, d in zip(cur, drafts)], pad, dev)
        base = torch.tensor([len(c) - 1 for c in cur], device=dev)
        idx = base[:, None] + torch.arange(k + 1, device=dev)[None, :]
        preds = lg[torch.arange(len(cur), device=dev)[:, None], idx].argmax(-1).tolist()
        for b, i in enumerate(live):
            n = 0
            while n < k and drafts[b][n] == preds[b][n]:
                n += 1
            seqs[i].extend(drafts[b][:n] + [preds[b][n]])
            made[i] += n + 1
            rounds += 1
            accepted += n
            hist[n] += 1
        live = [i for i in live if made[i] < n_new]
    outs = [s[len(p):len(p) + n_new] for s, p in zip(seqs, prompts)]
    return {"block": k, "rounds": rounds, "accepted": accepted,
            "mean_accepted": accepted / max(1, rounds),
            "tokens_per_target_pass": (accepted + rounds) / max(1, rounds),
            "histogram": hist}, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="models", help="output folder (gets demo-target/, demo-drafter/)")
    ap.add_argument("--minutes", type=float, default=5.0,
                    help="training wall-clock budget for both models together")
    ap.add_argument("--steps", type=int, default=0,
                    help="fixed step count (overrides the throughput probe; use to reproduce)")
    ap.add_argument("--deadline", type=float, default=560.0,
                    help="seconds after start by which everything must be done")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--distill", type=float, default=0.5,
                    help="final weight of the drafter's KL-to-target term (0 disables)")
    ap.add_argument("--metrics", default="", help="metrics JSON (default OUT/train_metrics.json)")
    ap.add_argument("--corpus-only", action="store_true", help="collect the corpus, print, stop")
    args = ap.parse_args()

    metrics = Metrics(None if args.corpus_only else
                      (args.metrics or os.path.join(args.out, "train_metrics.json")))
    docs, corpus = collect_corpus()
    log(f"corpus: {corpus['files']} files, {corpus['bytes'] / 1e6:.1f} MB, "
        f"{corpus['heldout_files']} held out, manifest {corpus['manifest_sha256'][:16]}")
    if args.corpus_only:
        print(json.dumps(corpus, indent=1))
        return
    metrics.set("corpus", corpus)

    os.makedirs(args.out, exist_ok=True)
    tok_path = os.path.join(args.out, "tokenizer.json")
    t = time.time()
    tok = train_tokenizer(docs, tok_path)
    vocab = tok.get_vocab()
    ids = {s: vocab[s] for s in SPECIAL_TOKENS}
    eot, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    with open(tok_path, "rb") as f:
        tok_sha = hashlib.sha256(f.read()).hexdigest()
    metrics.set("tokenizer", {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                              "special_ids": ids, "sha256": tok_sha,
                              "seconds": round(time.time() - t, 1)})
    log(f"tokenizer: {tok.get_vocab_size()} entries, specials {ids}, sha256 {tok_sha[:16]}")

    t = time.time()
    import numpy as np
    train_ids, held_ids, held_docs = encode_docs(tok, docs, eot)
    nbytes_train = sum(len(d["text"].encode()) for d in docs if not d["heldout"])
    metrics.set("tokens", {"train": int(train_ids.size), "heldout": int(held_ids.size),
                           "train_bytes_per_token": round(nbytes_train / max(1, train_ids.size), 3),
                           "seconds": round(time.time() - t, 1)})
    log(f"encode: {train_ids.size / 1e6:.2f} M train tokens, {held_ids.size / 1e6:.3f} M held out, "
        f"{nbytes_train / max(1, train_ids.size):.2f} bytes/token")

    import torch
    import torch.nn.functional as F
    import transformers
    import tokenizers
    # Seeds and data order are fixed; kernels keep their (faster) default
    # algorithms, whose atomics leave run-to-run noise far below the loss
    # differences that matter here.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    metrics.set("environment", {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
    })
    log(f"env: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}, device {metrics.data['environment']['device']}")

    V, B, T = VOCAB_SIZE, args.batch, args.seq
    cfg_t = make_config(TARGET_SPEC, eot, "target_config_check", metrics)
    cfg_d = make_config(DRAFTER_SPEC, eot, "drafter_config_check", metrics)

    # Token stream -> fixed chunks of T+1; a seeded permutation per epoch.
    def chunks_of(arr):
        n = arr.size // (T + 1)
        return torch.from_numpy(arr[: n * (T + 1)].astype(np.int32)).view(n, T + 1).to(dev)

    train_chunks = chunks_of(train_ids)
    held_chunks = chunks_of(held_ids)[:128]
    eval_train_chunks = train_chunks[:: max(1, train_chunks.shape[0] // 128)][:128]
    n_chunks = train_chunks.shape[0]
    rng = np.random.default_rng(SEED)

    def order_for(steps):
        need = steps * B
        parts, have = [], 0
        while have < need:
            parts.append(rng.permutation(n_chunks))
            have += n_chunks
        return np.concatenate(parts)[:need]

    # ---- sanity: a tiny forward of both configs
    t = time.time()
    for name, cfg in (("target", cfg_t), ("drafter", cfg_d)):
        m = make_model(cfg, SEED, dev)
        x = train_chunks[:2, :64].long()
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
            out = m(input_ids=x, use_cache=False).logits
        ok = tuple(out.shape) == (2, 64, V) and bool(torch.isfinite(out.float()).all())
        loss0 = F.cross_entropy(out.float().reshape(-1, V), train_chunks[:2, 1:65].long().reshape(-1)).item()
        log(f"sanity: {name} {n_params(m) / 1e6:.3f} M params, logits {tuple(out.shape)}, "
            f"finite={ok}, initial loss {loss0:.3f} (ln V = {math.log(V):.3f})")
        if not ok:
            raise SystemExit(f"{name}: tiny forward failed")
        del m
    log(f"sanity: {time.time() - t:.1f}s")

    def make_opt(m, lr):
        dec = [p for n, p in m.named_parameters() if p.ndim == 2]
        nodec = [p for n, p in m.named_parameters() if p.ndim != 2]
        return torch.optim.AdamW([{"params": dec, "weight_decay": 0.1},
                                  {"params": nodec, "weight_decay": 0.0}],
                                 lr=lr, betas=(0.9, 0.95), eps=1e-8,
                                 fused=dev.type == "cuda")

    LR_T, LR_D = 2e-3, 3e-3

    def train_step(tgt, drf, opt_t, opt_d, batch, alpha):
        x, y = batch[:, :-1], batch[:, 1:].reshape(-1)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            lt = tgt(input_ids=x, use_cache=False).logits
            ld = drf(input_ids=x, use_cache=False).logits
        lt = lt.float().reshape(-1, V)
        ld = ld.float().reshape(-1, V)
        loss_t = F.cross_entropy(lt, y)
        ce_d = F.cross_entropy(ld, y)
        logp_d = F.log_softmax(ld, -1)
        kl = F.kl_div(logp_d, F.log_softmax(lt.detach(), -1), log_target=True, reduction="batchmean")
        loss_d = (1.0 - alpha) * ce_d + alpha * kl
        opt_t.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)
        (loss_t + loss_d).backward()
        torch.nn.utils.clip_grad_norm_(tgt.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(drf.parameters(), 1.0)
        opt_t.step()
        opt_d.step()
        return loss_t.detach(), ce_d.detach(), kl.detach()

    # ---- throughput probe (throw-away models), then fix the step count
    budget_s = args.minutes * 60.0
    if args.steps > 0:
        steps = args.steps
        probe = None
    else:
        tgt, drf = make_model(cfg_t, SEED, dev), make_model(cfg_d, SEED + 1, dev)
        opt_t, opt_d = make_opt(tgt, LR_T), make_opt(drf, LR_D)
        probe_batches = train_chunks[: B * 12].view(12, B, T + 1)
        for i in range(3):
            train_step(tgt, drf, opt_t, opt_d, probe_batches[i].long(), 0.5)
        torch.cuda.synchronize()
        t = time.time()
        for i in range(3, 12):
            train_step(tgt, drf, opt_t, opt_d, probe_batches[i].long(), 0.5)
        torch.cuda.synchronize()
        sps = (time.time() - t) / 9
        # Never let training run into the time reserved for saving and measuring.
        avail = min(budget_s, args.deadline - (time.time() - T0) - 110.0)
        steps = max(50, int(avail / sps) // 10 * 10)
        probe = {"seconds_per_step": round(sps, 4), "tokens_per_second": round(B * T / sps),
                 "budget_seconds": budget_s, "steps": steps}
        log(f"probe: {sps * 1000:.1f} ms/step, {B * T / sps / 1e3:.0f} k tok/s (both models) -> {steps} steps")
        del tgt, drf, opt_t, opt_d
        torch.cuda.empty_cache()
    metrics.set("probe", probe)

    # ---- training
    tgt, drf = make_model(cfg_t, SEED, dev), make_model(cfg_d, SEED + 1, dev)
    opt_t, opt_d = make_opt(tgt, LR_T), make_opt(drf, LR_D)
    params = {"target": n_params(tgt), "drafter": n_params(drf),
              "target_embedding": tgt.get_input_embeddings().weight.numel(),
              "drafter_embedding": drf.get_input_embeddings().weight.numel()}
    metrics.set("params", params)
    log(f"params: target {params['target']:,}, drafter {params['drafter']:,}")
    order = torch.from_numpy(order_for(steps)).to(dev)
    warmup = max(10, min(200, steps // 20))

    def lr_factor(step):
        if step < warmup:
            return (step + 1) / warmup
        p = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, p)))

    def alpha_at(step):
        return args.distill * min(1.0, max(0.0, (step / steps - 0.1) / 0.3))

    hard_stop = min(time.time() + budget_s * 1.15 + 15.0, T0 + args.deadline - 100.0)
    curve, acc = [], []
    t_train = time.time()
    done = 0
    stopped_early = False
    log_every = 50
    for step in range(steps):
        if time.time() > hard_stop:
            stopped_early = True
            log(f"train: stopping at step {step} of {steps} to keep the deadline")
            break
        f = lr_factor(step)
        for g in opt_t.param_groups:
            g["lr"] = LR_T * f
        for g in opt_d.param_groups:
            g["lr"] = LR_D * f
        batch = train_chunks[order[step * B:(step + 1) * B]].long()
        acc.append(torch.stack(train_step(tgt, drf, opt_t, opt_d, batch, alpha_at(step))))
        done = step + 1
        if done % log_every == 0 or done == steps:
            m = torch.stack(acc).mean(0).tolist()
            acc = []
            el = time.time() - t_train
            curve.append({"step": done, "target_loss": round(m[0], 4), "drafter_ce": round(m[1], 4),
                          "drafter_kl": round(m[2], 4), "seconds": round(el, 1)})
            log(f"train: step {done}/{steps} target {m[0]:.4f} drafter {m[1]:.4f} kl {m[2]:.4f} "
                f"alpha {alpha_at(step):.2f} lr {LR_T * f:.2e} {done * B * T / el / 1e3:.0f} k tok/s")
    torch.cuda.synchronize()
    train_s = time.time() - t_train
    metrics.set("training", {
        "steps_planned": steps, "steps_run": done, "stopped_early": stopped_early,
        "batch": B, "seq": T, "tokens_seen": done * B * T,
        "epochs": round(done * B / n_chunks, 3), "seconds": round(train_s, 1),
        "tokens_per_second": round(done * B * T / max(train_s, 1e-9)),
        "lr_target": LR_T, "lr_drafter": LR_D, "warmup": warmup, "schedule": "linear warmup, cosine to 10%",
        "optimizer": "AdamW betas (0.9, 0.95), wd 0.1 on matrices, grad clip 1.0",
        "precision": "bf16 autocast, fp32 master weights",
        "distill_weight": args.distill, "curve": curve,
    })

    # ---- evaluate (fp32 masters and bf16 as shipped), save
    @torch.no_grad()
    def eval_loss(m, chunks):
        m.eval()
        tot, n = 0.0, 0
        for i in range(0, chunks.shape[0], 32):
            b = chunks[i:i + 32].long()
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                lg = m(input_ids=b[:, :-1], use_cache=False).logits
            tot += F.cross_entropy(lg.float().reshape(-1, V), b[:, 1:].reshape(-1), reduction="sum").item()
            n += b[:, 1:].numel()
        m.train()
        return tot / max(1, n)

    @torch.no_grad()
    def agreement(mt, md, chunks):
        mt.eval()
        md.eval()
        same = hit_t = hit_d = n = 0
        for i in range(0, chunks.shape[0], 32):
            b = chunks[i:i + 32].long()
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                at = mt(input_ids=b[:, :-1], use_cache=False).logits.argmax(-1)
                ad = md(input_ids=b[:, :-1], use_cache=False).logits.argmax(-1)
            y = b[:, 1:]
            same += (at == ad).sum().item()
            hit_t += (at == y).sum().item()
            hit_d += (ad == y).sum().item()
            n += y.numel()
        return {"top1_agreement": same / n, "target_top1_acc": hit_t / n, "drafter_top1_acc": hit_d / n}

    losses = {}
    for name, m in (("target", tgt), ("drafter", drf)):
        losses[name] = {"train_fp32": eval_loss(m, eval_train_chunks), "heldout_fp32": eval_loss(m, held_chunks)}
    losses["train_last_50_steps"] = curve[-1] if curve else None
    metrics.set("losses", losses)
    log(f"eval: {json.dumps(losses)}")

    def save(m, d, cfg):
        os.makedirs(d, exist_ok=True)
        m.to(torch.bfloat16)
        m.save_pretrained(d)
        cpath = os.path.join(d, "config.json")
        with open(cpath) as f:
            saved = json.load(f)
        backup = dict(saved)
        # Keep every field (save_pretrained drops some that equal library defaults).
        for k, v in m.config.to_dict().items():
            saved.setdefault(k, v)
        with open(cpath, "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        shutil.copyfile(tok_path, os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(ids), f, indent=2, sort_keys=True)
            f.write("\n")
        gen = {"eos_token_id": [eot, im_end], "pad_token_id": eot, "do_sample": False,
               "transformers_version": transformers.__version__}
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(gen, f, indent=2, sort_keys=True)
            f.write("\n")
        return backup

    dirs = {"target": os.path.join(args.out, "demo-target"), "drafter": os.path.join(args.out, "demo-drafter")}
    backups = {"target": save(tgt, dirs["target"], cfg_t), "drafter": save(drf, dirs["drafter"], cfg_d)}
    files = {}
    for name, d in dirs.items():
        files[name] = {fn: os.path.getsize(os.path.join(d, fn)) for fn in sorted(os.listdir(d))}
    metrics.set("files", files)
    log(f"saved: {json.dumps(files)}")
    del opt_t, opt_d
    tgt.cpu()
    drf.cpu()
    del tgt, drf
    torch.cuda.empty_cache()

    # ---- reload from disk (what ships) and check it
    cls = model_class()

    def load(d, name):
        try:
            m = cls.from_pretrained(d, dtype=torch.bfloat16)
        except Exception as e:
            log(f"reload {name}: {e!r}; retrying with the config as save_pretrained wrote it")
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(backups[name], f, indent=2, sort_keys=True, default=str)
                f.write("\n")
            m = cls.from_pretrained(d, dtype=torch.bfloat16)
        return m.to(dev).eval()

    checks = {}
    try:
        from safetensors import safe_open
        for name, d in dirs.items():
            with safe_open(os.path.join(d, "model.safetensors"), framework="pt") as f:
                keys = list(f.keys())
                dtypes = sorted({str(f.get_slice(k).get_dtype()) for k in keys})
            checks[name] = {"tensors": len(keys), "dtypes": dtypes,
                            "has_lm_head": any(k.startswith("lm_head") for k in keys),
                            "prefix_sample": sorted(keys)[:3]}
    except Exception as e:
        checks["safetensors_error"] = repr(e)
    sample_text = tok.decode(held_docs[0][:400].tolist()) if held_docs else "def f(x):\n    return x\n"
    raw = tok.encode(sample_text).ids
    try:
        from transformers import PreTrainedTokenizerFast
        t1 = PreTrainedTokenizerFast(tokenizer_file=os.path.join(dirs["target"], "tokenizer.json"))
        checks["tokenizer_file"] = {
            "matches_raw": t1(sample_text, add_special_tokens=False)["input_ids"] == raw,
            "roundtrip": t1.decode(raw) == sample_text,
        }
    except Exception as e:
        checks["tokenizer_file_error"] = repr(e)
    # AutoTokenizer must load the model folder as shipped. Try the generic
    # class first; if this library refuses it, ship the first class it takes.
    from transformers import AutoTokenizer
    tried = []
    for cls_name in ("PreTrainedTokenizerFast", "Qwen2Tokenizer", "TokenizersBackend"):
        tmp = os.path.join(args.out, "_tokcheck")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        shutil.copyfile(tok_path, os.path.join(tmp, "tokenizer.json"))
        tc = tokenizer_config(ids)
        tc["tokenizer_class"] = cls_name
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump(tc, f)
        try:
            t2 = AutoTokenizer.from_pretrained(tmp)
            res = {
                "class": cls_name, "loaded_as": type(t2).__name__,
                "matches_raw": t2(sample_text, add_special_tokens=False)["input_ids"] == raw,
                "roundtrip": t2.decode(raw) == sample_text,
                "eos_token": t2.eos_token, "pad_token": t2.pad_token,
                "chat": t2.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                               add_generation_prompt=True),
            }
        except Exception as e:
            res = {"class": cls_name, "error": repr(e)}
        tried.append(res)
        shutil.rmtree(tmp, ignore_errors=True)
        if "error" not in res and res["matches_raw"]:
            if cls_name != "PreTrainedTokenizerFast":
                for d in dirs.values():
                    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                        json.dump(tc, f, indent=2, sort_keys=True)
                        f.write("\n")
            break
    checks["auto_tokenizer"] = tried
    metrics.set("checks", checks)
    log(f"checks: {json.dumps(checks, default=str)}")

    tgt = load(dirs["target"], "target")
    drf = load(dirs["drafter"], "drafter")
    for name, m in (("target", tgt), ("drafter", drf)):
        losses[name]["train_bf16"] = eval_loss(m, eval_train_chunks)
        losses[name]["heldout_bf16"] = eval_loss(m, held_chunks)
        m.eval()
    try:
        losses["agreement_heldout"] = agreement(tgt, drf, held_chunks)
    except Exception as e:
        losses["agreement_error"] = repr(e)
    metrics.set("losses", losses)
    log(f"eval (bf16 reloaded): {json.dumps(losses)}")

    # ---- greedy speculative acceptance on held-out prompts (no cache: recompute)
    def greedy(m, prompts, n_new, stop=()):
        return greedy_decode(m, prompts, n_new, eot, dev, stop)

    def speculate(prompts, k, n_new):
        return speculate_greedy(model_proposer(drf, eot, dev), tgt, prompts, k, n_new, eot, dev)

    accept = {}
    try:
        prompts = acceptance_prompts(held_docs)
        n_new = 128
        t = time.time()
        ref = greedy(tgt, prompts, n_new)
        accept["prompts"] = len(prompts)
        accept["new_tokens"] = n_new
        accept["target_greedy_seconds"] = round(time.time() - t, 1)
        metrics.set("acceptance", accept)
        for k in (4, 8):
            t = time.time()
            res, outs = speculate(prompts, k, n_new)
            res["seconds"] = round(time.time() - t, 1)
            res["outputs_equal_target_greedy"] = sum(o == r for o, r in zip(outs, ref))
            accept[f"block{k}"] = res
            metrics.set("acceptance", accept)
            log(f"accept: block {k}: mean accepted {res['mean_accepted']:.3f} over {res['rounds']} rounds, "
                f"hist {res['histogram']}, {res['outputs_equal_target_greedy']}/{len(prompts)} equal greedy")
    except Exception as e:
        import traceback
        traceback.print_exc()
        accept["error"] = repr(e)
        metrics.set("acceptance", accept)

    # ---- greedy continuations of Python prompts
    samples = []
    try:
        stop = {eot, im_end}
        for p in SAMPLE_PROMPTS:
            pid = tok.encode(p).ids
            s = {"prompt": p}
            for name, m in (("target", tgt), ("drafter", drf)):
                out = greedy(m, [pid], 160, stop=stop)[0]
                s[name] = tok.decode(out, skip_special_tokens=False)
                if name == "target":
                    s["target_ids"] = out
            samples.append(s)
            print(f"----- target greedy: {p!r}\n{p}{s['target']}\n----- drafter greedy:\n{p}{s['drafter']}\n-----",
                  flush=True)
        metrics.set("samples", samples)
        # The library's cached generate path must give the same greedy tokens.
        pid = tok.encode(SAMPLE_PROMPTS[0]).ids
        x = torch.tensor([pid], device=dev)
        g = tgt.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=160, do_sample=False)
        gen_ids = g[0, len(pid):].tolist()
        mine = samples[0]["target_ids"]
        first_diff = next((i for i, (a, b) in enumerate(zip(gen_ids, mine)) if a != b), None)
        metrics.set("generate_check", {"hf_generate_equals_recompute": gen_ids == mine,
                                       "first_difference": first_diff,
                                       "lengths": [len(gen_ids), len(mine)]})
        log(f"generate check: equal={gen_ids == mine}, first difference at {first_diff}")
    except Exception as e:
        import traceback
        traceback.print_exc()
        metrics.set("samples_error", repr(e))
    metrics.set("total_seconds", round(time.time() - T0, 1))
    log("done")


if __name__ == "__main__":
    main()
