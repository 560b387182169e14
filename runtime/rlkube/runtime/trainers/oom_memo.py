"""Budgets an out-of-memory error shrank on a job of several ranks, kept for the restart.

On one rank an out-of-memory error is redone at a smaller budget inside the step. With several
ranks it cannot be: the other ranks are waiting inside collectives, so the attempt ends and the
operator restarts the job from its last checkpoint, whose budgets are the ones that ran out. So
the rank that ran out writes the shrunk budgets here first (one small JSON file per rank, under
the checkpoint directory every rank of the job sees), and a restarted trainer starts from the
smallest of them (the ranks then agree on the smallest over all ranks). The files stay: a
budget that ran out once is not tried again by later restarts of the job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MEMO_DIR = "oom-budgets"


def remember(checkpoint_dir: str | Path, rank: int, budgets: dict[str, float]) -> None:
    """Write `budgets` (name -> value) as rank `rank`'s memo, atomically."""
    folder = Path(checkpoint_dir) / MEMO_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(budgets))
    os.replace(tmp, folder / f"rank-{rank}.json")


def recalled(checkpoint_dir: str | Path) -> dict[str, float]:
    """The smallest value of each budget over every rank's memo ({} when there is none); an
    unreadable memo is skipped."""
    folder = Path(checkpoint_dir) / MEMO_DIR
    out: dict[str, float] = {}
    for path in sorted(folder.glob("rank-*.json")) if folder.is_dir() else []:
        try:
            memo = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, value in memo.items() if isinstance(memo, dict) else ():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = min(out.get(name, value), value)
    return out
