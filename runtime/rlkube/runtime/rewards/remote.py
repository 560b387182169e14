"""Scoring through the job's environment (`roles.reward.remote`): an HTTP client of the environment
protocol (`contract.environment_protocol`, docs/environments.md).

A step's completions go out in calls of `batch_size` items, `concurrency` calls at a time on a
thread pool, spread over the environment's replicas by the client itself (`Replicas`: the
environment's Service is headless, its name resolves to the ready replicas).
Each call has a timeout; a call that times out, cannot connect, answers 429 or 5xx, or answers a
body that breaks the protocol is retried after an exponential backoff with jitter (`backoff`,
doubling, at most `max_backoff` seconds), `retries` times. A call that still fails makes each of
its items a failure: `None`, which the trainer leaves out of the loss and of its group's
statistics (trainers/rl/env_mask.py); it is never scored as 0, which would teach the policy that
a completion the environment never saw was bad. A 4xx other than 429 is the caller's mistake and
is not retried. An item the environment answers `null` for is a failure too.

What the calls cost is counted (`EnvironmentStats`): calls, retries, failed items and each call's
latency; the trainer takes the counts once a step into its record (envFailures, envRetries,
envCallsPerSecond, envLatencyP50, envLatencyP99) and rank 0's /metrics.

Stdlib only: urllib over a thread pool. `step` is one step of a multi-turn episode (POST /v1/step,
`rollout.tools.remote`: tools/environment.py); an episode's steps go to one replica (the one its id
hashes to among the addresses, the next on a retry), since an environment keeps its episodes in
memory.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlkube.runtime.contract.environment_protocol import (
    HEALTH_PATH,
    MAX_ITEMS_PER_CALL,
    SCORE_PATH,
    STEP_PATH,
)
from rlkube.runtime.contract.pod import ENV_ENVIRONMENT_URL
from rlkube.runtime.contract.sections.environment_spec import EnvironmentClientSpec

RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
# How long a trainer waits before its first step for the environment to answer /healthz: its
# replicas start beside the trainers, and pulling an image may take minutes.
READY_TIMEOUT_SECONDS = 600.0


class EnvironmentUnavailable(RuntimeError):
    """The environment never became ready, or its URL is not known."""


class CallFailed(Exception):
    """One call failed; `retry` says whether another try may help."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


def environment_url_from_env(field: str = "roles.reward.remote") -> str:
    """The environment's URL, as the operator sets it on the trainer pods; `field` is the setting
    that needs it, for the error."""
    url = os.environ.get(ENV_ENVIRONMENT_URL, "").strip()
    if not url:
        raise EnvironmentUnavailable(
            f"{field}: {ENV_ENVIRONMENT_URL} is not set; the operator sets it on jobs with "
            "roles.environment (outside Kubernetes, set it to the environment's URL)")
    return url.rstrip("/")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-quantile (0..1) of `values`, nearest rank; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class EnvironmentStats:
    """What calls to the environment cost since the last `take` (thread-safe)."""

    calls: int = 0  # calls made, each retry counted as a call
    retries: int = 0
    failures: int = 0  # items left without a reward
    latencies: list[float] = field(default_factory=list)  # seconds of each call (tries, not items)
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, seconds: float) -> None:
        with self._lock:
            self.calls += 1
            self.latencies.append(seconds)

    def retry(self) -> None:
        with self._lock:
            self.retries += 1

    def failed(self, items: int) -> None:
        with self._lock:
            self.failures += items

    def take(self) -> dict[str, float | int | None]:
        """The step's counts, as step record fields (latencies in seconds), and a fresh start."""
        with self._lock:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            out = {"envFailures": self.failures, "envRetries": self.retries, "envCalls": self.calls,
                   "envCallsPerSecond": self.calls / elapsed,
                   "envLatencyP50": percentile(self.latencies, 0.5),
                   "envLatencyP99": percentile(self.latencies, 0.99)}
            self.calls = self.retries = self.failures = 0
            self.latencies = []
            self.started = time.monotonic()
        return out


class Replicas:
    """The addresses the environment's name resolves to, and the next one to call.

    The environment's Service is headless: its name resolves to the addresses of its ready
    replicas, so the client spreads the calls over them (round robin) and a retry goes to the next
    replica. The name is resolved again at most every `ttl` seconds (the replicas change as pods
    come and go); a name that does not resolve is left to the connection to fail, and retried.
    `resolve` replaces the name's lookup (a list of addresses on the URL's port: a benchmark's
    replicas on loopback addresses)."""

    def __init__(self, url: str, ttl: float = 1.0, resolve: Callable[[], list[str]] | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.scheme, self.host = parts.scheme, parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.netloc, self.ttl = parts.netloc, ttl
        self._addresses: list[str] = []
        self._resolved_at = -math.inf
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._lookup = resolve

    def _resolve(self) -> list[str]:
        if self._lookup is not None:
            return sorted(self._lookup())
        try:
            infos = socket.getaddrinfo(self.host, self.port, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            return []
        return sorted({info[4][0] for info in infos})

    def next_base(self, key: str | None = None, attempt: int = 0) -> tuple[str, str]:
        """(the base URL of the next replica to call, the Host header of the name). With `key` (an
        episode's id) the replica is the one the key hashes to, the `attempt`-th next on a retry:
        an episode stays on one replica while the replicas stay the same."""
        with self._lock:
            if time.monotonic() - self._resolved_at > self.ttl:
                self._addresses = self._resolve()
                self._resolved_at = time.monotonic()
            addresses = self._addresses
        if not addresses:
            return f"{self.scheme}://{self.netloc}", self.netloc
        turn = next(self._turn) if key is None else zlib.crc32(key.encode()) + attempt
        address = addresses[turn % len(addresses)]
        return f"{self.scheme}://{address}:{self.port}", self.netloc


def _reward(value: Any) -> float | None:
    """A protocol reward: a finite number, else None (null, or something no reward is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class EnvironmentClient:
    """Calls of one environment service, bounded in concurrency, each with a timeout and retries."""

    def __init__(self, url: str, concurrency: int = 8, timeout: float = 30.0, retries: int = 4,
                 backoff: float = 0.5, max_backoff: float = 8.0, batch_size: int = 16,
                 sleep: Callable[[float], None] = time.sleep,
                 resolve: Callable[[], list[str]] | None = None) -> None:
        """`resolve`: the replicas' addresses instead of the URL's name's (`Replicas`)."""
        if not 1 <= batch_size <= MAX_ITEMS_PER_CALL:
            raise ValueError(f"batch_size: must be in 1..{MAX_ITEMS_PER_CALL}, got {batch_size}")
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.batch_size = timeout, retries, batch_size
        self.backoff, self.max_backoff, self.sleep = backoff, max_backoff, sleep
        self.stats = EnvironmentStats()
        self.replicas = Replicas(self.url, resolve=resolve)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="environment")
        self._jitter = random.Random(0)  # jitter only spreads retries; it needs no seed of the run

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- transport ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None,
                 key: str | None = None, attempt: int = 0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        base, host = self.replicas.next_base(key, attempt)
        request = urllib.request.Request(base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Host": host})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            raise CallFailed(f"{path}: HTTP {e.code}", retry=e.code in RETRIED_STATUS) from None
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
            raise CallFailed(f"{path}: {getattr(e, 'reason', e)}") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise CallFailed(f"{path}: the answer is not JSON") from None

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + 0.5 * self._jitter.random())

    def call(self, path: str, body: Any, check: Callable[[Any], Any], key: str | None = None) -> Any:
        """POST `body` to `path`; `check` turns the answer into the result or raises CallFailed.
        Retried as the module says; raises the last CallFailed when every try failed. `key` keeps
        the calls of one episode on one replica (`Replicas.next_base`)."""
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                try:
                    return check(self._request("POST", path, body, key=key, attempt=attempt))
                finally:
                    self.stats.call(time.monotonic() - started)  # every try, failed ones too
            except CallFailed as failure:
                if not failure.retry or attempt >= self.retries:
                    raise
                self.stats.retry()
                self.sleep(self._backoff(attempt))
                attempt += 1

    # -- the protocol ------------------------------------------------------------------------
    def healthy(self) -> bool:
        try:
            self._request("GET", HEALTH_PATH, timeout=min(self.timeout, 5.0))
            return True
        except CallFailed:
            return False

    def wait_ready(self, timeout: float, poll: float = 1.0) -> float:
        """Wait until /healthz answers (an environment's replicas start beside the trainers);
        returns the seconds waited. Raises EnvironmentUnavailable after `timeout` seconds."""
        started = time.monotonic()
        while not self.healthy():
            waited = time.monotonic() - started
            if waited >= timeout:
                raise EnvironmentUnavailable(f"the environment at {self.url} did not answer {HEALTH_PATH} "
                                             f"within {timeout:.0f}s")
            self.sleep(min(poll, timeout - waited))
        return time.monotonic() - started

    def _score_call(self, items: list[dict]) -> list[float | None]:
        def check(answer: Any) -> list[float | None]:
            rewards = answer.get("rewards") if isinstance(answer, dict) else None
            if not isinstance(rewards, list) or len(rewards) != len(items):
                raise CallFailed(f"{SCORE_PATH}: expected {{'rewards': [...]}} with {len(items)} entries")
            return [_reward(value) for value in rewards]

        try:
            rewards = self.call(SCORE_PATH, {"items": items}, check)
        except CallFailed:
            rewards = [None] * len(items)
        self.stats.failed(sum(reward is None for reward in rewards))
        return rewards

    def score(self, prompts: Sequence[str], completions: Sequence[str],
              metadata: Sequence[dict] | None = None) -> list[float | None]:
        """One reward per completion, in order; None where the environment could not score it."""
        metadata = metadata if metadata is not None else [{} for _ in prompts]
        items = [{"prompt": p, "completion": c, "metadata": m}
                 for p, c, m in zip(prompts, completions, metadata, strict=True)]
        chunks = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        return [reward for part in self._pool.map(self._score_call, chunks) for reward in part]

    def step(self, episode_id: str, action: str, metadata: dict | None = None) -> dict:
        """One step of an episode: {observation, done, reward?}. Raises CallFailed when every try failed."""
        def check(answer: Any) -> dict:
            if not isinstance(answer, dict) or not isinstance(answer.get("observation"), str) \
                    or not isinstance(answer.get("done"), bool):
                raise CallFailed(f"{STEP_PATH}: expected {{'observation': str, 'done': bool}}")
            return {"observation": answer["observation"], "done": answer["done"],
                    "reward": _reward(answer.get("reward"))}

        body = {"episode_id": episode_id, "action": action, **({"metadata": metadata} if metadata else {})}
        return self.call(STEP_PATH, body, check, key=episode_id)

    def map(self, fn: Callable[[Any], Any], args: Sequence[Any]) -> list[Any]:
        """`fn` over `args` on the client's pool (`concurrency` at a time), in order."""
        return list(self._pool.map(fn, args))


def connect_environment(settings: EnvironmentClientSpec | None = None, ready_timeout: float = READY_TIMEOUT_SECONDS,
                        field: str = "roles.reward.remote") -> EnvironmentClient:
    """The client of the job's environment (RLKUBE_ENVIRONMENT_URL), with `settings`
    (roles.environment.client; the defaults when None), once it answers /healthz; `field` is the
    setting that needs it, for the errors."""
    s = settings or EnvironmentClientSpec()
    client = EnvironmentClient(environment_url_from_env(field), concurrency=s.concurrency,
                               timeout=s.timeout_seconds, retries=s.retries, batch_size=s.batch_size)
    client.wait_ready(ready_timeout)
    return client
