"""Batch sizing: how a step's global batch is split across ranks and into micro-batches.

The user fixes the global batch (samples per optimizer step). What moves is how many samples go
through the model at once (the micro-batch) and hence how many micro-batches accumulate into one
step. Everything here is pure logic over sample costs and measurements passed in, so the
decisions are tested without a GPU.

1. `rank_shares`: the step's samples are dealt to ranks by cost, largest first to the least
   loaded rank (LPT), so with long-tailed lengths no rank idles while another finishes.
2. `AdaptiveBatcher.plan`: each rank's share is cut into micro-batches under a token budget per
   GPU (packed tokens, or rows x longest row when padded) and [minMicroBatch, maxMicroBatch]
   samples. All ranks get the same number of micro-batches (FSDP runs collectives per
   micro-batch; a rank with fewer would hang the others): shorter plans are split further, and
   a rank with fewer samples than micro-batches gets empty ones (the trainer runs them with
   weight 0).
3. `AdaptiveBatcher.observe`: after each step, the peak memory fraction and the GPU busy
   fraction go into a sliding window of `WINDOW` steps. The busy fraction is itself a windowed
   value: the mean of the 10 Hz busy samples over the step (gpu_busy.py), never one NVML read
   (one read after a `synchronize` sees the idle tail and said 4% on a GPU busy a third of the
   time). Both are the maximum / minimum over ranks, so every rank decides the same. Once the
   window is full: peak above the target -> shrink the budget in proportion; peak well below
   the target -> grow it in proportion to the headroom (faster when the window's busy fraction,
   weighted by step time, is low: the GPU is waiting on small kernels), up to `MAX_GROWTH` x
   the starting budget. Every change clears the window, so each decision is based on steps run at
   the current budget.
4. `AdaptiveBatcher.on_oom`: halve what the failing micro-batch cost (not below one sample) and
   hold growth for `OOM_HOLD_STEPS`; the trainer re-plans and redoes the step, so no step is lost.

In 'fixed' mode micro-batches are maxMicroBatch samples and nothing adapts (an OOM still halves
the micro-batch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rlkube.runtime.contract.config import BatchingSpec

WINDOW = 8
GROW_BELOW = 0.8  # grow when peak < 0.8 x target fraction
MAX_GROWTH = 8
OOM_HOLD_STEPS = 50
MAX_CALIBRATION = 4  # the first step's measurement may raise a plan's budget this many times
CPU_TOKEN_BUDGET = 16384  # batching.maxTokensPerGpu's default where no memory plan is made


@dataclass(frozen=True)
class SampleCost:
    """What one sample costs: tokens when packed; rows and longest row when padded."""

    index: int
    tokens: int  # sum of the sample's sequence lengths (packed cost)
    rows: int  # sequences in the sample (2 for a preference pair)
    longest: int  # longest of its sequences


@dataclass(frozen=True)
class Measurement:
    """One step's measurements (max over ranks for memory, min for utilization)."""

    peak_memory_fraction: float | None  # peak reserved (held by the allocator) / device memory
    gpu_utilization: float | None  # 0..1: mean busy fraction over the step (sampled), not one read
    seconds: float | None = None  # the step's wall time: weights its busy fraction in the window


def window_busy(window: list[Measurement] | deque[Measurement]) -> float | None:
    """The busy fraction of a window of steps: each step's mean weighted by its time (steps
    without a time weigh 1); None when no step measured it."""
    pairs = [(m.gpu_utilization, m.seconds if m.seconds and m.seconds > 0 else 1.0)
             for m in window if m.gpu_utilization is not None]
    if not pairs:
        return None
    return sum(u * w for u, w in pairs) / sum(w for _, w in pairs)


def rank_shares(costs: list[SampleCost], world_size: int) -> list[list[SampleCost]]:
    """Deal samples to ranks, largest first to the least-loaded rank; stable for equal costs."""
    shares: list[list[SampleCost]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for c in sorted(costs, key=lambda c: (-c.tokens, c.index)):
        r = min(range(world_size), key=lambda k: (load[k], len(shares[k]), k))
        shares[r].append(c)
        load[r] += c.tokens
    return shares


def micro_batch_cost(samples: list[SampleCost], packed: bool) -> int:
    if not samples:
        return 0
    if packed:
        return sum(s.tokens for s in samples)
    return sum(s.rows for s in samples) * max(s.longest for s in samples)


def split_share(
    share: list[SampleCost], budget: int, min_mb: int, max_mb: int, packed: bool
) -> list[list[SampleCost]]:
    """Cut one rank's samples into micro-batches under `budget` tokens and the size bounds.

    Packed: first-fit decreasing into bins of `budget` tokens. Padded: samples sorted by length,
    consecutive runs cut where adding one more would exceed the budget or be padded to more than
    twice its length (similar lengths together waste the least padding). A sample over the budget alone still gets a micro-batch; the
    lower bound `min_mb` wins over the budget.
    """
    ordered = sorted(share, key=lambda c: (-(c.tokens if packed else c.longest), c.index))
    bins: list[list[SampleCost]] = []
    if packed:
        loads: list[int] = []
        for c in ordered:
            for k, b in enumerate(bins):
                if len(b) < max_mb and (loads[k] + c.tokens <= budget or len(b) < min_mb):
                    b.append(c)
                    loads[k] += c.tokens
                    break
            else:
                bins.append([c])
                loads.append(c.tokens)
    else:
        for c in ordered:
            if bins:
                b = bins[-1]
                fits = micro_batch_cost([*b, c], packed=False) <= budget
                similar = 2 * c.longest >= b[0].longest  # at most half of a row is padding
                if len(b) < max_mb and ((fits and similar) or len(b) < min_mb):
                    b.append(c)
                    continue
            bins.append([c])
    return bins


def equalise(plans: list[list[list[SampleCost]]]) -> list[list[list[SampleCost]]]:
    """Give every rank the same number of micro-batches (split the largest; pad with empties)."""
    target = max((len(p) for p in plans), default=0)
    out = []
    for plan in plans:
        plan = [list(mb) for mb in plan]
        while len(plan) < target:
            big = max(range(len(plan)), key=lambda k: (len(plan[k]), -k)) if plan else None
            if big is None or len(plan[big]) < 2:
                plan.append([])
                continue
            mb = plan.pop(big)
            half = len(mb) // 2
            plan[big:big] = [mb[:half], mb[half:]]
        out.append(plan)
    return out


class AdaptiveBatcher:
    """Chooses micro-batches per step from a token budget that follows measured memory."""

    def __init__(self, spec: BatchingSpec, packed: bool, min_budget: int = 1, budget: int | None = None,
                 grow: bool = True) -> None:
        """`budget`: the memory plan's token budget (trainers/memory_plan.py); None where there is no
        plan (a CPU): batching.maxTokensPerGpu, or CPU_TOKEN_BUDGET when unset. `grow`: False where
        the budget was sized to leave room that most steps' peaks do not show (the RL plan's
        checkpoint snapshot): only shrinking then."""
        self.grow = grow
        self.spec = spec
        self.packed = packed
        self.adaptive = spec.mode == "adaptive"
        if budget is None:
            budget = spec.max_tokens_per_gpu or CPU_TOKEN_BUDGET
        self.budget = budget
        self.min_budget = max(1, min_budget)  # one sample must always fit
        self.max_budget = budget * MAX_GROWTH
        self.max_mb = spec.max_micro_batch  # halved by an OOM in fixed mode
        self.hold = 0  # steps left during which the budget may not grow (after an OOM)
        self.window: deque[Measurement] = deque(maxlen=WINDOW)
        self.decisions: list[str] = []

    # -- planning ---------------------------------------------------------------------------
    def plan(self, costs: list[SampleCost], world_size: int) -> list[list[list[SampleCost]]]:
        """For each rank, its micro-batches for a step of samples `costs`."""
        shares = rank_shares(costs, world_size)
        # fixed mode: micro-batches of maxMicroBatch samples, whatever they cost
        budget = self.budget if self.adaptive else 1 << 62
        min_mb = min(self.spec.min_micro_batch, self.max_mb)
        plans = [split_share(s, budget, min_mb, self.max_mb, self.packed) for s in shares]
        return equalise(plans)

    # -- adapting ---------------------------------------------------------------------------
    def observe(self, m: Measurement) -> str | None:
        """Record a step; return a description of the change made, if any."""
        if self.hold:
            self.hold -= 1
        if not self.adaptive or m.peak_memory_fraction is None:
            return None
        self.window.append(m)
        if len(self.window) < WINDOW:
            return None
        target = self.spec.memory_fraction
        peak = max(w.peak_memory_fraction for w in self.window)  # type: ignore[type-var]
        util = window_busy(self.window)
        old = self.budget
        if peak > target:
            self.budget = max(self.min_budget, int(self.budget * target / peak * 0.95))
            why = f"peak memory {peak:.0%} above target {target:.0%}"
        elif peak < GROW_BELOW * target and not self.hold and self.grow:
            # memory grows roughly linearly with tokens per micro-batch; move part way to the target
            factor = min(target / max(peak, 1e-3), 2.0 if (util is not None and util < 0.85) else 1.25)
            self.budget = min(self.max_budget, int(self.budget * factor))
            why = f"peak memory {peak:.0%} below {GROW_BELOW:.0%} of target" + (
                f", GPU utilization {util:.0%}" if util is not None else ""
            )
        else:
            return None
        if self.budget == old:
            return None
        self.window.clear()
        msg = f"token budget {old} -> {self.budget} ({why})"
        self.decisions.append(msg)
        return msg

    def calibrate(self, peak_bytes: int, resident_bytes: int, left_bytes: int, largest_cost: int) -> str | None:
        """After the first step, when a memory plan sized the budget: raise it to what a token
        measurably cost (the step's peak beyond the resident weights and optimizer state, over the
        step's largest micro-batch), where that allows more than the plan's model did (compiled
        layers keep less than it counts). Grows only, at most MAX_CALIBRATION times; adaptive mode;
        not while an out-of-memory error holds the budget down (the step's peak is the failure's)."""
        if not self.adaptive or largest_cost <= 0 or self.hold:
            return None
        per_token = max(peak_bytes - resident_bytes, 1) / largest_cost
        old, fits = self.budget, int(left_bytes / per_token)
        if fits <= old:
            return None
        self.budget = min(fits, old * MAX_CALIBRATION, self.max_budget)
        self.window.clear()
        msg = (f"token budget {old} -> {self.budget} (measured {per_token / 2**20:.2f} MiB a token in the "
               f"first step)")
        self.decisions.append(msg)
        return msg

    def on_oom(self, failed: list[SampleCost]) -> bool:
        """Shrink after micro-batch `failed` ran out of memory; False when it cannot shrink.

        Adaptive: the budget becomes half of what the failed micro-batch cost (halving a budget
        that was not binding would change nothing). Fixed: maxMicroBatch is halved. A micro-batch
        of one sample cannot shrink (the sample does not fit at all).
        """
        if len(failed) <= 1:
            return False
        self.hold = OOM_HOLD_STEPS
        self.window.clear()
        if self.adaptive:
            old = self.budget
            self.budget = max(self.min_budget, min(self.budget, micro_batch_cost(failed, self.packed)) // 2)
            self.decisions.append(f"token budget {old} -> {self.budget} (out of memory; step redone)")
        else:
            old = self.max_mb
            self.max_mb = max(1, len(failed) // 2)
            self.decisions.append(f"micro-batch {old} -> {self.max_mb} samples (out of memory; step redone)")
        return True

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"budget": self.budget, "max_micro_batch": self.max_mb, "hold": self.hold}

    def load_state_dict(self, state: dict) -> None:
        self.budget = int(state["budget"])
        self.max_mb = int(state.get("max_micro_batch", self.spec.max_micro_batch))
        self.hold = int(state.get("hold", 0))
