"""CEL rules (`x-kubernetes-validations`) of the RLTrainingJob CRD, for `rlkube.operator.crd`.

They repeat the cross-field rules of the pydantic validators (`rlkube.operator.spec_types`, and
`rlkube.runtime.contract.config` / `algorithm_settings` for the sections the runtime shares), so
`kubectl apply` rejects what `rlkube validate` rejects; tests/unit/test_corpus_verdicts.py runs the
manifests of tests/data through both, test_crd_admission.py generated specs. Each message starts with the field path, as the pydantic errors do.
"""

from __future__ import annotations

from typing import Any

from rlkube.operator import pod_rules
from rlkube.runtime.contract.algorithm_settings import DPO_ONLY_FIELDS
from rlkube.runtime.contract.config import ROLE_NAMES, BatchingSpec, DataSpec, RolloutSpec, Spec, TrainingSpec

# ---------------------------------------------------------------------------------------------
# CEL rules, keyed by the pydantic model they belong to (they follow the model wherever the
# generator inlines it) or by (model, field) for rules on one property.
# ---------------------------------------------------------------------------------------------

_OTHER_ROLES = tuple(name for name in ROLE_NAMES if name != "actor")


def _rule(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict:
    out: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def _role_gpus(name: str, base: str = "self.roles") -> str:
    """CEL for a role's own gpus, 0 when the role or its gpus is unset."""
    if name == "actor":
        return f"(has({base}.actor.gpus) ? {base}.actor.gpus : 0)"
    return f"(has({base}.{name}) && has({base}.{name}.gpus) ? {base}.{name}.gpus : 0)"


def _total_gpus() -> str:
    return "(" + " + ".join(_role_gpus(name) for name in ROLE_NAMES) + ")"


def _gpus_per_pod() -> str:
    return "(has(self.placement) && has(self.placement.gpusPerPod) ? self.placement.gpusPerPod : 1)"


def _resolves(name: str, visited: frozenset[str]) -> str:
    """CEL: following colocateWith from role `name` ends at a role with gpus, without a cycle."""
    if name == "actor":
        return "true"
    visited = visited | {name}
    steps = []
    for target in ROLE_NAMES:
        if target in visited:
            continue
        present = "" if target == "actor" else f" && has(self.{target})"
        steps.append(f"(self.{name}.colocateWith == '{target}'{present} && {_resolves(target, visited)})")
    follow = " || ".join(steps) if steps else "false"
    return f"(has(self.{name}.gpus) || (has(self.{name}.colocateWith) && ({follow})))"


def _roles_rules() -> list[dict]:
    rules = [
        _rule(
            "!has(self.actor.colocateWith)",
            "roles.actor: must have gpus of its own, not colocateWith",
            ".actor",
        ),
        _rule(
            "has(self.actor.gpus) && self.actor.gpus >= 1",
            "roles.actor.gpus: must be >= 1 (the actor trains and generates on GPUs of its own)",
            ".actor",
        ),
        _rule("!has(self.actor.function)", "roles.actor.function: only the reward role takes a function", ".actor"),
    ]
    for name in _OTHER_ROLES:
        unset = f"!has(self.{name}) || !has(self.{name}.colocateWith)"
        existing = " || ".join(
            f"self.{name}.colocateWith == '{target}'" + ("" if target == "actor" else f" && has(self.{target})")
            for target in ROLE_NAMES
            if target != name
        )
        rules += [
            _rule(
                f"{unset} || self.{name}.colocateWith != '{name}'",
                f"roles.{name}.colocateWith: a role cannot colocate with itself",
                f".{name}",
            ),
            _rule(
                f"{unset} || {existing}",
                f"roles.{name}.colocateWith: must name a role that is set",
                f".{name}",
            ),
            _rule(
                f"!has(self.{name}) || {_resolves(name, frozenset())}",
                f"roles.{name}.colocateWith: the colocateWith chain must end at a role with gpus (no cycles)",
                f".{name}",
            ),
        ]
        rules.append(
            _rule(
                f"!has(self.{name}) || !has(self.{name}.model) || !has(self.{name}.model.lora)",
                f"roles.{name}.model.lora: only the actor trains adapters (set model.lora)",
                f".{name}",
            )
        )
        if name != "reward":
            rules.append(
                _rule(
                    f"!has(self.{name}) || !has(self.{name}.function)",
                    f"roles.{name}.function: only the reward role takes a function",
                    f".{name}",
                )
            )
    rules += [
        _rule(
            "!has(self.reward) || !has(self.reward.function) || !has(self.reward.model)",
            "roles.reward: set model or function, not both",
            ".reward",
        ),
        _rule(
            "!has(self.reward) || has(self.reward.function) || has(self.reward.model)",
            "roles.reward: set function (a rule-based reward, 'package.module:function') or model "
            "(a reward model)",
            ".reward",
        ),
    ]
    return rules


def _spec_rules() -> list[dict]:
    total, per_pod = _total_gpus(), _gpus_per_pod()
    return [
        _rule(f"{total} >= 1", "roles: the roles' gpus must add up to >= 1", ".roles"),
        # gpusPerPod < 1 is refused by its own minimum; the guard keeps CEL from dividing by 0.
        _rule(
            f"{per_pod} < 1 || {total} % {per_pod} == 0",
            "placement.gpusPerPod: the job's total GPUs (the sum of the roles' gpus) must be a "
            "multiple of gpusPerPod",
            ".placement",
        ),
        _rule(
            "self.algorithm == 'ppo' || !has(self.roles.critic)",
            "roles.critic: only ppo uses a critic",
            ".roles",
        ),
        _rule("self.algorithm != 'ppo' || has(self.roles.critic)", "roles.critic: ppo needs a critic role", ".roles"),
        _rule(
            "self.algorithm == 'dpo' || self.algorithm == 'kto' || has(self.roles.reward)",
            "roles.reward: ppo and grpo need a reward role (a model or a function)",
            ".roles",
        ),
        _rule(
            "(self.algorithm != 'dpo' && self.algorithm != 'kto') || !has(self.roles.reward)",
            "roles.reward: dpo and kto learn from preference data and use no reward role",
            ".roles",
        ),
        _rule(
            f"!has(self.elastic) || {per_pod} < 1 || self.elastic.minWorkers <= {total} / {per_pod}",
            "elastic.minWorkers: must be <= the job's pods (total GPUs / gpusPerPod)",
            ".elastic",
        ),
        _rule(
            f"!has(self.elastic) || {per_pod} < 1 || self.elastic.maxWorkers >= {total} / {per_pod}",
            "elastic.maxWorkers: must be >= the job's pods (total GPUs / gpusPerPod)",
            ".elastic",
        ),
        _rule(
            "!has(self.elastic) || "
            + " && ".join(
                f"(!has(self.roles.{name}) || !has(self.roles.{name}.gpus) || self.roles.{name}.gpus == 0)"
                for name in ("critic", "reward", "reference")
            ),
            "elastic: only the actor's data-parallel group resizes; the other roles must "
            "colocateWith the actor or have gpus: 0",
            ".elastic",
        ),
    ]


def _cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # a float keeps its '.', so CEL reads a double as the schema's number is
    if isinstance(value, str) and "'" not in value and "\\" not in value:
        return f"'{value}'"
    raise TypeError(f"no CEL literal for {value!r}")


def _spec_field(section: str, model: type[Spec], name: str) -> str:
    """CEL: the spec's `section.name`, or the pydantic default where it is unset (the CRD declares
    the same default, so the fallback only matters to an object the defaulting has not seen)."""
    wire = model.model_fields[name].alias or name
    default = _cel_literal(model.model_fields[name].default)
    return f"(has(self.{section}) && has(self.{section}.{wire}) ? self.{section}.{wire} : {default})"


def _batch_split_rules() -> list[dict]:
    """CEL twins of algorithm_settings.batch_split_problems and decode_rows_problems."""
    online = "(self.algorithm == 'ppo' || self.algorithm == 'grpo')"
    group = _spec_field("training", TrainingSpec, "group_size")
    rows = f"({_spec_field('batching', BatchingSpec, 'global_batch')} * (self.algorithm == 'grpo' ? {group} : 1))"
    minis = _spec_field("training", TrainingSpec, "mini_batches")
    rules = [
        _rule(
            f"!{online} || {_role_gpus(name)} == 0 || {rows} % {_role_gpus(name)} == 0",
            f"batching.globalBatch: the rows per step (globalBatch x groupSize) must split evenly over "
            f"the GPUs of role {name}",
            ".batching",
        )
        for name in ROLE_NAMES
    ]
    decode_rows = "(has(self.rollout) && has(self.rollout.decodeRows))"
    rules.append(_rule(
        f"!{online} || !{decode_rows} || self.rollout.decodeRows * {_role_gpus('actor')} <= {rows}",
        "rollout.decodeRows: must be <= the rows each actor GPU generates per step (globalBatch x "
        "groupSize / roles.actor.gpus): rows beyond them would never decode; leave it unset to decode "
        "all of them at once",
        ".rollout.decodeRows",
    ))
    rules.append(_rule(f"!{online} || {rows} % {minis} == 0",
                       "training.miniBatches: must divide the rows per step (globalBatch x groupSize)", ".training"))
    rules.extend(
        _rule(
            f"!{online} || {rows} % {minis} != 0 || {_role_gpus(name)} == 0 || "
            f"({rows} / {minis}) % {_role_gpus(name)} == 0",
            f"training.miniBatches: a mini-batch (rows per step / miniBatches) must split evenly over the "
            f"GPUs of role {name}",
            ".training",
        )
        for name in ("actor", "critic")
    )
    return rules


def _algorithm_setting_rules() -> list[dict]:
    """The rules of rlkube.runtime.contract.algorithm_settings, one for one."""
    kl = _spec_field("training", TrainingSpec, "kl")
    group_size = _spec_field("training", TrainingSpec, "group_size")
    temperature = _spec_field("rollout", RolloutSpec, "temperature")
    estimator = _spec_field("training", TrainingSpec, "kl_estimator")
    in_reward = _spec_field("training", TrainingSpec, "kl_in_reward")
    rules = [
        _rule(
            f"self.algorithm == 'dpo' || self.algorithm == 'kto' || {kl} == 0.0 || has(self.roles.reference)",
            "training.kl: > 0 needs roles.reference, the frozen policy the KL is taken to: add "
            "reference: {colocateWith: actor}, or set kl to 0",
            ".training.kl",
        ),
        _rule(
            f"(self.algorithm != 'ppo' && self.algorithm != 'grpo') || {kl} == 0.0 || {estimator} != 'k1' "
            f"|| (self.algorithm == 'ppo' && {in_reward})",
            "training.klEstimator: k1 cannot be a loss term (training.kl > 0, grpo or ppo with klInReward "
            "false): its expected gradient on the policy's own samples is 0, so it never pulls the policy "
            "to the reference; use k3 (or k2), or with ppo set klInReward",
            ".training.klEstimator",
        ),
        _rule(
            f"self.algorithm != 'grpo' || {group_size} >= 2",
            "training.groupSize: grpo needs >= 2 completions per prompt: advantages are rewards "
            "relative to the group's mean, so a group of one learns nothing",
            ".training.groupSize",
        ),
        _rule(
            f"self.algorithm != 'grpo' || {temperature} != 0.0",
            "rollout.temperature: grpo needs > 0: greedy decoding makes every completion of a group "
            "the same, so every advantage is 0",
            ".rollout.temperature",
        ),
        _rule(
            f"(self.algorithm != 'ppo' && self.algorithm != 'grpo') || "
            f"{_spec_field('rollout', RolloutSpec, 'max_new_tokens')} + 2 <= {_spec_field('data', DataSpec, 'max_seq_len')}",
            "rollout.maxNewTokens: must be <= data.maxSeqLen - 2: a prompt, its BOS token and its completion "
            "share maxSeqLen tokens, so no prompt token would be left",
            ".rollout.maxNewTokens",
        ),
        *_batch_split_rules(),
    ]
    for field in DPO_ONLY_FIELDS:
        model = DataSpec if field.section == "data" else BatchingSpec
        value = _spec_field(field.section, model, field.name)
        accepted = " || ".join(f"{value} == {_cel_literal(option)}" for option in field.accepted)
        rules.append(
            _rule(
                f"self.algorithm == 'dpo' || self.algorithm == 'kto' || {accepted}",
                f"{field.path}: {field.valid()}: {field.why}",
                f".{field.path}",
            )
        )
    return rules


def _immutable(field: str) -> list[dict]:
    return [
        _rule(
            "self == oldSelf",
            f"{field} is immutable: it defines the run; create a new RLTrainingJob instead",
        )
    ]


MODEL_RULES: dict[str, list[dict]] = {
    "ModelSpec": [_rule("has(self.path) != has(self.config)", "exactly one of path and config must be set")],
    "RoleSpec": [
        _rule("has(self.gpus) != has(self.colocateWith)", "exactly one of gpus and colocateWith must be set")
    ],
    "RolesSpec": _roles_rules(),
    "BatchingSpec": [
        _rule(
            "self.maxMicroBatch >= self.minMicroBatch",
            "maxMicroBatch: must be >= minMicroBatch",
            ".maxMicroBatch",
        )
    ],
    "DataSpec": [_rule("!has(self.eval) || !has(self.evalFraction)", "eval: set eval or evalFraction, not both", ".eval")],
    "ElasticSpec": [
        _rule("self.maxWorkers >= self.minWorkers", "maxWorkers: must be >= minWorkers", ".maxWorkers")
    ],
    "VolumeSpec": [
        _rule("has(self.claimName) != has(self.hostPath)", "exactly one of claimName and hostPath must be set")
    ],
    "Toleration": [
        _rule(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "value: must be empty when operator is Exists",
            ".value",
        ),
        _rule("has(self.key) || self.operator == 'Exists'", "operator: must be Exists when key is unset", ".operator"),
        _rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds: only applies to effect NoExecute",
            ".tolerationSeconds",
        ),
    ],
    "RLTrainingJobSpec": [
        *_spec_rules(),
        *_algorithm_setting_rules(),
        *(_rule(rule, message, path) for rule, message, path in pod_rules.mount_path_cel()),
    ],
    "PodResources": [
        _rule(pod_rules.requests_within_limits_cel(wire), f"requests.{wire}: must be <= limits.{wire}", ".requests")
        for _, wire in pod_rules.RESOURCE_FIELDS
    ],
    "PodSecurity": [_rule(pod_rules.NON_ROOT_AS_ROOT_CEL, pod_rules.NON_ROOT_AS_ROOT, ".runAsNonRoot")],
}

FIELD_RULES: dict[tuple[str, str], list[dict]] = {
    ("RLTrainingJobSpec", "algorithm"): _immutable("algorithm"),
    ("RLTrainingJobSpec", "model"): _immutable("model"),
    ("RLTrainingJobSpec", "roles"): _immutable("roles"),
    ("RLTrainingJobSpec", "volumes"): [
        _rule(
            "self.all(v, self.exists_one(w, w.mountPath == v.mountPath))",
            "each mountPath must be unique",
        ),
        _rule("self.all(v, v.name != 'checkpoints')", "name 'checkpoints' is reserved for the checkpoint volume"),
    ],
    ("RLTrainingJobSpec", "nodeSelector"): [
        _rule(pod_rules.label_keys_cel(), "every key must be a label key: an optional DNS-subdomain prefix and "
              "'/', then a name of 1-63 characters, starting and ending alphanumeric")
    ],
    ("RunPolicySpec", "failOnExitCodes"): [
        _rule(
            "!self.exists(c, c == 143)",
            "must not contain 143: that code means stopped by SIGTERM after a checkpoint",
        )
    ],
}

# Volumes are keyed by name (unique names, merge-friendly).
LIST_MAP_KEYS: dict[tuple[str, str], list[str]] = {("RLTrainingJobSpec", "volumes"): ["name"]}
