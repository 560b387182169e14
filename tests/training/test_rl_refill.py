"""rollout.decodeRows / rollout.refill in the RL trainer: the step's rows stream through a few decode
rows (a finished row takes the next waiting prompt), and the rollout, its GRPO groups, its masks and
its old log-probs are those of decoding every row at once.

Greedy decoding gives the same tokens whatever the rows (decode_batch's per-row arithmetic does not
depend on its neighbours), so greedy rollouts are compared exactly. GRPO refuses temperature 0 at
validation, so the greedy tests swap the built trainer's sampling for a greedy one, and stop
completions at a token the tiny random model does say greedily (picked so that completions end at
several lengths): a random-init model almost never says the tokenizer's own EOS in 16 tokens.
Sampled rollouts are reproducible for one seed and one (decodeRows, refill) setting; refill on and
off draw differently (the noise a prompt gets depends on its row and step), which the last test
shows. That both draw from the model's distribution is tests/unit/runtime/test_decode_batch.py's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import rl_config
from .spawned import spawn_ranks

GROUP, PROMPTS, NEW = 4, 6, 16  # 24 rows a step
SETTINGS = [  # (decodeRows, refill): all rows at once first (the reference)
    (None, True), (5, True), (5, False), (1, True), (24, True),
]


def trainer_for(tmp, decode_rows, refill, steps=1, **rollout) -> RLTrainer:
    torch.set_num_threads(1)
    cfg = rl_config(
        tmp, "grpo",
        batching={"globalBatch": PROMPTS, "maxMicroBatch": 8, "mode": "fixed"},
        # miniBatches 2: the rollout is trained on twice, so the scorer computes old log-probs
        training={"steps": steps, "lr": 3e-3, "groupSize": GROUP, "seed": 0, "miniBatches": 2},
        rollout={"maxNewTokens": NEW, "temperature": 1.0, "refill": refill, **rollout,
                 **({"decodeRows": decode_rows} if decode_rows else {})},
    )
    return RLTrainer(RuntimeConfig.model_validate(cfg), DistContext())


def greedy_stop_token(trainer: RLTrainer) -> int:
    """A token that ends this model's greedy completions of step 0 at the most distinct lengths."""
    prompts = trainer.rollout.prompts(0)
    sampling = dataclasses.replace(trainer.rollout.sampling, temperature=0.0, eos_token_id=None)
    out = trainer.actor.engine.generate(prompts.ids, prompts.mask, sampling)
    best, spread = None, 0
    for token in out.response_ids.unique().tolist():
        hits = out.response_ids == token
        first = torch.where(hits.any(1), hits.int().argmax(1), NEW)
        if first.unique().numel() > spread:
            best, spread = token, first.unique().numel()
    return best


def greedy_rollout(trainer: RLTrainer, stop: int):
    trainer.rollout.sampling = dataclasses.replace(trainer.rollout.sampling, temperature=0.0, eos_token_id=stop)
    rollout, _ = trainer.rollout.generate(0, trainer.rollout.prompts(0))
    return rollout, trainer.scorer.score(rollout), dict(trainer.actor.engine.decoder.last_stats)


def test_greedy_rollouts_with_refill_equal_all_rows_at_once(tmp_path):
    reference = trainer_for(tmp_path / "ref", None, True)
    stop = greedy_stop_token(reference)
    want, want_scored, _ = greedy_rollout(reference, stop)
    lengths = want.response_mask.sum(1)
    assert lengths.unique().numel() >= 3 and int(lengths.max()) == NEW, lengths.tolist()  # several EOS lengths
    assert "old_logprobs" in want_scored
    for decode_rows, refill in SETTINGS[1:]:
        trainer = trainer_for(tmp_path / f"{decode_rows}-{refill}", decode_rows, refill)
        got, scored, stats = greedy_rollout(trainer, stop)
        case = (decode_rows, refill)
        assert stats["rows"] == decode_rows, (case, stats)
        if decode_rows < want.rows:
            assert stats["prefills"] > 1, (case, stats)  # rows were refilled (or waves went through)
        assert got.prompt_index == want.prompt_index, case
        assert got.prompt_len == want.prompt_len, case
        assert torch.equal(got.sequences, want.sequences), case
        assert torch.equal(got.attention_mask, want.attention_mask), case
        for key in ("scores", "old_logprobs"):
            assert torch.equal(scored[key], want_scored[key]), (case, key)
    # Row order is the prompts' order: GRPO's groups are GROUP consecutive rows of one prompt ...
    index = torch.tensor(want.prompt_index).view(PROMPTS, GROUP)
    assert bool((index == index[:, :1]).all()), want.prompt_index
    # ... and each row's old log-probs are those of its own sequence, computed alone.
    policy, p = reference.actor.model, want.prompt_len
    for row in (0, GROUP + 1, want.rows - 1):
        seq, att, _ = want.on_device(slice(row, row + 1), torch.device("cpu"))
        with torch.no_grad():
            alone, _ = policy(seq, att, p, att[:, p:])
        n = int(att[0, p:].sum())
        assert torch.allclose(alone[0, :n], want_scored["old_logprobs"][row, :n], atol=1e-5), row
        assert bool((want_scored["old_logprobs"][row, n:] == 0).all()), row


def test_sampled_rollouts_are_reproducible_per_setting_and_refill_draws_differently(tmp_path):
    def sampled(name, decode_rows, refill):
        trainer = trainer_for(tmp_path / name, decode_rows, refill)
        rollout, _ = trainer.rollout.generate(0, trainer.rollout.prompts(0))
        return rollout

    refill_a, refill_b = sampled("a", 5, True), sampled("b", 5, True)
    waves = sampled("waves", 5, False)
    assert torch.equal(refill_a.sequences, refill_b.sequences)  # one seed, one setting: the same draws
    assert refill_a.prompt_index == waves.prompt_index  # the same prompts in the same order ...
    p = refill_a.prompt_len
    assert torch.equal(refill_a.sequences[:, :p], waves.sequences[:, :p])
    # ... but other draws: rows after the first wave are sampled at other rows and steps
    assert not torch.equal(refill_a.sequences, waves.sequences)


def test_grpo_with_refill_trains(tmp_path):
    steps = 4
    trainer = trainer_for(tmp_path, 8, True, steps=steps)
    t0 = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - t0
    assert result.steps_run == steps
    for rec in result.records:
        assert rec["loss"] is not None and math.isfinite(rec["loss"]), rec
        assert math.isfinite(rec["rewardMean"]), rec
        # 24 rows through 8 decode rows: the rows stay busy until the last completions drain
        assert 0.0 < rec["decodeRowOccupancy"] <= 1.0, rec
    stats = trainer.actor.engine.decoder.last_stats
    assert stats["rows"] == 8 and stats["prefills"] >= 3, stats
    print(f"grpo with refill on CPU: {seconds / steps:.2f} s/step over {steps} steps")


@pytest.mark.parametrize("decode_rows", [25])
def test_decode_rows_above_the_rows_of_an_actor_gpu_are_refused(tmp_path, decode_rows):
    cfg = rl_config(tmp_path, "grpo", batching={"globalBatch": PROMPTS, "maxMicroBatch": 8, "mode": "fixed"},
                    training={"groupSize": GROUP}, rollout={"decodeRows": decode_rows})
    with pytest.raises(ValueError, match=r"rollout.decodeRows: must be <= the rows each actor GPU .*\(24 rows / 1 GPUs, got 25\)"):
        RuntimeConfig.model_validate(cfg)


def test_resume_with_refill_repeats_the_uninterrupted_sampled_steps(tmp_path):
    """Sampled draws with refill are a function of (seed, step, rank) and the setting: a run stopped
    after step 2 and resumed computes steps 3-4 as the uninterrupted run does."""
    from rlkube.runtime.infra.checkpoint import committed

    def run(name, steps):
        trainer = trainer_for(tmp_path / name, 5, True, steps=steps)
        return trainer.train()

    whole = run("whole", 4)
    run("split", 2)
    assert [s for s, _ in committed(tmp_path / "split" / "ckpt")] == [2]
    second = run("split", 4)
    assert second.first_step == 3
    assert second.series("rewardMean") == pytest.approx(whole.series("rewardMean")[2:], rel=1e-6)
    assert second.losses == pytest.approx(whole.losses[2:], rel=1e-5, abs=1e-7)


def two_rank_ppo(tmp: Path, rollout: dict) -> RuntimeConfig:
    return RuntimeConfig.model_validate(rl_config(
        tmp, "ppo", roles={"actor": {"gpus": 2}, "critic": {"colocateWith": "actor"},
                           "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}},
        batching={"globalBatch": 32, "maxMicroBatch": 8, "mode": "fixed"},
        training={"steps": 2, "lr": 3e-3, "seed": 0},
        rollout={"maxNewTokens": 12, "temperature": 0.0, **rollout}))


def two_rank_worker(rank: int, port: int, tmp: str, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from rlkube.runtime.infra.distributed import init_from_env, shutdown
    from rlkube.runtime.trainers.base import train_on_this_rank

    configs = {name: two_rank_ppo(Path(tmp) / name, rollout)
               for name, rollout in (("all", {}), ("refill", {"decodeRows": 3, "refill": True}))}
    # one process group for both runs: a second rendezvous on the same port can meet the first's store
    ctx = init_from_env(configs["all"].device_map)
    try:
        results[rank] = {name: train_on_this_rank(lambda c, ctx: RLTrainer(c, ctx), cfg, ctx).records
                         for name, cfg in configs.items()}
    finally:
        shutdown(ctx)


@pytest.mark.timeout(300)
def test_two_rank_greedy_ppo_with_refill_trains_exactly_like_all_rows_at_once(tmp_path, monkeypatch):
    """The sharded actor (FSDP2 over 2 gloo ranks, each generating its 16 rows) with 3 decode rows
    and refill: the same greedy rollouts, so the same rewards, lengths and losses step by step."""
    results = spawn_ranks(two_rank_worker, lambda port, results: (port, str(tmp_path), results), monkeypatch)
    runs = results[0]
    assert len(runs["all"]) == len(runs["refill"]) == 2
    assert all(0 < r["decodeRowOccupancy"] <= 1 for r in runs["refill"]), runs["refill"]
    for a, b in zip(runs["all"], runs["refill"], strict=True):
        for key in ("rewardMean", "responseLengthMean", "loss", "value_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-8), (key, a[key], b[key])
