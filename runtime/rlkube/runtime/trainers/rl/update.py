"""Stage 4 of an RL step: one pass of a trained role (actor or critic) over the rollout.

`training.ppoEpochs` passes, each split into `training.miniBatches` optimizer steps. Inside a
mini-batch each rank of the role's group takes a contiguous share, cut into micro-batches by the
token budget of the memory plan (budgets.py: rows of similar length together, rows x longest
row under the budget, at most `batching.maxMicroBatch` rows); each micro-batch's loss is scaled
by its weight in the worker's loss aggregation (its tokens for token-mean, its rows for the
seq-mean modes, see algorithms/aggregation.py) over the mini-batch's, so that the update is the
aggregate over the whole mini-batch of all ranks however it is split (FSDP averages gradients
over the group). An out-of-memory error in a micro-batch drops the mini-batch's gradients, halves
the budget and redoes the mini-batch. What differs between the actor and the critic is only the
micro-batch loss (`micro_loss`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlkube.runtime.algorithms.aggregation import TOKEN_MEAN, LossAggregation
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.gpu_busy import BusySampler
from rlkube.runtime.trainers.base import apply_update, host_numbers
from rlkube.runtime.trainers.batching import SampleCost
from rlkube.runtime.trainers.rl.budgets import RLBudgets, role_micro_batches
from rlkube.runtime.trainers.rl.env_mask import row_weight
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.rollout import Rollout

_HOST = torch.empty((), dtype=torch.long)  # row_weight's device and dtype for the host masks


@dataclass
class PassTotals:
    """What a role's passes over a rollout add up to on this rank."""

    loss: float = 0.0  # mean over the passes of the mini-batch losses of all ranks
    tokens: int = 0  # response tokens trained on here
    seq_lens: list[int] = field(default_factory=list)  # lengths of the rows trained on here (FLOPs)
    scored: int = 0  # tokens whose log-prob was computed here (FLOPs)
    metrics: dict[str, float] = field(default_factory=dict)  # token-weighted sums of the loss terms

    def add(self, other: PassTotals, passes: int) -> None:
        """Add one of `passes` passes (its loss counts 1/passes)."""
        self.loss += other.loss / passes
        self.tokens += other.tokens
        self.seq_lens.extend(other.seq_lens)
        self.scored += other.scored
        for key, value in other.metrics.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + value


class RoleWorker:
    """A trained role: its sharded model, its optimizer, and the pass over a rollout."""

    role: str
    aggregation: LossAggregation = TOKEN_MEAN  # how micro_loss reduces its tokens (the weights here)

    def __init__(self, config: RuntimeConfig, groups: RoleGroups, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, budgets: RLBudgets) -> None:
        self.config, self.groups = config, groups
        self.model, self.optimizer = model, optimizer
        self.budgets = budgets
        # Test seam (TrainerHooks.before_micro_batch): called before each training micro-batch, may raise
        # OutOfMemoryError.
        self.before_micro_batch: Callable[[list[SampleCost]], None] | None = None
        self._running: list[SampleCost] | None = None  # the micro-batch in flight (what an OOM shrinks)

    def micro_loss(self, seq: torch.Tensor, att: torch.Tensor, idx: torch.Tensor, rollout: Rollout,
                   scored: dict, adv: dict, host: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of the rows `idx` of the rollout (on the device as `seq`, `att`; `host` is the
        host copy of their mask of trained tokens, for what must be known without waiting for the
        device: `att` itself, less the tool turns of multi-turn episodes) and its terms (detached
        0-dim tensors)."""
        raise NotImplementedError

    def train_pass(self, rollout: Rollout, scored: dict, adv: dict, order: torch.Tensor, step: int,
                   busy: BusySampler) -> PassTotals:
        """One pass over the rollout in `order`: `training.miniBatches` optimizer steps (their
        stages marked as the forward_backward and optimizer phases of `busy`)."""
        cfg = self.config.training
        per_mini = rollout.rows // cfg.mini_batches
        totals = PassTotals()
        for m in range(cfg.mini_batches):
            mini = order[m * per_mini : (m + 1) * per_mini]
            with busy.phase("forward_backward"):
                loss_mean, part = self._accumulate_or_redo(rollout, scored, adv, mini)
            with busy.phase("optimizer"):
                apply_update(self.model, self.optimizer, loss_mean, cfg.max_grad_norm, step, f"{self.role} ")
            totals.add(part, 1)
            totals.loss += loss_mean / cfg.mini_batches
        return totals

    def _accumulate_or_redo(self, rollout: Rollout, scored: dict, adv: dict, mini: torch.Tensor
                            ) -> tuple[float, PassTotals]:
        """`_accumulate`, redone from scratch at a smaller budget after an out-of-memory error."""
        while True:
            try:
                return self._accumulate(rollout, scored, adv, mini)
            except torch.OutOfMemoryError:
                failed, self._running = self._running, None
                self.optimizer.zero_grad(set_to_none=True)
                if failed is None or not self.budgets.training_oom(failed, self.groups.ctx.world_size):
                    raise

    def _accumulate(self, rollout: Rollout, scored: dict, adv: dict, mini: torch.Tensor) -> tuple[float, PassTotals]:
        """Gradients of this rank's share of the mini-batch `mini`; the mini-batch's mean loss and
        what this rank trained on. One wait for the device, after the last micro-batch (see
        `backward_micro_batches`)."""
        part = PassTotals()
        mini_weight = max(self.aggregation.weight(rollout.response_mask[mini] * row_weight(scored, mini, _HOST)), 1.0)
        sums = self.backward_micro_batches(rollout, scored, adv, mini, mini_weight, part)
        values = host_numbers(sums)
        loss_sum = values.pop("")
        for key, value in values.items():
            part.metrics[key] = part.metrics.get(key, 0.0) + value
        return self.groups.sum_in([loss_sum], self.role)[0] / mini_weight, part

    def backward_micro_batches(self, rollout: Rollout, scored: dict, adv: dict, mini: torch.Tensor,
                               mini_weight: float, totals: PassTotals) -> dict[str, torch.Tensor]:
        """Forward and backward of this rank's share of `mini`, in micro-batches; the weighted sums
        of the loss (key "") and of its terms (token-weighted), still on the device.

        Nothing here waits for the device: what the host needs to know of a micro-batch (its
        tokens, its weight, its rows' lengths, where its response tokens are) is read from the
        rollout's host copy, and the loss and its terms are summed on the device (a float() per
        micro-batch waited for each forward and backward, and the GPU idled while the host then
        launched the next stage). tests/unit/runtime/test_host_syncs.py runs this on the meta
        device, where any such wait raises."""
        ranks = self.groups.ranks[self.role]
        micro = role_micro_batches(self.budgets, self.groups, self.role, mini, rollout.lengths)
        device = self.groups.ctx.device
        weighted: dict[str, list[torch.Tensor]] = {"": []}
        for k, idx in enumerate(micro):
            self._running = [SampleCost(int(r), rollout.lengths[r], 1, rollout.lengths[r]) for r in idx.tolist()]
            cost = len(self._running) * max(c.longest for c in self._running)
            self.budgets.largest_tokens = max(self.budgets.largest_tokens, cost)
            if self.before_micro_batch is not None:
                self.before_micro_batch(self._running)
            sync = getattr(self.model, "set_requires_gradient_sync", None)
            if sync is not None:
                sync(k == len(micro) - 1)  # reduce-scatter once, after the last micro-batch
            seq, att, host = rollout.on_device(idx, device)
            trained = rollout.policy_host(idx, host)  # the policy's tokens only (multi-turn)
            tokens = float(trained[:, rollout.prompt_len :].sum())
            weight = self.aggregation.weight(trained[:, rollout.prompt_len :] * row_weight(scored, idx, trained))
            loss, metrics = self.micro_loss(seq, att, idx, rollout, scored, adv, trained)
            # the aggregate over the mini-batch of all ranks; FSDP divides gradients by the group size
            (loss * (weight / mini_weight * len(ranks))).backward()
            weighted[""].append(loss.detach().double() * weight)
            for key, value in metrics.items():
                weighted.setdefault(key, []).append(torch.as_tensor(value, dtype=torch.float64, device=device) * tokens)
            totals.tokens += int(tokens)
            totals.seq_lens.extend(host.sum(dim=1).tolist())
            totals.scored += int(tokens)
        self._running = None
        return {key: torch.stack(v).sum() if v else torch.zeros((), dtype=torch.float64, device=device)
                for key, v in weighted.items()}
