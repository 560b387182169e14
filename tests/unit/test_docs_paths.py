"""docs/architecture.md names files of this repository; every one it names must exist.

A path here is a backticked span without spaces that ends in .py, .md or .yaml, or a folder that
ends in '/', written from the repository root. Absolute paths (`/etc/rlkube/run.yaml`) name places
inside a container, not in the repository, and are skipped.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`([^`\s]+(?:\.py|\.md|\.yaml|/))`")


def named_paths(text: str) -> list[str]:
    return [p for p in PATH.findall(text) if not p.startswith("/")]


def test_named_paths_are_found_in_backticks_only():
    text = "see `runtime/a.py`, `docs/x.md`, `crds/`, `c.yaml`; not a.py, not `a b.py`, not `/etc/x.yaml`, not `x.txt`"
    assert named_paths(text) == ["runtime/a.py", "docs/x.md", "crds/", "c.yaml"]


def test_architecture_doc_names_paths():
    assert len(named_paths(DOC.read_text(encoding="utf-8"))) >= 20  # the map names the files it maps


@pytest.mark.parametrize("path", sorted(set(named_paths(DOC.read_text(encoding="utf-8")))))
def test_every_path_in_architecture_doc_exists(path):
    target = ROOT / path
    assert target.is_dir() if path.endswith("/") else target.is_file(), (
        f"docs/architecture.md names `{path}`, which is not in the repository (paths are written "
        "from the repository root)"
    )
