"""What a lifecycle decision returns, and the operator-side timing knobs it obeys. Pure.

A `Decision` is applied by the reconciler in a fixed order (status first, with a resourceVersion
precondition, then deletes, creates, ungates), so everything in it is intent already recorded
in `status` before it is acted on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """Operator-side knobs (not part of a job's spec): timings, and what the cluster offers every job."""

    backoff_base_seconds: float = 10.0     # first restart waits this long, then doubles
    backoff_max_seconds: float = 300.0
    unschedulable_retry_seconds: float = 15.0
    # A node not Ready this long is lost: its pods are force-deleted and the gang re-planned
    # (lifecycle/node_loss.py). Kubernetes' own taint eviction waits 300 s, then waits forever for
    # the pods of an unreachable node to go.
    node_lost_grace_seconds: float = 60.0
    node_lost_counts: bool = False         # whether a node loss counts against backoffLimit
    # The hostPath checkpoint root is one shared filesystem on every node (NFS mounted there, or
    # the local harness, whose nodes share one disk). Without it a job with no checkpoint.volumeClaim
    # is planned on one node only (cluster.largest_plan says why when it cannot be).
    host_path_shared: bool = False
    # A status write that only updates pod counts (status.counts_only) comes at most this often
    # per job; the latest counts are written when the interval ends. 0: every change at once.
    status_coalesce_seconds: float = 0.0
    # A volume mounted into every trainer pod at compile_cache_path for torch.compile's caches (the
    # chart's compileCache values): a PersistentVolumeClaim of that name in the job's namespace, or
    # a hostPath directory on each node. Neither set: no volume (the caches sit next to the
    # checkpoints, or where a job's checkpoint.compileCacheDir says).
    compile_cache_claim: str = ""
    compile_cache_host_path: str = ""
    compile_cache_path: str = "/var/cache/rlkube/compile"


@dataclass(frozen=True)
class Event:
    type: str      # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Ungate:
    """Remove the gang gate at `position` of pod `name`, if the pod is still of `attempt`."""

    name: str
    position: int
    attempt: int


@dataclass(frozen=True)
class Decision:
    status: dict | None = None                  # the new .status (None only with need_cluster)
    create: tuple[dict, ...] = ()               # objects, in order: Service, ConfigMap, pods
    delete: tuple[str, ...] = ()                # pod names
    force_delete: tuple[str, ...] = ()          # pod names, deleted with grace 0 (stranded on lost nodes)
    ungate: tuple[Ungate, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None          # seconds; None: wait for the next event or resync
    need_cluster: bool = False                  # call again with `cluster` (nodes and pods listed)
    action: str = "wait"                        # one word, for logs and metrics
    workload: dict | None = None                # a Kueue Workload to create (docs/kueue.md)
    workload_status: dict | None = None         # a merge patch for the job's Workload's status


# Asked for when a rule needs the GPU inventory and the caller did not list it (listing nodes and
# every bound pod is the expensive part of a reconcile, so it is done only on demand).
NEED_CLUSTER = Decision(need_cluster=True, action="observe")

