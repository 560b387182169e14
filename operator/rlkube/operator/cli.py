"""The `rlkube` command line.

    rlkube validate FILE...          check RLTrainingJob manifests; one 'file: path: message' line per error
    rlkube crd [--out DIR|--check DIR] print, write or check the generated CRD
    rlkube submit FILE [--follow]    validate, create the job with your kubeconfig, follow it to the end
    rlkube logs JOB [--role R] [--rank N] [--follow]  the log of the pod holding one rank (actor rank 0)
    rlkube operator [ARGS...]        run the operator (kopf)
    rlkube train|run|doctor ARGS...  the trainer: hands over to `python -m rlkube.runtime`
    rlkube export CHECKPOINT --to DIR  a committed checkpoint's model as a Hugging Face directory (runtime)

This module only wires the verbs to their modules (commands/: manifest checks, submit, logs).
Layering: this module imports neither kopf/kubernetes nor the runtime at import time. The API
types are imported only by the verbs that need them, and the trainer verbs replace this process
with the runtime's own entry point, so `rlkube run` on a GPU node never loads the operator.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# Re-exported: the names `rlkube validate` is known by (tests and callers import them from here).
from rlkube.operator.commands.manifest import (  # noqa: F401
    DuplicateKey,
    DuplicateKeys,
    load_documents,
    validate_files,
)

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
    if ns.verb == "submit":
        from rlkube.operator.commands import submit

        return submit.run(ns.file, ns.follow, ns.namespace, ns.kubeconfig, ns.timeout, ns.logs)
    if ns.verb == "logs":
        from rlkube.operator.commands import logs

        return logs.run(ns.job, ns.role, ns.rank, ns.follow, ns.namespace, ns.kubeconfig)
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
    _submit_parser(verbs)
    _logs_parser(verbs)
    verbs.add_parser("operator", help="run the operator (kopf); arguments go to it")
    for verb in RUNTIME_VERBS:
        verbs.add_parser(verb, help=f"trainer: python -m rlkube.runtime {verb} ...")
    return parser


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="the job's namespace (default: the manifest's, else the "
                        "kubeconfig context's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")


def _duration(text: str) -> float:
    from rlkube.operator.commands.submit import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _submit_parser(verbs: argparse._SubParsersAction) -> None:
    submit = verbs.add_parser(
        "submit", help="validate a manifest, create its RLTrainingJob, and with --follow follow it to the end",
        description="Exit codes: 0 created (with --follow: Succeeded), 1 Failed or an API error, 3 manifest "
        "refused (nothing sent), 124 --timeout passed, 130 Ctrl-C. Ctrl-C and the timeout never delete the job.")
    submit.add_argument("file", metavar="FILE", help="manifest holding one RLTrainingJob ('-' reads stdin)")
    submit.add_argument("-f", "--follow", action="store_true",
                        help="print phase changes, step/total with ETA, and rank 0's log until the job ends")
    submit.add_argument("--timeout", type=_duration, default="24h", metavar="DURATION",
                        help="stop following after this long (900, 30m, 2h; default 24h); the job keeps running")
    submit.add_argument("--no-logs", dest="logs", action="store_false", help="with --follow: no pod log, only status")
    _cluster_flags(submit)


def _logs_parser(verbs: argparse._SubParsersAction) -> None:
    logs = verbs.add_parser("logs", help="the log of the pod holding one rank of a role (default: actor rank 0)")
    logs.add_argument("job", metavar="JOB", help="the RLTrainingJob's name")
    logs.add_argument("--role", default="actor", help="actor, critic, reward or reference (default actor)")
    logs.add_argument("--rank", type=int, default=0, help="rank within the role, from 0 (default 0)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the container ends")
    _cluster_flags(logs)


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
