"""The preference trainer (DPO, and KTO with trainers/kto.py's objective): wires data, models,
batcher, checkpoints and reporting together.

What differs between DPO and KTO is one object, the trainer's `objective`
(`PreferenceObjective`): the data it loads, how a micro-batch is laid out for the packer, how the
policy's and the reference's log-probs become per-sample losses and sums, and what a step, an
evaluation and the start event report of those sums. `DpoObjective` here is DPO's; everything
else (the batcher, packing, prefetch, the OOM redo, the update, evaluation, checkpoints) is
shared.

One optimizer step:
  1. the step's global batch comes from the sampler (a pure function of seed and step);
  2. the batcher splits it across ranks and into micro-batches (same count on every rank);
  3. per micro-batch: the reference's log-probs under no_grad, the policy's with grad, the
     per-pair DPO loss scaled by world_size / global_batch (FSDP averages gradients over ranks,
     so the update is the mean over the whole global batch whatever the split), backward;
  4. an out-of-memory error shrinks the batcher's budget and the step is redone from scratch
     (gradients zeroed), so no step is lost and the update is the same;
  5. the loss summed over ranks must be finite, else NonFiniteLoss (exit 4) before the
     optimizer step; gradients are clipped, the optimizer steps;
  6. metrics (loss, reward margin, accuracy, tokens/s, MFU, GPU memory, and the GPU busy
     fraction over the step and per phase: data_wait, forward_backward, optimizer) are logged,
     served on /progress and /metrics, and fed back to the batcher;
  7. every `checkpoint.everySteps` steps, at the end, and after SIGTERM, a checkpoint.

Exactness of resume: the data order is a function of the step, the RNG is reseeded from
(seed, step, rank) at every step, and the batcher's state is in the checkpoint, so a resumed run
computes the same steps as an uninterrupted one.

What it leaves out, on purpose: learning-rate decay (linear warm-up, then constant), and
OOM recovery with world size > 1 (an OOM inside FSDP collectives cannot be redone on one rank
alone: the process exits as a crash, the pod restarts, and resumes from the last checkpoint).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from rlkube.runtime.algorithms.dpo import PairLogps, pair_loss, pair_stats
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.eval_split import eval_micro_batches, split_eval
from rlkube.runtime.data.packing import TokenBatch, pack_pairs, pad_pairs
from rlkube.runtime.data.preferences import PreferenceData, load_preference_data
from rlkube.runtime.data.prefetch import Prefetcher
from rlkube.runtime.data.sampler import StepSampler
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.engine.freezing import apply_trainable_modules
from rlkube.runtime.engine.logprobs import SequenceLogprobs
from rlkube.runtime.engine.lora import ReferenceView, add_lora
from rlkube.runtime.engine.models import (
    COMPILED_MIN_TOKENS,
    avoid_cudnn_sdpa,
    build_causal_lm,
    compile_layers,
    evaluating,
    frozen_copy,
    shard,
)
from rlkube.runtime.infra.distributed import DistContext, all_reduce_max, all_reduce_sum
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.gpu_busy import JobBusy
from rlkube.runtime.infra.log import log, warn_once
from rlkube.runtime.infra.metrics import FlopModel
from rlkube.runtime.trainers.base import (
    StepRecord,
    StepReport,
    Trainer,
    TrainerHooks,
    TrainResult,
    apply_update,
    host_numbers,
    train_on_this_rank,
)
from rlkube.runtime.trainers.batching import AdaptiveBatcher, Measurement, SampleCost, micro_batch_cost
from rlkube.runtime.trainers.evaluation import preference_summary
from rlkube.runtime.trainers.plan_request import (
    free_device_memory,
    plan_memory,
    preference_models,
    staging_of,
)

# Per-micro-batch sums of the data, besides those of every objective (PreferenceObjective.SUMS).
DATA_SUMS = ("tokens", "scored")


def sample_costs(data: PreferenceData) -> list[SampleCost]:
    out = []
    for i in range(len(data)):
        c, r = data.seq_lengths(i)
        out.append(SampleCost(index=i, tokens=c + r, rows=2, longest=max(c, r)))
    return out


class PreferenceObjective(Protocol):
    """What a preference algorithm brings to the trainer (DpoObjective, kto.KtoObjective)."""

    # Per-micro-batch sums (of tensors or numbers) that a step adds up and an evaluation reports;
    # those in REDUCED are summed over ranks too (the others are job-wide already).
    SUMS: tuple[str, ...]
    REDUCED: tuple[str, ...]

    def load(self, tokenizer: Tokenizer) -> tuple[Any, Any | None]:
        """The training data and the eval data (None without an eval set)."""

    def costs(self, data: Any) -> list[SampleCost]:
        """Each sample's cost: what the batcher plans with."""

    def pairs(self, data: Any, ids: list[int]) -> tuple[PreferenceData, list[int]]:
        """Samples `ids` of `data` as the pairs the packer lays out (and their indices there)."""

    def labelled(self, batch: TokenBatch, data: Any, ids: list[int]) -> TokenBatch:
        """The packed micro-batch with what the loss needs besides the tokens."""

    def score(self, pol: torch.Tensor, ref: torch.Tensor, batch: TokenBatch, counted: bool
              ) -> tuple[torch.Tensor, dict]:
        """Per-sample losses of a micro-batch from its sequences' summed log-probs under the policy
        and the reference, and its SUMS; `counted` is False for a weight-0 padding micro-batch."""

    def step_fields(self, sums: dict[str, float]) -> dict:
        """The step's log fields of its SUMS (over the step's micro-batches, REDUCED over ranks)."""

    def eval_summary(self, sums: dict[str, float]) -> dict:
        """The evaluation's record from its SUMS over every rank's eval samples."""

    def start_fields(self, data: Any) -> dict:
        """What the start event says of the data."""


class DpoObjective:
    """DPO: pairs of a chosen and a rejected completion of one prompt, the per-pair loss of
    algorithms/dpo.py (training.lossType) on their log-ratios to the reference."""

    SUMS = ("pairs", "loss", "margin", "correct", "chosen")
    REDUCED = SUMS

    def __init__(self, config: RuntimeConfig, ctx: DistContext) -> None:
        self.config, self.ctx = config, ctx

    def load(self, tokenizer: Tokenizer) -> tuple[PreferenceData, PreferenceData | None]:
        config = self.config

        def load(spec):
            return load_preference_data(spec, tokenizer, config.model.tokenizer, config.output_dir)

        return split_eval(config.data, load(config.data), load)

    def costs(self, data: PreferenceData) -> list[SampleCost]:
        return sample_costs(data)

    def pairs(self, data: PreferenceData, ids: list[int]) -> tuple[PreferenceData, list[int]]:
        return data, ids

    def labelled(self, batch: TokenBatch, data: PreferenceData, ids: list[int]) -> TokenBatch:
        return batch

    def score(self, pol: torch.Tensor, ref: torch.Tensor, batch: TokenBatch, counted: bool
              ) -> tuple[torch.Tensor, dict]:
        cfg, counts = self.config.training, batch.response_tokens
        logps = PairLogps(pol[0::2], pol[1::2], ref[0::2], ref[1::2], counts[0::2], counts[1::2])
        losses = pair_loss(logps, cfg.beta, cfg.loss_type)
        s = pair_stats(logps, losses, cfg.beta)
        return losses, {"pairs": s.pairs, "loss": s.loss_sum, "margin": s.margin_sum, "correct": s.correct,
                        "chosen": s.chosen_reward_sum}

    def step_fields(self, sums: dict[str, float]) -> dict:
        pairs = sums["pairs"]
        return {"accuracy": sums["correct"] / pairs, "margin": sums["margin"] / pairs,
                "rewardChosen": sums["chosen"] / pairs}

    def eval_summary(self, sums: dict[str, float]) -> dict:
        return preference_summary(sums)

    def start_fields(self, data: PreferenceData) -> dict:
        return {"pairs": len(data)}


class DPOTrainer(Trainer):
    """State of one preference run (DPO, or KTO with its objective) in one process (one rank)."""

    # /progress rewardMean is the chosen (desirable) completions' implicit reward.
    REPORT = StepReport(reward_mean="rewardChosen",
                        gauges={"accuracy": "accuracy", "margin": "reward_margin", "tokenBudget": "token_budget"})
    # (step, its prefetcher) started during the step before (start_ahead), until fetch takes it
    ahead: tuple[int, Prefetcher] | None = None

    def __init__(self, config: RuntimeConfig, ctx: DistContext, hooks: TrainerHooks | None = None,
                 objective: type[PreferenceObjective] = DpoObjective) -> None:
        self.objective = objective(config, ctx)
        super().__init__(config, ctx, hooks)

    def build(self) -> None:
        config = self.config
        # The data set is read and tokenised on a thread while the models load (the memory plan
        # needs nothing of it); the sampler is the first thing that waits for it.
        self.tokenizer, data = self.start_data(self._load_data)
        with data.errors_first():
            self._build_models()
        self.data, self.eval_data, self.costs = data.ready()
        lengths = None if config.data.packing or not config.data.length_bucketing else [c.longest for c in self.costs]
        try:
            self.sampler = StepSampler(len(self.data), config.batching.global_batch, config.data.seed, lengths)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _load_data(self, tokenizer: Tokenizer) -> tuple[Any, Any | None, list[SampleCost]]:
        """The training data, the eval data and the training samples' costs (on the data thread)."""
        data, eval_data = self.objective.load(tokenizer)
        return data, eval_data, self.objective.costs(data)

    def _build_models(self) -> None:
        """The memory plan, policy and reference, the batcher and the optimizer."""
        config, ctx = self.config, self.ctx
        packing = config.data.packing
        # Before any weight is loaded: DoesNotFit (exit 3) when policy and reference cannot fit at all.
        self.plan = plan_memory(config, ctx, preference_models(config, ctx))
        self.checkpoint_staging = staging_of(self.plan)
        lm, self.attention = build_causal_lm(config.model, ctx.device, seed=config.training.seed, packed=packing)
        # Packed rows need a kernel that keeps sequences apart: flash-attn's varlen (boundaries from
        # the position ids) or flex_attention (a sparse document mask). On CUDA, sdpa with an
        # arbitrary mask leaves its flash kernel for a masked one (measured on H200: ~4x slower and
        # far more memory on long-tailed data), so with sdpa one sequence a row, rows grouped by
        # length, no mask, beats packing.
        self.rows_per_sequence = packing and ctx.device.type == "cuda" and self.attention in ("sdpa", "eager")
        if self.rows_per_sequence:
            warn_once(
                "packing",
                f"data.packing=true with attention {self.attention} on CUDA: packed rows would need a "
                "block mask, which sends sdpa to a slow masked kernel; using one sequence a row, "
                "grouped by length, without a mask instead (model.attention auto or flex_attention packs)",
            )
        if (self.attention == "sdpa" and not packing) or self.rows_per_sequence:
            avoid_cudnn_sdpa(ctx.device)  # row shapes change every micro-batch
        self.batcher = AdaptiveBatcher(config.batching, packed=packing and not self.rows_per_sequence, min_budget=1,
                                       budget=self.plan.train_tokens if self.plan is not None else None,
                                       grow=self.plan is None or self.plan.grows_from_peaks)
        self._agree_budget()
        vocab = lm.get_input_embeddings().weight.shape[0]
        if vocab < self.tokenizer.vocab_size:
            raise ConfigError(
                f"model.config.vocab_size: {vocab} is smaller than the tokenizer's {self.tokenizer.vocab_size}"
            )
        self.flops = FlopModel.of(lm)
        ref_spec = config.roles.reference.model if config.roles.reference is not None else None
        self.peft = add_lora(lm, config.model.lora) if config.model.lora is not None else None
        if ref_spec is not None:
            ref_lm, _ = build_causal_lm(ref_spec, ctx.device, seed=config.training.seed)
            ref_lm.eval().requires_grad_(False)
        elif self.peft is None:
            ref_lm = frozen_copy(lm)
        apply_trainable_modules(lm, config.training.trainable_modules, config.model.lora)
        # after the reference copy (a copy of a compiled layer would call the original's forward)
        self.compiled = compile_layers(lm, config.model.compile, ctx.device)
        if ref_spec is not None or self.peft is None:
            compile_layers(ref_lm, config.model.compile, ctx.device)
        fused = config.training.fused_logprobs
        self.policy = shard(SequenceLogprobs(lm, fused=fused), ctx, "actor")
        if ref_spec is None and self.peft is not None:
            # LoRA: the reference is the actor's base weights, its adapters off (no second copy)
            self.reference = ReferenceView(self.policy)
        else:
            self.reference = shard(SequenceLogprobs(ref_lm, fused=fused), ctx, "reference")
        self.optimizer = self.adamw(self.policy)
        self.trainable = self.policy
        # the explicit block mask is for sdpa; eager/flex/flash read packed position ids
        self.explicit_mask = self.attention == "sdpa"
        # sdpa's masked kernel computes whole rows: keep packed rows at maxSeqLen. flash-attn's
        # varlen path and flex want one row (flex skips the blocks between sequences); flex's row
        # is padded to a multiple of its 128-token block, so a compiled kernel sees few shapes.
        self.row_tokens = config.data.max_seq_len if self.attention in ("sdpa", "eager") else None
        self.row_multiple = 128 if self.attention == "flex_attention" else 1
        self.row_min = COMPILED_MIN_TOKENS if self.compiled and self.row_tokens is None else 0

    def _agree_budget(self) -> None:
        """Every rank takes the job's smallest token budget: each rank's plan and calibration are its
        own, and a rank with more micro-batches than another would hang it in FSDP's collectives."""
        self.batcher.budget = int(-all_reduce_max(self.ctx, [-float(self.batcher.budget)])[0])

    def export_source(self) -> tuple[torch.nn.Module, str]:
        return self.policy, ""

    def trainer_state(self) -> dict:
        return {"batcher": self.batcher.state_dict(), "seed": self.config.training.seed}

    def load_trainer_state(self, state: dict) -> None:
        self.batcher.load_state_dict(state["batcher"])

    # -- one micro-batch -----------------------------------------------------------------
    def collate(self, ids: list[int], data: Any | None = None) -> TokenBatch:
        """Samples `ids` of `data` (default: the training data) as one micro-batch."""
        tok, data = self.tokenizer, data if data is not None else self.data
        pairs, local = self.objective.pairs(data, ids)
        if self.config.data.packing and not self.rows_per_sequence:
            batch = pack_pairs(pairs, local, tok.bos_id, tok.eos_id, explicit_mask=self.explicit_mask,
                               row_tokens=self.row_tokens, pad=tok.pad_id, multiple_of=self.row_multiple,
                               min_width=self.row_min)
        else:
            batch = pad_pairs(pairs, local, tok.bos_id, tok.eos_id, tok.pad_id, padding_mask=False)
        return self.objective.labelled(batch, data, ids)

    def score_batch(self, batch: TokenBatch, counted: bool) -> tuple[torch.Tensor, dict]:
        """The per-sample losses of a micro-batch and its sums (the objective's SUMS and DATA_SUMS);
        `counted` is False for a weight-0 padding micro-batch."""
        with torch.no_grad():
            ref = self.reference(batch)
        pol = self.policy(batch)
        losses, sums = self.objective.score(pol, ref, batch, counted)
        return losses, {**sums, "tokens": batch.real_tokens, "scored": int(batch.target_ids.numel()),
                        "seq_lens": batch.seq_lens}

    def micro_batch(self, batch: TokenBatch, scale: float) -> dict:
        losses, out = self.score_batch(batch, counted=bool(scale))
        (losses.sum() * scale).backward()
        return out

    # -- evaluation (trainers/evaluation.py says when) -------------------------------------
    def evaluate(self) -> dict:
        """The training loss's scoring of every eval sample, without gradients, summed over ranks."""
        if self.eval_data is None:
            return {}
        ctx, keys = self.ctx, self.objective.SUMS
        batches = eval_micro_batches(len(self.eval_data), ctx.world_size, ctx.rank,
                                     self.config.batching.max_micro_batch)
        sums = dict.fromkeys(keys, 0.0)
        with evaluating(self.policy), torch.no_grad():  # the eval set's numbers are the model's, not a sample's
            for ids in batches:
                batch = self.collate(ids or [0], self.eval_data).to(ctx.device)
                _, out = self.score_batch(batch, counted=bool(ids))
                for key in keys if ids else ():
                    sums[key] += out[key]
        sums = host_numbers(sums)
        return self.objective.eval_summary(dict(zip(keys, all_reduce_sum(ctx, [sums[k] for k in keys]), strict=True)))

    @property
    def pinned(self) -> bool:
        """Collated micro-batches wait in pinned host memory (CUDA), so their copy to the device
        runs asynchronously."""
        return self.ctx.device.type == "cuda"

    def step_items(self, step: int) -> list[tuple[list[SampleCost], float]]:
        """This rank's micro-batches of `step` with their loss weights (0 for a padding one), as
        the batcher plans them now."""
        step_costs = [self.costs[i] for i in self.sampler.batch(step)]
        scale = self.ctx.world_size / self.config.batching.global_batch
        plan = self.batcher.plan(step_costs, self.ctx.world_size)[self.ctx.rank]
        return [(mb or [step_costs[0]], scale if mb else 0.0) for mb in plan]

    def fetch(self, step: int, items: list[tuple[list[SampleCost], float]]) -> Prefetcher:
        """The collated micro-batches of `items`: the prefetcher started during the last step
        (start_ahead) when it holds the same micro-batches, else a new one."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            if ahead[0] == step and ahead[1].items == items:
                return ahead[1]
            ahead[1].close()  # the budget moved (batcher.observe, an OOM): planned anew
        return Prefetcher(lambda it: self.collate([c.index for c in it[0]]), items, self.config.data.prefetch,
                          pin=self.pinned)

    def start_ahead(self, step: int) -> None:
        """Start collating step `step`'s first micro-batches now, as the batcher would plan them
        today, so they are ready when that step begins (the GPU runs this step's last micro-batch
        and the optimizer meanwhile). `fetch` uses them if the plan still holds."""
        if step < self.config.training.steps and self.config.data.prefetch > 0:
            items = self.step_items(step)
            self.ahead = (step, self.fetch(step, items).start())

    def run_step(self, step: int) -> tuple[dict, list[list[SampleCost]]]:
        """Forward/backward of every micro-batch of `step`, redone after an OOM."""
        while True:
            items = self.step_items(step)
            keys = (*self.objective.SUMS, *DATA_SUMS)
            totals: dict = dict.fromkeys(keys, 0) | {"seq_lens": []}
            failed: list[SampleCost] | None = None
            try:
                for k, batch in enumerate(self.waited(self.fetch(step, items))):
                    mb, weight = items[k]
                    failed = mb
                    if self.hooks.before_micro_batch is not None:
                        self.hooks.before_micro_batch(mb)
                    sync = getattr(self.policy, "set_requires_gradient_sync", None)
                    last = k == len(items) - 1
                    if sync is not None:
                        sync(last)  # reduce-scatter once, after the last micro-batch
                    with self.busy.phase("forward_backward"):
                        out = self.micro_batch(batch.to(self.ctx.device, non_blocking=self.pinned), weight)
                    if last:
                        self.start_ahead(step + 1)
                    if weight:
                        for key in keys:
                            totals[key] += out[key]
                        totals["seq_lens"].extend(out["seq_lens"])
                plan = [mb if weight else [] for mb, weight in items]
                return host_numbers(totals), plan  # the step's one wait for its sums
            except torch.OutOfMemoryError:
                if self.ctx.world_size > 1 or failed is None or not self.batcher.on_oom(failed):
                    raise
                cost = micro_batch_cost(failed, self.batcher.packed)
                log.warning(
                    "step %d: out of memory at a micro-batch of %d samples (%d tokens); %s",
                    step + 1, len(failed), cost, self.batcher.decisions[-1],
                )
                self.optimizer.zero_grad(set_to_none=True)
                free_device_memory()

    # -- what the step loop shows and returns (base.Trainer.train runs it) ---------------
    def start_event(self) -> dict:
        return {"event": "start", "attention": self.attention, "worldSize": self.ctx.world_size,
                "startStep": self.start_step, "totalSteps": self.config.training.steps,
                **self.objective.start_fields(self.data), "setupSeconds": round(self.setup_seconds, 2),
                "peakFlops": self.peak, "peakSource": self.peak_source,
                "memoryPlan": self.plan.describe() if self.plan is not None else None}

    def decisions(self) -> list[str]:
        return list(self.batcher.decisions)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead[1].close()
            self.ahead = None
        super().close()

    def train_step(self, step: int, lr: float) -> dict:
        ctx = self.ctx
        self.sync()
        t0 = time.perf_counter()
        totals, plan = self.run_step(step)
        keys = (*self.objective.REDUCED, "tokens")
        sums = totals | dict(zip(keys, all_reduce_sum(ctx, [totals[k] for k in keys]), strict=True))
        tokens = sums["tokens"]
        loss = sums["loss"] / sums["pairs"]
        with self.busy.phase("optimizer"):
            norm = apply_update(self.policy, self.optimizer, loss, self.config.training.max_grad_norm, step)
        self.sync()
        seconds = time.perf_counter() - t0
        flops = all_reduce_sum(ctx, [self.flops.dpo_step_flops(totals["seq_lens"], totals["scored"])])[0]
        peak_frac = self.monitor.peak_memory_fraction()
        worst = all_reduce_max(ctx, [peak_frac if peak_frac is not None else -1.0])[0]
        peak_frac = worst if worst >= 0 else None
        mfu = flops / seconds / (self.peak * ctx.world_size) if self.peak else None
        return {
            "event": "step", "step": step + 1, "loss": loss, **self.objective.step_fields(sums), "gradNorm": norm,
            "lr": lr,
            "tokens": int(tokens), "seconds": round(seconds, 4), "tokensPerSecond": tokens / seconds,
            "mfu": mfu, "microBatches": len(plan), "tokenBudget": self.batcher.budget,
            "peakMemoryFraction": peak_frac,
        }

    def observe(self, rec: StepRecord, job: JobBusy) -> None:
        """The batcher decides from the step's peak memory and its windowed busy fraction (the
        least busy rank's mean over the step, the same on every rank)."""
        peak = rec.fields["peakMemoryFraction"]
        decision = None
        # the job's first step (a resumed run starts from the budget its checkpoint learned)
        if self.plan is not None and peak and rec.step == 1:
            largest = max(micro_batch_cost(mb, self.batcher.packed) for mb, _ in self.step_items(rec.step - 1))
            decision = self.batcher.calibrate(int(peak * self.plan.capacity), self.plan.resident, self.plan.left,
                                              largest)
        decision = decision or self.batcher.observe(Measurement(peak, job.step_min, rec.seconds))
        self._agree_budget()
        rec.fields["tokenBudget"] = self.batcher.budget  # the budget the next step plans with
        if decision and self.ctx.is_main:
            log.info("step %d: batcher: %s", rec.step, decision)


def train_preferences(objective: type[PreferenceObjective], config: RuntimeConfig, ctx: DistContext | None,
                      hooks: TrainerHooks | None) -> TrainResult:
    """Run the preference training of `objective` described by `config` in this process (one rank)."""
    return train_on_this_rank(lambda cfg, rank_ctx: DPOTrainer(cfg, rank_ctx, hooks, objective), config, ctx)


def train(config: RuntimeConfig, ctx: DistContext | None = None, hooks: TrainerHooks | None = None) -> TrainResult:
    """Run DPO training described by `config` in this process (one rank)."""
    return train_preferences(DpoObjective, config, ctx, hooks)
