"""The runtime's log output, and `warn_once` for settings that are ignored.

Logs go to stderr through the `rlkube.runtime` logger. `emit(record)` writes one JSON object a
line on stdout (step metrics, phase changes): that is what `kubectl logs` shows and what tests
parse. A warning about an ignored setting is printed once per process, loudly, saying what is
used instead (CONVENTIONS: never fall back silently).
"""

from __future__ import annotations

import json
import logging
import sys
import time

log = logging.getLogger("rlkube.runtime")
_warned: set[str] = set()


def setup_logging(rank: int) -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
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


def emit(record: dict) -> None:
    """One JSON line on stdout."""
    record = {"time": round(time.time(), 3), **record}
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()
