"""Does the memory plan hold on a real card? PPO, GRPO and DPO through the CLI path on shapes the
other benchmarks do not tune on, with the plan's terms, the measured peaks, GPU busy time and
tokens/s per case.

On a machine with a CUDA GPU, from the repository root (needs torch, transformers, pydantic,
pyyaml and nvidia-ml-py; no install of rlkube):
    PYTHONPATH=runtime python3 tests/gpu/bench_memory_plan.py --cases ppo-qwen1.5b,grpo-llama1b
    PYTHONPATH=runtime python3 tests/gpu/bench_memory_plan.py --list
    PYTHONPATH=runtime python3 tests/gpu/bench_memory_plan.py --cpu --tiny --cases grpo-llama1b  # CPU dry run

Each case builds its model from the shape's config (random init on the device: memory does not
depend on the weights), writes a RuntimeConfig with a checkpoint every `--every` steps (keep 1),
and runs `python -m rlkube.runtime run CONFIG` while `nvidia-smi -lms 200` samples utilization
and memory in a separate process (bench_utilization.py's sampler and summary). Reported per case:
the start record's memory plan (each term in GiB, the budgets), peak memory as a fraction of the
card (nvidia-smi's memory.used, CUDA context included, and the runtime's own peak reserved per
step), out-of-memory redos per step, decode capture seconds per step, the budgets the steps ran
with, busy between the first and last step, and tokens/s/GPU (all tokens of the steps after the
first / their time). `--runtime DIR` runs another checkout's runtime (a before/after pair on
one card); its config gets the fields that runtime knows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_utilization import ROOT, prompts_file, summarize  # noqa: E402
from model_shapes import SHAPES  # noqa: E402

# name -> (algorithm, shape, settings). RL: prompts per step, group size, new tokens, KL; DPO: pairs, longest.
CASES = {
    "ppo-qwen1.5b": ("ppo", "qwen1.5b", dict(prompts=64, group=1, new_tokens=256, kl=0.05)),
    "grpo-llama1b": ("grpo", "llama1b", dict(prompts=16, group=8, new_tokens=256, kl=0.04)),
    "grpo-qwen3b": ("grpo", "qwen3b", dict(prompts=16, group=8, new_tokens=256, kl=0.04)),
    "grpo-qwen7b-lora": ("grpo", "qwen7b", dict(prompts=16, group=8, new_tokens=256, kl=0.04, lora=True)),
    "dpo-qwen1.5b": ("dpo", "qwen1.5b", dict(pairs=32, longest=3072)),
    "dpo-llama1b": ("dpo", "llama1b", dict(pairs=32, longest=3072)),
}
PROMPT_CHARS = 127  # byte tokenizer: 128 prompt tokens with BOS


class MemorySampler:
    """nvidia-smi utilization and memory every 200 ms, in its own process."""

    def __init__(self, gpu: str) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (time, busy 0..1, memory used / total)
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", gpu, "--query-gpu=utilization.gpu,memory.used,memory.total",
             "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                self.samples.append((time.time(), int(parts[0]) / 100, int(parts[1]) / int(parts[2])))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.thread.join(timeout=10)

    def mean(self, start: float, end: float) -> float | None:
        values = [b for t, b, _ in self.samples if start < t <= end]
        return round(sum(values) / len(values), 4) if values else None

    def peak_memory(self) -> float | None:
        return round(max((m for _, _, m in self.samples), default=0.0), 4) or None


def case_config(name: str, args, work: Path) -> dict:
    algorithm, shape, s = CASES[name]
    shape = "tiny" if args.tiny else shape
    steps = args.steps_of(algorithm)
    model = {"config": dict(SHAPES[shape]), "dtype": "float32" if args.cpu else "bfloat16", "attention": "auto"}
    if s.get("lora"):
        model["lora"] = {"rank": 16, "alpha": 32, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    common = {"model": model, "training": {"steps": steps, "lr": 1e-6, "seed": 0},
              "checkpoint": {"dir": str(work / "ckpt"), "everySteps": args.every, "keep": 1},
              "progressPort": 0, "outputDir": str(work / "out"), "batching": {"memoryFraction": args.plan_fraction}}
    if algorithm == "dpo":
        longest = 128 if args.tiny else s["longest"]
        return {**common, "algorithm": "dpo",
                "roles": {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}},
                "data": {"source": "bench", "format": "synthetic", "numSamples": s["pairs"] * steps,
                         "maxSeqLen": longest, "lengthMix": "longTailed", "seed": 0},
                "batching": {**common["batching"], "globalBatch": 8 if args.tiny else s["pairs"],
                             "maxMicroBatch": 4096}}
    prompts = 4 if args.tiny else s["prompts"]
    new_tokens = 8 if args.tiny else s["new_tokens"]
    chars = 8 if args.tiny else PROMPT_CHARS
    data = work / "prompts.jsonl"
    prompts_file(data, prompts * steps, chars)
    roles = {"actor": {"gpus": 1}, "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"},
             "reference": {"colocateWith": "actor"}}
    if algorithm == "ppo":
        roles["critic"] = {"colocateWith": "actor"}
    return {**common, "algorithm": algorithm, "roles": roles,
            "data": {"source": str(data), "format": "jsonl", "maxSeqLen": chars + 1 + new_tokens + 64},
            "batching": {**common["batching"], "globalBatch": prompts},
            "training": {**common["training"], "groupSize": s["group"], "kl": s["kl"]},
            "rollout": {"maxNewTokens": new_tokens, "temperature": 1.0}}


def for_runtime(cfg: dict, runtime: Path) -> dict:
    """`cfg` in the fields the runtime at `runtime` knows (a checkout from before memoryFraction)."""
    contract = runtime / "rlkube/runtime/contract"
    batching = contract / "sections" / "batching_spec.py"  # contract/sections.py in older checkouts
    sections = (batching if batching.exists() else contract / "sections.py").read_text()
    if "memory_fraction" not in sections:
        cfg["batching"].pop("memoryFraction", None)
        if cfg["algorithm"] != "dpo":
            cfg["batching"]["mode"] = "fixed"
    return cfg


def run_case(name: str, args) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-memory-{name}-"))
    runtime = Path(args.runtime).resolve() if args.runtime else ROOT / "runtime"
    try:
        cfg = for_runtime(case_config(name, args, work), runtime)
        cfg_path = work / "run.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(runtime), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        if args.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        sampler = None if args.cpu or not shutil.which("nvidia-smi") else MemorySampler(args.gpu)
        launched = time.time()
        try:
            proc = subprocess.run([sys.executable, "-m", "rlkube.runtime", "run", str(cfg_path)], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=args.case_timeout)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = -9, e.stdout or "", (e.stderr or "") + "\n[bench: timed out]"
            out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x for x in (out, err))
        exited = time.time()
        if sampler is not None:
            sampler.stop()
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.log_dir) / f"{name}.log").write_text(out + "\n--- stderr ---\n" + err[-200_000:])
        recs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        steps = [r for r in recs if r.get("event") == "step"]
        start = next((r for r in recs if r.get("event") == "start"), {})
        result = {"case": name, "exit": code, "runtime": str(runtime.relative_to(ROOT)) if runtime.is_relative_to(ROOT)
                  else str(runtime), "memoryPlan": start.get("memoryPlan")}
        if code != 0 or len(steps) < 2:
            tail = [line for line in err.splitlines() if "Error" in line or "error" in line][-5:]
            return result | {"error": f"exit {code} after {len(steps)} steps", "stderrTail": tail or err[-1500:]}
        result |= summarize(name, recs, None, launched, exited)
        if sampler is not None:
            first_end, last_end = steps[0]["time"], steps[-1]["time"]
            result |= {"busy": sampler.mean(first_end, last_end), "busyToExit": sampler.mean(first_end, exited),
                       "peakMemorySmi": sampler.peak_memory()}
        result |= {
            "peakReservedFraction": max((r.get("peakMemoryFraction") or 0.0) for r in steps),
            "oomRetriesByStep": {r["step"]: r["oomRetries"] for r in steps if r.get("oomRetries")},
            "tokenBudgets": sorted({r["tokenBudget"] for r in steps if "tokenBudget" in r}),
            "decodeRows": sorted({r["decodeRows"] for r in steps if "decodeRows" in r}),
            "stepSecondsAll": [r["seconds"] for r in steps],
            "stepRecords": steps,
        }
        if args.scale != 1.0:  # planned as on a smaller card: the peaks as fractions of that card too
            result |= {"asCardGiB": args.as_card_gib, "cardGiB": round(args.card_gib, 1),
                       "memoryFraction": args.plan_fraction,
                       "peakMemorySmiOfAsCard": round((result.get("peakMemorySmi") or 0) * args.scale, 4),
                       "peakReservedOfAsCard": round(result["peakReservedFraction"] * args.scale, 4)}
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def card_gib(gpu: str) -> float | None:
    """The card's memory in GiB (nvidia-smi), None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.strip()
    return int(out) / 1024 if out.isdigit() else None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="ppo-qwen1.5b,grpo-llama1b,grpo-qwen3b,dpo-qwen1.5b,dpo-llama1b")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--steps", type=int, default=30, help="steps of every case (the 7B LoRA case: --lora-steps)")
    ap.add_argument("--lora-steps", type=int, default=10)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--fraction", type=float, default=0.9, help="batching.memoryFraction")
    ap.add_argument("--as-card-gib", type=float, default=None,
                    help="plan as on a card of this many GiB (e.g. 80 on an H200): memoryFraction becomes "
                         "fraction x GIB / the card's memory, and peaks are also given as fractions of GIB")
    ap.add_argument("--runtime", default=None, help="another checkout's runtime/ folder (a before run)")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape and small batches (dry run)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: run on CPU, no nvidia-smi")
    ap.add_argument("--gpu", default=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0")
    ap.add_argument("--case-timeout", type=float, default=420)
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    steps, lora_steps = (3, 3) if args.tiny else (args.steps, args.lora_steps)
    args.steps_of = lambda algorithm: steps
    args.card_gib = None if args.cpu else card_gib(args.gpu)
    args.scale = args.card_gib / args.as_card_gib if args.as_card_gib and args.card_gib else 1.0
    args.plan_fraction = round(args.fraction / args.scale, 4)
    args.steps_for = {name: (lora_steps if CASES[name][2].get("lora") else steps) for name in CASES}
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, (algorithm, shape, settings) in CASES.items():
            print(name, algorithm, shape, settings)
        return 0
    results = []
    for name in [c for c in args.cases.split(",") if c]:
        args.steps_of = lambda algorithm, name=name: args.steps_for[name]
        t0 = time.time()
        result = run_case(name, args)
        result["caseWallSeconds"] = round(time.time() - t0, 1)
        print(json.dumps(result), flush=True)
        results.append(result)
    cols = ("case", "exit", "busy", "peakMemorySmi", "peakReservedFraction", "peakMemorySmiOfAsCard", "tokensPerSecondPerGpu", "stepSeconds",
            "oomRetriesByStep", "decodeCaptureSeconds", "tokenBudgets", "decodeRows")
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(str(r.get(c)) for c in cols))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
