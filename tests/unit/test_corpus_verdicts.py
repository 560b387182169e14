"""One verdict per manifest from `rlkube validate` (pydantic) and the CRD (schema and CEL).

Every file of tests/data/bad must be refused by both, each naming the field path of the file's
first line ('# expect: spec.training.kl'); every file of tests/data/good and examples/ must be
accepted by both. The API server and `rlkube validate` are two doors to one cluster: a manifest
one lets through and the other stops is a bug in one of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crd_checker import admit, names

from rlkube.operator import cli, crd
from rlkube.operator.cli import load_documents

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
}


def expected_path(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: <path>'"
    return first.removeprefix("# expect: ").strip()


def validate(path: Path, capsys) -> tuple[int, str, list[str]]:
    """`rlkube validate PATH`: exit code, stdout, and the field path of each error line."""
    code = cli.main(["validate", str(path)])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    prefix = f"{path}: "
    assert all(line.startswith(prefix) for line in lines), lines
    return code, captured.out, [line.removeprefix(prefix).split(": ", 1)[0] for line in lines]


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

    crd_errors = admit(load_documents(path.read_text(encoding="utf-8"))[0], CRD)
    if path.stem in NOT_BY_THE_SCHEMA:
        assert crd_errors == [], "listed as not caught by the schema, but it is: drop it from the list"
    else:
        assert crd_errors, f"{path.name}: the CRD admits what rlkube validate refuses"
        assert any(names(error, expect) for error in crd_errors), (expect, crd_errors)


@pytest.mark.parametrize("path", GOOD + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_good_manifest_is_accepted_by_both(path, capsys):
    code, out, error_paths = validate(path, capsys)
    assert (code, error_paths) == (0, [])
    assert out.startswith(f"{path}: ok (")
    assert admit(load_documents(path.read_text(encoding="utf-8"))[0], CRD) == []
