"""Reward throughput through the environment (`roles.reward.remote`) against an in-process reward,
pure CPU (no cluster): completions scored per second with 1, 2 and 4 replicas of the reference
environment.

Run: `.venv/bin/python tests/bench/bench_environment.py [--completions 512] [--concurrency 8,32]`.

Each replica is the reference server (images/environment/server.py) in a subprocess of its own,
with `SCORE_DELAY_SECONDS` making every completion's verifier take `--delay` seconds (asleep: no
CPU, so the figures measure how the calls are spread and overlapped, not this machine's cores)
in one of the replica's `--slots` verifier slots (`SANDBOX_PARALLEL`: a pod of that many CPUs).
The replicas listen on one port at loopback addresses of their own (127.0.0.1, .2, ...), as a
headless Service's pods do at their pod IPs, and the runtime's client (rewards/remote.py, its
defaults but for `--concurrency`) spreads its calls over them through the same `Replicas` code,
its name lookup replaced by the list of those addresses.

The baseline is the same completions scored in-process by a reward function that sleeps `--delay`
seconds each, one after another, as `roles.reward.function` runs (rewards/functions.py).

One JSON object per case, then a table: completions/s and the ratio to one replica at the same
concurrency, and to the in-process baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "images" / "environment" / "server.py"

from rlkube.runtime.rewards import score_with_function  # noqa: E402
from rlkube.runtime.rewards.remote import EnvironmentClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_replicas(count: int, port: int, delay: float, slots: int) -> list[subprocess.Popen]:
    """`count` reference servers on 127.0.0.1.. at `port`, each a process of its own."""
    env = {**os.environ, "PORT": str(port), "SCORE_DELAY_SECONDS": str(delay), "SANDBOX_PARALLEL": str(slots)}
    return [subprocess.Popen([sys.executable, str(SERVER)], env={**env, "HOST": f"127.0.0.{i + 1}"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for i in range(count)]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=10)


def texts(count: int) -> tuple[list[str], list[str]]:
    return [f"prompt {i}" for i in range(count)], [f"completion number {i} ends here" for i in range(count)]


def remote_rate(replicas: int, concurrency: int, completions: int, delay: float, slots: int) -> dict:
    port = free_port()
    processes = start_replicas(replicas, port, delay, slots)
    addresses = [f"127.0.0.{i + 1}" for i in range(replicas)]
    client = EnvironmentClient(f"http://environment.bench:{port}", concurrency=concurrency,
                               resolve=lambda: addresses)
    try:
        for address in addresses:  # every replica answers /healthz before the clock starts
            one = EnvironmentClient(f"http://{address}:{port}")
            one.wait_ready(30.0, poll=0.05)
            one.close()
        prompts, outs = texts(completions)
        client.stats.take()
        started = time.perf_counter()
        rewards = client.score(prompts, outs)
        seconds = time.perf_counter() - started
        stats = client.stats.take()
    finally:
        client.close()
        stop(processes)
    assert all(r is not None for r in rewards), "the environment failed to score some completions"
    assert stats["envRetries"] == 0, stats
    return {"case": "remote", "replicas": replicas, "concurrency": concurrency, "completions": completions,
            "seconds": round(seconds, 2), "completions_per_s": round(completions / seconds, 1),
            "calls": stats["envCalls"], "latency_p50_s": round(stats["envLatencyP50"], 2),
            "latency_p99_s": round(stats["envLatencyP99"], 2)}


def in_process_rate(completions: int, delay: float) -> dict:
    def sleepy_reward(prompt: str, completion: str) -> float:
        time.sleep(delay)
        return sum("a" <= ch <= "z" for ch in completion) / len(completion)

    prompts, outs = texts(completions)
    started = time.perf_counter()
    score_with_function(sleepy_reward, prompts, outs)
    seconds = time.perf_counter() - started
    return {"case": "in-process", "completions": completions, "seconds": round(seconds, 2),
            "completions_per_s": round(completions / seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--completions", type=int, default=512)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds of a verifier per completion (asleep)")
    parser.add_argument("--slots", type=int, default=4, help="completions a replica verifies at once")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--concurrency", default="8,32", help="the client's calls at once (8: its default)")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    if not args.no_baseline:
        rows.append(in_process_rate(args.completions, args.delay))
        print(json.dumps(rows[-1]), flush=True)
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        for replicas in (int(r) for r in args.replicas.split(",")):
            rows.append(remote_rate(replicas, concurrency, args.completions, args.delay, args.slots))
            print(json.dumps(rows[-1]), flush=True)
    baseline = rows[0]["completions_per_s"] if not args.no_baseline else None
    print(f"\n{'case':<28} {'completions/s':>14} {'vs 1 replica':>13} {'vs in-process':>14}")
    for row in rows:
        one = next((r["completions_per_s"] for r in rows if r["case"] == "remote" and r["replicas"] == 1
                    and r["concurrency"] == row.get("concurrency")), None)
        name = ("in-process, sequential" if row["case"] == "in-process"
                else f"{row['replicas']} replica(s), concurrency {row['concurrency']}")
        ratio = f"{row['completions_per_s'] / one:.2f}x" if one and row["case"] == "remote" else ""
        speedup = f"{row['completions_per_s'] / baseline:.1f}x" if baseline else ""
        print(f"{name:<28} {row['completions_per_s']:>14.1f} {ratio:>13} {speedup:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
