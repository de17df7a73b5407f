"""cuda_bench_hf.py - transformers' speed on the shapes bench_cuda_bench uses.

Run on the GPU machine (torch + transformers 5.17):
    python3 bench/cuda_bench_hf.py [--shapes 0.8b,4b] [--batch 1,8] [--steps 10]

Builds Qwen3_5ForCausalLM in bf16 directly on the GPU from a config with the
Qwen3.5-0.8B / -4B shapes (vocab 248320, tied embeddings, layers 3:1; the
values of the weights do not matter for timing), prefills 32 tokens per
sequence, then times, median over `steps`: a greedy decode step (one token
per sequence through the cache, argmax on the GPU) and a verify forward of
1 + k tokens (k = 4, 8, 16) through the cache. Prints the same table layout
as bench_cuda_bench, headed by the path transformers took for the Gated
DeltaNet kernels: flash-linear-attention's Triton kernels (package `fla`,
found on PYTHONPATH, e.g. .carry/pylib) or its torch reference loops, and
causal-conv1d's CUDA kernels or the torch conv. transformers binds each kernel
when its Qwen3.5 module is imported (hub_kernels'
use_kernel_func_from_hub_with_fallback), so the path is read back from those
bindings, not guessed from what is installed. With fla active the kernels are
first compared against the torch reference on random inputs.

    --require-fla   exit 1 unless the delta rule runs on fla
"""
import argparse
import inspect
import statistics
import sys
import time

SHAPES = {
    "0.8b": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
                 num_attention_heads=8, num_key_value_heads=2, linear_num_value_heads=16),
    "4b": dict(hidden_size=2560, num_hidden_layers=32, intermediate_size=9216,
               num_attention_heads=16, num_key_value_heads=4, linear_num_value_heads=32),
}


def make_model(shape):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    s = SHAPES[shape]
    L = s["num_hidden_layers"]
    cfg = Qwen3_5TextConfig(
        vocab_size=248320, head_dim=256, linear_num_key_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=4096,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000,
                         "partial_rotary_factor": 0.25},
        **s)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model = model.to(torch.bfloat16).eval()
    return model


DELTA_SITES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
CONV_SITES = ("causal_conv1d_fn", "causal_conv1d_update")


def kernel_bindings():
    """Function each Gated DeltaNet kernel site runs, None where it is the torch reference.

    The sites are closures made by use_kernel_func_from_hub_with_fallback; their
    `implementation` / `is_new_implementation` cells say what was bound. Releases
    that imported the kernels at module level expose them directly instead."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    sites = {}
    for name in DELTA_SITES + CONV_SITES:
        fn = getattr(mq, name, None)
        try:
            cells = inspect.getclosurevars(fn).nonlocals
        except (TypeError, ValueError):
            cells = {}
        if "implementation" in cells:
            sites[name] = cells["implementation"] if cells.get("is_new_implementation") else None
    if not sites:
        for name, site in (("chunk_gated_delta_rule", DELTA_SITES[0]),
                           ("fused_recurrent_gated_delta_rule", DELTA_SITES[1]),
                           ("causal_conv1d_fn", CONV_SITES[0]),
                           ("causal_conv1d_update", CONV_SITES[1])):
            sites[site] = getattr(mq, name, None)
    return sites


def describe_path(sites):
    """(delta-rule label, conv label, True when the delta rule runs on fla)."""
    def origin(fn):
        return (getattr(fn, "__module__", "") or "").split(".")[0] if fn is not None else None

    delta = {origin(sites.get(n)) for n in DELTA_SITES}
    conv = {origin(sites.get(n)) for n in CONV_SITES}
    on_fla = delta == {"fla"}
    delta_label = ("fla kernels" if on_fla else "torch fallback" if delta == {None}
                   else f"mixed {sorted(map(str, delta))}")
    conv_label = ("causal-conv1d kernels" if conv == {"causal_conv1d"} else "torch conv" if conv == {None}
                  else f"mixed {sorted(map(str, conv))}")
    return delta_label, conv_label, on_fla


def check_delta_rule():
    """Bound fla kernels against transformers' torch reference (the wrapped function) on one
    random problem with a carried-in state, as the chunked prefill/verify and the decode call them."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, K = 2, 37, 16, 128
    q, k, v = (torch.randn(B, T, H, K, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    beta = torch.rand(B, T, H, device="cuda", generator=gen).to(torch.bfloat16)
    gate = -torch.rand(B, T, H, device="cuda", generator=gen)
    h0 = 0.1 * torch.randn(B, H, K, K, device="cuda", generator=gen)
    for name, n in ((DELTA_SITES[0], T), (DELTA_SITES[1], 1)):
        fn = getattr(mq, name)
        kw = dict(g=gate[:, :n], beta=beta[:, :n], initial_state=h0, output_final_state=True,
                  use_qk_l2norm_in_kernel=True)
        o, s = fn(q[:, :n], k[:, :n], v[:, :n], **kw)
        o_ref, s_ref = fn.__wrapped__(q[:, :n], k[:, :n], v[:, :n], **kw)
        print(f"check {name} (T={n}): max |out - ref| {(o.float() - o_ref.float()).abs().max().item():.2e}"
              f" (ref max {o_ref.float().abs().max().item():.2e}), max |state - ref| "
              f"{(s.float() - s_ref.float()).abs().max().item():.2e}")


def time_steps(model, batch, k, steps):
    import torch
    V = 248320
    prompt = torch.tensor([[(i * 7919 + 13 + b) % V for i in range(32)] for b in range(batch)],
                          device="cuda")
    times = []
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        pkv = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for s in range(steps + 2):
            if k == 0:
                ids = nxt
            else:
                ids = torch.cat([nxt, (nxt + torch.arange(1, k + 1, device="cuda")) % V], 1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=ids, past_key_values=pkv, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            if s >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
            pkv = out.past_key_values
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="0.8b,4b")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--require-fla", action="store_true")
    a = ap.parse_args()
    import torch
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    sites = kernel_bindings()
    for name, fn in sites.items():
        where = "torch reference" if fn is None else f"{fn.__module__}.{fn.__qualname__}"
        print(f"  {name}: {where}")
    delta_label, conv_label, on_fla = describe_path(sites)
    if on_fla:
        import fla
        print(f"fla {fla.__version__} from {fla.__file__}")
        try:
            check_delta_rule()
        except Exception as e:  # a kernel that fails here fails in the timed rows too
            print("check failed:", repr(e))
    elif a.require_fla:
        print("error: the delta rule is not on fla (is fla on PYTHONPATH?)")
        return 1
    print(f"\n### transformers with {delta_label} (causal conv: {conv_label})\n")
    print("| shape | batch | step | median ms | tokens/s (rows) |\n|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        try:
            model = make_model(shape)
        except Exception as e:
            print(f"{shape}: cannot build the model: {e!r}")
            continue
        for b in [int(x) for x in a.batch.split(",")]:
            for k in (0, 4, 8, 16):
                try:
                    ms = time_steps(model, b, k, a.steps)
                except Exception as e:
                    print(f"| {shape} | {b} | k={k} | failed: {e!r} | |")
                    continue
                step = "decode" if k == 0 else f"verify k={k}"
                print(f"| {shape} | {b} | {step} | {ms:.3f} | {b * (k + 1) / ms * 1e3:.0f} |",
                      flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
