"""The loop every trainer runs around its own step (base.Trainer.train calls it for DPO, PPO and GRPO).

What it owns, so the trainers only say what a step is:
- the HTTP endpoint (progress.py): one server per pod, on the pod's first process (pods have
  their own network namespace; the operator's probes hit it). Rank 0 serves /progress and
  /metrics, the first process of every other pod /healthz only;
- SIGTERM: noted by a flag, agreed on by all ranks at the end of each step (so every rank stops
  after the same step), then a checkpoint and `Terminated`;
- the checkpoint cadence: every `checkpoint.everySteps`, and after the last step;
- the phases the operator reads from /progress: training, succeeded, failed (non-finite loss),
  and the last report as the container's termination message when the loop ends;
- what /progress and /metrics show of a step: its throughput and loss, its GPU busy fraction and
  per-phase busy and seconds, the start-up split, and `rlkube_gpu_busy_ratio{role,rank,phase}`
  for every rank; of a checkpoint save, how long it held the loop (docs/metrics.md).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import (
    DistContext,
    all_reduce_max,
    init_from_env,
    shutdown,
    tighten_timeout,
)
from rlkube.runtime.infra.errors import NonFiniteLoss, Terminated
from rlkube.runtime.infra.log import emit, log, setup_logging
from rlkube.runtime.infra.metrics import BusyGauges
from rlkube.runtime.infra.progress import (
    Progress,
    ProgressServer,
    adopt_early_server,
    write_termination_message,
)
from rlkube.runtime.infra.sigterm import training_started


class SigtermFlag:
    """Set by SIGTERM; the loop checks it at step boundaries.

    A context manager: the trainer holds it from its first step until its last save has committed
    (base.Trainer.train), not only while the loop runs. A SIGTERM that comes after the loop stopped,
    while that save is still written in the background (a second SIGTERM, say), must not end the
    process before the commit, as it did while the loop put the start-up handler back on its way
    out (tests/training/test_checkpoint_background.py).
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

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def serve_progress(cfg: RuntimeConfig, ctx: DistContext, progress: Progress | None) -> ProgressServer | None:
    """The pod's HTTP endpoint, on its first process only (None elsewhere, or when it cannot listen)."""
    if not cfg.progress_port or ctx.local_rank != 0:
        return None
    early = adopt_early_server()
    if early is not None:
        early.attach(progress)
        return early
    try:
        return ProgressServer(progress, cfg.progress_port)
    except OSError as e:
        log.warning("progress server: cannot listen on port %d (%s); not serving", cfg.progress_port, e)
        return None


def run_steps(
    cfg: RuntimeConfig,
    ctx: DistContext,
    sigterm: SigtermFlag,
    start_step: int,
    start_event: dict,
    step: Callable[[int], dict],
    save: Callable[[int], None],
    progress_fields: Callable[[dict], dict],
    report: Callable[[int, dict], None] | None = None,
    busy_ranks: Callable[[], list[dict]] | None = None,
    export: Callable[[int], dict | None] | None = None,
) -> None:
    """Run steps `start_step` .. `training.steps - 1`, stopping after a step when `sigterm` (the
    caller's, entered) is set on any rank.

    `step(i)` trains step i and returns its record (an "event": "step" dict with at least
    tokens, loss, mfu, tokensPerSecond and gpuUtilization, which /progress shows); `save(n)`
    checkpoints after n steps (collective); `progress_fields(rec)` is what else /progress shows
    of a record (rewardMean, extra); `report(n, rec)` prints it on rank 0 (default: a JSON line);
    `busy_ranks()` is every rank's busy row of the last step (gpu_busy.JobBusy.ranks), exported
    on /metrics; `export(n)` exports the model after n steps when due (collective over the actor's
    ranks) and returns the /progress fields that say so. Raises Terminated after checkpointing
    when SIGTERM arrived, NonFiniteLoss from a step.
    """
    total = cfg.training.steps
    progress = Progress(total, gpus=ctx.world_size) if ctx.is_main else None
    gauges = BusyGauges(progress.registry, ctx.role_ranks) if progress is not None and busy_ranks else None
    server = serve_progress(cfg, ctx, progress)
    tighten_timeout(ctx)
    if ctx.is_main:
        emit(start_event)
    if progress is not None:
        progress.update(phase="training", step=start_step, startupSeconds=start_event.get("startupSeconds"))
    try:
        for i in range(start_step, total):
            rec = step(i)
            done = i + 1
            if progress is not None:
                progress.update(tokens=rec["tokens"], step=done, loss=rec["loss"], mfu=rec["mfu"],
                                tokensPerSecond=rec["tokensPerSecond"], stepSeconds=rec.get("seconds"),
                                gpuUtilization=rec["gpuUtilization"],
                                gpuBusyPhases=rec.get("gpuBusyPhases"), phaseSeconds=rec.get("phaseSeconds"),
                                **progress_fields(rec))
                if "startupSeconds" in rec:  # the first step of this run completes the split
                    progress.update(startupSeconds=rec["startupSeconds"])
                if gauges is not None:
                    gauges.set(busy_ranks())
            if ctx.is_main:
                report(done, rec) if report is not None else emit(rec)
            stop = all_reduce_max(ctx, [1.0 if sigterm.set else 0.0])[0] > 0
            if done % cfg.checkpoint.every_steps == 0 or done == total or stop:
                saving = time.perf_counter()
                save(done)
                if progress is not None:
                    progress.observe_checkpoint(time.perf_counter() - saving)
            if export is not None and not stop:  # a stopped run's checkpoint is exported later, if wanted
                exported = export(done)
                if progress is not None and exported:
                    progress.update(**exported)
            if stop:
                raise Terminated(done)
        if progress is not None:
            progress.update(phase="succeeded")
    except NonFiniteLoss:
        if progress is not None:
            progress.update(phase="failed")
        raise
    finally:
        if progress is not None:
            write_termination_message(progress)
        if server is not None:
            server.stop()


class _Trainer(Protocol):
    def train(self) -> Any: ...


def train_on_this_rank(
    make_trainer: Callable[[RuntimeConfig, DistContext], _Trainer], config: RuntimeConfig, ctx: DistContext | None
) -> Any:
    """`make_trainer(config, ctx).train()` as this process's rank. Without `ctx` the rank joins
    the process group from its environment here and leaves it afterwards; a caller's context is
    the caller's to shut down."""
    own_ctx = ctx is None
    ctx = ctx or init_from_env(config.device_map)
    setup_logging(ctx.rank)
    try:
        return make_trainer(config, ctx).train()
    finally:
        if own_ctx:
            shutdown(ctx)
            sys.stdout.flush()
