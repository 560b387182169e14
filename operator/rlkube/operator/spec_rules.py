"""Spec rules the trainer or its pod would otherwise fail on late, each a Python check and its CEL twin.

`spec_problems(spec)` is called by `RLTrainingJobSpec`'s validator (so `rlkube validate` and the
operator refuse them) and `MODEL_RULES` / `FIELD_SCHEMAS` go into the CRD through
`rlkube.operator.crd` (so `kubectl apply` refuses the same specs). tests/unit/test_corpus_verdicts.py
runs tests/data/bad and tests/data/good through both; tests/integration/test_corpus_admission.py
runs them through a real API server.

The rules:
- A model given by `config` names a `model_type` rlkube trains (`SUPPORTED_MODEL_TYPES`); the CRD
  declares `model_type` with its enum inside the otherwise free-form config. A model given by
  `path` has its config.json read in the pod (runtime/cli.py: exit 3 naming the field).
- Paths the trainer opens in the pod (model.path, model.tokenizer unless 'byte', data.source
  unless format is 'synthetic', data.eval, and the same in every role's model) are absolute: a
  relative one would resolve against the image's working directory, which no volume is mounted
  at. The runtime reads no URIs (no scheme is supported), so none is let through.
- PPO/GRPO: a mini-batch (rows per step / miniBatches) splits evenly over the ranks of the critic
  also where the critic has no GPUs of its own and shares another role's group (critic ->
  reward, say): the trainer checks the ranks each role runs on (rl/trainer.py _check_divisible),
  `algorithm_settings.batch_split_problems` only the roles with GPUs of their own.
- PPO/GRPO elastic jobs: every size in [minWorkers, maxWorkers] splits a mini-batch evenly over
  the actor's GPUs at that size (pods x gpusPerPod; an elastic job's other roles share the
  actor's ranks), as the full size must: the trainer refuses a size that does not when it is
  restarted at it. DPO and KTO deal a step's samples to the ranks by cost
  (trainers/batching.rank_shares), so any size works for them and no rule applies.
"""

from __future__ import annotations

from math import lcm
from typing import Any

from rlkube.operator import pod_rules
from rlkube.runtime.contract.config import ROLE_NAMES, BatchingSpec, TrainingSpec, device_map
from rlkube.runtime.contract.model_types import SUPPORTED_MODEL_TYPES, model_type_problem

ONLINE = ("ppo", "grpo")
_ONLINE_CEL = "(self.algorithm == 'ppo' || self.algorithm == 'grpo')"

# The CEL twin of the elastic rule unrolls this many sizes. A wider range can never pass: its
# sizes include a multiple of every number up to its width, so a mini-batch splitting over all
# of them is a multiple of lcm(1..ELASTIC_SIZES_CHECKED + 1), more rows than a step can have.
ELASTIC_SIZES_CHECKED = 22


def _upper_bound(model: Any, name: str) -> int:
    return next(bound.le for bound in model.model_fields[name].metadata if getattr(bound, "le", None) is not None)


MAX_ROWS_PER_STEP = _upper_bound(BatchingSpec, "global_batch") * _upper_bound(TrainingSpec, "group_size")
assert lcm(*range(1, ELASTIC_SIZES_CHECKED + 2)) > MAX_ROWS_PER_STEP, "raise ELASTIC_SIZES_CHECKED"


# -- Python ---------------------------------------------------------------------------------------


def spec_problems(spec: Any) -> list[str]:
    """Every rule above on a validated `RLTrainingJobSpec`, one 'path: what is wrong' line each."""
    return [
        *model_type_problems(spec),
        *source_path_problems(spec),
        *colocated_critic_problems(spec),
        *elastic_split_problems(spec),
    ]


def _models(spec: Any) -> dict[str, Any]:
    roles = {f"roles.{name}.model": role.model for name, role in spec.roles.present().items() if role.model}
    return {"model": spec.model, **roles}


def model_type_problems(spec: Any) -> list[str]:
    return [
        f"{where}.config.model_type: {problem}"
        for where, model in _models(spec).items()
        if model.config is not None and "model_type" in model.config
        and (problem := model_type_problem(model.config["model_type"]))
    ]


def source_path_problems(spec: Any) -> list[str]:
    paths: dict[str, str | None] = {}
    for where, model in _models(spec).items():
        paths[f"{where}.path"] = model.path
        paths[f"{where}.tokenizer"] = None if model.tokenizer == "byte" else model.tokenizer
    paths["data.source"] = None if spec.data.format == "synthetic" else spec.data.source
    paths["data.eval"] = spec.data.eval
    return [
        f"{where}: must be an absolute path in the pod (a volume's mountPath and below), got {path!r}: a "
        "relative path resolves against the image's working directory"
        for where, path in paths.items()
        if path is not None and not path.startswith("/")
    ]


def _rows_and_minis(spec: Any) -> tuple[int, int]:
    group = spec.training.group_size if spec.algorithm == "grpo" else 1
    return spec.batching.global_batch * group, spec.training.mini_batches


def colocated_critic_problems(spec: Any) -> list[str]:
    critic = spec.roles.critic
    if spec.algorithm not in ONLINE or critic is None or critic.gpus is not None:
        return []
    rows, minis = _rows_and_minis(spec)
    gpus = len(device_map(spec.roles)["critic"])
    if rows % minis or (rows // minis) % gpus == 0:
        return []
    return [
        f"training.miniBatches: a mini-batch of {rows // minis} rows must split evenly over the {gpus} GPUs "
        f"the critic shares with role {spec.roles.group_owner('critic')} (colocateWith {critic.colocate_with})"
    ]


def elastic_split_problems(spec: Any) -> list[str]:
    if spec.elastic is None or spec.algorithm not in ONLINE:
        return []
    rows, minis = _rows_and_minis(spec)
    if rows % minis:
        return []  # refused as training.miniBatches
    per_pod, low, high = spec.placement.gpus_per_pod, spec.elastic.min_workers, spec.elastic.max_workers
    uneven = [pods for pods in range(low, high + 1) if (rows // minis) % (pods * per_pod)]
    if not uneven:
        return []
    shown = ", ".join(map(str, uneven[:8])) + (", ..." if len(uneven) > 8 else "")
    return [
        f"elastic: a mini-batch of {rows // minis} rows (globalBatch x groupSize / miniBatches) must split "
        f"evenly over the actor's GPUs at every size in [minWorkers, maxWorkers] = [{low}, {high}] pods of "
        f"{per_pod} GPUs, as at full size; it does not at {shown} pods (the trainer would refuse the job "
        "when it shrinks or grows to them)"
    ]


# -- CEL ------------------------------------------------------------------------------------------


def _rule(rule: str, message: str, field_path: str | None = None) -> dict:
    return {"rule": rule, "message": message, **({"fieldPath": field_path} if field_path else {})}


def _absolute(field: str) -> str:
    return f"!has(self.{field}) || self.{field}.startsWith('/')"


def _field(section: str, model: Any, name: str) -> str:
    wire = model.model_fields[name].alias or name
    default = model.model_fields[name].default
    return f"(has(self.{section}) && has(self.{section}.{wire}) ? self.{section}.{wire} : {default})"


def _rows_cel() -> str:
    group = _field("training", TrainingSpec, "group_size")
    return f"({_field('batching', BatchingSpec, 'global_batch')} * (self.algorithm == 'grpo' ? {group} : 1))"


def _group_gpus_cel(name: str, visited: frozenset[str] = frozenset()) -> str:
    """CEL: the GPUs of the group role `name` runs on (device_map's ranks): its own gpus, the
    actor's for gpus 0, else those of the role colocateWith leads to; 0 where a role is missing."""
    actor = "(has(self.roles.actor.gpus) ? self.roles.actor.gpus : 0)"
    if name == "actor":
        return actor
    role = f"self.roles.{name}"
    follow = "".join(
        f"{role}.colocateWith == '{target}' ? {_group_gpus_cel(target, visited | {name})} : "
        for target in ROLE_NAMES
        if target != name and target not in visited
    )
    own = f"({role}.gpus > 0 ? {role}.gpus : {actor})"
    return f"(has({role}) ? (has({role}.gpus) ? {own} : (has({role}.colocateWith) ? ({follow}0) : 0)) : 0)"


def _spec_rules() -> list[dict]:
    rows, minis = _rows_cel(), _field("training", TrainingSpec, "mini_batches")
    critic = _group_gpus_cel("critic")
    low, high = "self.elastic.minWorkers", "self.elastic.maxWorkers"
    per_pod = "(has(self.placement) && has(self.placement.gpusPerPod) ? self.placement.gpusPerPod : 1)"
    sizes = " && ".join(
        f"({low} + {i} > {high} || ({rows} / {minis}) % (({low} + {i}) * {per_pod}) == 0)"
        for i in range(ELASTIC_SIZES_CHECKED)
    )
    return [
        _rule(
            f"!{_ONLINE_CEL} || !has(self.roles.critic) || has(self.roles.critic.gpus) || {rows} % {minis} != 0 "
            f"|| {critic} == 0 || ({rows} / {minis}) % {critic} == 0",
            "training.miniBatches: a mini-batch (rows per step / miniBatches) must split evenly over the GPUs "
            "the critic shares with the role it colocates with",
            ".training",
        ),
        _rule(
            f"!has(self.elastic) || !{_ONLINE_CEL} || {per_pod} < 1 || {rows} % {minis} != 0 || "
            f"({high} - {low} < {ELASTIC_SIZES_CHECKED} && {sizes})",
            "elastic: a mini-batch (globalBatch x groupSize / miniBatches) must split evenly over the actor's "
            "GPUs (pods x gpusPerPod) at every size in [minWorkers, maxWorkers], as at full size",
            ".elastic",
        ),
    ]


_SOURCE = "(has(self.format) ? self.format : 'jsonl') == 'synthetic' || self.source.startsWith('/')"

MODEL_RULES: dict[str, list[dict]] = {
    "ModelSpec": [
        _rule(_absolute("path"), "path: must be an absolute path in the pod", ".path"),
        _rule(
            "!has(self.tokenizer) || self.tokenizer == 'byte' || self.tokenizer.startsWith('/')",
            "tokenizer: must be 'byte' or an absolute path in the pod",
            ".tokenizer",
        ),
    ],
    "DataSpec": [
        _rule(_SOURCE, "source: must be an absolute path in the pod (or format 'synthetic')", ".source"),
        _rule(_absolute("eval"), "eval: must be an absolute path in the pod", ".eval"),
    ],
    "RLTrainingJobSpec": _spec_rules(),
    "VolumeSpec": [_rule(*rule) for rule in pod_rules.volume_cel()],
    "CheckpointSpec": [_rule(*rule) for rule in pod_rules.dir_cel("checkpoint.dir")],
    "ExportSpec": [_rule(*rule) for rule in pod_rules.dir_cel("export.dir")],
}

# Schema added to a field as the generator writes it: the free-form model config declares its
# model_type, so the API server checks it (it cannot look at an undeclared field).
FIELD_SCHEMAS: dict[tuple[str, str], dict] = {
    ("ModelSpec", "config"): {
        "required": ["model_type"],
        "properties": {
            "model_type": {
                "type": "string",
                "description": "The model family, as in config.json; one rlkube trains.",
                "enum": list(SUPPORTED_MODEL_TYPES),
                "maxLength": max(map(len, SUPPORTED_MODEL_TYPES)),
            }
        },
    }
}
