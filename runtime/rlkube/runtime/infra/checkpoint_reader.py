"""Reading a checkpoint's tensors on several threads, each with one read of its bytes.

DCP's FileSystemReader reads the tensors of a shard file one after another, each through
torch.load on a view of the open file that torch.load reads in many small pieces. A restart
waits for all of it before its first step: on an H100, a 1.5B GRPO job's build took 8.5 s on a
restart against 4.8 s on a fresh start, and reading its 8.6 GiB checkpoint (the model and its
AdamW state) is in that difference. `ParallelReader` reads each tensor's bytes with one read
into memory, loads them there and copies them into their target, on READ_THREADS threads (file
reads, torch.load's copies and the copy into the target leave the GIL to the others). On a
2-core CPU, 4.5 GiB of bf16 tensors in 1,008 items from the page cache: 5.7 s with
FileSystemReader, 2.1-2.2 s with 2 threads, 2.5 s with 8.

What it does not read itself (an item written through a storage transform, or a non-tensor
object) goes to FileSystemReader's own read, unchanged. Each thread holds at most one tensor in
two host copies (its bytes and the loaded tensor) at a time.
"""

from __future__ import annotations

import dataclasses
import io
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

READ_THREADS = 4


class ParallelReader(FileSystemReader):
    """FileSystemReader whose plain tensors are read on `threads` threads (module docstring)."""

    def __init__(self, path, threads: int = READ_THREADS) -> None:
        super().__init__(path)
        self.threads = max(1, threads)

    def _plain(self, item: ReadItem) -> bool:
        return item.type == LoadItemType.TENSOR and not self.storage_data[item.storage_index].transform_descriptors

    def _read_tensor(self, item: ReadItem, planner: LoadPlanner) -> tuple[ReadItem, torch.Tensor]:
        info = self.storage_data[item.storage_index]
        with self.fs.create_stream(self.fs.concat_path(self.path, info.relative_path), "rb") as stream:
            stream.seek(info.offset)
            data = stream.read(info.length)
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise ValueError(f"checkpoint item {item.storage_index}: stored size {tuple(tensor.size())} "
                             f"does not match the target's {tuple(target.size())}")
        target.copy_(tensor)
        return item, target

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        plain = [item for item in plan.items if self._plain(item)]
        rest = [item for item in plan.items if not self._plain(item)]
        if rest:
            super().read_data(dataclasses.replace(plan, items=rest), planner).wait()
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="checkpoint-read") as pool:
            done = list(pool.map(lambda item: self._read_tensor(item, planner), plain))
        for item, target in done:  # on this thread, as FileSystemReader commits
            planner.commit_tensor(item, target)
        finished: Future[None] = Future()
        finished.set_result(None)
        return finished
