"""Fencing by attempt with two live processes on one checkpoint directory, through the real
save/commit code (Checkpointer with background writes, as the trainer uses it).

Why the training tier and not e2e alone: the e2e node-loss test (tests/e2e/test_node_loss.py) shows
the same thing on real kubelets, but there the order of the stale pod's saves and the new
attempt's start depends on timing. Here the two processes are ordered by files they wait on, so
the worst order is forced every run: the stale attempt has run ahead of the new one (it committed a
higher step than the new attempt will ever have committed when the stale one saves again), and
it saves again once after the new attempt started (nothing of the new attempt committed yet: the
fence alone refuses it) and once after the new attempt committed a lower step than the stale
one's. Both must be refused, and the new attempt's lineage must stay the one every later restore
picks.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import torch

from rlkube.runtime.contract.pod import ENV_ATTEMPT
from rlkube.runtime.infra.checkpoint import StaleAttempt, committed, fence_attempt, latest, read_meta

TIMEOUT = 60.0


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {TIMEOUT:.0f} s")
        time.sleep(0.02)


def _checkpointer(root: str, attempt: int):
    os.environ[ENV_ATTEMPT] = str(attempt)
    torch.set_num_threads(1)
    from rlkube.runtime.infra.checkpoint import Checkpointer
    from rlkube.runtime.infra.distributed import DistContext

    torch.manual_seed(attempt)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    ck = Checkpointer(root, keep=10, ctx=DistContext(), background=True)
    return ck, model, opt


def _try_save(ck, model, opt, step: int) -> str:
    try:
        ck.save(step, model, opt, {"by": 3})
        ck.wait()
        return "committed"
    except StaleAttempt as exc:
        return f"refused: {exc}"


def stale_attempt(root: str, signals: str) -> None:
    """Attempt 3: runs ahead to step 60; once attempt 4 started (nothing committed yet) it tries
    to save 80, and once attempt 4 committed its own 80, it tries 100."""
    sig = Path(signals)
    ck, model, opt = _checkpointer(root, 3)
    ck.restore(model, opt)
    for step in (20, 40, 60):
        ck.save(step, model, opt, {"by": 3})
    ck.wait()
    (sig / "stale-ahead").touch()
    _wait_for(sig / "new-started")
    outcome = {"80": _try_save(ck, model, opt, 80)}
    (sig / "stale-tried").touch()
    _wait_for(sig / "new-committed")
    outcome["100"] = _try_save(ck, model, opt, 100)
    ck.close()
    (sig / "stale.json").write_text(json.dumps(outcome))


def new_attempt(root: str, signals: str) -> None:
    """Attempt 4: starts after attempt 3 ran ahead, resumes at its step 60, then commits 80 (a
    lower step than the stale process tries last) and 90."""
    sig = Path(signals)
    _wait_for(sig / "stale-ahead")
    ck, model, opt = _checkpointer(root, 4)
    meta = ck.restore(model, opt)
    (sig / "resumed.json").write_text(json.dumps({"step": meta["step"]}))
    (sig / "new-started").touch()
    _wait_for(sig / "stale-tried")
    ck.save(80, model, opt, {"by": 4})
    ck.wait()
    (sig / "new-committed").touch()
    _wait_for(sig / "stale.json")
    ck.save(90, model, opt, {"by": 4})
    ck.close()


def test_a_stale_process_cannot_commit_once_the_new_attempt_started(tmp_path):
    root, signals = tmp_path / "ckpt", tmp_path / "signals"
    signals.mkdir()
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=f, args=(str(root), str(signals))) for f in (stale_attempt, new_attempt)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT * 2)
    assert [p.exitcode for p in procs] == [0, 0], "a process failed or hung (see its output above)"

    assert json.loads((signals / "resumed.json").read_text()) == {"step": 60}
    stale = json.loads((signals / "stale.json").read_text())
    assert set(stale) == {"80", "100"}
    # Refused by the fence alone (attempt 4 had committed nothing yet), then by attempt 4's commit.
    assert stale["80"].startswith("refused: checkpoint refused: attempt 3 is older than attempt 4, which started"), stale
    assert stale["100"].startswith("refused: checkpoint refused: attempt 3 is older than attempt 4"), stale
    assert fence_attempt(root) == 4

    # Every commit of attempt 3 happened before attempt 4 started; attempt 4's are the latest.
    by_step = {step: read_meta(path) for step, path in committed(root)}
    assert {s: m["attempt"] for s, m in by_step.items()} == {20: 3, 40: 3, 60: 3, 80: 4, 90: 4}
    assert by_step[80]["trainer"] == {"by": 4}
    assert latest(root)[0] == 90
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp-step-")]
