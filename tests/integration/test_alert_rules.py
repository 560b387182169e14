"""The chart's PrometheusRule, as Prometheus itself reads it: `promtool check rules` and
`promtool test rules` on the rules `helm template` renders.

promtool is built from its Go module (github.com/prometheus/prometheus/cmd/promtool, pinned in
tests/cluster/go/promtool) by tests/cluster/build-bins.sh and cached like the other binaries.
The structural checks without promtool stay in tests/unit/deploy/test_observability.py.

`check rules` parses every expression with Prometheus' own PromQL parser and validates the
rule group (names, `for`, label and annotation templates). `test rules` goes further: each alert
is fed synthetic series and must fire when, and only when, its threshold says (the chart's
default thresholds: 15 min waiting, GPU busy < 0.5 for 10 min, any restart in 30 min, no step in
30 min).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster import bins

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlkube"
JOB = 'namespace="team-a",rltj="grpo-7b"'
LABELS = {"namespace": "team-a", "rltj": "grpo-7b"}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(bins.promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory) -> Path:
    """spec of the rendered PrometheusRule as a Prometheus rule file (its `groups`)."""
    out = subprocess.run(
        [str(bins.helm()), "template", "rlkube", str(CHART), "--namespace", "rlkube-system",
         "--kube-version", bins.version("kubernetes"), "--set", "prometheusRule.enabled=true",
         "--show-only", "templates/prometheusrule.yaml"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    (rule,) = [d for d in yaml.safe_load_all(out) if d]
    assert rule["kind"] == "PrometheusRule"
    path = tmp_path_factory.mktemp("promtool") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def test_promtool_check_rules_accepts_the_rendered_rules(rules_file):
    proc = promtool("check", "rules", rules_file.name, cwd=rules_file.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 4 rules found" in proc.stdout, proc.stdout


def test_promtool_check_rules_can_fail(rules_file):
    broken = rules_file.parent / "broken.yaml"
    groups = yaml.safe_load(rules_file.read_text())
    groups["groups"][0]["rules"][0]["expr"] = "max by (namespace rltj) (rlkube_operator_job_phase)"
    broken.write_text(yaml.safe_dump(groups))
    proc = promtool("check", "rules", broken.name, cwd=broken.parent)
    assert proc.returncode != 0 and "parse error" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


SUMMARIES = {  # what the alert's summary template must say for the job above
    "RLTrainingJobWaitingTooLong": "RLTrainingJob team-a/grpo-7b has waited more than 15 minutes to run",
    "RLTrainingJobGpusIdle": "RLTrainingJob team-a/grpo-7b keeps its GPUs busy only 30% of the time",
    "RLTrainingJobRestarting": "RLTrainingJob team-a/grpo-7b restarted its gang in the last 30 minutes",
    "RLTrainingJobNoProgress": "RLTrainingJob team-a/grpo-7b has finished no step in 30 minutes",
}
SEVERITY = {"RLTrainingJobNoProgress": "critical"}


def _alert(name: str, at: str, fired: bool) -> dict:
    """An alert_rule_test entry: at `at`, `name` fires for the job above, or fires for nothing.
    promtool compares annotations too; the description is taken from the rule (templates filled)."""
    expected = {"exp_labels": {"severity": SEVERITY.get(name, "warning"), **LABELS},
                "exp_annotations": {"summary": SUMMARIES[name], "description": None}}
    return {"eval_time": at, "alertname": name, "exp_alerts": [expected] if fired else []}


# Each case: input series (promtool's expanding notation, one sample a minute) and when the
# alert must not yet and must have fired.
UNIT_TESTS = [
    {   # Pending for 20 minutes: not at 14 (for: 15m), firing at 16
        "interval": "1m",
        "input_series": [{"series": f'rlkube_operator_job_phase{{{JOB},phase="Pending"}}', "values": "1x20"}],
        "alert_rule_test": [_alert("RLTrainingJobWaitingTooLong", "14m", False),
                            _alert("RLTrainingJobWaitingTooLong", "16m", True)],
    },
    {   # Running with GPUs busy 30% of each step: firing after 10 minutes; at 80% never
        "interval": "1m",
        "input_series": [
            {"series": f'rlkube_operator_job_phase{{{JOB},phase="Running"}}', "values": "1x20"},
            {"series": f'rlkube_gpu_busy_ratio{{{JOB},phase="step",role="actor",rank="0"}}', "values": "0.3x20"},
            {"series": 'rlkube_gpu_busy_ratio{namespace="team-a",rltj="busy",phase="step",role="actor",rank="0"}',
             "values": "0.8x20"},
            {"series": 'rlkube_operator_job_phase{namespace="team-a",rltj="busy",phase="Running"}', "values": "1x20"},
        ],
        "alert_rule_test": [_alert("RLTrainingJobGpusIdle", "9m", False),
                            _alert("RLTrainingJobGpusIdle", "11m", True)],
    },
    {   # A restart at minute 5: firing from then, quiet again 30 minutes later
        "interval": "1m",
        "input_series": [{"series": f"rlkube_operator_job_restarts_total{{{JOB}}}", "values": "0x4 1x40"}],
        "alert_rule_test": [_alert("RLTrainingJobRestarting", "3m", False),
                            _alert("RLTrainingJobRestarting", "10m", True),
                            _alert("RLTrainingJobRestarting", "40m", False)],
    },
    {   # Steps advance for 10 minutes, then stop: critical once 30 minutes pass without a step
        "interval": "1m",
        "input_series": [
            {"series": f'rlkube_operator_job_phase{{{JOB},phase="Running"}}', "values": "1x60"},
            {"series": f'rlkube_step{{{JOB},pod="grpo-7b-actor-0"}}', "values": "0+5x10 50x50"},
        ],
        "alert_rule_test": [_alert("RLTrainingJobNoProgress", "30m", False),
                            _alert("RLTrainingJobNoProgress", "45m", True)],
    },
]


def _descriptions(rules_file: Path) -> dict[str, str]:
    rules = yaml.safe_load(rules_file.read_text())["groups"][0]["rules"]
    fill = {"{{ $labels.namespace }}": LABELS["namespace"], "{{ $labels.rltj }}": LABELS["rltj"]}
    out = {}
    for rule in rules:
        text = rule["annotations"]["description"]
        for template, value in fill.items():
            text = text.replace(template, value)
        assert "{{" not in text, f"{rule['alert']}: a description template the test does not fill"
        out[rule["alert"]] = text
    return out


def test_promtool_test_rules_fires_each_alert_at_its_threshold(rules_file):
    descriptions = _descriptions(rules_file)
    cases = json.loads(json.dumps(UNIT_TESTS))
    for case in cases:
        for check in case["alert_rule_test"]:
            for alert in check["exp_alerts"]:
                alert["exp_annotations"]["description"] = descriptions[check["alertname"]]
    assert {c["alertname"] for case in cases for c in case["alert_rule_test"]} == set(descriptions)
    tests = rules_file.parent / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules_file.name], "evaluation_interval": "1m",
                                     "tests": cases}, sort_keys=False))
    proc = promtool("test", "rules", tests.name, cwd=tests.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout
