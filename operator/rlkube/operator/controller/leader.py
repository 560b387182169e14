"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

The replica that holds the lease runs the operator; the others wait. Taking the lease is an
update with the lease's resourceVersion, so of two replicas racing for it exactly one wins. A
lease counts as expired only after `lease_seconds` pass on THIS replica's clock without the
record changing (as client-go does), so clock skew between nodes cannot hand it over early.
The leader renews every `retry_seconds`; if it cannot renew for `renew_deadline_seconds`
(< lease_seconds) it stops acting at once: `on_lost` exits the process, and the Deployment
restarts it as a standby. A restarted process with the same identity (the same pod) takes its
lease back immediately instead of waiting for it to expire.

The holder names its own Pod as the Lease's owner (`owner`, an ownerReference), so the garbage
collector deletes the Lease once no operator pod holds it: `helm uninstall` leaves no Lease behind,
even when the chart's RBAC is gone before the terminating operator could delete it itself.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlkube.operator.controller.kubeapi import ApiError, Conflict, KubeAPI

logger = logging.getLogger("rlkube.operator.controller.leader")


def _micro_time(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    api: KubeAPI
    namespace: str
    identity: str
    name: str = "rlkube-operator"
    lease_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0
    owner: dict | None = None  # ownerReference of the holder's Pod (see the module docstring)
    _observed: tuple | None = field(default=None, init=False)
    _observed_at: float = field(default=0.0, init=False)
    _last_renew: float = field(default=0.0, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the lease afterwards."""
        now = dt.datetime.now(dt.timezone.utc)
        lease = self.api.get_lease(self.namespace, self.name)
        spec_new = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _micro_time(now),
        }
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace, **self._owned()},
                "spec": {**spec_new, "acquireTime": _micro_time(now), "leaseTransitions": 0},
            }
            try:
                self.api.create_lease(self.namespace, body)
            except ApiError as exc:
                if exc.status == 409:
                    return False
                raise
            self._held()
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and time.monotonic() - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        lease["spec"] = {
            **spec,
            **spec_new,
            "acquireTime": spec.get("acquireTime") if holder == self.identity else _micro_time(now),
            "leaseTransitions": transitions if holder == self.identity else transitions + 1,
        }
        lease["metadata"].update(self._owned())
        try:
            self.api.replace_lease(self.namespace, lease)
        except Conflict:
            return False
        self._held()
        return True

    def _owned(self) -> dict:
        return {"ownerReferences": [self.owner]} if self.owner else {}

    def _held(self) -> None:
        self._last_renew = time.monotonic()
        self._observed = None

    def acquire(self) -> None:
        """Block until this replica leads."""
        logger.info("leader election: waiting for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not self._stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    logger.info("leader election: %s leads", self.identity)
                    return
            except Exception as exc:  # API server away: keep trying
                logger.warning("leader election: %s", exc)
            self._stop.wait(self.retry_seconds * (1 + 0.2 * random.random()))

    def keep_renewing(self, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew on a daemon thread; call `on_lost` once renewing failed for the deadline."""

        def loop() -> None:
            while not self._stop.wait(self.retry_seconds):
                try:
                    if not self.try_acquire_or_renew():
                        logger.error("leader election: lease taken by another replica")
                        on_lost()
                        return
                except Exception as exc:
                    logger.warning("leader election: renew failed: %s", exc)
                if time.monotonic() - self._last_renew > self.renew_deadline_seconds:
                    logger.error("leader election: not renewed for %.0fs", self.renew_deadline_seconds)
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="rlkube-lease", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """On a clean shutdown: give the lease up so a standby takes over without waiting."""
        self._stop.set()
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["leaseDurationSeconds"] = 1
                self.api.replace_lease(self.namespace, lease)
        except Exception as exc:
            logger.warning("leader election: release failed: %s", exc)
