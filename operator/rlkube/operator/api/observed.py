"""What the operator observes, as small read-only views over raw API objects.

The pure functions (render, lifecycle, status) take these views, never API clients: a pod is a
camelCase dict as the API server returns it, and `PodView` reads the few facts that drive a
decision (attempt, index, phase, gate, exit code, disruption). Unit tests build the dicts with
small builders, so every rule is checked without a cluster.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlkube.operator.api import API_VERSION, KIND, RLTrainingJobSpec, parse_spec, spec_errors
from rlkube.runtime.contract import failure as run_failure
from rlkube.runtime.contract.pod import LABEL_ATTEMPT, LABEL_JOB, LABEL_POD_INDEX  # noqa: F401 (LABEL_JOB re-exported)

GANG_GATE = "rlkube.io/gang"
TRAINER_CONTAINER = "trainer"
# Where rlkube's plan puts a pod before it binds, and the GPUs it takes there: render writes
# them, the GPU inventory counts them (planning/inventory.py), like the scheduler's assumed pods.
PLANNED_NODE_ANNOTATION = "rlkube.io/planned-node"
GPUS_ANNOTATION = "rlkube.io/gpus"
# Who admits a gang instead of rlkube's gate (docs/kueue.md).
VOLCANO_SCHEDULER = "volcano"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# Pod status reasons that mean the pod was taken away (not that the trainer crashed). Kubernetes
# also marks such pods with the DisruptionTarget condition; older kubelets only set the reason.
DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Terminated", "NodeShutdown", "Shutdown"})
# Container waiting reasons that never resolve on their own with restartPolicy Never; they are
# reported in the job's status so `kubectl describe` says why the gang is not running.
STUCK_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "CrashLoopBackOff",
})


def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 API timestamp ("2026-12-02T14:00:00Z") as an aware datetime; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    parsed = dt.datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def format_time(value: dt.datetime) -> str:
    """An aware datetime as the API's RFC 3339 form, to the second, in UTC."""
    return value.astimezone(dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def gang_gate_position(pod: Mapping[str, Any]) -> int | None:
    """Where the rlkube.io/gang gate sits in `pod`'s spec.schedulingGates (the JSON patch that
    removes it names the position), or None when the gang no longer holds the pod. `pod`: a raw
    API object, a store's reduced copy or a pod this operator is about to create."""
    for position, gate in enumerate((pod.get("spec") or {}).get("schedulingGates") or ()):
        if gate.get("name") == GANG_GATE:
            return position
    return None


def gang_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the gang's scheduling gate still holds `pod` (kept from binding until the whole
    gang is placed and created)."""
    return gang_gate_position(pod) is not None


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class PodView:
    """The facts of one of a job's pods that the lifecycle decides on."""

    name: str
    index: int | None          # label rlkube.io/pod-index (= NODE_RANK)
    attempt: int | None        # label rlkube.io/attempt
    phase: str                 # Pending, Running, Succeeded, Failed, Unknown
    node: str | None           # spec.nodeName: bound by a scheduler
    gate_position: int | None  # position of the rlkube.io/gang gate in spec.schedulingGates
    ready: bool                # the Ready condition
    terminating: bool          # metadata.deletionTimestamp is set
    exit_code: int | None      # the trainer container's terminated exit code, if it ended
    reason: str                # pod status reason, or the trainer's terminated/waiting reason
    message: str
    disrupted: bool            # taken away (eviction, preemption, node loss), not a crash
    stuck: bool                # the trainer waits on something that will not resolve by itself
    pod_ip: str | None
    raw: Mapping[str, Any]
    # The trainer's last /progress report, from its termination message (rank 0 writes it as
    # {"progress": {...}} when training ends); None when it left none.
    final_progress: Mapping[str, Any] | None = None
    # Why the trainer failed, one line, from its termination message's error entry
    # (contract/failure.py): "config error: data.source: ... does not exist"; None when it left none.
    failure: str | None = None

    @property
    def gated(self) -> bool:
        return self.gate_position is not None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PodView:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        trainer = next(
            (c for c in status.get("containerStatuses") or [] if c.get("name") == TRAINER_CONTAINER),
            None,
        )
        state = (trainer or {}).get("state") or {}
        terminated = state.get("terminated")
        waiting = state.get("waiting")
        exit_code = _int_or_none(terminated.get("exitCode")) if terminated else None
        body = _termination_body(terminated.get("message")) if terminated else None
        final_progress = _final_progress(body)
        reason = status.get("reason") or ""
        message = status.get("message") or ""
        if not reason and terminated:
            reason = terminated.get("reason") or ""
            if body is None:  # a report is data, not a message for people
                message = message or terminated.get("message") or ""
        if not reason and waiting:
            reason = waiting.get("reason") or ""
            message = message or waiting.get("message") or ""
        disruption = conditions.get("DisruptionTarget") or {}
        phase = status.get("phase") or "Pending"
        disrupted = disruption.get("status") == "True" or (
            phase == "Failed" and (status.get("reason") or "") in DISRUPTION_REASONS
        )
        return cls(
            name=meta.get("name") or "",
            index=_int_or_none(labels.get(LABEL_POD_INDEX)),
            attempt=_int_or_none(labels.get(LABEL_ATTEMPT)),
            phase=phase,
            node=spec.get("nodeName") or None,
            gate_position=gang_gate_position(obj),
            ready=(conditions.get("Ready") or {}).get("status") == "True",
            terminating=bool(meta.get("deletionTimestamp")),
            exit_code=exit_code,
            reason=reason,
            message=message,
            disrupted=disrupted,
            stuck=bool(waiting) and (waiting.get("reason") or "") in STUCK_WAITING_REASONS,
            pod_ip=status.get("podIP") or None,
            raw=obj,
            final_progress=final_progress,
            failure=_failure(body),
        )


def _termination_body(message: str | None) -> Mapping[str, Any] | None:
    """A trainer's termination message as the JSON object it writes, else None."""
    if not message or not message.lstrip().startswith("{"):
        return None
    try:
        body = json.loads(message)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _final_progress(body: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The report in a trainer's termination message `{"progress": {...}}`, else None."""
    report = (body or {}).get("progress")
    return report if isinstance(report, dict) else None


def _failure(body: Mapping[str, Any] | None) -> str | None:
    """The error entry of a termination message as one line for people, naming the field."""
    error = (body or {}).get(run_failure.TERMINATION_ERROR_KEY)
    if not isinstance(error, dict):
        return None
    category = str(error.get(run_failure.ERROR_EXIT) or run_failure.ERROR_CRASH)
    field = str(error.get(run_failure.ERROR_FIELD) or "")
    text = " ".join(str(error.get(run_failure.ERROR_MESSAGE) or "").split())
    if field and field not in text:
        text = f"{field}: {text}"
    words = {run_failure.ERROR_CONFIG: "config error", run_failure.ERROR_NON_FINITE: "non-finite loss"}
    return f"{words.get(category, category)}: {text}"[:1024]


def pod_views(objs: list[Mapping[str, Any]]) -> list[PodView]:
    """Views of a job's pods, ordered by pod index then name (stable for tests and messages)."""
    views = [PodView.from_object(o) for o in objs]
    return sorted(views, key=lambda p: (p.index if p.index is not None else 1 << 30, p.name))


@dataclass(frozen=True)
class JobRef:
    """The identity of a job that its children point to (ownerReferences, labels, names)."""

    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str] | None = None

    def owner_reference(self) -> dict:
        # controller: the job is the one controller of its children; blockOwnerDeletion: a
        # foreground deletion of the job waits for them.
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def uses_gang_gate(job: JobRef, spec: RLTrainingJobSpec) -> bool:
    """Whether rlkube gates the pods itself: not when Volcano or Kueue does the admission."""
    if spec.scheduler_name == VOLCANO_SCHEDULER:
        return False
    return KUEUE_QUEUE_LABEL not in (job.labels or {})


@dataclass(frozen=True)
class JobView:
    """An RLTrainingJob as observed: identity, parsed spec (or why it does not parse), status."""

    ref: JobRef
    generation: int
    resource_version: str
    spec: RLTrainingJobSpec | None
    spec_error: str | None      # every spec problem, one per line, with its field path
    status: Mapping[str, Any]
    deleting: bool
    created: str = ""           # metadata.creationTimestamp: the job's place in the queue (planning/fifo.py)

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def namespace(self) -> str:
        return self.ref.namespace

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> JobView:
        meta = obj.get("metadata") or {}
        raw_spec = obj.get("spec") or {}
        spec: RLTrainingJobSpec | None
        error: str | None = None
        try:
            spec = parse_spec(raw_spec)
        except Exception:  # pydantic.ValidationError; spec_errors() names each field path
            spec = None
            error = "\n".join(str(e) for e in spec_errors(raw_spec)) or "spec: invalid"
        return cls(
            ref=JobRef(
                name=meta.get("name") or "",
                namespace=meta.get("namespace") or "default",
                uid=meta.get("uid") or "",
                labels=dict(meta.get("labels") or {}),
            ),
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            spec=spec,
            spec_error=error,
            status=dict(obj.get("status") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            created=str(meta.get("creationTimestamp") or ""),
        )


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` has an ownerReference to the object with `uid` (an old job of the same name
    may still have pods being garbage-collected; those are not this job's)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)
