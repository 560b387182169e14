"""The rules the trainer applies too (`rlkube.runtime.contract`: a section's own rules, the roles,
what an algorithm takes and cannot honour) give one verdict from their Python half and their CEL
half, rule by rule, on a few thousand seeded objects; and the runtime, `rlkube validate` and the
CRD read the same rule objects.

The objects are built without the validator of the model the rule sits on (`model_construct`), so
broken ones can be built; the sections below it are valid. The CEL runs in the test's model of the
API server's CEL (crd_checker.evaluate) on the object as the CRD's defaulting leaves it (every
default filled in, unset optional fields absent), as the API server runs it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from crd_checker import evaluate

from rlkube.operator.api import crd
from rlkube.runtime.contract import algorithm_settings, config
from rlkube.runtime.contract.config import (
    BatchingSpec,
    DataSpec,
    EnvironmentSpec,
    ModelSpec,
    RoleSpec,
    RolesSpec,
    RolloutSpec,
    RuntimeConfig,
    TrainingSpec,
)
from rlkube.runtime.contract.rule import Rule
from rlkube.runtime.contract.sections import roles_spec
from rlkube.runtime.contract.spec import ROLE_NAMES

SEED, OBJECTS = 20, 2500
REWARD_FUNCTION = "rlkube.runtime.rewards:target_pattern"


def _wire(obj: Any) -> dict:
    return obj.model_dump(by_alias=True, exclude_none=True)


def _role(rng: random.Random, name: str) -> RoleSpec:
    fields: dict[str, Any] = (
        {"gpus": rng.choice([0, 1, 2, 3, 4])} if rng.random() < 0.55 else {"colocateWith": rng.choice(ROLE_NAMES)}
    )
    if rng.random() < 0.2:
        fields["function"] = REWARD_FUNCTION
    if rng.random() < 0.15:
        fields["remote"] = rng.random() < 0.8
    if rng.random() < 0.2:
        source = {"path": "/models/m"} if rng.random() < 0.5 else {"config": _model_config(rng)}
        fields["model"] = {**source, **({"lora": {}} if rng.random() < 0.4 else {})}
    return RoleSpec.model_validate(fields)


def _model_config(rng: random.Random) -> dict:
    """A model config whose vocab_size is unset, below the byte tokenizer's 259 ids, or not."""
    vocab = rng.choice([None, 100, 258, 259, 32000])
    return {"model_type": "llama", **({} if vocab is None else {"vocab_size": vocab})}


def _roles(rng: random.Random, colocation: float) -> RolesSpec:
    actor = RoleSpec(gpus=rng.choice([0, 1, 2, 3, 4])) if rng.random() < 0.9 else _role(rng, "actor")
    others: dict[str, Any] = {name: _role(rng, name) for name in ROLE_NAMES[1:] if rng.random() < 0.55}
    if rng.random() < 0.3:
        others["environment"] = EnvironmentSpec(image="env:dev", replicas=rng.choice([1, 2]))
    for name, role in others.items():  # fewer colocation chains where the spec-wide rules are the subject
        if name != "environment" and role.colocate_with is not None and rng.random() > colocation:
            role.colocate_with, role.gpus = None, rng.choice([0, 1, 2])
    return RolesSpec.model_construct(actor=actor, **others)


def _valid_roles(rng: random.Random) -> RolesSpec:
    while True:
        roles = _roles(rng, colocation=0.4)
        if not any(rule.problem(roles) for rule in roles_spec.ROLES_RULES):
            return RolesSpec.model_validate(_wire(roles))


def _spec(rng: random.Random) -> RuntimeConfig:
    pick = rng.choice
    training = {"kl": pick([0.0, 0.1]), "klEstimator": pick(["k1", "k2", "k3"]), "klInReward": pick([True, False]),
                "groupSize": pick([1, 2, 3, 4]), "miniBatches": pick([1, 2, 3, 4, 6])}
    rollout = {"temperature": pick([0.0, 1.0]), "maxNewTokens": pick([6, 7, 62, 63, 126, 127, 200])}
    if rng.random() < 0.5:
        rollout["decodeRows"] = pick([1, 2, 4, 8, 16, 64])
    if rng.random() < 0.4:  # multi-turn: the tools, maxTurns and maxEpisodeTokens each broken on some
        rollout["maxTurns"] = pick([1, 2, 4])
        if rng.random() < 0.7:
            rollout["tools"] = pick([{"function": "rlkube.runtime.tools.calculator:calculator"},
                                     {"function": "rlkube.runtime.tools.calculator:calculator"}, {"remote": True},
                                     {"remote": True}, {}, {"remote": False},
                                     {"function": "rlkube.runtime.tools.calculator:calculator", "remote": True}])
        if rng.random() < 0.6:
            rollout["maxEpisodeTokens"] = pick([5, 62, 126, 200])
    data = {"source": "s", "format": pick(["synthetic", "synthetic", "jsonl"]), "maxSeqLen": pick([8, 64, 128]),
            "prefetch": pick([0, 1, 2]), "lengthMix": pick(["fixed", "longTailed"]),
            "numSamples": pick([1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 512])}
    if rng.random() < 0.4:  # x.5 products too: round() is half to even
        data["evalFraction"] = pick([0.1, 0.25, 0.5, 0.75, 0.9])
    batching = {"globalBatch": pick([1, 2, 3, 4, 6, 8, 12]), "minMicroBatch": pick([1, 1, 2]),
                "maxTokensPerGpu": pick([16384, 16384, 8192]), "memoryFraction": pick([0.9, 0.9, 0.5])}
    return RuntimeConfig.model_construct(
        algorithm=pick(["dpo", "kto", "ppo", "grpo"]),
        model=ModelSpec.model_validate({**pick([{"path": "/models/actor"}, {"config": _model_config(rng)}]),
                                        "tokenizer": pick(["byte", "byte", "/models/tokenizer"])}),
        roles=_valid_roles(rng), data=DataSpec.model_validate(data), batching=BatchingSpec.model_validate(batching),
        training=TrainingSpec.model_validate(training), rollout=RolloutSpec.model_validate(rollout),
    )


def _section(rng: random.Random, model: type) -> Any:
    """A section with the fields its own rules read set at random (and possibly broken)."""
    pick = rng.choice
    if model is ModelSpec:
        return ModelSpec.model_construct(path=pick([None, "/m"]), config=pick([None, {"model_type": "llama"}]))
    if model is RoleSpec:
        return RoleSpec.model_construct(gpus=pick([None, 0, 2]), colocate_with=pick([None, "actor"]))
    if model is DataSpec:
        return DataSpec.model_construct(source="s", eval=pick([None, "/e.jsonl"]), eval_fraction=pick([None, 0.1]))
    return BatchingSpec.model_construct(min_micro_batch=pick([1, 4, 64]), max_micro_batch=pick([1, 4, 64]))


def _agree(rules: tuple[Rule, ...], objects: list[Any]) -> None:
    """Each rule's two halves agree on every object, and each rule both holds and breaks on some
    (else the objects say nothing of it)."""
    seen: dict[str, set[bool]] = {rule.message: set() for rule in rules}
    for obj in objects:
        wire = _wire(obj)
        for rule in rules:
            python_ok = rule.problem(obj) is None
            assert python_ok == evaluate(rule.cel, {"self": wire}), (rule.message, wire)
            seen[rule.message].add(python_ok)
    assert {message: outcomes for message, outcomes in seen.items() if outcomes != {True, False}} == {}


SECTIONS = {ModelSpec: config.MODEL_SOURCE, RoleSpec: config.ROLE_SOURCE, DataSpec: config.EVAL_SOURCE,
            BatchingSpec: config.MICRO_BATCH_BOUNDS}


@pytest.mark.parametrize("model", list(SECTIONS), ids=lambda model: model.__name__)
def test_section_rules_python_and_cel_agree(model):
    rng = random.Random(SEED)
    _agree(SECTIONS[model], [_section(rng, model) for _ in range(200)])


def test_roles_rules_python_and_cel_agree():
    rng = random.Random(SEED)
    _agree(roles_spec.ROLES_RULES, [_roles(rng, colocation=1.0) for _ in range(OBJECTS)])


def test_spec_rules_python_and_cel_agree():
    rng = random.Random(SEED)
    _agree(algorithm_settings.SPEC_RULES, [_spec(rng) for _ in range(OBJECTS)])


def test_the_crd_carries_every_contract_rule_once():
    """The CRD's CEL of these rules is the contract's rule objects', nothing written beside them."""
    text = str(crd.crd_manifest())
    rules = [*roles_spec.ROLES_RULES, *algorithm_settings.SPEC_RULES, *(r for rs in SECTIONS.values() for r in rs)]
    for rule in rules:
        assert text.count(repr(rule.cel)[1:-1]) >= 1, rule.message
    assert len({rule.message for rule in rules}) == len(rules)
