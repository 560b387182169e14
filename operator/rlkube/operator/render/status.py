"""Status summarizing: what `kubectl get/describe rltrainingjob` shows, as a pure function.

`summarize(job, pods, progress, now, lifecycle)` returns the whole `.status` dict (camelCase, the
shape of `rlkube.operator.api.RLTrainingJobStatus`). The lifecycle decision (`lifecycle.decide`)
chooses the phase, the attempt and the placement; this module derives what follows from them and
from the observed pods: conditions in the built-in controllers' shape (lastTransitionTime kept
while a condition's status does not change), observedGeneration, per-role readiness, the
placement as status, progress, outputs (the model the run exported), the run's summary once it
succeeded, restarts.

Three fields exist so that a restarted operator continues where the last one stopped, declared
in the API like the others: `attempt` (gang generation: label rlkube.io/attempt, RLKUBE_ATTEMPT),
`nextAttemptTime` (restart backoff) and `admissionTime` (when the gang was admitted; the gang
timeout counts from it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkube.operator.api.observed import JobView, PodView, format_time
from rlkube.operator.planning.placement import Placement, PodPlan
from rlkube.runtime.contract.config import MAX_PATH_LEN
from rlkube.runtime.contract.progress import (
    MEMORY_PLAN,
    MEMORY_PLAN_MAX_CHARS,
    OUTPUT_ADAPTER,
    OUTPUT_MODEL,
    OUTPUT_PATH,
    OUTPUT_STEP,
    OUTPUTS,
    PROGRESS_FIELDS,
    STARTUP_PARTS,
    STARTUP_SECONDS,
    STATUS_OUTPUTS,
    STATUS_SUMMARY,
    SUMMARY,
    SUMMARY_COUNTS,
    SUMMARY_NUMBERS,
    SUMMARY_PATHS,
)

TERMINAL_PHASES = ("Succeeded", "Failed")


# Nodes whose hostPath holds a job's checkpoints: every node a plan of it used, kept across
# attempts, so deleting the job cleans each of them (operator/rlkube/operator/render/cleanup.py).
STATUS_CHECKPOINT_NODES = "checkpointNodes"


@dataclass(frozen=True)
class Lifecycle:
    """The lifecycle facts `lifecycle.decide` settles, from which the rest of the status follows."""

    phase: str
    reason: str                      # CamelCase reason of the phase, e.g. Unschedulable, ExitCode
    message: str = ""
    attempt: int = 0
    restarts: int = 0
    placement: Placement | None = None
    start_time: str | None = None
    completion_time: str | None = None
    next_attempt_time: str | None = None
    admission_time: str | None = None
    checkpoint_nodes: tuple[str, ...] = ()  # nodes whose hostPath holds the job's checkpoints


# -- conditions -------------------------------------------------------------------------------


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now: dt.datetime,
    generation: int,
) -> list[dict]:
    """`conditions` with `type_` set; its lastTransitionTime moves only when its status changes."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    out: list[dict] = []
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        since = cond.get("lastTransitionTime") if cond.get("status") == value else None
        out.append(_condition(type_, value, reason, message, since or format_time(now), generation))
    if not found:
        out.append(_condition(type_, value, reason, message, format_time(now), generation))
    return out


def _condition(type_: str, status: str, reason: str, message: str, since: str, generation: int) -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


# -- placement <-> status ---------------------------------------------------------------------


def placement_to_status(placement: Placement, names: Sequence[str]) -> dict:
    """The API's PlacementStatus of a plan; `names` are the pod names by index."""
    return {
        "pods": [
            {
                "name": names[plan.index],
                "index": plan.index,
                "node": plan.node,
                "ranks": list(plan.ranks),
                "roles": list(plan.roles),
            }
            for plan in placement.pods
        ],
        "deviceMap": {role: list(ranks) for role, ranks in placement.device_map.items()},
        "domains": dict(placement.domains),
        "fallback": placement.fallback,
    }


def placement_from_status(data: Mapping[str, Any] | None) -> Placement | None:
    """The plan recorded in status (messages are not recorded), or None."""
    if not data or not data.get("pods"):
        return None
    pods = tuple(
        PodPlan(index=int(p["index"]), node=str(p["node"]), ranks=tuple(p.get("ranks") or ()), roles=tuple(p.get("roles") or ()))
        for p in sorted(data["pods"], key=lambda p: int(p["index"]))
    )
    return Placement(
        pods=pods,
        device_map={k: list(v) for k, v in (data.get("deviceMap") or {}).items()},
        domains=dict(data.get("domains") or {}),
        fallback=bool(data.get("fallback")),
        messages=(),
    )


# -- readiness and progress -------------------------------------------------------------------


def role_readiness(
    device_map: Mapping[str, Sequence[int]], placement: Placement | None, pods: Sequence[PodView], attempt: int
) -> dict[str, dict]:
    """Per role: its ranks, the pods holding them, how many of those are Ready."""
    ready_by_index = {p.index: p.ready for p in pods if p.attempt == attempt and not p.terminating}
    out = {}
    for role, ranks in device_map.items():
        holders = [plan.index for plan in placement.pods if set(plan.ranks) & set(ranks)] if placement else []
        ready = sum(1 for i in holders if ready_by_index.get(i))
        out[role] = {
            "ranks": list(ranks),
            "pods": len(holders),
            "readyPods": ready,
            "ready": bool(holders) and ready == len(holders),
        }
    return out


# status.progress fields the operator derives from the copied ones (no /progress field feeds them).
DERIVED_PROGRESS = ("percent", "etaSeconds", "tokensPerSecondPerGpu")


def pace(progress: Mapping[str, Any], gpus: int | None) -> dict:
    """percent, etaSeconds and tokensPerSecondPerGpu from status.progress's step, totalSteps,
    stepSeconds and tokensPerSecond, and the job's GPUs; each left out where its inputs are."""
    out: dict[str, Any] = {}
    step, total = progress.get("step"), progress.get("totalSteps")
    if isinstance(step, int) and isinstance(total, int) and total > 0:
        done = min(step, total)
        out["percent"] = round(100.0 * done / total, 1)
        seconds = progress.get("stepSeconds")
        if isinstance(seconds, (int, float)):
            out["etaSeconds"] = round((total - done) * seconds)
    tps = progress.get("tokensPerSecond")
    if isinstance(tps, (int, float)) and gpus:
        out["tokensPerSecondPerGpu"] = round(tps / gpus, 1)
    return out


def progress_status(report: Mapping[str, Any], now: dt.datetime, gpus: int | None = None) -> dict:
    """status.progress from rank 0's /progress JSON: known numeric fields, negatives dropped, and
    what follows from them (`pace`) for a job of `gpus` GPUs."""
    out: dict[str, Any] = {}
    for key in PROGRESS_FIELDS:
        value = report.get(key)
        if key == "phase":
            continue  # the trainer's own stage name; the job's phase is the operator's
        if key == MEMORY_PLAN:
            if isinstance(value, str) and value:
                out[key] = value[:MEMORY_PLAN_MAX_CHARS]
            continue
        if key == STARTUP_SECONDS:
            split = startup_status(value)
            if split:
                out[key] = split
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue  # NaN/inf: not valid JSON numbers for the API server
        if key in ("step", "totalSteps", "evalStep"):
            if value < 0:
                continue
            value = int(value)
        elif key not in ("loss", "rewardMean", "evalRewardMean") and value < 0:
            continue
        elif key == "tokensPerSecond":
            value = round(value, 1)  # `kubectl get rltj` shows it: 26904.2, not 26904.229259433603
        elif key == "stepSeconds":
            value = round(value, 3)
        out[key] = value
    out.update(pace(out, gpus))
    out["updatedAt"] = format_time(now)
    return out


def startup_status(value: Any) -> dict:
    """status.progress.startupSeconds from the report's split: its known parts that are finite,
    non-negative seconds."""
    if not isinstance(value, Mapping):
        return {}
    out = {}
    for key in STARTUP_PARTS:
        seconds = value.get(key)
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < float("inf"):
            out[key] = round(float(seconds), 3)
    return out


def _output(entry: Any) -> dict | None:
    """One export entry {path, step} when well formed (a path of at most MAX_PATH_LEN characters
    and a non-negative integer step), else None."""
    if not isinstance(entry, Mapping):
        return None
    path, step = entry.get(OUTPUT_PATH), entry.get(OUTPUT_STEP)
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_LEN:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    return {OUTPUT_PATH: path, OUTPUT_STEP: step}


def outputs_status(report: Mapping[str, Any]) -> dict | None:
    """status.outputs from a /progress report: its model export and (LoRA) adapter, each when well
    formed; None when neither is."""
    outputs = report.get(OUTPUTS)
    if not isinstance(outputs, Mapping):
        return None
    found = {key: entry for key in (OUTPUT_MODEL, OUTPUT_ADAPTER) if (entry := _output(outputs.get(key)))}
    return found or None


def kept_outputs(progress: Mapping[str, Any] | None, old: Mapping[str, Any]) -> dict | None:
    """status.outputs from a fresh report, else the last one: a report without an export (a new
    attempt before its first, say) leaves the last export's directory where it was."""
    outputs = outputs_status(progress) if progress is not None else None
    return dict(outputs or old.get(STATUS_OUTPUTS) or {}) or None


def summary_status(report: Mapping[str, Any]) -> dict | None:
    """status.summary from a /progress report's summary: its counts (non-negative integers), figures
    (finite, non-negative numbers) and paths (at most MAX_PATH_LEN characters), each left out where
    it is not one; None when the report has no summary."""
    summary = report.get(SUMMARY)
    if not isinstance(summary, Mapping):
        return None
    out: dict[str, Any] = {}
    for key in SUMMARY_COUNTS:
        value = summary.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = value
    for key in SUMMARY_NUMBERS:
        value = summary.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf"):
            out[key] = round(value, 4)
    for key in SUMMARY_PATHS:
        value = summary.get(key)
        if isinstance(value, str) and value and len(value) <= MAX_PATH_LEN:
            out[key] = value
    return out or None


def kept_summary(progress: Mapping[str, Any] | None, old: Mapping[str, Any]) -> dict | None:
    """status.summary from a fresh report, else the last one."""
    summary = summary_status(progress) if progress is not None else None
    return summary or (dict(old[STATUS_SUMMARY]) if old.get(STATUS_SUMMARY) else None)


def memory_plan_message(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The message of a MemoryPlan Event when status.progress.memoryPlan changed from `old` to `new`
    (whole statuses): a new plan, made by a (re)started trainer; else None."""
    before = (old.get("progress") or {}).get(MEMORY_PLAN)
    after = (new.get("progress") or {}).get(MEMORY_PLAN)
    return after if after and after != before else None


def exported_message(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The message of an Exported Event when status.outputs' model or adapter changed from `old`
    to `new` (whole statuses), else None."""
    parts = []
    for key, what in ((OUTPUT_MODEL, "model"), (OUTPUT_ADAPTER, "LoRA adapter")):
        before = (old.get(STATUS_OUTPUTS) or {}).get(key)
        after = (new.get(STATUS_OUTPUTS) or {}).get(key)
        if after and after != before:
            parts.append(f"{what} exported to {after[OUTPUT_PATH]} at step {after[OUTPUT_STEP]}")
    return "; ".join(parts) or None


# -- the whole status -------------------------------------------------------------------------


def summarize(
    job: JobView,
    pods: Sequence[PodView],
    progress: Mapping[str, Any] | None,
    now: dt.datetime,
    lifecycle: Lifecycle,
    pod_names: Sequence[str] = (),
) -> dict:
    """The job's new `.status`, from the lifecycle decision and the observed pods.

    `progress` is a fresh /progress report, or None to keep the last one (it is polled on a
    timer, not on every reconcile). Conditions: Placed, Ready, Progressing, and Succeeded,
    Failed, Suspended once they have been true.
    """
    old = job.status
    gen = job.generation
    spec = job.spec
    phase, reason, message = lifecycle.phase, lifecycle.reason, lifecycle.message
    current = [p for p in pods if p.attempt == lifecycle.attempt and not p.terminating]
    conditions: list[dict] = [dict(c) for c in old.get("conditions") or []]

    def put(type_: str, status: bool, why: str, text: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, status, why, text, now, gen)

    placement = lifecycle.placement
    if placement is not None:
        where = ", ".join(f"{role} in {domain}" for role, domain in placement.domains.items())
        put("Placed", True, "PlacedWithFallback" if placement.fallback else "Placed", where)
    else:
        put("Placed", False, reason, message)

    expected = len(placement.pods) if placement else 0
    ready = sum(1 for p in current if p.ready)
    all_ready = phase == "Running" and expected > 0 and ready == expected
    put("Ready", all_ready, "AllPodsReady" if all_ready else ("PodsNotReady" if phase == "Running" else phase),
        f"{ready}/{expected} pods ready")

    progressing = phase in ("Scheduling", "Running", "Restarting") or (phase == "Pending" and reason != "Unschedulable")
    put("Progressing", progressing, reason, message)

    if phase == "Succeeded":
        put("Succeeded", True, reason, message)
    if phase == "Failed":
        put("Failed", True, reason, message)
    if phase == "Suspended":
        put("Suspended", True, reason, message)
    elif condition(old, "Suspended") is not None:
        put("Suspended", False, "Resumed", "")

    device_map = placement.device_map if placement else (spec.device_map() if spec else {})
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "observedGeneration": gen,
        "restarts": lifecycle.restarts,
        "attempt": lifecycle.attempt,
    }
    if spec is not None:
        # An elastic job's plan may be smaller or larger than its roles' GPUs: the plan counts.
        status["gpus"] = sum(len(p.ranks) for p in placement.pods) if placement else spec.total_gpus()
        status["roles"] = role_readiness(device_map, placement, pods, lifecycle.attempt)
    if placement is not None:
        status["placement"] = placement_to_status(placement, pod_names)
    if progress is not None:
        status["progress"] = progress_status(progress, now, status.get("gpus"))
    elif old.get("progress"):
        status["progress"] = dict(old["progress"])
    for key, value in (
        (STATUS_OUTPUTS, kept_outputs(progress, old)),
        (STATUS_SUMMARY, kept_summary(progress, old)),
        ("startTime", lifecycle.start_time),
        ("completionTime", lifecycle.completion_time),
        ("nextAttemptTime", lifecycle.next_attempt_time),
        ("admissionTime", lifecycle.admission_time),
        (STATUS_CHECKPOINT_NODES, list(lifecycle.checkpoint_nodes) or None),
    ):
        if value is not None:
            status[key] = value
    return status


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict | None:
    """A JSON merge patch turning `old` into `new` at the top level (None: nothing to write).

    Keys the operator dropped are set to null; keys it never writes (another controller's) are
    left alone only if they are absent from `new` AND not operator keys. Nested values are
    replaced whole, which is what merge patch does for lists and what we want for dicts too,
    so a nested dict is written as null-then-value only through its own keys.
    """
    owned = {
        "phase", "conditions", "observedGeneration", "restarts", "attempt", "gpus", "roles",
        "placement", "progress", "outputs", STATUS_SUMMARY, "environment", "startTime", "completionTime",
        "nextAttemptTime", "admissionTime",
        STATUS_CHECKPOINT_NODES,
    }
    patch: dict[str, Any] = {}
    for key in owned | set(new):
        if key in new:
            if old.get(key) != new[key]:
                patch[key] = _replace(old.get(key), new[key])
        elif key in old:
            patch[key] = None
    return patch or None


def _replace(old: Any, new: Any) -> Any:
    """A merge-patch value that yields exactly `new` over `old` (dict keys gone become null)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = {k: _replace(old.get(k), v) for k, v in new.items() if old.get(k) != v}
        out.update({k: None for k in old if k not in new})
        return out
    return new


def counts_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether `new` differs from `old` only in what pods are counted: condition messages under
    the same type, status and reason ("3/8 pods bound", "5/8 pods ready") and the roles' ready
    counts. No phase, reason, attempt, placement or time differs; the operator may write such a
    status a little later (reconcile.py coalesces them)."""
    patch = status_patch(old, new)
    if not patch or not set(patch) <= {"conditions", "roles"}:
        return False

    def shape(status: Mapping[str, Any]) -> list[tuple]:
        return [(c.get("type"), c.get("status"), c.get("reason"), c.get("lastTransitionTime"))
                for c in status.get("conditions") or []]

    return shape(old) == shape(new)
