"""Weights read from disk while the libraries import.

`python -m rlkube.runtime run` spends its first seconds importing torch and transformers (14 s on
a cold H100 machine), with the disk idle. The weights the build will load next (each role's
`model.path` safetensors, and the newest checkpoint a restart resumes from) are read into the
page cache meanwhile, on a thread of its own started before those imports: the load then reads
memory, not a cold volume. Only the host's page cache is used: nothing stays in this process,
and the kernel drops the pages under memory pressure as it drops any cache.

Bounded: nothing is read when the files add up to more than half the memory the host has
available (`MemAvailable`), so a large checkpoint on a small node does not push out what the
build needs. RLKUBE_READAHEAD=0 turns it off. Pure standard library (it runs before torch loads).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rlkube.runtime.infra.checkpoint_layout import META, STEP_DIR

ENV_READAHEAD = "RLKUBE_READAHEAD"
CHUNK_BYTES = 8 << 20
MAX_SHARE_OF_AVAILABLE = 0.5


@dataclass
class ReadAhead:
    """What was read ahead: the files, their bytes, and the seconds the thread took (None while it runs)."""

    files: list[Path]
    bytes: int
    seconds: float | None = None
    skipped: str | None = None
    thread: threading.Thread | None = field(default=None, repr=False)

    def wait(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


def weight_files(model_paths: Iterable[str | None], checkpoint_dir: str | None) -> list[Path]:
    """The safetensors files of each model directory, then every file of the newest committed
    checkpoint under `checkpoint_dir` (the highest step with its metadata file), without duplicates."""
    files: list[Path] = []
    for path in model_paths:
        if path and Path(path).is_dir():
            files += sorted(Path(path).glob("*.safetensors"))
    if checkpoint_dir and Path(checkpoint_dir).is_dir():
        steps = sorted(p for p in Path(checkpoint_dir).iterdir()
                       if STEP_DIR.match(p.name) and (p / META).is_file())
        if steps:
            files += sorted(p for p in steps[-1].rglob("*") if p.is_file())
    unique: dict[Path, None] = dict.fromkeys(f.resolve() for f in files)
    return list(unique)


def available_bytes() -> int | None:
    """The host's MemAvailable (Linux), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_all(files: list[Path], result: ReadAhead) -> None:
    started = time.perf_counter()
    buffer = bytearray(CHUNK_BYTES)
    for path in files:
        try:
            with open(path, "rb", buffering=0) as f:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
                while f.readinto(buffer):
                    pass
        except OSError:
            continue  # a file that went away or cannot be read is the load's to report
    result.seconds = round(time.perf_counter() - started, 3)


def start_readahead(model_paths: Iterable[str | None], checkpoint_dir: str | None,
                    environ: dict[str, str] | None = None) -> ReadAhead:
    """Start reading `weight_files(...)` into the page cache on a daemon thread; the ReadAhead
    says what (or why nothing: `skipped`)."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_READAHEAD, "1") == "0":
        return ReadAhead([], 0, skipped=f"{ENV_READAHEAD}=0")
    files = weight_files(model_paths, checkpoint_dir)
    total = sum(f.stat().st_size for f in files)
    available = available_bytes()
    if not files:
        return ReadAhead([], 0, skipped="no weight files")
    if available is not None and total > MAX_SHARE_OF_AVAILABLE * available:
        return ReadAhead(files, total, skipped=f"{total / 2**30:.1f} GiB is over half the host's available memory")
    result = ReadAhead(files, total)
    result.thread = threading.Thread(target=_read_all, args=(files, result), name="rlkube-readahead", daemon=True)
    result.thread.start()
    return result
