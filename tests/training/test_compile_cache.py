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


def test_a_restart_with_an_empty_cache_directory_loads_the_graphs_its_checkpoint_carries(tmp_path):
    # A restarted pod whose cache directory is new (an emptyDir, another node's hostPath): the
    # compiled graphs come from the artifacts inside the checkpoint it resumes from.
    from rlkube.runtime.infra.compile_artifacts import artifact_name

    cfg = tiny_config(tmp_path, training={"steps": 1, "lr": 1e-2, "seed": 0},
                      batching={"globalBatch": 8, "mode": "fixed", "maxMicroBatch": 8, "minMicroBatch": 1},
                      checkpoint={"compileCacheDir": str(tmp_path / "cache-of-pod-1")})
    cfg["model"]["compile"] = "layers"
    rc, recs, err = run_cli(write_config(tmp_path, cfg), timeout=300, TORCHINDUCTOR_CACHE_DIR="")
    assert rc == 0, err[-2000:]
    cold = first_step(recs)
    assert cold["compileCache"]["misses"] > 0 and "loaded" not in cold["compileCache"]
    split = cold["startupSeconds"]
    assert 0 < split["compile"] <= split["firstStep"]  # measured by torch's timers, inside the first step
    assert "restore" not in split  # nothing to resume from
    artifacts = tmp_path / "ckpt" / "step-000000001" / artifact_name(0)
    assert artifacts.stat().st_size > 0
    (save,) = [r for r in recs if r.get("event") == "checkpointSave"]
    assert 0 < save["compileArtifactsSeconds"] <= save["stallSeconds"]  # collecting them: part of the stall

    cfg["training"]["steps"] = 2
    cfg["checkpoint"]["compileCacheDir"] = str(tmp_path / "cache-of-pod-2")  # empty
    rc, recs, err = run_cli(write_config(tmp_path, cfg), timeout=300, TORCHINDUCTOR_CACHE_DIR="")
    assert rc == 0, err[-2000:]
    warm = first_step(recs)
    assert warm["step"] == 2
    assert warm["compileCache"]["hits"] > 0 and warm["compileCache"]["misses"] == 0, warm["compileCache"]
    assert warm["compileCache"]["loaded"] == str(artifacts)
    # the checkpoint and its artifacts, read inside the build
    assert 0 < warm["startupSeconds"]["restore"] <= warm["startupSeconds"]["modelLoad"]
    # the new checkpoint carries them on (what was loaded counts as this attempt's work)
    assert (tmp_path / "ckpt" / "step-000000002" / artifact_name(0)).stat().st_size > 0
