"""`make demo`: rlkube end to end on a local cluster, the way a user would run it.

    python -m tests.e2e.demo            (what `make demo` runs after `make setup`)

1. brings up the harness's cluster (two kubelet nodes with fake GPUs; built from official
   sources on first use, see docs/cluster.md), or reuses the one that is up;
2. builds the operator and CPU runtime images (cached by input hash) and loads them into the nodes;
3. installs the Helm chart into rlkube-system (Pod Security "restricted");
4. applies examples/dpo-tiny-cpu.yaml in the `default` namespace and follows it to Succeeded,
   printing phase, step and tokens/s as they change (bounded by --timeout);
5. prints `kubectl get rltj`, the job's events, and where to look next.

The cluster stays up afterwards, so the commands printed at the end work; `make cluster-down`
stops it. On failure it prints the operator's logs, the events and the job's YAML, and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cluster.cluster import up  # noqa: E402
from tests.cluster.fixtures import Cluster  # noqa: E402
from tests.cluster.layout import Layout, default_nodes  # noqa: E402
from tests.e2e import deploy  # noqa: E402

NAMESPACE = "default"
EXAMPLE = "dpo-tiny-cpu.yaml"


def follow(cluster: Cluster, name: str, timeout: float) -> dict:
    """Print the job's progress whenever it changes, until it ends or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        job = deploy.get_job(cluster, NAMESPACE, name)
        progress = (job.get("status") or {}).get("progress") or {}
        line = (deploy.phase(job) or "Pending", progress.get("step"), progress.get("tokensPerSecond"))
        if line != last:
            tps = f"{line[2]:.0f}" if isinstance(line[2], (int, float)) else "-"
            deploy.log(f"{name}: phase={line[0]} step={line[1] if line[1] is not None else '-'} tokens/s={tps}")
            last = line
        if deploy.phase(job) in deploy.TERMINAL:
            return job
        if time.monotonic() > deadline:
            raise deploy.JobTimeout(f"{name} did not finish within {timeout:.0f} s (phase {deploy.phase(job)})")
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the job (default 900)")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    layout = Layout()
    deploy.log("cluster: bringing it up (first run builds Kubernetes from source: see docs/cluster.md)")
    timings = up(layout, "full")
    deploy.log(f"cluster: up ({', '.join(f'{k} {v}' for k, v in timings.items()) or 'already running'})")
    cluster = Cluster(layout, "full", default_nodes())

    deploy.build_and_load(cluster, deploy.OPERATOR_IMAGE)
    deploy.build_and_load(cluster, deploy.RUNTIME_IMAGE)
    deploy.log(f"helm: installing charts/rlkube as release {deploy.RELEASE} in {deploy.OPERATOR_NAMESPACE}")
    deploy.install(cluster)

    job = deploy.job_manifest("dpo-tiny", NAMESPACE, EXAMPLE)
    name = job["metadata"]["name"]
    # A rerun starts the demo job afresh (its pods go with it, by ownerReference).
    deploy.delete_job(cluster, NAMESPACE, name)
    deploy.log(f"kubectl apply -f examples/{EXAMPLE}")
    deploy.apply(cluster, job)
    try:
        done = follow(cluster, name, args.timeout)
    except Exception:
        print(deploy.dump(cluster, [NAMESPACE]), file=sys.stderr)
        raise
    kubectl = f"kubectl --kubeconfig={cluster.kubeconfig}"
    print()
    print(f"$ {kubectl} get rltj")
    print(cluster.kubectl("get", "rltj", "-n", NAMESPACE).rstrip())
    print(f"\n$ {kubectl} get events --field-selector involvedObject.name={name}")
    for event in deploy.events(cluster, NAMESPACE, name):
        print(f"  {event.get('type', ''):8} {event.get('reason', ''):14} {event.get('message', '')}")
    ok = deploy.phase(done) == "Succeeded"
    print(f"\nrlkube demo: job {name} {deploy.phase(done)} in {time.monotonic() - t0:.0f} s (whole demo).")
    print(f"""
Where to look next:
  {kubectl} describe rltj {name}                      # status, conditions, placement, events
  {kubectl} get pods -l rlkube.io/job={name} -o wide  # one pod per (fake) GPU, where the planner put it
  {kubectl} logs -l rlkube.io/job={name},rlkube.io/pod-index=0   # the trainer's log (rank 0)
  {kubectl} -n {deploy.OPERATOR_NAMESPACE} logs deploy/{deploy.RELEASE}             # the operator's decisions
  {kubectl} explain rltj.spec.roles                   # the API, documented
  examples/*.yaml, docs/demo.md; `make cluster-down` stops the local cluster.""")
    if not ok:
        print(deploy.dump(cluster, [NAMESPACE]), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
