"""Does the GPU wait? Busy time, per-phase busy, MFU, tokens/s, checkpoint stall and start-up of
the real CLI path (`python -m rlkube.runtime run CONFIG` as a subprocess) for DPO (long-tailed
lengths), GRPO and PPO on a Qwen2.5-1.5B-shaped model.

On a machine with a CUDA GPU, from the repository root (needs only torch, transformers,
pydantic, pyyaml and nvidia-ml-py; no install of rlkube):
    PYTHONPATH=runtime python3 tests/gpu/bench_utilization.py                 # all three, ~9 min
    PYTHONPATH=runtime python3 tests/gpu/bench_utilization.py --cases grpo --steps 30
    PYTHONPATH=runtime python3 tests/gpu/bench_utilization.py --tiny --cpu     # CPU dry run

Each case: the bench saves a randomly initialised model with save_pretrained into a temp dir
(so the runtime's load path runs, as with a real checkpoint; the byte-level tokenizer needs no
files), writes a RuntimeConfig pointing model.path at it with a checkpoint every `--every`
steps, and runs the CLI while a separate `nvidia-smi -lms 200` process samples the GPU's
utilization (the same counter DCGM_FI_DEV_GPU_UTIL exports). Reported per case (one JSON object
each, a table last):
- busy: mean nvidia-smi utilization from the first step's end to the last step's end
  (checkpoint stalls included), and to the process's exit (the last checkpoint's write too);
- busy per phase: from the runtime's own step log (`gpuBusyPhases`, its 10 Hz NVML sampler),
  weighted by phase time; absent on a runtime that does not log them (and on CPU: no NVML);
  seconds per phase (`phaseSeconds`), the mean per step, also on CPU;
- MFU (mean of the runtime's per-step MFU after the first step), tokens/s and tokens/s/GPU
  (all tokens of the steps after the first / (their step time x GPUs));
- checkpoint stall per save (the runtime's `checkpointSave` events: time the step loop was
  blocked) and write time per commit;
- start-up: launch -> first step's end as seen from here, and the runtime's split
  (`startupSeconds`: import, model load, first step; the first step's record has all three,
  the start record only the first two) when it logs one.

Rollout decode rows (GRPO and PPO; `--refill`, a comma list, one run of each case per value):
`all` leaves rollout.decodeRows unset (every row of the step at once, the default); `on` / `off`
set decodeRows to `--decode-rows` with refill on or off (waves). A random model never says EOS,
so every completion runs to maxNewTokens and refill has nothing to refill; `--eos-median M`
makes completions end at geometric lengths of median M: the CLI process gets a sitecustomize
(written into the case's temp dir, first on its PYTHONPATH) that sets the EOS logit at the output
of the LM head so each sampled token is EOS with a fixed probability (tests/gpu/eos_hazard.py; a
forward hook on the first Linear with the vocabulary's width, found by a global module hook that
removes itself; a fixed EOS bias before 2026-12-05, whose lengths depended on the weights).
Decoding runs the hooked head; the fused log-prob head of training does not call the module (so
its log-probs miss the EOS setting: with ppoEpochs 1 and miniBatches 1 the ratio is 1 either way;
only time is measured). Example:
    PYTHONPATH=runtime python3 tests/gpu/bench_utilization.py --cases grpo,ppo --refill all,on,off \
        --decode-rows 32 --eos-median 48

A verifier's cost (`--reward-ms MS`): in process, `roles.reward.function` is tests/gpu/slow_reward.py,
MS of Python per completion; with `--remote-env SLOTS`, `roles.reward.remote` scores through the
reference environment (images/environment/server.py) started on loopback as one replica of
SLOTS verifier slots, each completion holding a slot MS (the same verifier as a service):
    PYTHONPATH=runtime python3 tests/gpu/bench_utilization.py --cases grpo --reward-ms 100
    PYTHONPATH=runtime python3 tests/gpu/bench_utilization.py --cases grpo --reward-ms 100 --remote-env 16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from rlkube.runtime.contract.pod import ENV_ENVIRONMENT_URL

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import SHAPES  # noqa: E402
from rollout_options import rollout_settings  # noqa: E402

# Steps per case sized to ~3 minutes each on an H200 (start-up and checkpoint writes included).
DEFAULT_STEPS = {"dpo": 60, "grpo": 40, "ppo": 40}
TINY_STEPS = {"dpo": 5, "grpo": 5, "ppo": 5}
CASE_TIMEOUT_S = 240
BYTE_EOS = 258  # the byte-level tokenizer's EOS id (data/tokenizer.py)
# Loaded by the CLI process before the runtime (see the module docstring, --eos-median).
EOS_SITECUSTOMIZE = f"""
import os, sys
import torch

sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from eos_hazard import eos_hook

_VOCAB = int(os.environ["BENCH_EOS_VOCAB"])
_HOOK = eos_hook(int(os.environ["BENCH_EOS_ID"]), float(os.environ["BENCH_EOS_MEDIAN"]))


def _find_head(module, inputs, output):
    if isinstance(module, torch.nn.Linear) and module.out_features == _VOCAB:
        module.register_forward_hook(_HOOK)
        _handle.remove()
        return _HOOK(module, inputs, output)
    return None


_handle = torch.nn.modules.module.register_module_forward_hook(_find_head)
"""


def save_model(shape: str, path: Path, cuda: bool, layers: int | None = None) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(SHAPES[shape])
    if layers:
        fields["num_hidden_layers"] = layers
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32)
    model.save_pretrained(path)
    del model
    if cuda:
        torch.cuda.empty_cache()


def prompts_file(path: Path, n: int, chars: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;"
    with path.open("w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": "".join(rng.choice(alphabet) for _ in range(chars))}) + "\n")


def case_config(case: str, args, model_dir: Path, work: Path, rollout: dict | None = None) -> dict:
    """The camelCase RuntimeConfig of one case (`rollout`: extra rollout settings, GRPO and PPO)."""
    steps = args.steps_of[case]
    tiny = args.tiny
    common = {
        "model": {"path": str(model_dir), "dtype": "float32" if args.cpu else "bfloat16", "attention": "auto",
                  "compile": args.compile},
        "training": {"steps": steps, "lr": 1e-6, "seed": 0},
        "checkpoint": {"dir": str(work / "ckpt"), "everySteps": args.every, "keep": 1},
        "progressPort": 0,
        "outputDir": str(work / "out"),
    }
    if case == "dpo":
        max_len = 64 if tiny else 4096
        batch = 8 if tiny else 32
        return {**common, "algorithm": "dpo",
                "roles": {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}},
                "data": {"source": "bench", "format": "synthetic", "numSamples": batch * steps,
                         "maxSeqLen": max_len, "lengthMix": "longTailed", "seed": 0},
                "batching": {"globalBatch": batch, "maxTokensPerGpu": 512 if tiny else 32768,
                             "maxMicroBatch": 4096}}
    prompt_chars, new_tokens = (8, 8) if tiny else (127, 128)
    prompts = 4 if tiny else (16 if case == "grpo" else 64)
    data = work / "prompts.jsonl"
    prompts_file(data, prompts * steps, prompt_chars)
    reward = "slow_reward:verifier_like" if args.reward_ms else "rlkube.runtime.rewards:target_pattern"
    roles = {"actor": {"gpus": 1}, "reward": {"gpus": 0, "function": reward}}
    if args.remote_env:  # scored by the reference environment on loopback (run_case starts it)
        roles = {"actor": {"gpus": 1}, "reward": {"gpus": 0, "remote": True},
                 "environment": {"image": "unused-outside-kubernetes",  # a call per slot, 4 completions each
                                 "client": {"concurrency": args.remote_env, "batchSize": 4}}}
    if case == "ppo":
        roles["critic"] = {"colocateWith": "actor"}
    return {**common, "algorithm": case, "roles": roles,
            "data": {"source": str(data), "format": "jsonl", "maxSeqLen": prompt_chars + 1 + new_tokens},
            "batching": {"globalBatch": prompts, "maxMicroBatch": 4 if tiny else 32, "mode": "fixed"},
            "training": {**common["training"], "groupSize": 8 if case == "grpo" else 1, "kl": 0.0,
                         "ppoEpochs": 1, "miniBatches": 1},
            "rollout": {"maxNewTokens": new_tokens, "temperature": 1.0, **(rollout or {})}}


class Sampler:
    """`nvidia-smi ... -lms 200` in its own process; (time, utilization 0..1) per line."""

    def __init__(self, gpu: str) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", gpu, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.strip()
            if line.isdigit():
                self.samples.append((time.time(), int(line) / 100.0))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.thread.join(timeout=10)

    def mean(self, start: float, end: float) -> float | None:
        values = [v for t, v in self.samples if start < t <= end]
        return round(sum(values) / len(values), 4) if values else None


def run_case(case: str, args, gpu_sampler_gpu: str | None, rollout: dict | None = None, label: str = "") -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"bench-util-{case}-"))
    case_name = case + label + ("[remote]" if args.remote_env and case != "dpo" else "")
    environment = None
    try:
        model_dir = work / "model"
        save_model(args.shape, model_dir, cuda=not args.cpu, layers=args.layers)
        cfg_path = work / "run.yaml"
        cfg_path.write_text(yaml.safe_dump(case_config(case, args, model_dir, work, rollout)))
        # TORCH_LOGS=recompiles: each recompile and the guard that failed, on stderr (recompilesOf)
        env = cli_env(args.cpu, TORCH_LOGS="recompiles")
        if args.cold:  # the job's own compile cache beside its checkpoints, not one the host shares
            for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
                env.pop(name, None)
        if args.eos_median and case != "dpo":
            hooks = work / "eos_hook"
            hooks.mkdir()
            (hooks / "sitecustomize.py").write_text(EOS_SITECUSTOMIZE)
            env.update(PYTHONPATH=f"{hooks}{os.pathsep}{env['PYTHONPATH']}", BENCH_EOS_ID=str(BYTE_EOS),
                       BENCH_EOS_VOCAB=str(SHAPES[args.shape]["vocab_size"]), BENCH_EOS_MEDIAN=str(args.eos_median))
        if args.remote_env and case != "dpo":
            environment = LocalEnvironment(args.reward_ms / 1000.0, args.remote_env)  # the trainer waits for /healthz
            env[ENV_ENVIRONMENT_URL] = environment.url
        elif args.reward_ms and case != "dpo":  # tests/gpu/slow_reward.py, importable by the CLI
            here = os.path.dirname(os.path.abspath(__file__))
            env.update(PYTHONPATH=f"{env['PYTHONPATH']}{os.pathsep}{here}", BENCH_REWARD_MS=str(args.reward_ms))
        dropped = drop_page_cache() if args.cold else None
        proc, recs, sampler, launched, exited = run_cli(cfg_path, env, args, gpu_sampler_gpu, case_name)
        if proc.returncode != 0:
            return {"case": case_name, "error": f"exit {proc.returncode}", "stderr": proc.stderr[-3000:]}
        result = summarize(case_name, recs, sampler, launched, exited) | {"rollout": rollout or {},
                                                                          "recompiles": recompiles_of(proc.stderr)}
        if dropped is not None:
            result["pageCacheDropped"] = dropped
        if args.restart:
            # The same job restarted (as after a pod is replaced): resumes from the last checkpoint,
            # with the compile cache the first run left in checkpoint.dir.
            config = yaml.safe_load(cfg_path.read_text())
            config["training"]["steps"] += args.restart
            cfg_path.write_text(yaml.safe_dump(config))
            proc, recs, sampler, launched, exited = run_cli(cfg_path, env, args, gpu_sampler_gpu,
                                                            case_name + "-restart")
            if proc.returncode != 0:
                result["restart"] = {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-3000:]}
            else:
                again = summarize(case_name, recs, sampler, launched, exited)
                first = next((r for r in recs if r.get("event") == "step"), {})
                result["restart"] = {k: again[k] for k in ("steps", "launchToFirstStepSeconds", "startupSeconds",
                                                           "firstStepPhaseSeconds")}
                result["restart"] |= {"firstStep": first.get("step"), "compileCache": first.get("compileCache")}
        return result
    finally:
        if environment is not None:
            environment.stop()
        shutil.rmtree(work, ignore_errors=True)


def cli_env(cpu: bool, **extra: str) -> dict[str, str]:
    """The environment of a CLI run: this checkout's runtime, unbuffered output, one process (no
    rank variables inherited), no GPU with `cpu`, and `extra`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "runtime"), PYTHONUNBUFFERED="1", **extra)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def drop_page_cache() -> bool:
    """Empty the host's page cache (root only) so the run reads its model from disk as on a fresh
    node; False where the kernel refuses (not root, a read-only /proc/sys)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class LocalEnvironment:
    """The reference environment's server (images/environment/server.py) in a process of its own on
    loopback, as one replica of roles.environment: every completion it scores first holds one of its
    `slots` verifier slots for `delay` seconds (SCORE_DELAY_SECONDS, asleep)."""

    def __init__(self, delay: float, slots: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, HOST="127.0.0.1", PORT=str(port), SCORE_DELAY_SECONDS=str(delay),
                   SANDBOX_PARALLEL=str(slots))
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "images" / "environment" / "server.py")], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def run_cli(cfg_path: Path, env: dict, args, gpu_sampler_gpu: str | None, log_name: str):
    """One `python -m rlkube.runtime run CONFIG` with nvidia-smi sampling beside it."""
    sampler = Sampler(gpu_sampler_gpu) if gpu_sampler_gpu is not None else None
    launched = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "rlkube.runtime", "run", str(cfg_path)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired as e:  # keep what it logged: the steps it did say where time went
        proc = subprocess.CompletedProcess(e.cmd, -9, _text(e.stdout), _text(e.stderr) + "\n[bench: timed out]")
    exited = time.time()
    if sampler is not None:
        sampler.stop()
    if args.log_dir:  # the CLI's own logs, for reading step by step what a figure hides
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.log_dir) / f"{log_name}.stdout").write_text(proc.stdout)
        (Path(args.log_dir) / f"{log_name}.stderr").write_text(proc.stderr)
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, recs, sampler, launched, exited


def recompiles_of(stderr: str) -> list[str]:
    """The guard failures TORCH_LOGS=recompiles logged: one line per recompile (function and first reason)."""
    out, lines = [], stderr.splitlines()
    for i, line in enumerate(lines):
        if "Recompiling function" in line:
            what = line.split("Recompiling function", 1)[1].strip()
            reason = lines[i + 2].split("[__recompiles]", 1)[-1].strip() if i + 2 < len(lines) else ""
            out.append(f"{what} :: {reason}")
    return out


def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def summarize(case: str, recs: list[dict], sampler: Sampler | None, launched: float, exited: float) -> dict:
    steps = [r for r in recs if r.get("event") == "step"]
    start = next((r for r in recs if r.get("event") == "start"), {})
    after = steps[1:]
    seconds = sum(r["seconds"] for r in after)
    tokens = sum(r["tokens"] for r in after)
    gpus = int(start.get("worldSize") or 1)
    first_end, last_end = steps[0]["time"], steps[-1]["time"]
    mfus = [r["mfu"] for r in after if r.get("mfu") is not None]
    phase_time: dict[str, float] = {}
    phase_busy: dict[str, float] = {}
    phase_seconds: dict[str, float] = {}
    for r in after:
        for name, secs in (r.get("phaseSeconds") or {}).items():
            phase_seconds[name] = phase_seconds.get(name, 0.0) + secs / len(after)
        for name, busy in (r.get("gpuBusyPhases") or {}).items():
            weight = (r.get("phaseSeconds") or {}).get(name, 1.0)
            phase_time[name] = phase_time.get(name, 0.0) + weight
            phase_busy[name] = phase_busy.get(name, 0.0) + busy * weight
    return {
        "case": case, "steps": len(steps), "gpus": gpus,
        "busy": sampler.mean(first_end, last_end) if sampler else None,
        "busyToExit": sampler.mean(first_end, exited) if sampler else None,
        "runtimeBusy": _mean([r.get("gpuUtilization") for r in after]),
        "busyPerPhase": {k: round(phase_busy[k] / phase_time[k], 4) for k in phase_time if phase_time[k] > 0},
        "phaseSecondsPerStep": {k: round(v, 4) for k, v in phase_seconds.items()},
        "mfu": _mean(mfus),
        "tokensPerSecond": round(tokens / seconds, 1) if seconds else None,
        "tokensPerSecondPerGpu": round(tokens / (seconds * gpus), 1) if seconds else None,
        "stepSeconds": round(seconds / len(after), 3) if after else None,
        # the slowest step after the first (a recompile or a stall shows here, not in the mean)
        "slowestStep": max(({"step": r.get("step"), "seconds": r["seconds"]} for r in after),
                           key=lambda x: x["seconds"], default=None),
        "checkpointStallSeconds": [r["stallSeconds"] for r in recs if r.get("event") == "checkpointSave"],
        "checkpointWriteSeconds": [r.get("writeSeconds") for r in recs if r.get("event") == "checkpoint"],
        "launchToFirstStepSeconds": round(first_end - launched, 2),
        # the tail: the last step's end to the process's exit (final checkpoint and export), and the
        # runtime's own figure (last step to both committed)
        "lastStepToExitSeconds": round(exited - last_end, 2),
        "tailSeconds": next((r["tailSeconds"] for r in recs if r.get("event") == "tail"), None),
        "startupSeconds": steps[0].get("startupSeconds") or start.get("startupSeconds"),
        # where the first step's time went, phase by phase (generate, score, forward_backward, ...)
        "firstStepPhaseSeconds": steps[0].get("phaseSeconds"),
        "setupSeconds": start.get("setupSeconds"),
        "responseLengthMean": _mean([r.get("responseLengthMean") for r in after]),
        "decodeRowOccupancy": _mean([r.get("decodeRowOccupancy") for r in after]),
        # generation's recorded log-probs against the training forward's, same tokens (PPO/GRPO's
        # step record, trainers/rl/mismatch.py): mean over the steps, the largest |difference| seen
        "rolloutLogprobMismatch": _mismatch(steps),
        # decode caches built / graphs captured per step: after the first step, > 0 means re-captures
        "decodeCaptureSeconds": [r["decodeCaptureSeconds"] for r in steps if "decodeCaptureSeconds" in r],
    }


def _mismatch(steps: list[dict]) -> dict | None:
    from statistics import fmean

    fields = ("rolloutLogprobAbsDiff", "rolloutLogprobKL", "rolloutLogprobK3")
    found = {f: [r[f] for r in steps if isinstance(r.get(f), (int, float))] for f in fields}
    if not any(found.values()):
        return None
    out = {f: float(f"{fmean(v):.3g}") for f, v in found.items() if v}
    most = [r["rolloutLogprobMaxDiff"] for r in steps if isinstance(r.get("rolloutLogprobMaxDiff"), (int, float))]
    if most:
        out["rolloutLogprobMaxDiff"] = max(most)
    return out


def _mean(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return round(sum(values) / len(values), 4) if values else None


def table(results: list[dict]) -> str:
    cols = ("case", "busy", "busyToExit", "mfu", "tokensPerSecondPerGpu", "stepSeconds", "launchToFirstStepSeconds")
    lines = [" | ".join(cols)]
    for r in results:
        stalls = r.get("checkpointStallSeconds") or []
        row = [str(r.get(c)) for c in cols]
        lines.append(" | ".join(row) + f" | length {r.get('responseLengthMean')} | decode rows busy "
                     f"{r.get('decodeRowOccupancy')} | stalls {stalls} | phases {r.get('busyPerPhase')}"
                     f" | phase s/step {r.get('phaseSecondsPerStep')} | start-up {r.get('startupSeconds')}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """The bench's settings: its flags, and what they imply (shape, checkpoint cadence, steps per
    case). profile_step.py builds its cases from the same settings."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="dpo,grpo,ppo")
    ap.add_argument("--steps", default=None, help="steps for every case (N) or per case (dpo=60,grpo=40)")
    ap.add_argument("--every", type=int, default=None, help="checkpoint every N steps (default 20; tiny 2)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and small batches (dry run)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: run on CPU, no nvidia-smi")
    ap.add_argument("--layers", type=int, default=None,
                    help="the shape with this many decoder layers (--tiny --cpu --layers 28: the start-up "
                    "and compile of a 28-layer model on CPU, as deep as Qwen2.5-1.5B)")
    ap.add_argument("--gpu", default=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0",
                    help="the GPU nvidia-smi samples (the one the run uses)")
    ap.add_argument("--compile", default="auto", choices=["auto", "layers", "off"],
                    help="model.compile of every case (auto and layers: on one GPU PPO/GRPO score and train "
                    "through compiled layers too; off: nothing compiled)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S, help="seconds one case's CLI may run")
    ap.add_argument("--log-dir", default=None, help="keep each case's CLI stdout and stderr here")
    ap.add_argument("--refill", default="all",
                    help="GRPO/PPO runs, comma list of: all (rollout.decodeRows unset), on / off (--decode-rows "
                    "rows, refill on or in waves)")
    ap.add_argument("--decode-rows", type=int, default=None, help="rollout.decodeRows of the on/off runs")
    ap.add_argument("--restart", type=int, default=0,
                    help="then run the same job again for N more steps (resumes from its checkpoint and compile "
                    "cache) and report its start-up")
    ap.add_argument("--reward-ms", type=float, default=0.0,
                    help="GRPO/PPO: a reward function that spends this many ms of Python per completion "
                    "(tests/gpu/slow_reward.py), as a verifier does")
    ap.add_argument("--cold", action="store_true",
                    help="empty the host's page cache before each case's first launch (root), so the "
                    "model is read from disk as on a fresh node; and leave the compile cache to the job "
                    "(beside its checkpoints) even where the host sets TORCHINDUCTOR_CACHE_DIR, so each "
                    "case compiles from nothing and its restart finds only its own artifacts")
    ap.add_argument("--remote-env", type=int, default=0, metavar="SLOTS",
                    help="GRPO/PPO: score through roles.reward.remote, the reference environment "
                    "(images/environment/server.py) on loopback with SLOTS verifier slots, each completion "
                    "holding one for --reward-ms")
    ap.add_argument("--eos-median", type=float, default=None,
                    help="GRPO/PPO: bias EOS so completions end at geometric lengths of this median")
    args = ap.parse_args(argv)
    args.shape = "tiny" if args.tiny else "qwen1.5b"
    args.every = args.every or (2 if args.tiny else 20)
    args.steps_of = dict(TINY_STEPS if args.tiny else DEFAULT_STEPS)
    if args.steps:
        for part in args.steps.split(","):
            name, _, n = part.rpartition("=")
            for c in ([name] if name else list(args.steps_of)):
                args.steps_of[c] = int(n)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    use_smi = not args.cpu and shutil.which("nvidia-smi") is not None
    results = []
    settings = [("" if not o else f"[{d}]", o) for d, o in rollout_settings(args.refill, args.decode_rows)]
    for case in [c for c in args.cases.split(",") if c]:
        for label, rollout in (settings if case != "dpo" else [("", {})]):
            t0 = time.time()
            result = run_case(case, args, args.gpu if use_smi else None, rollout, label)
            result["caseWallSeconds"] = round(time.time() - t0, 1)
            print(json.dumps(result), flush=True)
            results.append(result)
    print(table(results), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
