"""The PPO and GRPO trainer: one step orchestrates the role workers over the role device groups.

One step (one rollout of `batching.globalBatch` prompts; algorithms that sample groups take
`training.groupSize` completions of each):

  0. prompts   the step's prompt block, prepared on a thread while earlier steps ran
               (data.prefetch steps ahead; 0: inside the step);
  1. rollout   (rollout.py) actor ranks generate with the hybrid engine; every rank gets the rows;
  2. score     (scoring.py) reward, reference log-probs, critic values, old log-probs, each on
               its role's ranks and broadcast;
  3. advantages the algorithm's registered estimator (algorithms/registry.py), computed
               identically on every rank from the broadcast tensors;
  4. train     (update.py, actor.py, critic.py) `ppoEpochs` passes of `miniBatches` optimizer
               steps for each trained role held here.

The algorithm is a recipe picked by name from the registry (ppo: GAE + clipped loss + critic;
grpo: group-normalised advantages + clip-higher loss); nothing here branches on its name.
The stages are the GPU busy phases the step record reports: data_wait (0), generate (1),
score (2, 3), forward_backward and optimizer (4).

Every rank runs every step's collectives in the same order, whatever roles it holds; roles
that share a rank (colocateWith, or `gpus: 0`) run one after the other in that process.

Exactness of resume: prompts come from the step sampler (a function of seed and step); the
sampling generator and torch's RNG are reseeded from (seed, step, rank) at every step; model
and optimizer state of every role are in the checkpoint. A resumed run computes the same
steps as an uninterrupted one.

Memory: before any weight is loaded, the memory plan (trainers/memory_plan.py) adds up what this
GPU will hold and sizes the training micro-batches, the forward-only passes and the decode rows
(budgets.py); a job that cannot fit fails here, before its first step, with the terms named. An
out-of-memory error on one rank halves the budget of its phase and redoes that work.

Left out, on purpose: learning-rate decay, value-head pre-training, and overlapping generation
with scoring.
"""

from __future__ import annotations

import time

import torch

from rlkube.runtime.algorithms.grpo import fraction_of_groups_with_signal
from rlkube.runtime.algorithms.registry import get_adv_estimator, rl_algorithm
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.eval_split import split_eval
from rlkube.runtime.data.prefetch import Prefetcher
from rlkube.runtime.data.prompts import PromptData, load_prompt_data
from rlkube.runtime.data.sampler import StepSampler
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.engine.lora import ReferenceView
from rlkube.runtime.engine.sampling import SamplingParams
from rlkube.runtime.infra.distributed import DistContext, all_reduce_max, all_reduce_sum
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.gpu_busy import JobBusy
from rlkube.runtime.infra.log import log, warn_once
from rlkube.runtime.trainers.base import StepReport, Trainer, TrainerHooks, TrainResult, run_trainer
from rlkube.runtime.trainers.batching import Measurement
from rlkube.runtime.trainers.plan_request import plan_rl_memory, reference_shares_actor, staging_of
from rlkube.runtime.trainers.record import StepRecord
from rlkube.runtime.trainers.rl.actor import ActorWorker
from rlkube.runtime.trainers.rl.budgets import RLBudgets
from rlkube.runtime.trainers.rl.critic import CriticWorker
from rlkube.runtime.trainers.rl.env_mask import loss_mask, mask_failed_rows, remote_fields
from rlkube.runtime.trainers.rl.evaluation import GreedyEvaluator
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.mismatch import MISMATCH_GAUGES, step_fields
from rlkube.runtime.trainers.rl.multi_turn import (
    MULTI_TURN_GAUGES,
    MultiTurnEpisodes,
    ToolStats,
    record_fields,
)
from rlkube.runtime.trainers.rl.rollout import PromptBatch, Rollout, RolloutWorker, fixed_prompt_width
from rlkube.runtime.trainers.rl.scoring import Scorer
from rlkube.runtime.trainers.rl.update import PassTotals

# roles.reward.remote: what the step's calls to the environment cost (trainers/rl/env_mask.py)
ENVIRONMENT_GAUGES = {"envFailures": "env_failures", "envRetries": "env_retries",
                      "envCallsPerSecond": "env_calls_per_second", "envLatencyP50": "env_latency_p50_seconds",
                      "envLatencyP99": "env_latency_p99_seconds"}
TIMINGS = ("generationTokensPerSecond", "trainingTokensPerSecond", "reshardSeconds", "scoringSeconds",
           "generationSeconds", "trainingSeconds")
# The step record's fields that are also rank 0's /metrics gauges (docs/metrics.md)
GAUGES = {**{k: k for k in TIMINGS}, **ENVIRONMENT_GAUGES, **MULTI_TURN_GAUGES, **MISMATCH_GAUGES}


def load_prompts(cfg: RuntimeConfig, tokenizer: Tokenizer) -> tuple[PromptData, PromptData | None]:
    """The training prompts and the evaluation prompts (None without data.eval). A prompt leaves
    room for the longest response: one completion, or a multi-turn episode."""
    data = load_prompt_data(cfg.data, tokenizer, cfg.rollout.episode_tokens)
    return split_eval(cfg.data, data, lambda spec: load_prompt_data(spec, tokenizer, cfg.rollout.episode_tokens))


def check_divisible(rows: int, ranks: dict[str, list[int]], mini_batches: int) -> None:
    """ConfigError unless a step's `rows` split evenly over every role's ranks and into
    `mini_batches` mini-batches that split evenly over the trained roles' ranks."""
    for role, members in ranks.items():
        if rows % len(members):
            raise ConfigError(
                f"batching.globalBatch: {rows} rows per step (globalBatch x groupSize) must split "
                f"evenly over the {len(members)} ranks of role {role}"
            )
    per_mini = rows // mini_batches
    if rows % mini_batches:
        raise ConfigError(f"training.miniBatches: {mini_batches} does not divide the {rows} rows per step")
    for role in ("actor", "critic"):
        if role in ranks and per_mini % len(ranks[role]):
            raise ConfigError(
                f"training.miniBatches: a mini-batch of {per_mini} rows must split evenly over the "
                f"{len(ranks[role])} ranks of role {role}"
            )


class RLTrainer(Trainer):
    """State of one PPO or GRPO run in one process (one rank)."""

    REPORT = StepReport(reward_mean="rewardMean", gauges=GAUGES)

    def build(self) -> None:
        cfg, tcfg = self.config, self.config.training
        try:
            self.algorithm = rl_algorithm(cfg.algorithm)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.group_size = self.algorithm.group_size(tcfg)
        self.groups = RoleGroups(self.ctx, cfg.device_map)
        # kl > 0 without a reference and a reward role without a source are refused when the
        # config is validated (contract/algorithm_settings.py), before any pod starts.
        self.rows = cfg.batching.global_batch * self.group_size
        check_divisible(self.rows, self.groups.ranks, tcfg.mini_batches)
        self.reuse_rollout = tcfg.ppo_epochs > 1 or tcfg.mini_batches > 1
        # The prompts are read and tokenised on a thread while the trained models load. On CUDA the
        # memory plan waits for them: it sizes decode rows for the longest prompt
        # (fixed_prompt_width) and comes before any weight is loaded. Elsewhere the scorer is the
        # first to need them.
        self.tokenizer, data = self.start_data(lambda tokenizer: load_prompts(cfg, tokenizer))
        with data.errors_first():
            cuda = self.ctx.device.type == "cuda"
            prompt_width = fixed_prompt_width(cfg, data.ready()[0], self.ctx.device) if cuda else None
            actor_rows = self.rows // len(self.groups.ranks["actor"]) if "actor" in self.groups.here else 0
            self.plan = plan_rl_memory(cfg, self.ctx, self.groups.here, self.algorithm.critic, actor_rows,
                                       prompt_width)
            self.budgets = RLBudgets(cfg.batching, self.plan, cfg.rollout.decode_rows,
                                     memo=(cfg.checkpoint.dir, self.ctx.rank))
            self.budgets.agree(self.ctx)
            self.checkpoint_staging = staging_of(self.plan)
            self._build_trained_roles()
        self.data, eval_data = data.ready()
        try:
            sampler = StepSampler(len(self.data), cfg.batching.global_batch, cfg.data.seed)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.scorer = self._scorer()
        sampling = SamplingParams.from_rollout(cfg.rollout, self.tokenizer.eos_id, self.tokenizer.pad_id)
        engine = self.actor.engine if self.actor else None
        # rollout.maxTurns > 1: the actor plays each prompt out as an episode with tools (multi_turn.py)
        self.episodes = MultiTurnEpisodes(cfg, self.tokenizer, engine) if engine and cfg.rollout.multi_turn else None
        self.rollout = RolloutWorker(cfg, self.groups, self.data, sampler, sampling, self.tokenizer.pad_id,
                                     self.group_size, engine, self.sync, prompt_width, self.episodes)
        self.estimate = get_adv_estimator(self.algorithm.advantage_estimator)
        self.evaluator = None if eval_data is None else GreedyEvaluator(
            cfg, self.groups, eval_data, self.scorer, engine, self.tokenizer.eos_id, self.tokenizer.pad_id,
            self.rows, self.sync, self.episodes)
        self._prompt_stream = None  # (step, PromptBatch) from the prefetch thread, from the first step on

    def _build_trained_roles(self) -> None:
        """The trained roles held here (what this rank checkpoints)."""
        cfg, here = self.config, self.groups.here
        self.trainable = torch.nn.ModuleDict()
        self.actor = self.critic = None
        self.attention = None
        if "actor" in here:
            self.actor = ActorWorker(cfg, self.groups, self.algorithm, self.tokenizer.vocab_size, self.adamw,
                                     self.budgets, pretrained=not self.resuming)
            self.attention = self.actor.attention
            self.trainable["actor"] = self.actor.model
        if self.algorithm.critic and "critic" in here:
            self.critic = CriticWorker(cfg, self.groups, self.adamw, self.budgets, pretrained=not self.resuming)
            self.trainable["critic"] = self.critic.model
        self.workers = [w for w in (self.actor, self.critic) if w is not None]
        for worker in self.workers:
            worker.before_micro_batch = self.hooks.before_micro_batch

    def _scorer(self) -> Scorer:
        """The scorer of this rank's roles (it builds the reference and reward models held here)."""
        cfg = self.config
        return Scorer(
            cfg, self.groups, self.tokenizer, self.data,
            with_values=self.algorithm.critic,
            with_old_logprobs=self.reuse_rollout or self.algorithm.kl_in_reward(cfg.training),
            values=self.critic.values if self.critic else None,
            old_logprobs=self.actor.logprobs if self.actor else None,
            budgets=self.budgets,
            reference=self._reference_in_actor(),
        )

    def _reference_in_actor(self) -> torch.nn.Module | None:
        """A LoRA actor's reference: the actor's own module with its adapters off (verl's
        reference-in-actor), so the job holds one copy of the base weights, as DPO does. Only where
        the reference runs on the actor's ranks and names no model of its own; None: the scorer
        builds a separate reference."""
        cfg, ranks = self.config, self.groups.ranks
        ref = cfg.roles.reference
        if self.actor is None or cfg.model.lora is None or ref is None or ref.model is not None:
            return None
        if not reference_shares_actor(cfg, ranks):
            warn_once("lora-reference", (
                "model.lora with roles.reference on GPUs of its own: the reference holds a second copy "
                "of the base model; reference: {colocateWith: actor} would use the actor's base weights "
                "with the adapters off instead"))
            return None
        return ReferenceView(self.actor.model)

    # -- one step ------------------------------------------------------------------------
    def prompts(self, step: int) -> PromptBatch:
        """Step `step`'s prompts, prepared ahead by a thread over steps first..last in order (the
        order is the sampler's, a function of the step, so resume replays it exactly)."""
        if self._prompt_stream is None:
            steps = range(step, self.config.training.steps)
            ahead = Prefetcher(lambda s: (s, self.rollout.prompts(s)), steps, self.config.data.prefetch)
            self._prompt_stream = self.waited(ahead)
        made_for, batch = next(self._prompt_stream)
        assert made_for == step, (made_for, step)  # the loop runs consecutive steps
        return batch

    def close(self) -> None:
        if self._prompt_stream is not None:
            self._prompt_stream.close()
            self._prompt_stream = None
        super().close()

    def train_on(self, rollout: Rollout, scored: dict, adv: dict, step: int) -> dict[str, PassTotals]:
        """Every trained role held here, `ppoEpochs` passes over the rollout."""
        cfg = self.config.training
        out: dict[str, PassTotals] = {}
        for epoch in range(cfg.ppo_epochs):
            g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 31 + epoch)
            order = torch.randperm(rollout.rows, generator=g) if self.reuse_rollout else torch.arange(rollout.rows)
            for worker in self.workers:
                passed = worker.train_pass(rollout, scored, adv, order, step, self.busy)
                out.setdefault(worker.role, PassTotals()).add(passed, cfg.ppo_epochs)
        return out

    def train_step(self, step: int, lr: float) -> dict:
        t_start = time.perf_counter()
        prompts = self.prompts(step)
        self.budgets.oom_retries = 0
        with self.busy.phase("generate"):
            rollout, gen_stats = self._generate(step, prompts)
        t_scored = time.perf_counter()
        with self.busy.phase("score"):
            scored = self._score(rollout)
            scores = mask_failed_rows(scored)  # the environment's failures: out of the loss
            adv = self.estimate(scored, mask := loss_mask(rollout, scored), self.config.training)
            self.sync()
        t_trained = time.perf_counter()
        trained = self.train_on(rollout, scored, adv, step)
        self.sync()
        t_end = time.perf_counter()
        times = {"seconds": t_end - t_start, "scoring": t_trained - t_scored, "training": t_end - t_trained}
        rec = self._step_record(step, lr, rollout, gen_stats, scores, trained, times)
        rec.update(self._loss_terms(trained))
        if self.config.roles.reward.remote:  # the environment's calls; reward statistics over the rows with one
            rec.update(remote_fields(self.ctx, self.scorer.environment, scores, mask, self.group_size))
        return rec

    def _generate(self, step: int, prompts: PromptBatch) -> tuple[Rollout, dict]:
        """The rollout; after an out-of-memory error, redone with half the decode rows."""
        while True:
            try:
                out = self.rollout.generate(step, prompts)
                self.sync()
                return out
            except torch.OutOfMemoryError:
                decoder = self.actor.engine.decoder if self.actor else None
                rows = (decoder.batch_rows or self.rows) if decoder else 0
                if decoder is None or not self.budgets.decode_oom(self.ctx.world_size, rows):
                    raise
                decoder.release()
                decoder.batch_rows = self.budgets.decode_rows

    def _score(self, rollout: Rollout) -> dict:
        """The scorer's results; after an out-of-memory error, redone with half the forward budget."""
        while True:
            try:
                return self.scorer.score(rollout)
            except torch.OutOfMemoryError:
                if not self.budgets.forward_oom(self.ctx.world_size, max(rollout.lengths)):
                    raise

    def observe(self, rec: StepRecord, job: JobBusy) -> None:
        """The training budget follows the step's peak memory (adaptive mode); the budgets the next
        step plans with go into the record."""
        peak = rec.fields["peakMemoryFraction"]
        decision = self.budgets.calibrate(int(peak * self.plan.capacity) if peak and self.plan else None, self.plan)
        decision = decision or self.budgets.observe(Measurement(peak, job.step_min, rec.seconds))
        self.budgets.agree(self.ctx)
        if decision is not None and self.ctx.is_main:
            log.info("step %d: memory budget: %s", rec.step, decision)
        rec.fields.update(self.budgets.record())
        self.budgets.largest_tokens = 0

    def trainer_state(self) -> dict:
        return {"seed": self.config.training.seed, "budgets": self.budgets.state_dict()}

    def load_trainer_state(self, state: dict) -> None:
        if "budgets" in state:  # a checkpoint written before budgets were learned has none
            self.budgets.load_state_dict(state["budgets"])
            self.budgets.agree(self.ctx)
            if self.actor is not None:
                self.actor.engine.decoder.batch_rows = self.budgets.decode_rows

    def _step_record(self, step: int, lr: float, rollout: Rollout, gen_stats: dict, scores: torch.Tensor,
                     trained: dict[str, PassTotals], times: dict) -> dict:
        ctx = self.ctx
        actor = trained.get("actor", PassTotals())
        train_seconds, seconds = times["training"], times["seconds"]
        # Sums over ranks: generation and training tokens counted where they happened.
        flops = self.actor.flops if self.actor else None
        train_flops = 3.0 * flops.forward_flops(actor.seq_lens, actor.scored) if flops else 0.0
        gen_flops = 2.0 * flops.body_params * gen_stats["generatedTokens"] if flops else 0.0
        sums = all_reduce_sum(ctx, [gen_stats["generatedTokens"], actor.tokens, train_flops, gen_flops])
        gen_tokens, train_tokens, train_flops, gen_flops = sums
        gen_seconds, reshard_seconds = all_reduce_max(
            ctx, [gen_stats["generationSeconds"], gen_stats["reshardSeconds"]]
        )
        mask = rollout.response_mask.float()  # the policy's tokens (multi-turn: no tool tokens)
        if rollout.policy_mask is not None and bool(rollout.trained_rows.any()):
            # episodes masked out after a failed tool call are counted (toolCallFailures), not scored
            mask, scores = mask[rollout.trained_rows], scores[rollout.trained_rows]
        rec = {
            "event": "step", "algorithm": self.algorithm.name, "step": step + 1, "lr": lr,
            "rewardMean": float(scores.mean()), "rewardStd": float(scores.std()) if scores.numel() > 1 else 0.0,
            "loss": float(actor.loss) if "actor" in trained else None,
            "responseLengthMean": float(mask.sum(dim=1).mean()),
            "seconds": round(seconds, 4),
            "generationSeconds": round(gen_seconds, 4),
            "generationTokensPerSecond": gen_tokens / gen_seconds if gen_seconds else None,
            "reshardSeconds": round(reshard_seconds, 4),
            "scoringSeconds": round(times["scoring"], 4),
            "trainingSeconds": round(train_seconds, 4),
            "trainingTokensPerSecond": train_tokens / train_seconds if train_seconds else None,
            "tokensPerSecond": (gen_tokens + train_tokens) / seconds,
            "mfu": (train_flops + gen_flops) / seconds / (self.peak * ctx.world_size) if self.peak else None,
            "trainingMfu": train_flops / train_seconds / (self.peak * len(self.groups.ranks["actor"]))
            if self.peak and train_seconds else None,
            "peakMemoryFraction": self.monitor.peak_memory_fraction(),
            "tokens": int(gen_tokens + train_tokens),
        }
        if "decodeRowOccupancy" in gen_stats:  # this rank's decoder (rollout.decodeRows, rollout.refill)
            rec["decodeRowOccupancy"] = round(gen_stats["decodeRowOccupancy"], 4)
        if "decodeCaptureSeconds" in gen_stats:  # > 0 after the first step: graphs re-captured
            rec["decodeCaptureSeconds"] = gen_stats["decodeCaptureSeconds"]
        if self.algorithm.grouped and scores.numel() == rollout.rows:
            rec["groupsWithSignal"] = fraction_of_groups_with_signal(scores, self.group_size)
        if self.config.rollout.multi_turn:  # every rank takes part: the sums are over the actor's ranks
            rec.update(record_fields(all_reduce_sum(ctx, gen_stats.get("tools", ToolStats()).fields())))
        if rollout.generation_logprobs is not None:  # the same on every rank: all take part (mismatch.py)
            rec.update(step_fields(ctx, self.actor.mismatch if self.actor else None, rollout.rows))
        return rec

    def _loss_terms(self, trained: dict[str, PassTotals]) -> dict[str, float]:
        """Job-wide token means of the loss terms. They are token-weighted sums on the ranks that
        trained them (critic terms live on critic ranks only); one all-reduce over the job."""
        keys = self._metric_keys()
        local = []
        for role, names in keys.items():
            res = trained.get(role, PassTotals())
            local += [res.metrics.get(k, 0.0) for k in names] + [float(res.tokens)]
        total = all_reduce_sum(self.ctx, local)
        out, at = {}, 0
        for names in keys.values():
            tokens = max(total[at + len(names)], 1.0)
            for i, k in enumerate(names):
                out[k] = total[at + i] / tokens
            at += len(names) + 1
        return out

    def _metric_keys(self) -> dict[str, list[str]]:
        """Per-role metric names, known to every rank from the config alone."""
        t = self.config.training
        actor = ["policy_loss", "clip_fraction", "approx_kl"]
        if self.algorithm.kl_as_loss(t):
            actor.append("kl")
        if t.entropy_coef > 0:
            actor.append("entropy")
        keys = {"actor": actor}
        if self.algorithm.critic:
            keys["critic"] = ["value_loss", "value_clip_fraction"]
        return keys

    # -- what the step loop shows (base.Trainer.train runs it) ---------------------------
    def start_event(self) -> dict:
        engine = self.actor.engine if self.actor else None
        return {"event": "start", "algorithm": self.algorithm.name, "attention": self.attention,
                "worldSize": self.ctx.world_size, "deviceMap": self.groups.ranks, "startStep": self.start_step,
                "totalSteps": self.config.training.steps, "prompts": len(self.data), "rowsPerStep": self.rows,
                "setupSeconds": round(self.setup_seconds, 2), "peakFlops": self.peak,
                "peakSource": self.peak_source, "hybridEngineSharded": bool(engine and engine.sharded),
                "memoryPlan": self.plan.describe() if self.plan is not None else None}

    def export_source(self) -> tuple[torch.nn.Module, str] | None:
        return (self.actor.model, "actor.") if self.actor else None

    def evaluate(self) -> dict:
        return self.evaluator() if self.evaluator is not None else {}


def train(config: RuntimeConfig, ctx: DistContext | None = None, hooks: TrainerHooks | None = None) -> TrainResult:
    """Run the PPO or GRPO training described by `config` in this process (one rank)."""
    return run_trainer(RLTrainer, config, ctx, hooks)
