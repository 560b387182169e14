"""The lifecycle decision: given what is observed, what the operator does next. Pure.

`decide(job, pods, now, cluster, progress, settings)` looks at the job (spec and the status the
operator wrote last), the pods it owns, and, when it asks for it, the cluster's GPU inventory,
and returns a `Decision`: the new status, the objects to create, the pods to delete or to ungate,
Events to post, and when to look again. The handlers apply it in a fixed order (status first,
with a resourceVersion precondition, then deletes, creates, ungates), so a crash between any two
steps leaves a state from which the next reconcile continues: intent is recorded before it is
acted on, and every action is idempotent.

The rules, in the order they are checked:
1. The spec does not parse: Failed (InvalidSpec), naming every field path.
2. Succeeded/Failed are final: remaining running pods are deleted; after
   ttlSecondsAfterFinished the job itself is deleted (its children go by ownerReference GC).
3. activeDeadlineSeconds since startTime: Failed (DeadlineExceeded).
4. runPolicy.suspend: the gang is torn down, Suspended. Clearing it resumes with a new plan.
5. Pods of an older attempt are deleted and waited for (pod names are reused by the next
   attempt, so at most one pod per index ever exists). Then the restart backoff is waited out.
6. No plan for this attempt: plan (`placement.plan_placement`; an elastic job at the largest
   pod count in [minWorkers, maxWorkers] that fits). Unplaceable: Pending (Unschedulable),
   retried later. Placed: Service, ConfigMap and pods are created, gated.
7. Before admission: missing pods are created; once all exist, and the plan still fits the free
   GPUs, every gate is removed at once (admission). If the plan no longer fits: re-plan.
   With Volcano or Kueue admission is theirs: no gate, no gang timeout.
8. After admission: an exit code in failOnExitCodes fails the job at once; another failure
   restarts the whole gang with attempt+1 (counted against backoffLimit, exponential backoff);
   an eviction, a vanished pod or a vanished node re-plans (attempt+1, not counted); all pods
   Succeeded is success; pods not all bound within gangTimeoutSeconds re-plan. An elastic job
   running below maxWorkers whose larger gang fits now re-plans (ElasticGrow, not counted).

A gang teardown always bumps `attempt` in the same status write that records why, before any
pod is deleted; pods carry their attempt as a label, so "stale" is a fact anyone can check.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlkube.operator import render
from rlkube.operator.observed import JobView, PodView, format_time, parse_time
from rlkube.operator.placement import NodeInventory, Placement, Unplaceable, plan_placement, request_from_spec
from rlkube.operator.status import (
    TERMINAL_PHASES,
    Lifecycle,
    condition,
    placement_from_status,
    summarize,
)


@dataclass(frozen=True)
class Settings:
    """Operator-side timing knobs (not part of a job's spec)."""

    backoff_base_seconds: float = 10.0     # first restart waits this long, then doubles
    backoff_max_seconds: float = 300.0
    unschedulable_retry_seconds: float = 15.0


@dataclass(frozen=True)
class Cluster:
    """What planning sees of the cluster: the job's usable nodes, and the names of all nodes."""

    inventory: list[NodeInventory]
    node_names: frozenset[str]
    own_gpus: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs the job's own bound pods hold


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
    ungate: tuple[Ungate, ...] = ()
    delete_job: bool = False
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None          # seconds; None: wait for the next event or resync
    need_cluster: bool = False                  # call again with `cluster` (nodes and pods listed)
    action: str = "wait"                        # one word, for logs and metrics


def backoff_seconds(restarts: int, settings: Settings) -> float:
    """Wait before restart number `restarts` (1-based): base, 2x base, 4x base ... capped."""
    return min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** max(0, restarts - 1))


def cluster_view(nodes: list[dict], pods: list[dict], spec: Any, planned: list[dict] = (),
                 own_uid: str = "", own_pods: list[dict] | None = None) -> Cluster:
    """The job's view of the cluster: inventory of nodes it may use (nodeSelector, tolerations).

    `pods` are the pods bound to nodes; `planned` are rlkube pods not bound yet. Those of other
    jobs count as using GPUs on their planned node (like the scheduler's assumed pods): two jobs
    planned one after the other never get the same free GPUs, and a plan is never admitted onto
    GPUs another admitted gang is about to bind to. The job's own unbound pods do not count.

    `own_pods`, when given, is a fresher listing of the job's own pods than `pods` (the
    reconciler reads them on every pass; the node-wide listing may be a few seconds old). They
    replace the job's pods in `pods`: a pod of an earlier attempt that is gone no longer holds
    its GPUs, so the attempt planned right after an ElasticGrow teardown sees them free.
    """
    from rlkube.operator.observed import owned_by
    from rlkube.operator.placement import inventory_from_objects

    if own_pods is not None and own_uid:
        pods = [p for p in pods if not owned_by(p, own_uid)] + [p for p in own_pods if owned_by(p, own_uid)]

    reserved = []
    for pod in planned:  # pod metadata is enough: planned node and GPUs are annotations
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        node = notes.get(render.PLANNED_NODE_ANNOTATION)
        if node and not owned_by(pod, own_uid) and not meta.get("deletionTimestamp"):
            gpus = notes.get(render.GPUS_ANNOTATION, "0")
            reserved.append({"metadata": meta, "spec": {"nodeName": node, "containers": [
                {"name": "trainer", "resources": {"requests": {render.GPU_RESOURCE: gpus}}}]}})
    inventory = inventory_from_objects(nodes, [*pods, *reserved], tolerations=list(spec.tolerations))
    selector = dict(spec.node_selector or {})
    if selector:
        inventory = [n for n in inventory if all(n.labels.get(k) == v for k, v in selector.items())]
    names = frozenset((n.get("metadata") or {}).get("name") for n in nodes)
    # From the same listing as the inventory, so "free if this job let go" is exact even when
    # the listing is a little older than the job's own pod list.
    own = inventory_from_objects(nodes, [p for p in pods if own_uid and owned_by(p, own_uid)],
                                 tolerations=list(spec.tolerations))
    return Cluster(inventory=inventory, node_names=names, own_gpus={n.name: n.gpus_used for n in own if n.gpus_used})


def plan_fits(placement: Placement, cluster: Cluster, gpus_per_pod: int) -> str | None:
    """None when every planned node still has the free GPUs its pods need, else why not."""
    need: dict[str, int] = {}
    for plan in placement.pods:
        need[plan.node] = need.get(plan.node, 0) + gpus_per_pod
    free = {n.name: n.gpus_free for n in cluster.inventory}
    for node, gpus in sorted(need.items()):
        if node not in free:
            return f"planned node {node} is gone, unschedulable or not Ready"
        if free[node] < gpus:
            return f"planned node {node} has {free[node]} free GPUs, the plan needs {gpus}"
    return None


def largest_plan(spec: Any, inventory: list[NodeInventory]) -> Placement | Unplaceable:
    """The plan at the largest gang size the spec allows (`worker_counts`) that fits `inventory`;
    when none fits, the Unplaceable of the smallest size, whose reason is the one to fix."""
    failed = Unplaceable("no gang size to plan")
    for workers in spec.worker_counts():
        try:
            return plan_placement(request_from_spec(spec.with_workers(workers)), inventory)
        except Unplaceable as exc:
            failed = exc
    if spec.elastic is not None:
        return Unplaceable(f"elastic: not even minWorkers {spec.elastic.min_workers} pods fit: {failed.reason}")
    return failed


@dataclass
class _State:
    """The lifecycle fields being decided (starts as what the last status recorded)."""

    phase: str
    attempt: int
    restarts: int
    placement: Placement | None
    start_time: str | None
    completion_time: str | None
    next_attempt_time: str | None
    admission_time: str | None
    events: list[Event] = field(default_factory=list)


def decide(
    job: JobView,
    pods: Sequence[PodView],
    now: dt.datetime,
    cluster: Cluster | None = None,
    progress: Mapping[str, Any] | None = None,
    settings: Settings = Settings(),
) -> Decision:
    """What to do next for `job`, whose owned pods are `pods` (see the module docstring)."""
    st = job.status
    state = _State(
        phase=str(st.get("phase") or ""),
        attempt=int(st.get("attempt") or 0),
        restarts=int(st.get("restarts") or 0),
        placement=placement_from_status(st.get("placement")),
        start_time=st.get("startTime"),
        completion_time=st.get("completionTime"),
        next_attempt_time=st.get("nextAttemptTime"),
        admission_time=st.get("admissionTime"),
    )
    return _Decider(job, list(pods), now, cluster, progress, settings, state).run()


class _Decider:
    def __init__(self, job, pods, now, cluster, progress, settings, state: _State) -> None:
        self.job: JobView = job
        self.pods: list[PodView] = pods
        self.now: dt.datetime = now
        self.cluster: Cluster | None = cluster
        self.progress = progress
        self.settings: Settings = settings
        self.s = state
        self.old_phase = state.phase

    # -- outcome builders ---------------------------------------------------------------------

    def _names(self) -> list[str]:
        spec = self.sized_spec()
        return render.pod_names(self.job.name, spec) if spec else []

    def sized_spec(self) -> Any:
        """The spec at the size of this attempt's plan: an elastic job's gang may have more or
        fewer pods than its roles' GPUs make, and its pods, ConfigMap and world size follow the plan."""
        spec, placement = self.job.spec, self.s.placement
        if spec is None or placement is None or spec.elastic is None:
            return spec
        return spec.with_workers(len(placement.pods))

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
        )
        # A report counts while training runs and on the way to the end (the final report of
        # the termination message); a restarting or suspended gang keeps its last one.
        progress = self.progress if phase in ("Running", "Succeeded", "Failed") else None
        status = summarize(self.job, self.pods, progress, self.now, lifecycle, self._names())
        return Decision(
            status=status,
            create=tuple(create),
            delete=tuple(delete),
            ungate=tuple(ungate),
            delete_job=delete_job,
            events=tuple(s.events),
            requeue_after=requeue_after,
            action=action,
        )

    def event(self, type_: str, reason: str, message: str) -> None:
        self.s.events.append(Event(type_, reason, message))

    def active(self) -> list[PodView]:
        """Pods still running or waiting to run (not finished, not being deleted)."""
        return [p for p in self.pods if not p.finished and not p.terminating]

    def deletable(self) -> list[str]:
        return [p.name for p in self.pods if not p.terminating]

    def fail(self, reason: str, message: str) -> Decision:
        if self.s.completion_time is None:
            self.s.completion_time = format_time(self.now)
        self.event("Warning", reason, message)
        return self.finish("Failed", reason, message, action="fail", delete=[p.name for p in self.active()])

    def teardown(self, reason: str, message: str, counted: bool, event_type: str = "Warning") -> Decision:
        """End this attempt: attempt+1 recorded with the reason; every pod is deleted."""
        s = self.s
        s.attempt += 1
        s.placement = None
        s.admission_time = None
        if counted:
            s.restarts += 1
            wait = backoff_seconds(s.restarts, self.settings)
            s.next_attempt_time = format_time(self.now + dt.timedelta(seconds=wait))
            message = f"{message}; restart {s.restarts}/{self.job.spec.run_policy.backoff_limit} in {wait:g}s"
        else:
            s.next_attempt_time = None
        self.event(event_type, reason, message)
        return self.finish("Restarting", reason, message, action="restart" if counted else "replan",
                           delete=self.deletable(), requeue_after=1.0)

    # -- the rules ----------------------------------------------------------------------------

    def run(self) -> Decision:
        job, s = self.job, self.s
        spec = job.spec
        if spec is None:
            message = job.spec_error or "spec: invalid"
            if self.old_phase != "Failed":
                return self.fail("InvalidSpec", message)
            return self.finish("Failed", "InvalidSpec", message, delete=[p.name for p in self.active()])

        if self.old_phase in TERMINAL_PHASES:
            return self.finished()

        deadline = spec.run_policy.active_deadline_seconds
        started = parse_time(s.start_time)
        if deadline and started is not None:
            left = (started + dt.timedelta(seconds=deadline) - self.now).total_seconds()
            if left <= 0:
                return self.fail("DeadlineExceeded", f"activeDeadlineSeconds {deadline} passed since {s.start_time}")
        else:
            left = None

        if spec.run_policy.suspend:
            return self.suspended()
        if self.old_phase == "Suspended":
            self.event("Normal", "Resumed", "runPolicy.suspend cleared: re-planning the gang")

        stale = [p for p in self.pods if p.attempt != s.attempt]
        if stale:
            waiting = [p.name for p in stale if p.terminating]
            delete = [p.name for p in stale if not p.terminating]
            message = f"waiting for {len(stale)} pod(s) of earlier attempts to go"
            return self.finish("Restarting", self._reason("Restarting"), message,
                               action="delete" if delete else "wait", delete=delete,
                               requeue_after=None if waiting and not delete else 2.0)

        next_at = parse_time(s.next_attempt_time)
        if next_at is not None and next_at > self.now:
            wait = (next_at - self.now).total_seconds()
            return self.finish("Restarting", self._reason("Backoff"), f"next attempt at {s.next_attempt_time}",
                               requeue_after=wait)

        decision = self.placed() if s.placement is not None else self.plan()
        if left is not None and decision.requeue_after is None and decision.status is not None:
            decision = replace(decision, requeue_after=max(1.0, left))
        return decision

    def grow(self) -> Decision | None:
        """An elastic job running below maxWorkers whose larger gang fits now (counting the GPUs
        its own pods hold as free): end this attempt, not counted, so the next one is planned
        larger. The pods get SIGTERM and checkpoint on the way out; the larger gang resumes there."""
        spec, placement = self.job.spec, self.s.placement
        assert placement is not None
        running = len(placement.pods)
        if spec.elastic is None or running >= spec.elastic.max_workers:
            return None
        if self.cluster is None:
            return Decision(need_cluster=True, action="observe")
        held = self.cluster.own_gpus
        freed = [replace(n, gpus_used=max(0, n.gpus_used - held.get(n.name, 0))) for n in self.cluster.inventory]
        bigger = largest_plan(spec, freed)
        if isinstance(bigger, Unplaceable) or len(bigger.pods) <= running:
            return None
        return self.teardown("ElasticGrow", f"elastic: {len(bigger.pods)} pods fit now, running with {running} "
                             f"(maxWorkers {spec.elastic.max_workers}): restarting the gang larger from its "
                             "checkpoint", counted=False, event_type="Normal")

    def _reason(self, default: str) -> str:
        """Keep the reason of the teardown that started this restart while it is in progress."""
        cond = condition(self.job.status, "Progressing")
        if self.old_phase == "Restarting" and cond is not None and cond.get("reason"):
            return str(cond["reason"])
        return default

    def finished(self) -> Decision:
        s, spec = self.s, self.job.spec
        cond = condition(self.job.status, s.phase) or {}
        reason, message = str(cond.get("reason") or s.phase), str(cond.get("message") or "")
        ttl = spec.run_policy.ttl_seconds_after_finished
        done = parse_time(s.completion_time)
        if ttl is not None and done is not None:
            left = (done + dt.timedelta(seconds=ttl) - self.now).total_seconds()
            if left <= 0:
                self.event("Normal", "TTLExpired", f"ttlSecondsAfterFinished {ttl} passed: deleting the job")
                return self.finish(s.phase, reason, message, action="delete-job", delete_job=True)
            return self.finish(s.phase, reason, message, delete=[p.name for p in self.active()],
                               requeue_after=max(1.0, left))
        return self.finish(s.phase, reason, message, delete=[p.name for p in self.active()])

    def suspended(self) -> Decision:
        s = self.s
        if self.old_phase != "Suspended":
            if self.pods or s.placement is not None:
                s.attempt += 1
            s.placement = None
            s.admission_time = None
            s.next_attempt_time = None
            s.start_time = None  # activeDeadlineSeconds counts from the resume, as for a Job
            self.event("Normal", "Suspended", "runPolicy.suspend is set: the gang's pods are stopped")
        delete = self.deletable()
        return self.finish("Suspended", "Suspended", "runPolicy.suspend is set",
                           action="suspend" if delete or self.old_phase != "Suspended" else "wait", delete=delete)

    def plan(self) -> Decision:
        s, job, spec = self.s, self.job, self.job.spec
        if self.cluster is None:
            return Decision(need_cluster=True, action="observe")
        placement = largest_plan(spec, self.cluster.inventory)
        if isinstance(placement, Unplaceable):
            reason = placement.reason
            old = condition(job.status, "Placed") or {}
            if old.get("reason") != "Unschedulable" or old.get("message") != reason:
                self.event("Warning", "Unschedulable", reason)
            return self.finish("Pending", "Unschedulable", reason, action="unschedulable",
                               requeue_after=self.settings.unschedulable_retry_seconds)
        s.placement = placement
        s.next_attempt_time = None
        if s.start_time is None:
            s.start_time = format_time(self.now)
        messages = list(placement.messages)
        if spec.elastic is not None:
            messages.append(f"elastic: {len(placement.pods)} pods of minWorkers {spec.elastic.min_workers}.."
                            f"maxWorkers {spec.elastic.max_workers}, the most the free GPUs fit")
        self.event("Normal", "Placed", f"attempt {s.attempt}: " + "; ".join(messages))
        if placement.fallback:
            self.event("Warning", "PlacementFallback", "; ".join(placement.messages))
        objects = render.render(job.ref, self.sized_spec(), placement, s.attempt)
        # The plan was made on a fresh inventory that counts every other job's unbound pods, so the
        # whole gang fits now: admit it in the same step. The pods are still created gated and the
        # gates removed only after every create succeeded, so no pod binds while its gang is
        # incomplete.
        s.admission_time = format_time(self.now)
        ungate = []
        if render.uses_gang_gate(job.ref, spec):
            ungate = [Ungate(o["metadata"]["name"], 0, s.attempt) for o in objects if o["kind"] == "Pod"]
        self.event("Normal", "Admitted", f"gang of {len(placement.pods)} pods fits: created and ungated together")
        return self.finish("Scheduling", "Admitted", f"creating {len(placement.pods)} pods", action="create",
                           create=objects, ungate=ungate, requeue_after=float(spec.placement.gang_timeout_seconds))

    def placed(self) -> Decision:
        s, job, spec = self.s, self.job, self.sized_spec()
        placement = s.placement
        assert placement is not None
        by_index = {p.index: p for p in self.pods if not p.terminating}
        missing = [plan for plan in placement.pods if plan.index not in by_index]
        current = [by_index[plan.index] for plan in placement.pods if plan.index in by_index]
        gated_by_us = render.uses_gang_gate(job.ref, spec)

        if s.admission_time is None:
            if missing:
                objects = [render.render_service(job.ref), render.render_configmap(job.ref, spec, placement.device_map)]
                objects += [render.render_pod(job.ref, spec, placement, plan, s.attempt) for plan in missing]
                return self.finish("Scheduling", "Placed", f"creating {len(missing)} missing pods",
                                   action="create", create=objects)
            gated = [p for p in current if p.gated]
            if gated_by_us and gated:
                if self.cluster is None:
                    return Decision(need_cluster=True, action="observe")
                why = plan_fits(placement, self.cluster, spec.placement.gpus_per_pod)
                if why is not None:
                    return self.teardown("Replan", f"gang not admitted: {why}", counted=False, event_type="Normal")
                s.admission_time = format_time(self.now)
                self.event("Normal", "Admitted",
                           f"all {len(current)} pods exist and the plan fits: scheduling gates removed")
                return self.finish("Scheduling", "Admitted", "gang admitted, waiting for pods to bind",
                                   action="ungate",
                                   ungate=[Ungate(p.name, p.gate_position, s.attempt) for p in gated],
                                   requeue_after=float(spec.placement.gang_timeout_seconds))
            # Nothing of ours gates the pods (Volcano/Kueue admit), or the gates are already off.
            s.admission_time = format_time(self.now)
            return self.finish("Scheduling", "Admitted", "pods handed to the scheduler", action="admit")

        if missing:
            if not any(p.node or p.phase != "Pending" for p in current) and self.old_phase != "Running":
                # The admitting step stopped before all creates went through: finish them.
                objects = [render.render_service(job.ref), render.render_configmap(job.ref, spec, placement.device_map)]
                pods = [render.render_pod(job.ref, spec, placement, plan, s.attempt) for plan in missing]
                ungate = [Ungate(o["metadata"]["name"], 0, s.attempt) for o in pods] if gated_by_us else []
                return self.finish("Scheduling", "Admitted", f"creating {len(missing)} missing pods",
                                   action="create", create=objects + pods, ungate=ungate)
            names = ", ".join(self._names()[plan.index] for plan in missing)
            return self.teardown("PodLost", f"pod(s) {names} vanished after admission", counted=False)

        still_gated = [p for p in current if p.gated]
        if gated_by_us and still_gated:
            # Admission was recorded, but not every gate came off (the operator stopped between
            # two removals): finish it; the decision to admit was made and written already.
            return self.finish("Scheduling", "Admitted", f"removing {len(still_gated)} remaining gates",
                               action="ungate", ungate=[Ungate(p.name, p.gate_position, s.attempt) for p in still_gated])

        if self.cluster is not None:
            lost = [p for p in current if p.node and p.node not in self.cluster.node_names]
            if lost:
                return self.teardown("NodeLost", "node(s) " + ", ".join(sorted({p.node for p in lost})) + " are gone",
                                     counted=False)

        codes = set(spec.run_policy.fail_on_exit_codes)
        permanent = [p for p in current if p.failed and p.exit_code in codes]
        if permanent:
            p = permanent[0]
            return self.fail("ExitCode", f"pod {p.name} exited with code {p.exit_code}, one of failOnExitCodes "
                             f"{sorted(codes)}: not retried")
        crashed = [p for p in current if p.failed and not p.disrupted]
        if crashed:
            p = crashed[0]
            what = f"exited with code {p.exit_code}" if p.exit_code is not None else f"failed ({p.reason or 'no reason'})"
            if s.restarts >= spec.run_policy.backoff_limit:
                return self.fail("BackoffLimitExceeded",
                                 f"pod {p.name} {what}; backoffLimit {spec.run_policy.backoff_limit} reached")
            return self.teardown("PodFailed", f"pod {p.name} {what}", counted=True)
        disrupted = [p for p in current if p.failed and p.disrupted]
        if disrupted:
            p = disrupted[0]
            return self.teardown("PodDisrupted", f"pod {p.name} was disrupted ({p.reason}): re-planning",
                                 counted=False)

        if all(p.succeeded for p in current):
            s.completion_time = format_time(self.now)
            self.event("Normal", "Succeeded", f"all {len(current)} pods finished training")
            return self.finish("Succeeded", "Completed", f"all {len(current)} pods succeeded", action="succeed")

        unbound = [p for p in current if not p.node]
        if unbound:
            admitted = parse_time(s.admission_time)
            timeout = spec.placement.gang_timeout_seconds
            left = (admitted + dt.timedelta(seconds=timeout) - self.now).total_seconds() if admitted else timeout
            if gated_by_us and left <= 0:
                return self.teardown("GangTimeout", f"{len(unbound)} of {len(current)} pods not bound to a node "
                                     f"within gangTimeoutSeconds {timeout}", counted=False)
            return self.finish("Scheduling", "Admitted", f"{len(current) - len(unbound)}/{len(current)} pods bound",
                               requeue_after=max(1.0, left) if gated_by_us else None)

        stuck = [p for p in current if p.stuck]
        if all(p.phase in ("Running", "Succeeded") for p in current):
            started = self.old_phase != "Running"
            if started:
                self.event("Normal", "Running", f"all {len(current)} pods are running")
            elif all(p.phase == "Running" for p in current):
                grown = self.grow()
                if grown is not None:
                    return grown
            return self.finish("Running", "Running", f"{len(current)} pods running",
                               action="running" if started else "wait")
        message = f"{sum(p.phase == 'Running' for p in current)}/{len(current)} pods running"
        if stuck:
            message += "; " + ", ".join(f"{p.name}: {p.reason} {p.message}".strip() for p in stuck)
        return self.finish("Scheduling", "PodsStarting", message)
