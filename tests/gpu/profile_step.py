"""Where a training step's time goes on the GPU: torch.profiler over the CLI's trainer, in one process.

On a machine with a CUDA GPU, from the repository root (torch, transformers, pydantic, pyyaml,
nvidia-ml-py; no install of rlkube):
    PYTHONPATH=runtime python3 tests/gpu/profile_step.py --case dpo [--steps 6] [--skip 6 --window 6] [--trace t.json]
    PYTHONPATH=runtime python3 tests/gpu/profile_step.py --case grpo [--steps 6] [--skip 3 --window 2]

The config is bench_utilization.py's case (a saved Qwen2.5-1.5B-shaped model; DPO: long-tailed
pairs, adaptive batching; GRPO/PPO: 128 new tokens, EOS with `--eos-median`), trained by the
trainer's `train` as the CLI does. The profiled window is DPO micro-batches `skip+1..skip+window`,
or RL steps `skip+1..skip+window`. Prints each step's record, the allocator's counters (retries and
device mallocs say whether the cache thrashed), the GPU's kernel time over the window's wall time,
where the GPU sat idle (each gap of at least 0.2 ms, charged to the host operation or runtime phase
that was running then), and the top operators by GPU and by CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_utilization import BYTE_EOS, EOS_SITECUSTOMIZE, case_config, parse_args, save_model  # noqa: E402
from model_shapes import SHAPES  # noqa: E402

MIN_GAP_US = 200


def idle_gaps(prof: torch.profiler.profile) -> tuple[float, Counter, Counter, float]:
    """GPU idle time inside the trace (gaps >= MIN_GAP_US between kernels), in seconds, that time
    charged to the outermost host operations and to the runtime's phases running then, and the
    idle time in all gaps, however short (kernels on several streams overlap: their union counts)."""
    events = prof.events()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.cpu_parent is None]
    phases = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("phase:")]
    gaps, end, all_gaps = [], None, 0.0
    for start, stop in kernels:
        if end is not None and start > end:
            all_gaps += start - end
            if start - end >= MIN_GAP_US:
                gaps.append((end, start))
        end = stop if end is None else max(end, stop)
    by_op, by_phase = Counter(), Counter()
    for a, b in gaps:
        for counter, spans in ((by_op, host), (by_phase, phases)):
            charged = 0.0
            for e in spans:
                overlap = min(b, e.time_range.end) - max(a, e.time_range.start)
                if overlap > 0:
                    counter[e.name] += overlap / 1e6
                    charged += overlap
            if b - a - charged > 0 and counter is by_op:
                counter["(python between operators)"] += (b - a - charged) / 1e6
    return sum(b - a for a, b in gaps) / 1e6, by_op, by_phase, all_gaps / 1e6


def phases_traced(sampler):
    """The busy sampler with each phase also a profiler range named "phase:NAME"."""
    plain = sampler.phase

    @contextmanager
    def phase(name):
        with plain(name), torch.profiler.record_function(f"phase:{name}"):
            yield

    sampler.phase = phase
    return sampler


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="dpo", choices=["dpo", "grpo", "ppo"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=None, help="micro-batches (DPO, default 6) or steps (RL, default 3) "
                    "run before profiling starts (warm-up)")
    ap.add_argument("--window", type=int, default=None, help="micro-batches (DPO, default 6) or steps (RL, default 2)")
    ap.add_argument("--eos-median", type=float, default=48.0, help="RL: completion length median (EOS on)")
    ap.add_argument("--compile", default="auto", choices=["auto", "layers", "off"], help="model.compile")
    ap.add_argument("--trace", default=None, help="write a Chrome trace here")
    ap.add_argument("--cpu", action="store_true", help="dry run: the tiny shape on CPU (no GPU figures)")
    args = ap.parse_args()
    shape = "tiny" if args.cpu else "qwen1.5b"

    def sync() -> None:
        if not args.cpu:
            torch.cuda.synchronize()
    rl = args.case != "dpo"
    skip = args.skip if args.skip is not None else (3 if rl else 6)
    window_len = args.window if args.window is not None else (2 if rl else 6)
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.infra.gpu_busy import sampler_for
    from rlkube.runtime.trainers.base import TrainerHooks

    work = Path(tempfile.mkdtemp(prefix=f"profile-{args.case}-"))
    save_model(shape, work / "model", cuda=not args.cpu)
    if rl and args.eos_median:  # the bench's EOS bias, in this process (bench_utilization's docstring)
        os.environ.update(BENCH_EOS_ID=str(BYTE_EOS), BENCH_EOS_VOCAB=str(SHAPES[shape]["vocab_size"]),
                          BENCH_EOS_MEDIAN=str(args.eos_median))
        exec(EOS_SITECUSTOMIZE, {})
    # bench_utilization's own settings for this case (every field its case_config reads, its defaults)
    bench_args = parse_args(["--cases", args.case, "--steps", str(args.steps), "--every", "1000",
                             "--compile", args.compile, *(["--tiny", "--cpu"] if args.cpu else [])])
    config = RuntimeConfig.model_validate(case_config(args.case, bench_args, work / "model", work))
    activities = [torch.profiler.ProfilerActivity.CPU] + ([] if args.cpu else [torch.profiler.ProfilerActivity.CUDA])
    prof = torch.profiler.profile(activities=activities)
    seen = {"units": 0, "started": None, "stopped": None}

    def window(*_) -> None:
        # Only a window after warm-up is traced: a whole run's trace (model load and compile
        # included) takes minutes to summarise.
        seen["units"] += 1
        n = seen["units"]
        if n == skip + 1:
            sync()
            prof.start()
            seen["started"] = time.perf_counter()
        elif n == skip + window_len + 1 and seen["started"] is not None:
            sync()
            prof.stop()
            seen["stopped"] = time.perf_counter()

    hooks = TrainerHooks(busy_sampler=lambda device: phases_traced(sampler_for(device)))
    if rl:
        from rlkube.runtime.trainers.rl.trainer import RLTrainer, train
        plain_step = RLTrainer.train_step

        def step_in_window(self, step, lr):
            window()
            return plain_step(self, step, lr)
        RLTrainer.train_step = step_in_window
    else:
        from rlkube.runtime.trainers.dpo import train
        hooks.before_micro_batch = window
    t0 = time.perf_counter()
    try:
        result = train(config, hooks=hooks)
    finally:  # the model and the final checkpoint: ~20 GB a run at this shape
        shutil.rmtree(work, ignore_errors=True)
    if seen["started"] is not None and seen["stopped"] is None:
        sync()
        prof.stop()
        seen["stopped"] = time.perf_counter()
    wall = time.perf_counter() - t0
    print(json.dumps({"batcherDecisions": result.decisions}))
    for rec in result.records:
        if rec.get("event", "step") == "step":
            print(json.dumps({k: rec.get(k) for k in ("step", "seconds", "microBatches", "tokenBudget", "tokens",
                                                      "mfu", "gpuUtilization", "generationSeconds",
                                                      "trainingSeconds", "phaseSeconds") if k in rec}))
    stats = {} if args.cpu else torch.cuda.memory_stats()
    print(json.dumps({k: stats.get(k) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free",
                                                  "reserved_bytes.all.peak", "allocated_bytes.all.peak")}))
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events)
    traced = (seen["stopped"] or 0) - (seen["started"] or 0)
    idle, by_op, by_phase, idle_all = idle_gaps(prof)
    print(json.dumps({"runSeconds": round(wall, 2), "tracedSeconds": round(traced, 3),
                      "gpuKernelSeconds": round(kernel_us / 1e6, 3),
                      "gpuBusyInTrace": round(kernel_us / 1e6 / traced, 3) if traced > 0 else None,
                      "idleGapSeconds": round(idle, 3),
                      # from the first kernel to the last: the seconds with no kernel running
                      "idleAllGapsSeconds": round(idle_all, 3),
                      "idleByPhase": {k: round(v, 4) for k, v in by_phase.most_common()},
                      "idleByHostOp": {k: round(v, 4) for k, v in by_op.most_common(25)}}))
    print(events.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if args.trace:
        prof.export_chrome_trace(args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
