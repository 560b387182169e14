"""The weights read ahead while the libraries import (infra/readahead.py): which files, the bound,
the off switch, and that the thread reads every byte of them."""

from __future__ import annotations

from pathlib import Path

from rlkube.runtime.cli import model_paths
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra import readahead
from rlkube.runtime.infra.readahead import start_readahead, weight_files


def _write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_weight_files_are_the_models_safetensors_and_the_newest_committed_checkpoint(tmp_path):
    model = tmp_path / "model"
    shards = [_write(model / "model-00002.safetensors", 10), _write(model / "model-00001.safetensors", 10)]
    _write(model / "config.json", 2)  # not weights
    ckpt = tmp_path / "ckpt"
    _write(ckpt / "step-000000010" / "rlkube-checkpoint.json", 2)
    _write(ckpt / "step-000000010" / "__0_0.distcp", 5)
    newest = [_write(ckpt / "step-000000020" / "rlkube-checkpoint.json", 2),
              _write(ckpt / "step-000000020" / "__0_0.distcp", 5),
              _write(ckpt / "step-000000020" / "compile-artifacts" / "rank0.bin", 3)]
    _write(ckpt / "step-000000030" / "__0_0.distcp", 5)  # no metadata: not committed, never read
    found = weight_files([str(model), str(model), None], str(ckpt))
    assert found == [p.resolve() for p in sorted(shards)] + sorted(p.resolve() for p in newest)


def test_readahead_reads_every_file_on_its_thread(tmp_path, monkeypatch):
    files = [_write(tmp_path / "m" / f"w{i}.safetensors", readahead.CHUNK_BYTES + 17) for i in range(2)]
    read: list[int] = []
    original = readahead._read_all

    def counting(paths, result):
        for p in paths:
            read.append(len(Path(p).read_bytes()))
        original(paths, result)

    monkeypatch.setattr(readahead, "_read_all", counting)
    result = start_readahead([str(tmp_path / "m")], None, environ={})
    result.wait(30)
    assert result.skipped is None and result.bytes == sum(f.stat().st_size for f in files)
    assert read == [f.stat().st_size for f in files] and result.seconds is not None


def test_off_switch_and_memory_bound(tmp_path, monkeypatch):
    _write(tmp_path / "m" / "w.safetensors", 1000)
    off = start_readahead([str(tmp_path / "m")], None, environ={"RLKUBE_READAHEAD": "0"})
    assert off.thread is None and "RLKUBE_READAHEAD=0" in off.skipped
    monkeypatch.setattr(readahead, "available_bytes", lambda: 1500)  # 1000 bytes > half of 1500
    bounded = start_readahead([str(tmp_path / "m")], None, environ={})
    assert bounded.thread is None and "over half" in bounded.skipped
    assert start_readahead([str(tmp_path / "none")], None, environ={}).skipped == "no weight files"


def test_model_paths_names_the_actor_and_every_role_model(tmp_path):
    config = RuntimeConfig.model_validate({
        "algorithm": "ppo", "model": {"path": "/models/actor"},
        "roles": {"actor": {"gpus": 1}, "critic": {"colocateWith": "actor"},
                  "reward": {"gpus": 0, "model": {"path": "/models/rm"}}},
        "data": {"source": "/data/p.jsonl"}, "checkpoint": {"dir": str(tmp_path)},
    })
    assert model_paths(config) == ["/models/actor", "/models/rm"]
