"""What the chaos soak concludes from what it saw: pure functions over records, no cluster.

Three questions, each answered from observations the soak's threads collect (observe.py):

- Was there ever a duplicate pod? Two views, each with its own rule:
  * the API (`ApiCensus`, fed by a pod watch): at no moment two *live* pod objects (no
    deletionTimestamp, phase neither Succeeded nor Failed) of one job with one pod index. A
    terminating pod beside its replacement is allowed here, since it no longer counts as live;
    pod names are `<job>-<slot>-<index>` and reused across attempts, so this can only fail if two
    objects of one index ever carry different names.
  * the processes (`process_duplicates`, fed by /proc samples of the host the nodes share): at no
    moment trainer processes of two different pod UIDs with one pod name, except a *stale* one:
    a process whose pod object is already gone from the API (force-deleted by the operator) and
    whose node's kubelet is stopped, or was resumed less than STALE_KILL_GRACE seconds earlier
    (the time its kubelet needs to notice the deleted pod and kill the container). That is the
    partition the operator's lost-node policy accepts (docs/scheduling.md, "Lost nodes"); the
    fence keeps such a process from committing a checkpoint (checked separately on disk).
- How many steps did each fault cost? From rank 0's log of every attempt (`restarts_of`): for
  every attempt after a job's first, the last step any earlier attempt logged at or before the
  fault that preceded it, minus the step the new attempt resumed at (0 when it started fresh).
- How long did recovery take? The new attempt's first logged step minus the fault's time.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

STALE_KILL_GRACE = 60.0
ATTEMPT_SLACK_S = 30.0
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")
CGROUP_POD = re.compile(r"rlkube-[0-9a-f]{6}-(?P<node>[^/]+)/(?:.*/)?pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f-_]{27})")


# -- the API view ------------------------------------------------------------------------------------


def pod_key(pod: dict) -> tuple[str, str] | None:
    """(job, pod index) of a trainer pod, None for any other pod."""
    labels = pod["metadata"].get("labels") or {}
    job, index = labels.get("rlkube.io/job"), labels.get("rlkube.io/pod-index")
    return (job, index) if job and index is not None else None


def is_live(pod: dict) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return not pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


@dataclass
class ApiCensus:
    """Live trainer pods per (job, pod index), updated event by event; every moment with more than
    one is kept in `violations`."""

    live: dict[str, tuple[tuple[str, str], str, str]] = field(default_factory=dict)  # uid -> key, name, node
    seen: dict[str, dict] = field(default_factory=dict)  # uid -> the pod's last known object
    present: set[str] = field(default_factory=set)  # uids whose objects exist (terminating or not)
    most: int = 0
    violations: list[dict] = field(default_factory=list)

    def observe(self, kind: str, pod: dict, at: float) -> None:
        key = pod_key(pod)
        if key is None:
            return
        uid = pod["metadata"]["uid"]
        self.seen[uid] = pod
        if kind == "DELETED":
            self.present.discard(uid)
        else:
            self.present.add(uid)
        if kind != "DELETED" and is_live(pod):
            self.live[uid] = (key, pod["metadata"]["name"], pod["spec"].get("nodeName") or "")
        else:
            self.live.pop(uid, None)
        same = [(u, name, node) for u, (k, name, node) in self.live.items() if k == key]
        self.most = max(self.most, len(same))
        if len(same) > 1:
            self.violations.append({"time": at, "job": key[0], "index": key[1], "pods": same})

    def forget_missing(self, present: set[str], at: float) -> None:
        """After a re-list: pods not in it were deleted while the watch was down."""
        for uid in [u for u in self.present if u not in present]:
            self.observe("DELETED", self.seen[uid], at)


# -- the process view --------------------------------------------------------------------------------


def pod_of_cgroup(text: str) -> tuple[str, str] | None:
    """(node, pod uid) from a /proc/<pid>/cgroup of a container the harness's kubelets started."""
    found = CGROUP_POD.search(text)
    return (found["node"], found["uid"].replace("_", "-")) if found else None


def process_duplicates(sample: list[tuple[str, str]], names: dict[str, str], in_api: set[str],
                       stopped_since: dict[str, float], resumed_at: dict[str, float], at: float) -> dict | None:
    """One /proc sample's verdict: None when fine, else what was wrong.

    `sample` is (node, pod uid) of every trainer process; `names` maps pod uid -> pod name (from
    the watch); `in_api` the uids whose objects exist; `stopped_since`/`resumed_at` the kubelet
    stops of the fault driver (node -> time)."""
    uids_by_name: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for node, uid in sample:
        if uid in names:
            uids_by_name[names[uid]].add((uid, node))
    for name, found in uids_by_name.items():
        if len(found) < 2:
            continue
        stale = [(uid, node) for uid, node in found if uid not in in_api and _partitioned(node, stopped_since, resumed_at, at)]
        if len(found) - len(stale) > 1 or not stale:
            return {"time": at, "pod": name, "processes": sorted(found), "stale_allowed": sorted(stale)}
    return None


def _partitioned(node: str, stopped_since: dict[str, float], resumed_at: dict[str, float], at: float) -> bool:
    return node in stopped_since or at - resumed_at.get(node, float("-inf")) < STALE_KILL_GRACE


# -- the trainers' logs ------------------------------------------------------------------------------


def parse_cri_line(line: str) -> tuple[float, str] | None:
    """(unix time, message) of one line of a container log in the CRI format containerd writes."""
    parts = line.split(" ", 3)
    if len(parts) < 4:
        return None
    stamp = parts[0]
    try:  # nanoseconds: fromisoformat takes at most microseconds
        head, _, frac = stamp.rstrip("Z").partition(".")
        when = datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))
    except ValueError:
        return None
    return when, parts[3]


@dataclass
class AttemptLog:
    """Rank 0 of one pod UID (one attempt of a job), as its log says."""

    uid: str
    job: str
    node: str
    steps: list[tuple[float, int]] = field(default_factory=list)  # (time, steps done)
    resumed: int | None = None
    first_seen: float = 0.0

    def feed(self, when: float, message: str) -> None:
        if not self.first_seen:
            self.first_seen = when
        found = RESUMED.search(message)
        if found:
            self.resumed = int(found[1])
            return
        if '"event":"step"' in message:
            try:
                rec = json.loads(message)
            except ValueError:
                return
            self.steps.append((float(rec.get("time", when)), int(rec["step"])))

    @property
    def started(self) -> float:
        """When this attempt's trainer started training (its first record), else first log line."""
        return self.steps[0][0] if self.steps else self.first_seen


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float
    end: float
    target: str
    detail: str = ""
    training: tuple[str, ...] = ()  # the pods training when it struck ("<pod> on <node> at step N")


# -- did the faults strike while jobs trained? ------------------------------------------------------

TRAINING_FRESH_S = 20.0  # a job whose rank 0 logged a step this recently is training


@dataclass(frozen=True)
class Training:
    """A live trainer pod of a job whose current attempt is training (not loading, not done)."""

    job: str
    pod: str
    node: str
    step: int
    total: int

    def describe(self) -> str:
        return f"{self.pod} on {self.node} at step {self.step}/{self.total}"


def training_pods(attempts: list[AttemptLog], live: dict[str, tuple[tuple[str, str], str, str]],
                  totals: dict[str, int], now: float, fresh_s: float = TRAINING_FRESH_S) -> list[Training]:
    """Every live pod (`live`: ApiCensus.live, uid -> ((job, index), name, node)) of a job whose
    rank 0 is a live pod that logged a step within `fresh_s` seconds and is short of the job's
    last step (`totals`). A pod being deleted, or a stale one behind a partition (its object
    force-deleted), is not live, so never counts."""
    steps: dict[str, int] = {}
    for a in attempts:
        if a.uid in live and a.steps and now - a.steps[-1][0] <= fresh_s and a.steps[-1][1] < totals.get(a.job, 0):
            steps[a.job] = a.steps[-1][1]
    return sorted((Training(job, name, node, steps[job], totals[job])
                   for (job, _), name, node in live.values() if job in steps and node),
                  key=lambda t: t.pod)


def landing(faults: list[Fault], skipped: list[str], kinds: tuple[str, ...]) -> dict:
    """Every fault struck while a job trained, none was skipped, and every kind happened: a
    trainer kill hit a training pod, a kubelet stop a node with a training pod, an operator kill
    or an API-server restart happened while some job trained. A soak whose faults struck an idle
    cluster proves nothing."""
    rows = []
    for f in faults:
        pods = [t.split(" on ")[0] for t in f.training]
        nodes = [t.split(" on ")[1].split(" at ")[0] for t in f.training]
        if f.kind == "kill-trainer":
            ok = f.target.split("/")[-1] in pods
        elif f.kind == "stop-kubelet":
            ok = f.target in nodes
        else:
            ok = bool(f.training)
        rows.append({"kind": f.kind, "start": f.start, "target": f.target, "training": list(f.training), "ok": ok})
    missing = sorted(set(kinds) - {f.kind for f in faults})
    return {"ok": all(r["ok"] for r in rows) and not skipped and not missing,
            "faults": rows, "skipped": skipped, "kinds_missing": missing}


def restarts_of(job: str, attempts: list[AttemptLog], faults: list[Fault], every: int) -> list[dict]:
    """One row per attempt after the job's first: the fault before it, steps lost, recovery."""
    ordered = sorted((a for a in attempts if a.job == job and (a.steps or a.resumed is not None)),
                     key=lambda a: a.started)
    rows = []
    for i, new in enumerate(ordered[1:], start=1):
        earlier = ordered[:i]
        # From a little before the previous attempt's first log line: a fault can end an attempt
        # whose pod was just created (seen: a pod deleted 2 s after its job was applied).
        cause = _cause(job, faults, earlier[-1].first_seen - ATTEMPT_SLACK_S, new.started)
        cut = cause.start if cause else new.started
        before = [s for a in earlier for t, s in a.steps if t <= cut]
        last = max(before, default=0)
        resumed = new.resumed or 0
        lost = max(0, last - resumed)
        rows.append({
            "job": job, "uid": new.uid, "fault": cause.kind if cause else None,
            "fault_target": cause.target if cause else None, "fault_time": cause.start if cause else None,
            "last_step_before": last, "resumed": resumed, "steps_lost": lost, "ok": lost <= every,
            "recovery_s": round(new.steps[0][0] - cut, 1) if new.steps else None,
        })  # fmt: skip
    return rows


def _cause(job: str, faults: list[Fault], since: float, until: float) -> Fault | None:
    """The fault that ended the attempt which ran from `since`: the first one between the two
    attempts that touched the job (its trainer killed, any kubelet stopped), else the first of any
    kind (then the check on unexplained restarts names it), else None."""
    between = [f for f in faults if since <= f.start <= until]
    touching = [f for f in between if f.kind == "stop-kubelet"
                or (f.kind == "kill-trainer" and f.target.split("/")[-1].startswith(f"{job}-"))]
    return min(touching or between, key=lambda f: f.start, default=None)


def summarize(faults: list[Fault], restarts: list[dict], recoveries: dict[str, list[float]]) -> dict:
    """Figures by fault kind: count, component recovery times, job restarts, steps lost."""
    kinds: dict[str, dict] = {}
    for f in faults:
        row = kinds.setdefault(f.kind, {"faults": 0, "restarts": 0, "steps_lost": [], "job_recovery_s": []})
        row["faults"] += 1
    for r in restarts:
        row = kinds.setdefault(r["fault"] or "none", {"faults": 0, "restarts": 0, "steps_lost": [], "job_recovery_s": []})
        row["restarts"] += 1
        row["steps_lost"].append(r["steps_lost"])
        if r["recovery_s"] is not None:
            row["job_recovery_s"].append(r["recovery_s"])
    for kind, times in recoveries.items():
        kinds.setdefault(kind, {"faults": 0, "restarts": 0, "steps_lost": [], "job_recovery_s": []})["component_recovery_s"] = times
    return kinds
