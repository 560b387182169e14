"""Which pod holds a role's rank, and a pod's log printed as it comes.

A job's ranks are numbered over the whole gang, and each role owns a range of them (the device
map: actor [0, 1], critic [2], ...; a colocated role shares its host's range). `rlkube logs JOB
--role critic --rank 0` means the critic's first rank: global rank device_map['critic'][0], in
the pod whose rlkube.io/ranks annotation holds it (render/__init__.py writes it on every pod). One
pod runs one trainer process per GPU, and their output shares the pod's log. The device map is
the one the operator placed the job with (status.placement.deviceMap; an elastic job's actor
may hold fewer ranks than its spec asks), else the spec's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rlkube.runtime.contract.pod import LABEL_JOB, LABEL_POD_INDEX

RANKS_ANNOTATION = "rlkube.io/ranks"


class NoSuchPod(LookupError):
    """The asked-for role or rank does not exist, or its pod does not (yet); the message says
    which roles and ranks do."""


def device_map_of(job: dict) -> dict[str, list[int]]:
    """The job's device map as placed (status.placement.deviceMap), else as its spec asks."""
    placed = ((job.get("status") or {}).get("placement") or {}).get("deviceMap")
    if placed:
        return {role: list(ranks) for role, ranks in placed.items()}
    from rlkube.operator import api

    return api.parse_spec(job.get("spec") or {}).device_map()


def pod_ranks(pod: dict) -> list[int]:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(RANKS_ANNOTATION, "")
    return [int(part) for part in text.split(",") if part.strip().isdigit()]


def valid_choices(device_map: dict[str, list[int]]) -> str:
    """'actor (ranks 0-1), reference (rank 0)': what --role and --rank may be."""
    def ranks(count: int) -> str:
        return "rank 0" if count == 1 else f"ranks 0-{count - 1}"

    return ", ".join(f"{role} ({ranks(len(r))})" for role, r in device_map.items() if r)


def choose_pod(job: dict, pods: list[dict], role: str, rank: int) -> dict:
    """The pod of `pods` (the job's, as listed) holding `role`'s `rank`; NoSuchPod naming the
    valid roles and ranks, or the pod that is missing and the job's phase."""
    name = (job.get("metadata") or {}).get("name", "?")
    device_map = device_map_of(job)
    choices = valid_choices(device_map)
    ranks = device_map.get(role) or []
    if not ranks:
        raise NoSuchPod(f"job {name} has no role {role!r}; its roles: {choices}")
    if not 0 <= rank < len(ranks):
        raise NoSuchPod(f"job {name}: role {role} has no rank {rank}; its roles: {choices}")
    wanted = ranks[rank]
    for pod in pods:
        if wanted in pod_ranks(pod):
            return pod
    phase = (job.get("status") or {}).get("phase") or "not reported yet"
    existing = ", ".join(sorted(p["metadata"]["name"] for p in pods)) or "none"
    raise NoSuchPod(f"job {name}: no pod holds {role} rank {rank} (global rank {wanted}) now; job phase "
                    f"{phase}, its pods: {existing}")


def rank0_selector(job_name: str) -> str:
    """The label selector of the pod holding global rank 0 (pod index 0)."""
    return f"{LABEL_JOB}={job_name},{LABEL_POD_INDEX}=0"


def log_started(pod: dict) -> bool:
    """Whether the trainer container has started (a log can be read), for this pod object."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (s.get("state") or {}) or "terminated" in (s.get("state") or {}) for s in statuses)


class LogStream:
    """One pod's log read on a daemon thread, each line handed to `emit` as it comes.

    The reader blocks on the API server until the container ends; the caller bounds how long it
    waits for the rest (`join`), and the thread dies with the process otherwise.
    """

    def __init__(self, lines: Callable[[], Any], emit: Callable[[str], None], uid: str) -> None:
        self.uid = uid
        self.error: str | None = None
        self.error_shown = False
        self._lines, self._emit = lines, emit
        self._thread = threading.Thread(target=self._run, name=f"log-{uid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self._lines():
                self._emit(line)
        except Exception as exc:  # the log is a view: its loss must not end the follow
            self.error = str(exc)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
