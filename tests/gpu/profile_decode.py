"""Where a decode step's time goes: the rollout decoder's captured step, replayed and profiled.

On a CUDA machine, from the repository root:
    PYTHONPATH=runtime python3 tests/gpu/profile_decode.py                  # Qwen2.5-1.5B shape, batch 256
    PYTHONPATH=runtime python3 tests/gpu/profile_decode.py --shape llama1b --batch 64

One JSON line:
- first call (graph capture included) and steady-state call: seconds, tokens/s, ms per decode
  step (256 tokens per row, EOS off), and that against the read floor (bench_rollout's);
- each read-length bucket's captured graph replayed alone: ms per step;
- a kernel profile of one un-captured step at the longest read length (torch.profiler), with the
  decoder's own attention as inside generate: kernel launches per step, the kernels' summed
  time, and the 12 costliest kernels. A captured graph's replay costs about the summed kernel
  time plus a small gap per kernel, so the launch count and the sum say whether small kernels or
  memory-bound big ones own the step. Findings in docs/benchmarks.md ("Rollout").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_rollout import build, floor_seconds_per_step, run_ours  # noqa: E402

from rlkube.runtime.engine.generation import Decoder, decode_attention  # noqa: E402


def replay_ms(graph: torch.cuda.CUDAGraph, n: int = 20) -> float:
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / n


def kernel_profile(decoder: Decoder, read_len: int, top: int = 12) -> dict:
    from torch.profiler import ProfilerActivity, profile

    batch = decoder._batch
    steps = 3
    # The decoder's own attention (the live-slot kernel on CUDA), without autograd, as inside generate.
    with torch.no_grad(), decode_attention(decoder.model, decoder.gqa_decode), decoder.compiled_layers:
        batch._step(read_len)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                batch._step(read_len)
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
    total_us = sum(e.device_time_total for e in kernels) / steps
    count = sum(e.count for e in kernels) / steps
    rows = sorted(kernels, key=lambda e: -e.device_time_total)[:top]
    return {"kernelsPerStep": round(count), "kernelMsPerStep": round(total_us / 1e3, 3),
            "top": [{"name": e.key[:90], "msPerStep": round(e.device_time_total / steps / 1e3, 3),
                     "callsPerStep": round(e.count / steps)} for e in rows]}


def run(model, ids, mask, args, device) -> dict:
    decoder = Decoder(model, compile_layers=args.compile_layers)
    first, _ = run_ours(decoder, ids, mask, args.new_tokens, device, seed=0)
    steady, _ = run_ours(decoder, ids, mask, args.new_tokens, device, seed=1)
    batch = decoder._batch
    tokens = ids.shape[0] * args.new_tokens
    return {"firstCallSeconds": round(first, 2), "steadySeconds": round(steady, 3),
            "tokensPerSecond": round(tokens / steady), "msPerStep": round(1e3 * steady / args.new_tokens, 3),
            "replayMsPerBucket": {str(k): round(replay_ms(g), 3) for k, g in sorted(batch.graphs.items())},
            "profile": kernel_profile(decoder, max(batch.buckets))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen1.5b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--compile-layers", action="store_true", help="decode through compiled layers (decode_layers.py)")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    model = build(args.shape, device, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size - 1, (args.batch, args.prompt_tokens), device=device, generator=gen)
    mask = torch.ones_like(ids)
    floor = floor_seconds_per_step(model, args.batch, args.prompt_tokens, args.new_tokens, 2)
    result = run(model, ids, mask, args, device)
    result["floorFraction"] = round(floor / (result["msPerStep"] / 1e3), 3)
    print(json.dumps({"shape": args.shape, "batch": args.batch, "compileLayers": args.compile_layers, **result}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
