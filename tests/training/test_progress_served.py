"""During a CLI run, rank 0 serves /progress and /metrics as the contract says
(rlkube.runtime.contract; docs/architecture.md, "The contract")."""

import json
import socket
import time
import urllib.request

from .conftest import tiny_config, write_config
from .test_faults import start_cli


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_progress_and_metrics_while_training(tmp_path):
    port = free_port()
    cfg = tiny_config(tmp_path, progressPort=port, training={"steps": 40})
    proc = start_cli(write_config(tmp_path, cfg), RLKUBE_ATTEMPT="2")  # as the operator sets it
    seen = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=2) as r:
                    doc = json.loads(r.read())
                if doc["phase"] == "training" and doc["step"] >= 2:
                    seen = doc
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert seen is not None, "no /progress with step >= 2 while training"
        assert set(seen) == {"phase", "step", "totalSteps", "tokensPerSecond", "mfu", "gpuUtilization",
                             "loss", "rewardMean", "attempt", "gpuBusyPhases", "phaseSeconds", "startupSeconds",
                             "outputs", "evalStep", "evalLoss", "evalAccuracy", "evalMargin", "evalRewardMean",
                             "stepSeconds", "memoryPlan", "summary"}
        assert seen["summary"] is None  # the run's summary comes once it has succeeded
        assert seen["stepSeconds"] > 0  # the latest step's time, which status.progress's ETA uses
        assert seen["outputs"] is None  # no export before the last step (export.everySteps unset)
        assert seen["memoryPlan"] is None  # a CPU has no card to plan for
        assert seen["evalStep"] is None and seen["evalAccuracy"] is None  # no eval set, no evaluation
        assert seen["attempt"] == 2  # the restart attempt the pod runs as, from its env
        assert seen["totalSteps"] == 40 and seen["tokensPerSecond"] > 0 and 0 < seen["loss"] < 1
        assert seen["mfu"] is None  # no peak on a CPU: null, not a made-up number
        # no NVML on a CPU: no busy numbers, but the step's phases and the start-up split are timed
        assert seen["gpuUtilization"] is None and seen["gpuBusyPhases"] == {}
        assert {"data_wait", "forward_backward", "optimizer"} <= set(seen["phaseSeconds"])
        assert set(seen["startupSeconds"]) == {"import", "dataLoad", "dataWait", "modelLoad", "firstStep", "total"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            metrics = r.read().decode()
        assert "rlkube_step " in metrics and "rlkube_tokens_total" in metrics
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            assert r.read() == b"ok"
    finally:
        proc.kill()
        proc.wait(timeout=30)
