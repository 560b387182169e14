"""A SIGTERM that arrives while the trainer starts stops it at once, also as PID 1 of its own PID
namespace, as in a pod (runtime/rlkube/runtime/infra/sigterm.py). Without the start-up handler the
kernel drops the signal (PID 1 has no default action) and the trainer trains every step: the chaos
soak saw a deleted pod's trainer do so."""

import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from .conftest import ROOT, records, runtime_env, tiny_config, write_config
from .test_progress_served import free_port


def pid_namespaces_available() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not pid_namespaces_available(), reason="needs unshare --pid (root)")
def test_sigterm_while_starting_exits_143_as_pid_1_without_training(tmp_path):
    port = free_port()
    cfg = tiny_config(tmp_path, progressPort=port, training={"steps": 40})
    # `unshare --fork` makes the trainer PID 1 of a new PID namespace, as in a container.
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, "-m", "rlkube.runtime", "run", str(write_config(tmp_path, cfg))],
        cwd=ROOT, env=runtime_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # /healthz answers from before torch is imported (serve_health_early): start-up has begun.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail(f"no /healthz while starting: {proc.stderr.read()[-2000:] if proc.poll() is not None else ''}")
        (trainer,) = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                         text=True).stdout.split()]
        (nspid,) = [line for line in open(f"/proc/{trainer}/status") if line.startswith("NSpid:")]
        assert nspid.split()[-1] == "1"  # PID 1 in its namespace
        subprocess.run(["kill", "-TERM", str(trainer)], check=True)
        out, err = proc.communicate(timeout=60)  # before the fix: all 40 steps, exit 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM while starting" in err
    assert not [r for r in records(out) if r.get("event") == "step"]
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").glob("step-*"))
