"""Rank 0's /progress, /metrics and /healthz over real HTTP on loopback."""

import json
import urllib.request

import pytest

from rlkube.runtime.progress import FIELDS, Progress, ProgressServer


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
