"""The CRD's schema and CEL rules agree with the pydantic validators (see crd_checker).

The manifests of tests/data and examples/ get their one verdict in test_corpus_verdicts.py."""

from __future__ import annotations

import pytest
from crd_checker import CelError, admit, evaluate, validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rltj_builders import job
from rltj_strategies import mutated_specs
from verdicts import assert_one_verdict

from rlkube.operator import api
from rlkube.operator.api import crd

CRD = crd.crd_manifest()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_crd_and_pydantic_agree_on_mutated_specs(spec):
    obj = job() | {"spec": spec}
    pydantic_errors = api.job_errors(obj)
    crd_errors = admit(obj, CRD)
    if not pydantic_errors:
        assert crd_errors == [], crd_errors
    elif not crd_errors:
        # Only what the schema cannot express may pass the CRD.
        assert all("model_type" in error.message for error in pydantic_errors), pydantic_errors


# The rules of rlkube.runtime.contract.algorithm_settings at their boundaries: (algorithm, spec
# overrides, the one field path refused, or None). Each runs through pydantic (rlkube validate),
# the CRD (the API server) and RuntimeConfig (the trainer at start), which must agree.
NO_REFERENCE = {"actor": {"gpus": 2}, "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}}
SYNTHETIC = {"source": "synthetic", "format": "synthetic"}
SETTING_CASES = [
    ("grpo", {"training": {"kl": 0.05}}, None),
    ("grpo", {"training": {"kl": 0.05}, "roles": NO_REFERENCE}, "spec.training.kl"),
    ("grpo", {"training": {"kl": 0.0}, "roles": NO_REFERENCE}, None),
    ("ppo", {"training": {"kl": 1e-4}, "roles": {**NO_REFERENCE, "critic": {"colocateWith": "actor"}}},
     "spec.training.kl"),
    ("dpo", {"training": {"kl": 0.05}, "roles": {"actor": {"gpus": 2}}}, None),  # DPO never reads kl
    ("ppo", {"roles": {"actor": {"gpus": 1}, "critic": {"gpus": 1}, "reward": {"gpus": 1}}}, "spec.roles.reward"),
    ("grpo", {"roles": {"actor": {"gpus": 1}, "reward": {"colocateWith": "actor"}}}, "spec.roles.reward"),
    ("grpo", {"roles": {"actor": {"gpus": 1}, "reward": {"gpus": 1, "model": {"path": "/m"}}}}, None),
    ("grpo", {"training": {"groupSize": 1}}, "spec.training.groupSize"),
    ("grpo", {"training": {"groupSize": 2}}, None),
    ("ppo", {"training": {"groupSize": 1}}, None),  # PPO has no groups
    ("grpo", {"rollout": {"temperature": 0}}, "spec.rollout.temperature"),
    ("grpo", {"rollout": {"temperature": 0.0}}, "spec.rollout.temperature"),
    ("grpo", {"rollout": {"temperature": 0.01}}, None),
    ("ppo", {"rollout": {"temperature": 0}}, None),  # greedy PPO rollouts are allowed
    ("ppo", {"batching": {"minMicroBatch": 2}}, None),
    ("grpo", {"batching": {"minMicroBatch": 1, "maxMicroBatch": 8}}, None),
    ("grpo", {"batching": {"maxTokensPerGpu": 16385}}, None),
    ("ppo", {"batching": {"maxTokensPerGpu": 4096, "mode": "adaptive", "minMicroBatch": 2}}, None),
    ("ppo", {"batching": {"memoryFraction": 0.85}}, None),
    ("grpo", {"batching": {"memoryFraction": 1}}, "spec.batching.memoryFraction"),
    ("grpo", {"batching": {"memoryFraction": 0.2}}, "spec.batching.memoryFraction"),
    ("ppo", {"batching": {"mode": "fixed"}}, None),  # what PPO/GRPO do anyway
    ("grpo", {"batching": {"mode": "adaptive"}}, None),  # the default; CEL cannot tell it from unset
    ("grpo", {"data": {**SYNTHETIC, "packing": False, "lengthBucketing": False}}, None),
    ("ppo", {"data": {**SYNTHETIC, "prefetch": 3}}, "spec.data.prefetch"),
    ("grpo", {"data": {**SYNTHETIC, "prefetch": 0}}, None),
    ("ppo", {"data": {**SYNTHETIC, "lengthMix": "longTailed"}}, "spec.data.lengthMix"),
    ("dpo", {"data": {**SYNTHETIC, "lengthMix": "longTailed", "prefetch": 8},
             "batching": {"minMicroBatch": 2, "maxTokensPerGpu": 4096, "memoryFraction": 0.5}}, None),
]


@pytest.mark.parametrize("algorithm, overrides, refused", SETTING_CASES)
def test_algorithm_settings_get_one_verdict_from_pydantic_the_crd_and_the_runtime(algorithm, overrides, refused):
    obj = job(algorithm=algorithm, **overrides)
    assert_one_verdict(obj, refused)


ROLE_NAMES = ("actor", "critic", "reward", "reference")
FUNCTION = "rlkube.runtime.rewards:target_pattern"


@st.composite
def role_layouts(draw: st.DrawFn) -> dict:
    """Jobs that differ only in the cross-field parts (algorithm, roles, gpusPerPod, elastic).

    A valid layout, then at most one targeted break that adds no GPUs, and a gpusPerPod that
    usually divides the total: so a broken job usually breaks exactly one rule. Removing any one
    CEL rule that no other rule implies makes the test below fail (checked by deleting each rule
    in turn when they were written; the redundant ones give the clearer message for their case).
    """
    algorithm = draw(st.sampled_from(["dpo", "ppo", "grpo"]))
    gpus = st.integers(min_value=0, max_value=3)
    layout: dict = {"actor": {"gpus": draw(st.integers(min_value=1, max_value=4))}}
    if algorithm == "ppo":
        layout["critic"] = draw(st.sampled_from([{"gpus": draw(gpus)}, {"colocateWith": "actor"}]))
    if algorithm != "dpo":
        layout["reward"] = draw(st.sampled_from([
            {"gpus": draw(gpus), "model": {"path": "/m"}},
            {"gpus": 0, "function": FUNCTION},
            {"colocateWith": draw(st.sampled_from(sorted(layout))), "function": FUNCTION},
        ]))
    if draw(st.booleans()):
        layout["reference"] = {"colocateWith": draw(st.sampled_from(sorted(layout)))}
    others = [name for name in ROLE_NAMES if name != "actor"]
    role = draw(st.sampled_from(others))
    brk = draw(st.sampled_from([
        "none", "none", "negative", "actor-zero", "self", "missing-target", "cycle", "actor-colocated",
        "function-elsewhere", "model-and-function", "empty", "gpus-and-colocate", "drop", "add-critic",
        "add-reward", "reward-without-source",
    ]))
    if brk == "negative":
        layout[role] = {"gpus": -1}
    elif brk == "actor-zero":
        layout["actor"] = {"gpus": 0}
    elif brk == "self":
        layout[role] = {"colocateWith": role}
    elif brk == "missing-target":
        absent = [name for name in others if name not in layout and name != role]
        if absent:
            layout[role] = {"colocateWith": draw(st.sampled_from(absent))}
    elif brk == "cycle":
        first, second = draw(st.permutations(others))[:2]
        layout[first], layout[second] = {"colocateWith": second}, {"colocateWith": first}
    elif brk == "actor-colocated":
        layout["actor"] = {"colocateWith": draw(st.sampled_from(ROLE_NAMES))}
    elif brk == "function-elsewhere":
        target = draw(st.sampled_from(["actor", "critic", "reference"]))
        layout[target] = (
            {**layout["actor"], "function": FUNCTION}
            if target == "actor" else {"colocateWith": "actor", "function": FUNCTION}
        )
    elif brk == "model-and-function":
        layout["reward"] = {"colocateWith": "actor", "function": FUNCTION, "model": {"path": "/m"}}
    elif brk == "empty":
        layout[role] = {}
    elif brk == "gpus-and-colocate":
        layout[role] = {"gpus": 0, "colocateWith": "actor"}
    elif brk == "drop" and len(layout) > 1:
        layout.pop(draw(st.sampled_from(sorted(set(layout) - {"actor"}))))
    elif brk == "add-critic":
        layout["critic"] = {"colocateWith": "actor"}
    elif brk == "add-reward":
        layout["reward"] = {"gpus": 0, "function": FUNCTION}
    elif brk == "reward-without-source" and "reward" in layout:
        layout["reward"] = {key: value for key, value in layout["reward"].items() if key not in ("model", "function")}
    total = sum(r["gpus"] for r in layout.values() if isinstance(r.get("gpus"), int) and r["gpus"] > 0)
    divisors = [d for d in range(1, 5) if total and total % d == 0] or [1]
    per_pod = draw(st.sampled_from(divisors) | st.integers(min_value=1, max_value=4))
    overrides: dict = {"roles": layout, "placement": {"gpusPerPod": per_pod}}
    if draw(st.booleans()):
        pods = max(total // per_pod, 1)
        low = draw(st.integers(min_value=1, max_value=pods + 1))
        overrides["elastic"] = {"minWorkers": low, "maxWorkers": draw(st.integers(min_value=low - 1, max_value=pods + 1))}
    return job(algorithm=algorithm, **overrides)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(role_layouts())
def test_crd_and_pydantic_agree_exactly_on_role_layouts(obj):
    pydantic_errors = api.job_errors(obj)
    crd_errors = admit(obj, CRD)
    assert bool(pydantic_errors) == bool(crd_errors), (pydantic_errors, crd_errors)


def test_the_cel_subset_evaluator_is_not_vacuous():
    assert evaluate("has(self.a) && self.a.b % 4 == 0", {"self": {"a": {"b": 8}}}) is True
    assert evaluate("(has(self.x) ? self.x : 1) + 2 >= 4", {"self": {}}) is False
    assert evaluate("self.all(v, self.exists_one(w, w.n == v.n))", {"self": [{"n": 1}, {"n": 1}]}) is False
    assert evaluate("!self.exists(c, c == 143)", {"self": [3, 4]}) is True
    with pytest.raises(CelError):
        evaluate("self.missing == 1", {"self": {}})
    assert evaluate("self.all(k, k.matches('^[a-z]+$'))", {"self": {"ab": "1", "c": "2"}}) is True
    assert evaluate("self.all(k, k.matches('^[a-z]+$'))", {"self": {"ab": "1", "C": "2"}}) is False
    assert evaluate("self.startsWith('/')", {"self": "ckpt"}) is False
    assert evaluate("quantity(self.r).compareTo(quantity(self.l)) <= 0", {"self": {"r": "1500m", "l": "2"}}) is True
    assert evaluate("quantity(self.r).compareTo(quantity(self.l)) <= 0", {"self": {"r": "2G", "l": "1Gi"}}) is False
    assert evaluate("self.endsWith('/') || self.contains('//')", {"self": "/a//b"}) is True
    assert evaluate("self.matches('(^|/)[.][.]?(/|$)')", {"self": "/a/../b"}) is True
    with pytest.raises(CelError):
        evaluate("self.lowerAscii() == 'x'", {"self": "x"})


def _nodes(node: dict, path: str = ""):
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _nodes(node[key], f"{path}[]")


def test_every_default_passes_its_own_schema_and_rules_as_written():
    # The API server checks each default when the CRD is created, CEL rules included, and
    # without filling in the defaults nested inside it (a `default: {}` fails a rule that reads
    # a defaulted field: seen on kube-apiserver v1.34).
    root = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    checked = 0
    for path, node in _nodes(root):
        if "default" in node:
            assert validate(node["default"], node, path) == [], path
            checked += 1
    assert checked > 50
