"""Multi-turn rollouts whose tool calls the job's environment answers (rollout.tools.remote: true),
on CPU with a tiny random model and the reference environment (images/environment) on loopback.

As in test_multi_turn.py, the random model is made to "call" tools: its turns stop at a token it
says, and the parser reads every such turn as a call of the calculator, here answered by the
reference server's calculator over POST /v1/step. Checked: every call went to the environment,
one step of its episode; the tool output is appended as the tool turn and never trained on; a
call the environment keeps failing (broken answers, past the client's retries) masks its episode
out of the loss and is counted.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from rlkube.runtime.contract.pod import ENV_ENVIRONMENT_URL
from rlkube.runtime.tools.environment import EnvironmentTools
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .test_multi_turn import EPISODE, TOOL_TURN, TURNS, runs, trainer_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images" / "environment"))
from server import Environment, make_server  # noqa: E402


class Recording(Environment):
    """The reference environment, recording each step's episode and tool; steps of the episodes
    in `broken` get an answer that breaks the protocol (the client retries, then gives up)."""

    def __init__(self, broken: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.broken, self.steps = broken, []

    def step(self, body):
        with self.lock:
            self.steps.append((body["episode_id"], body.get("metadata", {}).get("name")))
        if body["episode_id"] in self.broken:
            return {"observation": None}
        return super().step(body)


@pytest.fixture
def environment(monkeypatch):
    """Start a reference environment on a free loopback port, its URL where the operator puts it."""
    servers = []

    def start(**kwargs) -> Recording:
        env = Recording(**kwargs)
        server = make_server("127.0.0.1", 0, env)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        monkeypatch.setenv(ENV_ENVIRONMENT_URL, f"http://127.0.0.1:{server.server_port}")
        return env

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def remote_trainer(tmp: Path, monkeypatch, temperature: float = 0.0) -> RLTrainer:
    """A GRPO trainer of 4 prompts x 4 whose episodes call the environment's calculator at a token
    the model says."""
    trainer = trainer_for(tmp, monkeypatch, temperature, roles={"environment": {"image": "unused-outside-kubernetes"}},
                          maxTurns=TURNS, maxEpisodeTokens=EPISODE, tools={"remote": True})
    assert isinstance(trainer.episodes.executor, EnvironmentTools)
    trainer.episodes.executor.client.sleep = lambda seconds: None  # retries without their backoff
    return trainer


def test_the_environment_answers_the_tool_calls(tmp_path, monkeypatch, environment):
    """Every call is one step of its episode on the environment; its answer ("42", the reference
    server's calculator) is the tool turn, attended to and never trained on; the step trains."""
    env = environment()
    trainer = remote_trainer(tmp_path, monkeypatch)
    rollout, stats = trainer.rollout.generate(0)
    calls = stats["tools"].tool_calls
    assert calls > 0 and stats["tools"].tool_failures == 0
    assert len(env.steps) == calls and {name for _, name in env.steps} == {"calculator"}
    p = rollout.prompt_len
    called = {episode for episode, _ in env.steps}
    for r in range(rollout.rows):
        real = int(rollout.attention_mask[r, p:].sum())
        tokens = rollout.sequences[r, p:p + real]
        tool_turns = [(start, end) for value, start, end in runs(rollout.response_mask[r, :real]) if value == 0]
        for start, end in tool_turns:  # the environment's answer, exactly, and no policy token
            assert tokens[start:end].tolist() == TOOL_TURN
        assert (f"s0-{r}" in called) == bool(tool_turns)  # the episode's own id, one episode per row
    rec = trainer.train_step(0, 3e-3)
    assert rec["toolCalls"] > 0 and rec["toolCallFailures"] == 0 and rec["toolCallRetries"] == 0
    assert rec["toolTokens"] == rec["toolCalls"] * len(TOOL_TURN)


def test_a_call_the_environment_keeps_failing_masks_its_episode_out(tmp_path, monkeypatch, environment):
    """Steps of some episodes get answers that break the protocol: each is retried by the client,
    then is a failed call. Its episode ends there, is masked out of the loss (no token trained
    on, out of its group's statistics and rewardMean) and counted; the others train."""
    broken = frozenset({"s0-1", "s0-6", "s0-11"})
    env = environment(broken=broken)
    trainer = remote_trainer(tmp_path, monkeypatch, temperature=0.05)
    rollout, stats = trainer.rollout.generate(0)
    masked = {f"s0-{r}" for r in range(rollout.rows) if not rollout.trained_rows[r]}
    assert masked and masked <= broken
    assert stats["tools"].tool_failures == len(masked)
    assert stats["tools"].tool_retries == len(masked) * trainer.episodes.executor.client.retries
    retries = trainer.episodes.executor.client.retries
    for episode in masked:  # the first call failed after its retries, and the episode made no other
        assert sum(e == episode for e, _ in env.steps) == 1 + retries
        assert rollout.response_mask[int(episode[3:])].sum() == 0
    rec = trainer.train_step(0, 3e-3)
    assert rec["toolCallFailures"] == len(masked)
    keep = rollout.trained_rows
    scored = trainer._score(rollout)
    assert rec["rewardMean"] == pytest.approx(float(scored["scores"][keep].mean()))
