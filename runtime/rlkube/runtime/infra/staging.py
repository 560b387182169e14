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
