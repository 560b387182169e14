"""What the chosen algorithm takes and cannot honour: rules on the whole spec, each written once.

Each rule is a `Rule` on the spec (a `RuntimeConfig`, or the operator's `RLTrainingJobSpec`, which
embeds the same sections): its Python half refuses the trainer's config at start (exit 3) and the
job in `rlkube validate` and the operator; its CEL half (spelled with `spec_cel`, on the CRD's
spec object) refuses it at admission. Messages are relative to the spec ('training.kl: ...').

The rules:
- Which roles an algorithm takes (`ALGORITHM_ROLES`): only PPO has a critic and needs one;
  PPO/GRPO need a reward role, DPO/KTO learn from fixed data and refuse one. (Which role takes a
  function, and the reward role's source, are `roles_spec.SOURCE_RULES`, reported with these; that
  only PPO/GRPO take an environment and that a remote reward needs one, `ENVIRONMENT_RULES`.)
- PPO/GRPO with training.kl > 0 need a reference role (the trainer would have nothing to take
  the KL to). DPO never reads training.kl.
- PPO/GRPO with training.kl > 0 refuse klEstimator k1 where the KL is a loss term (GRPO always,
  PPO unless klInReward): k1's expected gradient on the policy's own samples is 0, so the KL
  would be logged but never pull the policy to the reference (algorithms/ppo.py kl_divergence).
- GRPO needs groupSize >= 2 and a temperature > 0: its advantages are rewards relative to the
  group's mean, so a group of one, or a group of identical greedy completions, learns nothing.
  PPO has no groups and may roll out greedily.
- PPO/GRPO: maxNewTokens leaves a prompt token and BOS within maxSeqLen.
- A model config's vocab_size holds the byte tokenizer's ids, the actor's model and each role's
  own (`vocab`).
- Synthetic data leaves at least a step's samples (globalBatch) to train on after evalFraction's
  (`data_size`).
- PPO/GRPO: a step's rows (globalBatch x groupSize) split evenly over the ranks of every role with
  GPUs of its own and over training.miniBatches, and each mini-batch over the actor's and the
  critic's ranks (the trainer's own check at start, moved to validation), a colocated critic's
  being those of the role it shares. Other colocated roles share their owner's ranks, which are
  checked as the owner's. An elastic job is checked at its full size here (the operator checks
  every size of its range).
- PPO/GRPO: rollout.decodeRows is at most the rows each actor GPU generates per step (more rows
  than completions would leave rows that never decode; the setting would do nothing).
- Multi-turn rollouts (rollout.maxTurns, maxEpisodeTokens, tools): `multi_turn.MULTI_TURN_RULES`.
- PPO/GRPO refuse values of the DPO-only data and batching fields (`DPO_ONLY_FIELDS`) other
  than those that say what they do anyway, instead of ignoring them silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic.alias_generators import to_camel

from rlkube.runtime.contract.algorithms import ONLINE_ALGORITHMS
from rlkube.runtime.contract.data_size import SAMPLES_PER_STEP
from rlkube.runtime.contract.multi_turn import MULTI_TURN_RULES
from rlkube.runtime.contract.rule import Rule, problems, when
from rlkube.runtime.contract.sections import (
    ENVIRONMENT_RULES,
    BatchingSpec,
    DataSpec,
    RolesSpec,
    RolloutSpec,
    TrainingSpec,
    device_map,
    roles_spec,
)
from rlkube.runtime.contract.spec import ROLE_NAMES
from rlkube.runtime.contract.spec_cel import (
    OFFLINE,
    ONLINE,
    literal,
    mini_batches,
    role_gpus,
    rows,
    spec_field,
)
from rlkube.runtime.contract.vocab import VOCAB_RULES


class AlgorithmSettings(Protocol):
    """What the rules read: RuntimeConfig and the operator's RLTrainingJobSpec both fit."""

    algorithm: str
    roles: RolesSpec
    data: DataSpec
    batching: BatchingSpec
    training: TrainingSpec
    rollout: RolloutSpec


def online(spec: AlgorithmSettings) -> bool:
    """PPO/GRPO (rollouts and a reward role); DPO/KTO learn from fixed preference data with the DPO
    trainer's machinery: no reward role, no rollouts, and the DPO-only fields apply to them."""
    return spec.algorithm in ONLINE_ALGORITHMS


def step_rows(spec: AlgorithmSettings) -> int:
    """The rows of a PPO/GRPO step (globalBatch x groupSize for GRPO); `spec_cel.rows` in CEL."""
    return spec.batching.global_batch * (spec.training.group_size if spec.algorithm == "grpo" else 1)


def own_gpus(spec: AlgorithmSettings, name: str) -> int:
    """A role's own gpus, 0 when the role or its gpus is unset; `spec_cel.role_gpus` in CEL."""
    role = getattr(spec.roles, name)
    return (role.gpus or 0) if role is not None else 0


def kl_is_loss_term(algorithm: str, training: TrainingSpec) -> bool:
    """The KL goes into the actor's loss rather than the reward: GRPO always (it has no per-token
    rewards), PPO unless training.klInReward."""
    return algorithm == "grpo" or (algorithm == "ppo" and not training.kl_in_reward)


ALGORITHM_ROLES = (
    Rule("roles.critic: only ppo uses a critic", "self.algorithm == 'ppo' || !has(self.roles.critic)",
         lambda s: when(s.algorithm != "ppo" and s.roles.critic is not None, f", algorithm is {s.algorithm}"),
         ".roles.critic"),
    Rule("roles.critic: ppo needs a critic role", "self.algorithm != 'ppo' || has(self.roles.critic)",
         lambda s: when(s.algorithm == "ppo" and s.roles.critic is None), ".roles"),
    Rule("roles.reward: ppo and grpo need a reward role (a model or a function)",
         f"{OFFLINE} || has(self.roles.reward)",
         lambda s: when(online(s) and s.roles.reward is None, f", algorithm is {s.algorithm}"), ".roles"),
    Rule("roles.reward: dpo and kto learn from preference data and use no reward role",
         f"!{OFFLINE} || !has(self.roles.reward)",
         lambda s: when(not online(s) and s.roles.reward is not None, f", algorithm is {s.algorithm}"),
         ".roles.reward"),
)

_KL, _ESTIMATOR = spec_field("training", TrainingSpec, "kl"), spec_field("training", TrainingSpec, "kl_estimator")
_NEW_TOKENS = spec_field("rollout", RolloutSpec, "max_new_tokens")

SETTINGS = (
    Rule("training.kl: > 0 needs roles.reference, the frozen policy the KL is taken to: add "
         "reference: {colocateWith: actor}, or set kl to 0",
         f"{OFFLINE} || {_KL} == 0.0 || has(self.roles.reference)",
         lambda s: when(online(s) and s.training.kl > 0 and s.roles.reference is None, f" (kl is {s.training.kl})"),
         ".training.kl"),
    Rule("training.klEstimator: k1 cannot be a loss term (training.kl > 0, grpo or ppo with klInReward "
         "false): its expected gradient on the policy's own samples is 0, so it never pulls the policy "
         "to the reference; use k3 (or k2), or with ppo set klInReward",
         f"!{ONLINE} || {_KL} == 0.0 || {_ESTIMATOR} != 'k1' || "
         f"(self.algorithm == 'ppo' && {spec_field('training', TrainingSpec, 'kl_in_reward')})",
         lambda s: when(online(s) and s.training.kl > 0 and s.training.kl_estimator == "k1"
                        and kl_is_loss_term(s.algorithm, s.training)),
         ".training.klEstimator"),
    Rule("training.groupSize: grpo needs >= 2 completions per prompt: advantages are rewards "
         "relative to the group's mean, so a group of one learns nothing",
         f"self.algorithm != 'grpo' || {spec_field('training', TrainingSpec, 'group_size')} >= 2",
         lambda s: when(s.algorithm == "grpo" and s.training.group_size < 2, f" (got {s.training.group_size})"),
         ".training.groupSize"),
    Rule("rollout.temperature: grpo needs > 0: greedy decoding makes every completion of a group "
         "the same, so every advantage is 0",
         f"self.algorithm != 'grpo' || {spec_field('rollout', RolloutSpec, 'temperature')} != 0.0",
         lambda s: when(s.algorithm == "grpo" and s.rollout.temperature == 0, " (got 0)"), ".rollout.temperature"),
    # The prompt gets maxSeqLen - maxNewTokens - 1 tokens (one for BOS; data/prompts.py).
    Rule("rollout.maxNewTokens: must be <= data.maxSeqLen - 2: a prompt, its BOS token and its completion "
         "share maxSeqLen tokens, so no prompt token would be left",
         f"!{ONLINE} || {_NEW_TOKENS} + 2 <= {spec_field('data', DataSpec, 'max_seq_len')}",
         lambda s: when(online(s) and s.rollout.max_new_tokens + 2 > s.data.max_seq_len,
                        f" (data.maxSeqLen - 2 = {s.data.max_seq_len - 2}, got {s.rollout.max_new_tokens})"),
         ".rollout.maxNewTokens"),
)


def _rows_over_role(name: str) -> Rule:
    return Rule(
        f"batching.globalBatch: the rows per step (globalBatch x groupSize) must split evenly over the GPUs "
        f"of role {name}",
        f"!{ONLINE} || {role_gpus(name)} == 0 || {rows()} % {role_gpus(name)} == 0",
        lambda s: when(online(s) and own_gpus(s, name) > 0 and step_rows(s) % own_gpus(s, name) != 0,
                       f" ({step_rows(s)} rows, {own_gpus(s, name)} GPUs)"),
        ".batching",
    )


def _mini_batch_over_role(name: str) -> Rule:
    def broken(s: Any) -> str | None:
        per_mini = step_rows(s) // s.training.mini_batches
        uneven = step_rows(s) % s.training.mini_batches == 0 and own_gpus(s, name) and per_mini % own_gpus(s, name)
        return when(online(s) and bool(uneven), f" ({per_mini} rows, {own_gpus(s, name)} GPUs)")

    return Rule(
        f"training.miniBatches: a mini-batch (rows per step / miniBatches) must split evenly over the GPUs of "
        f"role {name}",
        f"!{ONLINE} || {rows()} % {mini_batches()} != 0 || {role_gpus(name)} == 0 || "
        f"({rows()} / {mini_batches()}) % {role_gpus(name)} == 0",
        broken,
        ".training",
    )


def group_gpus_cel(name: str, visited: frozenset[str] = frozenset()) -> str:
    """CEL: the GPUs of the group role `name` runs on (device_map's ranks): its own gpus, the
    actor's for gpus 0, else those of the role colocateWith leads to; 0 where a role is missing."""
    actor = role_gpus("actor")
    if name == "actor":
        return actor
    role = f"self.roles.{name}"
    follow = "".join(
        f"{role}.colocateWith == '{target}' ? {group_gpus_cel(target, visited | {name})} : "
        for target in ROLE_NAMES
        if target != name and target not in visited
    )
    own = f"({role}.gpus > 0 ? {role}.gpus : {actor})"
    return f"(has({role}) ? (has({role}.gpus) ? {own} : (has({role}.colocateWith) ? ({follow}0) : 0)) : 0)"


def _colocated_critic(s: Any) -> str | None:
    """A critic with no GPUs of its own runs on the ranks of the role it colocates with (critic ->
    reward, say); the trainer splits each mini-batch over them as over its own."""
    critic = s.roles.critic
    if not online(s) or critic is None or critic.gpus is not None or step_rows(s) % s.training.mini_batches:
        return None
    per_mini, gpus = step_rows(s) // s.training.mini_batches, len(device_map(s.roles)["critic"])
    return when(per_mini % gpus != 0, f" ({per_mini} rows over the {gpus} GPUs of role "
                                      f"{s.roles.group_owner('critic')}, colocateWith {critic.colocate_with})")


BATCH_SPLIT = (
    *(_rows_over_role(name) for name in ROLE_NAMES),
    Rule("rollout.decodeRows: must be <= the rows each actor GPU generates per step (globalBatch x "
         "groupSize / roles.actor.gpus): rows beyond them would never decode; leave it unset to decode "
         "all of them at once",
         f"!{ONLINE} || !(has(self.rollout) && has(self.rollout.decodeRows)) || "
         f"self.rollout.decodeRows * {role_gpus('actor')} <= {rows()}",
         lambda s: when(online(s) and s.rollout.decode_rows is not None
                        and s.rollout.decode_rows * own_gpus(s, "actor") > step_rows(s),
                        f" ({step_rows(s)} rows / {own_gpus(s, 'actor')} GPUs, got {s.rollout.decode_rows})"),
         ".rollout.decodeRows"),
    Rule("training.miniBatches: must divide the rows per step (globalBatch x groupSize)",
         f"!{ONLINE} || {rows()} % {mini_batches()} == 0",
         lambda s: when(online(s) and step_rows(s) % s.training.mini_batches != 0,
                        f" ({step_rows(s)} rows, got {s.training.mini_batches})"),
         ".training"),
    *(_mini_batch_over_role(name) for name in ("actor", "critic")),
    Rule("training.miniBatches: a mini-batch (rows per step / miniBatches) must split evenly over the GPUs "
         "the critic shares with the role it colocates with",
         f"!{ONLINE} || !has(self.roles.critic) || has(self.roles.critic.gpus) || {rows()} % {mini_batches()} != 0 "
         f"|| {group_gpus_cel('critic')} == 0 || ({rows()} / {mini_batches()}) % {group_gpus_cel('critic')} == 0",
         _colocated_critic, ".training"),
)


@dataclass(frozen=True)
class DpoOnlyField:
    """A data or batching field only the DPO trainer reads, and the values PPO/GRPO accept.

    The rule is on the value, not on whether the user wrote the field: the CRD declares each
    field's default, so the API server's CEL sees the default either way. Accepted are the
    default and any value that says what PPO/GRPO do anyway (prefetch 0: no prefetch thread)."""

    section: Literal["data", "batching"]
    name: str  # the Python name; `path` uses the camelCase one
    accepted: tuple[Any, ...]  # the default first
    why: str

    @property
    def wire(self) -> str:
        return to_camel(self.name)

    @property
    def path(self) -> str:
        return f"{self.section}.{self.wire}"

    def valid(self) -> str:
        """What PPO/GRPO accept, as the error messages say it."""
        shown = " or ".join(repr(value) for value in self.accepted)
        return f"ppo and grpo accept only {shown} (leave it unset)"

    def rule(self) -> Rule:
        model = DataSpec if self.section == "data" else BatchingSpec
        value = spec_field(self.section, model, self.name)
        accepted = " || ".join(f"{value} == {literal(option)}" for option in self.accepted)

        def broken(s: Any) -> str | None:
            got = getattr(getattr(s, self.section), self.name)
            return when(online(s) and all(got != option for option in self.accepted), f" (got {got!r})")

        return Rule(f"{self.path}: {self.valid()}: {self.why}", f"{OFFLINE} || {accepted}", broken, f".{self.path}")


def _dpo_only(section: Literal["data", "batching"], name: str, why: str, *also: Any) -> DpoOnlyField:
    model = DataSpec if section == "data" else BatchingSpec
    return DpoOnlyField(section, name, (model.model_fields[name].default, *also), why)


# data.packing and data.lengthBucketing are not here: their defaults (true, true) cannot be told
# from unset, and their other value (false) is what PPO/GRPO do anyway. Every batching field
# applies to every algorithm (the memory plan sizes RL micro-batches too).
DPO_ONLY_FIELDS: tuple[DpoOnlyField, ...] = (
    _dpo_only("data", "prefetch", "PPO/GRPO take their prompts inside the step; the prefetch thread is DPO's", 0),
    _dpo_only(
        "data", "length_mix", "PPO/GRPO's synthetic prompts have lengths of their own; lengthMix shapes DPO's pairs"
    ),
)

# Every rule on the spec the trainer applies too, in the order they are reported.
SPEC_RULES: tuple[Rule, ...] = (
    *ALGORITHM_ROLES, *roles_spec.SOURCE_RULES, *ENVIRONMENT_RULES, *VOCAB_RULES, *SETTINGS, *MULTI_TURN_RULES,
    SAMPLES_PER_STEP, *BATCH_SPLIT,
    *(field.rule() for field in DPO_ONLY_FIELDS),
)


def algorithm_setting_problems(spec: AlgorithmSettings) -> list[str]:
    """The roles `spec.algorithm` takes and the settings it cannot honour, one 'path: what would be
    valid' line each; empty when there are none. Paths are relative to the spec (training.kl,
    rollout.temperature), as the operator's and the runtime's error formatters expect."""
    return problems(SPEC_RULES, spec)
