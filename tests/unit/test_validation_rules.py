"""Each operator `Rule` gives one verdict from its Python check and its CEL, over grids of objects
built without their validators (so broken ones can be built), and the validator of the
model it sits on raises its message."""

from __future__ import annotations

import itertools

import pytest
from crd_checker import evaluate
from pydantic import ValidationError

from rlkube.operator import api
from rlkube.operator.api import elastic_spec, pod_spec, volume_spec
from rlkube.runtime.contract.rule import Rule

TOLERATIONS = [
    {"key": key, "operator": op, "value": value, "effect": effect, "toleration_seconds": seconds}
    for key, op, value, effect, seconds in itertools.product(
        [None, "gpu"], ["Exists", "Equal"], [None, "", "x"], [None, "NoSchedule", "NoExecute"], [None, 30])
]
SECURITY = [
    {"run_as_non_root": non_root, "run_as_user": user}
    for non_root, user in itertools.product([None, False, True], [None, 0, 1000])
]
ELASTIC = [{"min_workers": low, "max_workers": high} for low, high in itertools.product([1, 2, 5], [1, 2, 5])]
VOLUMES = [
    {"name": "w", "mount_path": "/w", "claim_name": claim, "host_path": host}
    for claim, host in itertools.product([None, "pvc"], [None, "/data"])
]
QUANTITIES = [None, "500m", "1", "2Gi", "1.5", "1e3", "2048Mi"]


def _resources(request: str | None, limit: str | None) -> api.PodResources:
    fields = [name for name, _ in pod_spec.RESOURCE_FIELDS]
    requests = api.ResourceList.model_construct(**dict.fromkeys(fields, request))
    limits = api.ResourceList.model_construct(**dict.fromkeys(fields, limit))
    return api.PodResources.model_construct(requests=requests, limits=limits)


CASES = [
    (pod_spec.TOLERATION, [api.Toleration.model_construct(**fields) for fields in TOLERATIONS]),
    (pod_spec.SECURITY, [api.PodSecurity.model_construct(**fields) for fields in SECURITY]),
    (elastic_spec.ELASTIC, [api.ElasticSpec.model_construct(**fields) for fields in ELASTIC]),
    ((volume_spec.VOLUME_SOURCE,), [api.VolumeSpec.model_construct(**fields) for fields in VOLUMES]),
    (pod_spec.RESOURCES, [_resources(req, lim) for req, lim in itertools.product(QUANTITIES, QUANTITIES)]),
]


def _wire(obj) -> dict:
    return obj.model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize("rules, objects", CASES, ids=["toleration", "security", "elastic", "volume", "resources"])
def test_python_and_cel_agree(rules: tuple[Rule, ...], objects: list):
    seen = {True: 0, False: 0}
    for rule, obj in itertools.product(rules, objects):
        python_ok = rule.problem(obj) is None
        assert python_ok == evaluate(rule.cel, {"self": _wire(obj)}), (rule.message, _wire(obj))
        seen[python_ok] += 1
    assert min(seen.values()) > 0, seen  # each grid breaks and keeps its rules


@pytest.mark.parametrize("rules, objects", CASES, ids=["toleration", "security", "elastic", "volume", "resources"])
def test_the_validator_raises_the_rules_message(rules: tuple[Rule, ...], objects: list):
    for obj in objects:
        broken = [problem for rule in rules if (problem := rule.problem(obj)) is not None]
        if not broken:
            continue
        with pytest.raises(ValidationError) as raised:
            type(obj).model_validate(_wire(obj))
        for problem in broken:
            assert problem in str(raised.value)


@pytest.mark.parametrize("labels, annotations, refused", [
    ({"team": "ml-research", "example.com/tier": "a.b_c"}, {"Example.COM/Note": "any text at all"}, []),
    ({"team": ""}, {}, []),
    ({"team": "ml research"}, {}, ["metadata.labels.team"]),
    ({"team": "x" * 64}, {}, ["metadata.labels.team"]),
    ({"a/b/c": "x"}, {}, ["metadata.labels"]),
    ({"Example.com/team": "x"}, {}, ["metadata.labels"]),  # a label key's prefix is lower-case
    ({}, {"my note": "x"}, ["metadata.annotations"]),
])
def test_metadata_as_the_api_server_checks_it(labels, annotations, refused):
    doc = {"apiVersion": "rlkube.io/v1alpha1", "kind": "RLTrainingJob",
           "metadata": {"name": "tiny", "labels": labels, "annotations": annotations}}
    errors = [error.path for error in api.job_errors(doc) if error.path.startswith("metadata")]
    assert errors == refused


def test_every_integer_field_of_the_spec_refuses_an_integral_float():
    # The API server's schema check takes 2.0 for an integer; only a CEL rule reading the field
    # refuses it there, as pydantic (strict) does (tests/data/bad/*-integral-float.yaml).
    from rlkube.operator.api import crd
    from rlkube.operator.api.crd_rules import INTEGER_CEL

    found = []

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("type") == "integer":
                # first; an immutable field adds its update rule after it
                assert node.get("x-kubernetes-validations")[: len(INTEGER_CEL)] == INTEGER_CEL, path
                found.append(path)
            for key, value in node.items():
                walk(value, f"{path}.{key}")

    walk(crd.spec_schema(), "spec")
    assert len(found) > 30
