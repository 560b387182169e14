"""The tail of a run (the last step to the process's exit): the final checkpoint and the Hugging
Face export are written in parallel from one staged host copy of the state, both committed before
`train` returns, and the summary says how long it took. A SIGKILL in the tail leaves the previous
committed checkpoint, and resuming from it gives the uninterrupted run's losses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.checkpoint import committed
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.export import Exporter

from .conftest import EVERY, ROOT, STEPS, run_cli, runtime_env, step_losses, tiny_config, write_config


def test_the_last_checkpoint_and_the_export_come_from_one_staged_copy_in_parallel(tmp_path, monkeypatch):
    from rlkube.runtime.trainers.dpo import DPOTrainer, TrainerHooks

    torch.set_num_threads(1)

    def no_gather(self, step, wrapper):  # the export's own gather of the weights: not in the tail
        assert not self.due(step), f"export after step {step} gathered its own copy of the weights"

    monkeypatch.setattr(Exporter, "__call__", no_gather)
    threads = []

    def during_tail(step):
        import threading

        threads.append((step, threading.current_thread().name))

    cfg = tiny_config(tmp_path, training={"steps": 4, "lr": 1e-3, "seed": 0})
    trainer = DPOTrainer(RuntimeConfig.model_validate(cfg), DistContext(), TrainerHooks(during_tail=during_tail))
    trainer.train()
    assert threads == [(4, "rlkube-checkpoint-4-beside")]  # beside the checkpoint writer
    assert [s for s, _ in committed(tmp_path / "ckpt")] == [4]
    exported = tmp_path / "ckpt" / "export"
    assert json.loads((exported / "rlkube-export.json").read_text())["step"] == 4
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(exported))
    ids = torch.tensor([[257, 104, 101, 108, 108, 111, 32, 119]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, trainer.policy.lm(input_ids=ids).logits)
    assert trainer.tail_done() is not None


def test_the_summary_reports_the_tail(tmp_path):
    cfg = tiny_config(tmp_path, training={"steps": 2, "lr": 1e-3, "seed": 0})
    code, recs, err = run_cli(write_config(tmp_path, cfg))
    assert code == 0, err[-3000:]
    tail = next(r for r in recs if r.get("event") == "tail")
    summary = next(r for r in recs if r.get("event") == "summary")
    assert summary["tailSeconds"] == tail["tailSeconds"] > 0
    assert summary["model"] and summary["checkpoint"].endswith("step-000000002")
    # the export and the checkpoint were both committed before the tail ended
    order = [r.get("event") for r in recs]
    assert order.index("export") < order.index("tail") and order.index("checkpoint") < order.index("tail")


KILL_IN_TAIL = textwrap.dedent(
    """
    import os, signal, sys, threading, torch
    torch.set_num_threads(1)
    from rlkube.runtime.cli import load_config
    from rlkube.runtime.trainers.dpo import TrainerHooks, train

    last = int(sys.argv[2])
    never = threading.Event()

    def hold_commit(step):  # the last checkpoint's shards are written; its commit waits
        if step == last:
            never.wait()

    def die(step):  # the export's thread, the staged copy in hand
        os.kill(os.getpid(), signal.SIGKILL)

    train(load_config(sys.argv[1]), hooks=TrainerHooks(before_checkpoint_commit=hold_commit, during_tail=die))
    """
)


@pytest.mark.slow
def test_sigkill_in_the_tail_leaves_the_previous_checkpoint_and_the_resume_is_exact(reference_run, tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path))
    proc = subprocess.run([sys.executable, "-c", KILL_IN_TAIL, str(path), str(STEPS)],
                          cwd=ROOT, env=runtime_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpt = tmp_path / "ckpt"
    assert [s for s, _ in committed(ckpt)][-1] == STEPS - EVERY  # the tail's checkpoint never committed
    assert not (ckpt / "export").exists()
    code, recs, err = run_cli(path)
    assert code == 0, err[-3000:]
    assert next(r for r in recs if r["event"] == "start")["startStep"] == STEPS - EVERY
    losses = step_losses(recs)
    assert sorted(losses) == list(range(STEPS - EVERY + 1, STEPS + 1))
    for step, loss in losses.items():
        assert loss == pytest.approx(reference_run["losses"][step], rel=1e-6, abs=1e-7), step
    assert (ckpt / "export" / "rlkube-export.json").is_file()
