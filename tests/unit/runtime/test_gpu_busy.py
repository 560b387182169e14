"""GPU busy sampling with a fake NVML source and clock: windowed means, phases, no NVML."""

import logging
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.gpu_busy import BusySampler, BusyWindow, gather_busy, sampler_for
from rlkube.runtime.infra.metrics import BusyGauges


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def driven(values):
    """A sampler over `values` (one per 0.1 s tick) and a function taking the next k samples."""
    clock = FakeClock()
    feed = iter(values)
    sampler = BusySampler(lambda: next(feed), clock=clock)

    def tick(k):
        for _ in range(k):
            clock.now += 0.1
            sampler.sample_once()

    return sampler, clock, tick


def test_window_is_the_mean_of_the_samples_since_the_last_window():
    # step 1: four samples, the instant after a synchronize would read 0.04 (the last one)
    sampler, _, tick = driven([0.9, 0.8, 0.7, 0.04, 0.5, 0.5])
    tick(4)
    w = sampler.window()
    assert w.mean == pytest.approx((0.9 + 0.8 + 0.7 + 0.04) / 4)
    assert w.samples == 4 and w.seconds == pytest.approx(0.4)
    tick(2)
    assert sampler.window().mean == pytest.approx(0.5)  # the next window starts empty
    assert sampler.window().mean is None  # nothing sampled: None, not 0


def test_phase_means_cover_only_the_samples_inside_each_phase():
    sampler, clock, tick = driven([1.0, 1.0, 1.0, 0.0, 0.0, 0.2, 0.4, 0.6, 0.0])
    with sampler.phase("generate"):
        tick(3)
    with sampler.phase("data_wait"):
        tick(2)
    with sampler.phase("forward_backward"):
        tick(2)
    with sampler.phase("forward_backward"):  # entered again (the next micro-batch)
        tick(1)
    with sampler.phase("optimizer"):
        clock.now += 0.01  # shorter than the sample period: no sample
    tick(1)  # outside any phase: counts for the step only
    w = sampler.window()
    assert w.phases["generate"] == pytest.approx(1.0)
    assert w.phases["data_wait"] == pytest.approx(0.0)
    assert w.phases["forward_backward"] == pytest.approx((0.2 + 0.4 + 0.6) / 3)
    assert w.phases["optimizer"] is None
    assert w.phase_seconds["forward_backward"] == pytest.approx(0.3)
    assert w.mean == pytest.approx(4.2 / 9)
    assert "generate" not in sampler.window().phases  # phases reset with the window


def test_unknown_phase_is_an_error():
    sampler, _, _ = driven([])
    with pytest.raises(ValueError, match="unknown GPU busy phase 'train'"):
        with sampler.phase("train"):
            pass


def test_source_reading_none_is_skipped():
    sampler, _, tick = driven([0.5, None, 0.7])
    tick(3)
    w = sampler.window()
    assert w.samples == 2 and w.mean == pytest.approx(0.6)


def test_thread_samples_the_source_until_closed():
    seen = threading.Event()
    count = [0]

    def source():
        count[0] += 1
        if count[0] >= 5:
            seen.set()
        return 0.25

    sampler = BusySampler(source, hz=200).start()
    assert seen.wait(timeout=10)
    sampler.close()
    w = sampler.window()
    assert w.samples >= 5 and w.mean == pytest.approx(0.25)


def test_no_gpu_reports_none_without_a_warning(caplog):
    # tests/conftest.py's runtime_log_state gives every test the logger and the warn-once keys
    # as a fresh process has them.
    import torch

    caplog.set_level(logging.WARNING, logger="rlkube.runtime")
    a = sampler_for(torch.device("cpu"))
    b = sampler_for(torch.device("cpu"))
    assert not a.available
    with a.phase("generate"):
        pass
    w = a.window()
    assert w.mean is None and w.phases == {"generate": None}
    assert b.window().mean is None
    # nothing a user could act on (a CPU has no GPU to sample): no warning; the summary says it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    a.close()


def test_gather_on_one_process_and_the_prometheus_series():
    ctx = DistContext()
    job = gather_busy(ctx, BusyWindow(mean=0.5, seconds=1.0, samples=10, phases={"generate": 0.9, "optimizer": None}))
    assert job.ranks == [{"step": 0.5, "data_wait": None, "generate": 0.9, "score": None,
                          "forward_backward": None, "optimizer": None, "checkpoint": None, "eval": None}]
    assert job.step_min == 0.5 and job.phase_means() == {"generate": 0.9}
    from rlkube.runtime.infra.gpu_busy import step_fields

    window = BusyWindow(0.5, 1.0, 10, {"generate": 0.9}, {"generate": 0.61234})
    assert step_fields(job, window) == {"gpuUtilization": 0.5, "gpuBusyPhases": {"generate": 0.9},
                                        "phaseSeconds": {"generate": 0.6123}}
    registry = CollectorRegistry()
    gauges = BusyGauges(registry, {"actor": [0], "reference": [0]})
    gauges.set(job.ranks)
    text = generate_latest(registry).decode()
    assert 'rlkube_gpu_busy_ratio{phase="generate",rank="0",role="actor+reference"} 0.9' in text
    assert 'phase="optimizer"' not in text


def test_job_view_takes_the_least_busy_rank():
    from rlkube.runtime.infra.gpu_busy import JobBusy

    job = JobBusy([{"step": 0.8, "generate": 0.9}, {"step": 0.3, "generate": None}, {"step": None}])
    assert job.step_min == 0.3
    assert job.phase_means() == {"generate": 0.9}

