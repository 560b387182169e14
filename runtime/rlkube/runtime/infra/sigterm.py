"""SIGTERM: while a trainer starts, exit at once, 143 (EXIT_TERMINATED); once it trains, stop at
a step boundary that every rank agrees on, after a checkpoint (`SigtermFlag`).

In a pod the trainer is PID 1 of its container, and the kernel delivers to PID 1 no signal it has
no handler for: until the step loop installs its own SIGTERM handler (`SigtermFlag`), a pod
deleted while its trainer imported torch, met its gang, loaded the model or resumed went unheard. The trainer then trained on as if nothing had happened, for up to the pod's
terminationGracePeriodSeconds (120 s) before the kubelet's SIGKILL, committing checkpoints for an
attempt the operator had already ended; the chaos soak saw a GRPO pod deleted a second before its
first step train all 200 steps and export (2026-12-04 14:50).

So `run` installs `stop_while_starting` first thing, and the trainer calls `training_started` once
the loop's handler is in place. Stopping during start-up loses nothing: the attempt has trained no
step, and what it resumes from is already committed. Once the trainer's last save has committed
(`SigtermFlag`) a SIGTERM gets the default action again, as before: ignored in PID 1, the end
elsewhere. Kept free of torch at import, so the start-up handler is in place before
torch is imported.
"""

from __future__ import annotations

import os
import signal
import sys

from rlkube.runtime.contract.pod import EXIT_TERMINATED

_starting = False


def _handle(signum, frame) -> None:
    if _starting:
        print("rlkube: stopped by SIGTERM while starting (no step trained in this attempt)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_TERMINATED)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # past start-up: what the process did before
    os.kill(os.getpid(), signal.SIGTERM)


def stop_while_starting() -> None:
    """From now until `training_started`, SIGTERM exits with EXIT_TERMINATED (main thread only)."""
    global _starting
    _starting = True
    signal.signal(signal.SIGTERM, _handle)


def training_started() -> None:
    """The step loop's handler is installed: start-up is over."""
    global _starting
    _starting = False


class SigtermFlag:
    """Set by SIGTERM once training runs; the loop asks, after each step, whether any rank has it
    (`agreed`), so every rank stops after the same step.

    A context manager: the trainer holds it from its first step until its last save has committed
    (trainers/base.Trainer.train), not only while the steps run. A SIGTERM that comes after the
    last step, while that save is still written in the background (a second SIGTERM, say), must not
    end the process before the commit (tests/training/test_checkpoint_background.py).
    """

    def __init__(self) -> None:
        self.set = False
        self._old = None

    def __enter__(self) -> SigtermFlag:
        try:
            self._old = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread (tests calling train() from a thread)
            self._old = None
        training_started()  # SIGTERM now stops at a step boundary, after a checkpoint
        return self

    def _handle(self, signum, frame) -> None:
        self.set = True

    def agreed(self, ctx) -> bool:
        """Whether any rank got SIGTERM (a collective: every rank asks after the same step)."""
        from rlkube.runtime.infra.distributed import all_reduce_max  # torch: loaded by training by now

        return all_reduce_max(ctx, [1.0 if self.set else 0.0])[0] > 0

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
