"""`checkpoint`: where and how often a run's checkpoints are written, and where torch.compile keeps
its caches. Its paths' rules in the pod are the operator's (`rlkube.operator.api.validation.paths`).
"""

from __future__ import annotations

from pydantic import Field

from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, Spec, optional_path


class CheckpointSpec(Spec):
    """Where and how often the trainer checkpoints."""

    dir: str = Field(
        default="/checkpoints", min_length=1, max_length=MAX_PATH_LEN, description="Checkpoint directory in the pod."
    )
    every_steps: int = Field(default=50, ge=1, le=100_000_000, description="Checkpoint every N steps.")
    keep: int = Field(default=2, ge=1, le=1000, description="Committed checkpoints to keep.")
    volume_claim: str | None = Field(
        default=None, max_length=MAX_NAME_LEN, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="PersistentVolumeClaim mounted at dir (shared by all pods). Unset: a hostPath "
        "per node under /var/lib/rlkube/<namespace>/<job>-<uid>, so a restarted gang on the same nodes "
        "resumes and a re-created job starts fresh.",
    )
    compile_cache_dir: str | None = optional_path(
        "Where torch.compile keeps its caches (compiled graphs and kernels). Unset: "
        "<dir>/.compile-cache, so this job's restarts reuse its compiled graphs. A directory on a volume "
        "several jobs mount read-write (spec.volumes) lets a job's first start reuse the graphs an earlier "
        "job compiled for the same model shape, torch version and GPU type. The TORCHINDUCTOR_CACHE_DIR "
        "environment variable, where set, wins.",
    )
