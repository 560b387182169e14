"""How `run` becomes training processes, from the env of the contract (`rlkube.runtime.contract.pod`,
docs/architecture.md "The contract").

- RANK set (torchrun, or a worker this module started): run as that one rank, in-process.
- LOCAL_WORLD_SIZE > 1 (the operator's pods: one process per GPU): start that many workers,
  `python -m rlkube.runtime run CONFIG` with RANK = RLKUBE_RANK_BASE + i and LOCAL_RANK = i,
  forward SIGTERM/SIGINT to them, and exit with the outcome of the gang.
- RLKUBE_RANK_BASE set with one process per pod (an operator pod of one GPU): run in-process as
  rank RLKUBE_RANK_BASE, local rank 0 (`pod_rank_env`). Without this every such pod would be
  rank 0, and the gang would wait in its rendezvous for ranks that never come.
- none of these: a single process of world size 1 (a workstation).

On a workstation spawn (no MASTER_ADDR), the workers rendezvous on 127.0.0.1 and a free port.
The gang's exit code: 3 or 4 (permanent failures) if any worker had one, 143 if SIGTERM
stopped it, 0 if all finished, else the first crash code. When one worker crashes the others
would hang in a collective until the timeout, so they are stopped after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from rlkube.runtime.contract.pod import (
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_RANK_BASE,
    ENV_WORLD_SIZE,
    EXIT_OK,
    EXIT_TERMINATED,
    MASTER_PORT,
    PERMANENT_EXIT_CODES,
)

CRASH_GRACE_S = 20.0


def launch_mode(env: dict[str, str]) -> str:
    if env.get(ENV_RANK, "") != "":
        return "rank"
    if int(env.get(ENV_LOCAL_WORLD_SIZE, "1") or "1") > 1:
        return "spawn"
    if env.get(ENV_RANK_BASE, "") != "":
        return "pod"
    return "single"


def pod_rank_env(env: dict[str, str]) -> dict[str, str]:
    """The rank variables of the one process of an operator pod ("pod" mode)."""
    (worker,) = worker_envs({**env, ENV_LOCAL_WORLD_SIZE: "1"})
    return {k: worker[k] for k in (ENV_RANK, ENV_LOCAL_RANK, ENV_WORLD_SIZE, ENV_MASTER_ADDR, ENV_MASTER_PORT)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_envs(env: dict[str, str], port: int | None = None) -> list[dict[str, str]]:
    """The environment of each local worker."""
    local = int(env[ENV_LOCAL_WORLD_SIZE])
    base = int(env.get(ENV_RANK_BASE, "0") or "0")
    common = dict(env)
    common.setdefault(ENV_WORLD_SIZE, str(local))
    if ENV_MASTER_ADDR not in env:
        common[ENV_MASTER_ADDR] = "127.0.0.1"
        common[ENV_MASTER_PORT] = str(port or free_port())
    common.setdefault(ENV_MASTER_PORT, str(MASTER_PORT))
    return [{**common, ENV_RANK: str(base + i), ENV_LOCAL_RANK: str(i)} for i in range(local)]


def gang_exit_code(codes: list[int], terminated: bool) -> int:
    for permanent in PERMANENT_EXIT_CODES:
        if permanent in codes:
            return permanent
    if all(c == EXIT_OK for c in codes):
        return EXIT_OK
    if terminated and all(c in (EXIT_OK, EXIT_TERMINATED, -signal.SIGTERM) for c in codes):
        return EXIT_TERMINATED
    crashes = [c for c in codes if c not in (EXIT_OK,)]
    first = crashes[0]
    return first if first > 0 else 128 - first  # killed by signal n -> 128 + n, like a shell


def spawn_workers(config_path: str, env: dict[str, str] | None = None) -> int:
    """Run LOCAL_WORLD_SIZE workers of this pod and wait for the gang's outcome."""
    env = dict(os.environ if env is None else env)
    procs = [
        subprocess.Popen([sys.executable, "-m", "rlkube.runtime", "run", config_path], env=e)
        for e in worker_envs(env)
    ]
    terminated = False

    def forward(signum, frame) -> None:
        nonlocal terminated
        terminated = terminated or signum == signal.SIGTERM
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        crash_at = None
        while any(p.poll() is None for p in procs):
            codes = [p.poll() for p in procs]
            if crash_at is None and any(c not in (None, 0) for c in codes):
                crash_at = time.monotonic()
            if crash_at is not None and time.monotonic() - crash_at > CRASH_GRACE_S:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.2)
        return gang_exit_code([p.returncode for p in procs], terminated)
    finally:
        for s, h in old.items():
            signal.signal(s, h)

