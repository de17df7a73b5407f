#!/usr/bin/env python3
"""Reference fixtures for the hybrid model engine.

Builds several small random Qwen3.5 text models with Hugging Face
transformers (Qwen3_5TextConfig / Qwen3_5ForCausalLM), saves them in the
Hugging Face layout and records transformers' logits for

  * a prefill of the prompt (one forward call, use_cache=True),
  * a multi-token continuation through the returned cache,
  * a single decode step through the cache,
  * the whole token sequence in one call without a cache ("full": only
    compared in the log, to show the cached path is sound),
  * for weights stored in bf16/fp16: the same sequence with the stored
    weights upcast to fp32 and everything computed in fp32 ("f32up").

Output folder layout (one sub-folder per fixture):
  <name>/model/           config.json + safetensors (HF layout)
  <name>/meta.json        token ids of each call, dtype, notes
  <name>/cached.npy       float32 [T0+T1+1, vocab]: prefill, continuation, decode
  <name>/f32up.npy        float32 [T0+T1+1, vocab] (bf16/fp16 weights only)

Run on a machine with torch and transformers 5.x (the GPU machine):
  python3 tools/engine_fixtures.py OUT_DIR [NAME ...]
The reference runs on CPU torch for determinism.
"""
import json
import zlib
import math
import os
import shutil
import sys
import traceback

import numpy as np

FIXTURES = [
    # fp32, Hv > Hk, untied, 3:1 pattern, head_dim 32, rotary 0.5, prefill
    # of 70 tokens crosses the 64-token chunk boundary of the chunked rule.
    dict(name="f32_gqa", dtype="float32", vocab=384, hidden=64, inter=128,
         layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
         nh=4, nkv=2, head_dim=32, lk=2, lv=4, dk=16, dv=16, rotary=0.5, theta=10000.0,
         tied=False, prefill=70, cont=5),
    # fp32, tied, attention first, Dk != Dv, head_dim 48, rotary 0.25.
    dict(name="f32_tied", dtype="float32", vocab=256, hidden=48, inter=96,
         layer_types=["full_attention", "linear_attention", "linear_attention"],
         nh=2, nkv=1, head_dim=48, lk=2, lv=2, dk=24, dv=16, rotary=0.25, theta=1000000.0,
         tied=True, prefill=24, cont=4),
    # bf16, Hv = 3 Hk, alternating pattern, head_dim 64.
    dict(name="bf16_alt", dtype="bfloat16", vocab=512, hidden=96, inter=160,
         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
         nh=2, nkv=1, head_dim=64, lk=2, lv=6, dk=16, dv=32, rotary=0.25, theta=10000000.0,
         tied=False, prefill=33, cont=6),
    # bf16, tied, saved as a qwen3_5 wrapper config (text_config, no
    # layer_types but full_attention_interval) with model.language_model.
    # tensor prefixes; prefill crosses a chunk boundary.
    dict(name="bf16_wrapped", dtype="bfloat16", vocab=320, hidden=64, inter=128,
         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
         nh=2, nkv=2, head_dim=32, lk=1, lv=2, dk=32, dv=16, rotary=0.5, theta=10000.0,
         tied=True, prefill=66, cont=3, wrap=True, interval=2),
    # fp32 sharded into several files with an index; full rotary.
    dict(name="f32_sharded", dtype="float32", vocab=300, hidden=48, inter=64,
         layer_types=["linear_attention", "full_attention"],
         nh=2, nkv=1, head_dim=16, lk=2, lv=4, dk=8, dv=8, rotary=1.0, theta=10000.0,
         tied=False, prefill=20, cont=4, shard="60KB"),
    # fp16 storage (weights of an fp32 model cast to fp16), fp32 reference on
    # the upcast weights only (torch's fp16 CPU path is not the target).
    dict(name="f16_store", dtype="float16", vocab=256, hidden=48, inter=96,
         layer_types=["linear_attention", "full_attention", "linear_attention"],
         nh=2, nkv=1, head_dim=32, lk=2, lv=4, dk=16, dv=16, rotary=0.25, theta=10000.0,
         tied=False, prefill=21, cont=3),
    # fp32 with dimensions that are not multiples of 8 (hidden 52, MLP 70,
    # Dk 12, Dv 10, head_dim 20, rotary 8): the SIMD kernels' scalar tails.
    dict(name="f32_odd", dtype="float32", vocab=270, hidden=52, inter=70,
         layer_types=["linear_attention", "full_attention", "linear_attention"],
         nh=2, nkv=1, head_dim=20, lk=2, lv=2, dk=12, dv=10, rotary=0.4, theta=10000.0,
         tied=False, prefill=30, cont=3),
    # bf16 with the head sizes of the released models (head_dim 256, rotary
    # 64, linear heads of 128) on a small hidden size.
    dict(name="bf16_realdims", dtype="bfloat16", vocab=256, hidden=64, inter=128,
         layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
         nh=2, nkv=1, head_dim=256, lk=1, lv=2, dk=128, dv=128, rotary=0.25, theta=10000000.0,
         tied=True, prefill=40, cont=4),
]


def log(*a):
    print(*a, flush=True)


def make_config(f):
    from transformers import Qwen3_5TextConfig
    kw = dict(
        vocab_size=f["vocab"], hidden_size=f["hidden"], intermediate_size=f["inter"],
        num_hidden_layers=len(f["layer_types"]), num_attention_heads=f["nh"],
        num_key_value_heads=f["nkv"], head_dim=f["head_dim"],
        linear_num_key_heads=f["lk"], linear_num_value_heads=f["lv"],
        linear_key_head_dim=f["dk"], linear_value_head_dim=f["dv"],
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=f["tied"],
        layer_types=list(f["layer_types"]), max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": f["theta"],
                         "partial_rotary_factor": f["rotary"]},
    )
    try:
        cfg = Qwen3_5TextConfig(partial_rotary_factor=f["rotary"], **kw)
    except Exception as e:  # strict configs may refuse the extra keyword
        log("config: partial_rotary_factor kwarg refused:", repr(e))
        cfg = Qwen3_5TextConfig(**kw)
    return cfg


def randomise(model, seed):
    """Replace the default init by values that give non-degenerate logits:
    linears ~ N(0, 1/in), embeddings ~ N(0,1), zero-centred norms ~ N(0, 0.2),
    gated norm ~ 1 + N(0, 0.2), conv ~ N(0, 0.4), A_log/dt_bias spread."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith("A_log"):
                v = torch.log(torch.empty(shape).uniform_(0.05, 2.0, generator=g))
            elif name.endswith("dt_bias"):
                v = torch.randn(shape, generator=g) * 0.5
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + torch.randn(shape, generator=g) * 0.2
            elif name.endswith("norm.weight"):
                v = torch.randn(shape, generator=g) * 0.2
            elif "conv1d" in name:
                v = torch.randn(shape, generator=g) * 0.4
            elif "embed_tokens" in name:
                v = torch.randn(shape, generator=g)
            elif p.dim() == 2:
                v = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            else:
                v = torch.randn(shape, generator=g) * 0.1
            p.copy_(v.to(p.dtype))


def load(path, dtype):
    import torch
    from transformers import Qwen3_5ForCausalLM
    try:
        m = Qwen3_5ForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    except TypeError:
        m = Qwen3_5ForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation="eager")
    m.eval()
    return m


def run_sequence(model, ids0, ids1, ids2):
    import torch
    with torch.no_grad():
        o0 = model(input_ids=torch.tensor([ids0]), use_cache=True)
        pkv = o0.past_key_values
        o1 = model(input_ids=torch.tensor([ids1]), past_key_values=pkv, use_cache=True)
        pkv = o1.past_key_values
        o2 = model(input_ids=torch.tensor([ids2]), past_key_values=pkv, use_cache=True)
        cached = torch.cat([o0.logits[0], o1.logits[0], o2.logits[0]], 0).float().numpy()
        full = model(input_ids=torch.tensor([ids0 + ids1 + ids2]), use_cache=False).logits[0].float().numpy()
    return cached, full


def build(f, out_root):
    import torch
    from transformers import Qwen3_5ForCausalLM
    name = f["name"]
    d = os.path.join(out_root, name)
    mdir = os.path.join(d, "model")
    os.makedirs(mdir, exist_ok=True)
    torch.manual_seed(1234)
    cfg = make_config(f)
    log(f"[{name}] rope_parameters={getattr(cfg, 'rope_parameters', None)} layer_types={cfg.layer_types}")
    model = Qwen3_5ForCausalLM(cfg)
    try:
        model.config._attn_implementation = "eager"
    except Exception:
        pass
    randomise(model, seed=zlib.crc32(name.encode()) % 100000)
    store = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[f["dtype"]]
    model = model.to(store)
    kwargs = {}
    if f.get("shard"):
        kwargs["max_shard_size"] = f["shard"]
    model.save_pretrained(mdir, safe_serialization=True, **kwargs)
    log(f"[{name}] saved: {sorted(os.listdir(mdir))}")

    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ids0 = [int(x) for x in rng.integers(0, f["vocab"], f["prefill"])]
    ids1 = [int(x) for x in rng.integers(0, f["vocab"], f["cont"])]
    ids2 = [int(rng.integers(0, f["vocab"]))]

    # Reference in the stored dtype (bf16 / fp32); fp16 storage is run in fp32 only.
    run_dtype = torch.float32 if store == torch.float16 else store
    ref = load(mdir, run_dtype)
    inv = ref.model.rotary_emb.inv_freq
    log(f"[{name}] inv_freq len={inv.numel()} first={inv[:3].tolist()} head_dim={f['head_dim']} rotary={f['rotary']}")
    cached, full = run_sequence(ref, ids0, ids1, ids2)
    np.save(os.path.join(d, "cached.npy"), cached.astype(np.float32))
    dcf = float(np.abs(cached - full).max())
    log(f"[{name}] max|logit|={float(np.abs(cached).max()):.4f} max|cached-full|={dcf:.3e}")
    # Per-part deviation tells whether the continuation honours the cache.
    t0, t1 = len(ids0), len(ids1)
    for part, sl in (("prefill", slice(0, t0)), ("cont", slice(t0, t0 + t1)), ("decode", slice(t0 + t1, None))):
        log(f"[{name}]   {part}: max|cached-full|={float(np.abs(cached[sl] - full[sl]).max()):.3e}")
    meta = dict(name=name, dtype=f["dtype"], calls=[ids0, ids1, ids2], vocab=f["vocab"],
                layer_types=f["layer_types"], max_abs_cached_minus_full=dcf)
    if store != torch.float32:
        up = load(mdir, torch.float32)
        c32, f32 = run_sequence(up, ids0, ids1, ids2)
        np.save(os.path.join(d, "f32up.npy"), c32.astype(np.float32))
        meta["max_abs_f32up_cached_minus_full"] = float(np.abs(c32 - f32).max())
        meta["max_abs_stored_minus_f32up"] = float(np.abs(cached - c32).max())
        log(f"[{name}] f32up: max|bf16-f32up|={meta['max_abs_stored_minus_f32up']:.4e} "
            f"max|f32up cached-full|={meta['max_abs_f32up_cached_minus_full']:.3e} "
            f"argmax agree={float((cached.argmax(1) == c32.argmax(1)).mean()):.3f}")

    if f.get("wrap"):
        wrap(mdir, f)
    with open(os.path.join(d, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    # Keep names in the log so a surprise in the saved layout shows at once.
    from safetensors import safe_open
    for fn in sorted(os.listdir(mdir)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(mdir, fn), "pt") as sf:
                keys = list(sf.keys())
                log(f"[{name}] {fn}: {len(keys)} tensors, e.g. {keys[:3]} dtype={sf.get_tensor(keys[0]).dtype}")


def wrap(mdir, f):
    """Rewrite a saved text model as a qwen3_5 wrapper checkpoint: tensors
    renamed model.* -> model.language_model.*, config nested under
    text_config, layer_types replaced by full_attention_interval."""
    from safetensors.torch import load_file, save_file
    p = os.path.join(mdir, "model.safetensors")
    t = load_file(p)
    out = {}
    for k, v in t.items():
        nk = "model.language_model." + k[len("model."):] if k.startswith("model.") else k
        out[nk] = v.contiguous()
    save_file(out, p, metadata={"format": "pt"})
    with open(os.path.join(mdir, "config.json")) as fh:
        cfg = json.load(fh)
    text = dict(cfg)
    text.pop("architectures", None)
    text["model_type"] = "qwen3_5_text"
    text.pop("layer_types", None)
    text["full_attention_interval"] = f["interval"]
    top = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "text_config": text, "tie_word_embeddings": f["tied"],
           "vision_config": {"depth": 1, "hidden_size": 16}}
    with open(os.path.join(mdir, "config.json"), "w") as fh:
        json.dump(top, fh, indent=1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "engine_fixtures_out"
    import torch
    import transformers
    log(f"torch {torch.__version__} transformers {transformers.__version__}")
    torch.set_num_threads(4)
    try:
        import transformers.models.qwen3_5.modeling_qwen3_5 as mq
        import inspect
        src = inspect.getsource(mq)
        for needle in ("def l2norm", "use_precomputed_states", "initial_state=recurrent_state",
                       "is_fast_path_available", "def torch_chunk_gated_delta_rule"):
            log(f"modeling has {needle!r}: {needle in src}")
        i = src.find("class Qwen3_5GatedDeltaNet")
        j = src.find("def forward", i)
        log("----- GatedDeltaNet.forward (excerpt) -----")
        log(src[j:j + 4200])
        k = src.find("def torch_chunk_gated_delta_rule")
        log(src[k:k + 900])
    except Exception:
        traceback.print_exc()
    only = set(sys.argv[2:])  # optional fixture names: build just those
    failed = []
    for f in FIXTURES:
        if only and f["name"] not in only:
            continue
        try:
            build(f, out)
        except Exception:
            traceback.print_exc()
            failed.append(f["name"])
    log("failed:", failed)


if __name__ == "__main__":
    main()
