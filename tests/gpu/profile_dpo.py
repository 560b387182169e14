"""Where a DPO step's time goes on the GPU: torch.profiler over the CLI's trainer, in one process.

On a machine with a CUDA GPU, from the repository root (torch, transformers, pydantic, pyyaml,
nvidia-ml-py; no install of rlkube):
    PYTHONPATH=runtime python3 tests/gpu/profile_dpo.py [--steps 6] [--skip 6 --window 6] [--trace t.json]

The config is bench_utilization.py's DPO case (a saved Qwen2.5-1.5B-shaped model, long-tailed
pairs, adaptive batching), trained by `rlkube.runtime.trainers.dpo.train` as the CLI does. Prints
each step's record (seconds, micro-batches, token budget, busy fraction), the allocator's
counters (retries and device mallocs say whether the cache thrashed), and, for a window of
micro-batches after warm-up, the GPU's kernel time over the window's wall time and the top
operators by GPU and by CPU time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_utilization import case_config, save_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=6, help="micro-batches run before profiling starts (warm-up)")
    ap.add_argument("--window", type=int, default=6, help="micro-batches profiled")
    ap.add_argument("--trace", default=None, help="write a Chrome trace here")
    args = ap.parse_args()
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.trainers.base import TrainerHooks
    from rlkube.runtime.trainers.dpo import train

    work = Path(tempfile.mkdtemp(prefix="profile-dpo-"))
    save_model("qwen1.5b", work / "model", cuda=True)
    bench_args = argparse.Namespace(steps_of={"dpo": args.steps}, tiny=False, cpu=False, every=1000)
    config = RuntimeConfig.model_validate(case_config("dpo", bench_args, work / "model", work))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    prof = torch.profiler.profile(activities=activities)
    seen = {"micro_batches": 0, "started": None, "stopped": None}

    def window(_micro_batch) -> None:
        # Only a window of micro-batches after warm-up is traced: a whole run's trace (model load
        # included) takes minutes to summarise.
        seen["micro_batches"] += 1
        n = seen["micro_batches"]
        if n == args.skip + 1:
            torch.cuda.synchronize()
            prof.start()
            seen["started"] = time.perf_counter()
        elif n == args.skip + args.window + 1 and seen["started"] is not None:
            torch.cuda.synchronize()
            prof.stop()
            seen["stopped"] = time.perf_counter()

    t0 = time.perf_counter()
    result = train(config, hooks=TrainerHooks(before_micro_batch=window))
    if seen["started"] is not None and seen["stopped"] is None:
        torch.cuda.synchronize()
        prof.stop()
        seen["stopped"] = time.perf_counter()
    wall = time.perf_counter() - t0
    print(json.dumps({"batcherDecisions": result.batcher_decisions}))
    for rec in result.records:
        if rec.get("event", "step") == "step":
            print(json.dumps({k: rec.get(k) for k in ("step", "seconds", "microBatches", "tokenBudget", "tokens",
                                                      "mfu", "gpuUtilization", "phaseSeconds")}))
    stats = torch.cuda.memory_stats()
    print(json.dumps({k: stats.get(k) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free",
                                                  "reserved_bytes.all.peak", "allocated_bytes.all.peak")}))
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events)
    traced = (seen["stopped"] or 0) - (seen["started"] or 0)
    print(json.dumps({"runSeconds": round(wall, 2), "tracedSeconds": round(traced, 3),
                      "gpuKernelSeconds": round(kernel_us / 1e6, 3),
                      "gpuBusyInTrace": round(kernel_us / 1e6 / traced, 3) if traced > 0 else None}))
    print(events.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if args.trace:
        prof.export_chrome_trace(args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
