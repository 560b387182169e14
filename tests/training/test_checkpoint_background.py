"""Background checkpoint writes.

On 2 gloo processes with an FSDP2-sharded model: staged, written by a writer thread on its own
group, committed once after both ranks' shards, and resharded on load into one process with the
weights of the step it was staged at.

Through the trainer (DPO, whose saves are in the background by default), with the writer thread
held at a commit deterministically (not by timing): SIGKILL while it is held leaves the previous
committed checkpoint, and the resumed run computes the uninterrupted losses; SIGTERM while it is
held lets the write commit before the process exits 143, and the resumed run is exact too.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.multiprocessing as mp

from rlkube.runtime.engine.models import shard
from rlkube.runtime.infra.checkpoint import Checkpointer, committed, latest
from rlkube.runtime.infra.distributed import DistContext, all_reduce_sum, init_from_env, shutdown

from .conftest import EVERY, ROOT, records, run_cli, runtime_env, step_losses, tiny_config, write_config
from .test_faults import assert_same_as_reference


class Layers(torch.nn.Module):
    """Two 'decoder layers' so models.shard finds units to wrap."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])

    def get_decoder(self):
        return self

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def train_step(model, opt):
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def worker(rank: int, port: int, root: str, results, staging: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ctx = init_from_env({"actor": [0, 1]})
    torch.manual_seed(0)
    model = shard(Layers(), ctx, "actor")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = Checkpointer(root, keep=3, ctx=ctx, background=True, staging=staging)
    train_step(model, opt)
    ck.save(1, model, opt, {"step": 1})
    # the loop trains on (collectives on the default group) while the writer works on its own
    expected = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    train_step(model, opt)
    all_reduce_sum(ctx, [1.0])
    ck.save(2, model, opt, {"step": 2})  # waits for step 1's write first
    train_step(model, opt)
    ck.close()
    if rank == 0:
        results["expected1"] = dict(expected)
    shutdown(ctx)


# "device": the snapshot of the sharded (DTensor) state is taken on the device and moved to host
# memory by the writer (how CUDA runs stage when the card has room); "host": staged by the step.
@pytest.mark.parametrize("staging", ["host", "device"])
def test_two_ranks_commit_once_and_the_checkpoint_reshards_into_one_process(tmp_path, staging):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.start_processes(worker, args=(port, str(tmp_path), results, staging), nprocs=2, join=True, start_method="spawn")
    assert [s for s, _ in committed(tmp_path)] == [1, 2]
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    # step 1's checkpoint holds step 1's weights although both ranks trained on while it was written
    ck = Checkpointer(str(tmp_path), keep=3, ctx=DistContext())
    other = Layers()
    opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    train_step(other, opt)  # optimizer state to load into
    shutil.rmtree(tmp_path / "step-000000002")
    meta = ck.restore(other, opt)
    assert meta["step"] == 1 and meta["worldSize"] == 2
    for name, value in other.state_dict().items():
        assert torch.equal(value, results["expected1"][name]), name


# The writer thread is held at step HOLD's commit (its shards written): it prints a "writerHeld"
# record, then waits until SIGTERM reached the process (under SIGKILL: until it dies).
HOLD_WRITER = textwrap.dedent(
    """
    import json, sys, threading, torch
    torch.set_num_threads(1)
    from rlkube.runtime.cli import load_config
    from rlkube.runtime.infra.errors import Terminated
    from rlkube.runtime.infra import sigterm
    from rlkube.runtime.trainers.dpo import TrainerHooks, train

    hold, term = int(sys.argv[2]), threading.Event()
    handle = sigterm.SigtermFlag._handle
    def noted(self, signum, frame):
        handle(self, signum, frame)
        term.set()
    sigterm.SigtermFlag._handle = noted

    def held(step):
        if step == hold:
            print(json.dumps({"event": "writerHeld", "step": step}), flush=True)
            term.wait(timeout=300)

    try:
        train(load_config(sys.argv[1]), hooks=TrainerHooks(before_checkpoint_commit=held))
    except Terminated:
        sys.exit(143)
    """
)


def start_held(path, hold):
    return subprocess.Popen([sys.executable, "-c", HOLD_WRITER, str(path), str(hold)], cwd=ROOT, env=runtime_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_held(proc):
    for line in proc.stdout:
        if records(line) and records(line)[0].get("event") == "writerHeld":
            return
    raise AssertionError(proc.stderr.read()[-2000:])


def test_sigkill_while_the_background_writer_holds_a_save_resumes_from_the_previous_commit(reference_run, tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path))
    proc = start_held(path, 2 * EVERY)
    wait_for_held(proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert [s for s, _ in committed(tmp_path / "ckpt")] == [EVERY]
    code, recs, err = run_cli(path)
    assert code == 0, err[-3000:]
    assert next(r for r in recs if r["event"] == "start")["startStep"] == EVERY
    assert_same_as_reference(step_losses(recs), reference_run, EVERY + 1)


def test_sigterm_during_a_background_write_commits_it_and_exits_143(reference_run, tmp_path):
    path = write_config(tmp_path, tiny_config(tmp_path))
    proc = start_held(path, EVERY)
    wait_for_held(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    saved = [s for s, _ in committed(tmp_path / "ckpt")]
    assert EVERY in saved  # the held write was let go and committed
    stopped = latest(tmp_path / "ckpt")[0]
    assert stopped >= EVERY and any(r.get("event") == "checkpoint" and r["step"] == stopped for r in records(out))
    code, recs, err = run_cli(path)
    assert code == 0, err[-3000:]
    assert next(r for r in recs if r["event"] == "start")["startStep"] == stopped
    assert_same_as_reference(step_losses(recs), reference_run, stopped + 1)


# The save that SIGTERM asks for is held at its commit until a second SIGTERM comes: by then the
# loop has stopped and only the writer works. As in a pod, the start-up handler (infra/sigterm.py)
# is installed first.
HOLD_STOP_SAVE = textwrap.dedent(
    """
    import json, sys, threading, torch
    torch.set_num_threads(1)
    from rlkube.runtime.cli import load_config
    from rlkube.runtime.infra.errors import Terminated
    from rlkube.runtime.infra import sigterm
    from rlkube.runtime.infra.sigterm import stop_while_starting
    from rlkube.runtime.trainers.dpo import TrainerHooks, train

    stop_while_starting()
    seen = threading.Semaphore(0)
    handle = sigterm.SigtermFlag._handle
    def noted(self, signum, frame):
        handle(self, signum, frame)
        seen.release()
    sigterm.SigtermFlag._handle = noted

    def held(step):
        seen.acquire(timeout=300)  # the first SIGTERM, which stopped the loop
        print(json.dumps({"event": "writerHeld", "step": step}), flush=True)
        seen.acquire(timeout=300)  # the second

    try:
        train(load_config(sys.argv[1]), hooks=TrainerHooks(before_checkpoint_commit=held))
    except Terminated:
        sys.exit(143)
    """
)


def test_a_second_sigterm_while_the_stop_save_is_written_does_not_end_the_process_before_its_commit(tmp_path):
    # steps far past the SIGTERM: the held save is the stop's, never the last step's
    path = write_config(tmp_path, tiny_config(tmp_path, training={"steps": 1000}, checkpoint={"everySteps": 1000}))
    proc = subprocess.Popen([sys.executable, "-c", HOLD_STOP_SAVE, str(path)], cwd=ROOT, env=runtime_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if any(r.get("event") == "step" and r["step"] >= 2 for r in records(line)):
            proc.send_signal(signal.SIGTERM)
            break
    wait_for_held(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]  # -15 before: the second SIGTERM ended it uncommitted
    stopped = latest(tmp_path / "ckpt")
    assert stopped is not None and stopped[0] >= 2
    assert any(r.get("event") == "checkpoint" and r["step"] == stopped[0] for r in records(out))
