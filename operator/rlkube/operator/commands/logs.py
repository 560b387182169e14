"""`rlkube logs JOB [--role R] [--rank N] [--follow]`: the log of the pod holding one rank of a role.

The default is the actor's rank 0 (global rank 0: the rank that prints the progress records and
the run's summary). The pod is found from the job's device map and each pod's ranks
(pod_logs.py); when the role, the rank or its pod does not exist, the error names the roles and
ranks the job has, or its pods and phase. `--follow` prints the log until the container ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from rlkube.operator.commands.follow import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_SUCCEEDED
from rlkube.operator.commands.pod_logs import NoSuchPod, choose_pod, log_started
from rlkube.runtime.contract.pod import LABEL_JOB

EXIT_NO_POD = 2  # the job, role, rank or pod does not exist


def run(job_name: str, role: str, rank: int, follow: bool, namespace: str | None, kubeconfig: str | None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr, connect: Callable[[str | None], Any] | None = None) -> int:
    """The `logs` verb; the exit code. `connect(kubeconfig)` makes the API client (kube.Kube)."""
    from rlkube.operator.commands.kube import Kube, KubeError

    try:
        kube = (connect or Kube)(kubeconfig)
        ns = namespace or kube.default_namespace
        job = kube.get_job(ns, job_name)
        if job is None:
            print(f"rlkube logs: no RLTrainingJob {job_name!r} in namespace {ns}", file=err)
            return EXIT_NO_POD
        pods = kube.list_pods(ns, f"{LABEL_JOB}={job_name}")
        pod = choose_pod(job, pods, role, rank)
        name = pod["metadata"]["name"]
        if not log_started(pod):
            phase = (pod.get("status") or {}).get("phase", "Pending")
            print(f"rlkube logs: pod {name} ({role} rank {rank}) has not started its trainer yet (pod phase "
                  f"{phase}); try again, or `kubectl describe pod {name} -n {ns}`", file=err)
            return EXIT_NO_POD
        for line in kube.pod_log(ns, name, follow=follow):
            out.write(line + "\n")
            out.flush()
    except NoSuchPod as exc:
        print(f"rlkube logs: {exc}", file=err)
        return EXIT_NO_POD
    except KubeError as exc:
        print(f"rlkube logs: {exc}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_SUCCEEDED
