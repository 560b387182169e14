"""The Helm chart's generated inputs are current: CRDs copied from crds/, RBAC from rbac.py.

Pure file checks (no helm binary): the rendered chart is checked against the same sources by
tests/integration/test_chart.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from rlkube.operator.controller import rbac

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "rlkube"


def _load_render_rbac():
    spec = importlib.util.spec_from_file_location("render_rbac", CHART / "hack" / "render_rbac.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_crds_are_byte_copies_of_the_generated_crds():
    source = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    copied = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source, "crds/ holds no CRD: run `make crds`"
    assert sorted(copied) == sorted(source), "charts/rlkube/crds/ differs from crds/: run `make chart-crds`"
    stale = [name for name in source if copied[name] != source[name]]
    assert not stale, f"charts/rlkube/crds/{stale[0]} differs from crds/: run `make chart-crds`"


def test_chart_rbac_file_is_generated_from_rbac_rules():
    assert (CHART / "files" / "rbac.yaml").read_text() == _load_render_rbac().render(), (
        "charts/rlkube/files/rbac.yaml is stale: run `make chart-rbac`"
    )


def _plain(section: list[dict]) -> list[dict]:
    return [
        {"apiGroups": r["apiGroups"], "resources": r["resources"], "verbs": [v["verb"] for v in r["verbs"]]}
        for r in section
    ]


def test_rbac_file_sections_equal_rbac_py_rule_sets():
    data = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    assert _plain(data["clusterWide"]) == rbac.cluster_role_rules(clusterwide=True)
    assert _plain(data["clusterOnly"]) == rbac.cluster_role_rules(clusterwide=False)
    assert _plain(data["watched"]) == rbac.rules_for("watched")
    assert _plain(data["operator"]) == rbac.rules_for("operator")


def test_every_granted_verb_carries_its_reason_and_no_wildcards_or_secrets():
    data = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    for section, rules in data.items():
        for rule in rules:
            where = f"{section}: {rule['apiGroups']}/{rule['resources']}"
            assert "*" not in rule["apiGroups"] + rule["resources"], where
            assert "secrets" not in rule["resources"], where
            for verb in rule["verbs"]:
                assert verb["verb"] != "*", where
                assert len(verb["why"]) >= 10, f"{where} {verb['verb']}: no reason given"


def test_merged_reasons_name_every_scope_a_verb_comes_from():
    # pods/list is granted for the watched namespaces and, cluster-wide, for the GPU inventory.
    data = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    (pods,) = [r for r in data["clusterWide"] if r["resources"] == ["pods"]]
    (pods_list,) = [v for v in pods["verbs"] if v["verb"] == "list"]
    reasons = [rule.verbs["list"] for rule in rbac.RULES if rule.resource == "pods" and "list" in rule.verbs]
    assert len(reasons) == 2
    for reason in reasons:
        assert reason in pods_list["why"]
