"""Operator benchmark: apply -> all pods created, rlkube vs the built-in Indexed Job controller.

Run: `.venv/bin/python tests/bench/bench_operator.py` (needs the harness binaries:
`tests/cluster/build-bins.sh kubernetes etcd`). It starts a private control plane of its own
under /tmp/rlkube-bench-operator-cp (etcd, kube-apiserver, kube-controller-manager with every
controller, kube-scheduler; own ports), so the shared test cluster is neither used nor disturbed,
and stops it at the end. `--markdown` prints the
table for docs/benchmarks.md.

Both arms, on the same API server in the same run, one after the other, alternating, `--rounds`
times each (median reported):
- rlkube: the operator (`python -m rlkube.operator`, namespace-scoped, default settings) is
  started and ready; then 100 RLTrainingJobs of 8 GPUs (gpusPerPod 1, so 8 pods each) are
  created. Measured: from the first create request until 800 pods exist (`created`), and until
  the last pod's scheduling gate is removed (`admitted`: planned on the real node inventory,
  every pod present, the plan re-checked, gates removed).
- Indexed Job: 100 batch/v1 Jobs, completionMode Indexed, completions = parallelism = 8, whose
  pod template is the very pod rlkube renders (same container, env, volumes, GPU request,
  security context, and the same scheduling gate, so neither arm's pods get bound and the
  scheduler adds no load to either). Created by kube-controller-manager's Job controller with
  its default client rate limits (--kube-api-qps 20, burst 30), which is what a user gets.
Fake nodes: 100 Node objects x 8 GPUs, kept Ready (node Lease renewed) for the inventory.
Pod counts are read with `limit=1` lists (remainingItemCount), 10 times a second.

Scale mode (`--rate R`, e.g. `--jobs 1000 --rate 20 --kwok --rounds 1`): the jobs arrive at a
steady R per second instead of all at once, on kwok nodes (`--kwok`: one Node of 8 GPUs per job,
kept Ready by the kwok controller, their taint tolerated by the spec). A pod watch
(tests/bench/arrivals.py) gives per job the time its last pod was created and its last gate
removed; reported: pods/s (all pods / first create -> last pod), p50/p99/max of create-returned ->
all pods gated-free (`admitted`) and -> all pods created, the operator's CPU seconds and peak RSS
over the arm, and its 'reconcile failed' log lines; the control plane's CPU (and per pod), the API
server's requests by kind (and per pod), and the namespace's Events by who posted them and why.
The Indexed Job arm gets the same arrivals.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests" / "bench"))

from arrivals import PodWatch, ProcessUsage, percentile, request_counts, request_delta, submit_steady  # noqa: E402
from operator_env import POOL_LABEL, Env, Kubelet, Operator, wait_until  # noqa: E402

from rlkube.operator import render  # noqa: E402
from rlkube.operator.api import parse_spec  # noqa: E402
from rlkube.operator.api.observed import JobRef  # noqa: E402
from rlkube.operator.controller.kubeapi import KubeAPI  # noqa: E402
from rlkube.operator.planning.placement import Placement, PodPlan  # noqa: E402
from tests.cluster import controlplane, kwok, network, procs  # noqa: E402
from tests.cluster.layout import Layout  # noqa: E402

STATE = Path("/tmp/rlkube-bench-operator-cp")


def private_layout() -> Layout:
    # Index 3: every port and address range shifted away from the shared cluster's (index 0).
    return Layout(state=STATE, index=3)


def stop_private(layout: Layout) -> None:
    if layout.state.exists():
        procs.stop_all(layout.state)
        network.unmount_under(layout.state)
        shutil.rmtree(layout.state, ignore_errors=True)

SPEC = {
    "algorithm": "dpo",
    "model": {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259}},
    "roles": {"actor": {"gpus": 8}, "reference": {"colocateWith": "actor"}},
    "data": {"source": "synthetic", "format": "synthetic"},
    "image": "localhost/rlkube/runtime-cpu:dev",
    "imagePullPolicy": "Never",
    "placement": {"gpusPerPod": 1},
}


def pod_count(env: Env) -> int:
    out = env.api.request("GET", f"/api/v1/namespaces/{env.namespace}/pods", query={"limit": 1})
    items = out.get("items") or []
    return len(items) + int((out.get("metadata") or {}).get("remainingItemCount") or 0)


def gated_count(env: Env) -> int:
    pods = env.api.request("GET", f"/api/v1/namespaces/{env.namespace}/pods").get("items") or []
    return sum(1 for p in pods if p["spec"].get("schedulingGates"))


def wait_count(env: Env, target: int, timeout: float, t0: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pod_count(env) >= target:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"only {pod_count(env)}/{target} pods after {timeout:.0f}s")


def create_all(env: Env, bodies: list[tuple[str, dict]], workers: int = 8) -> float:
    """POST every body with a few concurrent clients (as `kubectl apply` of many files would)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda pb: env.api.request("POST", pb[0], body=pb[1]), bodies))
    return time.monotonic() - t0


CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
OPERATOR_PYTHONPATH = ""  # --operator-pythonpath: the operator's code from another tree (an earlier commit's)
PROFILE: Path | None = None  # --profile: py-spy's folded stacks of the operator over the arm


def control_plane_usage() -> dict[str, ProcessUsage]:
    """CPU meters of the private control plane's processes (those that run)."""
    out = {}
    for name in CONTROL_PLANE:
        pid = procs.read_pid(STATE, name)
        if pid and procs.alive(pid):
            out[name] = ProcessUsage(pid)
    return out


def start_profile(pid: int) -> subprocess.Popen | None:
    """py-spy (installed in .venv for measurement only, not a dependency) sampling the operator's
    threads on CPU, 50 times a second, until stopped."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if PROFILE is None or spy is None:
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "50", "--format", "raw",
                             "--output", str(PROFILE), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def steady(env: Env, arm: str, jobs: int, rate: float, operator: Operator | None) -> dict:
    """One arm with jobs arriving at `rate` per second; figures from a pod watch."""
    client = controlplane.admin_client(private_layout(), timeout=60)
    watch = PodWatch(client, env.namespace).start()
    usage = ProcessUsage(operator.proc.pid) if operator else None
    plane = control_plane_usage()
    requests_before = request_counts(client)
    spy = start_profile(operator.proc.pid) if operator else None
    if arm == "rlkube":
        path = f"/apis/rlkube.io/v1alpha1/namespaces/{env.namespace}/rltrainingjobs"
        bodies = [(path, env.job_body(f"job{i}", SPEC)) for i in range(jobs)]
    else:
        bodies = job_bodies(env, jobs)
    t0 = time.monotonic()
    try:
        submitted = submit_steady(client, bodies, rate)
        submit_s = time.monotonic() - t0
        pods = jobs * 8
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            done = watch.ungated if arm == "rlkube" else watch.created
            if len(done) >= pods:
                break
            time.sleep(0.5)
        created = watch.per_job(watch.created, 8)
        admitted = watch.per_job(watch.ungated, 8)
        elapsed = time.monotonic() - t0
        plane_cpu = {name: round(u.cpu_seconds() - u.start_cpu, 1) for name, u in plane.items() if procs.alive(u.pid)}
        requests = request_delta(requests_before, request_counts(client))
    finally:
        watch.stop()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(timeout=60)
    last_pod = max(watch.created.values(), default=t0)
    out = {"submit_s": round(submit_s, 2), "pods_created": len(watch.created),
           "created_s": round(last_pod - t0, 2), "pods_per_s": round(len(watch.created) / (last_pod - t0), 1),
           "watch_errors": len(watch.errors)}

    def latency(times: dict[str, float], key: str) -> None:
        lat = [times[job] - submitted[job] for job in submitted if job in times]
        if lat:
            out.update({f"{key}_p50_s": round(percentile(lat, 50), 2), f"{key}_p99_s": round(percentile(lat, 99), 2),
                        f"{key}_max_s": round(max(lat), 2), f"{key}_jobs": len(lat)})

    latency(created, "apply_to_created")
    if arm == "rlkube":
        latency(admitted, "apply_to_admitted")
    if usage:
        out.update(operator_cpu_s=round(usage.cpu_seconds() - usage.start_cpu, 1),
                   operator_cpu_share=round((usage.cpu_seconds() - usage.start_cpu) / (time.monotonic() - t0), 2),
                   operator_mem_mib=usage.memory_mib())
    out["control_plane_cpu_s"] = plane_cpu  # over the same window as the pods' (all arrived and done)
    out["control_plane_cpu_ms_per_pod"] = round(1000 * sum(plane_cpu.values()) / pods, 1)
    out["window_s"] = round(elapsed, 1)
    out["apiserver_requests"] = requests  # every client's, the arm's window (see arrivals.request_counts)
    out["requests_per_pod"] = {k: round(v / pods, 3) for k, v in requests.items() if not k.endswith(" s")}
    out["events_by_source"] = events_by_source(env)  # counted after the window: who posts them, and why
    return out


def events_by_source(env: Env) -> dict[str, int]:
    """The namespace's Events counted by 'component reason' (the scheduler's are events.k8s.io
    ones, which the core view names by reportingComponent)."""
    try:
        events = env.api.request("GET", f"/api/v1/namespaces/{env.namespace}/events", timeout=120).get("items") or []
    except Exception as exc:  # a figure of the report, never a reason to lose the run's others
        return {"error": repr(exc)[:200]}
    counts: dict[str, int] = {}
    for event in events:
        who = event.get("reportingComponent") or (event.get("source") or {}).get("component") or "?"
        key = f"{who} {event.get('reason')}"
        counts[key] = counts.get(key, 0) + int(event.get("count") or 1)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def operator_counters(operator: Operator) -> dict:
    """Reconciles (by action) and errors (by kind) from the operator's /metrics."""
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, dict[str, float]] = {"reconciles": {}, "errors": {}}
    for line in text.splitlines():
        for name, key in (("rlkube_operator_reconciles_total{", "reconciles"), ("rlkube_operator_reconcile_errors_total{", "errors")):
            if line.startswith(name):
                label = line[len(name):].split('"')[1]
                out[key][label] = float(line.rsplit(" ", 1)[1])
        if line.startswith("rlkube_operator_reconcile_seconds_sum"):
            out["errors"]["_seconds_sum"] = float(line.rsplit(" ", 1)[1])
    seconds = out["errors"].pop("_seconds_sum", 0.0)
    count = sum(out["reconciles"].values())
    return {"operator_reconciles": out["reconciles"], "operator_error_counts": out["errors"],
            "reconcile_mean_s": round(seconds / count, 3) if count else None}


def job_template(env: Env) -> dict:
    """The pod rlkube renders for pod 0 of a job, as a Job pod template."""
    spec = parse_spec(SPEC)
    placement = Placement(pods=(PodPlan(0, env.nodes[0], (0,), ("actor", "reference")),),
                          device_map=spec.device_map(), domains={}, fallback=False, messages=())
    pod = render.render_pod(JobRef("tmpl", env.namespace, "0"), spec, placement, placement.pods[0], 0)
    pod_spec = pod["spec"]
    for key in ("hostname", "subdomain"):
        pod_spec.pop(key, None)
    return {"metadata": {"labels": {"app.kubernetes.io/name": "rlkube-bench"}}, "spec": pod_spec}


def run_rlkube(env: Env, log_dir: Path, jobs: int, rate: float | None = None, extra: list[str] = ()) -> dict:
    # The operator's default settings; --host-path-shared: fake nodes keep no checkpoints.
    environ = {"PYTHONPATH": OPERATOR_PYTHONPATH} if OPERATOR_PYTHONPATH else None
    operator = Operator(env, log_dir, fast=False, extra=["--host-path-shared", *extra], environ=environ)
    operator.start()
    try:
        operator.wait_ready(90)
        if rate:
            out = steady(env, "rlkube", jobs, rate, operator)
            out["operator_errors"] = operator.logs().count("reconcile failed")
            out.update(operator_counters(operator))
            warnings = env.api.request("GET", f"/api/v1/namespaces/{env.namespace}/events",
                                       query={"fieldSelector": "type=Warning"}).get("items") or []
            out["warning_events"] = len(warnings)
            for event in warnings[:3]:  # say why, when a job had to wait
                print(f"Warning {event['reason']} on {event['involvedObject']['name']}: {event['message']}", file=sys.stderr)
            return out
        path = f"/apis/rlkube.io/v1alpha1/namespaces/{env.namespace}/rltrainingjobs"
        bodies = [(path, env.job_body(f"job{i}", SPEC)) for i in range(jobs)]
        t0 = time.monotonic()
        submit = create_all(env, bodies)
        created = wait_count(env, jobs * 8, 600, t0)
        deadline = time.monotonic() + 600
        while gated_count(env) and time.monotonic() < deadline:
            time.sleep(0.2)
        admitted = time.monotonic() - t0
        errors = operator.logs().count("reconcile failed")
        return {"submit_s": round(submit, 2), "created_s": round(created, 2), "admitted_s": round(admitted, 2),
                "operator_errors": errors}
    finally:
        operator.stop()


def job_bodies(env: Env, jobs: int) -> list[tuple[str, dict]]:
    template = job_template(env)
    path = f"/apis/batch/v1/namespaces/{env.namespace}/jobs"
    return [(path, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"job{i}"},
                    "spec": {"completionMode": "Indexed", "completions": 8, "parallelism": 8,
                             "backoffLimit": 3, "template": json.loads(json.dumps(template))}})
            for i in range(jobs)]


def run_ceiling(env: Env, jobs: int, threads: int = 32) -> dict:
    """The API server's own ceiling for the operator's pod requests: every pod of every job created
    gated and then ungated straight from this process, `threads` at a time, as fast as the API
    server answers (no operator, no planning, no arrivals)."""
    template = job_template(env)
    names = [f"ceil{j}-{i}" for j in range(jobs) for i in range(8)]
    api = KubeAPI.from_environment(env.kubeconfig, pool_size=threads)  # kept-alive connections, as the operator's
    path = f"/api/v1/namespaces/{env.namespace}/pods"

    def create(name: str) -> None:
        api.request("POST", path, body={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **template["metadata"]},
                                        "spec": json.loads(json.dumps(template["spec"]))})

    def ungate(name: str) -> None:
        api.request("PATCH", f"{path}/{name}", body=[{"op": "remove", "path": "/spec/schedulingGates/0"}],
                    content_type="application/json-patch+json")

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, names))
        created = time.monotonic() - t0
        list(pool.map(ungate, names))
    both = time.monotonic() - t0
    return {"created_s": round(created, 2), "create_pods_per_s": round(len(names) / created, 1),
            "create_and_ungate_s": round(both, 2), "pods_per_s": round(len(names) / both, 1), "threads": threads}


def run_jobs(env: Env, jobs: int, rate: float | None = None) -> dict:
    if rate:
        return steady(env, "indexed-job", jobs, rate, None)
    bodies = job_bodies(env, jobs)
    t0 = time.monotonic()
    submit = create_all(env, bodies)
    created = wait_count(env, jobs * 8, 600, t0)
    return {"submit_s": round(submit, 2), "created_s": round(created, 2)}


def wait_untainted(env: Env, timeout: float) -> None:
    """Until the node lifecycle controller has lifted the not-ready taint it puts on every new node
    (it lags under load): a plan before that rightly finds those nodes unusable (Unschedulable)."""
    lifted = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

    def untainted() -> bool:
        nodes = env.api.request("GET", "/api/v1/nodes").get("items") or []
        return not any(t.get("key") in lifted for n in nodes for t in (n.get("spec") or {}).get("taints") or [])

    wait_until("the new nodes' not-ready taints lifted", untainted, timeout, interval=1.0)


def fresh_namespace(base: Env, tag: str) -> Env:
    env = Env(base.kubeconfig, base.kubectl, prefix=f"bench-{tag}")
    env.pool, env.nodes = base.pool, base.nodes  # same fake nodes for every arm
    env.create_namespace()
    return env


def drop_namespace(env: Env, arm: str) -> None:
    """Remove an arm's objects and wait until its pods are gone (so the next arm starts on an idle
    API server); the namespace itself is deleted without waiting."""
    ns = env.namespace
    owners = {"rlkube": (f"/apis/rlkube.io/v1alpha1/namespaces/{ns}/rltrainingjobs", None),
              "indexed-job": (f"/apis/batch/v1/namespaces/{ns}/jobs",
                              {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})}
    deletes = [owners[arm]] if arm in owners else []
    deletes.append((f"/api/v1/namespaces/{ns}/pods", {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}))
    for path, body in deletes:
        try:
            env.api.request("DELETE", path, body=body, timeout=600)
        except Exception as exc:  # a delete of thousands of objects can outlast the API server's request timeout
            print(f"deleting {path}: {exc}; waiting for the pods to go", file=sys.stderr)
    try:
        wait_until(f"the pods of {ns} gone", lambda: pod_count(env) == 0, 600, interval=1.0)
    except AssertionError as exc:  # 8,000 pods on kwok nodes took longer (12:51 and 15:41 runs): go on
        print(f"{exc}; the next arm starts with {pod_count(env)} of them left", file=sys.stderr)
    env.api.request("DELETE", f"/api/v1/namespaces/{ns}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--rate", type=float, default=None,
                        help="jobs per second arriving steadily (default: all at once)")
    parser.add_argument("--kwok", action="store_true", help="kwok nodes instead of heartbeat-only Node objects")
    parser.add_argument("--arms", default="rlkube,indexed-job",
                        help="which arms to run (comma-separated; default both, side by side); 'ceiling': the "
                             "same gated pods created and ungated by the bench itself, 32 requests at a time")
    parser.add_argument("--operator-arg", action="append", default=[],
                        help="an extra flag for the operator (repeatable), e.g. --operator-arg=--inventory=list")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write py-spy's folded stacks of the operator (scale mode) to this file")
    parser.add_argument("--operator-pythonpath", default="",
                        help="PYTHONPATH for the operator process, e.g. an earlier commit's operator and runtime "
                             "folders (git archive), to measure it side by side")
    args = parser.parse_args(argv)
    global PROFILE, OPERATOR_PYTHONPATH
    PROFILE, OPERATOR_PYTHONPATH = args.profile, args.operator_pythonpath
    # A SIGTERM (a timeout) still runs the clean-up below: the private control plane is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.kwok:
        SPEC["tolerations"] = [{"key": kwok.ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}]

    layout = private_layout()
    stop_private(layout)
    layout.state.mkdir(parents=True)
    controlplane.start(layout)
    base = Env(str(layout.kubeconfig), None, prefix="bench")
    base.install_crd()
    if args.kwok:
        labels = {"nvidia.com/gpu.clique": "", POOL_LABEL: base.pool}  # env.job_body selects the pool
        fake = [kwok.FakeNode(f"n{i:04d}", {**labels, "nvidia.com/gpu.clique": f"c{i // 8}"})
                for i in range(args.jobs)]
        kwok.add_nodes(layout, fake, timeout=600)
        base.nodes = [n.name for n in fake]
        wait_untainted(base, 600)
        heart = None
    else:
        for i in range(args.jobs):
            base.add_node(f"n{i:03d}", gpus=8, labels={"nvidia.com/gpu.clique": f"c{i // 8}"})
        heart = Kubelet(base, pods=False).start()  # heartbeat only: the nodes stay Ready, no pod is touched
    log_dir = Path("/tmp/rlkube-bench-operator")
    results: dict[str, list[dict]] = {"rlkube": [], "indexed-job": [], "ceiling": []}
    try:
        # The arms run in the order given, reversed every other round; the last arm's objects go with
        # the private control plane (nothing to delete and wait for).
        order = [arm for arm in args.arms.split(",") if arm in results]
        runs = [(r, arm) for r in range(args.rounds) for arm in (order if r % 2 == 0 else order[::-1])]
        for r, arm in runs:
            env = fresh_namespace(base, arm.split("-")[0])
            try:
                out = (run_rlkube(env, log_dir / f"{arm}-{r}", args.jobs, args.rate, args.operator_arg)
                       if arm == "rlkube" else run_ceiling(env, args.jobs) if arm == "ceiling"
                       else run_jobs(env, args.jobs, args.rate))
                out.update(case=f"apply-{args.jobs}x8", arm=arm, round=r, jobs=args.jobs, pods=args.jobs * 8)
                print(json.dumps(out), flush=True)
                results[arm].append(out)
            finally:
                if (r, arm) != runs[-1]:
                    drop_namespace(env, arm)
    finally:
        if heart:
            heart.stop()
            for name in list(base.nodes):
                base.delete_node(name)
        stop_private(layout)
    if args.rate or not (results["rlkube"] and results["indexed-job"]):
        print(json.dumps({"case": "summary", **{arm: rows[0] for arm, rows in results.items() if rows}}))
        return 0

    ours = statistics.median(r["created_s"] for r in results["rlkube"])
    peer = statistics.median(r["created_s"] for r in results["indexed-job"])
    admitted = statistics.median(r["admitted_s"] for r in results["rlkube"])
    setup = (f"{args.jobs} jobs x 8 pods (1 GPU each) on {args.jobs} fake nodes x 8 GPUs; {args.rounds} rounds, "
             f"median; Python {platform.python_version()}; shared 2-core machine")
    print(json.dumps({"case": "summary", "rlkube_created_s": ours, "indexed_job_created_s": peer,
                      "ratio_peer_over_ours": round(peer / ours, 2), "rlkube_admitted_s": admitted, "setup": setup}))
    rows = [("apply -> all 800 pods created (s)", ours, peer), ("apply -> all gates removed (s)", admitted, None)]
    if args.markdown:
        print("\n| case | rlkube | Indexed Job | ratio (Job / rlkube) |\n|---|---|---|---|")
        for case, a, b in rows:
            print(f"| {case} | {a:.2f} | {'-' if b is None else f'{b:.2f}'} | {'-' if b is None else f'{b / a:.2f}'} |")
        print(f"\nSetup: {setup}.")
    else:
        print(f"\n{'case':40} {'rlkube':>8} {'Job':>8} {'ratio':>6}")
        for case, a, b in rows:
            print(f"{case:40} {a:8.2f} {'-' if b is None else f'{b:8.2f}'} {'-' if b is None else f'{b / a:6.2f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
