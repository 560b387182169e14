"""Rank 0's /progress, /metrics and /healthz over real HTTP on loopback."""

import json
import urllib.error
import urllib.request

import pytest

from rlkube.runtime.infra.progress import FIELDS, Progress, ProgressServer, write_termination_message


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.read().decode()


def test_progress_metrics_healthz():
    progress = Progress(total_steps=10)
    server = ProgressServer(progress, 0, host="127.0.0.1")
    try:
        status, body = get(server.port, "/progress")
        doc = json.loads(body)
        assert status == 200 and set(doc) == set(FIELDS)
        assert doc["phase"] == "starting" and doc["totalSteps"] == 10 and doc["loss"] is None
        progress.update(tokens=512, phase="training", step=3, loss=0.25, tokensPerSecond=1e4, mfu=0.5,
                        extra={"accuracy": 0.75})
        doc = json.loads(get(server.port, "/progress")[1])
        assert (doc["step"], doc["loss"], doc["mfu"]) == (3, 0.25, 0.5)
        metrics = get(server.port, "/metrics")[1]
        assert "rlkube_step 3.0" in metrics and "rlkube_tokens_total 512.0" in metrics
        assert "rlkube_accuracy 0.75" in metrics
        assert get(server.port, "/healthz") == (200, "ok")
    finally:
        server.stop()


def test_other_ranks_serve_only_healthz():
    server = ProgressServer(None, 0, host="127.0.0.1")
    try:
        assert get(server.port, "/healthz") == (200, "ok")
        with pytest.raises(urllib.error.HTTPError):
            get(server.port, "/progress")
    finally:
        server.stop()


def test_unknown_field_is_an_error():
    with pytest.raises(KeyError):
        Progress(1).update(lossy=1.0)


def test_last_report_is_left_as_the_termination_message(tmp_path, monkeypatch):
    p = Progress(total_steps=30)
    p.update(phase="failed", step=7, loss=float("nan"), tokensPerSecond=12.5)
    path = tmp_path / "termination-log"
    assert write_termination_message(p, str(path))
    report = json.loads(path.read_text())["progress"]
    assert report["step"] == 7 and report["totalSteps"] == 30 and report["phase"] == "failed"
    assert report["tokensPerSecond"] == 12.5 and "loss" not in report  # NaN is no JSON number
    # The environment names the file; without it, only a kubelet-made /dev/termination-log is used.
    monkeypatch.setenv("RLKUBE_TERMINATION_LOG", str(tmp_path / "other"))
    assert write_termination_message(p) and (tmp_path / "other").exists()


def test_health_is_served_early_and_the_loop_adopts_the_same_server(monkeypatch):
    """The pod's first process answers /healthz before its slow start-up; the training loop
    then attaches its Progress to that server instead of binding the port a second time."""
    import socket

    from rlkube.runtime.infra import progress as progress_mod

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert progress_mod.serve_health_early(port) is None  # not the pod's first process
    monkeypatch.setenv("LOCAL_RANK", "0")
    early = progress_mod.serve_health_early(port)
    try:
        assert early is not None and get(port, "/healthz") == (200, "ok")
        with pytest.raises(urllib.error.HTTPError):
            get(port, "/progress")  # nothing to report yet
        adopted = progress_mod.adopt_early_server()
        assert adopted is early and progress_mod.adopt_early_server() is None  # handed over once
        p = Progress(total_steps=3)
        p.update(step=2)
        adopted.attach(p)
        assert json.loads(get(port, "/progress")[1])["step"] == 2
    finally:
        early.stop()


def test_per_gpu_throughput_phase_seconds_and_checkpoint_stall_are_exported():
    from prometheus_client import generate_latest

    progress = Progress(total_steps=10, gpus=4)
    progress.update(step=1, tokensPerSecond=4000.0, stepSeconds=1.5,
                    phaseSeconds={"generate": 0.75, "forward_backward": 0.5})
    progress.observe_checkpoint(0.25)
    progress.observe_checkpoint(0.5)
    sample = progress.registry.get_sample_value
    assert sample("rlkube_tokens_per_second_per_gpu") == 1000.0
    assert sample("rlkube_step_seconds") == 1.5 and progress.snapshot()["stepSeconds"] == 1.5
    assert sample("rlkube_phase_seconds", {"phase": "generate"}) == 0.75
    assert sample("rlkube_checkpoint_last_stall_seconds") == 0.5
    assert sample("rlkube_checkpoint_stall_seconds_total") == 0.75 and sample("rlkube_checkpoints_total") == 2
    progress.update(step=2, phaseSeconds={"optimizer": 0.1})  # a phase the last step had not: no stale series
    assert sample("rlkube_phase_seconds", {"phase": "generate"}) is None
    assert b'rlkube_phase_seconds{phase="optimizer"} 0.1' in generate_latest(progress.registry)
    assert Progress(total_steps=1).registry.get_sample_value("rlkube_tokens_per_second_per_gpu") == 0.0
