"""The step record's training/generation mismatch (trainers/rl/mismatch.py) on tiny CPU GRPO runs.

In float32 on a CPU the decoder's log-probs of the tokens it sampled and the trainer's forward's
agree to rounding, whichever side of the trainer gives its old log-probs: the actor's training
forward (a rollout trained on once) or the scorer's (several mini-batches or epochs, rows moving
between ranks). A known gap put into the rollout's recorded log-probs comes out in the fields:
that they measure what they say, over the policy's tokens only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.trainers.rl.mismatch import FIELDS
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import rl_config
from .spawned import spawn_ranks

SETTINGS = {
    "trained once": {},  # no old log-probs: the actor's training forward is the trainer's side
    "two mini-batches": {"miniBatches": 2},  # the scorer's old log-probs
    "two epochs of two": {"ppoEpochs": 2, "miniBatches": 2},
}


def config(tmp: Path, actor_gpus: int = 1, **training) -> RuntimeConfig:
    return RuntimeConfig.model_validate(rl_config(
        tmp, "grpo", roles={"actor": {"gpus": actor_gpus},
                            "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}},
        batching={"globalBatch": 4, "maxMicroBatch": 4, "mode": "fixed"},
        training={"steps": 2, "lr": 3e-3, "groupSize": 4, "seed": 0, **training},
        rollout={"maxNewTokens": 12, "temperature": 0.8}))


def shift_generation_logprobs(trainer: RLTrainer, seen: list) -> None:
    """Row i's recorded log-probs lowered by 0.01 * (i + 1) on its response tokens, raised by 5 on
    its padding (which no comparison may read); each rollout kept in `seen`."""
    real = trainer.rollout.generate

    def shifted(step, prompts=None):
        rollout, stats = real(step, prompts)
        policy = rollout.response_mask.bool()
        shift = 0.01 * torch.arange(1, rollout.rows + 1, dtype=torch.float32)[:, None]
        rollout.generation_logprobs = torch.where(policy, rollout.generation_logprobs - shift, 5.0)
        seen.append((rollout, shift))
        return rollout, stats

    trainer.rollout.generate = shifted


def expected(rollout, shift) -> dict:
    """The fields of a gap of exactly `shift` per row (the float32 rounding on top is < 1e-4)."""
    tokens = rollout.response_mask.sum(dim=1).double()
    s = shift[:, 0].double()
    return {"rolloutLogprobAbsDiff": float((s * tokens).sum() / tokens.sum()),
            "rolloutLogprobKL": float((-s * tokens).sum() / tokens.sum()),
            "rolloutLogprobK3": float(((torch.expm1(s) - s) * tokens).sum() / tokens.sum()),
            "rolloutLogprobMaxDiff": float(s[tokens > 0].max())}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_grpo_run_reports_generation_and_training_log_probs_agreeing_in_float32(tmp_path, setting):
    torch.set_num_threads(1)
    result = RLTrainer(config(tmp_path, **SETTINGS[setting]), DistContext()).train()
    assert result.steps_run == 2
    for rec in result.records:
        assert set(FIELDS) <= set(rec), rec
        assert 0 <= rec["rolloutLogprobAbsDiff"] < 1e-4, rec
        assert abs(rec["rolloutLogprobKL"]) < 1e-4 and 0 <= rec["rolloutLogprobK3"] < 1e-8, rec
        assert rec["rolloutLogprobAbsDiff"] <= rec["rolloutLogprobMaxDiff"] < 1e-3, rec


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_known_gap_comes_out_in_every_field(tmp_path, setting):
    torch.set_num_threads(1)
    trainer = RLTrainer(config(tmp_path, **SETTINGS[setting]), DistContext())
    seen: list = []
    shift_generation_logprobs(trainer, seen)
    rec = trainer.train_step(0, 3e-3)
    for key, want in expected(*seen[0]).items():
        assert rec[key] == pytest.approx(want, abs=1e-4), (key, rec[key], want)
    assert rec["rolloutLogprobK3"] > 0


def two_rank_worker(rank: int, port: int, tmp: str, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from rlkube.runtime.infra.distributed import init_from_env, shutdown

    cfg = config(Path(tmp), actor_gpus=2, **SETTINGS["two epochs of two"])
    ctx = init_from_env(cfg.device_map)
    try:
        trainer = RLTrainer(cfg, ctx)
        seen: list = []
        shift_generation_logprobs(trainer, seen)
        rec = trainer.train_step(0, 3e-3)
        results[rank] = {"record": {key: rec[key] for key in FIELDS}, "expected": expected(*seen[0])}
    finally:
        shutdown(ctx)


@pytest.mark.timeout(300)
def test_two_actor_ranks_count_each_row_once(tmp_path, monkeypatch):
    """Two epochs of two shuffled mini-batches over 2 actor ranks: a row trained on by both ranks
    (in different epochs) is counted once, so every rank reports the gap that was put in."""
    results = spawn_ranks(two_rank_worker, lambda port, results: (port, str(tmp_path), results), monkeypatch)
    for rank in (0, 1):
        got, want = results[rank]["record"], results[rank]["expected"]
        for key in FIELDS:
            assert got[key] == pytest.approx(want[key], abs=1e-4), (rank, key, got[key], want[key])
