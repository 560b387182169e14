"""A checkpoint read on several threads (infra/checkpoint_reader.py) gives what DCP's own reader
gives: every tensor bit for bit, the non-tensor objects, and a damaged shard is an error."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from rlkube.runtime.infra.checkpoint_reader import ParallelReader


def saved_state(path) -> dict:
    gen = torch.Generator().manual_seed(0)
    state = {
        "model": {f"layer{i}.weight": torch.randn(64, 48, generator=gen).to(torch.bfloat16) for i in range(6)}
        | {"head.bias": torch.randn(300, generator=gen)},
        "optim": {f"layer{i}.exp_avg": torch.randn(64, 48, generator=gen) for i in range(6)}
        | {"step": torch.tensor(12.0)},
        "trainer": {"seed": 7, "budgets": [4096, 2048]},  # a non-tensor object: DCP's own read
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "a single process"
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return state


def empty_like(state: dict) -> dict:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
            "optim": {k: torch.zeros_like(v) for k, v in state["optim"].items()},
            "trainer": {"seed": 0, "budgets": []}}


def load(path, target: dict, reader) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=reader, no_dist=True)
    return target


def test_threads_read_every_tensor_and_object_as_dcps_own_reader(tmp_path, monkeypatch):
    state = saved_state(tmp_path / "ckpt")
    names = set()
    read = ParallelReader._read_tensor

    def recording(self, item, planner):
        names.add(threading.current_thread().name)
        return read(self, item, planner)

    monkeypatch.setattr(ParallelReader, "_read_tensor", recording)
    ours = load(tmp_path, empty_like(state), ParallelReader(tmp_path / "ckpt", threads=3))
    theirs = load(tmp_path, empty_like(state), dcp.FileSystemReader(str(tmp_path / "ckpt")))
    for group in ("model", "optim"):
        for key, value in state[group].items():
            assert torch.equal(ours[group][key], value), key
            assert torch.equal(ours[group][key], theirs[group][key]), key
            assert ours[group][key].dtype == value.dtype
    assert ours["trainer"] == theirs["trainer"] == {"seed": 7, "budgets": [4096, 2048]}
    assert names and all(n.startswith("checkpoint-read") for n in names)


def test_a_damaged_shard_is_an_error_not_a_partly_loaded_model(tmp_path):
    state = saved_state(tmp_path / "ckpt")
    (shard,) = (tmp_path / "ckpt").glob("*.distcp")
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[: len(data) // 2]))  # a write cut short
    with pytest.raises(CheckpointException, match="corrupted"):  # DCP carries the thread's error
        load(tmp_path, empty_like(state), ParallelReader(tmp_path / "ckpt"))
