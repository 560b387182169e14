"""What every trainer does around its own step: one `Trainer` base for DPO, KTO, PPO and GRPO.

The base owns, so a trainer only says how it builds its data and models and what a step is:
- set-up: the initial seed, the checkpointer (background writes: a save stages the state to host
  memory and a writer thread commits it while training goes on), the GPU monitor, the GPU busy
  sampler and peak FLOP/s, resume (the latest committed checkpoint into the trained modules and
  their optimizers), and the start-up clock (import, model load, first step);
- AdamW construction with the team's settings (betas 0.9/0.95, fused on CUDA);
- the update (`apply_update`): the non-finite-loss guard raised before the optimizer step with the
  step number, gradient clipping, the guard on the gradient norm, the optimizer step;
- the training loop, `train`, which reads as it runs: per step the RNG reseeded from (seed, step,
  rank), the learning-rate schedule applied to every optimizer, the trainer's step, its
  evaluation when due (trainers/evaluation.py), the GPU busy window of every rank (which
  `observe` adapts to: DPO's batcher), the report (trainers/reporting.py: the log line,
  /progress, /metrics), the SIGTERM check agreed by every rank (infra/sigterm.py), the checkpoint
  every `checkpoint.everySteps`, after the last step and after SIGTERM, the Hugging Face export
  when due. The in-flight checkpoint write is committed before `train` returns on every path
  (the process group is shut down only after that, so SIGTERM's exit 143 means "committed").

A subclass implements `build()` (data, models, optimizers; sets `trainable` and `optimizers`),
`train_step(step, lr)` (the step's log fields, its stages marked with `self.busy.phase(...)`;
record.StepRecord types them), `start_event()`, and says what /progress shows of its steps
(`REPORT`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.tokenizer import Tokenizer, load_tokenizer
from rlkube.runtime.engine.freezing import parameter_budget
from rlkube.runtime.infra.checkpoint import Checkpointer, latest
from rlkube.runtime.infra.compile_artifacts import checkpoint_attachments, load_artifacts
from rlkube.runtime.infra.distributed import DistContext, init_from_env, shutdown, tighten_timeout
from rlkube.runtime.infra.errors import NonFiniteLoss, Terminated
from rlkube.runtime.infra.export import Exporter, model_meta
from rlkube.runtime.infra.gpu_busy import BusySampler, JobBusy, gather_busy, sampler_for
from rlkube.runtime.infra.log import emit, log, setup_logging
from rlkube.runtime.infra.metrics import GpuMonitor, peak_flops
from rlkube.runtime.infra.sigterm import SigtermFlag
from rlkube.runtime.infra.staging import checkpoint_bytes_estimate
from rlkube.runtime.infra.startup import DataBeside, StartupClock, compile_cache_counts, compile_seconds
from rlkube.runtime.trainers.batching import SampleCost
from rlkube.runtime.trainers.evaluation import Evaluation
from rlkube.runtime.trainers.record import StepRecord, StepReport, TrainResult
from rlkube.runtime.trainers.reporting import ProgressReport, RunConsole


@dataclass
class TrainerHooks:
    """Test seams: called at fixed points of the loop (production runs leave them unset)."""

    before_micro_batch: Callable[[list[SampleCost]], None] | None = None  # DPO; may raise OutOfMemoryError
    # On the checkpoint writer (a thread of its own), shards written, before the commit; may kill
    # the process or hold the writer.
    before_checkpoint_commit: Callable[[int], None] | None = None
    busy_sampler: Callable[[torch.device], BusySampler] | None = None  # default gpu_busy.sampler_for (NVML)
    # After the last step, on the thread that writes the export from the staged copy, before it
    # writes (the checkpoint's shards are being written meanwhile); may kill the process.
    during_tail: Callable[[int], None] | None = None


_T = TypeVar("_T")
_END = object()


def learning_rate(config: RuntimeConfig, step: int) -> float:
    """Linear warm-up to the peak over warmupSteps, then constant (step is 0-based)."""
    t = config.training
    if t.warmup_steps and step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    return t.lr


def host_numbers(values: dict) -> dict:
    """`values` with every tensor scalar turned into a float, in one transfer (other values pass
    through). Sums kept on the device over a step's micro-batches come to the host here: a float()
    each would make the host wait for the device once per scalar."""
    keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return dict(values)
    got = torch.stack([values[k].detach().double().reshape(()) for k in keys]).tolist()
    return {**values, **dict(zip(keys, got, strict=True))}


def checkpoint_due(config: RuntimeConfig, done: int) -> bool:
    """Whether the run checkpoints after `done` steps: every checkpoint.everySteps and after the
    last step (and after SIGTERM, which the loop says itself)."""
    return done % config.checkpoint.every_steps == 0 or done == config.training.steps


def check_finite(value: float, step: int, what: str) -> None:
    """NonFiniteLoss (exit 4) naming the 1-based step when `value` is NaN or infinite."""
    if not math.isfinite(value):
        raise NonFiniteLoss(step + 1, what, value)


def apply_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: float, max_norm: float, step: int,
    prefix: str = "",
) -> float:
    """Optimizer step on gradients accumulated for `loss` (the mean over all ranks that trained).

    Nothing is stepped when the loss or the clipped gradient norm is not finite: NonFiniteLoss is
    raised first, so a checkpoint never holds weights a NaN touched. Returns the gradient norm.
    """
    check_finite(loss, step, f"{prefix}loss")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    check_finite(norm, step, f"{prefix}gradient norm")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


class Trainer:
    """State of one training run in one process (one rank)."""

    # What /progress and /metrics show of this trainer's steps besides the common fields.
    REPORT: ClassVar[StepReport]
    # Set by save() after the last step: when the tail began, and the /progress fields of the export
    # written beside the checkpoint from its staged copy ([] until written; None: none is).
    tail_started: float | None = None
    staged_export_fields: list | None = None

    def __init__(self, config: RuntimeConfig, ctx: DistContext, hooks: TrainerHooks | None = None) -> None:
        t0 = time.perf_counter()
        self.startup = StartupClock()
        self.startup.mark("import")
        self.config, self.ctx = config, ctx
        self.hooks = hooks or TrainerHooks()
        self.busy = (self.hooks.busy_sampler or sampler_for)(ctx.device)
        self.trainable: torch.nn.Module = torch.nn.Module()  # what this rank checkpoints
        self.optimizers: list[torch.optim.Optimizer] = []
        self.checkpoint_staging = "auto"  # build() may decide from its memory plan (plan_request.staging_of)
        torch.manual_seed(config.training.seed)
        started = time.perf_counter()
        self.compile_artifacts = self.load_compile_artifacts()
        artifacts_seconds = time.perf_counter() - started
        # A committed checkpoint to resume from: the trained roles' weights come from it (restore
        # below loads every parameter of `trainable` or fails), so build() need not read theirs.
        self.resuming = latest(config.checkpoint.dir) is not None
        self.build()
        # Background writes always: the host copy costs the model and optimizer state once more in
        # host memory, which every GPU node this runs on has; the GPU never waits for the disk.
        self.checkpointer = Checkpointer(config.checkpoint.dir, config.checkpoint.keep, ctx, background=True,
                                         staging=self.checkpoint_staging)
        self.checkpointer.before_commit = self.hooks.before_checkpoint_commit
        # torch.compile's work, for the restart; what collecting it cost goes into each save's record
        self.checkpointer.attachments = lambda: checkpoint_attachments(ctx.rank)
        self.monitor = GpuMonitor(ctx.device)
        self.peak, self.peak_source = peak_flops(ctx.device)
        self.start_step = 0
        started = time.perf_counter()
        meta = self.checkpointer.restore(self.trainable, self.optimizers)
        if meta is None and self.resuming:  # removed between the two looks: the weights were never read
            raise RuntimeError(f"checkpoint.dir {config.checkpoint.dir}: the checkpoint to resume from "
                               "disappeared while the models were built; start again")
        if meta is not None:  # the start-up split's restore: the checkpoint and its compile artifacts
            self.startup.add("restore", time.perf_counter() - started + artifacts_seconds)
            self.start_step = int(meta["step"])
            self.load_trainer_state(meta["trainer"])
            log.info(
                "resumed from %s at step %d (written by %d ranks, now %d)",
                config.checkpoint.dir, self.start_step, meta["worldSize"], ctx.world_size,
            )
        # Page-lock host memory for the checkpoint writer while the first step runs (staging.PinnedPool).
        self.checkpointer.reserve(checkpoint_bytes_estimate(self.trainable))
        self.setup_seconds = time.perf_counter() - t0
        self.startup.mark("modelLoad")
        self.compiled_before_first_step = compile_seconds()

    # -- what a trainer defines ----------------------------------------------------------
    def build(self) -> None:
        """Data, models and optimizers of this rank; sets `trainable` and `optimizers`."""
        raise NotImplementedError

    def train_step(self, step: int, lr: float) -> dict:
        """Train step `step` (0-based) at learning rate `lr`; its log fields, an "event": "step"
        dict with at least step, loss, tokens, seconds, tokensPerSecond and mfu (StepRecord)."""
        raise NotImplementedError

    def start_event(self) -> dict:
        raise NotImplementedError

    def trainer_state(self) -> dict:
        """The trainer's own state in the checkpoint's metadata."""
        return {"seed": self.config.training.seed}

    def load_trainer_state(self, state: dict) -> None:
        """Restore what `trainer_state` saved."""

    def decisions(self) -> list[str]:
        """What the run's adaptive batch sizing decided, in order (TrainResult.decisions)."""
        return []

    def evaluate(self) -> dict:
        """The trainer's evaluation on its eval set (trainers/evaluation.py), on every rank; {}
        for a trainer without one."""
        return {}

    def export_source(self) -> tuple[torch.nn.Module, str] | None:
        """The trained actor on this rank, for the Hugging Face export (infra/export.py): the
        module whose `.lm` is the HF model (as sharded for training) and its name prefix in
        `trainable`; None on a rank that does not hold the actor."""
        return None

    def observe(self, rec: StepRecord, job: JobBusy) -> None:
        """After step `rec` and its busy window `job` (every rank's): what the trainer adapts."""

    def close(self) -> None:
        """Stop this run's threads (on every exit path of `train`)."""
        self.busy.close()

    # -- shared pieces -------------------------------------------------------------------
    def adamw(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW over `module`'s parameters, registered with the lr schedule and the checkpoint."""
        t = self.config.training
        optimizer = torch.optim.AdamW(
            # frozen weights (LoRA's base, frozen layers) get no moments
            [p for p in module.parameters() if p.requires_grad],
            lr=t.lr, weight_decay=t.weight_decay, betas=(0.9, 0.95),
            fused=self.ctx.device.type == "cuda",  # one kernel for all parameters instead of a loop
        )
        self.optimizers.append(optimizer)
        return optimizer

    def sync(self) -> None:
        """Wait for the device, so a stage's wall time is its own."""
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def waited(self, items: Iterable[_T]) -> Iterator[_T]:
        """`items`, the wait for each next one marked as the data_wait phase."""
        it = iter(items)
        try:
            while True:
                with self.busy.phase("data_wait"):
                    item = next(it, _END)
                if item is _END:
                    return
                yield item  # type: ignore[misc]
        finally:
            close = getattr(it, "close", None)
            if close is not None:  # a prefetcher's thread stops with it
                close()

    # -- the loop ------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Steps `start_step` .. `training.steps - 1`, then the result. Raises Terminated (exit
        143) after checkpointing when SIGTERM arrived on any rank, NonFiniteLoss from a step."""
        cfg, ctx = self.config, self.ctx
        result = TrainResult(first_step=self.start_step + 1)
        evaluation = Evaluation(cfg, self.evaluate, self.busy)
        # parameter_budget: what partial freezing (training.trainableModules) saves, in numbers
        start = {**self.start_event(), "startupSeconds": self.startup.seconds(), **parameter_budget(self.trainable)}
        # Left in reverse order: the termination message, then the last save committed and the
        # threads stopped (also after SIGTERM or a crash), then SIGTERM's handler (see SigtermFlag),
        # then rank 0's console: the summary of a run that succeeded names its committed checkpoint.
        with RunConsole(cfg, ctx, self.monitor.memory_total()) as console, SigtermFlag() as sigterm, \
                self.committed_on_exit(), ProgressReport(cfg, ctx, console) as report:
            tighten_timeout(ctx)  # start-up is over: a hang from here on becomes an exit
            report.started(start, self.start_step)
            for step in range(self.start_step, cfg.training.steps):
                rec = self.step(step)
                rec.eval = evaluation.after(rec.step)
                self.end_step(rec)
                result.steps.append(rec)
                report.step(rec)
                stop = sigterm.agreed(ctx)  # every rank stops after the same step
                last = rec.step == cfg.training.steps and not stop
                if stop or checkpoint_due(cfg, rec.step):
                    report.checkpointed(self.save(rec.step, last=last))
                if stop:  # a stopped run's checkpoint is exported later, if wanted
                    raise Terminated(rec.step)
                report.exported(self.export(rec.step))
            console.tail(self.tail_done())
            report.succeeded()
        result.decisions = self.decisions()
        return result

    def step(self, step: int) -> StepRecord:
        """Step `step` (0-based) from a state that depends only on (seed, step, rank)."""
        cfg = self.config
        torch.manual_seed((cfg.training.seed * 1_000_003 + step) * 4099 + self.ctx.rank)
        lr = learning_rate(cfg, step)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        self.monitor.reset_peak()
        return StepRecord.from_fields(self.train_step(step, lr), self.REPORT)

    def end_step(self, rec: StepRecord) -> StepRecord:
        """After step `rec` and its evaluation: every rank's GPU busy window into the record, what
        the trainer adapts from it, and on this run's first step the start-up split; `rec`. (A
        benchmark that runs steps without the loop calls `end_step(step(i))`.)"""
        window = self.busy.window()
        job = gather_busy(self.ctx, window)
        rec.gpu_utilization, rec.gpu_busy_phases = job.step_min, job.phase_means()
        rec.phase_seconds = {k: round(v, 4) for k, v in window.phase_seconds.items()}
        rec.busy_ranks = job.ranks
        self.observe(rec, job)
        if "firstStep" not in self.startup.marks:
            self.first_step_done(rec)
        return rec

    def first_step_done(self, rec: StepRecord) -> None:
        """This run's first step `rec` is over: the start-up split completed into its record (its
        compile seconds by torch's timers, its decode graph capture from the step's own field),
        the compile cache's hits and misses (and where the bytecode is cached: bytecode.py), the
        checkpoint's host buffers started."""
        self.startup.mark("firstStep")
        self.startup.add("compile", compile_seconds() - self.compiled_before_first_step)
        self.startup.add("decodeCapture", float(rec.fields.get("decodeCaptureSeconds") or 0.0))
        rec.startup_seconds = self.startup.seconds()
        rec.compile_cache = compile_cache_counts()
        if rec.compile_cache is not None and self.compile_artifacts is not None:
            rec.compile_cache["loaded"] = self.compile_artifacts["path"]
        if rec.compile_cache is not None and sys.pycache_prefix:  # infra/bytecode.py
            rec.compile_cache["bytecode"] = sys.pycache_prefix
        self.checkpointer.prepare(self.trainable, self.optimizers)  # the optimizer has its state now

    def load_compile_artifacts(self) -> dict | None:
        """torch.compile's cache artifacts from the latest committed checkpoint, loaded into this
        process's compile caches before anything compiles (infra/compile_artifacts.py); what was
        loaded, or None."""
        found = latest(self.config.checkpoint.dir)
        return load_artifacts(found[1] if found else None, self.ctx.rank)

    def start_data(self, load: Callable[[Tokenizer], _T]) -> tuple[Tokenizer, DataBeside[_T]]:
        """The tokenizer, loaded here (it is quick, and the models' build reads its vocabulary; its
        load counts to dataLoad and dataWait), and `load(tokenizer)`, reading and tokenising the
        data set, started on a thread so it runs while the build loads the models: `ready()` where
        the data is first needed, the build before that inside `errors_first()`."""
        with self.startup.within("dataLoad", "dataWait"):
            tokenizer = load_tokenizer(self.config.model.tokenizer)
        return tokenizer, DataBeside(self.startup, lambda: load(tokenizer))

    @contextmanager
    def committed_on_exit(self) -> Iterator[None]:
        """On the way out of `train`, however it goes: the in-flight checkpoint committed, then
        this run's threads stopped."""
        try:
            yield
        finally:
            try:
                self.checkpointer.close()
            finally:
                self.close()

    def save(self, step: int, last: bool = False) -> float:
        """Checkpoint after `step` steps (collective); the seconds it held the loop. After the `last`
        step the tail starts here: the export, when due, is written from the checkpoint's staged
        copy while the shards are written (staged_export)."""
        t0 = time.perf_counter()
        if last:
            self.tail_started = t0
            self.staged_export_fields = None
        with self.busy.phase("checkpoint"):  # the stall: waiting for the previous write, staging
            self.checkpointer.save(step, self.trainable, self.optimizers, self.trainer_state(),
                                   model_meta=self.model_meta(), with_staged=self.staged_export(step) if last else None)
        return time.perf_counter() - t0

    def staged_export(self, step: int) -> Callable[[dict], None] | None:
        """The run's final export written from the checkpoint's staged host copy, on a thread
        beside the checkpoint writer (infra/checkpoint.py `with_staged`): one copy of the state
        leaves the device, and the tail is as long as the longer of the two writes, not their sum.
        Only where this rank holds the whole actor (not sharded) and is rank 0; elsewhere None
        (the export gathers the shards itself, `export`, while the checkpoint is written)."""
        source = self.export_source()
        exporter = Exporter(self.config, self.ctx.is_main)
        if source is None or not self.ctx.is_main or self.ctx.sharded("actor") or not exporter.due(step):
            return None
        wrapper, prefix = source
        hf_config = wrapper.lm.config.to_dict()
        self.staged_export_fields = fields = []
        hook = self.hooks.during_tail

        def write(state: dict) -> None:
            if hook is not None:
                hook(step)
            fields.append(exporter.from_staged(step, state["model"], prefix, hf_config))

        return write

    def model_meta(self) -> dict | None:
        """What a checkpoint records of the actor's model, so `rlkube export` needs nothing else."""
        source = self.export_source()
        return model_meta(source[0].lm, self.config.model, source[1]) if source else None

    def export(self, step: int) -> dict | None:
        """The HF export after `step` steps when due (collective over the actor's ranks); its
        /progress fields on rank 0. After the last step: the checkpoint and the export committed
        (an export from the staged copy is written with the checkpoint: waited for here)."""
        fields = None
        if self.staged_export_fields is None:  # none written beside the checkpoint: gather and write here
            source = self.export_source()
            fields = Exporter(self.config, self.ctx.is_main)(step, source[0] if source else None)
        if self.tail_started is not None:
            self.checkpointer.wait()  # the last checkpoint committed (and the export beside it written)
            fields = self.staged_export_fields[0] if self.staged_export_fields else fields
        return fields

    def tail_done(self) -> float | None:
        """Seconds from the end of the last step to now, when the last checkpoint and the export
        are committed and the process may exit (None: this run computed no last step)."""
        if self.tail_started is None:
            return None
        seconds = round(time.perf_counter() - self.tail_started, 3)
        if self.ctx.is_main:
            emit({"event": "tail", "step": self.config.training.steps, "tailSeconds": seconds})
        return seconds


def train_on_this_rank(
    make_trainer: Callable[[RuntimeConfig, DistContext], Trainer], config: RuntimeConfig, ctx: DistContext | None
) -> TrainResult:
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


def run_trainer(
    trainer: type[Trainer], config: RuntimeConfig, ctx: DistContext | None, hooks: TrainerHooks | None
) -> TrainResult:
    """`trainer(config, ctx, hooks).train()` as this process's rank (train_on_this_rank)."""
    return train_on_this_rank(lambda cfg, rank_ctx: trainer(cfg, rank_ctx, hooks), config, ctx)
