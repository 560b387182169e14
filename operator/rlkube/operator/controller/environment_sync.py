"""A job's environment (`roles.environment`) kept as its spec says, on every reconcile: its
Deployment, Service and NetworkPolicy made when missing, the Deployment scaled to the spec's
replicas (0 once the job finished), and status.environment from what the Deployment reports. The
objects and the status are `render.environment`'s pure functions; this is the edge that reads and
writes them.

They are made while the job is still Pending, before the gang is placed, so the environment's
replicas start while the trainers do (a trainer waits for /healthz before its first step). A
change of `replicas` (the one field of roles that may change on a running job) reaches the
Deployment at the job's next reconcile, which the change itself triggers. One GET a reconcile,
only for jobs with an environment, and a second while the job may still train and its Deployment
exists: the NetworkPolicy's, so an environment made before the operator rendered one (or whose
policy was deleted) gets it without its Deployment and Service being made again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rlkube.operator.api.observed import JobView
from rlkube.operator.controller.kubeapi import KubeAPI, scale_deployment
from rlkube.operator.lifecycle import Decision
from rlkube.operator.render import environment

logger = logging.getLogger("rlkube.operator")


def sync_environment(api: KubeAPI, job: JobView, decision: Decision,
                     create: Callable[[dict[str, Any]], bool]) -> Decision:
    """`decision` with status.environment, after making or scaling the job's environment
    (`create` makes one object: False when it exists)."""
    spec = job.spec
    if spec is None or spec.roles.environment is None or decision.status is None:
        return decision
    phase = decision.status.get("phase")
    wanted = environment.wanted_replicas(spec, phase)
    name = environment.environment_name(job.name)
    deployment = api.get("Deployment", job.namespace, name)
    if deployment is None and wanted:
        for obj in environment.render_environment(job.ref, spec):
            create(obj)
    elif deployment is not None:
        if wanted and api.get("NetworkPolicy", job.namespace, name) is None:
            # An environment made before its pods had a NetworkPolicy (or one whose policy was deleted).
            create(environment.render_network_policy(job.ref, spec))
            logger.info("%s/%s: environment's NetworkPolicy made", job.namespace, job.name)
        if (deployment.get("spec") or {}).get("replicas") != wanted:
            scale_deployment(api, job.namespace, name, wanted)
            logger.info("%s/%s: environment scaled to %d replicas", job.namespace, job.name, wanted)
    status = environment.environment_status(spec, job.ref, deployment, phase)
    return replace(decision, status={**decision.status, "environment": status})
