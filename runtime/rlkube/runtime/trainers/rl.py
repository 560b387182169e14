"""The PPO and GRPO loop over role device groups.

One step (one rollout of `batching.globalBatch` prompts; GRPO samples `training.groupSize`
completions of each):

  1. rollout   actor ranks generate their contiguous share of the step's rows with the
               hybrid engine (weights unsharded for generation, resharded after); the shares
               are all-gathered in the actor group and broadcast from the actor leader, so
               every rank holds the same rollout tensor;
  2. score     each role computes on its own ranks, on its share of the rows, and the role
               leader broadcasts the result: reward (a rule-based function on the reward
               leader, or a reward model over the reward group), reference log-probs (when
               training.kl > 0), critic values (PPO), the actor's old log-probs (when the
               rollout is reused: more than one epoch or mini-batch);
  3. advantages computed identically on every rank from the broadcast tensors: GAE over
               per-token rewards (PPO; the KL in the reward when klInReward) or
               group-normalised sequence rewards (GRPO);
  4. train     `ppoEpochs` passes, each split into `miniBatches` optimizer steps; inside a
               mini-batch each rank of the actor (and critic) group takes a contiguous share
               and micro-batches of at most `batching.maxMicroBatch` rows; the loss is scaled so
               that the update is the token-mean over the whole mini-batch (FSDP averages
               gradients over the group).

Every rank runs every step's collectives in the same order, whatever roles it holds; roles
that share a rank (colocateWith, or `gpus: 0`) run one after the other in that process.

Exactness of resume: prompts come from the step sampler (a function of seed and step); the
sampling generator and torch's RNG are reseeded from (seed, step, rank) at every step; model
and optimizer state of every role are in the checkpoint. A resumed run computes the same
steps as an uninterrupted one.

Left out, on purpose: adaptive micro-batching (RL micro-batches are fixed at maxMicroBatch
rows; the DPO trainer owns the adaptive batcher), learning-rate decay, value-head
pre-training, OOM recovery, and overlapping generation with scoring.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

from rlkube.runtime.algorithms.advantages import gae, whiten
from rlkube.runtime.algorithms.grpo import fraction_of_groups_with_signal, group_layout, grpo_advantages
from rlkube.runtime.algorithms.ppo import actor_loss, shaped_rewards, value_loss
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.prompts import PromptData, left_padded, load_prompt_data
from rlkube.runtime.data.sampler import StepSampler
from rlkube.runtime.data.tokenizer import load_tokenizer
from rlkube.runtime.engine.generation import SamplingParams
from rlkube.runtime.engine.hybrid_engine import HybridEngine
from rlkube.runtime.engine.models import build_causal_lm, shard
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.infra.checkpoint import Checkpointer
from rlkube.runtime.infra.distributed import DistContext, all_reduce_max, all_reduce_sum
from rlkube.runtime.infra.errors import ConfigError, NonFiniteLoss
from rlkube.runtime.infra.log import log
from rlkube.runtime.infra.metrics import FlopModel, GpuMonitor, peak_flops
from rlkube.runtime.rewards import load_reward_function, score_with_function
from rlkube.runtime.rewards.model import build_reward_model
from rlkube.runtime.trainers.dpo import TrainerHooks, learning_rate
from rlkube.runtime.trainers.loop import run_steps, train_on_this_rank

PROMPT_WIDTH_STEP = 64  # CUDA: prompt blocks are padded to a multiple of this many tokens


@dataclass
class RLResult:
    steps_run: int
    first_step: int  # 1-based number of the first step this run computed
    reward_means: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)


@dataclass
class Rollout:
    """One step's rows, identical on every rank after the broadcast."""

    sequences: torch.Tensor  # [N, P + T]
    attention_mask: torch.Tensor  # [N, P + T]
    prompt_len: int  # P
    prompt_index: list[int]  # data index of each row

    @property
    def response_mask(self) -> torch.Tensor:
        return self.attention_mask[:, self.prompt_len :]

    @property
    def rows(self) -> int:
        return self.sequences.shape[0]


def share(rows: int, ranks: list[int], rank: int) -> slice:
    """The contiguous slice of `rows` that `rank` (a member of `ranks`) takes."""
    per = rows // len(ranks)
    i = ranks.index(rank)
    return slice(i * per, (i + 1) * per)


class RLTrainer:
    """State of one PPO or GRPO run in one process (one rank)."""

    def __init__(self, config: RuntimeConfig, ctx: DistContext, hooks: TrainerHooks | None = None) -> None:
        t0 = time.perf_counter()
        self.config, self.ctx = config, ctx
        self.hooks = hooks or TrainerHooks()
        cfg, tcfg = config, config.training
        self.algorithm = cfg.algorithm
        self.group_size = tcfg.group_size if self.algorithm == "grpo" else 1
        self.ranks = dict(cfg.device_map or {})
        self.here = set(ctx.roles_here()) if ctx.initialized else set(self.ranks)
        self.use_reference = tcfg.kl > 0
        if self.use_reference and cfg.roles.reference is None:
            raise ConfigError("training.kl: > 0 needs roles.reference (the frozen policy the KL is taken to)")
        reward = cfg.roles.reward
        if reward.function is None and reward.model is None:
            raise ConfigError("roles.reward: set either function (a rule-based reward) or model (a reward model)")
        self.rows = cfg.batching.global_batch * self.group_size
        self._check_divisible()
        torch.manual_seed(tcfg.seed)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer)
        self.data: PromptData = load_prompt_data(cfg.data, self.tokenizer, cfg.rollout.max_new_tokens)
        try:
            self.sampler = StepSampler(len(self.data), cfg.batching.global_batch, cfg.data.seed)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.sampling = SamplingParams.from_rollout(cfg.rollout, self.tokenizer.eos_id, self.tokenizer.pad_id)
        self.reuse_rollout = tcfg.ppo_epochs > 1 or tcfg.mini_batches > 1
        device = ctx.device

        self.trainable = torch.nn.ModuleDict()  # what this rank checkpoints
        self.optimizers: list[torch.optim.Optimizer] = []
        self.policy = self.engine = self.actor_opt = None
        self.reference = self.critic = self.critic_opt = None
        self.reward_fn = self.reward_model = None
        self.flops: FlopModel | None = None
        self.attention = None
        if "actor" in self.here:
            lm, self.attention = build_causal_lm(cfg.model, device, seed=tcfg.seed)
            if lm.get_input_embeddings().weight.shape[0] < self.tokenizer.vocab_size:
                raise ConfigError(
                    f"model.config.vocab_size: smaller than the tokenizer's {self.tokenizer.vocab_size}"
                )
            self.flops = FlopModel.of(lm)
            if self.use_reference and "reference" in self.here and cfg.roles.reference.model is None:
                # Same spec and seed: the reference starts equal to the actor. It is built before the
                # actor is sharded, from the same config, not copied from the trained weights.
                ref_lm, _ = build_causal_lm(cfg.model, device, seed=tcfg.seed)
                self.reference = self._frozen(ref_lm)
            self.policy = shard(PolicyModel(lm), ctx, "actor")
            self.actor_opt = self._adamw(self.policy)
            self.engine = HybridEngine(self.policy, self.actor_opt)
            self.trainable["actor"] = self.policy
            self.optimizers.append(self.actor_opt)
        if self.use_reference and "reference" in self.here and self.reference is None:
            spec = cfg.roles.reference.model or cfg.model
            ref_lm, _ = build_causal_lm(spec, device, seed=tcfg.seed)
            self.reference = self._frozen(ref_lm)
        if self.algorithm == "ppo" and "critic" in self.here:
            from rlkube.runtime.engine.value_model import ValueModel

            spec = cfg.roles.critic.model or cfg.model
            critic_lm, _ = build_causal_lm(spec, device, seed=tcfg.seed)
            self.critic = shard(ValueModel(critic_lm), ctx, "critic")
            self.critic_opt = self._adamw(self.critic)
            self.trainable["critic"] = self.critic
            self.optimizers.append(self.critic_opt)
        if "reward" in self.here:
            if reward.function is not None:
                try:
                    self.reward_fn = load_reward_function(reward.function)
                except ValueError as e:
                    raise ConfigError(str(e)) from None
            else:
                self.reward_model = build_reward_model(reward.model, device, self.tokenizer.pad_id, tcfg.seed)

        self.checkpointer = Checkpointer(cfg.checkpoint.dir, cfg.checkpoint.keep, ctx)
        self.checkpointer.before_commit = self.hooks.before_checkpoint_commit
        self.monitor = GpuMonitor(device)
        self.peak, self.peak_source = peak_flops(device)
        self.start_step = 0
        meta = self.checkpointer.restore(self.trainable, self.optimizers)
        if meta is not None:
            self.start_step = int(meta["step"])
            log.info("resumed from %s at step %d", cfg.checkpoint.dir, self.start_step)
        self.setup_seconds = time.perf_counter() - t0

    # -- construction helpers --------------------------------------------------------------
    def _adamw(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        t = self.config.training
        fused = self.ctx.device.type == "cuda"
        return torch.optim.AdamW(module.parameters(), lr=t.lr, weight_decay=t.weight_decay, betas=(0.9, 0.95),
                                 fused=fused)

    def _frozen(self, lm: torch.nn.Module) -> torch.nn.Module:
        lm.eval().requires_grad_(False)
        return shard(PolicyModel(lm), self.ctx, "reference")

    def _check_divisible(self) -> None:
        t = self.config.training
        for role, ranks in self.ranks.items():
            if self.rows % len(ranks):
                raise ConfigError(
                    f"batching.globalBatch: {self.rows} rows per step (globalBatch x groupSize) must split "
                    f"evenly over the {len(ranks)} ranks of role {role}"
                )
        per_mini = self.rows // t.mini_batches
        if self.rows % t.mini_batches:
            raise ConfigError(f"training.miniBatches: {t.mini_batches} does not divide the {self.rows} rows per step")
        for role in ("actor", "critic"):
            if role in self.ranks and per_mini % len(self.ranks[role]):
                raise ConfigError(
                    f"training.miniBatches: a mini-batch of {per_mini} rows must split evenly over the "
                    f"{len(self.ranks[role])} ranks of role {role}"
                )

    # -- collectives between role groups ---------------------------------------------------
    def _comm(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.ctx.device) if self.ctx.backend == "nccl" else t.cpu()

    def _leader(self, role: str) -> int:
        return min(self.ranks[role])

    def _broadcast(self, value: torch.Tensor | None, role: str, shape, dtype) -> torch.Tensor:
        """`value` from the role's leader to every rank (the job's default group)."""
        if not self.ctx.initialized:
            return value
        buf = self._comm(value) if self.ctx.rank == self._leader(role) else torch.empty(
            shape, dtype=dtype, device=self.ctx.device if self.ctx.backend == "nccl" else "cpu"
        )
        tdist.broadcast(buf, src=self._leader(role))
        return buf.cpu()

    def _gather_in_group(self, part: torch.Tensor, role: str) -> torch.Tensor:
        """Concatenate equal-shaped shares of the role's ranks, in rank order (inside the group)."""
        ranks = self.ranks[role]
        if not self.ctx.initialized or len(ranks) == 1:
            return part
        part = self._comm(part.contiguous())
        parts = [torch.empty_like(part) for _ in ranks]
        tdist.all_gather(parts, part, group=self.ctx.group(role))
        return torch.cat(parts).cpu()

    def _per_row(self, role: str, compute, rollout: Rollout, shape_tail, dtype) -> torch.Tensor:
        """Run `compute(rows slice)` on the role's ranks (each its share), gather, broadcast."""
        shape = (rollout.rows, *shape_tail)
        value = None
        if role in self.here or not self.ctx.initialized:
            rows = share(rollout.rows, self.ranks[role], self.ctx.rank) if self.ctx.initialized else slice(0, rollout.rows)
            value = self._gather_in_group(compute(rows).to(dtype).cpu(), role)
        return self._broadcast(value, role, shape, dtype)

    # -- stage 1: rollout ------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[Rollout, dict]:
        cfg = self.config
        prompt_index = group_layout(self.sampler.batch(step), self.group_size)
        rows = [self.data.ids[i] for i in prompt_index]
        width = None
        if self.ctx.device.type == "cuda":
            # Round the prompt block up so consecutive rollouts share a shape and the decoder's
            # captured graph (keyed on batch and length) is replayed instead of re-captured.
            longest = max(len(r) for r in rows)
            room = cfg.data.max_seq_len - cfg.rollout.max_new_tokens
            width = min(-(-longest // PROMPT_WIDTH_STEP) * PROMPT_WIDTH_STEP, max(room, longest))
        ids, mask = left_padded(rows, self.tokenizer.pad_id, width)
        prompt_len, width = ids.shape[1], ids.shape[1] + cfg.rollout.max_new_tokens
        stats = {"generationSeconds": 0.0, "generatedTokens": 0, "reshardSeconds": 0.0}
        packed = None
        if "actor" in self.here:
            mine = share(len(rows), self.ranks["actor"], self.ctx.rank) if self.ctx.initialized else slice(None)
            gen = torch.Generator(device=self.ctx.device)
            gen.manual_seed((cfg.training.seed * 1_000_003 + step) * 8191 + self.ctx.rank)
            reshard_before = self.engine.reshard_seconds
            self._sync()
            t0 = time.perf_counter()
            out = self.engine.generate(ids[mine], mask[mine], self.sampling, gen)
            self._sync()
            stats["generationSeconds"] = time.perf_counter() - t0
            stats["reshardSeconds"] = self.engine.reshard_seconds - reshard_before
            stats["generatedTokens"] = out.generated_tokens
            seq = torch.full((out.prompt_ids.shape[0], width), self.tokenizer.pad_id, dtype=torch.long)
            att = torch.zeros_like(seq)
            seq[:, : out.sequences.shape[1]] = out.sequences.cpu()
            att[:, : out.sequences.shape[1]] = out.attention_mask.cpu()
            packed = self._gather_in_group(torch.stack([seq, att], dim=1), "actor")
        packed = self._broadcast(packed, "actor", (len(rows), 2, width), torch.long)
        sequences, attention = packed[:, 0], packed[:, 1]
        # Trim response columns no row used (every rank computes the same width).
        used = int(attention[:, prompt_len:].sum(dim=0).nonzero().max()) + 1 if attention[:, prompt_len:].any() else 1
        keep = prompt_len + used
        rollout = Rollout(sequences[:, :keep].contiguous(), attention[:, :keep].contiguous(), prompt_len, prompt_index)
        return rollout, stats

    # -- stage 2: scoring ------------------------------------------------------------------
    def _completion_texts(self, rollout: Rollout, rows: slice) -> tuple[list[str], list[str]]:
        eos, pad = self.tokenizer.eos_id, self.tokenizer.pad_id
        prompts, completions = [], []
        for r in range(rollout.rows)[rows]:
            ids = rollout.sequences[r, rollout.prompt_len :][rollout.response_mask[r].bool()].tolist()
            completions.append(self.tokenizer.decode([t for t in ids if t not in (eos, pad)]))
            prompts.append(self.data.texts[rollout.prompt_index[r]])
        return prompts, completions

    def _scores(self, rollout: Rollout) -> torch.Tensor:
        def compute(rows: slice) -> torch.Tensor:
            if self.reward_fn is not None:
                prompts, completions = self._completion_texts(rollout, rows)
                return score_with_function(self.reward_fn, prompts, completions)
            device = self.ctx.device
            return self.reward_model(rollout.sequences[rows].to(device), rollout.attention_mask[rows].to(device))

        return self._per_row("reward", compute, rollout, (), torch.float32)

    @torch.no_grad()
    def _logprobs_of(self, model: torch.nn.Module, rollout: Rollout, rows: slice) -> torch.Tensor:
        out = []
        for batch in self._micro_slices(rows):
            seq, att = self._to_device(rollout, batch)
            logps, _ = model(seq, att, rollout.prompt_len, att[:, rollout.prompt_len :])
            out.append(logps.cpu())
        return torch.cat(out)

    @torch.no_grad()
    def _values_of(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        out = []
        for batch in self._micro_slices(rows):
            seq, att = self._to_device(rollout, batch)
            out.append(self.critic(seq, att, rollout.prompt_len).cpu())
        return torch.cat(out)

    def score(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        t = rollout.sequences.shape[1] - rollout.prompt_len
        out = {"scores": self._scores(rollout)}
        if self.use_reference:
            out["ref_logprobs"] = self._per_row(
                "reference", lambda rows: self._logprobs_of(self.reference, rollout, rows), rollout, (t,), torch.float32
            )
        if self.algorithm == "ppo":
            out["values"] = self._per_row(
                "critic", lambda rows: self._values_of(rollout, rows), rollout, (t,), torch.float32
            )
        if self.reuse_rollout or (self.algorithm == "ppo" and self.config.training.kl_in_reward):
            out["old_logprobs"] = self._per_row(
                "actor", lambda rows: self._logprobs_of(self.policy, rollout, rows), rollout, (t,), torch.float32
            )
        return out

    # -- stage 3: advantages ---------------------------------------------------------------
    def advantages(self, rollout: Rollout, scored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t = self.config.training
        mask = rollout.response_mask.float()
        if self.algorithm == "grpo":
            return {"advantages": grpo_advantages(scored["scores"], self.group_size)}
        kl_in_reward = t.kl_in_reward and self.use_reference
        rewards = shaped_rewards(
            scored["scores"],
            scored["old_logprobs"] if kl_in_reward else torch.zeros_like(mask),
            scored.get("ref_logprobs") if kl_in_reward else None,
            mask,
            t.kl if kl_in_reward else 0.0,
            t.kl_estimator,
        )
        adv, returns = gae(rewards, scored["values"], mask, t.gamma, t.gae_lambda)
        return {"advantages": whiten(adv, mask), "returns": returns}

    # -- stage 4: training -----------------------------------------------------------------
    def _micro_slices(self, rows: slice) -> list[slice]:
        start, stop = rows.start or 0, rows.stop
        size = self.config.batching.max_micro_batch
        return [slice(s, min(s + size, stop)) for s in range(start, stop, size)]

    def _to_device(self, rollout: Rollout, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        # Columns past the last real token of these rows are padding for all of them: drop them.
        att = rollout.attention_mask[rows]
        last = int(att.sum(dim=0).nonzero().max()) + 1
        dev = self.ctx.device
        return rollout.sequences[rows, :last].to(dev), att[:, :last].to(dev)

    def _train_role(self, role: str, rollout: Rollout, scored: dict, adv: dict, order: torch.Tensor) -> dict:
        """One pass of `role` (actor or critic) over the rollout in `order`, miniBatches steps."""
        cfg = self.config.training
        model = self.policy if role == "actor" else self.critic
        opt = self.actor_opt if role == "actor" else self.critic_opt
        ranks = self.ranks[role]
        per_mini = rollout.rows // cfg.mini_batches
        totals = {"loss": 0.0, "tokens": 0, "seq_lens": [], "scored": 0, "metrics": {}}
        p = rollout.prompt_len
        for m in range(cfg.mini_batches):
            mini = order[m * per_mini : (m + 1) * per_mini]
            mine = mini[share(per_mini, ranks, self.ctx.rank)] if self.ctx.initialized else mini
            mini_tokens = float(rollout.response_mask[mini].sum())
            micro = [mine[s : s + self.config.batching.max_micro_batch]
                     for s in range(0, len(mine), self.config.batching.max_micro_batch)]
            loss_sum = 0.0
            for k, idx in enumerate(micro):
                sync = getattr(model, "set_requires_gradient_sync", None)
                if sync is not None:
                    sync(k == len(micro) - 1)
                sub = Rollout(rollout.sequences[idx], rollout.attention_mask[idx], p, [])
                seq, att = self._to_device(sub, slice(0, len(idx)))
                resp = att[:, p:].float()
                cols = resp.shape[1]
                tokens = float(resp.sum())
                # token-mean over the mini-batch of all ranks; FSDP divides gradients by the group size
                weight = tokens / max(mini_tokens, 1.0) * len(ranks)
                dev = self.ctx.device
                if role == "actor":
                    want_entropy = cfg.entropy_coef > 0
                    logps, entropy = model(seq, att, p, att[:, p:], with_entropy=want_entropy)
                    old = scored["old_logprobs"][idx, :cols].to(dev) if "old_logprobs" in scored else logps.detach()
                    a = adv["advantages"][idx]
                    a = a.to(dev) if a.dim() == 1 else a[:, :cols].to(dev)
                    ref = scored["ref_logprobs"][idx, :cols].to(dev) if self.use_reference else None
                    kl_as_loss = self.use_reference and not (self.algorithm == "ppo" and cfg.kl_in_reward)
                    loss, metrics = actor_loss(
                        logps, old, a, resp, cfg.clip, cfg.clip_high if self.algorithm == "grpo" else None,
                        ref_logprobs=ref if kl_as_loss else None, kl_coef=cfg.kl if kl_as_loss else 0.0,
                        kl_estimator=cfg.kl_estimator, entropy=entropy, entropy_coef=cfg.entropy_coef,
                    )
                else:
                    values = model(seq, att, p)
                    loss, clip_frac = value_loss(
                        values, scored["values"][idx, :cols].to(dev), adv["returns"][idx, :cols].to(dev), resp,
                        cfg.value_clip,
                    )
                    metrics = {"value_loss": float(loss.detach()), "value_clip_fraction": clip_frac}
                (loss * weight).backward()
                loss_sum += float(loss.detach()) * tokens
                for key, value in metrics.items():
                    totals["metrics"][key] = totals["metrics"].get(key, 0.0) + value * tokens
                totals["tokens"] += int(tokens)
                totals["seq_lens"].extend(att.sum(dim=1).tolist())
                totals["scored"] += int(tokens)
            loss_mean = self._sum_in_group([loss_sum], role)[0] / max(mini_tokens, 1.0)
            if not math.isfinite(loss_mean):
                raise NonFiniteLoss(self._step + 1, f"{role} loss", loss_mean)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            if not math.isfinite(norm):
                raise NonFiniteLoss(self._step + 1, f"{role} gradient norm", norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            totals["loss"] += loss_mean / cfg.mini_batches
        return totals

    def _sum_in_group(self, values: list[float], role: str) -> list[float]:
        """Element-wise sum over the ranks of `role` only."""
        if not self.ctx.initialized or len(self.ranks[role]) == 1:
            return list(values)
        t = self._comm(torch.tensor(values, dtype=torch.float64))
        tdist.all_reduce(t, group=self.ctx.group(role))
        return t.cpu().tolist()

    def train_on(self, rollout: Rollout, scored: dict, adv: dict, step: int) -> dict:
        cfg = self.config.training
        out: dict = {}
        for epoch in range(cfg.ppo_epochs):
            g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 31 + epoch)
            order = torch.randperm(rollout.rows, generator=g) if self.reuse_rollout else torch.arange(rollout.rows)
            for role in ("actor", "critic"):
                if role in self.here and (role == "actor" or self.algorithm == "ppo"):
                    res = self._train_role(role, rollout, scored, adv, order)
                    acc = out.setdefault(role, {"loss": 0.0, "tokens": 0, "seq_lens": [], "scored": 0, "metrics": {}})
                    acc["loss"] += res["loss"] / cfg.ppo_epochs
                    acc["tokens"] += res["tokens"]
                    acc["seq_lens"].extend(res["seq_lens"])
                    acc["scored"] += res["scored"]
                    for k, v in res["metrics"].items():
                        acc["metrics"][k] = acc["metrics"].get(k, 0.0) + v
        return out

    # -- the loop --------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def step(self, step: int) -> dict:
        cfg, ctx = self.config, self.ctx
        self._step = step
        torch.manual_seed((cfg.training.seed * 1_000_003 + step) * 4099 + ctx.rank)
        lr = learning_rate(cfg, step)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        self.monitor.reset_peak()
        t_start = time.perf_counter()
        rollout, gen_stats = self.rollout(step)
        self._sync()
        t_scored = time.perf_counter()
        scored = self.score(rollout)
        adv = self.advantages(rollout, scored)
        self._sync()
        t_trained = time.perf_counter()
        trained = self.train_on(rollout, scored, adv, step)
        self._sync()
        t_end = time.perf_counter()

        actor = trained.get("actor", {"loss": 0.0, "tokens": 0, "seq_lens": [], "scored": 0, "metrics": {}})
        train_seconds = t_end - t_trained
        # Sums over ranks: generation and training tokens counted where they happened.
        train_flops = 3.0 * self.flops.forward_flops(actor["seq_lens"], actor["scored"]) if self.flops else 0.0
        gen_flops = 2.0 * self.flops.body_params * gen_stats["generatedTokens"] if self.flops else 0.0
        sums = all_reduce_sum(ctx, [gen_stats["generatedTokens"], actor["tokens"], train_flops, gen_flops])
        gen_tokens, train_tokens, train_flops, gen_flops = sums
        slow = all_reduce_max(ctx, [gen_stats["generationSeconds"], gen_stats["reshardSeconds"]])
        gen_seconds, reshard_seconds = slow
        scores = scored["scores"]
        mask = rollout.response_mask.float()
        seconds = t_end - t_start
        util = self.monitor.utilization()
        n_gpus = ctx.world_size
        rec = {
            "event": "step", "algorithm": self.algorithm, "step": step + 1, "lr": lr,
            "rewardMean": float(scores.mean()), "rewardStd": float(scores.std()) if scores.numel() > 1 else 0.0,
            "loss": float(actor["loss"]) if "actor" in trained else None,
            "responseLengthMean": float(mask.sum(dim=1).mean()),
            "seconds": round(seconds, 4),
            "generationSeconds": round(gen_seconds, 4),
            "generationTokensPerSecond": gen_tokens / gen_seconds if gen_seconds else None,
            "reshardSeconds": round(reshard_seconds, 4),
            "scoringSeconds": round(t_trained - t_scored, 4),
            "trainingSeconds": round(train_seconds, 4),
            "trainingTokensPerSecond": train_tokens / train_seconds if train_seconds else None,
            "tokensPerSecond": (gen_tokens + train_tokens) / seconds,
            "mfu": (train_flops + gen_flops) / seconds / (self.peak * n_gpus) if self.peak else None,
            "trainingMfu": train_flops / train_seconds / (self.peak * len(self.ranks["actor"]))
            if self.peak and train_seconds else None,
            "gpuUtilization": util,
            "peakMemoryFraction": self.monitor.peak_memory_fraction(),
            "tokens": int(gen_tokens + train_tokens),
        }
        if self.algorithm == "grpo":
            rec["groupsWithSignal"] = fraction_of_groups_with_signal(scores, self.group_size)
        # Loss terms are token-weighted sums on the ranks that trained them (critic metrics live
        # on critic ranks only); one all-reduce over the job makes them the job-wide means.
        keys = self._metric_keys()
        local = []
        for role, names in keys.items():
            res = trained.get(role, {"tokens": 0, "metrics": {}})
            local += [res["metrics"].get(k, 0.0) for k in names] + [float(res["tokens"])]
        total = all_reduce_sum(ctx, local)
        at = 0
        for names in keys.values():
            tokens = max(total[at + len(names)], 1.0)
            for i, k in enumerate(names):
                rec[k] = total[at + i] / tokens
            at += len(names) + 1
        return rec

    def _metric_keys(self) -> dict[str, list[str]]:
        """Per-role metric names, known to every rank from the config alone."""
        t = self.config.training
        actor = ["policy_loss", "clip_fraction", "approx_kl"]
        if self.use_reference and not (self.algorithm == "ppo" and t.kl_in_reward):
            actor.append("kl")
        if t.entropy_coef > 0:
            actor.append("entropy")
        keys = {"actor": actor}
        if self.algorithm == "ppo":
            keys["critic"] = ["value_loss", "value_clip_fraction"]
        return keys

    def train(self) -> RLResult:
        ctx = self.ctx
        result = RLResult(steps_run=0, first_step=self.start_step + 1)

        def one_step(i: int) -> dict:
            rec = self.step(i)
            result.steps_run += 1
            result.reward_means.append(rec["rewardMean"])
            result.losses.append(rec["loss"])
            result.records.append(rec)
            return rec

        def shown(rec: dict) -> dict:
            timings = ("generationTokensPerSecond", "trainingTokensPerSecond", "reshardSeconds", "scoringSeconds",
                       "generationSeconds", "trainingSeconds")
            return {"rewardMean": rec["rewardMean"],
                    "extra": {k: rec[k] for k in timings if isinstance(rec.get(k), (int, float))}}

        start = {"event": "start", "algorithm": self.algorithm, "attention": self.attention,
                 "worldSize": ctx.world_size, "deviceMap": self.ranks, "startStep": self.start_step,
                 "totalSteps": self.config.training.steps, "prompts": len(self.data), "rowsPerStep": self.rows,
                 "setupSeconds": round(self.setup_seconds, 2), "peakFlops": self.peak,
                 "peakSource": self.peak_source, "hybridEngineSharded": bool(self.engine and self.engine.sharded)}
        run_steps(self.config, ctx, self.start_step, start, one_step, self.save, shown)
        return result

    def save(self, step: int) -> None:
        self.checkpointer.save(step, self.trainable, self.optimizers, {"seed": self.config.training.seed})


def train(config: RuntimeConfig, ctx: DistContext | None = None, hooks: TrainerHooks | None = None) -> RLResult:
    """Run the PPO or GRPO training described by `config` in this process (one rank)."""
    return train_on_this_rank(lambda cfg, rank_ctx: RLTrainer(cfg, rank_ctx, hooks), config, ctx)
