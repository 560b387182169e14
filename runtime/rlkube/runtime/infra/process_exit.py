"""Leaving the process once the run's outcome is written, without the interpreter's teardown.

Why: after a run returns, everything it must leave behind is committed: the last checkpoint and
the export (`Trainer.train` waits for them), the trackers' files (each tracker's `finish`), the
termination message and the summary on stdout. What the interpreter still does on a normal exit
is only undoing: joining the threads that are left (the health server, prefetchers), running
libraries' atexit handlers (torch.compile's worker pool shuts its processes down one by one),
collecting every module's objects (the models, the optimizer state, the pinned host copies of a
checkpoint, each freed through CUDA) and unloading the libraries. On a 2-core CPU with a
2-layer model the last step to exit took 1.5-2.8 s with that teardown and 0.16-0.22 s without
(tests/gpu/bench_utilization.py --cpu --tiny); the H100 runs exited 4-6 s after their tail, a
pod's GPU held idle the whole time.

So `python -m rlkube.runtime` flushes stdout, stderr and the logging handlers and ends with
os._exit. The kernel frees the memory and closes the files, as it does for any exit, and
torch.compile's worker processes leave by themselves once their parent is gone (they watch its
pid). Only the entry point does this
(a caller of `cli.main` gets its return value), and `RLKUBE_FAST_EXIT=0` turns it off, for a
profiler or a leak checker that reports at exit.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

ENV_FAST_EXIT = "RLKUBE_FAST_EXIT"


def fast_exit_enabled(env: dict[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(ENV_FAST_EXIT, "1") != "0"


def exit_now(code: int) -> NoReturn:
    """Exit with `code` after flushing what this process wrote; no teardown (see the module)."""
    logging.shutdown()  # flushes and closes every handler
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to flush into
            pass
    os._exit(code)
