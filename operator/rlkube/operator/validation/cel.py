"""CEL building blocks the rule modules of `rlkube.operator.validation` share.

A rule's CEL runs on the object the rule sits on (`self`): the spec for cross-section rules, a
section or a list for the others. The helpers here spell the spec's facts once (a section's field
or its default, a role's GPUs, the rows of a PPO/GRPO step), so two rules that read the same fact
read it the same way.
"""

from __future__ import annotations

from typing import Any

from rlkube.runtime.contract.config import ROLE_NAMES, BatchingSpec, TrainingSpec

ONLINE = "(self.algorithm == 'ppo' || self.algorithm == 'grpo')"
OFFLINE = "(self.algorithm == 'dpo' || self.algorithm == 'kto')"


def rule(cel: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict:
    """One `x-kubernetes-validations` entry. The message starts with the field path relative to
    the object the rule sits on, as the Python check's error does."""
    out: dict[str, Any] = {"rule": cel, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def literal(value: Any) -> str:
    """A Python default as a CEL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # a float keeps its '.', so CEL reads a double as the schema's number is
    if isinstance(value, str) and "'" not in value and "\\" not in value:
        return f"'{value}'"
    raise TypeError(f"no CEL literal for {value!r}")


def spec_field(section: str, model: Any, name: str) -> str:
    """CEL on the spec: `section.name`, or the pydantic default where it is unset (the CRD declares
    the same default, so the fallback only matters to an object the defaulting has not seen)."""
    wire = model.model_fields[name].alias or name
    default = literal(model.model_fields[name].default)
    return f"(has(self.{section}) && has(self.{section}.{wire}) ? self.{section}.{wire} : {default})"


def role_gpus(name: str, base: str = "self.roles") -> str:
    """CEL: a role's own gpus, 0 when the role or its gpus is unset."""
    if name == "actor":
        return f"(has({base}.actor.gpus) ? {base}.actor.gpus : 0)"
    return f"(has({base}.{name}) && has({base}.{name}.gpus) ? {base}.{name}.gpus : 0)"


def total_gpus() -> str:
    """CEL on the spec: the sum of the roles' own gpus."""
    return "(" + " + ".join(role_gpus(name) for name in ROLE_NAMES) + ")"


def gpus_per_pod() -> str:
    return "(has(self.placement) && has(self.placement.gpusPerPod) ? self.placement.gpusPerPod : 1)"


def rows() -> str:
    """CEL on the spec: the rows of a PPO/GRPO step (globalBatch x groupSize for GRPO)."""
    group = spec_field("training", TrainingSpec, "group_size")
    return f"({spec_field('batching', BatchingSpec, 'global_batch')} * (self.algorithm == 'grpo' ? {group} : 1))"


def mini_batches() -> str:
    return spec_field("training", TrainingSpec, "mini_batches")
