"""Size limits of the code (docs/contributing.md, "Size limits"), checked by `make lint`.

A Python file under operator/ or runtime/ may have at most 600 lines, a function (or method)
at most 80 and a class at most 300. Lengths come from the syntax tree: a function or class
spans from its `def`/`class` line to its last line (decorators not counted, nested functions
counted in their parent as well as on their own). Each offender is printed as
`path:line: what is too long`, and the exit status is 1 when there is one that the allowlist
does not excuse.

The allowlist (`size_allowlist.txt` next to this file) names code that is over a limit today
and being split: `path` for a whole file, `path::Qualified.name` for a function or class, each
line with a comment saying why it is there. Entries are keyed by name, not line number, so
edits above an offender do not break them. An entry that no longer matches an offender is
reported as stale (remove it) but does not fail the run: the split that fixed it may land in
another engineer's commit before the allowlist is trimmed.

    python tests/lint/check_sizes.py [--root DIR] [--allowlist FILE] [folder ...]
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300
DEFAULT_FOLDERS = ("operator", "runtime")
DEFAULT_ALLOWLIST = Path(__file__).with_name("size_allowlist.txt")


@dataclass(frozen=True)
class Offender:
    path: str  # relative to the root, with forward slashes
    line: int
    kind: str  # "file", "function" or "class"
    name: str  # qualified name; "" for a file
    lines: int
    limit: int

    @property
    def key(self) -> str:
        """What an allowlist line names: the path, or path::qualified.name."""
        return self.path if self.kind == "file" else f"{self.path}::{self.name}"

    def __str__(self) -> str:
        what = "file" if self.kind == "file" else f"{self.kind} {self.name}"
        return f"{self.path}:{self.line}: {what} has {self.lines} lines (limit {self.limit})"


def _span(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def offenders_in_source(source: str, path: str) -> list[Offender]:
    """Every limit the source breaks; `path` is only used to label the results."""
    found: list[Offender] = []
    total = len(source.splitlines())
    if total > MAX_FILE_LINES:
        found.append(Offender(path, 1, "file", "", total, MAX_FILE_LINES))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                is_class = isinstance(child, ast.ClassDef)
                kind, limit = ("class", MAX_CLASS_LINES) if is_class else ("function", MAX_FUNCTION_LINES)
                if _span(child) > limit:
                    found.append(Offender(path, child.lineno, kind, name, _span(child), limit))
                visit(child, name + ".")
            else:
                # defs inside if/try/with blocks keep the enclosing prefix
                visit(child, prefix)

    visit(ast.parse(source, filename=path), "")
    return found


def find_offenders(root: Path, folders: tuple[str, ...] = DEFAULT_FOLDERS) -> list[Offender]:
    found: list[Offender] = []
    for folder in folders:
        for file in sorted((root / folder).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            found.extend(offenders_in_source(file.read_text(encoding="utf-8"), rel))
    return found


def read_allowlist(text: str) -> set[str]:
    """Keys of an allowlist: one a line, `#` starts a comment, blank lines ignored."""
    keys = set()
    for raw in text.splitlines():
        entry = raw.split("#", 1)[0].strip()
        if entry:
            keys.add(entry)
    return keys


def check(offenders: list[Offender], allowed: set[str]) -> tuple[list[Offender], list[Offender], list[str]]:
    """(failing, excused, stale allowlist keys)."""
    failing = [o for o in offenders if o.key not in allowed]
    excused = [o for o in offenders if o.key in allowed]
    stale = sorted(allowed - {o.key for o in offenders})
    return failing, excused, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", default=list(DEFAULT_FOLDERS))
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--allowlist", type=Path, default=DEFAULT_ALLOWLIST)
    args = parser.parse_args(argv)

    allowed = read_allowlist(args.allowlist.read_text(encoding="utf-8")) if args.allowlist.exists() else set()
    failing, excused, stale = check(find_offenders(args.root, tuple(args.folders)), allowed)
    for o in excused:
        print(f"{o}  [allowlisted: being split]")
    for key in stale:
        print(f"{args.allowlist.name}: stale entry, no longer over a limit (remove it): {key}")
    for o in failing:
        print(o)
    if failing:
        print(f"check_sizes: {len(failing)} over the size limits "
              f"(file {MAX_FILE_LINES}, function {MAX_FUNCTION_LINES}, class {MAX_CLASS_LINES} lines); "
              "split along a real seam", file=sys.stderr)
        return 1
    print(f"check_sizes: ok ({len(excused)} allowlisted, {len(stale)} stale allowlist entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
