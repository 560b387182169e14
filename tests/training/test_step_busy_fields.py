"""The GPU busy sampler wired into the trainers: with a fake NVML source injected, a step record,
/progress and /metrics carry the step's busy fraction, per-phase busy and phase seconds, and the
start-up split; the batcher gets the windowed busy fraction.

The fake sampler takes one sample at the end of every phase it is asked to mark, on the caller's
thread, with a counter for a clock: how many samples a step holds, and in which phase each falls,
is then a function of the code path, not of timing.
"""

import itertools
from contextlib import contextmanager

import pytest
import torch
from prometheus_client import generate_latest

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.gpu_busy import BusySampler
from rlkube.runtime.trainers import reporting

from .conftest import tiny_config
from .rl_common import rl_config

BUSY = {"data_wait": 0.1, "generate": 0.8, "score": 0.6, "forward_backward": 0.9, "optimizer": 0.5,
        "checkpoint": 0.2}


class PhaseSampledBusy(BusySampler):
    """Reads BUSY[the phase being marked] once at the end of each phase."""

    def __init__(self) -> None:
        counter = itertools.count(1)
        super().__init__(source=lambda: BUSY[self.current], clock=lambda: float(next(counter)))
        self.current = ""
        self.closed = False

    @contextmanager
    def phase(self, name):
        with super().phase(name):
            yield
            self.current = name
            self.sample_once()

    def close(self) -> None:
        self.closed = True
        super().close()


@pytest.fixture
def served(monkeypatch):
    """The Progress objects the step loop creates (rank 0's /progress and /metrics)."""
    made = []

    class Captured(reporting.Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(reporting, "Progress", Captured)
    return made


def run(train, cfg):
    from rlkube.runtime.trainers.base import TrainerHooks

    samplers = []

    def make(device):
        samplers.append(PhaseSampledBusy())
        return samplers[-1]

    torch.set_num_threads(1)
    result = train(RuntimeConfig.model_validate(cfg), hooks=TrainerHooks(busy_sampler=make))
    assert len(samplers) == 1 and samplers[0].closed  # the sampler's thread stops with the run
    return result


def test_dpo_step_records_progress_and_metrics_show_busy_per_phase(tmp_path, served, monkeypatch):
    from rlkube.runtime.trainers import dpo
    from rlkube.runtime.trainers.batching import AdaptiveBatcher

    seen = []
    observe = AdaptiveBatcher.observe
    monkeypatch.setattr(AdaptiveBatcher, "observe", lambda self, m: seen.append(m) or observe(self, m))
    result = run(dpo.train, tiny_config(tmp_path, training={"steps": 3}))
    for rec in result.records:
        k = rec["microBatches"]
        # per step: k+1 waits for data (the last one finds the end), k micro-batches, one update
        samples = [BUSY["data_wait"]] * (k + 1) + [BUSY["forward_backward"]] * k + [BUSY["optimizer"]]
        assert rec["gpuUtilization"] == pytest.approx(sum(samples) / len(samples), abs=1e-4), rec["step"]
        assert rec["gpuBusyPhases"] == {p: BUSY[p] for p in ("data_wait", "forward_backward", "optimizer")}
        assert set(rec["phaseSeconds"]) == {"data_wait", "forward_backward", "optimizer"}
    assert [m.gpu_utilization for m in seen] == [r["gpuUtilization"] for r in result.records]
    assert [m.seconds for m in seen] == [r["seconds"] for r in result.records]

    first = result.records[0]["startupSeconds"]
    # nothing compiled on a CPU by default: no compile part; the data loads beside the build, which
    # counts only what it waited for it (dataWait) out of modelLoad
    assert set(first) == {"import", "dataLoad", "dataWait", "modelLoad", "firstStep", "total"}
    assert first["total"] == pytest.approx(first["import"] + first["dataWait"] + first["modelLoad"] + first["firstStep"],
                                           abs=0.01)
    assert 0 <= first["dataWait"] <= first["dataLoad"] + 0.002
    assert all("startupSeconds" not in r for r in result.records[1:])

    (progress,) = served
    doc = progress.snapshot()
    assert doc["phase"] == "succeeded" and doc["step"] == 3
    assert doc["gpuUtilization"] == result.records[-1]["gpuUtilization"]
    assert doc["gpuBusyPhases"] == result.records[-1]["gpuBusyPhases"]
    assert doc["phaseSeconds"] == result.records[-1]["phaseSeconds"]
    assert doc["startupSeconds"] == first
    metrics = generate_latest(progress.registry).decode()
    for phase in ("step", "data_wait", "forward_backward", "optimizer"):
        assert f'rlkube_gpu_busy_ratio{{phase="{phase}",rank="0",role="actor+reference"}}' in metrics, phase
    assert f'rlkube_gpu_busy_ratio{{phase="optimizer",rank="0",role="actor+reference"}} {BUSY["optimizer"]}' in metrics


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_step_records_show_every_stage_as_a_phase(tmp_path, algorithm):
    from rlkube.runtime.trainers.rl import train

    cfg = rl_config(tmp_path, algorithm, training={"steps": 2, "lr": 3e-3, "groupSize": 4, "seed": 0},
                    checkpoint={"dir": str(tmp_path / "ckpt"), "everySteps": 1})
    result = run(train, cfg)
    stages = {"data_wait", "generate", "score", "forward_backward", "optimizer"}
    first, second = result.records
    assert set(first["gpuBusyPhases"]) == stages and set(first["phaseSeconds"]) == stages
    # step 1's checkpoint is saved after its window closed: it shows in step 2's
    assert set(second["gpuBusyPhases"]) == stages | {"checkpoint"}
    assert second["gpuBusyPhases"] == {p: BUSY[p] for p in stages | {"checkpoint"}}
    # decodeCapture: the decode batch's set-up (its KV cache here; graphs are captured on CUDA only)
    assert set(first["startupSeconds"]) == {"import", "dataLoad", "dataWait", "modelLoad", "firstStep", "decodeCapture",
                                            "total"}
    assert 0 < first["startupSeconds"]["decodeCapture"] <= first["startupSeconds"]["firstStep"]
