"""Stage 2 of an RL step: everything the losses need to know about the rollout, before training.

Each role computes on its own ranks, on its share of the rows, and the role's leader broadcasts
the result (`RoleGroups.collect`). The forwards are queued before the reward function runs, so its host
work overlaps them (`Scorer.score`):
- scores: a rule-based reward function on the reward ranks, a reward model over them, or the
  job's environment (roles.reward.remote: NaN where it failed to score a row);
- ref_logprobs: the frozen reference's per-token log-probs (when training.kl > 0): a model of
  its own, or, for a LoRA actor, the actor itself with its adapters off (the trainer passes it);
- values: the critic's per-token values (algorithms with a critic);
- old_logprobs: the actor's own log-probs at rollout time, when the rollout is trained on more
  than once (several epochs or mini-batches) or the KL goes into the reward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.prompts import PromptData
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.engine.models import build_causal_lm, compile_role, evaluating, shard
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.rewards import load_reward_function, score_with_function
from rlkube.runtime.rewards.model import build_reward_model
from rlkube.runtime.rewards.remote import connect_environment
from rlkube.runtime.trainers.rl.budgets import RLBudgets, in_row_order, role_micro_batches
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.rollout import Rollout, to_response_width

# (rollout, rows of it) -> a [rows, T] tensor on the CPU
RowsFn = Callable[[Rollout, slice], torch.Tensor]


def build_reference(config: RuntimeConfig, ctx: DistContext) -> torch.nn.Module:
    """The frozen policy the KL is taken to: roles.reference.model, or the actor's own spec and
    seed (so it starts equal to the actor: built from the config, not copied from trained weights).
    Its log-probs are taken at the rollout's temperature, as the actor's are, so the KL compares
    the two tempered distributions."""
    spec = config.roles.reference.model or config.model
    lm, _ = build_causal_lm(spec, ctx.device, seed=config.training.seed)
    lm.eval().requires_grad_(False)
    compile_role(lm, spec.compile, ctx, "reference")
    reference = PolicyModel(lm, temperature=config.rollout.temperature, fused=config.training.fused_logprobs)
    return shard(reference, ctx, "reference")


@torch.no_grad()
def response_logprobs(model: torch.nn.Module, rollout: Rollout, batches: list[torch.Tensor], first_row: int,
                      device) -> torch.Tensor:
    """Per-token log-probs of the responses of the rows in `batches` (micro-batches of the
    contiguous rows from `first_row`: budgets.role_micro_batches) under `model` (a PolicyModel),
    in row order."""
    out = []
    with evaluating(model):
        for batch in batches:
            seq, att, host = rollout.on_device(batch, device)
            # at the policy's tokens only: a multi-turn episode's tool tokens get 0, as the actor's
            # own log-probs do there, so no ratio or KL term of a tool token is ever computed
            logps, _ = model(seq, att, rollout.prompt_len, att[:, rollout.prompt_len :],
                             host_mask=rollout.policy_host(batch, host))
            out.append(to_response_width(logps, rollout))
    return in_row_order(out, batches, first_row)  # on the device: the caller waits once (Scorer.score)


class Scorer:
    """Scores, reference log-probs, values and old log-probs of a rollout, identical on every rank."""

    def __init__(self, config: RuntimeConfig, groups: RoleGroups, tokenizer: Tokenizer, data: PromptData,
                 with_values: bool, with_old_logprobs: bool, values: RowsFn | None, old_logprobs: RowsFn | None,
                 budgets: RLBudgets, reference: torch.nn.Module | None = None) -> None:
        """`values` (the critic's) and `old_logprobs` (the actor's) are called only on ranks holding
        that role; every rank takes part in the broadcast when `with_values` / `with_old_logprobs`.
        `reference`: the reference policy when the caller already holds it (a LoRA actor with its
        adapters off, engine/lora.py ReferenceView); else it is built here (build_reference)."""
        self.config, self.groups, self.tokenizer, self.data = config, groups, tokenizer, data
        self.with_values, self.with_old_logprobs = with_values, with_old_logprobs
        self.values, self.old_logprobs = values, old_logprobs
        self.budgets = budgets  # forward-only micro-batches (the reference's, the reward model's)
        self.use_reference = config.training.kl > 0
        ctx, reward, seed = groups.ctx, config.roles.reward, config.training.seed
        self.reference = self.reward_fn = self.reward_model = None
        if self.use_reference and "reference" in groups.here:
            self.reference = reference if reference is not None else build_reference(config, ctx)
        self.environment = None  # roles.reward.remote: the environment's client, on the reward ranks
        if "reward" in groups.here:
            if reward.remote:
                # Before step 1: the environment's replicas start beside the trainers.
                self.environment = connect_environment(config.roles.environment.client)
            elif reward.function is not None:
                try:
                    self.reward_fn = load_reward_function(reward.function)
                except ValueError as e:
                    raise ConfigError(str(e)) from None
            else:
                self.reward_model = build_reward_model(reward.model, ctx.device, tokenizer.pad_id, seed)

    def _completion_texts(self, rollout: Rollout, rows: slice, data: PromptData) -> tuple[list[str], list[str]]:
        eos, pad = self.tokenizer.eos_id, self.tokenizer.pad_id
        prompts, completions = [], []
        for r in range(rollout.rows)[rows]:
            # the whole response: a multi-turn episode's tool turns too (what the policy saw)
            ids = rollout.sequences[r, rollout.prompt_len :][rollout.episode_mask[r].bool()].tolist()
            completions.append(self.tokenizer.decode([t for t in ids if t not in (eos, pad)]))
            prompts.append(data.texts[rollout.prompt_index[r]])
        return prompts, completions

    def _remote_scores(self, rollout: Rollout, rows: slice, data: PromptData) -> torch.Tensor:
        """Rewards from the environment; NaN where it failed to score a row (trainers/rl/env_mask.py
        masks those rows out of the step)."""
        prompts, completions = self._completion_texts(rollout, rows, data)
        indices = rollout.prompt_index[rows]
        metadata = [{"prompt_index": i, **({"answer": data.answers[i]} if data.answers[i] is not None else {})}
                    for i in indices]
        rewards = self.environment.score(prompts, completions, metadata)
        return torch.tensor([float("nan") if r is None else r for r in rewards], dtype=torch.float32)

    def _scores(self, rollout: Rollout, rows: slice, data: PromptData | None = None) -> torch.Tensor:
        if self.environment is not None:
            return self._remote_scores(rollout, rows, data if data is not None else self.data)
        if self.reward_fn is not None:
            prompts, completions = self._completion_texts(rollout, rows, data if data is not None else self.data)
            return score_with_function(self.reward_fn, prompts, completions)
        batches = role_micro_batches(self.budgets, self.groups, "reward", torch.arange(rollout.rows),
                                     rollout.lengths, forward=True)
        out = []
        for batch in batches:
            seq, att, _ = rollout.on_device(batch, self.groups.ctx.device)
            out.append(self.reward_model(seq, att))
        return in_row_order(out, batches, rows.start or 0)

    def _reference_logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        batches = role_micro_batches(self.budgets, self.groups, "reference", torch.arange(rollout.rows),
                                     rollout.lengths, forward=True)
        return response_logprobs(self.reference, rollout, batches, rows.start or 0, self.groups.ctx.device)

    def rewards(self, rollout: Rollout, data: PromptData) -> torch.Tensor:
        """The reward of each row of a rollout of `data`'s prompts (the eval set's), on every rank."""
        return self.groups.per_row("reward", lambda rows: self._scores(rollout, rows, data), rollout.rows, (),
                                   torch.float32)

    def score(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """Device work first, then the reward: the forwards (reference, values, old log-probs) are
        queued without a wait, so a reward function's host work (decoding the completions, the
        user's Python) runs while the GPU computes them, and the host waits once, when it collects."""
        t = rollout.sequences.shape[1] - rollout.prompt_len
        queued: dict[str, tuple[str, torch.Tensor | None]] = {}
        if self.use_reference:
            queued["ref_logprobs"] = ("reference", self._here("reference", self._reference_logprobs, rollout))
        if self.with_values:
            queued["values"] = ("critic", self._here("critic", self.values, rollout))
        if self.with_old_logprobs:
            queued["old_logprobs"] = ("actor", self._here("actor", self.old_logprobs, rollout))
        out = {"scores": self.groups.collect("reward", self._here("reward", self._scores, rollout), rollout.rows, (),
                                             torch.float32)}
        for name, (role, part) in queued.items():
            out[name] = self.groups.collect(role, part, rollout.rows, (t,), torch.float32)
        return out

    def _here(self, role: str, compute: RowsFn, rollout: Rollout) -> torch.Tensor | None:
        return self.groups.compute_here(role, lambda rows: compute(rollout, rows), rollout.rows)
