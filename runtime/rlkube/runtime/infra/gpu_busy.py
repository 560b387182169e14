"""GPU busy time the way DCGM reports it (DCGM_FI_DEV_GPU_UTIL), per step and per phase.

NVML's utilization is the fraction of the last sample period (1/6 s to 1 s, by product) in which
a kernel ran. One read right after a `synchronize` says little about the step: it covers only the
last instant, often the idle tail. So a daemon thread reads the counter at `SAMPLE_HZ` and keeps
the timestamped samples; the trainer marks phases (`with busy.phase("generate"): ...`) and calls
`busy.window()` once a step, which returns the mean of the samples taken since the previous
window, overall and per phase. Samples come at a fixed rate, so a plain mean of the samples in an
interval is its time-weighted busy fraction. A sample belongs to the interval (a, b] its
timestamp falls in: a reading describes the period that ends when it is taken.

What a window covers: everything since the previous window, so the time the loop spends in a
checkpoint save after step N (phase "checkpoint") shows up in step N+1's window. A phase shorter
than the sample period may hold no sample: its mean is None, not a guess.

The source is injectable: `BusySampler(source=..., clock=...)` with a fake source and clock
drives it without a GPU (`sample_once` takes one sample on the caller's thread). Without a GPU or
without NVML the sampler has no source: it reports None and never raises; a GPU without NVML
warns once (installing pynvml fixes it), a CPU run does not (there is nothing to fix).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rlkube.runtime.infra.log import warn_once

SAMPLE_HZ = 10.0
MAX_SAMPLES = 1 << 16  # ~110 minutes at 10 Hz between two windows; older samples are dropped
# The phases every trainer may mark; fixed so ranks can exchange them as one vector.
PHASES = ("data_wait", "generate", "score", "forward_backward", "optimizer", "checkpoint", "eval")

Source = Callable[[], "float | None"]


@dataclass(frozen=True)
class BusyWindow:
    """Mean GPU busy fraction (0..1) over one window, overall and per phase (None: no sample)."""

    mean: float | None
    seconds: float
    samples: int
    phases: dict[str, float | None] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def nvml_source(device_index: int) -> Source | None:
    """A reader of device `device_index`'s utilization through NVML; None (warned) without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        pynvml.nvmlDeviceGetUtilizationRates(handle)
    except Exception as e:  # no driver, no library, a container without the device node
        warn_once("nvml", f"GPU busy sampling needs NVML ({type(e).__name__}: {e}); GPU utilization is reported as None")
        return None

    def read() -> float | None:
        try:
            return pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        except Exception:
            return None

    return read


class BusySampler:
    """Samples a busy source on a daemon thread; windows and phases over the samples."""

    def __init__(self, source: Source | None, hz: float = SAMPLE_HZ,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.interval = 1.0 / hz
        self.clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._spans: list[tuple[str, float, float]] = []  # closed phase intervals of this window
        self._window_start = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.source is not None

    # -- sampling -------------------------------------------------------------------------
    def sample_once(self) -> None:
        """Take one sample now (the thread's body; tests call it to drive a fake source)."""
        if self.source is None:
            return
        value = self.source()
        if value is None:
            return
        now = self.clock()
        with self._lock:
            self._samples.append((now, float(value)))

    def start(self) -> BusySampler:
        if self.source is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlkube-gpu-busy", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval + 1.0)
            self._thread = None

    # -- phases and windows ---------------------------------------------------------------
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark the code inside as phase `name` (a phase may be entered many times a window)."""
        if name not in PHASES:
            raise ValueError(f"unknown GPU busy phase {name!r}: one of {PHASES}")
        start = self.clock()
        try:
            yield
        finally:
            end = self.clock()
            with self._lock:
                self._spans.append((name, start, end))

    def window(self) -> BusyWindow:
        """Means since the previous window (or since start); starts the next window."""
        now = self.clock()
        with self._lock:
            start, spans = self._window_start, self._spans
            samples = [(t, v) for t, v in self._samples if start < t <= now]
            self._samples.clear()
            self._spans = []
            self._window_start = now
        phases: dict[str, list[float]] = {}
        phase_seconds: dict[str, float] = {}
        for name, a, b in spans:
            phase_seconds[name] = phase_seconds.get(name, 0.0) + (b - a)
            phases.setdefault(name, []).extend(v for t, v in samples if a < t <= b)
        return BusyWindow(
            mean=_mean([v for _, v in samples]),
            seconds=now - start,
            samples=len(samples),
            phases={name: _mean(values) for name, values in phases.items()},
            phase_seconds=phase_seconds,
        )


def sampler_for(device) -> BusySampler:
    """The started sampler of `device` (a torch.device): NVML on CUDA, no source elsewhere."""
    if getattr(device, "type", "cpu") != "cuda":
        # Nothing a user could change: a CPU run has no GPU to sample. No warning; the run's
        # summary says so once, and the fields are null.
        return BusySampler(None)
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return BusySampler(nvml_source(physical_index(index))).start()


def physical_index(cuda_index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    import os

    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


@dataclass(frozen=True)
class JobBusy:
    """One window seen by the whole job: every rank's means, and what the step reports."""

    ranks: list[dict[str, float | None]]  # per rank: "step" (the window's mean) and each phase

    @property
    def step_min(self) -> float | None:
        """The least busy rank's mean: the batcher and /progress take the worst GPU, which holds
        the others at every collective."""
        values = [r["step"] for r in self.ranks if r.get("step") is not None]
        return min(values) if values else None

    def phase_means(self) -> dict[str, float]:
        """Per phase, the mean over the ranks that sampled it (phases nobody sampled left out)."""
        out = {}
        for name in PHASES:
            values = [r[name] for r in self.ranks if r.get(name) is not None]
            if values:
                out[name] = round(sum(values) / len(values), 4)
        return out


def step_fields(job: JobBusy, window: BusyWindow) -> dict:
    """What a step record shows of the window: `gpuUtilization` (the least busy rank's mean over
    the step), `gpuBusyPhases` (each phase's mean over ranks) and this rank's `phaseSeconds`."""
    return {
        "gpuUtilization": job.step_min,
        "gpuBusyPhases": job.phase_means(),
        "phaseSeconds": {k: round(v, 4) for k, v in window.phase_seconds.items()},
    }


def gather_busy(ctx, window: BusyWindow) -> JobBusy:
    """Every rank's window means on every rank: one all-reduce of a (ranks x (1 + phases)) vector
    where each rank fills its own row (value + 1, so 0 stands for "no sample"). Collective."""
    from rlkube.runtime.infra.distributed import all_reduce_sum

    names = ("step", *PHASES)
    mine = [window.mean, *(window.phases.get(p) for p in PHASES)]
    width = len(names)
    flat = [0.0] * (ctx.world_size * width)
    for k, value in enumerate(mine):
        flat[ctx.rank * width + k] = 0.0 if value is None else value + 1.0
    flat = all_reduce_sum(ctx, flat)
    ranks = []
    for r in range(ctx.world_size):
        row = flat[r * width : (r + 1) * width]
        ranks.append({n: (round(v - 1.0, 4) if v > 0 else None) for n, v in zip(names, row, strict=True)})
    return JobBusy(ranks)
