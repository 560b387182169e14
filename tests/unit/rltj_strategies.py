"""Hypothesis strategies for RLTrainingJob specs: valid specs with random mutations deep inside."""

from __future__ import annotations

import typing

from hypothesis import strategies as st
from pydantic import BaseModel
from rltj_builders import spec

from rlkube.operator import api

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([-1, 0, 1, 2, 3, 4, 7, 8, 143, 255, 256, 4096, 4097, 2**31, 2**63]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "actor", "critic", "reward", "reference", "ppo", "dpo", "grpo", "1e-5", "500m",
                     "kubernetes.io/hostname", "Exists", "a" * 2000, "rlkube.runtime.rewards:target_pattern"]),
    st.text(max_size=12),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _aliases(annotation: typing.Any) -> list[str]:
    """Wire names of the fields of the model inside `annotation` (through Optional/list/dict)."""
    stack = [annotation]
    while stack:
        current = stack.pop()
        if isinstance(current, type) and issubclass(current, BaseModel):
            return [info.alias or name for name, info in current.model_fields.items()]
        stack.extend(typing.get_args(current))
    return []


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict:
    data = spec(draw(st.sampled_from(["dpo", "ppo", "grpo"])))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        node: typing.Any = data
        model: typing.Any = api.RLTrainingJobSpec
        # Walk down existing keys and real field names, so mutations land deep inside sections.
        while True:
            names = sorted(set(node) | set(_aliases(model))) if isinstance(node, dict) else []
            if not names:
                break
            key = draw(st.sampled_from(names) | st.text(max_size=6))
            child = node.get(key)
            info = next(
                (i for n, i in getattr(model, "model_fields", {}).items() if key in (n, i.alias)), None
            )
            descend = isinstance(child, dict) and draw(st.booleans())
            if descend:
                node, model = child, _model_of(info.annotation if info else None)
                continue
            action = draw(st.sampled_from(["set", "set", "delete"]))
            if action == "delete":
                node.pop(key, None)
            else:
                node[key] = draw(JSON)
            break
    return data


def _model_of(annotation: typing.Any) -> typing.Any:
    stack = [annotation]
    while stack:
        current = stack.pop()
        if isinstance(current, type) and issubclass(current, BaseModel):
            return current
        stack.extend(typing.get_args(current))
    return None
