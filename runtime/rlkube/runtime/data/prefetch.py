"""Prepare micro-batches ahead on a background thread, so the GPU never waits for collation.

`Prefetcher(make, items, depth, pin)` yields `make(item)` for each item in order. A daemon
thread runs up to `depth` items ahead; on CUDA the results are put in pinned (page-locked)
memory so the host-to-device copy can run asynchronously (`TokenBatch.to(non_blocking=True)`).
With depth 0 everything happens inline. An exception in the thread is re-raised in the
consumer at the item where it happened.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_DONE = object()


class Prefetcher:
    def __init__(self, make: Callable[[Any], Any], items: Iterable[Any], depth: int, pin: bool = False) -> None:
        self.make = make
        self.items = list(items)
        self.depth = depth
        self.pin = pin
        self._stop = threading.Event()

    def _prepare(self, item: Any) -> Any:
        out = self.make(item)
        return out.pin_memory() if self.pin else out

    def __iter__(self) -> Iterator[Any]:
        if self.depth <= 0:
            for item in self.items:
                yield self._prepare(item)
            return
        q: queue.Queue = queue.Queue(maxsize=self.depth)

        def work() -> None:
            try:
                for item in self.items:
                    if self._stop.is_set():
                        return
                    q.put(("ok", self._prepare(item)))
                q.put(("ok", _DONE))
            except BaseException as e:  # handed to the consumer, raised there
                q.put(("error", e))

        thread = threading.Thread(target=work, name="rlkube-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = q.get()
                if kind == "error":
                    raise value
                if value is _DONE:
                    return
                yield value
        finally:
            self._stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)
