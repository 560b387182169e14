"""The memory budgets of an RL step on this GPU, and what an out-of-memory error does to them.

Three budgets, all from the memory plan (trainers/memory_plan.py) on a GPU:
- training micro-batches (actor and critic), in padded tokens (rows x the longest row: RL rows
  are not packed), held by the adaptive batcher (trainers/batching.py), which follows each step's
  measured peak memory in 'adaptive' mode;
- forward-only passes (old log-probs, reference, values, reward model): the same memory at a forward token's
  cost, so `forward_ratio` times the training budget;
- decode rows of the actor's rollout.

A micro-batch is a set of rows of this rank's share, cut by `micro_batches`: the rows sorted by
length, consecutive runs of similar lengths under the budget (batching.split_share). Every rank
of a role computes every rank's cut from the broadcast rollout and all get the same number of
micro-batches (FSDP runs collectives per micro-batch).

An out-of-memory error halves the budget of the phase that raised it, frees the memory, and the
work is redone: a training mini-batch from its first micro-batch (its gradients are dropped), the
scoring forwards, or the rollout with half the decode rows. What is redone is what a run started
at the smaller budget computes. With several ranks the error still ends the attempt (the other
ranks are inside collectives), and the operator restarts the job from its checkpoint.
"""

from __future__ import annotations

import torch

from rlkube.runtime.contract.config import BatchingSpec
from rlkube.runtime.engine.policy import host_to_device
from rlkube.runtime.infra.distributed import DistContext, all_reduce_max
from rlkube.runtime.infra.log import log
from rlkube.runtime.trainers.batching import (
    MAX_CALIBRATION,
    AdaptiveBatcher,
    Measurement,
    SampleCost,
    equalise,
    split_share,
)
from rlkube.runtime.trainers.memory_plan import MemoryPlan
from rlkube.runtime.trainers.oom_memo import recalled, remember
from rlkube.runtime.trainers.plan_request import free_device_memory
from rlkube.runtime.trainers.rl.groups import RoleGroups


def balanced(bins: list[list[SampleCost]], budget: int) -> list[list[SampleCost]]:
    """The same rows in as many micro-batches, of near-equal row counts where each still fits the
    budget (cut greedily, 64 rows under a budget of 58 would be 58 + 6: two shapes, one of them
    small). The rows keep split_share's order (longest first), so similar lengths stay together."""
    if len(bins) < 2:
        return bins
    rows = [c for b in bins for c in b]
    n = len(bins)
    size, extra = divmod(len(rows), n)
    out, at = [], 0
    for k in range(n):
        take = size + (1 if k < extra else 0)
        out.append(rows[at : at + take])
        at += take
    fits = all(len(b) == 1 or len(b) * max(c.longest for c in b) <= budget for b in out)
    return out if fits else bins


class RLBudgets:
    """Training tokens, forward tokens and decode rows of this GPU; the learned values are in
    the checkpoint (`state_dict`) so a restart begins from them."""

    def __init__(self, spec: BatchingSpec, plan: MemoryPlan | None, decode_rows: int | None,
                 memo: tuple[str, int] | None = None) -> None:
        """`memo`: (checkpoint directory, rank), where an out-of-memory error on a job of several ranks
        leaves its shrunk budgets for the restart (oom_memo.py); None: nowhere."""
        self.spec = spec
        self.memo = memo
        self.planned = plan is not None
        self.trains = plan is not None and bool(plan.train_tokens)  # the plan sized a training budget here
        self.batcher = AdaptiveBatcher(spec, packed=False, min_budget=1,
                                       budget=plan.train_tokens if plan is not None and plan.train_tokens else None,
                                       grow=plan is None or plan.grows_from_peaks)
        self.forward_ratio = plan.forward_ratio if plan is not None else 1.0
        if plan is not None and not plan.train_tokens:  # trains nothing here (a reference of its own)
            self.forward_ratio = plan.forward_tokens / self.batcher.budget
        self.forward_scale = 1.0  # halved by each out-of-memory error in a forward-only pass
        self.decode_rows = plan.decode_rows if plan is not None and plan.decode_rows else decode_rows
        # The plan's forward budget is a ceiling: calibration measures a training token's cost, not a
        # forward one's, so a raised training budget does not raise the forward budget past the plan's.
        self.forward_ceiling = plan.forward_tokens if plan is not None else None
        # A resumed run's learned budgets are kept below what this GPU's plan allows (another card or
        # world size than the run that saved them): the decode rows and the most calibration may reach.
        self.plan_ceiling = (plan.train_tokens * MAX_CALIBRATION if plan is not None and plan.train_tokens else None,
                             plan.decode_rows if plan is not None and plan.decode_rows else None)
        self.oom_retries = 0  # this step's redos, reported in the step record
        self.largest_tokens = 0  # the largest training micro-batch of the step (rows x longest row)
        self.calibrated = plan is None
        self.recall()

    @property
    def train_tokens(self) -> int:
        return self.batcher.budget

    @property
    def forward_tokens(self) -> int:
        tokens = self.batcher.budget * self.forward_ratio
        if self.forward_ceiling is not None:
            tokens = min(tokens, self.forward_ceiling)
        return max(1, int(tokens * self.forward_scale))

    def micro_batches(self, lengths: list[int], shares: list[list[int]], mine: int, forward: bool = False
                      ) -> list[list[int]]:
        """Rank `mine`'s micro-batches (row indices) of the rows `shares[r]` of each rank of a role,
        `lengths[row]` the padded length of each row; every rank gets as many micro-batches."""
        adaptive = self.batcher.adaptive
        budget = (self.forward_tokens if forward else self.batcher.budget) if adaptive else 1 << 62
        max_mb = self.batcher.max_mb
        min_mb = min(self.spec.min_micro_batch, max_mb)
        plans = []
        for share in shares:
            costs = [SampleCost(row, lengths[row], 1, lengths[row]) for row in share]
            plans.append(balanced(split_share(costs, budget, min_mb, max_mb, packed=False), budget))
        return [[c.index for c in mb] for mb in equalise(plans)[mine]]

    def calibrate(self, peak_reserved: int | None, plan: MemoryPlan | None) -> str | None:
        """After the first step: the training budget from what a token measurably cost in it
        (AdaptiveBatcher.calibrate), once."""
        if self.calibrated or plan is None or peak_reserved is None or not self.largest_tokens:
            return None
        self.calibrated = True
        return self.batcher.calibrate(peak_reserved, plan.resident, plan.left, self.largest_tokens)

    def agree(self, ctx: DistContext) -> None:
        """Every rank takes the job's smallest training and forward budgets (of the ranks whose plan
        sized them): each rank cuts every rank's share of a role with its own budgets, and a rank
        with more micro-batches than another of its role would hang it in FSDP's collectives.
        Collective; called where a budget may have moved (the plan, a resume, after a step)."""
        if not ctx.initialized:
            return
        none = float("-inf")
        mine = [-float(self.batcher.budget) if self.trains else none,
                -float(self.forward_tokens) if self.planned else none]
        train, forward = (-v for v in all_reduce_max(ctx, mine))
        if train != float("inf"):
            self.batcher.budget = int(train)
        if forward != float("inf"):  # forward_tokens is then `forward` (+0.5: int() of a float product)
            self.forward_ratio = (forward + 0.5) / (self.batcher.budget * self.forward_scale)

    # -- out of memory ------------------------------------------------------------------------
    def _can_redo(self, world_size: int, what: str) -> bool:
        """True on one rank. With several the budget just shrunk is left for the restart
        (oom_memo.py) and the attempt ends: the other ranks are inside collectives."""
        if world_size > 1:
            if self.memo is not None:
                remember(self.memo[0], self.memo[1], self.memo_values())
            log.error("out of memory in %s with %d ranks: the attempt ends; the job restarts from its "
                      "checkpoint with this budget (%s)", what, world_size, self.memo_values())
            return False
        return True

    def training_oom(self, failed: list[SampleCost], world_size: int) -> bool:
        """After micro-batch `failed` ran out of memory: shrink, free; False when it cannot be redone."""
        if not self.batcher.on_oom(failed) or not self._can_redo(world_size, "training"):
            return False
        self._redo(f"training micro-batch of {len(failed)} rows: {self.batcher.decisions[-1]}")
        return True

    def forward_oom(self, world_size: int, row_tokens: int) -> bool:
        if self.forward_tokens <= row_tokens:
            return False
        self.forward_scale /= 2
        if not self._can_redo(world_size, "scoring"):
            return False
        self._redo(f"forward-only passes: token budget now {self.forward_tokens}")
        return True

    def decode_oom(self, world_size: int, rows: int) -> bool:
        if rows <= 1:
            return False
        self.decode_rows = rows // 2
        if not self._can_redo(world_size, "generation"):
            return False
        self._redo(f"rollout: decode rows {rows} -> {self.decode_rows}")
        return True

    def memo_values(self) -> dict[str, float]:
        out = {"tokenBudget": self.batcher.budget, "forwardScale": self.forward_scale}
        if self.decode_rows is not None:
            out["decodeRows"] = self.decode_rows
        return out

    def recall(self) -> None:
        """Cap the budgets at what an earlier attempt of the job ran out of memory with (oom_memo.py)."""
        memo = recalled(self.memo[0]) if self.memo is not None else {}
        if "tokenBudget" in memo:
            self.batcher.budget = max(1, min(self.batcher.budget, int(memo["tokenBudget"])))
        if "forwardScale" in memo:
            self.forward_scale = min(self.forward_scale, float(memo["forwardScale"]))
        if "decodeRows" in memo and self.decode_rows is not None:
            self.decode_rows = max(1, min(self.decode_rows, int(memo["decodeRows"])))

    def _redo(self, what: str) -> None:
        self.oom_retries += 1
        free_device_memory()
        log.warning("out of memory; redoing the work with a smaller budget (%s)", what)

    # -- after a step -------------------------------------------------------------------------
    def observe(self, measured: Measurement) -> str | None:
        return self.batcher.observe(measured)

    def record(self) -> dict:
        """The budgets the next step plans with, for the step record."""
        out = {"tokenBudget": self.train_tokens, "forwardTokenBudget": self.forward_tokens,
               "oomRetries": self.oom_retries}
        if self.decode_rows is not None:
            out["decodeRows"] = self.decode_rows
        return out

    def state_dict(self) -> dict:
        return {"batcher": self.batcher.state_dict(), "forwardScale": self.forward_scale,
                "decodeRows": self.decode_rows, "calibrated": self.calibrated}

    def load_state_dict(self, state: dict) -> None:
        self.batcher.load_state_dict(state["batcher"])
        self.forward_scale = float(state.get("forwardScale", 1.0))
        self.decode_rows = state.get("decodeRows", self.decode_rows)
        most_tokens, most_rows = self.plan_ceiling
        if most_tokens is not None and self.batcher.budget > most_tokens:
            self.batcher.budget = most_tokens
        if most_rows is not None and self.decode_rows is not None and self.decode_rows > most_rows:
            self.decode_rows = most_rows
        self.recall()
        self.calibrated = bool(state.get("calibrated", True))  # written after a first step: calibrated then


def role_micro_batches(budgets: RLBudgets, groups: RoleGroups, role: str, rows: torch.Tensor,
                       lengths: list[int], forward: bool = False) -> list[torch.Tensor]:
    """This rank's micro-batches (row index tensors) of its share of `rows` among `role`'s ranks."""
    slices, mine = groups.shares(len(rows), role)
    shares = [rows[s].tolist() for s in slices]
    return [torch.tensor(mb, dtype=torch.long) for mb in budgets.micro_batches(lengths, shares, mine, forward)]


def in_row_order(parts: list[torch.Tensor], batches: list[torch.Tensor], first_row: int) -> torch.Tensor:
    """Per-micro-batch results (rows of `batches`, in that order) put back in row order, for the
    contiguous rows starting at `first_row` that the batches cover. Stays on the device, and the
    host does not wait for it (a pageable copy would wait for the queued forwards)."""
    stacked = torch.cat(parts)
    where = host_to_device(torch.cat(batches) - first_row, stacked.device)
    return torch.empty_like(stacked).index_copy_(0, where, stacked)


