"""Faults: SIGKILL mid-training and mid-save, injected OOM, SIGTERM, bad config, NaN loss."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from rlkube.runtime.infra.checkpoint import committed, latest

from .conftest import (
    EVERY,
    ROOT,
    STEPS,
    records,
    run_cli,
    runtime_env,
    step_losses,
    tiny_config,
    write_config,
)


def start_cli(config_path, **env):
    return subprocess.Popen(
        [sys.executable, "-m", "rlkube.runtime", "run", str(config_path)],
        cwd=ROOT, env=runtime_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def read_until_step(proc, step):
    lines = []
    for line in proc.stdout:
        lines.append(line)
        recs = records(line)
        if recs and recs[0].get("event") == "step" and recs[0]["step"] >= step:
            return lines
    raise AssertionError(f"process ended before step {step}: {proc.stderr.read()[-2000:]}")


def assert_same_as_reference(losses, reference, first):
    assert sorted(losses) == list(range(first, STEPS + 1))
    for step, loss in losses.items():
        # same data order, same RNG, same batcher state: the same numbers
        assert loss == pytest.approx(reference["losses"][step], rel=1e-6, abs=1e-7), step


def test_sigkill_during_training_then_resume_gives_the_uninterrupted_losses(reference_run, tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path))
    proc = start_cli(path)
    read_until_step(proc, EVERY + 2)  # past the first checkpoint, before the second commit
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    resumed_from = latest(tmp_path / "ckpt")[0]
    assert resumed_from in (EVERY, 2 * EVERY)
    code, recs, err = run_cli(path)
    assert code == 0, err[-3000:]
    assert next(r for r in recs if r["event"] == "start")["startStep"] == resumed_from
    assert_same_as_reference(step_losses(recs), reference_run, resumed_from + 1)


KILL_IN_SAVE = textwrap.dedent(
    """
    import os, signal, sys, torch
    torch.set_num_threads(1)
    from rlkube.runtime.cli import load_config
    from rlkube.runtime.trainers.dpo import TrainerHooks, train

    def die(step):
        if step == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)  # shards written, not committed

    train(load_config(sys.argv[1]), hooks=TrainerHooks(before_checkpoint_commit=die))
    """
)


def test_sigkill_during_checkpoint_save_resumes_from_the_previous_commit(reference_run, tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path))
    proc = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, str(path), str(2 * EVERY)],
                          cwd=ROOT, env=runtime_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpt = tmp_path / "ckpt"
    assert [s for s, _ in committed(ckpt)] == [EVERY]
    assert any(p.name.startswith(f".tmp-step-{2 * EVERY:09d}") for p in ckpt.iterdir())
    code, recs, err = run_cli(path)
    assert code == 0, err[-3000:]
    assert next(r for r in recs if r["event"] == "start")["startStep"] == EVERY
    assert_same_as_reference(step_losses(recs), reference_run, EVERY + 1)
    assert not any(p.name.startswith(".tmp-") for p in ckpt.iterdir())  # cleaned on a later commit


def test_injected_oom_shrinks_the_micro_batch_and_the_step_completes(reference_run, tmp_path):
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.trainers.dpo import TrainerHooks, train

    sizes = []

    def oom_above_two(mb):
        sizes.append(len(mb))
        if len(mb) > 2:
            raise torch.OutOfMemoryError("injected: more than 2 pairs")

    cfg = RuntimeConfig.model_validate(tiny_config(tmp_path, training={"steps": 3}))
    result = train(cfg, hooks=TrainerHooks(before_micro_batch=oom_above_two))
    assert result.steps_run == 3
    assert sizes[0] == 4 and max(sizes[1:]) <= 2  # first plan: 4 pairs per micro-batch; then 2
    assert any("out of memory" in d for d in result.decisions)
    # redoing the step with smaller micro-batches is the same update (up to summation order)
    for i, loss in enumerate(result.losses, 1):
        assert loss == pytest.approx(reference_run["losses"][i], rel=1e-5), i


def test_sigterm_writes_a_checkpoint_and_exits_143(tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path, checkpoint={"everySteps": 100}))
    proc = start_cli(path)
    read_until_step(proc, 2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    stopped = [r for r in records(out) if r["event"] == "checkpoint"]
    assert stopped and latest(tmp_path / "ckpt")[0] == stopped[-1]["step"] >= 2


def test_bad_config_exits_3_with_the_field_path(tmp_path):
    cfg = tiny_config(tmp_path, batching={"globalBatch": 0})
    code, _, err = run_cli(write_config(tmp_path, cfg), timeout=120)
    assert code == 3
    assert "batching.globalBatch" in err and "greater than or equal to 1" in err


def test_non_finite_loss_stops_before_the_optimizer_step_with_exit_4(tmp_path, monkeypatch):
    from rlkube.runtime.cli import run_in_process
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.trainers import dpo as trainer

    monkeypatch.setattr(trainer, "pair_loss", lambda logps, beta, kind: logps.policy_chosen * float("nan"))
    stepped = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: stepped.append(1))
    cfg = RuntimeConfig.model_validate(tiny_config(tmp_path, training={"steps": 2}))
    assert run_in_process(cfg) == 4
    assert stepped == []
    assert os.path.isdir(tmp_path / "ckpt") is False or committed(tmp_path / "ckpt") == []
