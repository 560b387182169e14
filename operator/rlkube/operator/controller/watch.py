"""List, then watch: one kind of object kept in a local store, on a thread of its own.

client-go's reflector, reduced to what the inventory needs. The store is listed once, then
followed with a watch from the list's resourceVersion, so no change between the list and the
watch is lost and every event is applied in the API server's order. The watch is bounded on both
sides (the API server ends it after `seconds`, and a socket silent past that raises), and it is
resumed from the last resourceVersion seen (bookmarks keep that recent). When the API server no
longer has that version (410 Gone, as a status or as an ERROR event), the store is listed again
and replaced as a whole. Other failures wait (1 s doubling to 30 s) and resume.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rlkube.operator.controller.kubeapi import ApiError, KubeAPI

logger = logging.getLogger("rlkube.operator")

RETRY_SECONDS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


class Store(Protocol):
    def replace(self, items: list[dict]) -> None: ...

    def apply(self, kind: str, obj: dict) -> None: ...


class Reflector:
    """Keeps `store` equal to the objects at `path` (one resource, optionally filtered)."""

    def __init__(self, api: KubeAPI, path: str, store: Store, query: Mapping[str, Any] | None = None,
                 seconds: int = 300, name: str = "", accept: str = "application/json",
                 sleep: Callable[[float], bool] | None = None) -> None:
        self.api, self.path, self.store = api, path, store
        self.query = dict(query or {})
        self.seconds = seconds
        self.name = name or path
        self.accept = accept
        self.synced = threading.Event()   # the first list is in the store
        self.relists = 0                  # lists made (1 + one per 410 Gone or failed resume)
        self.events = 0
        self.errors = 0
        self.resource_version = ""
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None

    def start(self) -> Reflector:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current read (at most `seconds` + 30 s away; the thread is a daemon)."""
        self._stop.set()

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self._list()
                self._follow()
                failures = 0
            except ApiError as exc:
                if exc.status == 410:  # too old to resume from: list again
                    self.resource_version = ""
                    continue
                failures = self._failed(failures, exc)
            except Exception as exc:  # connection reset, read timeout, a half line
                failures = self._failed(failures, exc)

    def _failed(self, failures: int, exc: Exception) -> int:
        self.errors += 1
        delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
        logger.warning("watch %s failed (%s: %s), resuming in %.0fs", self.name, type(exc).__name__, exc, delay)
        self._sleep(delay)
        return failures + 1

    def _list(self) -> None:
        started = time.monotonic()
        items, version = self.api.list_at(self.path, self.query, accept=self.accept)
        self.store.replace(items)
        self.resource_version = version
        self.relists += 1
        self.synced.set()
        logger.info("watch %s: listed %d objects in %.2fs (resourceVersion %s)", self.name, len(items),
                    time.monotonic() - started, version)

    def _follow(self) -> None:
        query = {**self.query, "resourceVersion": self.resource_version}
        for event in self.api.watch(self.path, query, self.seconds):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""), str(obj.get("message") or ""))
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.store.apply(kind, obj)
                self.events += 1
            if version:
                self.resource_version = version
            if self._stop.is_set():
                return
