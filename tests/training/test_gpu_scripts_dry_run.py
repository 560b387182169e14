"""The GPU benchmark and profiling scripts start and finish on CPU (their dry runs), so a device
call is not spent finding that one no longer runs against the runtime (profile_step.py failed
this way: its config builder lacked a field that bench_utilization's case_config had started to
read). Only that they run to the end is checked here; their figures mean something on a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT, runtime_env

pytestmark = pytest.mark.slow

DRY_RUNS = {
    "profile_step_dpo": ["tests/gpu/profile_step.py", "--cpu", "--case", "dpo", "--steps", "8"],
    "profile_step_ppo": ["tests/gpu/profile_step.py", "--cpu", "--case", "ppo", "--steps", "5"],
    "bench_utilization": ["tests/gpu/bench_utilization.py", "--cpu", "--tiny", "--cases", "dpo,grpo", "--steps", "3",
                          "--reward-ms", "1"],
    "bench_grpo": ["tests/gpu/bench_grpo.py", "--shape", "tiny", "--prompts", "2", "--group", "4", "--new-tokens", "8",
                   "--steps", "1", "--only", "ours", "--prompt-min-tokens", "32"],
    "bench_dpo": ["tests/gpu/bench_dpo.py", "--shape", "tiny", "--skip-trl", "--steps", "1", "--warmup", "1"],
    "probe_nvml": ["tests/gpu/probe_nvml.py", "--cpu", "--seconds", "0.2"],
    "bench_memory_plan": ["tests/gpu/bench_memory_plan.py", "--cpu", "--tiny", "--cases", "grpo-llama1b,dpo-llama1b"],
}


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_the_script_runs_to_the_end_on_cpu(name):
    env = runtime_env(PYTHONPATH=str(ROOT / "runtime"), CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, *DRY_RUNS[name]], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"error"' not in result.stdout, result.stdout[-3000:]  # bench_utilization reports a failed case so
