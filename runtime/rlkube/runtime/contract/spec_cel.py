"""The spec's facts spelled in CEL, for the rules of the contract that sit on the whole spec
(`algorithm_rules`) and for the operator's own spec-wide rules.

A rule's CEL runs on the object the rule sits on (`self`), here the spec: a `RuntimeConfig` or an
`RLTrainingJobSpec`, which share these sections. Each helper spells one fact (a section's field or
its default, a role's GPUs, the rows of a PPO/GRPO step) once, so two rules that read the same
fact read it the same way, and the Python half reads the same fact from the same defaults.
"""

from __future__ import annotations

from typing import Any

from rlkube.runtime.contract.algorithms import OFFLINE_ALGORITHMS, ONLINE_ALGORITHMS
from rlkube.runtime.contract.sections import BatchingSpec, TrainingSpec


def _any_of(names: tuple[str, ...]) -> str:
    return "(" + " || ".join(f"self.algorithm == '{name}'" for name in names) + ")"


ONLINE = _any_of(ONLINE_ALGORITHMS)  # PPO, GRPO: rollouts and a reward role
OFFLINE = _any_of(OFFLINE_ALGORITHMS)  # DPO, KTO: fixed preference data


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


def rows() -> str:
    """CEL on the spec: the rows of a PPO/GRPO step (globalBatch x groupSize for GRPO)."""
    group = spec_field("training", TrainingSpec, "group_size")
    return f"({spec_field('batching', BatchingSpec, 'global_batch')} * (self.algorithm == 'grpo' ? {group} : 1))"


def mini_batches() -> str:
    return spec_field("training", TrainingSpec, "mini_batches")
