"""One verdict per manifest from `rlkube validate` (pydantic) and the CRD (schema and CEL).

Every file of tests/data/bad must be refused by both, each naming the field path of the file's
first line ('# expect: spec.training.kl'); every file of tests/data/good and examples/ must be
accepted by both. The API server and `rlkube validate` are two doors to one cluster: a manifest
one lets through and the other stops is a bug in one of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from crd_checker import admit, names
from pydantic import ValidationError
from verdicts import RUNTIME_SECTIONS

from rlkube.operator import cli
from rlkube.operator.api import crd
from rlkube.operator.cli import DuplicateKeys, load_documents
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.contract.field_path import field_path
from rlkube.runtime.contract.model_types import model_type_problems

ROOT = Path(__file__).resolve().parents[2]
CRD = crd.crd_manifest()
BAD = sorted((ROOT / "tests" / "data" / "bad").glob("*.yaml"))
GOOD = sorted((ROOT / "tests" / "data" / "good").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# Bad manifests that the API server itself rejects by other means, or that only pydantic sees.
NOT_BY_THE_SCHEMA = {
    "name-missing": "the API server requires metadata.name before any schema check",
    "wrong-api-version": "the API server routes by apiVersion; no schema applies",
    "wrong-kind": "the API server routes by kind; no schema applies",
    # crd_checker models the CRD's schema only; the real API server refuses these in its own
    # ObjectMeta validation (tests/integration/test_corpus_admission.py).
    "metadata-label-value-space": "the API server checks label values itself, before any schema",
    "metadata-label-key-two-slashes": "the API server checks label keys itself, before any schema",
    "metadata-annotation-key-space": "the API server checks annotation keys itself, before any schema",
    # Only rlkube validate reads the YAML: the API server gets the JSON kubectl builds from it,
    # which holds each key once, so no schema can see the second writing.
    **dict.fromkeys(["duplicate-key-image", "duplicate-key-training-lr"],
                    "the API server reads JSON built from the YAML, one value per key"),
}


# The third door: the trainer's own config (run.yaml is the spec's runtime sections), which
# refuses a bad manifest whose field lies in those sections, except these, which are the
# operator's alone.
OPERATOR_ONLY = {
    **dict.fromkeys(
        ["data-eval-relative", "data-source-relative", "data-source-uri", "model-path-dot-relative",
         "model-path-relative", "reference-model-path-relative", "tokenizer-relative"],
        "paths in the pod are absolute (validation.paths); a trainer on a workstation reads relative ones",
    ),
    **dict.fromkeys(
        ["fused-logprobs-string", "global-batch-string", "gpus-bool", "gpus-integral-float", "gpus-quoted-number",
         "gradient-checkpointing-string", "scale-rewards-string", "skip-invalid-string", "snake-case-field",
         "steps-integral-float"],
        "the operator parses a manifest strictly, as the API server does; the trainer reads the run.yaml the "
        "operator renders, or a hand-written one, with pydantic's lax parsing and Python field names",
    ),
    "duplicate-key-training-lr": "the trainer reads the run.yaml the operator renders, one value per key",
}


def runtime_error_paths(spec: dict) -> list[str]:
    """The trainer's verdict on a spec's runtime sections: its config model, then the model types
    it checks before loading (runtime/cli.py); 'spec.'-prefixed field paths of the problems."""
    try:
        config = RuntimeConfig.model_validate({key: spec[key] for key in RUNTIME_SECTIONS if key in spec})
    except ValidationError as exc:
        return [
            "spec." + ".".join(part for part in (field_path(error["loc"]), line.split(": ")[0]) if part)
            for error in exc.errors()
            for line in error["msg"].removeprefix("Value error, ").splitlines()
        ]
    return ["spec." + problem.split(": ")[0] for problem in model_type_problems(config)]


def document(path: Path) -> dict:
    """The file's first document as the API server and the trainer get it: a key written twice
    (refused by rlkube validate) holds its last value, as in the JSON built from the YAML."""
    try:
        return load_documents(path.read_text(encoding="utf-8"))[0]
    except DuplicateKeys as exc:
        return exc.documents[0]


def expected_path(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: <path>'"
    return first.removeprefix("# expect: ").strip()


def validate(path: Path, capsys) -> tuple[int, str, list[str]]:
    """`rlkube validate PATH`: exit code, stdout, and the field path of each error line ('PATH:
    field: why', or 'PATH:LINE: field: why' where the YAML itself is at fault)."""
    code = cli.main(["validate", str(path)])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    prefix = re.compile(re.escape(str(path)) + r"(:\d+)?: ")
    assert all(prefix.match(line) for line in lines), lines
    return code, captured.out, [prefix.sub("", line, count=1).split(": ", 1)[0] for line in lines]


def test_corpora_are_large_enough():
    assert len(BAD) >= 100
    assert len(GOOD) >= 12
    assert set(NOT_BY_THE_SCHEMA) <= {path.stem for path in BAD}


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_manifest_is_refused_by_both_with_its_field_path(path, capsys):
    expect = expected_path(path)
    code, out, error_paths = validate(path, capsys)
    assert (code, out) == (1, "")
    assert error_paths, "no error printed"
    assert any(expect in error_path for error_path in error_paths), (expect, error_paths)

    crd_errors = admit(document(path), CRD)
    if path.stem in NOT_BY_THE_SCHEMA:
        assert crd_errors == [], "listed as not caught by the schema, but it is: drop it from the list"
    else:
        assert crd_errors, f"{path.name}: the CRD admits what rlkube validate refuses"
        assert any(names(error, expect) for error in crd_errors), (expect, crd_errors)


RUNTIME_BAD = [
    path for path in BAD
    if expected_path(path).removeprefix("spec.").split(".")[0].split("[")[0] in RUNTIME_SECTIONS
]


def test_the_operator_only_list_names_bad_manifests():
    assert set(OPERATOR_ONLY) <= {path.stem for path in RUNTIME_BAD}


@pytest.mark.parametrize("path", RUNTIME_BAD, ids=lambda p: p.stem)
def test_bad_manifest_in_the_runtime_sections_is_refused_by_the_trainer_too(path):
    """Rules the trainer applies (roles, colocation, what an algorithm takes and cannot honour)
    are written once in its contract; the trainer's verdict is the other doors'."""
    expect = expected_path(path)
    errors = runtime_error_paths(document(path)["spec"])
    if path.stem in OPERATOR_ONLY:
        assert not any(expect in error for error in errors), "listed as operator-only, but the trainer refuses it"
    else:
        assert any(expect in error for error in errors), (expect, errors)


@pytest.mark.parametrize("path", GOOD + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_good_manifest_is_accepted_by_the_trainer(path):
    assert runtime_error_paths(load_documents(path.read_text(encoding="utf-8"))[0]["spec"]) == []


@pytest.mark.parametrize("path", GOOD + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_good_manifest_is_accepted_by_both(path, capsys):
    code, out, error_paths = validate(path, capsys)
    assert (code, error_paths) == (0, [])
    assert out.startswith(f"{path}: ok (")
    assert admit(load_documents(path.read_text(encoding="utf-8"))[0], CRD) == []
