"""What the chaos soak watches while it runs, on two threads, each bounded by a stop flag.

- `PodWatch`: a watch on the soak namespace's trainer pods through the API server (re-listed
  after every broken connection: the API server is one of the things the soak restarts), feeding
  verdict.ApiCensus.
- `HostSampler`: every SAMPLE_S seconds, (1) every trainer process on this machine (the harness's
  nodes share it), mapped to its node and pod UID by its cgroup, checked by
  verdict.process_duplicates; (2) rank 0's container log of every trainer pod, read from its
  node's pod-log folder (no kubelet needed, so a stopped node's trainer is still followed, and
  nothing is lost when the pod goes), fed to verdict.AttemptLog.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.cluster.controlplane import admin_client
from tests.soak import verdict

SAMPLE_S = 2.0
SELECTOR = "rlkube.io/pod-index"


class PodWatch(threading.Thread):
    def __init__(self, layout, namespace: str) -> None:
        super().__init__(daemon=True, name="pod-watch")
        self.layout, self.namespace = layout, namespace
        self.census = verdict.ApiCensus()
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.reconnects = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                version = self._relist()
                self._watch(version)
            except Exception as err:  # noqa: BLE001 - the API server is down on purpose at times
                if len(self.errors) < 50:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {type(err).__name__}: {err}"[:300])
                self.stop_flag.wait(1.0)
            self.reconnects += 1

    def _relist(self) -> str:
        client = admin_client(self.layout, timeout=10)
        listing = client.get(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={SELECTOR}")
        now = time.time()
        with self.lock:
            for pod in listing["items"]:
                self.census.observe("MODIFIED", pod, now)
            self.census.forget_missing({p["metadata"]["uid"] for p in listing["items"]}, now)
        return listing["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> None:
        client = admin_client(self.layout, timeout=30)
        url = (f"{client.server}/api/v1/namespaces/{self.namespace}/pods?watch=1&labelSelector={SELECTOR}"
               f"&resourceVersion={version}&timeoutSeconds=25&allowWatchBookmarks=true")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, context=client._ctx, timeout=35) as stream:
            for raw in stream:
                if self.stop_flag.is_set():
                    return
                event = json.loads(raw)
                if event["type"] == "ERROR":  # 410 Gone: re-list
                    return
                if event["type"] == "BOOKMARK":
                    continue
                with self.lock:
                    self.census.observe(event["type"], event["object"], time.time())

    def names(self) -> dict[str, str]:
        with self.lock:
            return {uid: pod["metadata"]["name"] for uid, pod in self.census.seen.items()}

    def pods(self) -> dict[str, dict]:
        with self.lock:
            return dict(self.census.seen)


class HostSampler(threading.Thread):
    def __init__(self, layout, namespace: str, watch: PodWatch, kubelets) -> None:
        super().__init__(daemon=True, name="host-sampler")
        self.layout, self.namespace, self.watch, self.kubelets = layout, namespace, watch, kubelets
        self.stop_flag = threading.Event()
        self.attempts: dict[str, verdict.AttemptLog] = {}
        self.offsets: dict[Path, int] = {}
        self.violations: list[dict] = []
        self.samples = 0
        self.most_processes = 0  # trainer processes seen in one sample: 0 would mean a blind census
        self.stale_seen: list[dict] = []

    def run(self) -> None:
        while not self.stop_flag.wait(SAMPLE_S):
            self.sample_once()

    def sample_once(self) -> None:
        pods = self.watch.pods()
        self._census(pods)
        self._logs(pods)
        self.samples += 1

    def _census(self, pods: dict[str, dict]) -> None:
        found = trainer_processes()
        self.most_processes = max(self.most_processes, len(found))
        now = time.time()
        with self.watch.lock:
            in_api = set(self.watch.census.present)
        names = self.watch.names()
        stopped, resumed = self.kubelets.partition_state()
        bad = verdict.process_duplicates(found, names, in_api, stopped, resumed, now)
        if bad:
            self.violations.append(bad)
        by_name: dict[str, set[str]] = {}
        for _, uid in found:
            by_name.setdefault(names.get(uid, uid), set()).add(uid)
        for name, uids in by_name.items():
            if len(uids) > 1:
                self.stale_seen.append({"time": now, "pod": name, "uids": sorted(uids)})

    def _logs(self, pods: dict[str, dict]) -> None:
        for uid, pod in pods.items():
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if (meta.get("labels") or {}).get(SELECTOR) != "0" or not node:
                continue
            folder = (self.layout.state / "nodes" / node / "pod-logs"
                      / f"{meta['namespace']}_{meta['name']}_{uid}" / "trainer")
            attempt = self.attempts.setdefault(uid, verdict.AttemptLog(uid, meta["labels"]["rlkube.io/job"], node))
            for path in sorted(folder.glob("*.log")) if folder.exists() else []:
                self._read(path, attempt)

    def _read(self, path: Path, attempt: verdict.AttemptLog) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next sample
        self.offsets[path] = self.offsets.get(path, 0) + end
        for line in data[:end].decode(errors="replace").splitlines():
            parsed = verdict.parse_cri_line(line)
            if parsed:
                attempt.feed(*parsed)


def trainer_processes() -> list[tuple[str, str]]:
    """(node, pod uid) of every trainer process (`python -m rlkube.runtime run ...`) on this host."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            if b"rlkube.runtime\0run\0" not in cmd:
                continue
            where = verdict.pod_of_cgroup((entry / "cgroup").read_text())
        except OSError:
            continue
        if where:
            found.append(where)
    return found
