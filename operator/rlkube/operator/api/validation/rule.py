"""`Rule`, the one shape of a rule with a Python check and a CEL twin on the same object.

It lives in the runtime's contract (`rlkube.runtime.contract.rule`), because the rules the trainer
also applies are written there and the runtime never imports the operator; the operator's own
rules (pod, paths, elastic) use the same class from here.
"""

from __future__ import annotations

from rlkube.runtime.contract.rule import Rule, check, crd, problems, when

__all__ = ["Rule", "check", "crd", "problems", "when"]
