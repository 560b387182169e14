"""The start-up split: import, data load, model load, first step (its compile and decode capture); and
what the run path imports."""

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


def test_startup_split_cuts_the_data_wait_out_of_the_build_and_names_the_first_steps_compile_and_capture():
    from rlkube.runtime.infra.startup import StartupClock, startup_split

    marks = {"import": 12.0, "modelLoad": 20.0, "firstStep": 50.0}
    parts = {"dataLoad": 3.0, "dataWait": 0.5, "compile": 21.5, "decodeCapture": 1.25}
    split = startup_split(10.0, marks, parts)
    # dataLoad ran beside the build: only the 0.5 s the build waited for it comes out of modelLoad
    assert split == {"import": 2.0, "dataLoad": 3.0, "dataWait": 0.5, "modelLoad": 7.5, "firstStep": 30.0,
                     "compile": 21.5, "decodeCapture": 1.25, "total": 40.0}
    assert split["total"] == split["import"] + split["dataWait"] + split["modelLoad"] + split["firstStep"]
    # loaded before the models (serial): the wait is the whole load, as before the overlap
    assert startup_split(10.0, {"import": 12.0, "modelLoad": 20.0}, {"dataLoad": 3.0, "dataWait": 3.0}) == {
        "import": 2.0, "dataLoad": 3.0, "dataWait": 3.0, "modelLoad": 5.0, "total": 10.0}
    # before the first step: no first-step parts, and the total runs to the build's end
    assert startup_split(10.0, {"import": 12.0, "modelLoad": 20.0}, {"dataLoad": 3.0, "compile": 4.0}) == {
        "import": 2.0, "dataLoad": 3.0, "modelLoad": 8.0, "total": 10.0}
    # a resumed run's restore: a share of modelLoad, as reported
    assert startup_split(10.0, {"import": 12.0, "modelLoad": 20.0}, {"restore": 3.5}) == {
        "import": 2.0, "modelLoad": 8.0, "restore": 3.5, "total": 10.0}
    # a part never exceeds the stage it is inside; nothing compiled: no compile key
    assert startup_split(0.0, {"import": 1.0, "modelLoad": 2.0, "firstStep": 3.0}, {"dataWait": 5.0})[
        "modelLoad"] == 0.0
    assert "compile" not in startup_split(0.0, {"import": 1.0, "modelLoad": 2.0, "firstStep": 3.0}, {})

    times = iter([1.0, 1.25, 1.75, 4.0])
    clock = StartupClock(started=0.0, clock=lambda: next(times))
    clock.mark("import")
    with clock.within("dataLoad", "dataWait"):
        pass
    clock.mark("modelLoad")
    assert clock.seconds() == {"import": 1.0, "dataLoad": 0.5, "dataWait": 0.5, "modelLoad": 2.5, "total": 4.0}
    with pytest.raises(ValueError, match="unknown start-up part"):
        clock.add("warmup", 1.0)


def test_in_background_returns_the_value_and_counts_its_own_time_and_the_wait_once():
    import threading

    from rlkube.runtime.infra.startup import InBackground

    release, calls = threading.Event(), []

    def load():
        calls.append(threading.current_thread().name)
        assert release.wait(10)
        return [1, 2, 3]

    pending = InBackground(load, "data", serial=False)
    release.set()
    assert pending.result() == [1, 2, 3]
    assert calls == ["rlkube-data"]  # on a thread of its own, called once
    assert pending.seconds >= 0 and pending.waited >= 0
    waited = pending.waited
    assert pending.result() == [1, 2, 3] and pending.waited == waited  # joined once: no second wait
    assert pending.error() is None and calls == ["rlkube-data"]


def test_in_background_raises_the_threads_exception_unchanged_with_its_traceback():
    import traceback

    from rlkube.runtime.infra.errors import DataError
    from rlkube.runtime.infra.startup import InBackground

    def bad_line():
        raise DataError("data.source: /x/train.jsonl:3: field 'prompt' missing")

    pending = InBackground(bad_line, "data", serial=False)
    with pytest.raises(DataError) as first:
        pending.result()
    assert str(first.value) == "data.source: /x/train.jsonl:3: field 'prompt' missing"
    assert "bad_line" in [f.name for f in traceback.extract_tb(first.value.__traceback__)]  # the thread's frame
    with pytest.raises(DataError) as second:  # every call raises the same object
        pending.result()
    assert second.value is first.value and pending.error() is first.value


def test_in_background_serial_runs_the_call_at_once_and_raises_from_the_constructor(monkeypatch):
    import threading

    from rlkube.runtime.infra.startup import ENV_SERIAL_STARTUP, InBackground

    ticks = iter([10.0, 12.5])
    monkeypatch.setenv(ENV_SERIAL_STARTUP, "1")
    pending = InBackground(lambda: threading.current_thread().name, "data", clock=lambda: next(ticks))
    assert pending.result() == threading.current_thread().name  # ran here, before the constructor returned
    assert pending.seconds == pending.waited == 2.5
    with pytest.raises(KeyError):
        InBackground(lambda: {}["x"], "data")


def test_the_split_reaches_status_progress_with_only_known_non_negative_seconds():
    import datetime as dt

    from rlkube.operator.render.status import progress_status

    report = {"step": 1, "startupSeconds": {"import": 2.0, "dataLoad": 0.1234567, "dataWait": 0.05, "restore": 1.5,
                                            "firstStep": 9.0, "compile": -1.0, "bogus": 3.0, "total": float("nan")}}
    out = progress_status(report, dt.datetime(2026, 12, 6, tzinfo=dt.UTC))
    assert out["startupSeconds"] == {"import": 2.0, "dataLoad": 0.123, "dataWait": 0.05, "restore": 1.5,
                                     "firstStep": 9.0}
    assert "startupSeconds" not in progress_status({"step": 1, "startupSeconds": "x"}, dt.datetime.now(dt.UTC))


def test_compile_cache_goes_next_to_the_checkpoints_unless_the_user_set_one():
    from rlkube.runtime.infra.startup import COMPILE_CACHE, compile_cache_env

    here = f"/ckpt/{COMPILE_CACHE}"
    assert compile_cache_env("/ckpt", {}) == {"TORCHINDUCTOR_CACHE_DIR": here, "TRITON_CACHE_DIR": f"{here}/triton"}
    assert compile_cache_env("/ckpt", {"TORCHINDUCTOR_CACHE_DIR": ""})["TORCHINDUCTOR_CACHE_DIR"] == here
    assert compile_cache_env("/ckpt", {"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == {}
    assert compile_cache_env("/ckpt", {"TRITON_CACHE_DIR": "/t"}) == {"TORCHINDUCTOR_CACHE_DIR": here}


def test_compile_cache_dir_puts_the_cache_where_other_jobs_find_it_unless_the_environment_says():
    from rlkube.runtime.contract.pod import ENV_COMPILE_CACHE
    from rlkube.runtime.infra.startup import compile_cache_env

    def inductor(*args):
        return compile_cache_env(*args).get("TORCHINDUCTOR_CACHE_DIR")

    assert inductor("/ckpt", {}, "/shared/compile") == "/shared/compile"
    assert compile_cache_env("/ckpt", {"TORCHINDUCTOR_CACHE_DIR": "/mine"}, "/shared/compile") == {}
    assert inductor("", {}, "/shared/compile") == "/shared/compile"
    # the cluster's cache volume (the chart's compileCache) when the job names none
    assert inductor("/ckpt", {ENV_COMPILE_CACHE: "/var/cache/rlkube"}) == "/var/cache/rlkube"
    assert inductor("/ckpt", {ENV_COMPILE_CACHE: "/var/cache/rlkube"}, "/shared/compile") == "/shared/compile"


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


def test_data_beside_counts_its_load_and_wait_once_and_puts_a_data_error_before_the_builds():
    from rlkube.runtime.infra.errors import DataError
    from rlkube.runtime.infra.startup import DataBeside, StartupClock

    clock = StartupClock(started=0.0)
    data = DataBeside(clock, lambda: [7])
    assert data.ready() == [7] and data.ready() == [7]
    assert set(clock.parts) == {"dataLoad", "dataWait"}
    counted = dict(clock.parts)
    data.ready()
    assert clock.parts == counted  # the first ready() counted, once

    def bad():
        raise DataError("data.source: /x/train.jsonl:2: not JSON")

    with pytest.raises(DataError, match="not JSON"):  # the build's error waits for the data and gives way
        with DataBeside(StartupClock(started=0.0), bad).errors_first():
            raise RuntimeError("the model cannot be built")
    with pytest.raises(RuntimeError, match="cannot be built"):  # good data: the build's own error
        with DataBeside(StartupClock(started=0.0), lambda: [7]).errors_first():
            raise RuntimeError("the model cannot be built")
