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
import time

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import rl_config

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
        seq, att = want.on_device(slice(row, row + 1), torch.device("cpu"))
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
    with pytest.raises(ValueError, match=r"rollout.decodeRows: must be <= the 24 rows each actor GPU"):
        RuntimeConfig.model_validate(cfg)
