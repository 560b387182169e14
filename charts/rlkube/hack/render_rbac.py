"""Writes the chart's RBAC data file (files/rbac.yaml) from `rlkube.operator.controller.rbac.RULES`.

The operator's RBAC needs live with its code, as data (verb -> why). Helm cannot run Python, so
this script turns them into a YAML file the templates iterate over, one entry per PolicyRule
with the reason for each verb, which the templates print as a comment above the verb.

    python charts/rlkube/hack/render_rbac.py            # rewrite files/rbac.yaml
    python charts/rlkube/hack/render_rbac.py --check    # exit 1 if files/rbac.yaml is stale

Sections: `clusterWide` (the ClusterRole when every namespace is watched), `clusterOnly` (the
ClusterRole when a list of namespaces is watched), `watched` (the Role in each watched
namespace), `operator` (the Role in the operator's own namespace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from rlkube.operator.controller import rbac

OUT = Path(__file__).resolve().parent.parent / "files" / "rbac.yaml"

HEADER = """\
# Generated from operator/rlkube/operator/controller/rbac.py by `make chart-rbac`; do not edit by hand.
# Each rule lists its verbs with the reason the operator needs them; the templates print the
# reason as a comment above the verb in the rendered Role/ClusterRole.
"""


def _why(group: str, resource: str, verb: str, scopes: tuple[str, ...]) -> str:
    """The reasons given for one verb, across the scopes a merged rule was built from."""
    reasons = [
        rule.verbs[verb]
        for rule in rbac.RULES
        if rule.api_group == group and rule.resource == resource and rule.scope in scopes and verb in rule.verbs
    ]
    return "; ".join(dict.fromkeys(reasons))


def _annotate(policy_rules: list[dict], scopes: tuple[str, ...]) -> list[dict]:
    annotated = []
    for rule in policy_rules:
        (group,), (resource,) = rule["apiGroups"], rule["resources"]
        annotated.append({
            "apiGroups": [group],
            "resources": [resource],
            "verbs": [{"verb": verb, "why": _why(group, resource, verb, scopes)} for verb in rule["verbs"]],
        })
    return annotated


def render() -> str:
    sections = {
        "clusterWide": _annotate(rbac.cluster_role_rules(clusterwide=True), ("cluster", "watched")),
        "clusterOnly": _annotate(rbac.cluster_role_rules(clusterwide=False), ("cluster",)),
        "watched": _annotate(rbac.rules_for("watched"), ("watched",)),
        "operator": _annotate(rbac.rules_for("operator"), ("operator",)),
    }
    return HEADER + yaml.safe_dump(sections, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT}: stale; run `make chart-rbac`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
