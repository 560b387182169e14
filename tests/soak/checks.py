"""The chaos soak's end: waiting for the jobs, the checks over what was seen, the deletion of every
job with the orphan checks after it, and the printed summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.e2e import deploy

HOST_ROOT = Path("/var/lib/rlkube")  # render.HOST_CHECKPOINT_ROOT, as this machine sees it
CHECKPOINT_META = "rlkube-checkpoint.json"
FENCE = "rlkube-fence.json"


def wait_all_ended(cluster, namespace: str, jobs: list[dict], timeout: float) -> dict[str, dict]:
    """Every job's object once all have ended (Succeeded or Failed), bounded by `timeout`."""
    names = [j["metadata"]["name"] for j in jobs]
    last: dict[str, dict] = {}

    def ended() -> bool:
        for name in names:
            try:
                last[name] = deploy.get_job(cluster, namespace, name)
            except RuntimeError:  # the API server may still be settling after a restart
                return False
        return all(deploy.phase(j) in deploy.TERMINAL for j in last.values())

    try:
        deploy.wait_until("every soak job to end", ended, timeout, interval=5,
                          describe=lambda: ", ".join(f"{n}={deploy.phase(j)}@{deploy.step(j)}" for n, j in last.items()))
    except deploy.JobTimeout as err:
        deploy.log(str(err))
    return last


def run_all(cluster, namespace: str, jobs: list[dict], final: dict[str, dict], watch, sampler,
            restarts: list[dict], landing: dict) -> dict[str, dict]:
    """Every check before deletion: name -> {"ok": bool, ...what it found}."""
    results: dict[str, dict] = {}
    wanted = {j["metadata"]["name"]: j["spec"]["training"]["steps"] for j in jobs}
    outcome = {n: {"phase": deploy.phase(final.get(n, {})), "step": deploy.step(final.get(n, {})),
                   "attempt": (final.get(n, {}).get("status") or {}).get("attempt"),
                   "restarts": (final.get(n, {}).get("status") or {}).get("restarts")} for n in wanted}
    results["all_succeeded"] = {"ok": all(o["phase"] == "Succeeded" and o["step"] == wanted[n] for n, o in outcome.items()),
                                "jobs": outcome}
    results["no_duplicate_pods_in_api"] = {"ok": not watch.census.violations, "most_live_per_index": watch.census.most,
                                           "violations": watch.census.violations[:10]}
    allowed = _distinct(sampler.stale_seen)
    results["no_duplicate_trainer_processes"] = {"ok": not sampler.violations and sampler.most_processes > 0,
                                                 "samples": sampler.samples, "most_processes": sampler.most_processes, "violations": sampler.violations[:10],
                                                 "stale_allowed": allowed}
    results["steps_lost_within_interval"] = {"ok": all(r["ok"] for r in restarts), "restarts": len(restarts),
                                             "worst": max((r["steps_lost"] for r in restarts), default=0),
                                             "bad": [r for r in restarts if not r["ok"]]}
    unexplained = [r for r in restarts if r["fault"] in (None, "kill-operator", "restart-apiserver")]
    results["restarts_only_from_faults_that_kill_trainers"] = {"ok": not unexplained, "rows": unexplained}
    results["newest_checkpoint_is_the_final_attempts"] = _fenced(namespace, final)
    # A soak whose faults struck an idle cluster proves nothing (verdict.landing).
    results["every_fault_struck_training_jobs"] = landing
    return results


def _distinct(seen: list[dict]) -> list[dict]:
    spans: dict[tuple, dict] = {}
    for s in seen:
        key = (s["pod"], tuple(s["uids"]))
        span = spans.setdefault(key, {"pod": s["pod"], "uids": s["uids"], "from": s["time"], "to": s["time"]})
        span["to"] = s["time"]
    return list(spans.values())


FENCE_RACE_S = 2.0  # a commit that passed the fence check an instant before the fence rose may land


def _fenced(namespace: str, final: dict[str, dict]) -> dict:
    """Fencing, on disk: the fence file carries the final attempt (each attempt raised it), the
    newest committed checkpoint by (attempt, step), the runtime's order, is at the last step, and
    no older attempt committed after the fence rose (beyond FENCE_RACE_S: the documented race)."""
    rows, ok = {}, True
    for name, job in final.items():
        if not job or deploy.phase(job) != "Succeeded":
            continue
        folder = HOST_ROOT / namespace / f"{name}-{job['metadata']['uid']}"
        metas = []
        for path in folder.glob(f"step-*/{CHECKPOINT_META}"):
            try:
                metas.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        try:
            fence = json.loads((folder / FENCE).read_text())
        except (OSError, ValueError):
            fence = {}
        if not metas:
            rows[name], ok = "no committed checkpoint", False
            continue
        newest = max(metas, key=lambda m: (m.get("attempt", -1), m["step"]))
        late = [m for m in metas if m.get("attempt", -1) < fence.get("attempt", -1)
                and m.get("time", 0) > fence.get("time", 0) + FENCE_RACE_S]
        good = (fence.get("attempt") == job["status"].get("attempt")
                and newest["step"] == job["spec"]["training"]["steps"] and not late)
        rows[name] = {"fence": fence.get("attempt"), "newest_attempt": newest.get("attempt"),
                      "newest_step": newest["step"], "committed_after_fence": late, "ok": good}
        ok = ok and good
    return {"ok": ok, "jobs": rows}


def delete_leftovers(cluster, namespace: str) -> None:
    """Jobs an aborted earlier soak left behind, deleted (with the orphan checks of delete_job)."""
    out = cluster.kubectl("get", "rltj", "-n", namespace, "-o", "json")
    for job in json.loads(out)["items"]:
        deploy.log(f"soak: deleting {job['metadata']['name']}, left by an earlier run")
        deploy.delete_job(cluster, namespace, job["metadata"]["name"])


def delete_all(cluster, namespace: str, jobs: list[dict], report: dict) -> None:
    """Delete every job, then check that nothing of them is left (report["checks"]["no_orphans"])."""
    errors, uids = [], {}
    for job in jobs:
        name = job["metadata"]["name"]
        found = cluster.kubectl("get", "rltj", name, "-n", namespace, "-o", "json", "--ignore-not-found")
        if found.strip():
            uids[name] = json.loads(found)["metadata"]["uid"]
        t0 = time.monotonic()
        try:
            deploy.delete_job(cluster, namespace, name)  # waits for its folder and cleanup pods to go
        except AssertionError as err:
            errors.append(str(err))
        deploy.log(f"soak: {name} deleted and cleaned in {time.monotonic() - t0:.0f} s")
    left = {}
    for kind in ("pods", "configmaps", "services", "rltj"):
        items = json.loads(cluster.kubectl("get", kind, "-n", namespace, "-o", "json"))["items"]
        names = [i["metadata"]["name"] for i in items if i["metadata"]["name"] != "kube-root-ca.crt"]
        if names:
            left[kind] = names
    folders = [str(p) for p in (HOST_ROOT / namespace).glob("*") if any(p.name.startswith(f"{n}-") for n in uids)]
    report["checks"]["no_orphans"] = {"ok": not errors and not left and not folders, "objects_left": left,
                                      "folders_left": folders, "errors": errors[:5]}


def text_summary(report: dict) -> str:
    lines = [f"chaos soak, seed {report['seed']}: {len(report['jobs'])} jobs, {len(report.get('faults', []))} faults"
             f" in {report['duration']:.0f} s, checkpoint every {report['every']} steps"]
    for f in report.get("faults", []):
        lines.append(f"  {time.strftime('%H:%M:%S', time.gmtime(f['start']))} {f['kind']:18} {f['target']} {f['detail']}"
                     f"; training: {', '.join(f.get('training') or ()) or 'nothing'}")
    lines.append("by kind: faults, job restarts, steps lost (each restart), job recovery s, component recovery s")
    for kind, row in sorted(report.get("figures", {}).items()):
        lines.append(f"  {kind:18} {row['faults']:3} {row['restarts']:3}  lost {row['steps_lost']}  "
                     f"jobs {row['job_recovery_s']}  component {row.get('component_recovery_s', [])}")
    for name, check in report.get("checks", {}).items():
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'} {name}")
    if "error" in report:
        lines.append(f"  FAIL {report['error']}")
    lines.append("PASSED" if report.get("passed") else "FAILED")
    return "\n".join(lines)

