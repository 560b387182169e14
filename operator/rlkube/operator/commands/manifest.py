"""Reading and checking RLTrainingJob manifests: what `rlkube validate` prints and what `rlkube
submit` refuses before it sends anything to the cluster.

`check_file` yields one verdict per YAML document of a file (errors as 'field.path: message', or a
one-line summary); `load_documents` reads YAML the way kubectl does and refuses a key written twice
in one mapping. yaml and the API types are imported on first use, so importing this module (the
CLI does at start) stays cheap.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


def validate_files(files: Sequence[str], out: TextIO, err: TextIO) -> int:
    """Validate every RLTrainingJob document of every file; 0 when all are valid, else 1."""
    failed = False
    for name in files:
        for label, problems, summary in check_file(name):
            if problems:
                failed = True
                for problem in problems:
                    print(f"{label}: {problem}", file=err)
            else:
                print(f"{label}: {summary}", file=out)
    return 1 if failed else 0


def read_text(name: str) -> str:
    """The text of file `name` ('-': stdin); OSError when it cannot be read."""
    return sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")


def check_file(name: str) -> Iterator[tuple[str, list[str], str]]:
    """(label, error lines, verdict) for each document of one file (see `check_text`)."""
    try:
        text = read_text(name)
    except OSError as exc:
        yield name, [f"cannot read: {exc.strerror or exc}"], ""
        return
    yield from check_text(name, text)


def check_text(name: str, text: str) -> Iterator[tuple[str, list[str], str]]:
    """(label, error lines, verdict) for each document of the text of file `name`.

    Documents of other API groups (a Namespace or a PVC next to the job, say) are skipped, but a
    file must hold at least one rlkube.io document.
    """
    import yaml

    from rlkube.operator import api

    try:
        documents = [doc for doc in load_documents(text) if doc is not None]
    except DuplicateKeys as exc:
        for duplicate in exc.duplicates:
            yield f"{name}:{duplicate.line}", [duplicate.problem()], ""
        return
    except yaml.YAMLError as exc:
        yield name, [f"invalid YAML: {_yaml_problem(exc)}"], ""
        return
    if not documents:
        yield name, ["no YAML documents found"], ""
        return
    ours = [doc for doc in documents if is_ours(doc)]
    if not ours:
        yield name, [f"no {api.KIND} documents found (apiVersion {api.API_VERSION})"], ""
        return
    for index, doc in enumerate(documents):
        label = name if len(documents) == 1 else f"{name}[{index}]"
        if not is_ours(doc):
            kind = doc.get("kind", "?") if isinstance(doc, dict) else type(doc).__name__
            yield label, [], f"skipped ({kind} is not an {api.GROUP} object)"
            continue
        errors = api.job_errors(doc)
        if errors:
            yield label, [str(error) for error in errors], ""
        else:
            job = api.parse_job(doc)
            spec = job.spec
            pods = spec.pod_count()
            summary = (
                f"ok ({job.metadata.name}: {spec.algorithm}, {spec.total_gpus()} GPUs in {pods} "
                f"pod{'s' if pods != 1 else ''} of {spec.placement.gpus_per_pod})"
            )
            yield label, [], summary


def is_ours(doc: Any) -> bool:
    """A document meant as an rlkube object: its apiVersion is in the rlkube.io group (or unset)."""
    from rlkube.operator import api

    if not isinstance(doc, dict):
        return True  # not a mapping at all: report it, do not skip it
    version = doc.get("apiVersion")
    return not isinstance(version, str) or version.split("/")[0] == api.GROUP


def load_documents(text: str) -> list[Any]:
    """All YAML documents of `text`, read the way kubectl reads them; DuplicateKeys when a mapping
    holds a key twice (yaml.YAMLError when the text is not YAML).

    PyYAML follows YAML 1.1, where `1e-5` (no dot) is a string; kubectl reads it as a number, as
    users expect of a learning rate. The loader here resolves such scientific notation as floats.
    A mapping with a key twice is not one YAML defines (it asks for unique keys), and a reader keeps
    one of the two values without a word (PyYAML the last): the manifest says two things and the
    cluster would get one, so it is refused, naming the key and its lines.
    """
    loader = _manifest_loader()(text)
    try:
        documents = []
        while loader.check_data():
            documents.append(loader.get_data())
    finally:
        loader.dispose()
    if loader.duplicates:
        raise DuplicateKeys(sorted(loader.duplicates, key=lambda duplicate: duplicate.line), documents)
    return documents


@dataclass(frozen=True)
class DuplicateKey:
    """A key written twice in one mapping: its field path, and the lines of its two writings."""

    path: str  # 'spec.training.lr', or the key alone at the top of a document
    line: int  # 1-based, of the second writing
    first_line: int

    def problem(self) -> str:
        return (f"{self.path}: duplicate key (first at line {self.first_line}): a mapping holds each key "
                "once, and YAML readers keep one of the two values without a word; keep one")


class DuplicateKeys(ValueError):
    """The duplicate keys of a text, in the order they are written, and its documents as a reader
    that keeps each key's last value reads them (what a JSON body built from them would hold)."""

    def __init__(self, duplicates: list[DuplicateKey], documents: list[Any]) -> None:
        super().__init__("; ".join(f"line {d.line}: {d.problem()}" for d in duplicates))
        self.duplicates, self.documents = duplicates, documents


@functools.cache
def _manifest_loader() -> type:
    """The loader class of `load_documents` (built on first use: yaml is imported lazily)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader with kubectl's floats, refusing (collecting) keys written twice in a mapping.

        Keys are compared as constructed ('lr' and "lr" are one key), at construction, among the
        pairs the mapping was written with: a merge key's ('<<: *base') pairs may be overridden, and
        PyYAML folds them into the mapping's node before the constructor reads it, so each
        mapping's own pairs and field path are noted while it is composed."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.duplicates: list[DuplicateKey] = []
            self._paths: list[str] = []
            self._written: dict[Any, tuple[str, list]] = {}  # mapping node -> (its path, its own pairs)

        def compose_node(self, parent: Any, index: Any) -> Any:
            here = self._paths[-1] if self._paths else ""
            if parent is None:
                path = ""
            elif isinstance(index, yaml.ScalarNode):  # a mapping's value, under its key
                path = f"{here}.{index.value}" if here else index.value
            elif isinstance(index, int):  # a sequence's item
                path = f"{here}[{index}]"
            else:
                path = here
            self._paths.append(path)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._paths.pop()
            if isinstance(node, yaml.MappingNode) and node not in self._written:
                self._written[node] = (path, list(node.value))
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            path, pairs = self._written.get(node, ("", node.value))
            seen: dict[Any, Any] = {}
            for key_node, _ in pairs:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the constructor refuses it
                if first is not key_node:
                    self.duplicates.append(DuplicateKey(f"{path}.{key}" if path else str(key),
                                                        key_node.start_mark.line + 1, first.start_mark.line + 1))
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?([0-9][0-9_]*)?\.?[0-9]+([eE][-+]?[0-9]+)$"),
        list("-+0123456789."),
    )
    return Loader


def _yaml_problem(exc: Any) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
