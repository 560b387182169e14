"""DPO collates the next step's first micro-batches while this step's last one runs, so a step
never begins by waiting for its data; the training is the same as with no prefetch at all, also
when the batcher's budget moves between steps and the micro-batches started ahead are dropped."""

import threading

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.trainers import dpo

from .conftest import tiny_config

STEPS = 6
COLLATE, RUN_STEP, OBSERVE = dpo.DPOTrainer.collate, dpo.DPOTrainer.run_step, dpo.DPOTrainer.observe


def logged_run(monkeypatch, tmp_path, prefetch: int, halve_budget_after: int | None = None):
    """A tiny DPO run; the log of collations and step starts, and the step records."""
    log: list[tuple] = []

    def logged_collate(self, ids, data=None):
        log.append(("collate", tuple(ids), threading.current_thread().name))
        return COLLATE(self, ids, data)

    def logged_run_step(self, step):
        log.append(("step", step, tuple(c.index for c in self.step_items(step)[0][0])))
        return RUN_STEP(self, step)

    def moved_observe(self, rec, job):
        OBSERVE(self, rec, job)
        if rec["step"] == halve_budget_after:  # as an adaptive decision would, between two steps
            self.batcher.budget //= 2

    monkeypatch.setattr(dpo.DPOTrainer, "collate", logged_collate)
    monkeypatch.setattr(dpo.DPOTrainer, "run_step", logged_run_step)
    monkeypatch.setattr(dpo.DPOTrainer, "observe", moved_observe)
    torch.set_num_threads(1)
    cfg = tiny_config(tmp_path, training={"steps": STEPS}, data={"prefetch": prefetch},
                      checkpoint={"everySteps": 100})
    result = dpo.train(RuntimeConfig.model_validate(cfg))
    return log, result


def test_each_step_after_the_first_finds_its_first_micro_batch_collated(monkeypatch, tmp_path):
    log, _ = logged_run(monkeypatch, tmp_path, prefetch=2)
    starts = [k for k, entry in enumerate(log) if entry[0] == "step"]
    assert len(starts) == STEPS
    for k in starts[1:]:
        _, step, first = log[k]
        before = [e for e in log[:k] if e[0] == "collate" and e[1] == first]
        assert before, f"step {step}'s first micro-batch {first} was not collated before the step began"
        assert before[-1][2] == "rlkube-prefetch"


@pytest.mark.parametrize("halve_budget_after", [None, 3])
def test_the_training_is_the_same_as_without_prefetch(monkeypatch, tmp_path, halve_budget_after):
    _, ahead = logged_run(monkeypatch, tmp_path / "ahead", prefetch=2, halve_budget_after=halve_budget_after)
    log, inline = logged_run(monkeypatch, tmp_path / "inline", prefetch=0, halve_budget_after=halve_budget_after)
    assert {e[2] for e in log if e[0] == "collate"} == {"MainThread"}
    micro = [[r["microBatches"] for r in result.records] for result in (ahead, inline)]
    assert micro[0] == micro[1]
    if halve_budget_after is not None:  # the budget bound: the steps after it planned more micro-batches
        assert micro[0][halve_budget_after] > micro[0][halve_budget_after - 1]
    assert ahead.losses == inline.losses
