"""Where the time from process start to the first trained step goes, and the build's one overlap.

A 1.5B model took 10-12 s from process start to the GPU's first busy sample, reported as one
`setupSeconds`. Split, it says what to fix (`startup_split`, the start record's and the first
step's `startupSeconds`, /progress and status.progress):
- import:        process start -> the trainer starts building (interpreter, torch, transformers,
                 the rendezvous);
- dataLoad:      reading and tokenising the data set (and the eval split): the wall time of the
                 thread that does it (`DataBeside`), which runs while the models load, so it
                 overlaps modelLoad and is not a share of the total;
- dataWait:      of dataLoad, the seconds the build blocked waiting for the data where it first
                 needed it (all of dataLoad when the data is loaded before the build goes on:
                 RLKUBE_SERIAL_STARTUP=1, or a trainer that needs the data first);
- modelLoad:     the rest of the build: models, optimizers, the memory plan, and restoring a
                 checkpoint (the build's wall time less dataWait), of which
  - restore:       a resumed run only: loading the checkpoint into the models and optimizers, and
                   torch.compile's artifacts saved with it (reported as a share of modelLoad);
- firstStep:     the first step, of which
  - compile:       seconds torch.compile spent compiling (forward and backward graphs, as torch's
                   own compile timers count them: measured, not estimated; a cache hit counts
                   its load), and
  - decodeCapture: seconds spent setting up decoding: its KV cache and, on CUDA, capturing the
                   decode step's graphs (PPO/GRPO's decodeCaptureSeconds);
- total:         process start -> the end of the first step (import + dataWait + modelLoad +
                 firstStep).

The process start comes from the kernel (/proc/self/stat) where there is one, so the import
share counts the interpreter's own start; elsewhere it counts from this module's import.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from rlkube.runtime.contract.pod import ENV_COMPILE_CACHE

_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """Wall-clock time this process started (Linux: from /proc; else when this module loaded)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5), counted after "pid (comm)"
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


class StartupClock:
    """Marks the end of each start-up stage, and times the parts inside a stage (`within`, `add`);
    `seconds()` is the split so far (startup_split)."""

    STAGES = ("import", "modelLoad", "firstStep")
    # dataLoad, dataWait and restore inside modelLoad's span (dataLoad beside the build, dataWait cut
    # out of it, restore a share of it), the others inside firstStep's
    PARTS = ("dataLoad", "dataWait", "restore", "compile", "decodeCapture")

    def __init__(self, started: float | None = None, clock=time.time) -> None:
        self.clock = clock
        self.started = process_start_time() if started is None else started
        self.marks: dict[str, float] = {}
        self.parts: dict[str, float] = {}

    def mark(self, stage: str) -> None:
        """`stage` ended now (a stage marked twice keeps its first end)."""
        if stage not in self.STAGES:
            raise ValueError(f"unknown start-up stage {stage!r}: one of {self.STAGES}")
        self.marks.setdefault(stage, self.clock())

    def add(self, part: str, seconds: float) -> None:
        """`seconds` more spent in `part` (one of PARTS)."""
        if part not in self.PARTS:
            raise ValueError(f"unknown start-up part {part!r}: one of {self.PARTS}")
        self.parts[part] = self.parts.get(part, 0.0) + max(seconds, 0.0)

    @contextmanager
    def within(self, *parts: str) -> Iterator[None]:
        """Within: time counted to each of `parts`."""
        t0 = self.clock()
        try:
            yield
        finally:
            seconds = self.clock() - t0
            for part in parts:
                self.add(part, seconds)

    def seconds(self) -> dict[str, float]:
        return startup_split(self.started, self.marks, self.parts)


def startup_split(started: float, marks: dict[str, float], parts: dict[str, float]) -> dict[str, float]:
    """The start-up split (module docstring) from the process start, the wall-clock end of each
    stage marked so far (import, modelLoad, firstStep), and the seconds of the parts timed inside
    them (dataLoad, dataWait and restore in the build, between the import and modelLoad marks;
    compile and decodeCapture in the first step). modelLoad is the build's span less dataWait;
    dataLoad, which ran beside the build, and restore, a share of it, are reported as they are.
    Stages are cut at the first unmarked one; `total` runs to the last mark. Seconds rounded to
    milliseconds, camelCase keys."""
    out: dict[str, float] = {}
    before = started
    for stage in StartupClock.STAGES:
        if stage not in marks:
            break
        span = marks[stage] - before
        if stage == "modelLoad":
            if "dataLoad" in parts:
                out["dataLoad"] = round(min(parts["dataLoad"], span), 3)
            if "dataWait" in parts:
                wait = min(parts["dataWait"], span)
                out["dataWait"] = round(wait, 3)
                span -= wait
        out[stage] = round(span, 3)
        if stage == "modelLoad" and parts.get("restore"):
            out["restore"] = round(min(parts["restore"], span), 3)
        if stage == "firstStep":
            for part in ("compile", "decodeCapture"):
                if parts.get(part):
                    out[part] = round(min(parts[part], span), 3)
        before = marks[stage]
    if out:
        out["total"] = round(before - started, 3)
    return out


_T = TypeVar("_T")

# Set to 1, the build loads its data before the models, on its own thread (InBackground runs its
# call at once): the order before the overlap, for comparing the two.
ENV_SERIAL_STARTUP = "RLKUBE_SERIAL_STARTUP"


class InBackground(Generic[_T]):
    """`fn()` running on a thread of its own from construction on; `result()` waits for it (the
    first call joins the thread, later ones return at once) and returns its value or raises its
    exception: the same object, with the thread's frames in its traceback.

    `seconds` is the call's own wall time, `waited` how long `result()` blocked. With `serial`
    (default: RLKUBE_SERIAL_STARTUP=1 in the environment) the call runs here, before the
    constructor returns, and its exception is raised from here; then `waited` is `seconds`."""

    def __init__(self, fn: Callable[[], _T], name: str, serial: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._fn, self._clock = fn, clock
        self._value: _T | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.seconds = self.waited = 0.0
        if serial is None:
            serial = os.environ.get(ENV_SERIAL_STARTUP, "") == "1"
        if serial:
            t0 = clock()
            try:
                self._value = fn()
            finally:
                self.seconds = self.waited = clock() - t0
            return
        self._thread = threading.Thread(target=self._run, name=f"rlkube-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = self._clock()
        try:
            self._value = self._fn()
        except BaseException as e:  # raised by result(), on the thread that wants the value
            self._error = e
        finally:
            self.seconds = self._clock() - t0

    def _join(self) -> None:
        if self._thread is not None:
            t0 = self._clock()
            self._thread.join()
            self.waited = self._clock() - t0
            self._thread = None

    def error(self) -> BaseException | None:
        """What the call raised (None: it returned), once it is done (waits for it)."""
        self._join()
        return self._error

    def result(self) -> _T:
        """The call's value, once it is done (waits for it); its exception raised, unchanged."""
        self._join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class DataBeside(Generic[_T]):
    """A trainer's data set read and tokenised by `load` on a thread (InBackground) while its build
    loads the models, counted in `clock`'s split (dataLoad: the thread's time; dataWait: the
    build's wait for it) once, at the first `ready()`."""

    def __init__(self, clock: StartupClock, load: Callable[[], _T]) -> None:
        self.clock = clock
        self.pending = InBackground(load, "data")
        self.counted = False

    def ready(self) -> _T:
        """The data, waited for; a data error raised as the load raised it."""
        try:
            return self.pending.result()
        finally:
            if not self.counted:
                self.counted = True
                self.clock.add("dataLoad", self.pending.seconds)
                self.clock.add("dataWait", self.pending.waited)

    @contextmanager
    def errors_first(self) -> Iterator[None]:
        """Within: the build that goes on while the data loads. An error there waits for the data,
        and a data error is raised in its place: a run with bad data fails on its data, whatever
        else is wrong, as when the data was loaded before the models."""
        try:
            yield
        except Exception:
            error = self.pending.error()
            if error is not None:
                raise error from None
            raise


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process so far (forward frames and
    backward graphs, torch's own cumulative timers); 0 when nothing was compiled."""
    if "torch._dynamo" not in sys.modules:
        return 0.0
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


# Where torch.compile keeps its on-disk caches (inductor's FX graph and AOTAutograd caches, and
# Triton's kernels under TRITON_SUBDIR), relative to checkpoint.dir.
COMPILE_CACHE = ".compile-cache"
TRITON_SUBDIR = "triton"


def compile_cache_env(checkpoint_dir: str, env: dict[str, str], cache_dir: str | None = None) -> dict[str, str]:
    """The environment that keeps torch.compile's caches where a restarted or resumed trainer (a
    new pod, a new /tmp) finds them, so it loads the first attempt's compiled graphs instead of
    compiling again: a 1.5B model's first DPO step is 32-35 s on an H200, nearly all compile.

    Where, first that applies: a cache directory the user set (TORCHINDUCTOR_CACHE_DIR: nothing
    is changed); the job's `cache_dir` (checkpoint.compileCacheDir, such as a volume other jobs
    mount too); the cluster's cache volume (RLKUBE_COMPILE_CACHE, set by the operator where the
    chart mounts one); else next to the checkpoints. Triton's kernels go under it
    (TRITON_CACHE_DIR, unless set). Set before the first compile; spawned workers inherit it."""
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        return {}
    chosen = cache_dir or env.get(ENV_COMPILE_CACHE) or (
        os.path.join(checkpoint_dir, COMPILE_CACHE) if checkpoint_dir else "")
    if not chosen:
        return {}
    out = {"TORCHINDUCTOR_CACHE_DIR": chosen}
    if not env.get("TRITON_CACHE_DIR"):
        out["TRITON_CACHE_DIR"] = os.path.join(chosen, TRITON_SUBDIR)
    return out


# The CUDA caching allocator's setting the runtime starts with, unless the user set one.
ALLOCATOR_CONF = "expandable_segments:True"


def allocator_env(env: dict[str, str]) -> dict[str, str]:
    """The environment that makes the CUDA caching allocator grow segments in place instead of
    holding many fixed-size ones: long-tailed DPO (micro-batches of every size) held 138.7 GiB of
    an H200's 139.8 with fixed segments and 83.9 GiB with expandable ones, at the same tokens/s
    (docs/benchmarks.md). The adaptive batcher reads that reserved figure, so fragments were
    headroom it could not use. A setting the user made (either variable name) wins. Set before
    the first CUDA allocation; spawned workers inherit it."""
    if env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF"):
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": ALLOCATOR_CONF}


def compile_cache_counts() -> dict[str, int] | None:
    """Inductor's FX graph cache hits and misses in this process so far (None: nothing compiled).
    Logged with the first step: hits there mean the compile came from an earlier attempt."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
    return {"hits": int(hits), "misses": int(misses)} if hits or misses else None
