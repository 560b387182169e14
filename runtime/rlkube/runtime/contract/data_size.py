"""How many samples a trainer trains on when it makes its data itself (data.format 'synthetic'),
and the rule that one step's samples fit in them.

data.numSamples is read only for format 'synthetic'; for the other formats the count is the
files', known only in the pod. From it, DPO makes numSamples preference pairs and PPO/GRPO
numSamples prompts; KTO makes numSamples / 2 pairs (at least one) and trains on each pair's two
completions, desirable and undesirable, so numSamples rounded down to even, at least 2
(trainers/kto.synthetic_unpaired). data.evalFraction then holds some of them out
(`held_out_count`, data/eval_split.py). Every step takes batching.globalBatch of the rest, and the
step sampler (data/sampler.py) refuses fewer: the rule moves that refusal from the pod's start
to admission.
"""

from __future__ import annotations

from typing import Any

from rlkube.runtime.contract.rule import Rule
from rlkube.runtime.contract.sections import BatchingSpec, DataSpec
from rlkube.runtime.contract.spec_cel import spec_field


def held_out_count(samples: int, fraction: float) -> int:
    """The samples data.evalFraction holds out of `samples` (>= 2): round(samples x fraction),
    at least one, and at least one left to train on."""
    return min(max(1, round(samples * fraction)), samples - 1)


def made_samples(algorithm: str, num_samples: int) -> int:
    """The samples a trainer makes from data.numSamples (format 'synthetic')."""
    return 2 * max(num_samples // 2, 1) if algorithm == "kto" else num_samples


def training_samples(spec: Any) -> int | None:
    """The samples a synthetic run trains on, after data.evalFraction's; None for data read from
    files (their count is known only in the pod). 0 when evalFraction leaves none (fewer than 2
    samples to split)."""
    data = spec.data
    if data.format != "synthetic":
        return None
    made = made_samples(spec.algorithm, data.num_samples)
    if data.eval_fraction is None:
        return made
    return made - held_out_count(made, data.eval_fraction) if made >= 2 else 0


def _cel() -> str:
    """CEL twin of `training_samples(spec) >= globalBatch`. With evalFraction f, made samples N
    and globalBatch g, N - held_out_count(N, f) >= g holds exactly when N >= g + 1 and either
    g == 1 or round(N x f) <= N - g; round is Python's (half to even) on the same double N x f,
    so round(x) <= m reads x < m + 0.5, or x == m + 0.5 with m even."""
    num = spec_field("data", DataSpec, "num_samples")
    made = f"(self.algorithm == 'kto' ? ({num} / 2 >= 1 ? {num} / 2 * 2 : 2) : {num})"
    batch = spec_field("batching", BatchingSpec, "global_batch")
    left = f"({made} - {batch})"
    product, half_over = f"double({made}) * self.data.evalFraction", f"double({left}) + 0.5"
    rounds_within = f"({product} < {half_over} || ({product} == {half_over} && {left} % 2 == 0))"
    held_out = f"{made} >= {batch} + 1 && ({batch} == 1 || {rounds_within})"
    synthetic = f"{spec_field('data', DataSpec, 'format')} == 'synthetic'"
    return f"!({synthetic}) || (has(self.data) && has(self.data.evalFraction) ? ({held_out}) : {made} >= {batch})"


def _broken(spec: Any) -> str | None:
    samples, batch = training_samples(spec), spec.batching.global_batch
    if samples is None or samples >= batch:
        return None
    data = spec.data
    made = made_samples(spec.algorithm, data.num_samples)
    parts = [f"numSamples {data.num_samples}"]
    if made != data.num_samples:
        parts.append(f"kto trains on {made} completions")
    if data.eval_fraction is not None:
        parts.append(f"evalFraction {data.eval_fraction} holds out {made - samples}")
    return f" ({'; '.join(parts)}: {samples} left to train on, globalBatch {batch})"


SAMPLES_PER_STEP = Rule(
    "data.numSamples: must leave at least batching.globalBatch samples (one step's) to train on after "
    "those data.evalFraction holds out (kto trains on numSamples rounded down to even): raise numSamples "
    "or lower globalBatch",
    _cel(),
    _broken,
    ".data.numSamples",
)
