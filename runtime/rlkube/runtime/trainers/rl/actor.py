"""The actor: the policy being trained, which also generates the rollouts (hybrid engine).

Its micro-batch loss is the algorithm's registered policy loss (algorithms/registry.py) over the
rollout's advantages: per token (PPO's GAE) or per sequence (GRPO), with the KL to the reference
as a loss term unless the algorithm put it into the reward, and the entropy bonus when
training.entropyCoef > 0; every term reduced by training.lossAggregation. Its micro-batches also
compare the old log-probs with the ones generation recorded (mismatch.py: metrics, not the loss).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkube.runtime.algorithms.registry import RLAlgorithm, get_loss_agg, get_policy_loss
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.freezing import apply_trainable_modules
from rlkube.runtime.engine.hybrid_engine import HybridEngine
from rlkube.runtime.engine.lora import add_lora
from rlkube.runtime.engine.models import build_causal_lm, compile_role, compile_wanted, shard
from rlkube.runtime.engine.policy import PolicyModel, host_to_device
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.metrics import FlopModel
from rlkube.runtime.trainers.rl.budgets import RLBudgets, role_micro_batches
from rlkube.runtime.trainers.rl.env_mask import row_weight
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.mismatch import RowMismatch
from rlkube.runtime.trainers.rl.rollout import Rollout
from rlkube.runtime.trainers.rl.scoring import response_logprobs
from rlkube.runtime.trainers.rl.update import RoleWorker


class ActorWorker(RoleWorker):
    role = "actor"

    def __init__(self, config: RuntimeConfig, groups: RoleGroups, algorithm: RLAlgorithm, vocab_size: int,
                 make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer], budgets: RLBudgets,
                 pretrained: bool = True) -> None:
        """`pretrained=False`: a resumed run, whose checkpoint holds every weight (the frozen LoRA
        base too): model.path's weight files are not read."""
        ctx = groups.ctx
        lm, self.attention = build_causal_lm(config.model, ctx.device, seed=config.training.seed, weights=pretrained)
        if lm.get_input_embeddings().weight.shape[0] < vocab_size:
            raise ConfigError(f"model.config.vocab_size: smaller than the tokenizer's {vocab_size}")
        self.flops = FlopModel.of(lm)
        if config.model.lora is not None:
            add_lora(lm, config.model.lora)  # in place: training and generation both run the adapters
        apply_trainable_modules(lm, config.training.trainable_modules, config.model.lora)
        compile_role(lm, config.model.compile, ctx, "actor")  # training and scoring
        # Log-probs of the tempered distribution the rollout samples from (engine/policy.py).
        policy = PolicyModel(lm, temperature=config.rollout.temperature, fused=config.training.fused_logprobs)
        policy = shard(policy, ctx, "actor")
        super().__init__(config, groups, policy, make_optimizer(policy), budgets)
        # With a memory plan the optimizer state stays on the GPU while generating (the plan counted
        # it), so the decode caches and graphs are kept between rollouts instead of re-captured.
        self.engine = HybridEngine(self.model, self.optimizer, decode_rows=budgets.decode_rows,
                                   refill=config.rollout.refill, offload_optimizer=False if budgets.planned else None,
                                   compile_layers=compile_wanted(config.model.compile, ctx.device))
        self.policy_loss = get_policy_loss(algorithm.policy_loss)
        self.kl_as_loss = algorithm.kl_as_loss(config.training)
        self.aggregation = get_loss_agg(config.training.loss_aggregation)
        self.mismatch = RowMismatch()  # generation's log-probs against the old ones, row by row

    def logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """The policy's per-token log-probs of the responses of `rows` (old log-probs, at rollout time)."""
        batches = role_micro_batches(self.budgets, self.groups, self.role, torch.arange(rollout.rows),
                                     rollout.lengths, forward=True)
        return response_logprobs(self.model, rollout, batches, rows.start or 0, self.groups.ctx.device)

    def micro_loss(self, seq: torch.Tensor, att: torch.Tensor, idx: torch.Tensor, rollout: Rollout,
                   scored: dict, adv: dict, host: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg, dev, p = self.config.training, self.groups.ctx.device, rollout.prompt_len
        # the policy's tokens: multi-turn tool tokens are attended to, never trained on (nor in the KL)
        resp = (att if rollout.policy_mask is None else host_to_device(host, dev))[:, p:]
        cols = resp.shape[1]
        logps, entropy = self.model(seq, att, p, resp, with_entropy=cfg.entropy_coef > 0, host_mask=host)
        resp = resp.float()
        sampled = resp  # every policy token was sampled, also in rows the environment failed to score
        resp = resp * row_weight(scored, idx, resp)  # rows the environment failed to score weigh 0
        # A rollout trained on once has no old log-probs: the ratio is 1 at the current weights.
        old = scored["old_logprobs"][idx, :cols].to(dev) if "old_logprobs" in scored else logps.detach()
        self.mismatch.add(rollout, idx, old, sampled)
        a = adv["advantages"][idx]
        a = a.to(dev) if a.dim() == 1 else a[:, :cols].to(dev)
        ref = scored["ref_logprobs"][idx, :cols].to(dev) if self.kl_as_loss else None
        return self.policy_loss(logps, old, a, resp, cfg, ref_logprobs=ref, entropy=entropy)
