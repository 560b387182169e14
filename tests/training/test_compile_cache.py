"""A restarted trainer compiles from the cache next to its checkpoints: the first attempt's
torch.compile graphs (inductor's FX graph and AOTAutograd caches) are written under
checkpoint.dir/.compile-cache, and a second process on the same checkpoint directory, resuming
there, finds them (its first step logs cache hits, no misses). On CPU inductor compiles C++, so
each run pays ~10-30 s on 2 cores; the figure that matters, a 1.5B model's 32-35 s first step on
an H200, is in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from rlkube.runtime.infra.startup import COMPILE_CACHE

from .conftest import run_cli, tiny_config, write_config

pytestmark = pytest.mark.slow


def first_step(recs: list[dict]) -> dict:
    return next(r for r in recs if r.get("event") == "step")


def test_a_resumed_trainer_compiles_from_the_cache_next_to_its_checkpoints(tmp_path):
    cfg = tiny_config(tmp_path, training={"steps": 1, "lr": 1e-2, "seed": 0},
                      batching={"globalBatch": 8, "mode": "fixed", "maxMicroBatch": 8, "minMicroBatch": 1})
    cfg["model"]["compile"] = "layers"
    rc, recs, err = run_cli(write_config(tmp_path, cfg), timeout=300, TORCHINDUCTOR_CACHE_DIR="")
    assert rc == 0, err[-2000:]
    cold = first_step(recs)["compileCache"]
    assert cold["misses"] > 0 and cold["hits"] == 0
    assert any((tmp_path / "ckpt" / COMPILE_CACHE).iterdir())

    cfg["training"]["steps"] = 2  # the same job, resumed at step 1: its next step is this process's first
    rc, recs, err = run_cli(write_config(tmp_path, cfg), timeout=300, TORCHINDUCTOR_CACHE_DIR="")
    assert rc == 0, err[-2000:]
    warm = first_step(recs)
    assert warm["step"] == 2
    assert warm["compileCache"]["hits"] > 0 and warm["compileCache"]["misses"] == 0, warm["compileCache"]


def test_a_second_job_compiles_from_the_cache_the_first_job_left_in_compile_cache_dir(tmp_path):
    # Two jobs, each with its own checkpoint directory, one shared checkpoint.compileCacheDir (a
    # volume both mount, in a cluster): the second job's first step loads the first job's graphs.
    shared = tmp_path / "shared-compile-cache"
    recs_of = {}
    for job in ("first", "second"):
        cfg = tiny_config(tmp_path / job, training={"steps": 1, "lr": 1e-2, "seed": 0},
                          batching={"globalBatch": 8, "mode": "fixed", "maxMicroBatch": 8, "minMicroBatch": 1},
                          checkpoint={"compileCacheDir": str(shared)})
        cfg["model"]["compile"] = "layers"
        (tmp_path / job).mkdir()
        rc, recs, err = run_cli(write_config(tmp_path / job, cfg), timeout=300, TORCHINDUCTOR_CACHE_DIR="")
        assert rc == 0, err[-2000:]
        recs_of[job] = first_step(recs)["compileCache"]
    assert recs_of["first"]["misses"] > 0 and recs_of["first"]["hits"] == 0
    assert recs_of["second"]["hits"] > 0 and recs_of["second"]["misses"] == 0, recs_of["second"]
    assert not (tmp_path / "second" / "ckpt" / COMPILE_CACHE).exists()  # nothing next to its checkpoints
