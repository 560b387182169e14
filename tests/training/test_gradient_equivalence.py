"""The gradient of a step does not depend on how it is split: 1 rank or 2 (gloo, FSDP2), one
micro-batch or several, for DPO, PPO and GRPO.

Each case drives the real trainer's step (`Trainer.step(0)`: the data, the reference, the
reward, the critic, the advantage estimator, update.py's or the DPO trainer's micro-batch
scaling, FSDP's gradient averaging, `apply_update`'s clipping) and reads the gradients the
optimizer is about to apply, through a step pre-hook registered on each of the trainer's
optimizers (torch's own hook; AdamW itself would hide a constant scale, so the test looks at the
gradient, not at the weights after the step). maxGradNorm is 1e6 so clipping leaves them as
they are. On 2 ranks the sharded gradients are gathered (`full_tensor`) inside the hook, on
both ranks, before the step.

The RL rollout is pinned: sampling draws from a per-rank generator (the rollout of 2 ranks is
not that of 1), so the rollout stage is replaced by a fixed one built from the step's real
prompt block and seeded random responses of different lengths; everything after generation
(scoring, advantages, the update) runs as in production.

Tolerance: the models are float32 (the runtime's smallest dtype choice), so per parameter
rtol 1e-4 with atol 1e-6 of the largest entry, and the whole gradient within 1e-5 relative
(L2). A scale slip (sum vs mean over ranks or micro-batches, a missing group-size factor) moves
the gradient by a factor, far outside either.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import init_from_env, shutdown

from .conftest import tiny_config
from .rl_common import rl_config

pytestmark = pytest.mark.slow

NO_CLIP = 1e6
RESPONSE_TOKENS = 7


def config(algorithm: str, tmp: str, ranks: int, micro: int) -> dict:
    """A one-step config of `algorithm` on `ranks` actor ranks, micro-batches of `micro` rows."""
    training = {"steps": 1, "maxGradNorm": NO_CLIP, "seed": 0}
    if algorithm == "dpo":
        return tiny_config(
            Path(tmp), roles={"actor": {"gpus": ranks}, "reference": {"colocateWith": "actor"}},
            batching={"globalBatch": 8, "mode": "fixed", "maxMicroBatch": micro, "minMicroBatch": 1},
            training=training,
        )
    roles = {"actor": {"gpus": ranks}, "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"},
             "reference": {"colocateWith": "actor"}}
    if algorithm == "ppo":
        roles["critic"] = {"colocateWith": "actor"}
        training |= {"kl": 0.05, "klInReward": True, "lossAggregation": "token-mean"}
    else:
        # per-sequence weights and the group-size factor of update.py, with the KL as a loss term
        training |= {"kl": 0.05, "groupSize": 4, "lossAggregation": "seq-mean-token-mean", "clipHigh": 0.28}
    return rl_config(
        Path(tmp), algorithm, roles=roles,
        batching={"globalBatch": 2 if algorithm == "grpo" else 8, "maxMicroBatch": micro, "mode": "fixed"},
        training=training, rollout={"maxNewTokens": RESPONSE_TOKENS, "temperature": 1.0},
    )


def pinned_rollout(trainer):
    """`generate` returning the same rollout on every rank: the step's prompts + seeded responses."""
    from rlkube.runtime.trainers.rl.rollout import Rollout

    def generate(step, prompts=None):
        batch = prompts if prompts is not None else trainer.rollout.prompts(step)
        rows = batch.ids.shape[0]
        g = torch.Generator().manual_seed(7)
        responses = torch.randint(0, 256, (rows, RESPONSE_TOKENS), generator=g)
        lengths = torch.tensor([RESPONSE_TOKENS - (i % 5) for i in range(rows)])
        resp_mask = (torch.arange(RESPONSE_TOKENS)[None] < lengths[:, None]).long()
        responses = torch.where(resp_mask.bool(), responses, torch.full_like(responses, trainer.tokenizer.pad_id))
        rollout = Rollout(torch.cat([batch.ids, responses], 1), torch.cat([batch.mask.long(), resp_mask], 1),
                          batch.ids.shape[1], batch.prompt_index)
        return rollout, {"generationSeconds": 0.0, "generatedTokens": int(resp_mask.sum()), "reshardSeconds": 0.0}

    return generate


def capture_gradients(trainer) -> dict[str, torch.Tensor]:
    """Every trained parameter's full gradient, as each optimizer is about to step."""
    names = {id(p): name for name, p in trainer.trainable.named_parameters()}
    grads: dict[str, torch.Tensor] = {}

    def before_step(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                    grads[names[id(p)]] = g.detach().clone()

    for optimizer in trainer.optimizers:
        optimizer.register_step_pre_hook(before_step)
    return grads


def step_gradients(algorithm: str, cfg: dict, inspect=None) -> tuple[dict[str, torch.Tensor], dict]:
    """Gradients of step 1 on this process's rank (the process group from the environment);
    `inspect(trainer)` runs once the trainer is built, before the step."""
    from rlkube.runtime.trainers.dpo import DPOTrainer
    from rlkube.runtime.trainers.rl.trainer import RLTrainer

    config = RuntimeConfig.model_validate(cfg)
    ctx = init_from_env(config.device_map)
    try:
        trainer = (DPOTrainer if algorithm == "dpo" else RLTrainer)(config, ctx)
        if inspect is not None:
            inspect(trainer)
        if algorithm != "dpo":
            trainer.rollout.generate = pinned_rollout(trainer)
        grads = capture_gradients(trainer)
        try:
            rec = trainer.step(0)
        finally:
            trainer.checkpointer.close()
            trainer.close()
        return grads, rec
    finally:
        shutdown(ctx)


def worker(rank: int, algorithm: str, cfg: dict, port: int, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    grads, rec = step_gradients(algorithm, cfg)
    results[rank] = {"grads": grads, "loss": rec.loss}


def two_rank_gradients(algorithm: str, cfg: dict) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    # spawn, not fork: torch refuses a forked worker autograd once an earlier test's backward has
    # started autograd's threads in this process (so a subset of the tests failed by their order)
    mp.start_processes(worker, args=(algorithm, cfg, port, results), nprocs=2, join=True, start_method="spawn")
    return [results[0], results[1]]


def assert_same(ours: dict[str, torch.Tensor], whole: dict[str, torch.Tensor], what: str) -> None:
    assert ours.keys() == whole.keys() and whole, what
    flat_ours = torch.cat([ours[k].flatten() for k in sorted(whole)])
    flat_whole = torch.cat([whole[k].flatten() for k in sorted(whole)])
    scale = float(flat_whole.abs().max())
    assert scale > 0, what
    assert float((flat_ours - flat_whole).norm() / flat_whole.norm()) <= 1e-5, what
    for name, grad in whole.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-6 * scale, msg=f"{what}: {name}")


@pytest.mark.parametrize("algorithm", ["dpo", "ppo", "grpo"])
def test_step_gradient_is_the_same_on_1_and_2_ranks_and_any_micro_batch(algorithm, tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    torch.set_num_threads(1)
    whole, rec = step_gradients(algorithm, config(algorithm, str(tmp_path / "whole"), ranks=1, micro=8))
    assert rec.loss is not None
    if algorithm == "ppo":
        assert any(k.startswith("critic.") for k in whole) and any(k.startswith("actor.") for k in whole)

    split, _ = step_gradients(algorithm, config(algorithm, str(tmp_path / "split"), ranks=1, micro=3))
    assert_same(split, whole, f"{algorithm}: micro-batches of 3 rows vs one of 8")

    ranks = two_rank_gradients(algorithm, config(algorithm, str(tmp_path / "ranks"), ranks=2, micro=2))
    for rank, out in enumerate(ranks):
        assert_same(out["grads"], whole, f"{algorithm}: 2 ranks (micro-batches of 2), rank {rank}")
        assert out["loss"] == pytest.approx(rec.loss, rel=1e-5, abs=1e-6)  # PPO: whitened advantages, ~0
