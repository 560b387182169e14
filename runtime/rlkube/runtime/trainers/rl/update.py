"""Stage 4 of an RL step: one pass of a trained role (actor or critic) over the rollout.

`training.ppoEpochs` passes, each split into `training.miniBatches` optimizer steps. Inside a
mini-batch each rank of the role's group takes a contiguous share, in micro-batches of at most
`batching.maxMicroBatch` rows; each micro-batch's loss is scaled by its weight in the worker's
loss aggregation (its tokens for token-mean, its rows for the seq-mean modes, see
algorithms/aggregation.py) over the mini-batch's, so that the update is the aggregate over the
whole mini-batch of all ranks however it is split (FSDP averages gradients over the group).
What differs between the actor and the critic is only the micro-batch loss (`micro_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlkube.runtime.algorithms.aggregation import TOKEN_MEAN, LossAggregation
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.gpu_busy import BusySampler
from rlkube.runtime.trainers.base import apply_update
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.rollout import Rollout


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
                 optimizer: torch.optim.Optimizer) -> None:
        self.config, self.groups = config, groups
        self.model, self.optimizer = model, optimizer

    def micro_loss(self, seq: torch.Tensor, att: torch.Tensor, idx: torch.Tensor, rollout: Rollout,
                   scored: dict, adv: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of the rows `idx` of the rollout (on the device as `seq`, `att`) and its terms."""
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
                loss_mean = self._accumulate(rollout, scored, adv, mini, totals)
            with busy.phase("optimizer"):
                apply_update(self.model, self.optimizer, loss_mean, cfg.max_grad_norm, step, f"{self.role} ")
            totals.loss += loss_mean / cfg.mini_batches
        return totals

    def _accumulate(self, rollout: Rollout, scored: dict, adv: dict, mini: torch.Tensor, totals: PassTotals) -> float:
        """Gradients of this rank's share of the mini-batch `mini`; the mini-batch's mean loss."""
        size = self.config.batching.max_micro_batch
        ranks = self.groups.ranks[self.role]
        mine = mini[self.groups.rows_of(len(mini), self.role)]
        mini_weight = max(self.aggregation.weight(rollout.response_mask[mini]), 1.0)
        micro = [mine[s : s + size] for s in range(0, len(mine), size)]
        loss_sum = 0.0
        for k, idx in enumerate(micro):
            sync = getattr(self.model, "set_requires_gradient_sync", None)
            if sync is not None:
                sync(k == len(micro) - 1)  # reduce-scatter once, after the last micro-batch
            seq, att = rollout.on_device(idx, self.groups.ctx.device)
            tokens = float(att[:, rollout.prompt_len :].float().sum())
            weight = self.aggregation.weight(att[:, rollout.prompt_len :])
            loss, metrics = self.micro_loss(seq, att, idx, rollout, scored, adv)
            # the aggregate over the mini-batch of all ranks; FSDP divides gradients by the group size
            (loss * (weight / mini_weight * len(ranks))).backward()
            loss_sum += float(loss.detach()) * weight
            for key, value in metrics.items():
                totals.metrics[key] = totals.metrics.get(key, 0.0) + value * tokens
            totals.tokens += int(tokens)
            totals.seq_lens.extend(att.sum(dim=1).tolist())
            totals.scored += int(tokens)
        return self.groups.sum_in([loss_sum], self.role)[0] / mini_weight
