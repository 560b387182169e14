"""The environment protocol end to end on loopback: the reference environment's server
(images/environment) and the runtime's client (rewards/remote.py), a server that fails calls
(retries counted, failures reported as None), and the trainer's mask of failed completions
(out of the loss and of GRPO's group statistics, never scored as 0)."""

from __future__ import annotations

import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from rlkube.runtime.algorithms.advantages import group_normalized_advantages
from rlkube.runtime.algorithms.registry import get_adv_estimator
from rlkube.runtime.contract.config import TrainingSpec
from rlkube.runtime.contract.pod import ENV_ENVIRONMENT_URL
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.rewards.remote import (
    EnvironmentClient,
    EnvironmentUnavailable,
    environment_url_from_env,
    percentile,
)
from rlkube.runtime.trainers.rl.env_mask import (
    environment_fields,
    loss_mask,
    mask_failed_rows,
    reward_fields,
    row_weight,
)
from rlkube.runtime.trainers.rl.rollout import Rollout

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "images" / "environment"))
from server import Environment, make_server  # noqa: E402


@pytest.fixture
def served():
    """Start a reference environment on a free loopback port; yields (url, environment)."""
    servers = []

    def start(host: str = "127.0.0.1", port: int = 0, **kwargs):
        environment = Environment(**kwargs)
        server = make_server(host, port, environment)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://{host}:{server.server_port}", environment

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def client(url: str, **kwargs) -> EnvironmentClient:
    kwargs.setdefault("backoff", 0.001)
    kwargs.setdefault("timeout", 10.0)
    return EnvironmentClient(url, **kwargs)


def test_scores_code_math_and_letters_through_the_protocol(served):
    url, _ = served()
    c = client(url, batch_size=2, concurrency=2)
    assert c.wait_ready(5) < 5
    completions = ["```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a - b",
                   "so the answer is \\boxed{\\frac{1}{2}}", "I think 7", "abc!"]
    metadata = [{"tests": "assert add(2, 3) == 5"}, {"tests": "assert add(2, 3) == 5"}, {"answer": "0.5"},
                {"answer": "8"}, {}]
    rewards = c.score(["p"] * 5, completions, metadata)
    assert rewards == [1.0, 0.0, 1.0, 0.0, 0.75]
    stats = c.stats.take()
    assert (stats["envCalls"], stats["envRetries"], stats["envFailures"]) == (3, 0, 0)  # 5 items, 2 a call
    assert stats["envLatencyP50"] is not None and stats["envLatencyP99"] >= stats["envLatencyP50"]


def test_a_failing_server_costs_retries_and_what_still_fails_is_none(served):
    url, environment = served(fail_every=2)  # every second /v1/score call answers 503
    c = client(url, batch_size=1, concurrency=1, retries=3)
    assert c.score(["p"] * 4, ["abcd"] * 4) == [1.0] * 4
    stats = c.stats.take()
    assert stats["envRetries"] == 3 and stats["envFailures"] == 0 and stats["envCalls"] == 7
    url, _ = served(fail_every=1)  # every call fails: the items are failures, not zeros
    c = client(url, batch_size=2, retries=2)
    assert c.score(["p"] * 3, ["abc"] * 3) == [None, None, None]
    stats = c.stats.take()
    assert stats["envFailures"] == 3 and stats["envRetries"] == 4  # 2 calls x 2 retries


def test_a_server_that_answers_a_broken_body_or_null_is_a_failure():
    class Broken(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"rewards": [None, float("nan"), 0.25]} if self.path == "/v1/score" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        c = client(f"http://127.0.0.1:{server.server_port}", batch_size=3)
        assert c.score(["p"] * 3, ["a"] * 3) == [None, None, 0.25]  # NaN is no reward either
        assert c.score(["p"] * 2, ["a"] * 2) == [None, None]  # 3 rewards for 2 items: a broken answer
        assert c.stats.take()["envFailures"] == 4
    finally:
        server.shutdown()
        server.server_close()


def test_an_environment_that_never_answers_is_reported_after_the_timeout():
    c = EnvironmentClient("http://127.0.0.1:9", timeout=0.2, sleep=lambda s: None)
    with pytest.raises(EnvironmentUnavailable, match="did not answer /healthz"):
        c.wait_ready(0.0)


def test_the_url_comes_from_the_operator(monkeypatch):
    monkeypatch.delenv(ENV_ENVIRONMENT_URL, raising=False)
    with pytest.raises(EnvironmentUnavailable, match=ENV_ENVIRONMENT_URL):
        environment_url_from_env()
    monkeypatch.setenv(ENV_ENVIRONMENT_URL, "http://tiny-environment.team.svc:8000/")
    assert environment_url_from_env() == "http://tiny-environment.team.svc:8000"


def test_the_client_is_called_as_roles_environment_client_says(served, monkeypatch):
    from rlkube.runtime.contract.sections.environment_spec import EnvironmentClientSpec
    from rlkube.runtime.rewards.remote import connect_environment

    url, _ = served()
    monkeypatch.setenv(ENV_ENVIRONMENT_URL, url)
    c = connect_environment(EnvironmentClientSpec(concurrency=32, batch_size=4, timeout_seconds=5, retries=1))
    assert (c._pool._max_workers, c.batch_size, c.timeout, c.retries) == (32, 4, 5, 1)
    d = connect_environment()  # no settings: the spec's defaults
    defaults = EnvironmentClientSpec()
    assert (d._pool._max_workers, d.batch_size, d.timeout, d.retries) == (
        defaults.concurrency, defaults.batch_size, defaults.timeout_seconds, defaults.retries)


def test_step_runs_a_tool_and_ends_with_an_answer(served):
    url, _ = served()
    c = client(url)
    assert c.step("e1", "print(6 * 7)", {"answer": "42"}) == {"observation": "42\n", "done": False, "reward": None}
    assert c.step("e1", "ANSWER: \\boxed{42}") == {"observation": "", "done": True, "reward": 1.0}


def test_percentile_is_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile(list(range(1, 101)), 0.99) == 99


# -- the trainer's mask ---------------------------------------------------------------------

def rollout(rows: int, prompt_len: int = 2, response: int = 3) -> Rollout:
    seq = torch.ones(rows, prompt_len + response, dtype=torch.long)
    return Rollout(seq, torch.ones_like(seq), prompt_len, list(range(rows)))


def test_failed_rows_are_masked_out_of_the_loss_and_the_group_statistics():
    scores = torch.tensor([1.0, float("nan"), 0.0, 0.5, float("nan"), 0.5])
    r = rollout(6)
    scored = {"scores": scores.clone()}
    recorded = mask_failed_rows(scored)
    assert scored["valid"].tolist() == [True, False, True, True, False, True]
    mask = loss_mask(r, scored)
    assert mask.sum(dim=1).tolist() == [3, 0, 3, 3, 0, 3]  # no token of a failed row is in a loss
    assert int(r.response_mask.sum()) == 18  # ... but every row keeps its tokens for the forward
    weights = row_weight(scored, torch.tensor([0, 1, 4]), torch.ones(1))
    assert weights.flatten().tolist() == [1.0, 0.0, 0.0] and weights.shape == (3, 1)
    adv = get_adv_estimator("grpo")(scored, mask, TrainingSpec(group_size=3))["advantages"]
    assert adv[1] == 0 and adv[4] == 0
    # Group statistics over the valid completions only: as if the failed ones were never sampled.
    assert torch.allclose(adv[[0, 2]], group_normalized_advantages(torch.tensor([1.0, 0.0]), 2))
    assert torch.allclose(adv[[3, 5]], torch.zeros(2))  # two equal rewards: no signal
    fields = reward_fields(recorded, mask, 3)
    assert fields["rewardMean"] == pytest.approx(0.5) and fields["groupsWithSignal"] == 0.5
    # Scored as 0 instead, the failed completion would have moved its group's advantages.
    zeroed = group_normalized_advantages(torch.nan_to_num(scores, nan=0.0), 3)
    assert not torch.allclose(zeroed[[0, 2]], adv[[0, 2]])


def test_the_actor_loss_of_a_failed_row_is_zero_and_the_mean_is_over_the_others():
    """The policy loss with the loss mask: a failed row's tokens add nothing, whatever its values."""
    from rlkube.runtime.algorithms.registry import get_policy_loss

    scored = {"scores": torch.tensor([1.0, float("nan")])}
    mask_failed_rows(scored)
    r = rollout(2)
    resp = r.response_mask.float() * row_weight(scored, torch.arange(2), torch.ones(1))
    logps = torch.randn(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, 5.0])  # whatever the failed row's advantage, it must not count
    loss, _ = get_policy_loss("grpo")(logps, logps.detach(), adv, resp, TrainingSpec())
    loss.backward()
    assert logps.grad[1].abs().sum() == 0 and logps.grad[0].abs().sum() > 0
    assert loss.item() == pytest.approx(-1.0)  # the token mean of the valid row alone (ratio 1, A 1)


def test_with_nothing_failed_the_mask_changes_nothing():
    r, scores = rollout(4), torch.tensor([1.0, 0.0, 0.5, 0.25])
    scored = {"scores": scores.clone()}
    mask_failed_rows(scored)
    assert "valid" not in scored and torch.equal(loss_mask(r, scored), r.response_mask.float())
    assert torch.allclose(group_normalized_advantages(scores, 2, valid=torch.ones(4, dtype=torch.bool)),
                          group_normalized_advantages(scores, 2))


def test_environment_fields_of_one_process(served):
    url, _ = served(fail_every=2)
    c = client(url, batch_size=1, concurrency=1)
    c.score(["p"] * 2, ["ab"] * 2)
    fields = environment_fields(DistContext(), c)  # one process: no collective
    assert fields["envRetries"] == 1 and fields["envFailures"] == 0 and fields["envCallsPerSecond"] > 0
    assert math.isfinite(fields["envLatencyP99"])


def test_calls_spread_over_every_address_the_name_resolves_to(served, monkeypatch):
    """A headless Service's name resolves to its ready replicas: round robin over them, and a
    replica that is gone costs a retry on the next one, not a failure."""
    url_a, env_a = served()
    port = int(url_a.rsplit(":", 1)[1])
    _, env_b = served(host="127.0.0.2", port=port)  # two loopback addresses stand for two pods
    c = client(f"http://environment.test:{port}", batch_size=1, concurrency=1)
    monkeypatch.setattr(c.replicas, "_resolve", lambda: ["127.0.0.1", "127.0.0.2"])
    assert c.score(["p"] * 4, ["ab"] * 4) == [1.0] * 4
    assert (env_a.score_calls, env_b.score_calls) == (2, 2)
    assert c.replicas.next_base()[1] == f"environment.test:{port}"  # the Host header keeps the name
    # One replica gone (nothing listens there): each call that lands on it is retried on the other.
    monkeypatch.setattr(c.replicas, "_resolve", lambda: ["127.0.0.1", "127.0.0.3"])
    c.replicas._resolved_at = float("-inf")
    c.stats.take()
    assert c.score(["p"] * 4, ["ab"] * 4) == [1.0] * 4
    stats = c.stats.take()
    assert stats["envRetries"] >= 1 and stats["envFailures"] == 0


def test_tool_calls_of_multi_turn_episodes_can_be_answered_by_the_environment(served):
    """rollout.tools.remote's executor over POST /v1/step: the reference environment's tools answer
    by name (python in the sandbox, calculator), a call the policy got wrong is answered with an
    error (not a failure), the environment's `done` ends the episode, and a call that fails after
    the retries is a failed call (masked out), not an answer."""
    from rlkube.runtime.tools.environment import EnvironmentTools
    from rlkube.runtime.tools.executor import ToolCall

    url, environment = served()
    tools = EnvironmentTools(client(url))
    result = tools.step("s0-3", ToolCall("python", {"code": "print(2 ** 10)"}, '{"name": "python"}'))
    assert (result.text, result.done, result.ok) == ("1024\n", False, True)
    assert tools.step("s0-3", ToolCall("calculator", {"expression": "(2 + 3) * 4"})).text == "20"
    raised = tools.step("s0-3", ToolCall("python", {"code": "1 / 0"}))
    assert raised.ok and "ZeroDivisionError" in raised.text
    for wrong in (ToolCall("search", {"q": "x"}), ToolCall("python", {}), ToolCall("calculator", {"expression": "x"})):
        answer = tools.step("s0-4", wrong)
        assert answer.ok and not answer.done and answer.text.startswith("error: "), wrong
    results = tools.step_many([(f"s0-{row}", ToolCall("calculator", {"expression": f"{row} * 7"}))
                               for row in range(10)])
    assert [r.text for r in results] == [str(row * 7) for row in range(10)]
    # A step without a tool's name is the Python-over-episodes protocol: ANSWER: ends the episode.
    assert tools.client.step("e0-5", "ANSWER: 42", {"answer": "42"}) == {"observation": "", "done": True,
                                                                        "reward": 1.0}
    environment.step = lambda body: {"observation": "over", "done": True}
    assert tools.step("s0-6", ToolCall("calculator", {"expression": "1"})).done
    failing = EnvironmentTools(client("http://127.0.0.1:9", retries=1, timeout=0.5))
    assert not failing.step("s0-7", ToolCall("python", {"code": "print(1)"})).ok
    assert [r.ok for r in failing.step_many([("s0-8", ToolCall("calculator", {})), ("s0-9", ToolCall("x"))])] \
        == [False, False]


def test_an_episode_stays_on_one_replica():
    """Steps of one episode go to the replica its id hashes to (an environment keeps episodes in
    memory); a retry goes to the next one; ids spread over the replicas."""
    from rlkube.runtime.rewards.remote import Replicas

    replicas = Replicas("http://env.example:8000", resolve=lambda: ["10.0.0.3", "10.0.0.1", "10.0.0.2"])
    first = {replicas.next_base("s3-7")[0] for _ in range(5)}
    assert len(first) == 1 and first.pop().endswith(":8000")
    addresses = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    home = addresses.index(replicas.next_base("s3-7")[0])
    assert replicas.next_base("s3-7", attempt=1)[0] == addresses[(home + 1) % 3]
    assert {replicas.next_base(f"s3-{row}")[0] for row in range(30)} == set(addresses)
    assert replicas.next_base()[1] == "env.example:8000"  # the Host header names the Service
