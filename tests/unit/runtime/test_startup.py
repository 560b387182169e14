"""The start-up split: import, model load, first step."""

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


def test_allocator_env_expandable_segments_unless_the_user_chose():
    from rlkube.runtime.infra.startup import ALLOCATOR_CONF, allocator_env

    assert allocator_env({}) == {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATOR_CONF}
    assert allocator_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == {}
    assert allocator_env({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) == {}
