"""Scoring queues every forward before the reward function runs and waits for the device once,
after it: a reward function's host work (decoding completions, the user's Python) then overlaps
the reference, critic and old log-prob forwards instead of leaving the GPU idle (Scorer.score)."""

from types import SimpleNamespace

import torch

from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.rollout import Rollout
from rlkube.runtime.trainers.rl.scoring import Scorer

ROWS, P, T = 4, 3, 5


class Queued:
    """A result still being computed on the device: `.cpu()` is where the host would wait."""

    def __init__(self, name: str, value: torch.Tensor, events: list[str]) -> None:
        self.name, self.value, self.events = name, value, events

    def to(self, dtype):
        return self

    def cpu(self) -> torch.Tensor:
        self.events.append(f"wait {self.name}")
        return self.value


def test_forwards_are_queued_before_the_reward_function_and_waited_for_after_it():
    events: list[str] = []
    rollout = Rollout(torch.randint(1, 50, (ROWS, P + T)), torch.ones(ROWS, P + T, dtype=torch.long), P,
                      list(range(ROWS)))

    def device_result(name: str, fill: float):
        def compute(r: Rollout, rows: slice):
            assert r is rollout and rows == slice(0, ROWS)
            events.append(name)
            return Queued(name, torch.full((ROWS, T), fill), events)
        return compute

    def reward(r: Rollout, rows: slice) -> torch.Tensor:
        events.append("reward")
        return torch.arange(ROWS, dtype=torch.float32)

    scorer = Scorer.__new__(Scorer)
    scorer.groups = RoleGroups(SimpleNamespace(initialized=False), {r: [0] for r in
                                                                    ("actor", "critic", "reference", "reward")})
    scorer.use_reference = scorer.with_values = scorer.with_old_logprobs = True
    scorer._reference_logprobs = device_result("reference", -1.0)
    scorer.values = device_result("values", 0.5)
    scorer.old_logprobs = device_result("old_logprobs", -2.0)
    scorer._scores = reward

    out = scorer.score(rollout)

    assert events == ["reference", "values", "old_logprobs", "reward",
                      "wait reference", "wait values", "wait old_logprobs"]
    assert torch.equal(out["scores"], torch.arange(ROWS, dtype=torch.float32))
    assert torch.equal(out["ref_logprobs"], torch.full((ROWS, T), -1.0))
    assert torch.equal(out["values"], torch.full((ROWS, T), 0.5))
    assert torch.equal(out["old_logprobs"], torch.full((ROWS, T), -2.0))
