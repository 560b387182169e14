"""Where a background checkpoint's state waits while it is written: on the GPU, or in host memory.

The step loop is blocked only while the state is copied somewhere training cannot change it.
A copy into host memory is bounded by the host link, and the first one also allocates the pinned
buffers: measured on an H200 with a 1.5B model (bf16 weights + AdamW state), the first save
stalled the GPU 5-20 s and later ones 1.6 s. A copy on the GPU itself runs at device bandwidth
(~4 TB/s there: milliseconds). So when the GPU has room for one more copy of the state next to a
step's peak, the snapshot is taken on the device (`DeviceSnapshot`); the checkpoint writer thread
then moves it to host memory on a CUDA stream of its own (the copy engines do that work while
the training kernels run) and frees it before writing. Without that room the pinned host stager
(torch.distributed.checkpoint's BlockingAsyncStager) is used, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

# Room kept free on top of the snapshot and the step's peak (allocator slack, NCCL buffers).
HEADROOM_BYTES = 2 << 30
# The snapshot plus the step's peak may use at most this share of the card.
MAX_SHARE = 0.92


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a nested state dict (a DTensor counts its local shard)."""
    leaves, _ = tree_flatten(state)
    total = 0
    for t in leaves:
        if isinstance(t, torch.Tensor):
            local = t.to_local() if hasattr(t, "to_local") else t
            total += local.numel() * local.element_size()
    return total


def device_snapshot_fits(snapshot_bytes: int, step_peak_bytes: int, total_bytes: int) -> bool:
    """Whether one more copy of the state fits on the card next to a training step's peak."""
    return snapshot_bytes + step_peak_bytes + HEADROOM_BYTES <= MAX_SHARE * total_bytes


def checkpoint_bytes_estimate(model: torch.nn.Module) -> int:
    """Host bytes a checkpoint of `model` with AdamW will need, before the optimizer has state:
    the model's state dict (a tied embedding counted under both names, as the checkpoint holds
    it), two moments per trainable parameter in its dtype (AdamW keeps them so), and room for the
    step counters, each tensor's 64-byte alignment and 3% more. (Measured short by ~0.5 GB when it
    counted parameters once: the pool went unused.)"""
    params = list(model.parameters())
    held_tensors = list(model.state_dict().values())  # a tied weight is there under each of its names
    held = sum(t.numel() * t.element_size() for t in held_tensors if isinstance(t, torch.Tensor))
    moments = sum(2 * p.numel() * p.element_size() for p in params if p.requires_grad)
    tensors = len(held_tensors) + len(params) * 3
    return held + moments + 128 * tensors + ((held + moments) >> 5)


def pinned_like(state: dict) -> Callable[[], dict] | None:
    """A function that allocates pinned host tensors shaped like `state`'s (the layout the host
    stager fills), reading only shapes and dtypes: safe to call on another thread while training
    runs. None when a leaf is a sharded tensor (DTensor): allocating its host copy reads it."""
    leaves, spec = tree_flatten(state)
    if any(isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)
           for t in leaves):
        return None
    pin = torch.cuda.is_available()
    # per leaf: (shape, dtype) of a tensor, or the value itself (optimizer hyperparameters)
    layout = [(t.shape, t.dtype) if isinstance(t, torch.Tensor) else t for t in leaves]
    tensor_at = [isinstance(t, torch.Tensor) for t in leaves]

    def allocate() -> dict:
        out = [torch.empty(item[0], dtype=item[1], pin_memory=pin) if is_tensor else item
               for item, is_tensor in zip(layout, tensor_at, strict=True)]
        return tree_unflatten(out, spec)

    return allocate


def same_layout(a: dict, b: dict) -> bool:
    """Whether two state dicts have the same structure and tensor shapes and dtypes."""
    leaves_a, spec_a = tree_flatten(a)
    leaves_b, spec_b = tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and (x.shape != y.shape or x.dtype != y.dtype):
            return False
    return True


class PinnedPool:
    """Page-locked host memory for the writer's copies of device snapshots, reserved once at
    start-up on a thread of its own, in chunks.

    Why: moving a device snapshot into pageable host memory held the step loop up for as long as
    the copy ran (measured on an H200 with a 1.5B model: the step after each save took 6 s (GRPO)
    and 12.9 s (PPO, actor + critic) instead of 1.3 s), and page-locking the buffers when a save
    is due stalls the same way (step 2's 15.9 s, before 0688c1c). Reserved while the first step
    runs (its time is compile, not GPU work), the pages are locked before the first save, and the
    writer's copies into them are plain DMA on its own stream. Chunks of CHUNK bytes keep each
    page-locking call short. A save that comes before the pool is ready, or whose state does not
    fit, is moved to pageable memory as before.
    """

    CHUNK = 1 << 30

    def __init__(self, nbytes: int, pin: bool = True, chunk: int = CHUNK) -> None:
        self.chunks: list[torch.Tensor] = []
        self.ready = threading.Event()
        self.error: str | None = None
        sizes = [min(chunk, nbytes - start) for start in range(0, max(nbytes, 0), chunk)]

        def reserve() -> None:
            try:
                for size in sizes:
                    self.chunks.append(torch.empty(size, dtype=torch.uint8, pin_memory=pin))
            except Exception as e:  # no more pinned memory to be had: use what was reserved
                self.error = f"{type(e).__name__}: {e}"
            finally:
                self.ready.set()

        threading.Thread(target=reserve, name="rlkube-checkpoint-pin", daemon=True).start()

    @property
    def nbytes(self) -> int:
        return sum(c.numel() for c in self.chunks)

    def carve(self, state: dict) -> dict | None:
        """Host tensors shaped like `state`'s (views into the pool), or None when the pool is not
        ready, a leaf is not a plain tensor (DTensor), or the state does not fit. Tensors do not
        span chunks: the largest go first, each into the first chunk with room (a 1.5B model's
        embedding is ~0.47 GB of a 1 GB chunk)."""
        if not self.ready.is_set():
            return None
        leaves, spec = tree_flatten(state)
        tensors = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
        if any(type(leaves[i]) is not torch.Tensor and not isinstance(leaves[i], torch.nn.Parameter) for i in tensors):
            return None
        out = list(leaves)
        used = [0] * len(self.chunks)
        for i in sorted(tensors, key=lambda i: -leaves[i].numel() * leaves[i].element_size()):
            t = leaves[i]
            size = t.numel() * t.element_size()
            for c, chunk in enumerate(self.chunks):
                offset = -(-used[c] // 64) * 64
                if offset + size <= chunk.numel():
                    out[i] = chunk[offset:offset + size].view(t.dtype).view(t.shape)
                    used[c] = offset + size
                    break
            else:
                return None
        return tree_unflatten(out, spec)


class DeviceSnapshot:
    """A copy of a state dict taken on its own device, moved to host memory later, off the step.

    `take` runs on the training thread: it enqueues one clone per tensor on the current stream and
    records an event after them, so it returns before the copies have even run. `to_host` runs on
    the writer thread: on a side stream that first waits for that event, it copies the snapshot
    into (pageable) host memory, waits for the copies, and drops the device copy.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None

    def take(self, state: dict) -> tuple[dict, Any]:
        with torch.no_grad():
            snapshot = tree_map_only(torch.Tensor, lambda t: t.detach().clone(), state)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        return snapshot, event

    def to_host(self, snapshot: dict, event: Any, host: dict | None = None) -> dict:
        """The snapshot in host memory: in `host` (buffers of the same layout, reused across saves)
        when given and still the snapshot's layout, else in newly allocated pageable memory."""
        if host is None or not same_layout(snapshot, host):
            host = _create_cpu_state_dict(snapshot)
        if not self.cuda:
            return _copy_state_dict(snapshot, host)
        with torch.cuda.stream(self.side):
            self.side.wait_event(event)
            _copy_state_dict(snapshot, host, non_blocking=True)
        # The device copies were allocated on the training stream and read on the side stream:
        # they may be freed (and reused by training) only once the side stream is done with them.
        self.side.synchronize()
        return host
