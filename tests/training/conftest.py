"""Builders for tiny CPU DPO runs, and the uninterrupted reference run the other tests compare to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.sections import with_sections

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12
EVERY = 4


def tiny_config(tmp: Path, **sections) -> dict:
    """A RuntimeConfig (camelCase) for a 2-layer qwen2-shaped model on synthetic pairs."""
    cfg = {
        "algorithm": "dpo",
        "model": {
            "config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "vocab_size": 259, "max_position_embeddings": 128, "tie_word_embeddings": True},
            "dtype": "float32",
            "attention": "sdpa",
        },
        "roles": {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}},
        "data": {"source": "synthetic", "format": "synthetic", "numSamples": 512, "maxSeqLen": 32},
        "batching": {"globalBatch": 8, "maxTokensPerGpu": 256},
        "training": {"steps": STEPS, "lr": 1.0e-3, "beta": 0.1, "seed": 0},
        "checkpoint": {"dir": str(tmp / "ckpt"), "everySteps": EVERY, "keep": 3},
        "progressPort": 0,
        "outputDir": str(tmp / "out"),
    }
    return with_sections(cfg, sections)


def write_config(tmp: Path, cfg: dict) -> Path:
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def runtime_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RLKUBE_TRAIN_TIMEOUT_S="120")
    env.update(extra)
    return env


def run_cli(config_path: Path, timeout: float = 240, **env) -> tuple[int, list[dict], str]:
    """`python -m rlkube.runtime run CONFIG`; exit code, JSON records of stdout, stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlkube.runtime", "run", str(config_path)],
        cwd=ROOT, env=runtime_env(**env), capture_output=True, text=True, timeout=timeout,
    )
    return proc.returncode, records(proc.stdout), proc.stderr


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def step_losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs if r.get("event") == "step"}


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """One uninterrupted in-process run of STEPS steps: its per-step losses and accuracies."""
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.trainers.dpo import train

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("reference")
    result = train(RuntimeConfig.model_validate(tiny_config(tmp)))
    assert result.steps_run == STEPS
    return {
        "losses": {i + 1: loss for i, loss in enumerate(result.losses)},
        "accuracies": result.series("accuracy"),
        "dir": tmp,
    }
