"""Rollout decode speed, side by side in one run: rlkube's generation vs HF `model.generate`.

On a machine with a CUDA GPU, from the repository root:
    pip install -e '.[runtime]'
    PYTHONPATH=runtime python3 tests/gpu/bench_rollout.py
    PYTHONPATH=runtime python3 tests/gpu/bench_rollout.py --cpu --tiny  # dry run of every case on CPU

Same for both: a Qwen2.5-1.5B-shaped model from its config (random init; speed does not
depend on weight values), bf16, sdpa attention, the same random 128-token prompts, 256 new
tokens, sampling at temperature 1 (top-p 1, top-k off), EOS ignored so every row decodes all
256 tokens (like for like). HF runs `generate` with a static cache, compiled (the peer), and
with its default dynamic cache. rlkube runs `generation.Decoder`: per-row cache slots, 4-D masks
updated in place, one whole decode step (sampling included) captured as a CUDA graph per
read-length bucket; the figure is its steady state (second call: in RL the decoder is reused
every rollout), and the first call (with graph capture) is printed too. Ablations: rlkube's loop
with HF's own masked sdpa decode attention (which repeats the KV heads), and with attention
over the whole cache every step (one bucket); a cross-check calls HF generate the way TRL's
GRPOTrainer does.

Decode floor: per decode step the GPU must read every weight once and the KV cache of every
row (mean context = prompt + half the new tokens); floor seconds = those bytes / 4.2 TB/s (the
device-to-device copy bandwidth measured on an H200, docs/benchmarks.md; on another card, set
COPY_BANDWIDTH to its own; each run also measures its card's copy bandwidth and prints the share
at that figure, `ours_floor_fraction_own_card`). "floor fraction" = floor time / measured time per step. Decode
tokens/s counts generated tokens only, over the whole call (prefill included, for both).
The peer docs/benchmarks.md names is HF `generate` with `cache_implementation="static"` and its
automatic `torch.compile` of the decode step (first call, compilation included, is a warm-up
and not timed); the dynamic-cache default is printed next to it.

EOS-on case (`--eos-prompts`, default 1024 prompts on `--eos-rows` 256 decode rows, up to
`--eos-new-tokens` 1024): a forward hook on the LM head sets the EOS logit of the sampled
position, the same for every side, so each step ends a completion with a constant probability (a
random-init model never says EOS by itself; tests/gpu/eos_hazard.py). Lengths are then geometric (median
`--eos-median`, long tail, ~3% reach the limit): within a wave of 256 rows the longest row holds
the batch. Rows: rlkube with refill (a finished row takes the next waiting prompt; once none
waits, the busy rows move into smaller batches), rlkube in waves (refill off), rlkube with refill
but without that compaction, rlkube with every prompt in a row of its own at once (what an RL step
does with rollout.decodeRows unset), HF static-cache compiled in waves of the same rows.
`--refill` picks rlkube's rows (on, off, nocompact, all). tokens/s counts each side's own
generated tokens (its samples differ, so the realized lengths are printed per side).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eos_hazard import eos_hazard  # noqa: E402
from model_shapes import SHAPES  # noqa: E402

from rlkube.runtime.engine import decode_batch  # noqa: E402

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


def measured_copy_bandwidth(device, gib: float = 2.0, repeats: int = 10) -> float | None:
    """Bytes/s of a device-to-device copy on this card (read + write, the figure COPY_BANDWIDTH is on
    the H200); None on CPU. The floor at this figure is printed beside the fixed one."""
    if device.type != "cuda":
        return None
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    seconds = time.perf_counter() - t0
    del src, dst
    return 2 * gib * 2**30 * repeats / seconds


def run_hf(model, ids, mask, new: int, device, trl_style: bool = False, static: bool = False,
           eos: int | None = None) -> tuple[float, int]:
    """HF generate; returns (seconds, generated tokens). Default cache unless `static` (static
    cache with HF's automatic compile of the decode step on CUDA). With `eos` rows stop at it;
    without, every row decodes `new` tokens. trl_style: called the way TRL's GRPOTrainer calls it
    (a GenerationConfig with an EOS id and disable_compile, no min_new_tokens) - a cross-check."""
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
        extra = {"cache_implementation": "static", "disable_compile": device.type != "cuda"} if static else {}
        fixed = {"min_new_tokens": new} if eos is None else {}
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, eos_token_id=eos, pad_token_id=0,
                             **fixed, **extra)
    sync(device)
    seconds = time.perf_counter() - t0
    response = out[:, ids.shape[1]:]
    if eos is None:
        if not trl_style:
            assert response.shape[1] == new, out.shape
        return seconds, response.numel()
    # tokens up to and including each row's first EOS
    hit = response == eos
    first = torch.where(hit.any(1), hit.int().argmax(1) + 1, response.shape[1])
    return seconds, int(first.sum())


def run_ours(decoder, ids, mask, new: int, device, seed: int, eos: int | None = None) -> tuple[float, object]:
    from rlkube.runtime.engine.generation import SamplingParams

    params = SamplingParams(max_new_tokens=new, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=eos)
    gen = torch.Generator(device=device).manual_seed(seed)
    sync(device)
    t0 = time.perf_counter()
    out = decoder.generate(ids, mask, params, gen)
    sync(device)
    if eos is None:
        assert out.response_ids.shape[1] == new and out.generated_tokens == ids.shape[0] * new
    return time.perf_counter() - t0, out


def lengths_summary(lengths: torch.Tensor) -> dict:
    q = torch.quantile(lengths.float(), torch.tensor([0.5, 0.9, 0.99]))
    return {"mean": float(lengths.float().mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "max": int(lengths.max())}


# --refill names -> (record key, Decoder batch_rows: None = a row per prompt, refill, compact)
EOS_VARIANTS = {"on": ("refill", True, True), "off": ("waves", False, True),
                "nocompact": ("refill_no_compaction", True, False), "all": ("all_rows", True, True)}


def eos_case(model, args, device, setup) -> dict:
    """EOS on, long-tailed lengths: rlkube refill on / off / all rows at once and HF static compiled."""
    from rlkube.runtime.engine.generation import Decoder

    eos, rows, new = model.config.vocab_size - 1, args.eos_rows, args.eos_new_tokens
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, model.config.vocab_size - 1, (args.eos_prompts, args.prompt_tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    handle = eos_hazard(model, eos, args.eos_median)
    rec = {"case": f"rollout EOS on, {args.eos_prompts} prompts on {rows} rows", "rows": rows,
           "prompts": args.eos_prompts, "new_tokens_max": new, "eos_median_target": args.eos_median,
           "variants": []}
    try:
        # one decoder for the settings on `rows` rows (refill is not part of its graphs): capture
        # and warm up on one wave of prompts; "all" gets its own, warmed up on every prompt
        decoder = Decoder(model, batch_rows=rows, compile_layers=args.compile_layers)
        run_ours(decoder, ids[:rows], mask[:rows], new, device, 11, eos)
        rec["graph_capture_s"] = decoder.last_stats["captureSeconds"]
        for variant in [v for v in args.refill.split(",") if v]:
            name, refill, compact = EOS_VARIANTS[variant]
            if variant == "all":
                decoder.release()
                decoder = Decoder(model, compile_layers=args.compile_layers)
                run_ours(decoder, ids, mask, new, device, 11, eos)
            decoder.refill, decoder.compact = refill, compact
            seconds, out = run_ours(decoder, ids, mask, new, device, 12, eos)
            stats = decoder.last_stats
            rec["variants"].append(name)
            rec[f"ours_{name}_tokens_per_s"] = out.generated_tokens / seconds
            rec[f"ours_{name}_s"] = seconds
            rec[f"ours_{name}_steps"] = stats["steps"]
            rec[f"ours_{name}_lengths"] = lengths_summary(out.response_lengths.cpu())
            rec[f"ours_{name}_row_occupancy"] = stats["row_steps_busy"] / stats["row_steps"]
            rec[f"ours_{name}_compactions"] = stats["compactions"]
        decoder.release()
        hf_s, hf_tokens = 0.0, 0
        waves = [slice(i, i + rows) for i in range(0, args.eos_prompts, rows)]
        run_hf(model, ids[waves[0]], mask[waves[0]], new, device, static=True, eos=eos)  # compile + warm-up
        for wave in waves:
            seconds, tokens = run_hf(model, ids[wave], mask[wave], new, device, static=True, eos=eos)
            hf_s, hf_tokens = hf_s + seconds, hf_tokens + tokens
        rec["hf_static_tokens_per_s"] = hf_tokens / hf_s
        rec["hf_static_mean_length"] = hf_tokens / args.eos_prompts
    finally:
        handle.remove()
    for name in rec["variants"]:
        rec[f"ratio_{name}_vs_hf_static"] = rec[f"ours_{name}_tokens_per_s"] / rec["hf_static_tokens_per_s"]
    if "ours_waves_tokens_per_s" in rec and "ours_refill_tokens_per_s" in rec:
        rec["ratio_refill_vs_waves"] = rec["ours_refill_tokens_per_s"] / rec["ours_waves_tokens_per_s"]
    rec["setup"] = setup
    return rec


def fixed_case(model, graphs, repeat_kv, batch: int, args, device, dtype, setup) -> dict:
    """EOS ignored, every row decodes `--new-tokens` tokens (like for like)."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, args.prompt_tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    new = args.new_tokens
    # HF first, on a GPU our decoder has not touched yet; warm-up of both (kernels, allocator)
    run_hf(model, ids, mask, 4, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    hf, _ = run_hf(model, ids, mask, new, device)
    hf_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    hf_trl, _ = run_hf(model, ids, mask, new, device, trl_style=True)
    run_hf(model, ids, mask, new, device, static=True)  # compilation + warm-up at this shape
    hf_static, _ = run_hf(model, ids, mask, new, device, static=True)
    first, _ = run_ours(graphs, ids, mask, new, device, 1)
    capture = graphs.last_stats["captureSeconds"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ours, _ = run_ours(graphs, ids, mask, new, device, 2)
    ours_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    graphs.release()
    ablations = set(args.ablations.split(","))
    no_gqa = full_read = sdpa_decode = unfused = None
    if "hf-sdpa" in ablations:
        no_gqa, _ = run_ours(repeat_kv, ids, mask, new, device, 3)
        repeat_kv.release()
    if "sdpa-decode" in ablations:
        # sdpa over the read length (grouped-query packed) instead of the live-slot kernel; then
        # also the unfused sampler: the decode step before either kernel
        graphs.live_attention = False
        run_ours(graphs, ids, mask, new, device, 6)
        sdpa_decode, _ = run_ours(graphs, ids, mask, new, device, 7)
        graphs.release()
        graphs.fused_sampling = False
        run_ours(graphs, ids, mask, new, device, 8)
        unfused, _ = run_ours(graphs, ids, mask, new, device, 9)
        graphs.live_attention = graphs.fused_sampling = True
        graphs.release()
    if "full-read" in ablations:
        # attention over the whole cache every step (one read-length bucket)
        graphs.length_buckets = 1
        run_ours(graphs, ids, mask, new, device, 4)
        full_read, _ = run_ours(graphs, ids, mask, new, device, 5)
        graphs.length_buckets = decode_batch.BUCKETS
        graphs.release()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tokens = batch * new

    def rate(seconds):
        return tokens / seconds if seconds else None

    def per_step(seconds):
        return 1e3 * seconds / new if seconds else None

    floor = floor_seconds_per_step(model, batch, args.prompt_tokens, new, torch.finfo(dtype).bits // 8)
    return {
        "case": f"rollout batch {batch}", "batch": batch,
        "ours_tokens_per_s": tokens / ours, "hf_static_tokens_per_s": tokens / hf_static,
        "ratio": hf_static / ours, "hf_tokens_per_s": tokens / hf, "ratio_vs_hf_dynamic": hf / ours,
        "ours_hf_sdpa_decode_tokens_per_s": rate(no_gqa), "hf_trl_style_tokens_per_s": tokens / hf_trl,
        "ours_full_cache_read_tokens_per_s": rate(full_read),
        "ours_sdpa_decode_ms_per_step": per_step(sdpa_decode),
        "ours_sdpa_decode_unfused_sampler_ms_per_step": per_step(unfused),
        "ours_first_call_s": first, "graph_capture_s": capture, "cuda_graphs_used": graphs.cuda_graphs,
        "ours_ms_per_step": 1e3 * ours / new, "hf_static_ms_per_step": 1e3 * hf_static / new,
        "floor_ms_per_step": 1e3 * floor, "ours_floor_fraction": floor / (ours / new),
        # the same floor at this card's own measured copy bandwidth
        "ours_floor_fraction_own_card": (floor * COPY_BANDWIDTH / setup["copy_bandwidth"] / (ours / new)
                                         if setup.get("copy_bandwidth") else None),
        "hf_static_floor_fraction": floor / (hf_static / new),
        "ours_peak_gib": ours_peak / 2**30 if ours_peak else None,
        "hf_peak_gib": hf_peak / 2**30 if hf_peak else None,
        "setup": setup,
    }


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_tables(results: list[dict]) -> None:
    fixed = [r for r in results if "batch" in r]
    if fixed:
        print("\n| case | ours tok/s | HF static compiled tok/s | ratio | HF dynamic tok/s | HF TRL-style tok/s | "
              "ours w/ HF sdpa decode tok/s | ours w/ full-cache reads tok/s | ours w/ sdpa decode ms/step | "
              "ours w/ sdpa decode, unfused sampler ms/step | ours ms/step | floor ms/step | "
              "floor fraction | peak GiB ours/HF |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in fixed:
        peaks = f"{r['ours_peak_gib']:.1f}/{r['hf_peak_gib']:.1f}" if r["ours_peak_gib"] else "-"
        print(f"| {r['case']} | {r['ours_tokens_per_s']:,.0f} | {r['hf_static_tokens_per_s']:,.0f} | "
              f"{r['ratio']:.2f}x | {r['hf_tokens_per_s']:,.0f} | {r['hf_trl_style_tokens_per_s']:,.0f} | "
              f"{fmt(r['ours_hf_sdpa_decode_tokens_per_s'], ',.0f')} | {fmt(r['ours_full_cache_read_tokens_per_s'], ',.0f')} | "
              f"{fmt(r['ours_sdpa_decode_ms_per_step'], '.2f')} | "
              f"{fmt(r['ours_sdpa_decode_unfused_sampler_ms_per_step'], '.2f')} | {r['ours_ms_per_step']:.2f} | "
              f"{r['floor_ms_per_step']:.2f} | {r['ours_floor_fraction']:.2f} | {peaks} |")
    for r in results:
        if "rows" not in r:
            continue
        print(f"\n{r['case']}; HF static compiled (waves of {r['rows']}): {r['hf_static_tokens_per_s']:,.0f} tok/s")
        print("| rlkube rows | tok/s | seconds | / HF static | decode steps | row occupancy | compactions | "
              "lengths p50/p90/max |")
        print("|---|---|---|---|---|---|---|---|")
        for name in r["variants"]:
            lengths = r[f"ours_{name}_lengths"]
            print(f"| {name} | {r[f'ours_{name}_tokens_per_s']:,.0f} | {r[f'ours_{name}_s']:.2f} | "
                  f"{r[f'ratio_{name}_vs_hf_static']:.2f}x | {r[f'ours_{name}_steps']} | "
                  f"{r[f'ours_{name}_row_occupancy']:.2f} | {r[f'ours_{name}_compactions']} | "
                  f"{lengths['p50']:.0f}/{lengths['p90']:.0f}/{lengths['max']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen1.5b", choices=sorted(SHAPES))
    ap.add_argument("--batches", default="64,256", help="fixed-length cases ('' to skip)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--eos-prompts", type=int, default=1024, help="EOS-on case prompts (0 to skip)")
    ap.add_argument("--eos-rows", type=int, default=256)
    ap.add_argument("--eos-new-tokens", type=int, default=1024)
    ap.add_argument("--eos-median", type=float, default=200.0)
    ap.add_argument("--refill", default="on,off,nocompact,all",
                    help="EOS case rlkube rows: on (refill), off (waves), nocompact (refill without compaction), "
                    "all (a row per prompt, at once)")
    ap.add_argument("--cpu", action="store_true", help="run on CPU even where a GPU is present")
    ap.add_argument("--tiny", action="store_true", help="tiny shape and small cases: a dry run of every path")
    ap.add_argument("--compile-layers", action="store_true",
                    help="rlkube decodes through compiled decoder layers (engine/decode_layers.py)")
    ap.add_argument("--ablations", default="hf-sdpa,sdpa-decode,full-read",
                    help="rlkube's loop with one part swapped, fixed cases: hf-sdpa (HF's decode attention, KV heads "
                    "repeated), sdpa-decode (sdpa over the read length instead of the live-slot kernel, then also "
                    "the unfused sampler), full-read (one read-length bucket)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        args.shape, args.batches, args.prompt_tokens, args.new_tokens = "tiny", "4", 16, 16
        args.eos_prompts, args.eos_rows, args.eos_new_tokens, args.eos_median = 24, 4, 48, 8.0

    from rlkube.runtime.engine.generation import Decoder

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(args.shape, device, dtype)
    import transformers

    setup = {
        "model": args.shape, "params": sum(p.numel() for p in model.parameters()), "dtype": str(dtype),
        "attention": "sdpa", "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "temperature": 1.0, "torch": torch.__version__, "transformers": transformers.__version__,
        "hf_static_compiled": device.type == "cuda", "ours_compiled_layers": args.compile_layers,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "copy_bandwidth": measured_copy_bandwidth(device),
    }
    results = []
    graphs = Decoder(model, compile_layers=args.compile_layers)  # static cache + CUDA graphs on GPU
    repeat_kv = Decoder(model)  # ablation: HF's masked sdpa decode (repeats KV heads)
    repeat_kv.gqa_decode = False
    for batch in [int(b) for b in args.batches.split(",") if b]:
        rec = fixed_case(model, graphs, repeat_kv, batch, args, device, dtype, setup)
        print(json.dumps(rec), flush=True)
        results.append(rec)
    if args.eos_prompts:
        rec = eos_case(model, args, device, setup)
        print(json.dumps(rec), flush=True)
        results.append(rec)
    print_tables(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
