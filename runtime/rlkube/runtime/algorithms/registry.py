"""Named variants of the RL algorithms: advantage estimators, policy losses, loss aggregations,
and the recipes that pick an estimator and a loss for an `algorithm` of the config.

An advantage estimator turns a scored rollout into the tensors the losses train on; a policy
loss is the actor's whole objective for one micro-batch. Both are registered by name
(`register_adv_est`, `register_policy_loss`) and looked up by name, so a new variant is one
decorated function here, not a new branch in the trainer. Loss aggregations
(`aggregation.py`) are registered by the names training.lossAggregation takes. A recipe (`RLAlgorithm`) names the
estimator and the loss an online `algorithm` of the spec (contract/algorithms.py, where the
algorithms are registered) uses and says which roles and data layout it needs:

  ppo  -> "gae" advantages (per-token rewards, values from a critic) + "ppo" clipped loss, critic
  grpo -> "grpo" group-normalised sequence advantages + "grpo" loss (clip-higher), no critic

Unknown names raise ValueError listing the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from rlkube.runtime.algorithms.advantages import gae, whiten
from rlkube.runtime.algorithms.aggregation import (
    SEQ_MEAN_TOKEN_MEAN,
    SEQ_MEAN_TOKEN_SUM,
    TOKEN_MEAN,
    LossAggregation,
)
from rlkube.runtime.algorithms.grpo import grpo_advantages
from rlkube.runtime.algorithms.ppo import actor_loss, shaped_rewards
from rlkube.runtime.contract.algorithms import ONLINE_ALGORITHMS
from rlkube.runtime.contract.config import TrainingSpec

# (scored rollout tensors, response mask [N, T], training settings) -> {"advantages": .., maybe "returns": ..}
AdvantageEstimator = Callable[[Mapping[str, torch.Tensor], torch.Tensor, TrainingSpec], dict[str, torch.Tensor]]


# (logprobs, old_logprobs, advantages, mask, training, ref_logprobs=None, entropy=None) -> (loss, metrics);
# ref_logprobs is passed only when the KL to the reference is a loss term, entropy only when
# training.entropyCoef > 0.
PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

_ADV_ESTIMATORS: dict[str, AdvantageEstimator] = {}
_POLICY_LOSSES: dict[str, PolicyLoss] = {}
_LOSS_AGGREGATIONS: dict[str, LossAggregation] = {}


def _register(table: dict, kind: str, name: str):
    def add(fn):
        if name in table:
            raise ValueError(f"{kind} {name!r} is registered already")
        table[name] = fn
        return fn

    return add


def _lookup(table: dict, kind: str, name: str):
    if name not in table:
        raise ValueError(f"{kind} {name!r} is not registered; valid: {', '.join(sorted(table))}")
    return table[name]


def register_adv_est(name: str):
    """Decorator: register an advantage estimator under `name`."""
    return _register(_ADV_ESTIMATORS, "advantage estimator", name)


def register_policy_loss(name: str):
    """Decorator: register a policy loss under `name`."""
    return _register(_POLICY_LOSSES, "policy loss", name)


def register_loss_agg(name: str):
    """Decorator (or call on an object): register a loss aggregation under `name`."""
    return _register(_LOSS_AGGREGATIONS, "loss aggregation", name)


for _agg in (TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM, SEQ_MEAN_TOKEN_MEAN):
    register_loss_agg(_agg.name)(_agg)


def get_loss_agg(name: str) -> LossAggregation:
    return _lookup(_LOSS_AGGREGATIONS, "loss aggregation", name)


def loss_agg_names() -> list[str]:
    return sorted(_LOSS_AGGREGATIONS)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    return _lookup(_ADV_ESTIMATORS, "advantage estimator", name)


def get_policy_loss(name: str) -> PolicyLoss:
    return _lookup(_POLICY_LOSSES, "policy loss", name)


@register_adv_est("gae")
def gae_advantages(scored: Mapping[str, torch.Tensor], mask: torch.Tensor, t: TrainingSpec) -> dict[str, torch.Tensor]:
    """PPO: GAE over per-token rewards (the score on the last token; minus the KL on every token
    when training.klInReward and there is a reference), whitened advantages, and returns."""
    kl_in_reward = t.kl_in_reward and "ref_logprobs" in scored
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


@register_adv_est("grpo")
def group_advantages(scored: Mapping[str, torch.Tensor], mask: torch.Tensor, t: TrainingSpec) -> dict[str, torch.Tensor]:
    """GRPO: one advantage per completion, its score relative to its group of training.groupSize,
    divided by the group's std unless training.scaleRewards is false (Dr. GRPO). A completion
    without a token in the mask (a multi-turn episode masked out of the loss after a failed tool
    call) counts in no group's statistics."""
    valid = mask.bool().any(dim=1)
    return {"advantages": grpo_advantages(scored["scores"], t.group_size, scale_by_std=t.scale_rewards,
                                          valid=valid)}


def _objective(logprobs, old_logprobs, advantages, mask, t: TrainingSpec, clip_high, ref_logprobs, entropy):
    return actor_loss(
        logprobs, old_logprobs, advantages, mask, t.clip, clip_high,
        ref_logprobs=ref_logprobs, kl_coef=t.kl if ref_logprobs is not None else 0.0,
        kl_estimator=t.kl_estimator, entropy=entropy, entropy_coef=t.entropy_coef,
        aggregate=get_loss_agg(t.loss_aggregation),
    )


@register_policy_loss("ppo")
def ppo_policy_loss(logprobs, old_logprobs, advantages, mask, t: TrainingSpec, ref_logprobs=None, entropy=None):
    """PPO's clipped surrogate, symmetric clip (training.clipHigh is a GRPO setting)."""
    return _objective(logprobs, old_logprobs, advantages, mask, t, None, ref_logprobs, entropy)


@register_policy_loss("grpo")
def grpo_policy_loss(logprobs, old_logprobs, advantages, mask, t: TrainingSpec, ref_logprobs=None, entropy=None):
    """GRPO's clipped surrogate with DAPO's clip-higher upper bound when training.clipHigh is set;
    advantages are one per sequence ([batch]), broadcast over its tokens."""
    return _objective(logprobs, old_logprobs, advantages, mask, t, t.clip_high, ref_logprobs, entropy)


@dataclass(frozen=True)
class RLAlgorithm:
    """What an `algorithm` of the config is made of."""

    name: str
    advantage_estimator: str  # a register_adv_est name
    policy_loss: str  # a register_policy_loss name
    critic: bool  # trains a value model, whose values the estimator reads
    grouped: bool  # samples training.groupSize completions of each prompt
    token_rewards: bool  # the estimator takes per-token rewards, so training.klInReward can put the KL there

    def group_size(self, t: TrainingSpec) -> int:
        return t.group_size if self.grouped else 1

    def kl_in_reward(self, t: TrainingSpec) -> bool:
        """training.klInReward applies (the estimator needs the rollout's own log-probs for it)."""
        return self.token_rewards and t.kl_in_reward

    def kl_as_loss(self, t: TrainingSpec) -> bool:
        """The KL to the reference is a term of the actor's loss (not folded into the reward)."""
        return t.kl > 0 and not self.kl_in_reward(t)


_RECIPES: dict[str, RLAlgorithm] = {}


def register_recipe(recipe: RLAlgorithm) -> RLAlgorithm:
    """Register the recipe of an online algorithm of the spec (contract/algorithms.py names them)."""
    if recipe.name not in ONLINE_ALGORITHMS:
        raise ValueError(f"recipe {recipe.name!r} is not an online algorithm of the spec: "
                         f"register it in contract/algorithms.py ({', '.join(ONLINE_ALGORITHMS)})")
    return _register(_RECIPES, "RL recipe", recipe.name)(recipe)


register_recipe(RLAlgorithm("ppo", advantage_estimator="gae", policy_loss="ppo", critic=True, grouped=False,
                            token_rewards=True))
register_recipe(RLAlgorithm("grpo", advantage_estimator="grpo", policy_loss="grpo", critic=False, grouped=True,
                            token_rewards=False))
# Every online algorithm the spec accepts has its recipe (a config could name one the trainer lacks).
_missing = set(ONLINE_ALGORITHMS) - set(_RECIPES)
if _missing:
    raise ImportError(f"online algorithms without an RL recipe: {', '.join(sorted(_missing))}")


def rl_algorithm(name: str) -> RLAlgorithm:
    """The recipe of `name`; ValueError naming the field and the valid names for anything else."""
    if name not in _RECIPES:
        raise ValueError(f"algorithm: {name!r} is not an RL algorithm; valid: {', '.join(sorted(_RECIPES))}")
    return _RECIPES[name]
