"""`rlkube submit --follow` and `rlkube logs` as a user runs them: the CLI in its own process, with
the harness's kubeconfig, against the operator Helm installed.

A good tiny DPO job is followed to Succeeded (exit 0), printing its phases, its steps and rank 0's
log; `rlkube logs` then reads that pod, and names the job's roles when asked for one it lacks.
A job whose data file does not exist fails at once: the trainer exits 3 (a config error, never
retried: runPolicy.failOnExitCodes' default), the operator writes the Failed condition naming
data.source, and `submit --follow` exits 1 printing it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.e2e import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def rlkube(deployed, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The `rlkube` CLI of this checkout, in a process of its own, as the harness's user."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(deploy.REPO / "operator"), str(deploy.REPO / "runtime")])}
    env.pop("KUBECONFIG", None)
    command = [sys.executable, "-m", "rlkube.operator.cli", *args, "--kubeconfig", str(deployed.cluster.kubeconfig)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=deploy.REPO)
    deploy.log(f"rlkube {' '.join(args)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return proc


def test_submit_follows_a_good_job_to_succeeded_and_logs_reads_rank_0(deployed, tmp_path):
    ns = deployed.jobs_namespace
    name = deployed.job_name("submit")
    job = deploy.job_manifest(name, ns)
    steps = job["spec"]["training"]["steps"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    try:
        proc = rlkube(deployed, "submit", str(path), "--follow", "--timeout", "8m")
        out = proc.stdout
        assert proc.returncode == 0, out + proc.stderr
        assert f"rltrainingjob.rlkube.io/{name} created in namespace {ns}" in out, out
        assert any(f"[{name}] phase {p}" in out for p in ("Pending", "Scheduling", "Running")), out
        assert f"[{name}] step {steps}/{steps}" in out, out
        assert f"[{name}] job {name} succeeded" in out, out
        assert f"\n{name}-actor-0 | " in out, out  # rank 0's log, streamed
        assert deploy.phase(deploy.get_job(deployed.cluster, ns, name)) == "Succeeded"

        logs = rlkube(deployed, "logs", name, "-n", ns)
        assert logs.returncode == 0 and logs.stdout.strip(), logs.stdout + logs.stderr
        other = rlkube(deployed, "logs", name, "-n", ns, "--role", "critic")
        assert other.returncode == 2, other.stdout + other.stderr
        assert "has no role 'critic'" in other.stderr and "actor (ranks 0-1)" in other.stderr, other.stderr
        # The same manifest again: refused by the API server, the existing job untouched.
        again = rlkube(deployed, "submit", str(path))
        assert again.returncode == 1 and "kubectl delete rltj" in again.stderr, again.stderr
    finally:
        deploy.delete_job(deployed.cluster, ns, name)


def test_submit_follow_exits_non_zero_naming_a_missing_data_file(deployed, tmp_path):
    ns = deployed.jobs_namespace
    name = deployed.job_name("nodata")
    job = deploy.job_manifest(name, ns, roles={"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}},
                              data={"source": "/data/missing.jsonl", "format": "jsonl"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    try:
        proc = rlkube(deployed, "submit", str(path), "--follow", "--timeout", "6m")
        out = proc.stdout
        assert proc.returncode == 1, out + proc.stderr
        failed = next((line for line in out.splitlines() if line.startswith(f"[{name}] job {name} failed: ")), "")
        assert "data.source" in failed and "/data/missing.jsonl" in failed, out
        done = deploy.get_job(deployed.cluster, ns, name)
        assert deploy.phase(done) == "Failed" and done["status"]["restarts"] == 0, done["status"]
    finally:
        deploy.delete_job(deployed.cluster, ns, name)


def test_submit_refuses_a_bad_manifest_before_sending_it(deployed, tmp_path):
    ns = deployed.jobs_namespace
    name = deployed.job_name("bad")
    job = deploy.job_manifest(name, ns, roles={"actor": {"gpus": 0}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    proc = rlkube(deployed, "submit", str(path), "--follow")
    assert proc.returncode == 3 and "spec.roles.actor.gpus" in proc.stderr, proc.stderr
    found = deployed.cluster.kubectl("get", "rltj", name, "-n", ns, "--ignore-not-found")
    assert not found.strip(), found
