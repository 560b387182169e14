"""The reference environment of rlkube: an HTTP server of the environment protocol, version 1
(docs/environments.md; the runtime's `rlkube.runtime.contract.environment_protocol`). Stdlib only,
so the image is a Python and these files (the calculator tool is the runtime's own module).

  GET  /healthz   {"status": "ok", "version": 1}
  POST /v1/score  {"items": [{"prompt", "completion", "metadata"}]} -> {"rewards": [float | null]}
  POST /v1/step   {"episode_id", "action", "metadata"?} -> {"observation", "done", "reward"?}

Which verifier scores an item is its metadata's `kind`, else guessed from its fields:
- "code" (or metadata.tests set): the completion's Python (the last ```python block if it has
  one) followed by metadata.tests, run in the sandbox (sandbox.py); 1.0 when it exits 0, else 0.0;
- "math" (or metadata.answer set): math_check.math_reward against metadata.answer (1.0 or 0.0);
- "letters" (else): the share of the completion's characters that are lowercase ASCII letters,
  the runtime's toy reward (rlkube.runtime.rewards.target_pattern), for tiny jobs with synthetic
  prompts.
An item that cannot be scored (an unknown kind, a verifier that raised) is null.

/v1/step answers tool calls: a step whose metadata names a tool (`name`, `arguments`: what the
runtime's `rollout.tools.remote` sends) is answered by that tool of tools.py (python, calculator).
Otherwise it is a Python tool over episodes: each action runs in the sandbox and its stdout (or
error) is the observation; an action starting with "ANSWER:" ends the episode, with the math
reward of the rest against metadata.answer given at the episode's first step. Episodes live in
this replica's memory (at most MAX_EPISODES, oldest dropped): a multi-turn trainer must keep an
episode on one replica.

Settings (environment variables): PORT (8000), HOST (0.0.0.0: every address of the pod), SANDBOX_CPU_SECONDS (2), SANDBOX_WALL_SECONDS (5),
SANDBOX_MEMORY_MB (512), SANDBOX_PARALLEL (the CPUs this process may use: sandboxes run at once),
FAIL_EVERY (0; N > 0 answers every Nth /v1/score call with 503, to test a trainer's retries),
SCORE_DELAY_SECONDS (0; for benchmarks: each /v1/score item first holds a sandbox slot this long,
asleep, standing in for a verifier's time).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from math_check import math_reward  # noqa: E402
from sandbox import SandboxLimits, run_python  # noqa: E402
from tools import answer_call  # noqa: E402

VERSION = 1
MAX_ITEMS = 256
MAX_BODY = 8 * 1024 * 1024
MAX_EPISODES = 1024
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def code_of(completion: str) -> str:
    """The completion's last fenced Python block, else the whole completion."""
    blocks = _CODE_BLOCK.findall(completion)
    return blocks[-1] if blocks else completion


def letters_reward(completion: str) -> float:
    return sum("a" <= ch <= "z" for ch in completion) / len(completion) if completion else 0.0


class Environment:
    """The verifiers and the episodes, shared by the server's threads."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), parallel: int | None = None,
                 fail_every: int = 0, score_delay: float = 0.0) -> None:
        self.limits, self.score_delay = limits, score_delay
        self.sandboxes = threading.BoundedSemaphore(parallel or len(os.sched_getaffinity(0)))
        self.fail_every = fail_every
        self.score_calls = 0
        self.episodes: OrderedDict[str, dict] = OrderedDict()
        self.lock = threading.Lock()

    def should_fail(self) -> bool:
        with self.lock:
            self.score_calls += 1
            return self.fail_every > 0 and self.score_calls % self.fail_every == 0

    def run(self, code: str):
        with self.sandboxes:
            return run_python(code, self.limits)

    def score_item(self, item: dict) -> float | None:
        completion, metadata = str(item.get("completion", "")), item.get("metadata") or {}
        kind = metadata.get("kind") or ("code" if "tests" in metadata else "math" if "answer" in metadata
                                        else "letters")
        if self.score_delay > 0:
            with self.sandboxes:
                time.sleep(self.score_delay)
        try:
            if kind == "code":
                program = code_of(completion) + "\n\n" + str(metadata.get("tests", ""))
                return 1.0 if self.run(program).ok else 0.0
            if kind == "math":
                return math_reward(completion, str(metadata["answer"]))
            if kind == "letters":
                return letters_reward(completion)
        except Exception:  # noqa: BLE001 (a verifier's failure is this item's null, not the call's)
            return None
        return None

    def score(self, body: Any) -> dict:
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list) or len(items) > MAX_ITEMS or not all(isinstance(i, dict) for i in items):
            raise ValueError(f"expected {{'items': [...]}} of at most {MAX_ITEMS} objects")
        return {"rewards": [self.score_item(item) for item in items]}

    def step(self, body: Any) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("episode_id"), str) \
                or not isinstance(body.get("action"), str):
            raise ValueError("expected {'episode_id': str, 'action': str}")
        with self.lock:
            episode = self.episodes.pop(body["episode_id"], None) or {"metadata": body.get("metadata") or {}}
            self.episodes[body["episode_id"]] = episode
            while len(self.episodes) > MAX_EPISODES:
                self.episodes.popitem(last=False)
        action, metadata = body["action"], body.get("metadata") or {}
        if isinstance(metadata.get("name"), str):
            return {"observation": answer_call(metadata["name"], metadata.get("arguments") or {}, self.run),
                    "done": False}
        if action.startswith("ANSWER:"):
            with self.lock:
                self.episodes.pop(body["episode_id"], None)
            answer = episode["metadata"].get("answer")
            reward = math_reward(action[len("ANSWER:"):], str(answer)) if answer is not None else None
            return {"observation": "", "done": True, "reward": reward}
        result = self.run(action)
        observation = result.stdout if result.ok else (result.stderr[-2000:] or "timed out")
        return {"observation": observation, "done": False}


class Handler(BaseHTTPRequestHandler):
    environment: Environment  # set by `serve`
    protocol_version = "HTTP/1.1"

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/healthz":
            self._send(200, {"status": "ok", "version": VERSION})
        else:
            self._send(404, {"error": f"no {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(413, {"error": f"body over {MAX_BODY} bytes"})
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            self._send(400, {"error": "body is not JSON"})
            return
        routes = {f"/v{VERSION}/score": self.environment.score, f"/v{VERSION}/step": self.environment.step}
        if self.path not in routes:
            self._send(404, {"error": f"no {self.path}"})
            return
        if self.path.endswith("/score") and self.environment.should_fail():
            self._send(503, {"error": "failing on purpose (FAIL_EVERY)"})
            return
        try:
            self._send(200, routes[self.path](body))
        except ValueError as e:
            self._send(400, {"error": str(e)})

    def log_message(self, *args) -> None:  # one line per call would drown the pod's log
        pass


def make_server(host: str, port: int, environment: Environment) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"environment": environment})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main() -> None:
    env = os.environ
    limits = SandboxLimits(cpu_seconds=int(env.get("SANDBOX_CPU_SECONDS", 2)),
                           wall_seconds=float(env.get("SANDBOX_WALL_SECONDS", 5)),
                           memory_bytes=int(env.get("SANDBOX_MEMORY_MB", 512)) * 1024 * 1024)
    environment = Environment(limits, int(env["SANDBOX_PARALLEL"]) if env.get("SANDBOX_PARALLEL") else None,
                              int(env.get("FAIL_EVERY", 0)), float(env.get("SCORE_DELAY_SECONDS", 0)))
    server = make_server(env.get("HOST", "0.0.0.0"), int(env.get("PORT", 8000)), environment)
    print(f"rlkube reference environment: protocol v{VERSION} on :{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
