"""cuda_bench_hf.py - transformers' speed on the shapes bench_cuda_bench uses.

Run on the GPU machine (torch + transformers 5.17):
    python3 bench/cuda_bench_hf.py [--shapes 0.8b,4b] [--batch 1,8] [--steps 10]

Builds Qwen3_5ForCausalLM in bf16 directly on the GPU from a config with the
Qwen3.5-0.8B / -4B shapes (vocab 248320, tied embeddings, layers 3:1; the
values of the weights do not matter for timing), prefills 32 tokens per
sequence, then times, median over `steps`: a greedy decode step (one token
per sequence through the cache, argmax on the GPU) and a verify forward of
1 + k tokens (k = 4, 8, 16) through the cache. Prints the same table layout
as bench_cuda_bench. Which delta-rule kernels transformers uses (the fla /
causal-conv1d fast path or its torch fallback) is printed too.
"""
import argparse
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
    a = ap.parse_args()
    import torch
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}")
    try:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
        fast = {n: getattr(mq, n, None) is not None for n in
                ("causal_conv1d_fn", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")}
        print("transformers fast-path kernels available:", fast)
    except Exception as e:  # informational only
        print("could not inspect the delta-rule path:", repr(e))
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
