"""On the toy task a tiny random model learns to write lowercase letters, with GRPO and with PPO.

The rule-based reward (rewards.target_pattern) is the fraction of completion characters in
[a-z]; a random byte-level model starts near 26/259 ~ 0.1. Fixed seed, fixed step budget, and
the assertion is a margin on the mean reward of the last steps over the first ones.
"""

import json
import socket
import threading
import time
import urllib.request

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.trainers.rl import train

from .rl_common import rl_config

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll_progress(port: int, seen: list, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=1) as r:
                seen.append(json.loads(r.read()))
        except OSError:
            pass
        time.sleep(0.3)


def mean(xs):
    return sum(xs) / len(xs)


def test_grpo_raises_mean_reward_and_serves_it_on_progress(tmp_path):
    torch.set_num_threads(1)
    port = free_port()
    cfg = RuntimeConfig.model_validate(rl_config(tmp_path, "grpo", progressPort=port,
                                                 training={"clipHigh": 0.28}))
    seen: list[dict] = []
    stop = threading.Event()
    poller = threading.Thread(target=poll_progress, args=(port, seen, stop), daemon=True)
    poller.start()
    try:
        result = train(cfg)
    finally:
        stop.set()
        poller.join(5)
    rewards = result.series("rewardMean")
    assert len(rewards) == 20
    assert mean(rewards[:3]) < 0.2
    assert mean(rewards[-3:]) - mean(rewards[:3]) > 0.25, rewards
    served = [s for s in seen if s.get("rewardMean") is not None]
    assert served, f"/progress never showed a rewardMean: {seen[-1:]}"
    assert set(served[-1]) >= {"phase", "step", "totalSteps", "tokensPerSecond", "loss", "rewardMean"}
    rec = result.records[-1]
    for key in ("generationTokensPerSecond", "trainingTokensPerSecond", "scoringSeconds", "reshardSeconds"):
        assert rec[key] is not None and rec[key] >= 0, key


def test_ppo_raises_mean_reward(tmp_path):
    torch.set_num_threads(1)
    cfg = RuntimeConfig.model_validate(rl_config(tmp_path, "ppo"))
    result = train(cfg)
    rewards = result.series("rewardMean")
    assert mean(rewards[-3:]) - mean(rewards[:3]) > 0.2, rewards
    assert all("value_loss" in r for r in result.records)
