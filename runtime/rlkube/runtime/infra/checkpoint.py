"""Checkpoints with torch.distributed.checkpoint (DCP), committed atomically.

Layout under `checkpoint.dir`:
    step-000000040/              a committed checkpoint: DCP shards + rlkube-checkpoint.json (+ files
                                 ranks attach, such as compile-artifacts/: compile_artifacts.py)
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
carries the trainer's own state (step, batcher state) as JSON, and the gang attempt that wrote
it (RLKUBE_ATTEMPT). Fencing by attempt, for a process left running behind a partition after
the operator started a new attempt elsewhere: every attempt raises the fence file
(`rlkube-fence.json`, its attempt) when it starts (`claim`, in `restore`), and a commit is refused
(`check_fence`, StaleAttempt) when the fence or any committed checkpoint carries a newer attempt
than the writer's. The check runs just before the commit; a commit that passed it an instant
before the new attempt raised the fence still lands, and is harmless: checkpoints are ordered
by (attempt, step), so a newer attempt's checkpoint is always the latest and an older attempt's
is pruned first, whatever its step.

All ranks must see the same directory (a shared volume claim, or one node). Every function
that takes a DistContext is collective: all ranks call it.

Background writes (`background=True`): `save` takes a snapshot of the state — on the GPU when it
has room for one next to a step's peak (milliseconds; the writer thread moves it to host memory
off the step, see infra/staging.py), else in pinned host memory reused across saves — and
returns; a writer thread writes the shards and commits exactly as above.
The writer's collectives (DCP's planning, the barrier before the commit) run on a gloo group of
their own, so they never interleave with the training loop's collectives on the default group.
A save due while the previous one is still writing waits for it first (never two in flight,
never one skipped); `wait()` is the end of training's (and SIGTERM's) "until it committed". The
time the step loop spends inside `save` (waiting + staging) is its stall, logged per save.
A save may take more work on its staged copy (`with_staged`: the run's final export, written
from the same host copy on a thread beside the shards' writer); `wait()` covers it too.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlkube.runtime.infra.checkpoint_layout import META, STEP_DIR
from rlkube.runtime.infra.compile_artifacts import write_attachments
from rlkube.runtime.infra.distributed import DistContext, barrier
from rlkube.runtime.infra.log import emit
from rlkube.runtime.infra.progress import attempt_from_env
from rlkube.runtime.infra.staging import (
    DeviceSnapshot,
    PinnedPool,
    device_snapshot_fits,
    pinned_like,
    same_layout,
    state_bytes,
)

# DCP warns on every save and load without a process group (one process on a workstation, the
# `export` verb) that it assumes "a single process": that is what runs, and nothing is to be done.
# A filter on that message alone, for the process: catch_warnings around the calls would not do,
# since the background writer saves on a thread of its own and catch_warnings is not thread-safe.
warnings.filterwarnings(
    "ignore", category=UserWarning,
    message=r"torch\.distributed is (disabled, )?unavailable or uninitialized, assuming the intent is to "
            r"(save|load) in a single process",
)

FENCE = "rlkube-fence.json"
# Files each rank writes in parallel. DCP's writer does Python work per tensor, and a background
# writer thread gets the GIL only between the step loop's own Python: on an H200 a 1.5B model's
# 9 GiB took 24-27 s to write next to a DPO run against 8 s alone with one thread (4 s with 8).
WRITE_THREADS = 8


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def committed(root: str | Path) -> list[tuple[int, Path]]:
    """Committed checkpoints under `root` as (step, path), oldest first: by the gang attempt that
    wrote them, then by step (a newer attempt's checkpoint supersedes an older attempt's even at
    a lower step: the older one may be a stale process's, see the module docstring)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and (p / META).is_file():
            try:
                attempt = _attempt_of(read_meta(p))
            except (OSError, ValueError):  # removed or half-written meanwhile: not committed
                continue
            out.append((attempt, int(m.group(1)), p))
    return [(step, path) for _, step, path in sorted(out)]


def _attempt_of(meta: dict) -> int:
    attempt = meta.get("attempt")
    return attempt if isinstance(attempt, int) else -1


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


class StaleAttempt(RuntimeError):
    """A save of an older gang attempt than the one that committed the newest checkpoint: this
    process was replaced (its node lost, say, behind a partition) and must not commit."""


def fence_attempt(root: str | Path) -> int | None:
    """The newest attempt that started on this checkpoint directory (None: no fence yet)."""
    try:
        value = json.loads((Path(root) / FENCE).read_text()).get("attempt")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) else None


def claim(root: str | Path, attempt: int | None) -> None:
    """Raise the fence to `attempt` (never lower it): from now on no older attempt commits here.
    Called by rank 0 of every attempt when it starts, before it picks the checkpoint to resume."""
    if attempt is None:
        return
    root = Path(root)
    current = fence_attempt(root)
    if current is not None and current >= attempt:
        return
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{FENCE}.{os.getpid()}.tmp"
    with tmp.open("w") as f:
        json.dump({"attempt": attempt, "time": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / FENCE)


def check_fence(root: str | Path, attempt: int | None) -> None:
    """Fencing by attempt: refuse a commit from an attempt older than the fence (the newest
    attempt that started here) or than any committed checkpoint's (its metadata's "attempt", the
    operator's RLKUBE_ATTEMPT of its writer). A run outside an operator pod (no attempt) is not
    fenced."""
    if attempt is None:
        return
    fence = fence_attempt(root)
    if fence is not None and fence > attempt:
        raise StaleAttempt(f"checkpoint refused: attempt {attempt} is older than attempt {fence}, "
                           f"which started on {root}; this process was replaced")
    for _, path in reversed(committed(root)):
        newest = read_meta(path).get("attempt")
        if isinstance(newest, int) and newest > attempt:
            raise StaleAttempt(f"checkpoint refused: attempt {attempt} is older than attempt {newest}, "
                               f"which committed {path.name}; this process was replaced")
        break  # ordered by attempt: the last one carries the newest


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

    def __init__(self, root: str, keep: int, ctx: DistContext, background: bool = False,
                 staging: str = "auto") -> None:
        """`staging` (background saves): "auto" takes the snapshot on the GPU when it fits next to
        a step's peak, else in pinned host memory; "device" and "host" force one (tests)."""
        self.root = Path(root)
        self.keep = keep
        self.ctx = ctx
        self.background = background
        # Test seams, called on the writer (the writer thread when in the background):
        # before the shards are written, and after they are written but before the commit.
        self.before_write: Callable[[int], None] | None = None
        self.before_commit: Callable[[int], None] | None = None
        # Files this rank adds to each checkpoint ({name relative to it: bytes}) and fields for the
        # save's record (what collecting them cost), asked for on the training thread at each save;
        # the files are written into the temp directory before the commit
        # (compile_artifacts.checkpoint_attachments: torch.compile's cache artifacts).
        self.attachments: Callable[[], tuple[dict[str, bytes], dict]] | None = None
        self.stalls: list[float] = []  # seconds the step loop spent in each save
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self._group = None
        self._stager = None
        self._snapshot: DeviceSnapshot | None = None
        self._preparing: threading.Thread | None = None
        self._pool: PinnedPool | None = None  # see reserve()
        self._staging = staging
        if background:
            # Pinned buffers kept between saves on CUDA; plain copies on CPU (no pinning there).
            self._stager = BlockingAsyncStager(cache_staged_state_dict=ctx.device.type == "cuda")
            if staging == "device" or (staging == "auto" and ctx.device.type == "cuda"):
                self._snapshot = DeviceSnapshot(ctx.device)
            if ctx.initialized:  # collective: every rank builds its Checkpointer at the same point
                self._group = tdist.new_group(backend="gloo")

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Allocate the pinned host buffers of the host stager ahead of the first save, on a thread
        of their own: a 1.5B model's 9 GiB took ~4-5 s of an H200 host's time, which the first
        save used to stall for. Only when saves will stage on the host (no room on the GPU for a
        device snapshot, judged from the peak so far): see below. Call once the optimizer has
        state (after the first step). Sharded states (DTensor) are left to the first save."""
        stager = self._stager
        if stager is None or not stager.cache_staged_state_dict or self._preparing is not None:
            return
        model_sd, optim_sd = _state_dicts(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        if self._on_device(state):
            # Saves will snapshot on the device, and the writer moves the snapshot to (pageable) host
            # memory on a stream of its own, off the step loop: pinned buffers would only speed up
            # the writer, and pinning costs the step loop dearly. Page-locking memory holds the CUDA
            # driver while the step loop waits to launch: on an H200 host, pinning a 1.5B PPO state
            # (actor + critic, ~21 GiB) made step 2's generation take 14.9 s at 4% GPU busy instead
            # of 0.7 s, and DPO's step 2 took 4-8 s instead of under 1 s.
            return
        buffers = pinned_like(state)  # None: a leaf that is not a plain tensor
        if buffers is None:
            return
        pool = self._pool

        def allocate() -> None:
            try:
                # The memory reserve() page-locked at start-up, when the state fits in it: not a
                # second pinned copy of the state next to it.
                carved = pool.carve(state) if pool is not None and pool.ready.wait() else None
                stager.state_dict_cache = carved if carved is not None else buffers()
            except Exception as e:  # no pinned memory to be had: the first save allocates as before
                emit({"event": "checkpointPrepare", "error": f"{type(e).__name__}: {e}"})

        self._preparing = threading.Thread(target=allocate, name="rlkube-checkpoint-pin", daemon=True)
        self._preparing.start()

    def reserve(self, nbytes: int) -> None:
        """Start page-locking `nbytes` of host memory for the writer's copies of device snapshots
        (staging.PinnedPool), on a thread: call before the first step, whose time is compile.
        Only for background saves that may snapshot on a CUDA device."""
        if self._snapshot is not None and self.ctx.device.type == "cuda" and self._pool is None and nbytes > 0:
            self._pool = PinnedPool(nbytes)

    def _host_for(self, snapshot: dict) -> dict | None:
        """Where the writer puts a device snapshot: the host buffers kept between saves (the
        stager's, which prepare() or an earlier save carved from the reserved pool), carved anew
        from the pool when the layout changed; None when there are none of this layout (to_host
        then uses pageable memory)."""
        cache = self._stager.state_dict_cache
        if cache is not None and same_layout(snapshot, cache):
            return cache
        carved = self._pool.carve(snapshot) if self._pool is not None else None
        if carved is not None:
            self._stager.state_dict_cache = carved
        return carved

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: dict,
             model_meta: dict | None = None, with_staged: Callable[[dict], None] | None = None) -> Path:
        """Checkpoint after `step` steps; returns once the state is safe from training (staged, or
        written and committed when not in the background). Collective. `model_meta` (export.model_meta:
        what the model is) is kept in the metadata, so the checkpoint can be exported on its own.
        `with_staged(state)`: more work on the same staged copy (the run's final export), on a thread
        of its own while the shards are written; the save's `wait()` covers it and re-raises what
        failed it. Called with the state in host memory ({"model": ..., "optim": ...}) in the
        background, with the live state otherwise."""
        t0 = time.perf_counter()
        self.wait()
        if self._preparing is not None:  # the buffers prepare() allocates (done long since, normally)
            self._preparing.join()
        waited = time.perf_counter() - t0
        ctx = self.ctx
        tmp_name = f".tmp-step-{step:09d}-{os.getpid()}" if ctx.is_main else ""
        tmp = self.root / _broadcast_str(ctx, tmp_name)
        if ctx.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
        barrier(ctx)
        model_sd, optim_sd = _state_dicts(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        meta = {"step": step, "worldSize": ctx.world_size, "trainer": trainer, "attempt": attempt_from_env()}
        files, attached = self.attachments() if self.attachments is not None else ({}, {})
        if model_meta is not None:
            meta["model"] = model_meta
        staged_on = None
        if self.background:
            snapshot: list = []  # a box the writer empties, so the device copy is freed before the write
            if self._on_device(state):
                snapshot, staged_on = [self._snapshot.take(state)], "device"
            else:
                state, staged_on = self._stage(state), "host"
            self._writer = threading.Thread(target=self._write_in_background,
                                            args=(step, tmp, state, meta, snapshot, files, with_staged),
                                            name=f"rlkube-checkpoint-{step}")
            self._writer.start()
        else:
            self._write_beside(step, tmp, state, meta, files, with_staged)
        stall = time.perf_counter() - t0
        self.stalls.append(stall)
        if ctx.is_main:
            emit({"event": "checkpointSave", "step": step, "stallSeconds": round(stall, 4),
                  "waitedSeconds": round(waited, 4), "background": self.background, "staging": staged_on,
                  **attached})
        return step_dir(self.root, step)

    def _on_device(self, state: dict) -> bool:
        """Whether this save's snapshot is taken on the device (see infra/staging.py)."""
        if self._snapshot is None:
            return False
        if self._staging == "device" or self.ctx.device.type != "cuda":
            return True
        dev = self.ctx.device
        total = torch.cuda.get_device_properties(dev).total_memory
        return device_snapshot_fits(state_bytes(state), torch.cuda.max_memory_reserved(dev), total)

    def _stage(self, state: dict) -> dict:
        try:
            staged = self._stager.stage(state)
        except Exception:  # the state's shape changed since the cached copy (new optimizer state)
            self._stager.state_dict_cache = None
            staged = self._stager.stage(state)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        return staged

    def _group_barrier(self) -> None:
        if self.background and self._group is not None:
            tdist.barrier(group=self._group)
        elif not self.background:
            barrier(self.ctx)

    def _write(self, step: int, tmp: Path, state: dict, meta: dict, files: dict[str, bytes] | None = None) -> None:
        """Write the shards and this rank's attached files, wait for every rank's, commit on rank 0.
        Collective (on the writer's group)."""
        t0 = time.perf_counter()
        if self.before_write is not None:
            self.before_write(step)
        dcp.save(state, storage_writer=FileSystemWriter(str(tmp), thread_count=WRITE_THREADS),
                 process_group=self._group)
        write_attachments(tmp, files or {})
        self._group_barrier()  # every rank's shards are on disk before anything is committed
        if self.before_commit is not None:
            self.before_commit(step)
        final = step_dir(self.root, step)
        if self.ctx.is_main:
            try:
                check_fence(self.root, meta.get("attempt"))
            except StaleAttempt:
                self._group_barrier()  # the other ranks wait at the commit's barrier: release them
                raise
            if final.exists():  # an uncommitted leftover of an earlier attempt at this step
                shutil.rmtree(final)
            os.rename(tmp, final)
            write_meta(final, {**meta, "time": time.time()})
            self._prune()
            emit({"event": "checkpoint", "step": step, "path": str(final),
                  "writeSeconds": round(time.perf_counter() - t0, 4)})
        self._group_barrier()

    def _write_beside(self, step: int, tmp: Path, state: dict, meta: dict, files: dict[str, bytes],
                      with_staged: Callable[[dict], None] | None) -> None:
        """`_write`, with `with_staged(state)` on a thread of its own meanwhile; both done on return
        (the first error raised: the write's, else the side work's)."""
        if with_staged is None:
            self._write(step, tmp, state, meta, files)
            return
        failed: list[BaseException] = []

        def side() -> None:
            try:
                with_staged(state)
            except BaseException as e:  # re-raised on the writer below
                failed.append(e)

        beside = threading.Thread(target=side, name=f"rlkube-checkpoint-{step}-beside")
        beside.start()
        try:
            self._write(step, tmp, state, meta, files)
        finally:
            beside.join()
        if failed:
            raise failed[0]

    def _write_in_background(self, step: int, tmp: Path, state: dict, meta: dict, snapshot: list,
                             files: dict[str, bytes], with_staged: Callable[[dict], None] | None = None) -> None:
        t0 = time.perf_counter()
        try:
            if snapshot:
                device_state, event = snapshot.pop()
                host = self._host_for(device_state)
                state = self._snapshot.to_host(device_state, event, host=host)
                del device_state  # the device copy is dropped here, before the write
                if self.ctx.is_main:
                    pool = self._pool
                    emit({"event": "checkpointStaged", "step": step, "pinned": host is not None,
                          "toHostSeconds": round(time.perf_counter() - t0, 4), "stateBytes": state_bytes(state),
                          "poolBytes": pool.nbytes if pool else 0,
                          "poolReady": bool(pool and pool.ready.is_set()), "poolError": pool.error if pool else None})
            self._write_beside(step, tmp, state, meta, files, with_staged)
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e

    def wait(self) -> None:
        """Block until the save in flight (if any) has committed; re-raise what failed it."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """The end of training: the last save committed, the writer's group released."""
        try:
            self.wait()
        finally:
            if self._group is not None and tdist.is_initialized():
                tdist.destroy_process_group(self._group)
            self._group = None

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
        """Load the latest committed checkpoint into model and optimizer; its metadata, or None.
        Rank 0 first raises the fence to this attempt (`claim`): a process of an older attempt
        still running elsewhere can no longer commit."""
        found = None
        if self.ctx.is_main:
            claim(self.root, attempt_from_env())
            found = latest(self.root)
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
