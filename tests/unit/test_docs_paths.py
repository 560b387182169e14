"""The maps of the code (docs/architecture.md, docs/contributing.md) name files of this repository;
every one they name must exist.

Three kinds of reference are checked:
- a backticked span without spaces that ends in a file extension (.py, .md, .yaml, .toml, .txt,
  .sh, .json) or in '/', written from the repository root (`runtime/rlkube/runtime/cli.py`,
  `crds/`, `pyproject.toml`). Absolute paths (`/etc/rlkube/run.yaml`) name places inside a
  container, not in the repository, and are skipped;
- a path outside backticks that starts with one of the repository's top-level folders
  (tests/unit/test_crd.py, docs/kueue.md);
- the target of a relative Markdown link ([cluster.md](cluster.md)), from the page's own folder.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "docs/contributing.md")
TOP_FOLDERS = ("operator", "runtime", "tests", "docs", "crds", "charts", "images", "examples")

PATH = re.compile(r"`([^`\s]+(?:\.py|\.md|\.yaml|\.toml|\.txt|\.sh|\.json|/))`")
BARE = re.compile(r"(?<![\w./`-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./-]*[\w/])")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def named_paths(text: str) -> list[str]:
    """Backticked paths and bare paths under a top-level folder, in order of appearance."""
    found = [(m.start(), m.group(1)) for m in PATH.finditer(text) if not m.group(1).startswith("/")]
    without_code = PATH.sub(lambda m: " " * len(m.group(0)), text)
    found += [(m.start(), m.group(1).rstrip(".")) for m in BARE.finditer(without_code)]
    return [path for _, path in sorted(found)]


def linked_paths(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


def test_named_paths_are_found_in_backticks_and_under_top_folders():
    text = (
        "see `runtime/a.py`, `docs/x.md`, `crds/`, `c.yaml`, `pyproject.toml`; not `a b.py`, not "
        "`/etc/x.yaml`, not `x.txt.bak`, not a.py, not my/tests/x.py; but tests/unit/y.py and docs/z.md."
    )
    assert named_paths(text) == [
        "runtime/a.py", "docs/x.md", "crds/", "c.yaml", "pyproject.toml", "tests/unit/y.py", "docs/z.md",
    ]


def test_relative_links_are_found():
    text = "[a](cluster.md), [b](benchmarks-data/x.json), [c](https://example.org/d.md), [e](kueue.md#elastic)"
    assert linked_paths(text) == ["cluster.md", "benchmarks-data/x.json", "kueue.md"]


def test_architecture_doc_names_paths():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(named_paths(text)) >= 20  # the map names the files it maps


def _cases() -> list[tuple[str, str]]:
    cases = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        cases += [(doc, path) for path in sorted(set(named_paths(text)))]
        cases += [(doc, str(Path(doc).parent / link)) for link in sorted(set(linked_paths(text)))]
    return cases


@pytest.mark.parametrize(("doc", "path"), _cases())
def test_every_path_a_map_names_exists(doc, path):
    target = ROOT / path
    exists = target.is_dir() if path.endswith("/") else target.exists()
    assert exists, (
        f"{doc} names `{path}`, which is not in the repository (paths are written from the "
        "repository root; links from the page's folder)"
    )
