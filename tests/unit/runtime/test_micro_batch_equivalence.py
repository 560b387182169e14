"""The gradient of a mini-batch does not depend on how update.py splits it into micro-batches.

AdamW would hide a constant gradient scale (a sum-vs-mean slip), so the check is on the raw
gradient after backward, in float64, for every loss aggregation: one micro-batch of all rows vs
micro-batches of 1 and 2 rows, and vs micro-batches cut by token budgets (rows x longest row, the
memory plan's unit: rows of similar length together). 1 vs 2 gloo ranks, through the real trainer
step: tests/training/test_gradient_equivalence.py.
"""

from types import SimpleNamespace

import pytest
import torch

from rlkube.runtime.algorithms.ppo import actor_loss
from rlkube.runtime.algorithms.registry import get_loss_agg, loss_agg_names
from rlkube.runtime.contract.config import BatchingSpec
from rlkube.runtime.trainers.rl.budgets import RLBudgets
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.rollout import Rollout
from rlkube.runtime.trainers.rl.update import RoleWorker

ROWS, P, T, V = 5, 2, 4, 11


class Worker(RoleWorker):
    """A role whose 'model' is a table of logits per (row, column): the loss is the actor's."""

    role = "actor"

    def micro_loss(self, seq, att, idx, rollout, scored, adv, host):
        resp = att[:, P:].to(torch.float64)
        cols = resp.shape[1]
        logits = self.model.weight[idx, :cols]
        logps = torch.log_softmax(logits, -1).gather(2, seq[:, P:, None]).squeeze(2) * resp
        return actor_loss(logps, scored["old"][idx, :cols], adv["advantages"][idx], resp, 0.2, None,
                          ref_logprobs=scored["ref"][idx, :cols], kl_coef=0.1, kl_estimator="k3",
                          aggregate=self.aggregation)


def rollout():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(1, V, (ROWS, P + T), generator=g)
    lengths = torch.tensor([4, 1, 3, 2, 4])
    att = torch.ones(ROWS, P + T, dtype=torch.long)
    att[:, P:] = (torch.arange(T)[None] < lengths[:, None]).long()
    return Rollout(seq * att, att, P, list(range(ROWS)))


def gradient(aggregation: str, micro: int, tokens: int | None = None) -> tuple[torch.Tensor, list[list[int]]]:
    """The raw gradient of the mini-batch, and the micro-batches (row indices) it was cut into."""
    torch.manual_seed(1)
    model = torch.nn.Embedding(ROWS, T * V, dtype=torch.float64)
    model.weight = torch.nn.Parameter(torch.randn(ROWS, T, V, dtype=torch.float64))
    config = SimpleNamespace(batching=BatchingSpec(maxMicroBatch=micro))
    budgets = RLBudgets(config.batching, None, None)
    if tokens is not None:
        budgets.batcher.budget = tokens  # below the spec's lower bound (64): these rows are 6 columns
    ctx = SimpleNamespace(initialized=False, device=torch.device("cpu"), rank=0)
    worker = Worker(config, RoleGroups(ctx, {"actor": [0]}), model, torch.optim.SGD(model.parameters(), lr=1.0),
                    budgets)
    cuts = []
    worker.before_micro_batch = lambda costs: cuts.append([c.index for c in costs])
    worker.aggregation = get_loss_agg(aggregation)
    g = torch.Generator().manual_seed(2)
    scored = {"old": -torch.rand(ROWS, T, generator=g, dtype=torch.float64) * 2,
              "ref": -torch.rand(ROWS, T, generator=g, dtype=torch.float64) * 2}
    adv = {"advantages": torch.randn(ROWS, generator=g, dtype=torch.float64)}
    worker._accumulate(rollout(), scored, adv, torch.tensor([3, 0, 4, 1, 2]))
    return model.weight.grad.clone(), cuts


@pytest.mark.parametrize("aggregation", loss_agg_names())
def test_gradient_is_the_same_whatever_the_micro_batch(aggregation):
    whole, cuts = gradient(aggregation, ROWS)
    assert whole.abs().max() > 0 and len(cuts) == 1
    for micro in (1, 2):
        got, cuts = gradient(aggregation, micro)
        assert len(cuts) == -(-ROWS // micro)
        assert torch.allclose(got, whole, rtol=1e-12, atol=1e-15), micro


@pytest.mark.parametrize("aggregation", loss_agg_names())
def test_token_budget_micro_batches_give_the_same_gradient(aggregation):
    """Rows are 3..6 columns long (prompt 2 + response 1..4). A budget of 6 tokens holds one long
    row or two of 3; 12 holds two long rows; every cut gives the unsplit gradient."""
    whole, _ = gradient(aggregation, ROWS)
    seen = set()
    for tokens in (6, 8, 12, 18):
        got, cuts = gradient(aggregation, ROWS, tokens)
        lengths = rollout().lengths
        for cut in cuts:  # each micro-batch costs rows x longest row <= the budget (or is one row)
            assert len(cut) == 1 or len(cut) * max(lengths[r] for r in cut) <= tokens, (tokens, cut)
        assert sorted(r for cut in cuts for r in cut) == list(range(ROWS))
        seen.add(len(cuts))
        assert torch.allclose(got, whole, rtol=1e-12, atol=1e-15), tokens
    assert len(seen) >= 3, seen  # the budgets really cut differently
