"""After admission: what the whole gang's pods add up to. Pure.

Checked in this order on a gang that is whole (see `repair`): an exit code in failOnExitCodes
fails the job at once; another failure ends the attempt and counts against backoffLimit
(lifecycle/restart.py); a disruption (eviction, preemption) re-plans, not counted; all pods
Succeeded is success; pods not all bound within gangTimeoutSeconds re-plan (GangTimeout, not
counted); all running is Running, and an elastic job may then grow (lifecycle/elastic.py).
"""

from __future__ import annotations

import datetime as dt

from rlkube.operator.api.observed import format_time, parse_time
from rlkube.operator.lifecycle import elastic, restart
from rlkube.operator.lifecycle.decider import Decider, Gang
from rlkube.operator.lifecycle.decision import Decision


def judge(d: Decider, gang: Gang) -> Decision:
    """The admitted, whole gang's outcome: failed, restarting, succeeded, binding or running."""
    ended = _failed(d, gang)
    if ended is not None:
        return ended
    current, spec = gang.current, gang.spec
    if all(p.succeeded for p in current):
        d.s.completion_time = format_time(d.now)
        d.event("Normal", "Succeeded", f"all {len(current)} pods finished training")
        return d.finish("Succeeded", "Completed", f"all {len(current)} pods succeeded", action="succeed")

    unbound = [p for p in current if not p.node]
    if unbound:
        admitted = parse_time(d.s.admission_time)
        timeout = spec.placement.gang_timeout_seconds
        left = (admitted + dt.timedelta(seconds=timeout) - d.now).total_seconds() if admitted else timeout
        if gang.gated_by_us and left <= 0:
            return d.teardown("GangTimeout", f"{len(unbound)} of {len(current)} pods not bound to a node "
                              f"within gangTimeoutSeconds {timeout}")
        return d.finish("Scheduling", "Admitted", f"{len(current) - len(unbound)}/{len(current)} pods bound",
                        requeue_after=max(1.0, left) if gang.gated_by_us else None)

    stuck = [p for p in current if p.stuck]
    if all(p.phase in ("Running", "Succeeded") for p in current):
        started = d.old_phase != "Running"
        if started:
            d.event("Normal", "Running", f"all {len(current)} pods are running")
        elif all(p.phase == "Running" for p in current):
            grown = elastic.grow(d)
            if grown is not None:
                return grown
        return d.finish("Running", "Running", f"{len(current)} pods running{d.admission_note()}",
                        action="running" if started else "wait")
    message = f"{sum(p.phase == 'Running' for p in current)}/{len(current)} pods running"
    if stuck:
        message += "; " + ", ".join(f"{p.name}: {p.reason} {p.message}".strip() for p in stuck)
    return d.finish("Scheduling", "PodsStarting", message)


def _failed(d: Decider, gang: Gang) -> Decision | None:
    """A failed pod ends the attempt: the job fails, or the gang restarts or re-plans."""
    current, policy = gang.current, gang.spec.run_policy
    codes = set(policy.fail_on_exit_codes)
    permanent = [p for p in current if p.failed and p.exit_code in codes]
    if permanent:
        p = permanent[0]
        # The trainer's own word on why (contract/failure.py) leads: it names the field or file.
        why = f": {p.failure}" if p.failure else ""
        return d.fail("ExitCode", f"pod {p.name} exited with code {p.exit_code}{why} (one of failOnExitCodes "
                      f"{sorted(codes)}: not retried)")
    crashed = [p for p in current if p.failed and not p.disrupted]
    if crashed:
        p = crashed[0]
        what = f"exited with code {p.exit_code}" if p.exit_code is not None else f"failed ({p.reason or 'no reason'})"
        if p.failure:
            what += f": {p.failure}"
        return restart.restart_or_fail(d, "PodFailed", f"pod {p.name} {what}")
    disrupted = [p for p in current if p.failed and p.disrupted]
    if disrupted:
        p = disrupted[0]
        return d.teardown("PodDisrupted", f"pod {p.name} was disrupted ({p.reason}): re-planning")
    return None
