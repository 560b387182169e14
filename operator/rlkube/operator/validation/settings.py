"""CEL of the rules `rlkube.runtime.contract.algorithm_settings` checks in Python, one for one:
settings the chosen algorithm cannot honour (KL without a reference, a k1 loss term, GRPO groups of
one or greedy rollouts, maxNewTokens against maxSeqLen, a step's rows split over ranks and
mini-batches, decodeRows, the DPO-only fields). The Python checks stay in the runtime's contract,
because the trainer runs them on its own config without the operator.
"""

from __future__ import annotations

from rlkube.operator.validation.cel import (
    OFFLINE,
    ONLINE,
    literal,
    mini_batches,
    role_gpus,
    rows,
    rule,
    spec_field,
)
from rlkube.runtime.contract.algorithm_settings import DPO_ONLY_FIELDS
from rlkube.runtime.contract.config import ROLE_NAMES, BatchingSpec, DataSpec, RolloutSpec, TrainingSpec


def _batch_split_cel() -> list[dict]:
    """CEL twins of algorithm_settings.batch_split_problems and decode_rows_problems."""
    step_rows, minis = rows(), mini_batches()
    rules = [
        rule(f"!{ONLINE} || {role_gpus(name)} == 0 || {step_rows} % {role_gpus(name)} == 0",
             f"batching.globalBatch: the rows per step (globalBatch x groupSize) must split evenly over "
             f"the GPUs of role {name}", ".batching")
        for name in ROLE_NAMES
    ]
    decode_rows = "(has(self.rollout) && has(self.rollout.decodeRows))"
    rules.append(rule(
        f"!{ONLINE} || !{decode_rows} || self.rollout.decodeRows * {role_gpus('actor')} <= {step_rows}",
        "rollout.decodeRows: must be <= the rows each actor GPU generates per step (globalBatch x "
        "groupSize / roles.actor.gpus): rows beyond them would never decode; leave it unset to decode "
        "all of them at once",
        ".rollout.decodeRows",
    ))
    rules.append(rule(f"!{ONLINE} || {step_rows} % {minis} == 0",
                      "training.miniBatches: must divide the rows per step (globalBatch x groupSize)", ".training"))
    rules.extend(
        rule(f"!{ONLINE} || {step_rows} % {minis} != 0 || {role_gpus(name)} == 0 || "
             f"({step_rows} / {minis}) % {role_gpus(name)} == 0",
             f"training.miniBatches: a mini-batch (rows per step / miniBatches) must split evenly over the "
             f"GPUs of role {name}", ".training")
        for name in ("actor", "critic")
    )
    return rules


def algorithm_settings_cel() -> list[dict]:
    """CEL on the spec: algorithm_settings.algorithm_setting_problems' rules."""
    kl = spec_field("training", TrainingSpec, "kl")
    group_size = spec_field("training", TrainingSpec, "group_size")
    temperature = spec_field("rollout", RolloutSpec, "temperature")
    estimator = spec_field("training", TrainingSpec, "kl_estimator")
    in_reward = spec_field("training", TrainingSpec, "kl_in_reward")
    new_tokens = spec_field("rollout", RolloutSpec, "max_new_tokens")
    rules = [
        rule(f"{OFFLINE} || {kl} == 0.0 || has(self.roles.reference)",
             "training.kl: > 0 needs roles.reference, the frozen policy the KL is taken to: add "
             "reference: {colocateWith: actor}, or set kl to 0", ".training.kl"),
        rule(f"!{ONLINE} || {kl} == 0.0 || {estimator} != 'k1' || (self.algorithm == 'ppo' && {in_reward})",
             "training.klEstimator: k1 cannot be a loss term (training.kl > 0, grpo or ppo with klInReward "
             "false): its expected gradient on the policy's own samples is 0, so it never pulls the policy "
             "to the reference; use k3 (or k2), or with ppo set klInReward", ".training.klEstimator"),
        rule(f"self.algorithm != 'grpo' || {group_size} >= 2",
             "training.groupSize: grpo needs >= 2 completions per prompt: advantages are rewards "
             "relative to the group's mean, so a group of one learns nothing", ".training.groupSize"),
        rule(f"self.algorithm != 'grpo' || {temperature} != 0.0",
             "rollout.temperature: grpo needs > 0: greedy decoding makes every completion of a group "
             "the same, so every advantage is 0", ".rollout.temperature"),
        rule(f"!{ONLINE} || {new_tokens} + 2 <= {spec_field('data', DataSpec, 'max_seq_len')}",
             "rollout.maxNewTokens: must be <= data.maxSeqLen - 2: a prompt, its BOS token and its completion "
             "share maxSeqLen tokens, so no prompt token would be left", ".rollout.maxNewTokens"),
        *_batch_split_cel(),
    ]
    for field in DPO_ONLY_FIELDS:
        model = DataSpec if field.section == "data" else BatchingSpec
        value = spec_field(field.section, model, field.name)
        accepted = " || ".join(f"{value} == {literal(option)}" for option in field.accepted)
        rules.append(rule(f"{OFFLINE} || {accepted}", f"{field.path}: {field.valid()}: {field.why}", f".{field.path}"))
    return rules
