"""`make soak`: a chaos soak of rlkube on the local cluster (not part of `make test`).

    python -m tests.soak.soak [--seed 1] [--jobs 6] [--faults 8] [--duration 420] [--out DIR]

1. brings up the harness's cluster (or reuses the one that is up; one it started is stopped at
   the end unless another session uses it), builds and loads the images, installs the chart;
2. applies `--jobs` small CPU-stub jobs in the namespace rlkube-soak, DPO and GRPO in turn, some
   on two pods, checkpointing every EVERY steps to their hostPath;
3. once one of them trains, opens a fault window of `--duration` seconds in which `--faults`
   faults (faults.py: trainer killed, operator killed, kubelet stopped and resumed, API server
   restarted) happen at seeded random times, each while a job trains (a fault that finds none
   applies a job still to come and waits for it), each logged with its time and what trained;
4. waits (bounded) for every job to end, restores the cluster whatever happened (kubelets
   resumed, API server running, nodes and operator Ready), then checks:
   - every job Succeeded at its last step;
   - no duplicate pod, in the API or among the host's processes (the rules: verdict.py);
   - every fault struck a training job (a trainer kill a training pod, a kubelet stop a node
     where one trained), and every planned kind happened;
   - every restart lost at most EVERY steps (rank 0's logs of both attempts), and the newest
     checkpoint on disk is the final attempt's (a stale trainer never committed over it);
   - after each job is deleted: no pod, ConfigMap, Service or cleanup pod of it left, and no
     checkpoint folder of it under /var/lib/rlkube.
5. writes report.json (faults with times, recovery times, steps lost, every check) into --out,
   prints a summary, exits 0 when every check held.

Hold /tmp/rlkube-cluster-tests.lock around it on a shared machine (the cluster is shared).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cluster import fixtures  # noqa: E402
from tests.e2e import deploy  # noqa: E402
from tests.soak import checks, faults, observe, verdict  # noqa: E402

NAMESPACE = "rlkube-soak"
EVERY = 5
FIRST_WAVE = 3  # jobs applied before the window opens; the rest arrive during it


def job_specs(count: int, steps: int, grpo_steps: int, tag: str) -> list[dict]:
    """`count` jobs: DPO and GRPO in turn; every third one on two pods of one GPU each."""
    jobs = []
    for i in range(count):
        algo = "dpo" if i % 2 == 0 else "grpo"
        name = f"soak{i}-{algo}-{tag}"
        gpus = 2 if i % 3 == 0 else 1
        sections = {
            "roles": {"actor": {"gpus": gpus}},  # merged: the example's other roles stay
            "training": {"steps": steps if algo == "dpo" else grpo_steps},
            "checkpoint": {"everySteps": EVERY, "keep": 2},
            "runPolicy": {"backoffLimit": 50},
        }
        jobs.append(deploy.job_manifest(name, NAMESPACE, f"{algo}-tiny-cpu.yaml", **sections))
    return jobs


def arrival_times(count: int, duration: float) -> list[float]:
    """When (seconds into the fault window) the later jobs that are not held back are applied: a
    third of them, evenly over the first 80% of it. The others are held back: a fault that finds
    no job training applies one and waits for it to train (faults.Driver._await_training), so
    every fault strikes a training job however fast this machine trains and however late a
    fault comes behind a long kubelet stop (on an idle machine a 200-step GRPO job trained in
    13 s; at 14:46 and 14:48 an operator kill, an API-server restart and a kubelet stop struck
    an idle cluster). Those no fault needed are applied after the faults."""
    timed = count // 3
    return [0.8 * duration * (i + 1) / (timed + 1) for i in range(timed)]


class Arrivals:
    """The jobs still to be applied: at their times (arrival_times), one whenever a fault finds no
    job training (`apply_next`, called by the driver), the rest after the faults. When a fault
    finds no job training and none is left, `extra` makes one more (`make_job`, which adds it to
    the soak's jobs, so every check covers it): seen at 15:56, when the idle machine trained the
    first three jobs (600/400 steps) in under 90 s and the held-back ones were gone by the third
    fault, which left five faults with nothing to strike."""

    def __init__(self, cluster, jobs: list[dict], make_job: Callable[[], dict] | None = None) -> None:
        self.cluster, self.pending, self.lock = cluster, list(jobs), threading.Lock()
        self.make_job = make_job
        self.extra = 0

    def apply_next(self, why: str, extra: bool = False) -> bool:
        with self.lock:
            job = self.pending.pop(0) if self.pending else None
            if job is None and extra and self.make_job is not None:
                job, self.extra = self.make_job(), self.extra + 1
                why += ", one more than --jobs"
        if job is None:
            return False
        # The API server may be down for a fault right now: retried, bounded.
        deploy.wait_until(f"{job['metadata']['name']} applied", lambda: _applied(self.cluster, job), 120, interval=2)
        deploy.log(f"soak: {job['metadata']['name']} applied ({why})")
        return True

    def run(self, opened: float, times: list[float]) -> None:
        for at in times:
            time.sleep(max(0.0, opened + at - time.monotonic()))
            if not self.apply_next(f"{at:.0f} s into the window"):
                return

    def rest(self) -> None:
        """The jobs no trainer kill needed, applied once the faults are done: every job runs."""
        while self.apply_next("after the faults: not needed by a trainer kill"):
            pass


def _applied(cluster, job: dict) -> bool:
    try:
        deploy.apply(cluster, job)
    except RuntimeError:
        return False
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="seeds the fault times, kinds and targets (default 1)")
    parser.add_argument("--jobs", type=int, default=6, help="how many jobs (default 6)")
    parser.add_argument("--faults", type=int, default=8, help="how many faults (default 8)")
    parser.add_argument("--duration", type=float, default=420, help="the fault window, seconds (default 420)")
    parser.add_argument("--steps", type=int, default=600, help="steps of each DPO job (default 600)")
    parser.add_argument("--grpo-steps", type=int, default=400, help="steps of each GRPO job (default 400)")
    parser.add_argument("--finish-timeout", type=float, default=480,
                        help="seconds the jobs may take after the fault window (default 480)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default /tmp/rlkube-soak/<time>)")
    args = parser.parse_args(argv)
    for flag in ("jobs", "faults", "steps", "grpo_steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.duration <= 0:
        parser.error(f"--duration must be > 0, got {args.duration}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or Path("/tmp/rlkube-soak") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    # SIGTERM (a timeout's kill, Ctrl-C's cousin) unwinds through the finally blocks, so the
    # cluster is restored and a cluster this process started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.contextmanager(fixtures._session_cluster)("full") as cluster:
        try:
            report = soak(cluster, args, out)
        except Exception:
            # Seen (15:28): the chart's install timed out; what the operator said goes with the
            # cluster when the soak started it, so it is kept first.
            (out / "cluster-state.txt").write_text(deploy.dump(cluster, [NAMESPACE]))
            print(f"cluster state: {out / 'cluster-state.txt'}")
            raise
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(checks.text_summary(report))
    print(f"report: {out / 'report.json'}")
    return 0 if report["passed"] else 1


def soak(cluster, args: argparse.Namespace, out: Path) -> dict:
    deploy.build_and_load(cluster, deploy.OPERATOR_IMAGE)
    deploy.build_and_load(cluster, deploy.RUNTIME_IMAGE)
    deploy.install(cluster)
    deploy.ensure_namespace(cluster, NAMESPACE)
    checks.delete_leftovers(cluster, NAMESPACE)

    jobs = job_specs(args.jobs, args.steps, args.grpo_steps, uuid.uuid4().hex[:4])
    plan = faults.schedule(args.seed, args.faults, args.duration)
    report: dict = {"seed": args.seed, "jobs": [j["metadata"]["name"] for j in jobs], "every": EVERY,
                    "duration": args.duration, "plan": [p.__dict__ for p in plan], "started": time.time()}
    driver = faults.Driver(cluster, NAMESPACE, args.seed)
    watch = observe.PodWatch(cluster.layout, NAMESPACE)
    sampler = observe.HostSampler(cluster.layout, NAMESPACE, watch, driver.kubelets)
    watch.start()
    sampler.start()
    final: dict[str, dict] = {}
    try:
        first, later = jobs[:FIRST_WAVE], jobs[FIRST_WAVE:]
        for job in first:
            deploy.apply(cluster, job)
        deploy.log(f"soak: {len(first)} jobs applied, {len(later)} to come; {len(plan)} faults planned "
                   f"within {args.duration:.0f} s")
        deploy.wait_until("a soak job training", lambda: any(a.steps for a in sampler.attempts.values()), 600, 2)
        opened = time.monotonic()
        report["window_opened"] = time.time()
        deploy.log(f"soak: a job trains; the fault window opens ({args.duration:.0f} s)")
        times = arrival_times(len(later), args.duration)
        report["arrivals"] = times
        tag = jobs[0]["metadata"]["name"].rsplit("-", 1)[1]

        def one_more() -> dict:  # appended to `jobs`: waited for, checked and deleted like the others
            jobs.append(job_specs(len(jobs) + 1, args.steps, args.grpo_steps, tag)[-1])
            return jobs[-1]

        pending = Arrivals(cluster, later, one_more)

        def training() -> list[verdict.Training]:
            with watch.lock:
                live = dict(watch.census.live)
            totals = {j["metadata"]["name"]: j["spec"]["training"]["steps"] for j in list(jobs)}
            return verdict.training_pods(list(sampler.attempts.values()), live, totals, time.time())

        driver.training = training
        driver.feed = lambda: pending.apply_next("early: a fault found no job training", extra=True)
        arrivals = threading.Thread(target=pending.run, args=(opened, times), daemon=True)
        arrivals.start()
        driver.run(plan, opened, threading.Event())
        arrivals.join(timeout=120)
        pending.rest()
        report["window_closed"] = time.time()
        final = checks.wait_all_ended(cluster, NAMESPACE, jobs, args.finish_timeout)
    except Exception as err:
        report["error"] = f"{type(err).__name__}: {err}"
        deploy.log(f"soak: {report['error']}")
    finally:
        try:
            report["restored"] = faults.restore(cluster)
        finally:
            sampler.sample_once()
            for thread in (sampler, watch):
                thread.stop_flag.set()
    report["jobs"], report["extra_jobs"] = [j["metadata"]["name"] for j in jobs], len(jobs) - args.jobs
    report["faults"] = [f.__dict__ for f in driver.faults]
    report["skipped_faults"] = driver.skipped
    report["watch"] = {"reconnects": watch.reconnects, "errors": watch.errors[:10],
                       "most_live_per_index": watch.census.most, "samples": sampler.samples}
    restarts = [r for job in jobs for r in verdict.restarts_of(job["metadata"]["name"], list(sampler.attempts.values()),
                                                               driver.faults, EVERY)]
    report["restarts"] = restarts
    report["attempts"] = [{"job": a.job, "uid": a.uid, "node": a.node, "resumed": a.resumed,
                           "first": a.steps[0] if a.steps else None, "last": a.steps[-1] if a.steps else None}
                          for a in sorted(sampler.attempts.values(), key=lambda a: (a.job, a.started))]
    report["figures"] = verdict.summarize(driver.faults, restarts, driver.recoveries)
    report["checks"] = checks.run_all(cluster, NAMESPACE, jobs, final, watch, sampler, restarts,
                                      verdict.landing(driver.faults, driver.skipped, tuple({p.kind for p in plan})))
    report["passed"] = "error" not in report and all(c["ok"] for c in report["checks"].values())
    if not report["passed"]:
        (out / "cluster-state.txt").write_text(deploy.dump(cluster, [NAMESPACE]))
    checks.delete_all(cluster, NAMESPACE, jobs, report)
    report["passed"] = report["passed"] and all(c["ok"] for c in report["checks"].values())
    report["ended"] = time.time()
    return report


if __name__ == "__main__":
    sys.exit(main())
