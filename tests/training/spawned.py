"""Tests that run a trainer on several CPU ranks (gloo), each rank a spawned process."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
import torch.multiprocessing as mp


def spawn_ranks(worker: Callable, args: Callable[[int, dict], tuple], monkeypatch: pytest.MonkeyPatch,
                nprocs: int = 2) -> dict:
    """`worker(rank, *args(port, results))` on `nprocs` processes rendezvousing on a free loopback
    port; what the workers put in `results` (a shared dict), once all have finished.

    Spawned, not forked: torch refuses autograd in a forked worker once an earlier test's backward
    has started autograd's threads in this process (so a subset of the tests failed by their order)."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.start_processes(worker, args=args(port, results), nprocs=nprocs, join=True, start_method="spawn")
    return dict(results)
