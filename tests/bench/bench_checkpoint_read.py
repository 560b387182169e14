"""Reading a checkpoint back: rlkube's threaded reader (infra/checkpoint_reader.py) against DCP's
own FileSystemReader, on the same files, in the same process, one after the other.

Run: `.venv/bin/python tests/bench/bench_checkpoint_read.py [--gib 4.5] [--threads 2,4,8] [--repeats 2]`.

The checkpoint is laid out as a 28-layer model's: 12 bf16 tensors a layer, and two AdamW moments
(bf16) a tensor, written with DCP's FileSystemWriter into a temporary folder and read back from
the page cache (the state a restart on the same node finds) into CPU tensors. Each reader's
best time over --repeats, the GiB/s, and the ratio to FileSystemReader; every read is checked
bit for bit against what was written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from rlkube.runtime.infra.checkpoint_reader import ParallelReader

LAYERS, PER_LAYER = 28, 12


def state_of(gib: float) -> dict:
    """A model of LAYERS x PER_LAYER bf16 tensors with two moments each, `gib` GiB in all."""
    n = int(gib * (1 << 30) / 2 / (LAYERS * PER_LAYER) / 3)
    gen = torch.Generator().manual_seed(0)
    model = {f"layer{i}.t{j}": torch.randn(n, generator=gen).to(torch.bfloat16)
             for i in range(LAYERS) for j in range(PER_LAYER)}
    optim = {f"{name}.{m}": torch.randn(n, generator=gen).to(torch.bfloat16)
             for name in model for m in ("exp_avg", "exp_avg_sq")}
    return {"model": model, "optim": optim}


def read_seconds(path: Path, state: dict, make_reader, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        target = {group: {k: torch.zeros_like(v) for k, v in tensors.items()} for group, tensors in state.items()}
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=make_reader(), no_dist=True)
        best = min(best, time.perf_counter() - t0)
        for group, tensors in state.items():
            if not all(torch.equal(target[group][k], v) for k, v in tensors.items()):
                raise SystemExit(f"{make_reader().__class__.__name__}: read differs from what was written")
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.5)
    ap.add_argument("--threads", default="2,4,8")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # DCP's "a single process" on every call
    state = state_of(args.gib)
    size = sum(t.numel() * t.element_size() for tensors in state.values() for t in tensors.values()) / (1 << 30)
    folder = Path(tempfile.mkdtemp(prefix="bench-ckpt-read-"))
    try:
        dcp.save(state, storage_writer=FileSystemWriter(str(folder), thread_count=8), no_dist=True)
        base = read_seconds(folder, state, lambda: FileSystemReader(str(folder)), args.repeats)
        rows = [("FileSystemReader", base)]
        for threads in (int(t) for t in args.threads.split(",") if t):
            rows.append((f"ParallelReader, {threads} threads",
                         read_seconds(folder, state, lambda t=threads: ParallelReader(folder, t), args.repeats)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    items = LAYERS * PER_LAYER * 3
    for name, seconds in rows:
        print(json.dumps({"reader": name, "gib": round(size, 2), "items": items, "seconds": round(seconds, 2),
                          "gibPerSecond": round(size / seconds, 2), "vsFileSystemReader": round(base / seconds, 2)}))
    print("| reader | seconds | GiB/s | vs FileSystemReader |\n| --- | ---: | ---: | ---: |")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {size / seconds:.2f} | {base / seconds:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
