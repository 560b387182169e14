"""The chart's dashboard and alerts name only metrics the operator or the runtime export.

Pure file checks (no helm, no Prometheus): the exported names come from the code's own
Gauge/Counter/Histogram definitions (read with ast, so torch need not load), the queries from
charts/rlkube/dashboards/*.json and charts/rlkube/files/alerts.yaml. tests/integration/test_chart.py
renders both with helm.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "rlkube"
SOURCES = [REPO / "runtime" / "rlkube" / "runtime", REPO / "operator" / "rlkube" / "operator"]
KINDS = {"Gauge": ("",), "Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count")}
METRIC = re.compile(r"\brlkube_[a-z0-9_]+\b")
PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def _string_constants(tree: ast.AST) -> dict[str, str]:
    """NAME = "..." assignments anywhere in a module (class attributes included)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _step_gauges(tree: ast.AST) -> set[str]:
    """The gauges of a trainer's step fields: the values of a `*_GAUGES = {field: name}` map, which
    a StepReport names as Progress's `extra` gauges rlkube_<name>."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id.endswith("_GAUGES") for t in node.targets):
            out.update(f"rlkube_{v.value}" for v in node.value.values
                       if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return out


def exported_series() -> set[str]:
    """Every series name a Prometheus scrape of the operator or rank 0 can show."""
    names: set[str] = set()
    for root in SOURCES:
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text())
            constants = _string_constants(tree)
            names |= _step_gauges(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KINDS):
                    continue
                if not node.args:
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    name = first.value
                elif isinstance(first, ast.Attribute | ast.Name):
                    name = constants.get(first.attr if isinstance(first, ast.Attribute) else first.id, "")
                elif isinstance(first, ast.JoinedStr):
                    continue  # Progress's `extra` gauges: named at run time, not for dashboards
                else:
                    name = ""
                assert name, f"{path.relative_to(REPO)}:{node.lineno}: a metric whose name this test cannot read"
                names.update(name + suffix for suffix in KINDS[node.func.id])
    return names


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return exported_series()


def test_exported_names_are_collected_from_both_parts(exported):
    # The collector itself can fail: known names of each part, each kind, must be found.
    assert {"rlkube_gpu_busy_ratio", "rlkube_tokens_total", "rlkube_checkpoint_stall_seconds_total",
            "rlkube_operator_job_phase", "rlkube_operator_job_restarts_total",
            "rlkube_operator_admission_wait_seconds_bucket", "rlkube_step_seconds", "rlkube_phase_seconds",
            "rlkube_tokens_per_second_per_gpu", "rlkube_mfu", "rlkube_env_calls_per_second",
            "rlkube_tool_call_failures"} <= exported


def dashboards() -> list[Path]:
    found = sorted((CHART / "dashboards").glob("*.json"))
    assert found, "charts/rlkube/dashboards/ holds no dashboard"
    return found


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_every_dashboard_query_names_exported_metrics(path, exported):
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"]
    queried = [p for p in panels(dashboard) if p["type"] != "row"]
    assert queried
    for panel in queried:
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = METRIC.findall(target["expr"])
            assert names, f"panel {panel['title']!r}: {target['expr']!r} names no rlkube metric"
            unknown = sorted(set(names) - exported)
            assert not unknown, f"panel {panel['title']!r} queries {unknown}, which nothing exports"
    for variable in dashboard["templating"]["list"]:
        for name in METRIC.findall(json.dumps(variable.get("query", ""))):
            assert name in exported, f"variable {variable['name']!r} queries {name}"


def test_dashboard_has_the_panels_the_platform_team_asked_for():
    dashboard = json.loads((CHART / "dashboards" / "rlkube-jobs.json").read_text())
    exprs = " ".join(t["expr"] for p in panels(dashboard) for t in p.get("targets", []))
    for name in ("rlkube_operator_jobs", "rlkube_gpu_busy_ratio", "rlkube_tokens_per_second",
                 "rlkube_tokens_per_second_per_gpu", "rlkube_mfu", "rlkube_phase_seconds",
                 "rlkube_checkpoint_last_stall_seconds", "rlkube_operator_job_restarts_total",
                 "rlkube_operator_admission_wait_seconds_bucket", "rlkube_env_calls_per_second",
                 "rlkube_env_latency_p50_seconds", "rlkube_env_latency_p99_seconds", "rlkube_env_failures",
                 "rlkube_env_retries", "rlkube_tool_calls", "rlkube_tool_call_failures", "rlkube_turns_per_episode",
                 "rlkube_rollout_logprob_abs_diff", "rlkube_rollout_logprob_k3"):
        assert re.search(rf"\b{name}\b", exprs), f"no panel shows {name}"
    assert 'by (rltj, role)' in exprs  # GPU busy per role, not only per job
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def alert_rules() -> list[dict]:
    """files/alerts.yaml with its placeholders filled from values.yaml, as the template does."""
    text = (CHART / "files" / "alerts.yaml").read_text()
    thresholds = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["thresholds"]
    used = set(PLACEHOLDER.findall(text))
    assert used == set(thresholds), f"alerts use {sorted(used)}, values.yaml defines {sorted(thresholds)}"
    return yaml.safe_load(PLACEHOLDER.sub(lambda m: str(thresholds[m.group(1)]), text))


def test_alert_rules_have_the_shape_prometheus_loads(exported):
    rules = alert_rules()
    assert isinstance(rules, list) and rules
    allowed = {"alert", "expr", "for", "labels", "annotations"}
    for rule in rules:
        name = rule.get("alert", "")
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name), f"alert name {name!r}"
        assert set(rule) <= allowed and {"alert", "expr", "labels", "annotations"} <= set(rule), name
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
        if "for" in rule:
            assert re.fullmatch(r"[0-9]+(ms|s|m|h|d)", rule["for"]), f"{name}: for {rule['for']!r}"
        assert rule["labels"].get("severity") in ("info", "warning", "critical"), name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        assert rule["expr"].count("(") == rule["expr"].count(")"), f"{name}: unbalanced parentheses"
        assert rule["expr"].count("{") == rule["expr"].count("}"), f"{name}: unbalanced braces"
        names = METRIC.findall(rule["expr"])
        assert names and not set(names) - exported, f"{name}: {sorted(set(names) - exported)} not exported"
        for text in rule["annotations"].values():
            assert "${" not in text and text.count("{{") == text.count("}}"), name
    assert len({r["alert"] for r in rules}) == len(rules)


def test_the_alerts_the_brief_asks_for_are_there():
    by_name = {r["alert"]: r for r in alert_rules()}
    assert 'phase=~"Pending|Scheduling"' in by_name["RLTrainingJobWaitingTooLong"]["expr"]
    assert by_name["RLTrainingJobWaitingTooLong"]["for"] == "15m"
    idle = by_name["RLTrainingJobGpusIdle"]
    assert "< 0.5" in idle["expr"] and idle["for"] == "10m" and 'phase="Running"' in idle["expr"]
    assert "increase(rlkube_operator_job_restarts_total[30m])" in by_name["RLTrainingJobRestarting"]["expr"]
    assert "changes(rlkube_step[30m])" in by_name["RLTrainingJobNoProgress"]["expr"]


def test_series_labels_the_queries_join_on_are_exported():
    # The joins `on (namespace, rltj)` need the operator's job metrics labelled so; the PodMonitor
    # puts the same labels on the runtime's (checked on the rendered chart in test_chart.py).
    source = (REPO / "operator" / "rlkube" / "operator" / "controller" / "metrics.py").read_text()
    assert source.count('["namespace", "rltj"') == 2
    podmonitor = (CHART / "templates" / "podmonitor.yaml").read_text()
    assert "targetLabel: rltj" in podmonitor and "rlkube.io/pod-index" in podmonitor
