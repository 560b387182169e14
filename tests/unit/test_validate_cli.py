"""`rlkube validate` on many files and documents, and the CLI's other verbs.

The verdict on each manifest of tests/data and examples/ is test_corpus_verdicts.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rltj_builders import job

from rlkube.operator import cli
from rlkube.operator.api import crd

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((ROOT / "tests" / "data" / "bad").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_expected_examples_exist():
    names = {path.name for path in EXAMPLES}
    assert {
        "dpo-tiny-cpu.yaml",
        "grpo-tiny-cpu.yaml",
        "ppo-tiny-cpu.yaml",
        "ppo-7b-4gpu.yaml",
        "dpo-7b-4gpu.yaml",
        "ppo-multinode.yaml",
    } <= names


def test_many_files_and_documents_report_every_error(tmp_path, capsys):
    bad = job(name="two-errors")
    bad["spec"]["training"] = {"steps": 0, "lr": "fast"}
    multi = tmp_path / "multi.yaml"
    multi.write_text(yaml.safe_dump_all([job(name="good"), bad, None]))
    code, out, err = run_cli(["validate", str(multi), str(EXAMPLES[0])], capsys)
    assert code == 1
    assert out.splitlines()[0].startswith(f"{multi}[0]: ok (good: dpo, 2 GPUs in 2 pods of 1)")
    assert f"{EXAMPLES[0]}: ok" in out
    assert sorted(err.splitlines()) == [
        f"{multi}[1]: spec.training.lr: must be a finite number, got 'fast'",
        f"{multi}[1]: spec.training.steps: must be >= 1, got 0",
    ]


def test_unreadable_and_malformed_files(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec:\n  roles: [\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    code, out, err = run_cli(["validate", str(broken), str(empty), str(tmp_path / "missing.yaml")], capsys)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"{broken}: invalid YAML:") and "line 3" in lines[0]
    assert lines[1] == f"{empty}: no YAML documents found"
    assert lines[2].startswith(f"{tmp_path / 'missing.yaml'}: cannot read")


DUPLICATES = """\
apiVersion: rlkube.io/v1alpha1
kind: RLTrainingJob
metadata: {name: twice}
base: &base {steps: 10, lr: 1.0e-5}
spec:
  training:
    <<: *base
    steps: 30
    lr: 1e-5
    "lr": 2e-5
  volumes:
  - {name: a, mountPath: /a, name: b}
kind: RLTrainingJob
---
apiVersion: rlkube.io/v1alpha1
kind: RLTrainingJob
metadata: {name: second, name: third}
"""


def test_duplicate_keys_are_refused_naming_each_key_and_its_lines(tmp_path, capsys):
    manifest = tmp_path / "twice.yaml"
    manifest.write_text(DUPLICATES)
    code, out, err = run_cli(["validate", str(manifest)], capsys)
    assert (code, out) == (1, "")
    # One line per duplicate, in the file's order: file:line: field path: why. A key that
    # overrides a merged mapping's ('<<: *base') is no duplicate.
    assert [line.split(" (first at")[0] for line in err.splitlines()] == [
        f"{manifest}:10: spec.training.lr: duplicate key",
        f"{manifest}:12: spec.volumes[0].name: duplicate key",
        f"{manifest}:13: kind: duplicate key",
        f"{manifest}:17: metadata.name: duplicate key",
    ]
    assert "(first at line 9)" in err.splitlines()[0] and "keep one" in err.splitlines()[0]


def test_documents_without_duplicate_keys_load_as_before():
    (doc,) = cli.load_documents("a: 1e-5\nb: &x {c: 1}\nd: {<<: *x, c: 2}\ne: [{f: 1}, {f: 1}]\n")
    assert doc == {"a": 1e-5, "b": {"c": 1}, "d": {"c": 2}, "e": [{"f": 1}, {"f": 1}]}
    with pytest.raises(cli.DuplicateKeys) as caught:
        cli.load_documents("a: {b: 1, c: 2, b: 3}\n")
    assert [(d.path, d.line, d.first_line) for d in caught.value.duplicates] == [("a.b", 1, 1)]


def test_validate_needs_a_file(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["validate"])
    assert exc.value.code == 2


def test_crd_prints_writes_and_checks(tmp_path, capsys):
    code, out, _ = run_cli(["crd"], capsys)
    assert code == 0 and out == crd.crd_yaml()
    assert run_cli(["crd", "--out", str(tmp_path)], capsys)[0] == 0
    written = tmp_path / crd.CRD_FILENAME
    assert written.read_text() == crd.crd_yaml()
    assert run_cli(["crd", "--check", str(tmp_path)], capsys)[0] == 0
    written.write_text(crd.crd_yaml().replace("maxItems: 8", "maxItems: 9"))
    code, _, err = run_cli(["crd", "--check", str(tmp_path)], capsys)
    assert code == 1 and "run `make crds`" in err
    diff = err.splitlines()
    assert any(line.startswith("-") and line.endswith("maxItems: 9") for line in diff), err
    assert any(line.startswith("+") and line.endswith("maxItems: 8") for line in diff), err
    assert run_cli(["crd", "--check", str(tmp_path / "nowhere")], capsys)[0] == 1


def test_operator_verb_explains_a_missing_entry_point(monkeypatch, capsys):
    # None in sys.modules makes the import fail as if the module did not exist.
    monkeypatch.setitem(sys.modules, "rlkube.operator.main", None)
    code, _, err = run_cli(["operator"], capsys)
    assert code == 1 and "rlkube.operator.main" in err


def test_runtime_verbs_hand_over_to_the_runtime_entry_point(monkeypatch):
    calls = []

    def fake_execv(path, argv):
        calls.append((path, argv))
        raise SystemExit(0)

    monkeypatch.setattr(cli.os, "execv", fake_execv)
    for verb in cli.RUNTIME_VERBS:
        with pytest.raises(SystemExit):
            cli.main([verb, "/etc/rlkube/run.yaml", "--flag"])
    assert calls == [
        (sys.executable, [sys.executable, "-m", "rlkube.runtime", verb, "/etc/rlkube/run.yaml", "--flag"])
        for verb in cli.RUNTIME_VERBS
    ]


def _assert_imports_none(modules: str, forbidden: str) -> None:
    """Importing `modules` in a fresh interpreter loads no module for which `forbidden` (an
    expression in `m`, a module name) holds."""
    code = (f"import sys, {modules}; bad = sorted(m for m in sys.modules if {forbidden}); "
            "print(bad); sys.exit(bool(bad))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cli_import_loads_neither_kubernetes_nor_the_runtime():
    _assert_imports_none("rlkube.operator.cli", "m.split('.')[0] in ('kopf', 'kubernetes', 'torch') "
                         "or m.startswith('rlkube.runtime') or m == 'rlkube.operator.api'")


def test_api_and_crd_import_no_torch():
    _assert_imports_none("rlkube.operator.api, rlkube.operator.api.crd",
                         "m.split('.')[0] in ('torch', 'transformers', 'kopf')")


def test_console_script_exit_codes():
    script = Path(sys.executable).parent / "rlkube"
    if not script.exists():
        pytest.skip("console script not installed (make setup installs it)")
    ok = subprocess.run([str(script), "validate", str(EXAMPLES[0])], capture_output=True, text=True)
    bad = subprocess.run([str(script), "validate", str(BAD[0])], capture_output=True, text=True)
    assert (ok.returncode, bad.returncode) == (0, 1), ok.stderr + bad.stderr


def test_readme_example_is_valid(tmp_path, capsys):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    manifest = tmp_path / "readme.yaml"
    manifest.write_text(block)
    code, out, err = run_cli(["validate", str(manifest)], capsys)
    assert (code, err) == (0, ""), err


def test_documents_of_other_groups_are_skipped_but_one_job_is_needed(tmp_path, capsys):
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rl"}}
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump_all([namespace, job(name="good")]))
    code, out, err = run_cli(["validate", str(mixed)], capsys)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"{mixed}[0]: skipped (Namespace is not an rlkube.io object)",
        f"{mixed}[1]: ok (good: dpo, 2 GPUs in 2 pods of 1)",
    ]
    only_other = tmp_path / "other.yaml"
    only_other.write_text(yaml.safe_dump(namespace))
    code, _, err = run_cli(["validate", str(only_other)], capsys)
    assert code == 1 and "no RLTrainingJob documents found" in err


def test_validate_reads_stdin(monkeypatch, capsys):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(job(name="piped"))))
    code, out, err = run_cli(["validate", "-"], capsys)
    assert (code, err) == (0, "") and out.startswith("-: ok (piped: dpo")
