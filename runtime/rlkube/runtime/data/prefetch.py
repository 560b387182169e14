"""Prepare micro-batches ahead on a background thread, so the GPU never waits for collation.

`Prefetcher(make, items, depth, pin)` yields `make(item)` for each item in order. A daemon
thread runs up to `depth` items ahead; on CUDA the results are put in pinned (page-locked)
memory so the host-to-device copy can run asynchronously (`TokenBatch.to(non_blocking=True)`).
With depth 0 everything happens inline. An exception in the thread is re-raised in the
consumer at the item where it happened.

`start()` begins before the consumer asks: a trainer starts the next step's micro-batches while
the GPU still runs this step's last one, so a step's first micro-batch is ready when the step
begins (trainers/dpo.py). `close()` stops a prefetcher that will not be consumed.
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
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None

    def _prepare(self, item: Any) -> Any:
        out = self.make(item)
        return out.pin_memory() if self.pin else out

    def _work(self, q: queue.Queue) -> None:
        try:
            for item in self.items:
                if self._stop.is_set():
                    return
                q.put(("ok", self._prepare(item)))
            q.put(("ok", _DONE))
        except BaseException as e:  # handed to the consumer, raised there
            q.put(("error", e))

    def start(self) -> Prefetcher:
        """Begin preparing items now (depth > 0; again: no-op)."""
        if self.depth > 0 and self._thread is None:
            self._queue = queue.Queue(maxsize=self.depth)
            self._thread = threading.Thread(target=self._work, args=(self._queue,), name="rlkube-prefetch",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the producer thread, if any (it may be waiting on a full queue)."""
        self._stop.set()
        while self._thread is not None and self._thread.is_alive():
            try:
                self._queue.get_nowait()  # type: ignore[union-attr]
            except queue.Empty:
                self._thread.join(timeout=0.05)

    def __iter__(self) -> Iterator[Any]:
        if self.depth <= 0:
            for item in self.items:
                yield self._prepare(item)
            return
        if self._stop.is_set():
            raise RuntimeError("a Prefetcher is iterated once; this one is closed")
        q = self.start()._queue
        try:
            while True:
                kind, value = q.get()  # type: ignore[union-attr]
                if kind == "error":
                    raise value
                if value is _DONE:
                    return
                yield value
        finally:
            self.close()
