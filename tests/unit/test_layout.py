"""The repository layout must not shadow the standard library's `operator` module."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stdlib_operator_loads_from_repository_root():
    # -I would drop the cwd from sys.path; run plainly, as a user in the repo root would.
    code = "import operator, sys; print(operator.__file__); print(operator.itemgetter)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    first = out.splitlines()[0]
    assert "rlkube" not in first and not first.startswith(str(ROOT / "operator")), first


def test_rlkube_operator_is_ours():
    import rlkube.operator

    assert Path(rlkube.operator.__file__).parent == ROOT / "operator" / "rlkube" / "operator"


def test_every_source_package_is_listed_for_the_wheel():
    # pyproject lists packages by hand (the two source roots map one namespace package); a
    # sub-package missing there is left out of the wheel, and the images fail to import it.
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for root in ("operator", "runtime"):
        for init in (ROOT / root).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT / root).parts))
    assert found - listed == set(), f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed in pyproject.toml but not a package: {sorted(listed - found)}"


def test_the_operators_top_level_holds_only_its_entry_points():
    # The operator's code lives in folders that are its layers (api, planning, render,
    # lifecycle, controller; import-linter holds their order); the top keeps the entry points.
    top = sorted(p.name for p in (ROOT / "operator" / "rlkube" / "operator").glob("*.py"))
    assert len(top) <= 6, f"move these into the layer folders: {top}"
    layers = {"api", "planning", "render", "lifecycle", "controller"}
    assert layers <= {p.name for p in (ROOT / "operator" / "rlkube" / "operator").iterdir() if p.is_dir()}
