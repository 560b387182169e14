"""Fixtures of the e2e tests: rlkube installed by Helm on the harness's cluster, and, when a test
that uses it fails, the cluster's side of the story (operator logs, events, jobs, pods) added to
the test's report.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from tests.e2e import deploy

JOBS_NAMESPACE = "rlkube-e2e"


@dataclass
class Deployed:
    """rlkube as installed for the e2e session: the chart's release and a namespace for jobs."""

    cluster: object
    release: str
    namespace: str  # the operator's (PSS restricted)
    jobs_namespace: str  # where the tests' RLTrainingJobs run (hostPath checkpoints: not restricted)
    runtime_image: str

    def job_name(self, prefix: str) -> str:
        """A job name unique to this run: checkpoints live in a hostPath named after the job, so a
        reused name would resume from an earlier run's checkpoint."""
        return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def deployed(cluster):
    """Images built and loaded, the chart installed into rlkube-system, the operator Ready."""
    deploy.build_and_load(cluster, deploy.OPERATOR_IMAGE)
    runtime = deploy.build_and_load(cluster, deploy.RUNTIME_IMAGE)
    deploy.install(cluster)
    deploy.ensure_namespace(cluster, JOBS_NAMESPACE)
    yield Deployed(cluster, deploy.RELEASE, deploy.OPERATOR_NAMESPACE, JOBS_NAMESPACE, runtime)
    cluster.kubectl("delete", "namespace", JOBS_NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On the failure of a test that uses `deployed`, append the cluster state to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.when not in ("setup", "call") or not report.failed:
        return
    deployed_fixture = item.funcargs.get("deployed") if hasattr(item, "funcargs") else None
    cluster = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if deployed_fixture is not None:
        cluster = deployed_fixture.cluster
    if cluster is None or not getattr(cluster, "nodes", None):
        return
    namespaces = [JOBS_NAMESPACE, *getattr(item, "rlkube_namespaces", [])]
    report.sections.append(("rlkube cluster state", deploy.dump(cluster, namespaces)))
