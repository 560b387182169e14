"""Background checkpoint writes on 2 gloo processes with an FSDP2-sharded model: staged, written
by a writer thread on its own group, committed once after both ranks' shards, and resharded on
load into one process with the weights of the step it was staged at."""

import os
import shutil
import socket

import torch
import torch.multiprocessing as mp

from rlkube.runtime.engine.models import shard
from rlkube.runtime.infra.checkpoint import Checkpointer, committed
from rlkube.runtime.infra.distributed import DistContext, all_reduce_sum, init_from_env, shutdown


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


def worker(rank: int, port: int, root: str, results) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ctx = init_from_env({"actor": [0, 1]})
    torch.manual_seed(0)
    model = shard(Layers(), ctx, "actor")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = Checkpointer(root, keep=3, ctx=ctx, background=True)
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


def test_two_ranks_commit_once_and_the_checkpoint_reshards_into_one_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.start_processes(worker, args=(port, str(tmp_path), results), nprocs=2, join=True, start_method="fork")
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
