"""Settings the chosen algorithm cannot honour, refused when the config is validated.

One table and one function serve the runtime (`RuntimeConfig`, so the trainer refuses them at
start with exit 3) and the operator (`RLTrainingJobSpec`, so `rlkube validate` refuses them);
`rlkube.operator.crd` builds the CRD's CEL rules from the same table and defaults, so the API
server gives the same verdict at admission.

The rules:
- The reward role of PPO/GRPO has a function or a model.
- PPO/GRPO with training.kl > 0 need a reference role (the trainer would have nothing to take
  the KL to). DPO never reads training.kl.
- GRPO needs groupSize >= 2 and a temperature > 0: its advantages are rewards relative to the
  group's mean, so a group of one, or a group of identical greedy completions, learns nothing.
  PPO has no groups and may roll out greedily.
- PPO/GRPO with training.kl > 0 refuse klEstimator k1 where the KL is a loss term (GRPO always,
  PPO unless klInReward): k1's expected gradient on the policy's own samples is 0, so the KL
  would be logged but never pull the policy to the reference (algorithms/ppo.py kl_divergence).
- PPO/GRPO: rollout.decodeRows is at most the rows each actor GPU generates per step (more rows
  than completions would leave rows that never decode; the setting would do nothing).
- PPO/GRPO refuse values of the DPO-only data and batching fields (`DPO_ONLY_FIELDS`) other
  than those that say what they do anyway, instead of ignoring them silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic.alias_generators import to_camel

from rlkube.runtime.contract.config import BatchingSpec, DataSpec, RolesSpec, RolloutSpec, TrainingSpec


class AlgorithmSettings(Protocol):
    """What the rules read: RuntimeConfig and the operator's RLTrainingJobSpec both fit."""

    algorithm: str
    roles: RolesSpec
    data: DataSpec
    batching: BatchingSpec
    training: TrainingSpec
    rollout: RolloutSpec


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


def _dpo_only(section: Literal["data", "batching"], name: str, why: str, *also: Any) -> DpoOnlyField:
    model = DataSpec if section == "data" else BatchingSpec
    return DpoOnlyField(section, name, (model.model_fields[name].default, *also), why)


_ROWS = "PPO/GRPO micro-batches are batching.maxMicroBatch rows"

# batching.mode, data.packing and data.lengthBucketing are not here: their defaults ('adaptive',
# true, true) cannot be told from unset, and their other value ('fixed', false) is what PPO/GRPO
# do anyway. Their descriptions say which algorithms read them.
DPO_ONLY_FIELDS: tuple[DpoOnlyField, ...] = (
    _dpo_only("batching", "min_micro_batch", f"{_ROWS}; the adaptive batcher's smallest micro-batch is DPO's"),
    _dpo_only("batching", "max_tokens_per_gpu", f"{_ROWS}; the adaptive batcher's token budget is DPO's"),
    _dpo_only("batching", "target_utilization", f"{_ROWS}; the adaptive batcher's memory target is DPO's"),
    _dpo_only("data", "prefetch", "PPO/GRPO take their prompts inside the step; the prefetch thread is DPO's", 0),
    _dpo_only(
        "data", "length_mix", "PPO/GRPO's synthetic prompts have lengths of their own; lengthMix shapes DPO's pairs"
    ),
)


def kl_is_loss_term(algorithm: str, training: TrainingSpec) -> bool:
    """The KL goes into the actor's loss rather than the reward: GRPO always (it has no per-token
    rewards), PPO unless training.klInReward."""
    return algorithm == "grpo" or (algorithm == "ppo" and not training.kl_in_reward)


# Algorithms that learn from fixed preference data (DPO's pairs, KTO's labelled completions) with
# the DPO trainer's machinery: no reward role, no rollouts, and the DPO-only fields apply to them.
OFFLINE_ALGORITHMS = ("dpo", "kto")


def algorithm_setting_problems(spec: AlgorithmSettings) -> list[str]:
    """Settings `spec.algorithm` cannot honour, one 'path: what would be valid' line each.

    Empty when there are none. Paths are relative to the spec (training.kl, rollout.temperature),
    as the operator's and the runtime's error formatters expect.
    """
    if spec.algorithm in OFFLINE_ALGORITHMS:
        return []
    problems: list[str] = []
    reward = spec.roles.reward
    # There is no default reward: the actor's model has no reward head to fall back on. (DPO
    # refuses a reward role altogether, in validate_algorithm_roles.)
    if reward is not None and reward.function is None and reward.model is None:
        problems.append(
            "roles.reward: set function (a rule-based reward, 'package.module:function') or model "
            "(a reward model); it has neither"
        )
    training = spec.training
    if training.kl > 0 and spec.roles.reference is None:
        problems.append(
            f"training.kl: {training.kl} > 0 needs roles.reference, the frozen policy the KL is taken "
            "to: add reference: {colocateWith: actor}, or set kl to 0"
        )
    if training.kl > 0 and training.kl_estimator == "k1" and kl_is_loss_term(spec.algorithm, training):
        problems.append(
            "training.klEstimator: k1 cannot be a loss term (training.kl > 0"
            + ("" if spec.algorithm == "grpo" else " with klInReward false")
            + "): its expected gradient on the policy's own samples is 0, so it never pulls the policy "
            "to the reference; use k3 (or k2)" + ("" if spec.algorithm == "grpo" else ", or set klInReward")
        )
    if spec.algorithm == "grpo" and training.group_size < 2:
        problems.append(
            f"training.groupSize: grpo needs >= 2 completions per prompt, got {training.group_size}: "
            "advantages are rewards relative to the group's mean, so a group of one learns nothing"
        )
    if spec.algorithm == "grpo" and spec.rollout.temperature == 0:
        problems.append(
            "rollout.temperature: grpo needs > 0, got 0: greedy decoding makes every completion of a "
            "group the same, so every advantage is 0"
        )
    # The prompt gets maxSeqLen - maxNewTokens - 1 tokens (one for BOS; data/prompts.py).
    if spec.rollout.max_new_tokens > spec.data.max_seq_len - 2:
        problems.append(
            f"rollout.maxNewTokens: must be <= data.maxSeqLen - 2 ({spec.data.max_seq_len - 2}), got "
            f"{spec.rollout.max_new_tokens}: a prompt, its BOS token and its completion share maxSeqLen "
            "tokens, so no prompt token would be left"
        )
    problems.extend(batch_split_problems(spec))
    problems.extend(decode_rows_problems(spec))
    for field in DPO_ONLY_FIELDS:
        value = getattr(getattr(spec, field.section), field.name)
        if all(value != accepted for accepted in field.accepted):
            problems.append(f"{field.path}: {field.valid()}, got {value!r}: {field.why}")
    return problems


def batch_split_problems(spec: AlgorithmSettings) -> list[str]:
    """PPO/GRPO: a step's rows (globalBatch x groupSize) split evenly over the ranks of every role
    with GPUs of its own, and over training.miniBatches, and each mini-batch over the actor's and
    the critic's ranks (the trainer's own check at start, rl/trainer.py, moved to validation).
    A colocated role shares its owner's ranks, which are checked as the owner's. An elastic job is
    checked at its full size; a smaller size that does not split is the trainer's to refuse."""
    if spec.algorithm in OFFLINE_ALGORITHMS:
        return []
    rows = spec.batching.global_batch * (spec.training.group_size if spec.algorithm == "grpo" else 1)
    own = {name: role.gpus for name, role in spec.roles.present().items() if role.gpus}
    problems = [
        f"batching.globalBatch: {rows} rows per step (globalBatch x groupSize) must split evenly over the "
        f"{gpus} GPUs of role {name}"
        for name, gpus in own.items()
        if rows % gpus
    ]
    minis = spec.training.mini_batches
    if rows % minis:
        problems.append(f"training.miniBatches: {minis} does not divide the {rows} rows per step "
                        "(globalBatch x groupSize)")
        return problems
    problems.extend(
        f"training.miniBatches: a mini-batch of {rows // minis} rows must split evenly over the {own[name]} "
        f"GPUs of role {name}"
        for name in ("actor", "critic")
        if name in own and (rows // minis) % own[name]
    )
    return problems


def decode_rows_problems(spec: AlgorithmSettings) -> list[str]:
    """PPO/GRPO: rollout.decodeRows <= the rows each actor GPU generates per step (globalBatch x
    groupSize / roles.actor.gpus, at the job's full size; an elastic job at fewer workers gives
    each GPU more rows). Compared as decodeRows x gpus <= rows, as the CEL twin does."""
    decode_rows = spec.rollout.decode_rows
    if spec.algorithm in OFFLINE_ALGORITHMS or decode_rows is None:
        return []
    rows = spec.batching.global_batch * (spec.training.group_size if spec.algorithm == "grpo" else 1)
    gpus = spec.roles.actor.gpus or 1
    if decode_rows * gpus <= rows:
        return []
    return [f"rollout.decodeRows: must be <= the {rows // gpus} rows each actor GPU generates per step "
            f"(globalBatch x groupSize / roles.actor.gpus = {rows} / {gpus}), got {decode_rows}: "
            "rows beyond them would never decode; leave it unset to decode all of them at once"]
