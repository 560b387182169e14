"""Rank 0's output format, and a few lines redrawn in place on a terminal.

The format (`log_format`): JSON lines, one object a line, where stdout is not a terminal (a pod's
log, CI, a pipe) and the progress view where it is; `--log-format json|text` (the CLI sets
RLKUBE_LOG_FORMAT, which the workers it starts inherit) overrides the guess.

`LiveLines` keeps a few lines at the bottom of stdout and redraws them in place with plain ANSI
(carriage return, cursor up, erase line): no dependency, nothing the runtime images must carry.
Permanent lines (`note`) go above them. While it runs, `sys.stderr` is wrapped where it is the
same terminal: a write there (a log line, a Python warning, a library's progress bar) first
erases the live lines and, once the written text ends its line, draws them again below it, so
the view is never torn.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import TextIO

LOG_FORMAT_ENV = "RLKUBE_LOG_FORMAT"
LOG_FORMATS = ("auto", "json", "text")
_ERASE_LINE = "\r\x1b[2K"
_UP = "\x1b[1A"


def log_format(env: dict[str, str] | None = None, stdout: TextIO | None = None) -> str:
    """"json" or "text": RLKUBE_LOG_FORMAT when it says one, else text where stdout is a terminal."""
    env = os.environ if env is None else env
    stdout = sys.stdout if stdout is None else stdout
    chosen = env.get(LOG_FORMAT_ENV, "auto")
    if chosen in ("json", "text"):
        return chosen
    try:
        return "text" if stdout.isatty() else "json"
    except (AttributeError, ValueError):  # a replaced or closed stream: not a terminal
        return "json"


def fit(line: str, width: int) -> str:
    """`line` cut to `width` - 1 columns: a line that wraps would break the cursor-up redraw."""
    return line if len(line) < width else line[: max(width - 2, 0)] + "~"


class LiveLines:
    """Lines at the bottom of `out`, redrawn in place; permanent lines above them. Thread-safe
    (the checkpoint writer's thread notes its commits)."""

    def __init__(self, out: TextIO | None = None, guard_stderr: bool | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.lines: list[str] = []
        self.drawn = 0  # how many live lines are on the screen now
        self.partial = False  # stderr wrote a line it has not ended: the live lines go below it
        self.lock = threading.RLock()
        self._stderr: TextIO | None = None
        if guard_stderr is None:
            guard_stderr = _isatty(sys.stderr) and _isatty(self.out)
        if guard_stderr:
            self._stderr = sys.stderr
            sys.stderr = _GuardedStream(sys.stderr, self)

    def show(self, lines: list[str]) -> None:
        """Replace the live lines."""
        with self.lock:
            self.lines = list(lines)
            self._erase()
            self._draw()

    def note(self, line: str) -> None:
        """A permanent line above the live ones."""
        with self.lock:
            self._erase()
            self._end_partial()
            self.out.write(line + "\n")
            self._draw()

    def close(self) -> None:
        """Leave the live lines as the last drawn, end their line, give stderr back."""
        with self.lock:
            if self.drawn:
                self.out.write("\n")
                self.out.flush()
            self.drawn, self.lines = 0, []
            if self._stderr is not None and isinstance(sys.stderr, _GuardedStream):
                sys.stderr = self._stderr
            self._stderr = None

    def _erase(self) -> None:
        if self.drawn:
            self.out.write(_ERASE_LINE + (_UP + _ERASE_LINE) * (self.drawn - 1))
            self.out.flush()
            self.drawn = 0

    def _draw(self) -> None:
        if not self.lines:
            self.out.flush()
            return
        self._end_partial()
        width = shutil.get_terminal_size((120, 24)).columns
        self.out.write("\n".join(fit(line, width) for line in self.lines))
        self.out.flush()
        self.drawn = len(self.lines)

    def _end_partial(self) -> None:
        if self.partial:
            self.out.write("\n")
            self.partial = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _GuardedStream:
    """stderr while the live lines are shown: each write erases them first and draws them again
    when the text ends its line (a progress bar's carriage-return updates leave them off until
    then, or until the next step's redraw, which starts them on a line of their own)."""

    def __init__(self, inner: TextIO, live: LiveLines) -> None:
        self._inner, self._live = inner, live

    def write(self, text: str) -> int:
        if not text:
            return 0
        with self._live.lock:
            self._live._erase()
            n = self._inner.write(text)
            self._inner.flush()
            self._live.partial = not text.endswith("\n")
            if not self._live.partial:
                self._live._draw()
            return n

    def flush(self) -> None:
        self._inner.flush()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)
