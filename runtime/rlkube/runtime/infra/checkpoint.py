"""Checkpoints with torch.distributed.checkpoint (DCP), committed atomically.

Layout under `checkpoint.dir`:
    step-000000040/              a committed checkpoint: DCP shards + rlkube-checkpoint.json
    .tmp-step-000000050-<pid>/   a save in progress (or one that died): never read

A save writes the DCP shards of every rank into a temp directory, then rank 0 renames it to
its final name and writes the metadata file last (through a temp file and os.replace). A
checkpoint without its metadata file does not exist: a save killed at any point leaves at
worst a temp directory or a metadata-less directory, both ignored and removed later, and the
previous committed checkpoint stays the latest. Older committed checkpoints beyond `keep` are
removed after each commit (metadata first, so a half-removed one is not mistaken for valid).

The model and optimizer state go through `get_state_dict`/`set_state_dict`, which store
parameters by their fully qualified names as global tensors; DCP reshards on load, so a
checkpoint written by 4 FSDP ranks loads into 2, or into 1 unsharded process. The metadata
carries the trainer's own state (step, batcher state) as JSON.

All ranks must see the same directory (a shared volume claim, or one node). Every function
that takes a DistContext is collective: all ranks call it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlkube.runtime.infra.distributed import DistContext, barrier
from rlkube.runtime.infra.log import emit

META = "rlkube-checkpoint.json"
STEP_DIR = re.compile(r"^step-(\d{9})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def committed(root: str | Path) -> list[tuple[int, Path]]:
    """Committed checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and (p / META).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest(root: str | Path) -> tuple[int, Path] | None:
    found = committed(root)
    return found[-1] if found else None


def read_meta(path: Path) -> dict:
    return json.loads((path / META).read_text())


def write_meta(path: Path, meta: dict) -> None:
    """Write the metadata file atomically; it is the commit point of a checkpoint."""
    tmp = path / f".{META}.tmp"
    with tmp.open("w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / META)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _broadcast_str(ctx: DistContext, value: str) -> str:
    if not ctx.initialized:
        return value
    box = [value]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def _state_dicts(model: torch.nn.Module, optimizer) -> tuple[dict, dict]:
    """Model and optimizer state; empty on a rank that trains nothing (an RL reward rank), which
    still takes part in the collective save and load."""
    if next(model.parameters(), None) is None:
        return {}, {}
    return get_state_dict(model, optimizer)


class Checkpointer:
    """Saves and restores model + optimizer + trainer state under one directory."""

    def __init__(self, root: str, keep: int, ctx: DistContext) -> None:
        self.root = Path(root)
        self.keep = keep
        self.ctx = ctx
        # Called after the shards are written and before the commit; tests use it to die there.
        self.before_commit: Callable[[int], None] | None = None

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: dict) -> Path:
        ctx = self.ctx
        tmp_name = f".tmp-step-{step:09d}-{os.getpid()}" if ctx.is_main else ""
        tmp = self.root / _broadcast_str(ctx, tmp_name)
        if ctx.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
        barrier(ctx)
        model_sd, optim_sd = _state_dicts(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        barrier(ctx)
        if self.before_commit is not None:
            self.before_commit(step)
        final = step_dir(self.root, step)
        if ctx.is_main:
            if final.exists():  # an uncommitted leftover of an earlier attempt at this step
                shutil.rmtree(final)
            os.rename(tmp, final)
            meta = {"step": step, "worldSize": ctx.world_size, "time": time.time(), "trainer": trainer}
            write_meta(final, meta)
            self._prune()
            emit({"event": "checkpoint", "step": step, "path": str(final)})
        barrier(ctx)
        return final

    def _prune(self) -> None:
        found = committed(self.root)
        for _, path in found[: max(0, len(found) - self.keep)]:
            (path / META).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
        newest = found[-1][0] if found else -1
        for p in self.root.iterdir():
            m = STEP_DIR.match(p.name)
            stale_tmp = p.name.startswith(".tmp-step-")
            uncommitted = m is not None and not (p / META).exists() and int(m.group(1)) <= newest
            if stale_tmp or uncommitted:
                shutil.rmtree(p, ignore_errors=True)

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Load the latest committed checkpoint into model and optimizer; its metadata, or None."""
        found = latest(self.root) if self.ctx.is_main else None
        chosen = _broadcast_str(self.ctx, str(found[1]) if found else "")
        if not chosen:
            return None
        path = Path(chosen)
        model_sd, optim_sd = _state_dicts(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        if state["model"]:
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return read_meta(path)
