"""One lifecycle decision in the making: what was observed, the fields being decided, and the
three ways a decision ends (finish in a phase, fail the job, tear the gang down). Pure.

The policy modules (one file each: `admission`, `restart`, `deadline`, `ttl`, `suspend`,
`elastic`, `node_loss`, ...) read the observed facts from a `Decider` and end by calling one of
its outcome builders, so every decision's status is summarized the same way and every teardown
bumps the attempt in the same status write that says why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkube.operator import render
from rlkube.operator.api.observed import JobView, PodView, format_time, uses_gang_gate
from rlkube.operator.lifecycle.decision import Decision, Event, Settings, Ungate
from rlkube.operator.planning.cluster import Cluster
from rlkube.operator.planning.placement import Placement, PodPlan
from rlkube.operator.render import kueue_workload as kw
from rlkube.operator.render.status import (
    STATUS_CHECKPOINT_NODES,
    Lifecycle,
    condition,
    exported_message,
    memory_plan_message,
    placement_from_status,
    summarize,
)


@dataclass
class AttemptState:
    """The lifecycle fields being decided (starts as what the last status recorded)."""

    phase: str
    attempt: int
    restarts: int
    placement: Placement | None
    start_time: str | None
    completion_time: str | None
    next_attempt_time: str | None
    admission_time: str | None
    checkpoint_nodes: tuple[str, ...] = ()
    events: list[Event] = field(default_factory=list)

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> AttemptState:
        return cls(
            phase=str(status.get("phase") or ""),
            attempt=int(status.get("attempt") or 0),
            restarts=int(status.get("restarts") or 0),
            placement=placement_from_status(status.get("placement")),
            start_time=status.get("startTime"),
            completion_time=status.get("completionTime"),
            next_attempt_time=status.get("nextAttemptTime"),
            admission_time=status.get("admissionTime"),
            checkpoint_nodes=tuple(status.get(STATUS_CHECKPOINT_NODES) or ()),
        )


@dataclass(frozen=True)
class Gang:
    """This attempt's plan next to the job's pods that are not being deleted."""

    placement: Placement
    spec: Any                       # sized to the plan (see Decider.sized_spec)
    current: list[PodView]          # the planned pods that exist, in plan order
    missing: list[PodPlan]          # the planned pods that do not
    gated_by_us: bool               # rlkube's scheduling gate admits the gang (not Volcano/Kueue)

    @property
    def gated(self) -> list[PodView]:
        return [p for p in self.current if p.gated]


class Decider:
    """The observed facts of one decision and the state being decided, with its outcome builders."""

    def __init__(self, job: JobView, pods: list[PodView], now: dt.datetime, cluster: Cluster | None,
                 progress: Mapping[str, Any] | None, settings: Settings, state: AttemptState,
                 workload: Mapping[str, Any] | None = None, priority: int | None = None) -> None:
        self.job = job
        self.workload = workload    # the job's Kueue Workload as observed (None: there is none)
        self.priority = priority    # the value of spec.priorityClassName, for a new Workload
        self.pods = pods
        self.now = now
        self.cluster = cluster
        self.progress = progress
        self.settings = settings
        self.s = state
        self.old_phase = state.phase

    def compile_cache(self) -> render.CompileCacheVolume | None:
        """The cluster's volume for torch.compile's caches in every trainer pod (Settings), or None."""
        st = self.settings
        if not (st.compile_cache_claim or st.compile_cache_host_path):
            return None
        return render.CompileCacheVolume(st.compile_cache_path, st.compile_cache_claim, st.compile_cache_host_path)

    # -- observed facts -----------------------------------------------------------------------

    def sized_spec(self) -> Any:
        """The spec at the size of this attempt's plan: an elastic job's gang may have more or
        fewer pods than its roles' GPUs make, and its pods, ConfigMap and world size follow the plan."""
        spec, placement = self.job.spec, self.s.placement
        if spec is None or placement is None or spec.elastic is None:
            return spec
        return spec.with_workers(len(placement.pods))

    def kueue_admission(self) -> kw.WorkloadState | None:
        """The job's Workload as Kueue admitted it, or None (not queued, or not admitted)."""
        if self.workload is None:
            return None
        state = kw.observe_workload(self.workload)
        return state if state.worker_cap is not None else None

    def worker_cap(self) -> int | None:
        """The most pods any plan of this job may have: Kueue's admitted count (an elastic job
        may be admitted partly); None when nothing but the spec limits it."""
        admission = self.kueue_admission()
        return admission.worker_cap if admission is not None else None

    def admission_note(self) -> str:
        """" (admitted N of M pods by Kueue)" for a partly admitted job, else "": appended to the
        condition messages of its plan and run, so `kubectl describe` says why it is smaller."""
        admission = self.kueue_admission()
        return f" ({admission.admission_message()})" if admission is not None and admission.partial else ""

    def pod_names(self) -> list[str]:
        spec = self.sized_spec()
        return render.pod_names(self.job.name, spec) if spec else []

    def gang(self) -> Gang:
        """The gang of this attempt's plan (which must exist) as observed."""
        placement, spec = self.s.placement, self.sized_spec()
        assert placement is not None
        by_index = {p.index: p for p in self.pods if not p.terminating}
        return Gang(
            placement=placement,
            spec=spec,
            current=[by_index[plan.index] for plan in placement.pods if plan.index in by_index],
            missing=[plan for plan in placement.pods if plan.index not in by_index],
            gated_by_us=uses_gang_gate(self.job.ref, spec),
        )

    def active(self) -> list[PodView]:
        """Pods still running or waiting to run (not finished, not being deleted)."""
        return [p for p in self.pods if not p.finished and not p.terminating]

    def deletable(self) -> list[str]:
        return [p.name for p in self.pods if not p.terminating]

    def kept_reason(self, default: str) -> str:
        """Keep the reason of the teardown that started this restart while it is in progress."""
        cond = condition(self.job.status, "Progressing")
        if self.old_phase == "Restarting" and cond is not None and cond.get("reason"):
            return str(cond["reason"])
        return default

    # -- outcome builders ---------------------------------------------------------------------

    def event(self, type_: str, reason: str, message: str) -> None:
        self.s.events.append(Event(type_, reason, message))

    def finish(
        self,
        phase: str,
        reason: str,
        message: str = "",
        *,
        action: str = "wait",
        create: Sequence[dict] = (),
        delete: Sequence[str] = (),
        ungate: Sequence[Ungate] = (),
        delete_job: bool = False,
        requeue_after: float | None = None,
        workload: dict | None = None,
        workload_status: dict | None = None,
    ) -> Decision:
        s = self.s
        lifecycle = Lifecycle(
            phase=phase,
            reason=reason,
            message=message,
            attempt=s.attempt,
            restarts=s.restarts,
            placement=s.placement,
            start_time=s.start_time,
            completion_time=s.completion_time,
            next_attempt_time=s.next_attempt_time,
            admission_time=s.admission_time,
            checkpoint_nodes=s.checkpoint_nodes,
        )
        # A report counts while training runs and on the way to the end (the final report of
        # the termination message); a restarting or suspended gang keeps its last one.
        progress = self.progress if phase in ("Running", "Succeeded", "Failed") else None
        status = summarize(self.job, self.pods, progress, self.now, lifecycle, self.pod_names())
        exported = exported_message(self.job.status, status)
        if exported is not None:
            self.event("Normal", "Exported", exported)
        plan = memory_plan_message(self.job.status, status)
        if plan is not None:
            self.event("Normal", "MemoryPlan", plan)
        return Decision(
            status=status,
            create=tuple(create),
            delete=tuple(delete),
            ungate=tuple(ungate),
            delete_job=delete_job,
            events=tuple(s.events),
            requeue_after=requeue_after,
            action=action,
            workload=workload,
            workload_status=workload_status,
        )

    def fail(self, reason: str, message: str) -> Decision:
        if self.s.completion_time is None:
            self.s.completion_time = format_time(self.now)
        self.event("Warning", reason, message)
        return self.finish("Failed", reason, message, action="fail", delete=[p.name for p in self.active()])

    def teardown(self, reason: str, message: str, event_type: str = "Warning", action: str = "replan") -> Decision:
        """End this attempt: attempt+1 recorded with the reason; every pod is deleted. Counts
        nothing against backoffLimit: a counted restart is `restart.restart_or_fail`, which has
        set the backoff (`nextAttemptTime`) before it calls this with action "restart"."""
        s = self.s
        s.attempt += 1
        s.placement = None
        s.admission_time = None
        if action != "restart":
            s.next_attempt_time = None
        self.event(event_type, reason, message)
        return self.finish("Restarting", reason, message, action=action, delete=self.deletable(), requeue_after=1.0)
