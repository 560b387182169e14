"""Fencing by attempt: a process of an older gang attempt than the fence (raised by every attempt
when it starts) or the newest committed checkpoint's cannot commit (one left behind a partition
must not commit over the attempt that replaced it). tests/training/test_fencing_processes.py
shows it with two live processes."""

import json

import pytest
import torch

from rlkube.runtime.contract.pod import ENV_ATTEMPT
from rlkube.runtime.infra.checkpoint import (
    META,
    Checkpointer,
    StaleAttempt,
    check_fence,
    claim,
    committed,
    fence_attempt,
    latest,
    read_meta,
    step_dir,
)
from rlkube.runtime.infra.distributed import DistContext


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def fake(root, step, attempt):
    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / META).write_text(json.dumps({"step": step, **({"attempt": attempt} if attempt is not None else {})}))


@pytest.mark.parametrize(("newest", "mine", "refused"), [
    (3, 2, True),      # the new attempt committed: the old one is fenced off
    (3, 3, False),     # the same attempt saves again
    (2, 3, False),     # a newer attempt commits over an older one's checkpoint
    (None, 1, False),  # a checkpoint written outside an operator pod carries no attempt
    (3, None, False),  # a run outside an operator pod is not fenced
])
def test_check_fence(tmp_path, newest, mine, refused):
    fake(tmp_path, 10, newest)
    if refused:
        with pytest.raises(StaleAttempt, match=f"attempt {mine} is older than attempt {newest}"):
            check_fence(tmp_path, mine)
    else:
        check_fence(tmp_path, mine)


def test_a_stale_attempt_cannot_commit_and_the_new_attempts_checkpoint_stays_latest(tmp_path, monkeypatch):
    model, opt = model_and_optimizer()
    monkeypatch.setenv(ENV_ATTEMPT, "4")
    Checkpointer(str(tmp_path), keep=3, ctx=DistContext()).save(20, model, opt, {})
    assert read_meta(step_dir(tmp_path, 20))["attempt"] == 4

    monkeypatch.setenv(ENV_ATTEMPT, "3")  # the process of attempt 3, still running behind a partition
    stale = Checkpointer(str(tmp_path), keep=3, ctx=DistContext())
    with pytest.raises(StaleAttempt):
        stale.save(30, model, opt, {})
    assert [s for s, _ in committed(tmp_path)] == [20]
    assert not (step_dir(tmp_path, 30) / META).exists()


def test_the_fence_refuses_an_older_attempt_before_the_new_one_committed_anything(tmp_path):
    fake(tmp_path, 40, 3)       # the old attempt's last commit: newest by step
    claim(tmp_path, 4)          # attempt 4 started here (restore), nothing committed yet
    assert fence_attempt(tmp_path) == 4
    with pytest.raises(StaleAttempt, match="attempt 3 is older than attempt 4, which started"):
        check_fence(tmp_path, 3)
    check_fence(tmp_path, 4)
    claim(tmp_path, 2)          # a stale process never lowers the fence
    assert fence_attempt(tmp_path) == 4


def test_a_newer_attempts_checkpoint_is_latest_whatever_its_step(tmp_path):
    # A stale process ran ahead (step 60, attempt 3) before the new attempt (4) resumed at 40
    # and committed 50: the new attempt's lineage wins, and the stale one is pruned first.
    fake(tmp_path, 40, 3)
    fake(tmp_path, 60, 3)
    fake(tmp_path, 50, 4)
    assert [s for s, _ in committed(tmp_path)] == [40, 60, 50]
    assert latest(tmp_path)[0] == 50
    with pytest.raises(StaleAttempt, match="which committed step-000000050"):
        check_fence(tmp_path, 3)


def test_restore_raises_the_fence_so_the_stale_attempt_cannot_commit(tmp_path, monkeypatch):
    model, opt = model_and_optimizer()
    monkeypatch.setenv(ENV_ATTEMPT, "3")
    stale = Checkpointer(str(tmp_path), keep=3, ctx=DistContext())
    stale.restore(model, opt)
    stale.save(20, model, opt, {})

    monkeypatch.setenv(ENV_ATTEMPT, "4")  # the new attempt starts and resumes from step 20
    meta = Checkpointer(str(tmp_path), keep=3, ctx=DistContext()).restore(model, opt)
    assert meta["step"] == 20 and fence_attempt(tmp_path) == 4

    monkeypatch.setenv(ENV_ATTEMPT, "3")
    with pytest.raises(StaleAttempt):
        stale.save(40, model, opt, {})
    assert [s for s, _ in committed(tmp_path)] == [20]
