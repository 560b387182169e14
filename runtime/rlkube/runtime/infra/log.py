"""The runtime's log output, and `warn_once` for settings that are ignored.

Logs go to stderr through the `rlkube.runtime` logger. `emit(record)` writes one JSON object a
line on stdout (step metrics, phase changes): that is what `kubectl logs` shows and what tests
parse; while rank 0 shows the progress view on a terminal (trainers/reporting.RunConsole), the
view takes the records instead (`route_events`) and says them in words. A warning about an ignored setting is printed once per process, loudly, saying what is
used instead: nothing falls back silently.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

log = logging.getLogger("rlkube.runtime")
_warned: set[str] = set()
_event_sink: Callable[[dict], None] | None = None


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes: the progress view wraps it so a log
    line never tears the view (infra/terminal.py)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(rank: int) -> None:
    if log.handlers:
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def warn_once(key: str, message: str) -> None:
    """Log `message` as a warning the first time `key` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    log.warning("IGNORED SETTING: %s", message)


def route_events(sink: Callable[[dict], None] | None) -> None:
    """Hand `emit`'s records to `sink` instead of writing them (None: JSON lines again)."""
    global _event_sink
    _event_sink = sink


def emit(record: dict) -> None:
    """One JSON line on stdout (or the record to the sink `route_events` set)."""
    sink = _event_sink
    if sink is not None:
        sink(record)
        return
    record = {"time": round(time.time(), 3), **record}
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()
