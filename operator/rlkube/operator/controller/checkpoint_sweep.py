"""The sweep that cleans the hostPath checkpoints of jobs deleted while no operator ran.

kopf does not replay a DELETED event that happened while the operator was down (it exited after
losing its Lease to an API-server outage, say, or was being upgraded), and rlkube puts no
finalizer on jobs (docs/scheduling.md says why). What survives the job is its checkpoint record
(cleanup.py): a ConfigMap written with its first pods, naming its nodes. At start (the leader
only: this runs inside the operator's leadership) and every `--checkpoint-sweep-seconds`, the
sweep lists the records, then the jobs, and hands every record whose job UID is gone to
`Reconciler.clean_checkpoints`, which makes the cleanup pods and deletes the record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from rlkube.operator.controller.kubeapi import KubeAPI, list_configmaps
from rlkube.operator.controller.metrics import Metrics
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.render import cleanup

logger = logging.getLogger("rlkube.operator")


def sweep(api: KubeAPI, reconciler: Reconciler, namespaces: Sequence[str]) -> list[str]:
    """One sweep over `namespaces` (empty: all); returns the `namespace/job` of every record it
    cleaned for."""
    scopes: Sequence[str | None] = list(namespaces) or [None]
    records = [r for ns in scopes for r in list_configmaps(api, ns, cleanup.LABEL_RECORD)]
    if not records:
        return []
    live = {j["metadata"]["uid"] for ns in scopes for j in api.list_jobs(ns)}  # after the records: see orphaned()
    cleaned = []
    for found in cleanup.orphaned(records, live):
        job = cleanup.job_of_record(found)
        meta = job["metadata"]
        logger.info("%s/%s (uid %s) was deleted while no operator ran: removing its hostPath checkpoints",
                    meta["namespace"], meta["name"], meta["uid"])
        reconciler.clean_checkpoints(job)
        cleaned.append(f"{meta['namespace']}/{meta['name']}")
    return cleaned


async def sweep_loop(reconciler: Reconciler, namespaces: Sequence[str], seconds: float, metrics: Metrics,
                     executor=None) -> None:
    """Sweep now, then every `seconds`; a failed sweep is logged and tried again next time."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await loop.run_in_executor(executor, sweep, reconciler.api, reconciler, namespaces)
        except Exception as exc:
            metrics.observe_error("checkpoint_sweep")
            logger.warning("checkpoint sweep failed (next in %.0f s): %s", seconds, exc)
        await asyncio.sleep(seconds)
