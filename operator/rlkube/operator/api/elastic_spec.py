"""`elastic`: the range of workers (pods) an elastic job may run with, and the rule within it.

The rules that read the rest of the spec too (the range holds the job's full size, only the actor
resizes, every size splits a mini-batch evenly) are the job's (`validation.elastic`).
"""

from __future__ import annotations

from pydantic import Field

from rlkube.operator.api.limits import MAX_PODS
from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.spec import Spec

ELASTIC = (
    Rule("maxWorkers: must be >= minWorkers", "self.maxWorkers >= self.minWorkers",
         lambda e: when(e.max_workers < e.min_workers, f" ({e.min_workers}), got {e.max_workers}"), ".maxWorkers"),
)


class ElasticSpec(Spec):
    """Elastic size: the range of workers (pods of gpusPerPod GPUs) the job may run with.

    Each attempt is planned at the largest count in the range that fits the free GPUs; a job
    running below maxWorkers is restarted larger from its checkpoint once more GPUs are free.
    A gang that resizes across nodes needs checkpoints every node sees (checkpoint.volumeClaim
    on a ReadWriteMany volume). PPO/GRPO: a mini-batch (globalBatch x groupSize / miniBatches)
    must split evenly over the actor's GPUs at every size in the range, not only the full one."""

    RULES = ELASTIC

    min_workers: int = Field(
        ge=1, le=MAX_PODS,
        description="Fewest pods the job keeps running with (the actor's data-parallel group "
        "shrinks; the global batch is kept by more gradient accumulation). At most the pods the "
        "roles' GPUs make.",
    )
    max_workers: int = Field(
        ge=1, le=MAX_PODS,
        description="Most pods the job grows to when GPUs become free. At least minWorkers and "
        "the pods the roles' GPUs make.",
    )

