"""The critic (algorithms with one, PPO): a value model trained with the clipped value loss on
the returns of the advantage estimator, whose rollout-time values the estimator reads."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkube.runtime.algorithms.ppo import value_loss
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.models import build_causal_lm, compile_role, evaluating, shard
from rlkube.runtime.engine.policy import host_to_device
from rlkube.runtime.engine.value_model import ValueModel
from rlkube.runtime.trainers.rl.budgets import RLBudgets, in_row_order, role_micro_batches
from rlkube.runtime.trainers.rl.env_mask import row_weight
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.rollout import Rollout, to_response_width
from rlkube.runtime.trainers.rl.update import RoleWorker


class CriticWorker(RoleWorker):
    role = "critic"

    def __init__(self, config: RuntimeConfig, groups: RoleGroups,
                 make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer], budgets: RLBudgets,
                 pretrained: bool = True) -> None:
        """`pretrained=False`: a resumed run; its checkpoint holds the critic's weights (ActorWorker)."""
        spec = config.roles.critic.model or config.model
        lm, _ = build_causal_lm(spec, groups.ctx.device, seed=config.training.seed, weights=pretrained)
        compile_role(lm, spec.compile, groups.ctx, "critic")
        critic = shard(ValueModel(lm), groups.ctx, "critic")
        super().__init__(config, groups, critic, make_optimizer(critic), budgets)

    @torch.no_grad()
    def values(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """Per-token values of the responses of `rows` (the old values, at rollout time)."""
        batches = role_micro_batches(self.budgets, self.groups, self.role, torch.arange(rollout.rows),
                                     rollout.lengths, forward=True)
        out = []
        with evaluating(self.model):
            for batch in batches:
                seq, att, _ = rollout.on_device(batch, self.groups.ctx.device)
                out.append(to_response_width(self.model(seq, att, rollout.prompt_len), rollout))
        return in_row_order(out, batches, rows.start or 0)  # on the device: the caller waits once (Scorer.score)

    def micro_loss(self, seq: torch.Tensor, att: torch.Tensor, idx: torch.Tensor, rollout: Rollout,
                   scored: dict, adv: dict, host: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        dev, p = self.groups.ctx.device, rollout.prompt_len
        resp = (att if rollout.policy_mask is None else host_to_device(host, dev))[:, p:].float()
        resp = resp * row_weight(scored, idx, resp)  # rows the environment failed to score weigh 0
        cols = resp.shape[1]
        values = self.model(seq, att, p)
        loss, clip_frac = value_loss(
            values, scored["values"][idx, :cols].to(dev), adv["returns"][idx, :cols].to(dev), resp,
            self.config.training.value_clip,
        )
        return loss, {"value_loss": loss.detach(), "value_clip_fraction": clip_frac}
