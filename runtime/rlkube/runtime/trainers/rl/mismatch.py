"""The training/generation mismatch: how far the log-probs generation recorded for the tokens it
sampled are from the log-probs the trainer's forward gives the same tokens.

Both sides take log_softmax(logits.float() / T) at the token, with T the rollout's temperature (1
for greedy rollouts): engine/sampling.py `sampled_logprobs` while generating, engine/policy.py in
the trainer. So the two would be equal but for the arithmetic: generation runs one token at a time
over a KV cache (a captured CUDA graph, compiled decoder layers, its own attention kernel), the
trainer runs whole sequences, and in bf16 the two round differently. A large gap means the ratio
PPO/GRPO clip is not measured against the policy that actually sampled (a known source of
unstable RL runs with fast inference engines). Metrics only: no loss reads them.

Over the policy's tokens of a step (the response mask: not a multi-turn episode's tool tokens,
not a row masked out after a failed tool call), with r = log p_train - log p_gen per token:
- rolloutLogprobAbsDiff: mean |r|;
- rolloutLogprobKL: mean(-r) = mean(log p_gen - log p_train), the k1 estimate of KL(gen || train)
  from the sampled tokens (unbiased, may be negative on a step);
- rolloutLogprobK3: mean(exp(r) - 1 - r), the k3 estimate of the same KL (never negative);
- rolloutLogprobMaxDiff: max |r|.

The trainer's side is its old log-probs (scoring.py) when the step computes them, else the
actor's training forward itself: a rollout trained on once has its one optimizer step after every
row's forward, so those log-probs are at the weights that generated. Kept per row on the device
while training (`RowMismatch`), so an out-of-memory redo of a mini-batch or a later epoch
overwrites a row instead of counting it twice, and nothing waits for the device until the step
record reads them once.
"""

from __future__ import annotations

import torch

from rlkube.runtime.engine.policy import host_to_device
from rlkube.runtime.infra.distributed import DistContext, all_reduce_sum
from rlkube.runtime.trainers.rl.rollout import Rollout

ABS_DIFF, KL, K3, MAX_DIFF = "rolloutLogprobAbsDiff", "rolloutLogprobKL", "rolloutLogprobK3", "rolloutLogprobMaxDiff"
FIELDS = (ABS_DIFF, KL, K3, MAX_DIFF)
# The step record's mismatch fields as rank 0's /metrics gauges rlkube_<name> (docs/metrics.md)
MISMATCH_GAUGES = {ABS_DIFF: "rollout_logprob_abs_diff", KL: "rollout_logprob_kl", K3: "rollout_logprob_k3",
                   MAX_DIFF: "rollout_logprob_max_diff"}
# Per-row columns: sum |r|, sum -r, sum k3, tokens, max |r|, copies (how many times it was written)
_COLUMNS = 6


def row_stats(generated: torch.Tensor, trained: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, 5] float64 per row over its tokens where `mask` is set: sum |r|, sum -r, sum k3, tokens,
    max |r|, with r = trained - generated (log-probs [B, T]). No host sync."""
    m = mask.bool()
    r = torch.where(m, trained.double() - generated.double(), 0.0)
    k3 = torch.where(m, torch.expm1(r) - r, 0.0)
    return torch.stack([r.abs().sum(dim=1), -r.sum(dim=1), k3.sum(dim=1), m.sum(dim=1).double(),
                        r.abs().amax(dim=1)], dim=1)


def fields_of(rows: torch.Tensor) -> dict[str, float | None]:
    """The step record's fields from `RowMismatch.rows` summed over ranks ([N, 6]): each row's
    copies divided out (a row trained on by several ranks, in later epochs, was written by each,
    with the same numbers), then means over all tokens and the max. None without a policy token."""
    copies = rows[:, 5:6]
    rows = torch.where(copies > 0, rows[:, :5] / copies.clamp_min(1.0), 0.0)
    abs_sum, kl_sum, k3_sum, tokens = rows[:, :4].sum(dim=0).tolist()
    if tokens <= 0:
        return dict.fromkeys(FIELDS)
    return {ABS_DIFF: abs_sum / tokens, KL: kl_sum / tokens, K3: k3_sum / tokens,
            MAX_DIFF: float(rows[:, 4].max())}


class RowMismatch:
    """The per-row comparison of one step's rollout, on the device: filled by the actor's training
    micro-batches (`add`), read and cleared once the step's training is done (`take`)."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | None = None  # [N, 6] float64 of the step in progress

    def add(self, rollout: Rollout, idx: torch.Tensor, trained: torch.Tensor, mask: torch.Tensor) -> None:
        """Rows `idx` (host indices into `rollout`): the trainer's log-probs and the mask of the
        policy's tokens, [len(idx), cols] on the device, against generation's of the same tokens.
        A no-op for a rollout without generation's log-probs."""
        if rollout.generation_logprobs is None:
            return
        device = trained.device
        if self.rows is None:
            self.rows = torch.zeros(rollout.rows, _COLUMNS, dtype=torch.float64, device=device)
        generated = rollout.generation_logprobs[idx, : trained.shape[1]].to(device)
        stats = row_stats(generated, trained.detach(), mask)
        written = torch.cat([stats, torch.ones_like(stats[:, :1])], dim=1)
        self.rows.index_copy_(0, host_to_device(idx, device), written)

    def take(self, rows: int) -> torch.Tensor:
        """This step's [rows, 6] on the host (zeros where nothing was added), and clear it."""
        got = self.rows.cpu() if self.rows is not None else torch.zeros(rows, _COLUMNS, dtype=torch.float64)
        self.rows = None
        return got


def step_fields(ctx: DistContext, mismatch: RowMismatch | None, rows: int) -> dict[str, float | None]:
    """The step record's fields, over the rows every actor rank trained on: each rank's per-row
    numbers (zeros on a rank without the actor, `mismatch` None) summed over the job; every rank
    must call it."""
    local = (mismatch or RowMismatch()).take(rows)
    return fields_of(torch.tensor(all_reduce_sum(ctx, local.flatten().tolist()),
                                  dtype=torch.float64).view(local.shape))
