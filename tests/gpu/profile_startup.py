"""Where a start and a restart spend their time: the CLI under cProfile, as a pod runs it.

On a machine with a CUDA GPU, from the repository root:
    PYTHONPATH=runtime python3 tests/gpu/profile_startup.py OUT [--case grpo] [--steps 4] [--top 60]
CPU dry run (seconds): add --cpu --tiny.

bench_utilization.py's case (a saved Qwen2.5-1.5B-shaped model, a checkpoint at the last step) is
run three times with `python -m rlkube.runtime run`: a first run (no profiler), a restart of 2
more steps from its checkpoint and compile cache (no profiler: the split as a user sees it), and
another restart of 2 more under cProfile. OUT gets each run's start record and first step record
(`startupSeconds`, `compileCache`) in `<run>.txt`, and for the profiled run its stats
(`restart-profiled.prof`) and the top functions by cumulative and by own time in its `.txt`.

What cProfile shows and what it does not: it times the main thread only, counts the wait for the
GIL inside whatever function was running, and cannot see into C++ (CUDA context creation, kernel
launches, copies). Counts are exact (how many modules compiled from source, how many graphs
traced); its seconds are inflated in Python-heavy parts (dynamo's tracing, sympy). On an H100
host it found the start compiling 2,583 modules from source (infra/bytecode.py).
"""

from __future__ import annotations

import argparse
import io
import json
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_utilization as bench  # noqa: E402

KEPT = ("event", "step", "startupSeconds", "compileCache", "decodeCaptureSeconds", "seconds", "phaseSeconds")


def run(name: str, cfg_path: Path, env: dict, out: Path, profile: bool, top: int) -> None:
    """One CLI run; its start and first step records (and, profiled, its stats) into OUT."""
    stats = out / f"{name}.prof"
    # The fast exit (infra/process_exit.py) would leave before cProfile writes its file.
    cmd = [sys.executable, *(["-m", "cProfile", "-o", str(stats)] if profile else []),
           "-m", "rlkube.runtime", "run", str(cfg_path)]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=bench.ROOT, env=env, capture_output=True, text=True, timeout=bench.CASE_TIMEOUT_S)
    wall = time.time() - t0
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    firsts = [r for r in records if r.get("event") in ("start", "step")]
    firsts = [next((r for r in firsts if r["event"] == e), None) for e in ("start", "step")]
    with (out / f"{name}.txt").open("w") as f:
        f.write(f"exit {proc.returncode}, {wall:.1f} s from launch to exit\n")
        for record in filter(None, firsts):
            f.write(json.dumps({k: v for k, v in record.items() if k in KEPT}) + "\n")
        if proc.returncode != 0:
            f.write(proc.stderr[-4000:] + "\n")
        if profile and stats.exists():
            for key in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(str(stats), stream=text).sort_stats(key).print_stats(top)
                f.write(text.getvalue())
    split = (firsts[1] or {}).get("startupSeconds")
    print(f"{name}: exit {proc.returncode}, {wall:.1f} s; start-up {split}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--case", default="grpo", choices=["dpo", "grpo", "ppo"])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=60, help="functions listed per ordering")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    opts = ap.parse_args()
    args = bench.parse_args(["--cases", opts.case, "--steps", str(opts.steps), "--every", str(opts.steps)]
                            + (["--cpu"] if opts.cpu else []) + (["--tiny"] if opts.tiny else []))
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="profile-startup-"))
    try:
        model_dir = work / "model"
        bench.save_model(args.shape, model_dir, cuda=not args.cpu)
        config = bench.case_config(opts.case, args, model_dir, work)
        cfg_path = work / "run.yaml"
        env = bench.cli_env(args.cpu, RLKUBE_FAST_EXIT="0")
        for name, more, profile in (("first", 0, False), ("restart", 2, False), ("restart-profiled", 2, True)):
            config["training"]["steps"] += more
            cfg_path.write_text(yaml.safe_dump(config))
            run(name, cfg_path, env, out, profile, opts.top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
