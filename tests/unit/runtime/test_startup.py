"""The start-up split: import, model load, first step; and what the run path imports."""

import json
import subprocess
import sys

import pytest


def test_startup_split_counts_each_stage_from_the_previous_mark():
    from rlkube.runtime.infra.startup import StartupClock, process_start_time

    times = iter([12.5, 20.0, 23.0, 99.0])
    clock = StartupClock(started=10.0, clock=lambda: next(times))
    assert clock.seconds() == {}
    clock.mark("import")
    clock.mark("modelLoad")
    assert clock.seconds() == {"import": 2.5, "modelLoad": 7.5, "total": 10.0}
    clock.mark("firstStep")
    clock.mark("firstStep")  # later steps do not move it
    assert clock.seconds() == {"import": 2.5, "modelLoad": 7.5, "firstStep": 3.0, "total": 13.0}
    with pytest.raises(ValueError, match="unknown start-up stage"):
        clock.mark("warmup")
    import time

    assert 0 <= time.time() - process_start_time() < 3600  # this test process started before now


def test_compile_cache_goes_next_to_the_checkpoints_unless_the_user_set_one():
    from rlkube.runtime.infra.startup import COMPILE_CACHE, compile_cache_env

    assert compile_cache_env("/ckpt", {}) == {"TORCHINDUCTOR_CACHE_DIR": f"/ckpt/{COMPILE_CACHE}"}
    assert compile_cache_env("/ckpt", {"TORCHINDUCTOR_CACHE_DIR": ""}) == {"TORCHINDUCTOR_CACHE_DIR": f"/ckpt/{COMPILE_CACHE}"}
    assert compile_cache_env("/ckpt", {"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == {}


def test_compile_cache_dir_puts_the_cache_where_other_jobs_find_it_unless_the_environment_says():
    from rlkube.runtime.infra.startup import compile_cache_env

    assert compile_cache_env("/ckpt", {}, "/shared/compile") == {"TORCHINDUCTOR_CACHE_DIR": "/shared/compile"}
    assert compile_cache_env("/ckpt", {"TORCHINDUCTOR_CACHE_DIR": "/mine"}, "/shared/compile") == {}
    assert compile_cache_env("", {}, "/shared/compile") == {"TORCHINDUCTOR_CACHE_DIR": "/shared/compile"}


def test_allocator_env_expandable_segments_unless_the_user_chose():
    from rlkube.runtime.infra.startup import ALLOCATOR_CONF, allocator_env

    assert allocator_env({}) == {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATOR_CONF}
    assert allocator_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == {}
    assert allocator_env({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) == {}


# What the run path must not load by being imported, measured on a CPU host on top of torch and a
# model's transformers modules (which the model load needs anyway): peft 0.14 s (only a LoRA role
# uses it: engine/lora.py imports it there), kubernetes 0.34 s and datasets 0.46 s (the runtime
# uses neither). Transitive imports count too, which the import-linter contracts do not follow.
NOT_ON_THE_RUN_PATH = {"peft", "kubernetes", "datasets"}


def packages_after(code: str) -> set[str]:
    """The top-level packages in sys.modules once `code` has run in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_entry_point_imports_no_torch():
    # /healthz answers, and a bad config exits 3, before torch loads (cli.main, serve_health_early).
    assert packages_after("import rlkube.runtime.__main__") & {"torch", "transformers"} == set()


def test_importing_the_trainers_loads_nothing_a_run_may_not_need():
    from rlkube.runtime.contract.algorithms import ALGORITHMS

    code = "\n".join(f"import {module}" for module in sorted({entry.trainer for entry in ALGORITHMS.values()}))
    assert packages_after(code) & NOT_ON_THE_RUN_PATH == set()
