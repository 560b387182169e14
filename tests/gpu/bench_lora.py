"""DPO with LoRA next to full fine-tuning, side by side in one run: memory and speed.

On a machine with a CUDA GPU, from the repository root (both cases should take about 2 minutes
on an H200, estimated from bench_dpo's ~2 s steps: not run there yet):
    PYTHONPATH=runtime python3 tests/gpu/bench_lora.py                    # Qwen2.5-1.5B shape
    PYTHONPATH=runtime python3 tests/gpu/bench_lora.py --shape tiny --cpu # CPU dry run (seconds)

Same for both cases, from bench_dpo.py's config builder: a model of the shape built from its
config (random init: speed and memory do not depend on weight values), bf16 on CUDA, attention
'auto', the same synthetic pairs (same seed), the same pairs per optimizer step and token budget,
no gradient checkpointing, one GPU. The only difference is `model.lora`:
- full: every weight trains; the reference is a frozen second copy of the model;
- lora: rank 16 (alpha 32) adapters on the attention and MLP projections (q, k, v, o, gate, up,
  down); the base is frozen and, with the adapters off, is the reference (one base copy).

Measured per case: peak GPU memory allocated over the whole case (model build included), the
parameter bytes held (each storage counted once, policy and reference together), the trainable
parameter bytes, the optimizer-state bytes (AdamW moments, after the timed steps), tokens/s of
real tokens and step seconds over the timed steps after warm-up. The trainer's MFU is printed as
it computes it, 3x the forward FLOPs for every token; a LoRA step needs less (no weight gradients
of the frozen base, about 2x), so its MFU reads low by that much. Prints one JSON object per case,
one comparison object (lora / full), then a table.
"""

from __future__ import annotations

import sys

if "--cpu" in sys.argv:  # before torch sees a GPU
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dpo import runtime_config, versions  # noqa: E402
from model_shapes import SHAPES  # noqa: E402

from rlkube.runtime.engine.models import parameter_storage_bytes  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def case_config(args, lora: bool):
    """bench_dpo.py's DPO config for the fixed-length or long-tailed case, with or without LoRA."""
    from rlkube.runtime.contract.config import RuntimeConfig

    case = {"mix": args.mix, "max_len": args.max_len}
    out = tempfile.mkdtemp(prefix=f"bench-lora-{'lora' if lora else 'full'}-")
    cfg = runtime_config(args, case, out).model_dump(mode="json", by_alias=True, exclude_none=True)
    if lora:
        cfg["model"]["lora"] = {"rank": args.rank, "alpha": 2.0 * args.rank, "targetModules": TARGETS}
    return RuntimeConfig.model_validate(cfg)



def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for state in optimizer.state.values()
               for v in state.values() if torch.is_tensor(v) and v.dim() > 0)


def run_case(args, lora: bool) -> dict:
    from rlkube.runtime.engine.lora import ReferenceView
    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers.dpo import DPOTrainer

    cuda = torch.cuda.is_available()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    # what an earlier case left allocated would inflate this case's peak: shown, not hidden
    left_over = torch.cuda.memory_allocated() / 2**30 if cuda else None
    config = case_config(args, lora)
    t0 = time.perf_counter()
    trainer = DPOTrainer(config, init_from_env({"actor": [0], "reference": [0]}))
    setup = time.perf_counter() - t0
    recs = [trainer.end_step(trainer.step(s)).log_line() for s in range(args.warmup + args.steps)]
    timed = recs[args.warmup:]
    seconds = sum(r["seconds"] for r in timed)
    reference = trainer.reference.actor if isinstance(trainer.reference, ReferenceView) else trainer.reference
    trainable = [p for p in trainer.policy.parameters() if p.requires_grad]
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    res = {
        "case": "lora" if lora else "full",
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "allocated_at_start_gib": left_over,
        "parameter_gib": parameter_storage_bytes(trainer.policy, reference) / 2**30,
        "reference_is_view": isinstance(trainer.reference, ReferenceView),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "trainable_gib": sum(p.numel() * p.element_size() for p in trainable) / 2**30,
        "optimizer_state_gib": optimizer_state_bytes(trainer.optimizer) / 2**30,
        "tokens_per_s": sum(r["tokens"] for r in timed) / seconds,
        "step_s_median": statistics.median(r["seconds"] for r in timed),
        "step_s": [round(r["seconds"], 4) for r in timed],
        "mfu_as_reported": sum(m * r["seconds"] for m, r in zip(mfu, timed, strict=False)) / seconds if mfu else None,
        "setup_s": round(setup, 2),
        "attention": trainer.attention,
        "micro_batches": [r["microBatches"] for r in timed],
        "loss": [round(r["loss"], 5) for r in recs],
    }
    trainer.close()
    del trainer, reference, trainable
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return res


def size(gib: float | None) -> str:
    if gib is None:
        return "-"
    return f"{gib:.2f}G" if gib >= 1 else f"{gib * 1024:.3g}M"


def table(rows: list[dict]) -> str:
    f = lambda v, spec: "-" if v is None else spec.format(v)  # noqa: E731
    lines = [f"{'case':<5} {'peak mem':>9} {'params':>8} {'trainable':>10} {'optim state':>12} {'tok/s':>9} "
             f"{'step s':>7} {'MFU*':>5}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<5} error: {r['error'][:200]}")
            continue
        lines.append(f"{r['case']:<5} {size(r['peak_memory_gib']):>9} {size(r['parameter_gib']):>8} "
                     f"{size(r['trainable_gib']):>10} {size(r['optimizer_state_gib']):>12} {r['tokens_per_s']:>9.0f} "
                     f"{r['step_s_median']:>7.3f} {f(r['mfu_as_reported'], '{:.0%}'):>5}")
    lines.append("(*MFU as the trainer reports it: 3x forward FLOPs a token, which a LoRA step does not need)")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen1.5b", choices=sorted(SHAPES))
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is visible (dry run)")
    p.add_argument("--mix", default="fixed", choices=["fixed", "longTailed"], help="synthetic length regime")
    p.add_argument("--max-len", type=int, default=None, help="maxSeqLen (every sequence, for fixed); 1024, --cpu 128")
    p.add_argument("--global-batch", type=int, default=None, help="pairs per optimizer step; 32, --cpu 8")
    p.add_argument("--steps", type=int, default=None, help="timed steps; 8, --cpu 3")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps; 3, --cpu 1")
    p.add_argument("--token-budget", type=int, default=32768)
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", default="full,lora")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    # the dry run proves the script end to end in seconds; the GPU defaults fit both cases in ~2 min
    for name, gpu, cpu in (("max_len", 1024, 128), ("global_batch", 32, 8), ("steps", 8, 3), ("warmup", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, cpu if args.cpu else gpu)
    if args.cpu and torch.cuda.is_available():
        raise SystemExit("--cpu: a GPU is still visible to torch")
    torch.backends.cuda.matmul.allow_tf32 = True
    setup = {"shape": args.shape, "model": SHAPES[args.shape], "pairs_per_step": args.global_batch,
             "max_len": args.max_len, "length_mix": args.mix, "token_budget": args.token_budget,
             "dtype": "bfloat16" if torch.cuda.is_available() else "float32", "timed_steps": args.steps,
             "warmup_steps": args.warmup, "lora": {"rank": args.rank, "alpha": 2.0 * args.rank, "targets": TARGETS},
             "gradient_checkpointing": False, **versions()}
    t0 = time.perf_counter()
    rows = []
    for name in args.cases.split(","):
        try:
            row = run_case(args, lora=name == "lora")
        except Exception as e:  # report the case's failure, keep the other case's numbers
            row = {"case": name, "error": repr(e)[:2000]}
        row["setup"] = setup
        print(json.dumps(row), flush=True)
        rows.append(row)
    by = {r["case"]: r for r in rows if "error" not in r}
    if {"full", "lora"} <= set(by):
        full, lora = by["full"], by["lora"]
        ratio = lambda k: lora[k] / full[k] if full.get(k) else None  # noqa: E731
        comparison = {"case": "lora/full", "peak_memory": ratio("peak_memory_gib"),
                      "peak_memory_saved_gib": full["peak_memory_gib"] - lora["peak_memory_gib"]
                      if full["peak_memory_gib"] is not None else None,
                      "parameters": ratio("parameter_gib"), "optimizer_state": ratio("optimizer_state_gib"),
                      "tokens_per_s": ratio("tokens_per_s"), "step_s": ratio("step_s_median")}
        print(json.dumps(comparison), flush=True)
    print(json.dumps({"event": "done", "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    print()
    print(table(rows))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
