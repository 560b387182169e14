"""What every trainer does around its own step: one `Trainer` base for DPO, PPO and GRPO.

The base owns, so a trainer only says how it builds its data and models and what a step is:
- set-up: the initial seed, the checkpointer (background writes: a save stages the state to host
  memory and a writer thread commits it while training goes on), the GPU monitor, the GPU busy
  sampler and peak FLOP/s, resume (the latest committed checkpoint into the trained modules and
  their optimizers), and the start-up clock (import, model load, first step);
- AdamW construction with the team's settings (betas 0.9/0.95, fused on CUDA);
- per step: the RNG reseeded from (seed, step, rank), the learning-rate schedule applied to
  every optimizer, the peak-memory counter reset; after it, the step's GPU busy window gathered
  from every rank into the record (gpuUtilization, gpuBusyPhases, phaseSeconds) and handed to
  `observe` (DPO's batcher decides from it);
- the update (`apply_update`): the non-finite-loss guard raised before the optimizer step with the
  step number, gradient clipping, the guard on the gradient norm, the optimizer step;
- the step loop (loop.run_steps: endpoint, SIGTERM, checkpoint cadence), the result, save; the
  in-flight checkpoint write committed before `train` returns on every path (the process group
  is shut down only after that, so SIGTERM's exit 143 means "committed").

A subclass implements `build()` (data, models, optimizers; sets `trainable` and `optimizers`),
`train_step(step, lr)` (the step's record, its stages marked with `self.busy.phase(...)`),
`start_event()` and `progress_fields(rec)`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.freezing import parameter_budget
from rlkube.runtime.infra.checkpoint import Checkpointer
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.errors import NonFiniteLoss
from rlkube.runtime.infra.export import Exporter, model_meta
from rlkube.runtime.infra.gpu_busy import BusySampler, JobBusy, gather_busy, sampler_for, step_fields
from rlkube.runtime.infra.log import log
from rlkube.runtime.infra.metrics import GpuMonitor, peak_flops
from rlkube.runtime.infra.staging import checkpoint_bytes_estimate
from rlkube.runtime.infra.startup import StartupClock, compile_cache_counts
from rlkube.runtime.trainers.batching import SampleCost
from rlkube.runtime.trainers.evaluation import eval_due, eval_progress
from rlkube.runtime.trainers.loop import SigtermFlag, run_steps, train_on_this_rank


@dataclass
class TrainerHooks:
    """Test seams: called at fixed points of the loop (production runs leave them unset)."""

    before_micro_batch: Callable[[list[SampleCost]], None] | None = None  # DPO; may raise OutOfMemoryError
    # On the checkpoint writer (a thread of its own), shards written, before the commit; may kill
    # the process or hold the writer.
    before_checkpoint_commit: Callable[[int], None] | None = None
    busy_sampler: Callable[[torch.device], BusySampler] | None = None  # default gpu_busy.sampler_for (NVML)


_T = TypeVar("_T")
_END = object()


@dataclass
class TrainResult:
    """What one run of `train()` computed in this process: the step records, in order."""

    steps_run: int
    first_step: int  # 1-based number of the first step this run computed
    records: list[dict] = field(default_factory=list)
    batcher_decisions: list[str] = field(default_factory=list)  # DPO's adaptive batcher, in order

    @property
    def losses(self) -> list[float | None]:
        return [r["loss"] for r in self.records]

    @property
    def accuracies(self) -> list[float]:
        """DPO: preference accuracy of each step."""
        return [r["accuracy"] for r in self.records]

    @property
    def evals(self) -> list[dict]:
        """The evaluations of this run, in order (trainers/evaluation.py)."""
        return [r["eval"] for r in self.records if "eval" in r]

    @property
    def reward_means(self) -> list[float]:
        """PPO/GRPO: mean reward of each step's rollout."""
        return [r["rewardMean"] for r in self.records]


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

    def __init__(self, config: RuntimeConfig, ctx: DistContext, hooks: TrainerHooks | None = None) -> None:
        t0 = time.perf_counter()
        self.startup = StartupClock()
        self.startup.mark("import")
        self.config, self.ctx = config, ctx
        self.hooks = hooks or TrainerHooks()
        self.busy = (self.hooks.busy_sampler or sampler_for)(ctx.device)
        self.job_busy = JobBusy([])  # the last step's busy window, every rank's row
        self.trainable: torch.nn.Module = torch.nn.Module()  # what this rank checkpoints
        self.optimizers: list[torch.optim.Optimizer] = []
        self.checkpoint_staging = "auto"  # build() may decide from its memory plan (plan_request.staging_of)
        torch.manual_seed(config.training.seed)
        self.build()
        # Background writes always: the host copy costs the model and optimizer state once more in
        # host memory, which every GPU node this runs on has; the GPU never waits for the disk.
        self.checkpointer = Checkpointer(config.checkpoint.dir, config.checkpoint.keep, ctx, background=True,
                                         staging=self.checkpoint_staging)
        self.checkpointer.before_commit = self.hooks.before_checkpoint_commit
        self.monitor = GpuMonitor(ctx.device)
        self.peak, self.peak_source = peak_flops(ctx.device)
        self.start_step = 0
        meta = self.checkpointer.restore(self.trainable, self.optimizers)
        if meta is not None:
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

    # -- what a trainer defines ----------------------------------------------------------
    def build(self) -> None:
        """Data, models and optimizers of this rank; sets `trainable` and `optimizers`."""
        raise NotImplementedError

    def train_step(self, step: int, lr: float) -> dict:
        """Train step `step` (0-based) at learning rate `lr`; its "event": "step" record."""
        raise NotImplementedError

    def start_event(self) -> dict:
        raise NotImplementedError

    def progress_fields(self, rec: dict) -> dict:
        """What /progress shows of a step record besides the common fields (see loop.run_steps)."""
        raise NotImplementedError

    def report(self) -> Callable[[int, dict], None] | None:
        """How rank 0 prints a step (None: one JSON line)."""
        return None

    def trainer_state(self) -> dict:
        """The trainer's own state in the checkpoint's metadata."""
        return {"seed": self.config.training.seed}

    def load_trainer_state(self, state: dict) -> None:
        """Restore what `trainer_state` saved."""

    def finish(self, result: TrainResult) -> None:
        """Add what the trainer reports at the end of a run to `result`."""

    def evaluate(self) -> dict:
        """The trainer's evaluation on its eval set (trainers/evaluation.py), on every rank; {}
        for a trainer without one."""
        return {}

    def export_source(self) -> tuple[torch.nn.Module, str] | None:
        """The trained actor on this rank, for the Hugging Face export (infra/export.py): the
        module whose `.lm` is the HF model (as sharded for training) and its name prefix in
        `trainable`; None on a rank that does not hold the actor."""
        return None

    def observe(self, rec: dict, job: JobBusy) -> None:
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

    def step(self, step: int) -> dict:
        """Step `step` (0-based) from a state that depends only on (seed, step, rank)."""
        cfg = self.config
        torch.manual_seed((cfg.training.seed * 1_000_003 + step) * 4099 + self.ctx.rank)
        lr = learning_rate(cfg, step)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        self.monitor.reset_peak()
        rec = self.train_step(step, lr)
        if eval_due(cfg, step + 1):
            with self.busy.phase("eval"):
                rec["eval"] = {"step": step + 1, **self.evaluate()}
        window = self.busy.window()
        self.job_busy = gather_busy(self.ctx, window)
        rec.update(step_fields(self.job_busy, window))
        self.observe(rec, self.job_busy)
        if "firstStep" not in self.startup.marks:
            self.startup.mark("firstStep")
            rec["startupSeconds"] = self.startup.seconds()
            cache = compile_cache_counts()
            if cache is not None:
                rec["compileCache"] = cache
            self.checkpointer.prepare(self.trainable, self.optimizers)  # the optimizer has its state now
        return rec

    def train(self) -> TrainResult:
        result = TrainResult(steps_run=0, first_step=self.start_step + 1)

        def one_step(i: int) -> dict:
            rec = self.step(i)
            result.steps_run += 1
            result.records.append(rec)
            return rec

        # parameter_budget: what partial freezing (training.trainableModules) saves, in numbers
        start = {**self.start_event(), "startupSeconds": self.startup.seconds(), **parameter_budget(self.trainable)}
        with SigtermFlag() as sigterm:  # until the last save has committed (see SigtermFlag)
            try:
                run_steps(self.config, self.ctx, sigterm, self.start_step, start, one_step, self.save,
                          self.progress_with_eval, report=self.report(), busy_ranks=lambda: self.job_busy.ranks,
                          export=self.export)
            finally:
                try:
                    self.checkpointer.close()  # the last save committed, also after SIGTERM or a crash
                finally:
                    self.close()
        self.finish(result)
        return result

    def progress_with_eval(self, rec: dict) -> dict:
        """`progress_fields(rec)` and, after a step that evaluated, the evaluation's fields."""
        return {**self.progress_fields(rec), **(eval_progress(rec["eval"]) if "eval" in rec else {})}

    def save(self, step: int) -> None:
        with self.busy.phase("checkpoint"):  # the stall: waiting for the previous write, staging
            self.checkpointer.save(step, self.trainable, self.optimizers, self.trainer_state(),
                                   model_meta=self.model_meta())

    def model_meta(self) -> dict | None:
        """What a checkpoint records of the actor's model, so `rlkube export` needs nothing else."""
        source = self.export_source()
        return model_meta(source[0].lm, self.config.model, source[1]) if source else None

    def export(self, step: int) -> dict | None:
        """The HF export after `step` steps when due; its /progress fields on rank 0."""
        source = self.export_source()
        return Exporter(self.config, self.ctx.is_main)(step, source[0] if source else None)


def run_trainer(
    trainer: type[Trainer], config: RuntimeConfig, ctx: DistContext | None, hooks: TrainerHooks | None
) -> TrainResult:
    """`trainer(config, ctx, hooks).train()` as this process's rank (loop.train_on_this_rank)."""
    return train_on_this_rank(lambda cfg, rank_ctx: trainer(cfg, rank_ctx, hooks), config, ctx)
