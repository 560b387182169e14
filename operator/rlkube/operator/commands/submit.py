"""`rlkube submit FILE [--follow]`: check a manifest, create its RLTrainingJob, and follow it.

The manifest is checked first with exactly what `rlkube validate` applies (manifest.py): a bad
one is refused with its field named and nothing is sent (exit 3). The file must hold one
RLTrainingJob (other documents, a PVC say, are left to kubectl). It is created with the user's
credentials (kube.py); a job of that name that already exists is not touched.

With `--follow` the job is read every few seconds until it ends or `--timeout` passes: phase
changes, one progress line per step (step/total, ETA, tokens/s, loss from status.progress) and
rank 0's pod log, each attempt's (follow.py decides what is printed and the exit code). Ctrl-C
and the timeout stop following only: the job keeps running, and the lines printed say how to
look again or stop it.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from rlkube.operator.commands import manifest
from rlkube.operator.commands.follow import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_SUCCEEDED,
    EXIT_TIMEOUT,
    Follower,
)
from rlkube.operator.commands.pod_logs import LogStream, log_started, rank0_selector

DEFAULT_TIMEOUT = "24h"
POLL_SECONDS = 2.0
LOG_DRAIN_SECONDS = 15.0  # after the job ends, how long the rest of rank 0's log may take to arrive
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")


def parse_duration(text: str) -> float:
    """'90' or '90s', '30m', '2h', '1d' -> seconds; ValueError otherwise (argparse's type)."""
    found = _DURATION.match(text.strip())
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 900, 30m, 2h)")
    return float(found.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]


@dataclass
class Printer:
    """Lines of the job (prefixed with its name) and of rank 0's log (with the pod's), one at a
    time from both threads."""

    out: TextIO
    job: str

    def __post_init__(self) -> None:
        import threading

        self._lock = threading.Lock()

    def job_line(self, line: str) -> None:
        self._write(f"[{self.job}] {line}")

    def log_line(self, pod: str, line: str) -> None:
        self._write(f"{pod} | {line}")

    def _write(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()


def job_document(name: str, text: str, err: TextIO) -> dict | None:
    """The one RLTrainingJob of the manifest text when it is valid; else None, its problems
    printed as `rlkube validate` prints them."""
    failed = False
    for label, problems, _summary in manifest.check_text(name, text):
        for problem in problems:
            failed = True
            print(f"{label}: {problem}", file=err)
    if failed:
        return None
    jobs = [doc for doc in manifest.load_documents(text) if doc is not None and manifest.is_ours(doc)]
    if len(jobs) != 1:
        print(f"{name}: holds {len(jobs)} RLTrainingJobs; rlkube submit takes one (kubectl apply -f takes many)",
              file=err)
        return None
    return jobs[0]


def target_namespace(doc: dict, flag: str | None, default: str) -> str:
    """--namespace, else the manifest's, else the context's; ValueError when the flag and the
    manifest disagree (kubectl refuses that too)."""
    written = (doc.get("metadata") or {}).get("namespace")
    if flag and written and flag != written:
        raise ValueError(f"the manifest's namespace {written!r} does not match --namespace {flag!r}")
    return flag or written or default


def run(file: str, follow: bool, namespace: str | None, kubeconfig: str | None, timeout: float, logs: bool,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr, connect: Callable[[str | None], Any] | None = None) -> int:
    """The `submit` verb; the exit code. `connect(kubeconfig)` makes the API client (kube.Kube)."""
    try:
        text = manifest.read_text(file)
    except OSError as exc:
        print(f"{file}: cannot read: {exc.strerror or exc}", file=err)
        return EXIT_INVALID
    doc = job_document(file, text, err)
    if doc is None:
        print("nothing was submitted", file=err)
        return EXIT_INVALID
    from rlkube.operator.commands.kube import Kube, KubeError

    try:
        kube = (connect or Kube)(kubeconfig)
        ns = target_namespace(doc, namespace, kube.default_namespace)
        name = doc["metadata"]["name"]
        kube.create_job(ns, {**doc, "metadata": {**doc["metadata"], "namespace": ns}})
    except ValueError as exc:
        print(f"{file}: {exc}; nothing was submitted", file=err)
        return EXIT_INVALID
    except KubeError as exc:
        hint = ""
        if exc.status == 409:
            hint = (f"\n  a job of that name exists: `rlkube logs {name} -n {ns}` to read it, `kubectl delete "
                    f"rltj {name} -n {ns}` to run it again, or change metadata.name")
        print(f"rlkube submit: {exc}{hint}", file=err)
        return EXIT_FAILED
    print(f"rltrainingjob.rlkube.io/{name} created in namespace {ns}", file=out, flush=True)
    if not follow:
        return EXIT_SUCCEEDED
    return follow_job(kube, ns, name, timeout, logs, Printer(out, name), err)


def follow_job(kube: Any, ns: str, name: str, timeout: float, logs: bool, printer: Printer, err: TextIO,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """Read the job until it ends (its exit code), `timeout` passes (124) or Ctrl-C (130)."""
    from rlkube.operator.commands.kube import KubeError

    follower, stream, deadline = Follower(name), None, clock() + timeout
    again = (f"the job keeps running: `rlkube logs {name} -n {ns} --follow` to read its log, "
             f"`kubectl get rltj {name} -n {ns}` for its state, `kubectl delete rltj {name} -n {ns}` to stop it")
    try:
        while True:
            lines, code = follower.observe(kube.get_job(ns, name))
            if code is None:
                for line in lines:
                    printer.job_line(line)
            if logs:
                try:
                    stream = _rank0_log(kube, ns, stream, printer)
                except KubeError as exc:  # pods may be forbidden to the user: the job is still followed
                    printer.job_line(f"rank 0's log: {exc}; following without it")
                    logs = False
            if code is not None:
                if stream is not None:
                    stream.join(LOG_DRAIN_SECONDS)  # rank 0's last words before the verdict
                    _log_error(stream, printer)
                for line in lines:
                    printer.job_line(line)
                return code
            if clock() >= deadline:
                printer.job_line(f"stopped following after --timeout {timeout:.0f}s; {again}")
                return EXIT_TIMEOUT
            sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        printer.job_line(f"stopped following (Ctrl-C); nothing was deleted, {again}")
        return EXIT_INTERRUPTED
    except KubeError as exc:
        print(f"rlkube submit: {exc}; {again}", file=err)
        return EXIT_FAILED


def _rank0_log(kube: Any, ns: str, stream: LogStream | None, printer: Printer) -> LogStream | None:
    """The stream of rank 0's log: a new one when its pod is new (a restart attempt) and its
    trainer has started, else `stream` as it is."""
    if stream is not None and stream.done():
        _log_error(stream, printer)
    job = printer.job
    pods = [p for p in kube.list_pods(ns, rank0_selector(job)) if log_started(p)]
    if not pods:
        return stream
    pod = pods[0]
    uid, pod_name = pod["metadata"].get("uid", ""), pod["metadata"]["name"]
    if stream is not None and stream.uid == uid:
        return stream
    if stream is not None:
        stream.join(LOG_DRAIN_SECONDS)  # the previous attempt's last lines first
    return LogStream(lambda: kube.pod_log(ns, pod_name, follow=True),
                     lambda line: printer.log_line(pod_name, line), uid)


def _log_error(stream: LogStream, printer: Printer) -> None:
    """Say once why rank 0's log stopped early (the job is still followed)."""
    if stream.error and not stream.error_shown:
        stream.error_shown = True
        printer.job_line(f"rank 0's log stopped: {stream.error}")
