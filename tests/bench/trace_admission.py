"""Where a job's apply -> admitted time goes, in a bench_operator.py scale run (issue 20).

Run it next to the bench, for the bench's whole run:
    .venv/bin/python tests/bench/trace_admission.py record /tmp/trace.jsonl &   # before the bench
    .venv/bin/python tests/bench/trace_admission.py report /tmp/trace.jsonl     # afterwards

`record` watches the bench's private control plane (RLTrainingJobs and pods, every namespace) and
writes one JSON line per change that matters, on one monotonic clock: a job added, a job's
status.phase changed (the operator's first status write of a job is its admission decision
landing), a pod created, ungated, bound. Every 10 s it also writes the machine's busy CPU split
into the bench's processes (control plane, operator, bench, this tracer) and everything else, so
a run disturbed by other work on the machine says so, and when.

`report` splits each admitted job's time from its job watch event (just after the create
returned) into: -> the operator's status write (event delivery, the work queue, planning and the
write's round trip), -> its first and last pod created (the creates' round trip), -> its last gate
removed (the gate removals' round trip); p50/p99 of each, the slowest 1%'s mean split, and the
p99 per minute of arrivals next to the other processes' CPU in that minute.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.cluster import controlplane  # noqa: E402
from tests.cluster.layout import Layout  # noqa: E402

STATE = Path("/tmp/rlkube-bench-operator-cp")  # bench_operator.py's private control plane (index 3)
BENCH_COMMANDS = ("kube-apiserver", "kube-controller", "kube-scheduler", "etcd", "kwok")
BENCH_ARGS = ("rlkube.operator", "bench_operator", "trace_admission")


def _client():
    while True:  # the bench starts (and may first build) its control plane after this starts
        try:
            client = controlplane.admin_client(Layout(state=STATE, index=3), timeout=60)
            client.get("/api/v1/namespaces?limit=1")
            return client
        except Exception:
            time.sleep(2)


def _follow(client, path: str, handle, write) -> None:
    version = None
    while True:
        try:
            if version is None:
                version = client.get(path + "?limit=1")["metadata"]["resourceVersion"]
            url = f"{client.server}{path}?watch=1&allowWatchBookmarks=true&timeoutSeconds=60&resourceVersion={version}"
            with urllib.request.urlopen(url, context=client._ctx, timeout=90) as stream:
                for line in stream:
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # 410 Gone: start again from now
                        version = None
                        break
                    version = event["object"]["metadata"].get("resourceVersion", version)
                    if event["type"] != "BOOKMARK":
                        handle(event["type"], event["object"], time.monotonic())
        except Exception as exc:  # the CRD not installed yet, a cut stream: resume
            write({"error": repr(exc)[:200], "t": time.monotonic()})
            time.sleep(1)


def _cpu_ticks() -> tuple[int, int]:
    """(the machine's busy ticks, the bench's processes' ticks) from /proc."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ours = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            args = Path(f"/proc/{pid}/cmdline").read_text()
            if comm.startswith(BENCH_COMMANDS) or any(a in args for a in BENCH_ARGS):
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ours += int(stat[11]) + int(stat[12])
        except OSError:
            continue
    return sum(fields) - fields[3] - fields[4], ours


def record(out_path: str) -> None:
    lock, out = threading.Lock(), open(out_path, "a", buffering=1)

    def write(rec: dict) -> None:
        with lock:
            out.write(json.dumps(rec) + "\n")

    phases: dict[tuple[str, str], object] = {}
    pods: dict[tuple[str, str], tuple[bool, bool]] = {}

    def on_job(kind: str, obj: dict, t: float) -> None:
        meta, phase = obj["metadata"], (obj.get("status") or {}).get("phase")
        key = (meta["namespace"], meta["name"])
        if key not in phases or phases[key] != phase:
            phases[key] = phase
            write({"k": "job", "ev": kind, "ns": key[0], "name": key[1], "phase": phase, "t": t})

    def on_pod(kind: str, obj: dict, t: float) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        labels = meta.get("labels") or {}
        job = labels.get("rlkube.io/job") or labels.get("job-name")
        state = (bool(spec.get("schedulingGates")), bool(spec.get("nodeName")))
        key = (meta["namespace"], meta["name"])
        if job and kind != "DELETED" and pods.get(key) != state:
            pods[key] = state
            write({"k": "pod", "ns": key[0], "name": key[1], "job": job, "gated": state[0], "bound": state[1], "t": t})

    client = _client()
    for path, handle in (("/apis/rlkube.io/v1alpha1/rltrainingjobs", on_job), ("/api/v1/pods", on_pod)):
        threading.Thread(target=_follow, args=(client, path, handle, write), daemon=True).start()
    ticks = os.sysconf("SC_CLK_TCK")
    busy, ours, at = *_cpu_ticks(), time.monotonic()
    while True:
        time.sleep(10)
        busy2, ours2, at2 = *_cpu_ticks(), time.monotonic()
        span = (at2 - at) * ticks
        bench = max(0, ours2 - ours) / span  # a bench process that exited in the window reads as 0
        write({"k": "cpu", "t": at2, "busy": round((busy2 - busy) / span, 2), "bench": round(bench, 2),
               "others": round(max(0.0, (busy2 - busy) / span - bench), 2), "load1": os.getloadavg()[0]})
        busy, ours, at = busy2, ours2, at2


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def report(path: str, namespace_part: str = "bench-rlkube") -> None:
    records = sorted((json.loads(line) for line in open(path)), key=lambda r: r["t"])
    added: dict[str, float] = {}
    written: dict[str, float] = {}
    firsts: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seen: set[tuple[str, str]] = set()
    cpu = [r for r in records if r.get("k") == "cpu"]
    for r in records:
        if r.get("k") not in ("job", "pod") or namespace_part not in r["ns"]:
            continue
        if r["k"] == "job":
            added.setdefault(r["name"], r["t"])
            if r["phase"]:
                written.setdefault(r["name"], r["t"])
            continue
        for what, now in (("created", True), ("ungated", not r["gated"]), ("bound", r["bound"])):
            if now and (what, r["name"]) not in seen:
                seen.add((what, r["name"]))
                firsts[r["job"]][what].append(r["t"])
    rows = []
    for job, t0 in added.items():
        pods = firsts[job]
        if len(pods["created"]) < 8 or len(pods["ungated"]) < 8 or job not in written:
            continue
        rows.append({"t0": t0, "status written": written[job] - t0, "first pod": min(pods["created"]) - t0,
                     "last pod": max(pods["created"]) - t0, "admitted": max(pods["ungated"]) - t0})
    print(f"{len(rows)} of {len(added)} jobs admitted; seconds from the job's watch event")
    for key in ("status written", "first pod", "last pod", "admitted"):
        values = [r[key] for r in rows]
        print(f"  -> {key:15} p50 {_pct(values, 50):6.2f}  p99 {_pct(values, 99):6.2f}  max {max(values):6.2f}")
    slow = sorted(rows, key=lambda r: -r["admitted"])[:max(1, len(rows) // 100)]
    print("  slowest 1%, mean:", {k: round(sum(r[k] for r in slow) / len(slow), 2)
                                  for k in ("status written", "first pod", "last pod", "admitted")})
    start = min(r["t0"] for r in rows)
    minutes: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        minutes[int((r["t0"] - start) // 60)].append(r)
    for m, group in sorted(minutes.items()):
        window = [c for c in cpu if start + 60 * m <= c["t"] < start + 60 * (m + 1)]
        others = sum(c["others"] for c in window) / len(window) if window else float("nan")
        busy = sum(c["busy"] for c in window) / len(window) if window else float("nan")
        admitted = [r["admitted"] for r in group]
        print(f"  arrivals {60 * m:4d}-{60 * m + 60:4d} s: {len(group):4d} jobs, admitted p50 {_pct(admitted, 50):6.2f}"
              f" p99 {_pct(admitted, 99):6.2f}; machine busy {busy:.2f} cores, other work {others:.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("record", "report"):
        sys.exit(__doc__)
    record(sys.argv[2]) if sys.argv[1] == "record" else report(*sys.argv[2:])
