"""Rollout decode speed, side by side in one run: rlkube's generation vs HF `model.generate`.

On a machine with a CUDA GPU, from the repository root:
    pip install -e '.[runtime]'
    PYTHONPATH=runtime python3 tests/gpu/bench_rollout.py
    PYTHONPATH=runtime python3 tests/gpu/bench_rollout.py --shape tiny --batches 4 --new-tokens 16  # CPU smoke

Same for both: a Qwen2.5-1.5B-shaped model from its config (random init; speed does not
depend on weight values), bf16, sdpa attention, the same random 128-token prompts, 256 new
tokens, sampling at temperature 1 (top-p 1, top-k off), EOS ignored so every row decodes all
256 tokens (like for like). HF runs `generate` with its default (dynamic) cache. rlkube runs
`generation.Decoder`: static cache, prebuilt 4-D masks, one decode step captured as a CUDA graph;
the figure is its steady state (second call: in RL the decoder is reused every rollout), and the
first call (with graph capture) is printed too. An ablation runs rlkube's loop with HF's own
masked sdpa decode attention (which repeats the KV heads), and a cross-check calls HF generate
the way TRL's GRPOTrainer does.

Decode floor: per decode step the GPU must read every weight once and the KV cache of every
row (mean context = prompt + half the new tokens); floor seconds = those bytes / 4.2 TB/s (the
device-to-device copy bandwidth measured on an H200, docs/benchmarks.md; on another card, set
COPY_BANDWIDTH to its own). "floor fraction" = floor time / measured time per step. Decode
tokens/s counts generated tokens only, over the whole call (prefill included, for both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import SHAPES  # noqa: E402

COPY_BANDWIDTH = 4.2e12


def build(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def floor_seconds_per_step(model, batch: int, prompt: int, new: int, dtype_bytes: int) -> float:
    cfg = model.config
    weights = sum(p.numel() for p in model.parameters()) * dtype_bytes  # tied head counted once
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * dtype_bytes
    mean_context = prompt + new / 2
    return (weights + batch * mean_context * kv_per_token) / COPY_BANDWIDTH


def run_hf(model, ids, mask, new: int, device, trl_style: bool = False) -> float:
    """HF generate, default cache. trl_style: called the way TRL's GRPOTrainer calls it (a
    GenerationConfig with an EOS id and disable_compile, no min_new_tokens) - a cross-check."""
    from transformers import GenerationConfig

    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    sync(device)
    t0 = time.perf_counter()
    if trl_style:
        config = GenerationConfig(max_new_tokens=new, do_sample=True, pad_token_id=0, eos_token_id=[258],
                                  temperature=1.0, top_p=1.0, top_k=0, disable_compile=True)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    else:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=True, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=None,
                             pad_token_id=0)
    sync(device)
    if not trl_style:
        assert out.shape[1] == ids.shape[1] + new, out.shape
    return time.perf_counter() - t0


def run_ours(decoder, ids, mask, new: int, device, seed: int) -> float:
    from rlkube.runtime.engine.generation import SamplingParams

    params = SamplingParams(max_new_tokens=new, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=None)
    gen = torch.Generator(device=device).manual_seed(seed)
    sync(device)
    t0 = time.perf_counter()
    out = decoder.generate(ids, mask, params, gen)
    sync(device)
    assert out.response_ids.shape[1] == new and out.generated_tokens == ids.shape[0] * new
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen1.5b", choices=sorted(SHAPES))
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from rlkube.runtime.engine.generation import Decoder

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(args.shape, device, dtype)
    import transformers

    setup = {
        "model": args.shape, "params": sum(p.numel() for p in model.parameters()), "dtype": str(dtype),
        "attention": "sdpa", "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "temperature": 1.0, "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    vocab = model.config.vocab_size
    results = []
    graphs = Decoder(model)  # static cache + CUDA graphs on GPU
    repeat_kv = Decoder(model)  # ablation: HF's masked sdpa decode (repeats KV heads)
    repeat_kv.gqa_decode = False
    for batch in [int(b) for b in args.batches.split(",")]:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, vocab, (batch, args.prompt_tokens), generator=g).to(device)
        mask = torch.ones_like(ids)
        new = args.new_tokens
        # HF first, on a GPU our decoder has not touched yet; warm-up of both (kernels, allocator)
        run_hf(model, ids, mask, 4, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        hf = run_hf(model, ids, mask, new, device)
        hf_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        hf_trl = run_hf(model, ids, mask, new, device, trl_style=True)
        first = run_ours(graphs, ids, mask, new, device, 1)
        capture = graphs.last_capture_seconds
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ours = run_ours(graphs, ids, mask, new, device, 2)
        ours_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        graphs.release()
        no_gqa = run_ours(repeat_kv, ids, mask, new, device, 3)
        repeat_kv.release()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        tokens = batch * new
        floor = floor_seconds_per_step(model, batch, args.prompt_tokens, new, torch.finfo(dtype).bits // 8)
        rec = {
            "case": f"rollout batch {batch}", "batch": batch,
            "ours_tokens_per_s": tokens / ours, "hf_tokens_per_s": tokens / hf, "ratio": hf / ours,
            "ours_hf_sdpa_decode_tokens_per_s": tokens / no_gqa, "hf_trl_style_tokens_per_s": tokens / hf_trl,
            "ours_first_call_s": first, "graph_capture_s": capture, "cuda_graphs_used": graphs.cuda_graphs,
            "ours_ms_per_step": 1e3 * ours / new, "hf_ms_per_step": 1e3 * hf / new,
            "floor_ms_per_step": 1e3 * floor, "ours_floor_fraction": floor / (ours / new),
            "hf_floor_fraction": floor / (hf / new),
            "ours_peak_gib": ours_peak / 2**30 if ours_peak else None,
            "hf_peak_gib": hf_peak / 2**30 if hf_peak else None,
            "setup": setup,
        }
        print(json.dumps(rec), flush=True)
        results.append(rec)
    print("\n| case | ours tok/s | HF generate tok/s | ratio | HF TRL-style tok/s | ours w/ HF sdpa decode tok/s | ours ms/step | floor ms/step | floor fraction | peak GiB ours/HF |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        peaks = f"{r['ours_peak_gib']:.1f}/{r['hf_peak_gib']:.1f}" if r["ours_peak_gib"] else "-"
        print(f"| {r['case']} | {r['ours_tokens_per_s']:,.0f} | {r['hf_tokens_per_s']:,.0f} | {r['ratio']:.2f}x | "
              f"{r['hf_trl_style_tokens_per_s']:,.0f} | {r['ours_hf_sdpa_decode_tokens_per_s']:,.0f} | "
              f"{r['ours_ms_per_step']:.2f} | {r['floor_ms_per_step']:.2f} | "
              f"{r['ours_floor_fraction']:.2f} | {peaks} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
