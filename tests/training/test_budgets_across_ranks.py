"""Every rank of a job plans with the same token budgets, on 2 gloo ranks.

Each rank cuts every rank's share of a role into micro-batches with its own budgets, and FSDP
runs collectives per micro-batch: a rank with a larger budget than another gets fewer
micro-batches and the other hangs in a collective. Each rank's memory plan is its own (the
card's memory already in use, the roles it holds), and the first step's calibration measures
each rank's own peak; the budgets must still come out the same everywhere.

The cards are stood in for by replacing plan_request.device_memory, with a different amount
already in use on each rank; the trainers are built and observe a first step whose measured
peak differs by rank, without running it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import init_from_env, shutdown
from rlkube.runtime.trainers.memory_plan import GIB

from .conftest import tiny_config
from .rl_common import rl_config
from .spawned import spawn_ranks

pytestmark = pytest.mark.slow


def config(algorithm: str, tmp: str) -> dict:
    if algorithm == "dpo":
        cfg = tiny_config(Path(tmp), roles={"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
                          batching={"globalBatch": 8, "mode": "adaptive"}, training={"steps": 2})
        del cfg["batching"]["maxTokensPerGpu"]
        return cfg
    return rl_config(Path(tmp), algorithm, training={"steps": 2, "kl": 0.05},
                     roles={"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"},
                            "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}},
                     batching={"globalBatch": 8, "mode": "adaptive"})


def budgets_of(trainer) -> dict:
    if hasattr(trainer, "budgets"):
        b = trainer.budgets
        rows = [800] * 64  # a share of 25,600 tokens: one micro-batch or two, by the budget
        shares = [list(range(32)), list(range(32, 64))]
        return {"train": b.train_tokens, "forward": b.forward_tokens,
                "cuts": len(b.micro_batches(rows, shares, 0)), "forwardCuts": len(b.micro_batches(rows, shares, 0, True))}
    return {"train": trainer.batcher.budget}


def worker(rank: int, algorithm: str, cfg: dict, port: int, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from rlkube.runtime.trainers import plan_request
    from rlkube.runtime.trainers.dpo import DPOTrainer
    from rlkube.runtime.trainers.rl.trainer import RLTrainer

    in_use = (200 << 20) + rank * (300 << 20)  # the two cards already hold different amounts
    plan_request.device_memory = lambda device: (2 * GIB, in_use)
    config = RuntimeConfig.model_validate(cfg)
    ctx = init_from_env(config.device_map)
    try:
        trainer = (DPOTrainer if algorithm == "dpo" else RLTrainer)(config, ctx)
        try:
            built = budgets_of(trainer)
            # the first step's measured peak: low enough that calibration raises the budget, to a
            # different value on each rank (RL: each rank's own peak; DPO: the job's largest, as its
            # train_step reduces it, against each rank's own plan)
            if hasattr(trainer, "budgets"):
                trainer.budgets.largest_tokens = 512
                peak = (trainer.plan.resident + 512 * 8000 * (1 + rank)) / trainer.plan.capacity
            else:
                peak = (5 << 20) / trainer.plan.capacity
            rec = SimpleNamespace(step=1, seconds=1.0, fields={"peakMemoryFraction": peak})
            trainer.observe(rec, SimpleNamespace(step_min=None))
            results[rank] = {"built": built, "observed": budgets_of(trainer)}
        finally:
            trainer.checkpointer.close()
            trainer.close()
    finally:
        shutdown(ctx)


@pytest.mark.parametrize("algorithm", ["grpo", "dpo"])
def test_every_rank_plans_with_the_same_budgets(algorithm, tmp_path, monkeypatch):
    results = spawn_ranks(worker, lambda port, results: (algorithm, config(algorithm, str(tmp_path)), port, results),
                          monkeypatch)
    zero, one = results[0], results[1]
    assert zero["built"]["train"] > 1000  # planned from the stand-in card, not the CPU default
    assert zero["built"] == one["built"], "after the plan"
    assert zero["observed"]["train"] > zero["built"]["train"]  # calibrated upwards
    assert zero["observed"] == one["observed"], "after the first step's calibration"
