"""Rules on `spec.elastic`: the range holds the job's full size, only the actor resizes, and (PPO,
GRPO) a mini-batch splits evenly over the actor's GPUs at every size of the range.

Each rule has both halves here (`elastic_range_problems` and `elastic_split_problems`, CEL in
`elastic_cel`); the range's own rule (maxWorkers >= minWorkers) sits on `ElasticSpec`. DPO and KTO deal a step's samples to the ranks by cost
(trainers/batching.rank_shares), so any size works for them and no split rule applies.
"""

from __future__ import annotations

from math import lcm
from typing import Any

from rlkube.operator.api.validation.cel import gpus_per_pod, rule, total_gpus
from rlkube.runtime.contract.algorithm_settings import step_rows
from rlkube.runtime.contract.algorithms import ONLINE_ALGORITHMS
from rlkube.runtime.contract.config import BatchingSpec, TrainingSpec
from rlkube.runtime.contract.spec_cel import ONLINE, mini_batches, rows

# The CEL of the split rule unrolls this many sizes. A wider range can never pass: its sizes
# include a multiple of every number up to its width, so a mini-batch splitting over all of them
# is a multiple of lcm(1..ELASTIC_SIZES_CHECKED + 1), more rows than a step can have.
ELASTIC_SIZES_CHECKED = 22


def _upper_bound(model: Any, name: str) -> int:
    return next(bound.le for bound in model.model_fields[name].metadata if getattr(bound, "le", None) is not None)


MAX_ROWS_PER_STEP = _upper_bound(BatchingSpec, "global_batch") * _upper_bound(TrainingSpec, "group_size")
assert lcm(*range(1, ELASTIC_SIZES_CHECKED + 2)) > MAX_ROWS_PER_STEP, "raise ELASTIC_SIZES_CHECKED"

ELASTIC_SPLIT = ("elastic: a mini-batch (globalBatch x groupSize / miniBatches) must split evenly over the "
                 "actor's GPUs (pods x gpusPerPod) at every size in [minWorkers, maxWorkers], as at full size")


def elastic_range_problems(spec: Any) -> list[str]:
    """An elastic range holds the job's full size (the pods its roles' GPUs make), and only the
    actor has GPUs of its own."""
    if spec.elastic is None:
        return []
    problems = []
    total, per_pod = spec.total_gpus(), spec.placement.gpus_per_pod
    if total % per_pod == 0 and spec.elastic.min_workers > total // per_pod:
        problems.append(
            f"elastic.minWorkers: must be <= the job's {total // per_pod} pods "
            f"({total} GPUs / gpusPerPod {per_pod}), got {spec.elastic.min_workers}"
        )
    if total % per_pod == 0 and spec.elastic.max_workers < total // per_pod:
        problems.append(
            f"elastic.maxWorkers: must be >= the job's {total // per_pod} pods "
            f"({total} GPUs / gpusPerPod {per_pod}), got {spec.elastic.max_workers}"
        )
    others = [name for name, role in spec.roles.present().items() if name != "actor" and role.gpus]
    if others:
        problems.append(
            f"elastic: only the actor's data-parallel group resizes, so the other roles must "
            f"colocateWith the actor or have gpus: 0; {', '.join(others)} have GPUs of their own"
        )
    return problems


def elastic_split_problems(spec: Any) -> list[str]:
    """PPO/GRPO elastic jobs: every size in [minWorkers, maxWorkers] splits a mini-batch evenly
    over the actor's GPUs at that size, as the full size must: the trainer refuses a size that
    does not when it is restarted at it."""
    if spec.elastic is None or spec.algorithm not in ONLINE_ALGORITHMS:
        return []
    rows_per_step, minis = step_rows(spec), spec.training.mini_batches
    if rows_per_step % minis:
        return []  # refused as training.miniBatches
    per_pod, low, high = spec.placement.gpus_per_pod, spec.elastic.min_workers, spec.elastic.max_workers
    uneven = [pods for pods in range(low, high + 1) if (rows_per_step // minis) % (pods * per_pod)]
    if not uneven:
        return []
    shown = ", ".join(map(str, uneven[:8])) + (", ..." if len(uneven) > 8 else "")
    return [
        f"elastic: a mini-batch of {rows_per_step // minis} rows (globalBatch x groupSize / miniBatches) must split "
        f"evenly over the actor's GPUs at every size in [minWorkers, maxWorkers] = [{low}, {high}] pods of "
        f"{per_pod} GPUs, as at full size; it does not at {shown} pods (the trainer would refuse the job "
        "when it shrinks or grows to them)"
    ]


def elastic_cel() -> list[dict]:
    """CEL on the spec: the twins of `elastic_range_problems`, then of `elastic_split_problems`."""
    total, per_pod = total_gpus(), gpus_per_pod()
    rows_cel, minis = rows(), mini_batches()
    low, high = "self.elastic.minWorkers", "self.elastic.maxWorkers"
    sizes = " && ".join(
        f"({low} + {i} > {high} || ({rows_cel} / {minis}) % (({low} + {i}) * {per_pod}) == 0)"
        for i in range(ELASTIC_SIZES_CHECKED)
    )
    others = " && ".join(
        f"(!has(self.roles.{name}) || !has(self.roles.{name}.gpus) || self.roles.{name}.gpus == 0)"
        for name in ("critic", "reward", "reference")
    )
    return [
        rule(f"!has(self.elastic) || {per_pod} < 1 || {low} <= {total} / {per_pod}",
             "elastic.minWorkers: must be <= the job's pods (total GPUs / gpusPerPod)", ".elastic"),
        rule(f"!has(self.elastic) || {per_pod} < 1 || {high} >= {total} / {per_pod}",
             "elastic.maxWorkers: must be >= the job's pods (total GPUs / gpusPerPod)", ".elastic"),
        rule(f"!has(self.elastic) || {others}",
             "elastic: only the actor's data-parallel group resizes; the other roles must "
             "colocateWith the actor or have gpus: 0", ".elastic"),
        rule(f"!has(self.elastic) || !{ONLINE} || {per_pod} < 1 || {rows_cel} % {minis} != 0 || "
             f"({high} - {low} < {ELASTIC_SIZES_CHECKED} && {sizes})", ELASTIC_SPLIT, ".elastic"),
    ]
