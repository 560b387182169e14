"""The generated CRD: committed copy is current, the schema is structural and bounded, defaults agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_checker import evaluate
from pydantic import BaseModel, Field

from rlkube.operator import api
from rlkube.operator.api import crd
from rlkube.runtime.contract.model_types import SUPPORTED_MODEL_TYPES

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / crd.CRD_FILENAME


@pytest.fixture(scope="module")
def manifest() -> dict:
    return crd.crd_manifest()


@pytest.fixture(scope="module")
def root_schema(manifest) -> dict:
    return manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: Any, path: str = ""):
    """Every schema node with its path (properties, items, additionalProperties)."""
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_what_the_generator_prints():
    assert COMMITTED.read_text(encoding="utf-8") == crd.crd_yaml(), "run `make crds`"


def test_output_is_deterministic_and_parses_back(manifest):
    text = crd.crd_yaml()
    crd.crd_yaml.cache_clear()
    assert text == crd.crd_yaml()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    assert yaml.load(text, Loader=loader) == manifest


def test_no_ref_or_type_unions_anywhere():
    text = COMMITTED.read_text()
    for word in ("$ref", "anyOf", "oneOf", "allOf", "nullable", "$defs", "title:"):
        assert word not in text, word


def test_schema_is_structural_and_bounded(root_schema):
    nodes = list(walk(root_schema))
    assert len(nodes) > 150
    for path, node in nodes:
        if path == ".metadata":
            continue
        assert "type" in node, path
        if node["type"] == "string":
            assert isinstance(node.get("maxLength"), int), f"{path}: string without maxLength"
        if node["type"] == "array":
            assert isinstance(node.get("maxItems"), int), f"{path}: list without maxItems"
        if node["type"] == "object":
            assert not ("properties" in node and "additionalProperties" in node), path
            if "properties" not in node:
                assert isinstance(node.get("maxProperties"), int), f"{path}: map without maxProperties"
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node:
                assert node[key] is True and (("minimum" if "Min" in key else "maximum") in node), path


@pytest.mark.parametrize("section", [".spec", ".status"])
def test_every_field_has_a_description(root_schema, section):
    for path, node in walk(root_schema):
        if path.startswith(section) and not path.endswith(("[]", "{}")):
            assert node.get("description", "").strip(), f"{path}: no description"


def test_metadata_name_is_bounded_for_derived_names(root_schema):
    name = root_schema["properties"]["metadata"]["properties"]["name"]
    assert name == {"type": "string", "maxLength": api.MAX_JOB_NAME_LEN, "pattern": api.JOB_NAME_PATTERN}
    assert root_schema["properties"]["metadata"] == {"type": "object", "properties": {"name": name}}


def test_bounds_enums_and_defaults_come_from_the_pydantic_fields(root_schema):
    spec = root_schema["properties"]["spec"]
    gpus = spec["properties"]["roles"]["properties"]["actor"]["properties"]["gpus"]
    assert (gpus["minimum"], gpus["maximum"]) == (0, 4096)
    placement = spec["properties"]["placement"]
    # Written out in full: the API server checks an object default against the CEL rules as is.
    assert placement["default"] == api.PlacementSpec().model_dump(mode="json", by_alias=True)
    assert spec["properties"]["batching"]["default"]["maxMicroBatch"] == 64
    keys = placement["properties"]["topologyKeys"]
    assert keys["default"] == list(api.DEFAULT_TOPOLOGY_KEYS)
    assert (keys["minItems"], keys["maxItems"], keys["x-kubernetes-list-type"]) == (1, 8, "set")
    assert placement["properties"]["policy"]["enum"] == ["required", "preferred"]
    lr = spec["properties"]["training"]["properties"]["lr"]
    assert (lr["minimum"], lr["exclusiveMinimum"], lr["maximum"]) == (0.0, True, 1.0)
    codes = spec["properties"]["runPolicy"]["properties"]["failOnExitCodes"]
    assert codes["default"] == [3, 4] and codes["items"]["maximum"] == 255
    config = spec["properties"]["model"]["properties"]["config"]
    # Free-form but for model_type and vocab_size, declared so the API server (and CEL) can check them.
    assert config == {
        "type": "object",
        "description": config["description"],
        "maxProperties": 256,
        "properties": {"model_type": config["properties"]["model_type"],
                       "vocab_size": config["properties"]["vocab_size"]},
        "required": ["model_type"],
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert config["properties"]["model_type"]["enum"] == list(SUPPORTED_MODEL_TYPES)
    assert (config["properties"]["vocab_size"]["type"], config["properties"]["vocab_size"]["minimum"]) == ("integer", 1)
    assert set(spec["required"]) == {"algorithm", "model", "roles", "data", "image"}


def _schema_defaults(node: dict, path: tuple = ()):
    for key, sub in node.get("properties", {}).items():
        if "default" in sub:
            yield (*path, key), sub["default"]
        yield from _schema_defaults(sub, (*path, key))


def test_scalar_defaults_equal_what_pydantic_fills_in(root_schema):
    # A minimal valid spec, parsed by pydantic and dumped with every default filled in.
    minimal = {
        "algorithm": "dpo",
        "model": {"path": "/m"},
        "roles": {"actor": {"gpus": 1, "model": {"path": "/m"}}, "reference": {"colocateWith": "actor"}},
        "data": {"source": "/s"},
        "image": "i",
        "elastic": {"minWorkers": 1, "maxWorkers": 1},
        "tolerations": [{"key": "k"}],
        "volumes": [{"name": "v", "hostPath": "/v", "mountPath": "/v"}],
    }
    dumped = api.parse_spec(minimal).model_dump(mode="json", by_alias=True, exclude_none=True)
    checked = 0
    for path, default in _schema_defaults(root_schema["properties"]["spec"]):
        value: Any = dumped
        for part in path:
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and value and part in value[0]:
                value = value[0][part]
            else:
                break
        else:
            assert value == default, path
            checked += 1
    assert checked > 40


def test_cel_rules_cover_cross_field_rules_and_immutability(root_schema):
    spec = root_schema["properties"]["spec"]
    spec_rules = " ".join(rule["rule"] for rule in spec["x-kubernetes-validations"])
    for fragment in ("% (has(self.placement)", "has(self.roles.critic)", "has(self.roles.reward)", ">= 1"):
        assert fragment in spec_rules
    for field in ("algorithm", "model"):
        rules = [rule["rule"] for rule in spec["properties"][field]["x-kubernetes-validations"]]
        assert "self == oldSelf" in rules, field
    # roles: immutable but for the environment's replicas (test_roles_immutable_but_environment_replicas)
    assert any("oldSelf.actor" in rule["rule"] for rule in spec["properties"]["roles"]["x-kubernetes-validations"])
    roles = spec["properties"]["roles"]
    messages = " ".join(rule["message"] for rule in roles["x-kubernetes-validations"])
    assert "no cycles" in messages and "must name a role that is set" in messages
    actor_rules = [rule["rule"] for rule in roles["properties"]["actor"]["x-kubernetes-validations"]]
    assert actor_rules == ["has(self.gpus) != has(self.colocateWith)"]
    elastic = spec["properties"]["elastic"]["x-kubernetes-validations"]
    assert elastic[0]["rule"] == "self.maxWorkers >= self.minWorkers"


def test_rules_have_messages_and_valid_field_paths(root_schema):
    for path, node in walk(root_schema):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["message"].strip(), path
            assert rule["rule"].count("(") == rule["rule"].count(")"), rule
            if "fieldPath" in rule:
                target = node
                for part in rule["fieldPath"].strip(".").split("."):
                    target = target["properties"][part]


def test_status_subresource_printer_columns_and_kopf_state(manifest, root_schema):
    version = manifest["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Phase", ".status.phase"),
        ("Algorithm", ".spec.algorithm"),
        ("GPUs", ".status.gpus"),
        ("Step", ".status.progress.step"),
        ("Tokens/s", ".status.progress.tokensPerSecond"),
        ("ETA(s)", ".status.progress.etaSeconds"),
        ("Done%", ".status.progress.percent"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    status = root_schema["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    names = manifest["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("RLTrainingJob", "rltrainingjobs", ["rltj"])
    assert manifest["metadata"]["name"] == "rltrainingjobs.rlkube.io"


class _Unbounded(BaseModel):
    """A model whose string has no max_length."""

    name: str = Field(description="A name.")


class _UnboundedList(BaseModel):
    """A model whose list has no max_length."""

    names: list[str] = Field(default_factory=list, description="Names.")


class _Union(BaseModel):
    """A model with a union of two types."""

    value: int | str = Field(description="A value.")


class _Undescribed(BaseModel):
    """A model with a field without a description."""

    value: int = 0


@pytest.mark.parametrize(
    "model, fragment",
    [
        (_Unbounded, "maxLength"),
        (_UnboundedList, "maxItems"),
        (_Union, "union"),
        (_Undescribed, "description"),
    ],
)
def test_generator_refuses_unbounded_or_non_structural_types(model, fragment):
    with pytest.raises(crd.SchemaError, match=fragment):
        crd._Converter(model).convert_root(model.__name__)


def test_roles_immutable_but_environment_replicas(root_schema):
    """Scaling the environment passes the roles' update rule; changing a GPU role, adding or
    removing the environment, or changing its image does not."""
    roles = root_schema["properties"]["spec"]["properties"]["roles"]
    (update,) = [r["rule"] for r in roles["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
    image_rule = roles["properties"]["environment"]["properties"]["image"]["x-kubernetes-validations"][0]["rule"]
    old = {"actor": {"gpus": 1}, "reward": {"gpus": 0, "remote": True},
           "environment": {"image": "env:1", "replicas": 2}}

    def allowed(new: dict) -> bool:
        return evaluate(update, {"self": new, "oldSelf": old})

    assert allowed({**old, "environment": {"image": "env:1", "replicas": 5}})
    assert not allowed({**old, "actor": {"gpus": 2}})
    assert not allowed({"actor": {"gpus": 1}, "reward": {"gpus": 0, "remote": True}})
    assert not allowed({**old, "critic": {"gpus": 1}})
    assert not evaluate(image_rule, {"self": "env:2", "oldSelf": "env:1"})
    allow_egress = roles["properties"]["environment"]["properties"]["allowEgress"]
    assert (allow_egress["type"], allow_egress["default"]) == ("boolean", False)
    assert "NetworkPolicy" in allow_egress["description"]
    (egress_rule,) = allow_egress["x-kubernetes-validations"]
    assert not evaluate(egress_rule["rule"], {"self": True, "oldSelf": False})
    assert egress_rule["message"].startswith("roles.environment.allowEgress is immutable")
