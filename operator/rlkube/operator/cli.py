"""The `rlkube` command line.

    rlkube validate FILE...          check RLTrainingJob manifests; one 'file: path: message' line per error
    rlkube crd [--out DIR|--check DIR] print, write or check the generated CRD
    rlkube operator [ARGS...]        run the operator (kopf)
    rlkube train|run|doctor ARGS...  the trainer: hands over to `python -m rlkube.runtime`
    rlkube export CHECKPOINT --to DIR  a committed checkpoint's model as a Hugging Face directory (runtime)

Layering: this module imports neither kopf/kubernetes nor the runtime at import time. The API
types are imported only by the verbs that need them, and the trainer verbs replace this process
with the runtime's own entry point, so `rlkube run` on a GPU node never loads the operator.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

RUNTIME_VERBS = ("train", "run", "doctor", "export")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlkube` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in RUNTIME_VERBS:
        _exec_runtime(args[0], args[1:])  # does not return
    if args and args[0] == "operator":
        return _operator(args[1:])
    parser = _parser()
    ns = parser.parse_args(args)
    if ns.verb is None:
        parser.print_help(sys.stderr)
        return 2
    if ns.verb == "validate":
        return validate_files(ns.files, out=sys.stdout, err=sys.stderr)
    if ns.verb == "crd":
        return _crd(ns.out, ns.check)
    parser.error(f"unknown verb {ns.verb}")  # argparse exits
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkube", description="RL post-training on Kubernetes.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    validate = verbs.add_parser("validate", help="check RLTrainingJob manifests (multi-document YAML)")
    validate.add_argument("files", nargs="+", metavar="FILE", help="manifest file ('-' reads stdin)")
    crd = verbs.add_parser("crd", help="print the RLTrainingJob CRD generated from the API types")
    where = crd.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", help="write the CRD file into DIR")
    where.add_argument("--check", metavar="DIR", help="exit 1 if the CRD file in DIR differs from the generator")
    verbs.add_parser("operator", help="run the operator (kopf); arguments go to it")
    for verb in RUNTIME_VERBS:
        verbs.add_parser(verb, help=f"trainer: python -m rlkube.runtime {verb} ...")
    return parser


# -- validate ------------------------------------------------------------------------------------


def validate_files(files: Sequence[str], out: TextIO, err: TextIO) -> int:
    """Validate every RLTrainingJob document of every file; 0 when all are valid, else 1."""
    failed = False
    for name in files:
        for label, problems, summary in _check_file(name):
            if problems:
                failed = True
                for problem in problems:
                    print(f"{label}: {problem}", file=err)
            else:
                print(f"{label}: {summary}", file=out)
    return 1 if failed else 0


def _check_file(name: str) -> Iterator[tuple[str, list[str], str]]:
    """(label, error lines, verdict) for each document of one file.

    Documents of other API groups (a Namespace or a PVC next to the job, say) are skipped, but a
    file must hold at least one rlkube.io document.
    """
    import yaml

    from rlkube.operator import api

    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        yield name, [f"cannot read: {exc.strerror or exc}"], ""
        return
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
    ours = [doc for doc in documents if _is_ours(doc)]
    if not ours:
        yield name, [f"no {api.KIND} documents found (apiVersion {api.API_VERSION})"], ""
        return
    for index, doc in enumerate(documents):
        label = name if len(documents) == 1 else f"{name}[{index}]"
        if not _is_ours(doc):
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


def _is_ours(doc: Any) -> bool:
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


# -- crd -----------------------------------------------------------------------------------------


def _crd(out_dir: str | None, check_dir: str | None) -> int:
    from rlkube.operator.api import crd

    text = crd.crd_yaml()
    if out_dir is None and check_dir is None:
        sys.stdout.write(text)
        return 0
    if out_dir is not None:
        path = Path(out_dir) / crd.CRD_FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
        return 0
    path = Path(check_dir) / crd.CRD_FILENAME  # type: ignore[arg-type]
    try:
        committed = path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"{path}: cannot read ({exc.strerror}); run `make crds`", file=sys.stderr)
        return 1
    if committed == text:
        print(f"{path}: up to date")
        return 0
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "generated"
    )
    sys.stderr.writelines(list(diff)[:200])
    print(f"{path}: differs from the generator (rlkube.operator.api); run `make crds`", file=sys.stderr)
    return 1


# -- operator and runtime verbs ------------------------------------------------------------------


def _operator(args: list[str]) -> int:
    try:
        from rlkube.operator.main import run
    except ModuleNotFoundError as exc:
        if exc.name in ("rlkube.operator.main", "kopf", "kubernetes"):
            print(
                f"rlkube operator: cannot start: module {exc.name!r} is missing "
                "(install rlkube[operator]; rlkube.operator.main is the operator's entry point)",
                file=sys.stderr,
            )
            return 1
        raise
    import inspect

    # main.run takes the remaining arguments (kopf's own flags) when it accepts any.
    takes_args = bool(inspect.signature(run).parameters)
    if args and not takes_args:
        print(f"rlkube operator: takes no arguments, got {' '.join(args)}", file=sys.stderr)
        return 2
    result = run(args) if takes_args else run()
    return int(result or 0)


def _exec_runtime(verb: str, args: list[str]) -> None:
    """Replace this process with the runtime's entry point (no operator code stays loaded)."""
    argv = [sys.executable, "-m", "rlkube.runtime", verb, *args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    raise SystemExit(main())
