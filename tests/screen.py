"""What a terminal shows after some output: the few control sequences the progress view writes
(infra/terminal.py: carriage return, erase line, cursor up) applied to a screen of lines, so a
test reads the screen a person would see, not the bytes."""

from __future__ import annotations

import re

_TOKENS = re.compile(r"\x1b\[(\d*)([A-Za-z])|\r\n|\r|\n|[^\x1b\r\n]+")


def screen(output: str) -> list[str]:
    """The lines of the screen after `output` (no scrolling limit, trailing spaces dropped)."""
    lines, row, col = [""], 0, 0
    for m in _TOKENS.finditer(output):
        token = m.group(0)
        if m.group(2) is not None:
            n = int(m.group(1) or 1)
            if m.group(2) == "A":  # cursor up
                row = max(row - n, 0)
            elif m.group(2) == "K":  # erase line (2K: the whole line)
                lines[row] = "" if m.group(1) == "2" else lines[row][:col]
            else:
                raise AssertionError(f"unexpected control sequence {token!r}")
        elif token == "\r":
            col = 0
        elif token in ("\n", "\r\n"):  # a pty turns "\n" into "\r\n"
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token):]
            col += len(token)
    while lines and not lines[-1].strip():
        lines.pop()
    return [line.rstrip() for line in lines]
