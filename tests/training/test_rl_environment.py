"""A tiny GRPO run scoring through an environment (roles.reward.remote) on loopback, through the
pod entry point with 2 processes: the reference environment (images/environment), made to fail
some calls (retried) and to leave some completions without a reward (null: masked out of the
loss, never scored as 0). The run finishes, and its step records count the calls."""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

import pytest
import yaml

from rlkube.runtime.contract.pod import ENV_ENVIRONMENT_URL

from .conftest import run_cli
from .rl_common import rl_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images" / "environment"))
from server import Environment, make_server  # noqa: E402

pytestmark = pytest.mark.slow


class Flaky(Environment):
    """Every 3rd call answers 503 (FAIL_EVERY) and every 5th completion gets null."""

    def __init__(self) -> None:
        super().__init__(fail_every=3)
        self.items = 0

    def score_item(self, item: dict) -> float | None:
        with self.lock:
            self.items += 1
            drop = self.items % 5 == 0
        return None if drop else super().score_item(item)


def test_grpo_scores_through_a_flaky_environment(tmp_path):
    environment = Flaky()
    server = make_server("127.0.0.1", 0, environment)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        cfg = rl_config(tmp_path, "grpo", roles={"actor": {"gpus": 2}, "reward": {"gpus": 0, "remote": True},
                                                 "environment": {"image": "unused-outside-kubernetes"}},
                        training={"steps": 3, "groupSize": 4, "kl": 0.0},
                        batching={"globalBatch": 4, "maxMicroBatch": 1})  # a failed row alone in a micro-batch
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(cfg))
        code, recs, err = run_cli(path, timeout=400, LOCAL_WORLD_SIZE="2",
                                  **{ENV_ENVIRONMENT_URL: f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, err[-4000:]
    steps = [r for r in recs if r.get("event") == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert environment.items >= 3 * 16  # every completion of every step went to the environment
    assert sum(r["envRetries"] for r in steps) > 0  # the 503s were retried ...
    assert sum(r["envFailures"] for r in steps) > 0  # ... the nulls were counted as failures ...
    for r in steps:
        assert math.isfinite(r["loss"]) and 0.0 <= r["rewardMean"] <= 1.0  # ... and never made the loss NaN
        assert r["envCallsPerSecond"] > 0 and r["envLatencyP99"] >= r["envLatencyP50"] > 0
    json.dumps(steps)  # the records stay JSON (no NaN leaks into them)
