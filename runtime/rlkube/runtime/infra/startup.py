"""Where the time from process start to the first trained step goes.

A 1.5B model took 10-12 s from process start to the GPU's first busy sample, reported as one
`setupSeconds`. Split, it says what to fix:
- import:     process start -> the trainer starts building (interpreter, torch, transformers,
              the rendezvous);
- modelLoad:  building models, optimizers, data, and restoring a checkpoint;
- firstStep:  the first step (kernel selection, allocator warm-up, CUDA graph capture).

The process start comes from the kernel (/proc/self/stat) where there is one, so the import
share counts the interpreter's own start; elsewhere it counts from this module's import.
"""

from __future__ import annotations

import os
import sys
import time

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
    """Marks the end of each start-up stage; `seconds()` is the split so far."""

    STAGES = ("import", "modelLoad", "firstStep")

    def __init__(self, started: float | None = None, clock=time.time) -> None:
        self.clock = clock
        self.started = process_start_time() if started is None else started
        self.marks: dict[str, float] = {}

    def mark(self, stage: str) -> None:
        """`stage` ended now (a stage marked twice keeps its first end)."""
        if stage not in self.STAGES:
            raise ValueError(f"unknown start-up stage {stage!r}: one of {self.STAGES}")
        self.marks.setdefault(stage, self.clock())

    def seconds(self) -> dict[str, float]:
        """Seconds of each marked stage, and `total` to the last mark (camelCase keys)."""
        out: dict[str, float] = {}
        before = self.started
        for stage in self.STAGES:
            if stage not in self.marks:
                break
            out[stage] = round(self.marks[stage] - before, 3)
            before = self.marks[stage]
        if out:
            out["total"] = round(before - self.started, 3)
        return out


# Where torch.compile keeps its on-disk caches (inductor's FX graph and AOTAutograd caches, and
# Triton's kernels under it), relative to checkpoint.dir.
COMPILE_CACHE = ".compile-cache"


def compile_cache_env(checkpoint_dir: str, env: dict[str, str], cache_dir: str | None = None) -> dict[str, str]:
    """The environment that keeps torch.compile's caches next to the checkpoints, so a restarted
    or resumed trainer (a new pod, a new /tmp) loads the first attempt's compiled graphs instead
    of compiling again: a 1.5B model's first DPO step is 32-35 s on an H200, nearly all compile.
    `cache_dir` (checkpoint.compileCacheDir) puts them elsewhere, such as a volume other jobs
    mount too. A cache directory the user set (TORCHINDUCTOR_CACHE_DIR) wins. Set before the
    first compile; spawned workers inherit it."""
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        return {}
    if cache_dir:
        return {"TORCHINDUCTOR_CACHE_DIR": cache_dir}
    if not checkpoint_dir:
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(checkpoint_dir, COMPILE_CACHE)}


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
