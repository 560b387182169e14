"""`python -m rlkube.runtime VERB`: run / train CONFIG, doctor [--require ...], export CHECKPOINT --to DIR.

`run` (and its alias `train`) reads the runtime config (a RuntimeConfig as camelCase YAML, the
path as argument or in RLKUBE_CONFIG), validates it before anything starts — a bad config exits
3 with the field path of every problem — and then launches (launch.py) and trains. Rank 0 prints
JSON lines where stdout is not a terminal and the progress view where it is; `--log-format`
says which (infra/terminal.py). `run(config)` is the in-process entry point: it picks the
trainer of `config.algorithm` from the algorithms' registry (contract/algorithms.py:
trainers/dpo.py, kto.py, rl/) and maps outcomes to the exit codes of the contract
(`rlkube.runtime.contract.pod`, docs/architecture.md "The contract").

`export` writes the Hugging Face directory of a committed checkpoint's actor (infra/export.py), on
CPU in this one process (a LoRA actor: its adapter in DIR/adapter, and with --merge-lora the merged
model in DIR); exit 3 with the argument named when the checkpoint or a path is wrong.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError

from rlkube.runtime.contract import failure
from rlkube.runtime.contract.algorithms import ALGORITHMS
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.contract.field_path import field_path
from rlkube.runtime.contract.model_types import model_problems
from rlkube.runtime.contract.pod import ENV_CONFIG, EXIT_CONFIG, EXIT_NON_FINITE, EXIT_OK, EXIT_TERMINATED
from rlkube.runtime.infra.config_overrides import apply_overrides
from rlkube.runtime.infra.errors import ConfigError, NonFiniteLoss, Terminated
from rlkube.runtime.infra.terminal import LOG_FORMAT_ENV, LOG_FORMATS


def format_validation_error(err: ValidationError, source: str) -> list[str]:
    """One 'source: field.path: problem' line per error (paths as the operator writes them)."""
    lines = []
    for e in err.errors():
        path = field_path(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if e["type"] in ("missing",) or isinstance(got, dict) else f", got {got!r}"
        lines.append(f"{source}: {path or '(top level)'}: {msg}{shown}")
    return lines


def load_config(path: str, overrides: Sequence[str] = ()) -> RuntimeConfig:
    """Read and validate a runtime config, with `--set FIELD=VALUE` overrides applied
    (infra/config_overrides.py); ConfigError with every problem's field path."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a mapping of RuntimeConfig fields")
    if overrides:
        raw = apply_overrides(raw, overrides)
    try:
        return RuntimeConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError("\n".join(format_validation_error(e, path))) from None


def _config_file(path: str, config: RuntimeConfig, overrides: Sequence[str]) -> str:
    """The config file the workers read: `path` itself, or with `--set` overrides a copy of the
    validated config holding them (workers take no arguments but the path)."""
    if not overrides:
        return path
    import tempfile

    data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    with tempfile.NamedTemporaryFile("w", prefix="rlkube-run-", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return f.name


def run(config: RuntimeConfig, **kwargs):
    """Train `config` in this process (one rank) with its algorithm's trainer module
    (contract/algorithms.py, imported only now: torch and transformers load with it, so `validate`
    and `doctor` stay fast); the algorithm's result."""
    # Before torch loads: an unknown model type, a model directory without config.json or a
    # tracker whose package is missing is the user's mistake (exit 3 naming the field), not a
    # crash to retry.
    from rlkube.runtime.trainers.trackers import tracker_problems

    problems = model_problems(config) + tracker_problems(config)
    if problems:
        raise ConfigError("\n".join(problems))
    return importlib.import_module(ALGORITHMS[config.algorithm].trainer).train(config, **kwargs)


def model_paths(config: RuntimeConfig) -> list[str]:
    """The model directories the run loads: the actor's, and any role's own model."""
    paths = [config.model.path]
    for name in type(config.roles).model_fields:
        role = getattr(config.roles, name, None)
        model = getattr(role, "model", None)
        paths.append(getattr(model, "path", None))
    return [p for p in paths if p]


def config_failed(e: ConfigError) -> int:
    """A config (or data) error: said on stderr and in the termination message; EXIT_CONFIG."""
    print(f"config error: {e}", file=sys.stderr)
    from rlkube.runtime.infra.progress import write_termination_error

    write_termination_error(failure.ERROR_CONFIG, e, e.field_path())
    return EXIT_CONFIG


def run_in_process(config: RuntimeConfig) -> int:
    """`run(config)` with outcomes mapped to exit codes (a crash propagates: exit 1). Each
    failure leaves why in the termination message (infra/progress.write_termination_error)."""
    from rlkube.runtime.infra.progress import write_termination_error

    try:
        run(config)
        return EXIT_OK
    except ConfigError as e:
        return config_failed(e)
    except NonFiniteLoss as e:
        print(f"rlkube: {e}", file=sys.stderr)
        write_termination_error(failure.ERROR_NON_FINITE, e)
        return EXIT_NON_FINITE
    except Terminated as e:
        print(f"rlkube: {e}", file=sys.stderr)
        return EXIT_TERMINATED
    except Exception as e:
        write_termination_error(failure.ERROR_CRASH, f"{type(e).__name__}: {e}")
        raise


def export(checkpoint: str, to: str, tokenizer: str | None, overwrite: bool, merge_lora: bool = False) -> int:
    """The `export` verb: one JSON line naming the directory and step, or exit 3 and why."""
    import json

    from rlkube.runtime.infra.export import export_checkpoint

    try:
        record = export_checkpoint(Path(checkpoint), Path(to), tokenizer, overwrite, merge=merge_lora)
    except ConfigError as e:
        print(f"export error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(record))
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlkube.runtime", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb")
    for verb in ("run", "train"):
        v = verbs.add_parser(verb, help="train with CONFIG (a RuntimeConfig YAML)")
        v.add_argument("config", nargs="?", default=os.environ.get(ENV_CONFIG), help="config path")
        v.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                       help="rank 0's stdout: json (one JSON object a line), text (the progress view and "
                       "the summary in words), or auto: text on a terminal, else json (the default)")
        v.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="change one config field, e.g. --set model.path=./my-model --set data.source="
                       "pairs.jsonl (dotted path as in the YAML file; VALUE read as YAML); repeatable")
    d = verbs.add_parser("doctor", help="print device information; check required capabilities")
    d.add_argument("--require", default="", help="comma-separated: cuda,nccl,flash_attn")
    e = verbs.add_parser("export", help="write a committed checkpoint's model as a Hugging Face directory")
    e.add_argument("checkpoint", help="a step-NNNNNNNNN directory, or a checkpoint directory (its latest)")
    e.add_argument("--to", required=True, metavar="DIR", help="the model directory to write")
    e.add_argument("--tokenizer", metavar="DIR", help="the tokenizer, when the run's is not at its path here")
    e.add_argument("--overwrite", action="store_true", help="replace DIR when it is not empty")
    e.add_argument("--merge-lora", action="store_true",
                   help="a LoRA checkpoint: also write the model with the adapters folded in to DIR (the "
                   "adapter, in PEFT's format, always goes to DIR/adapter)")
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.verb == "doctor":
        from rlkube.runtime.infra.doctor import main as doctor

        return doctor([c for c in ns.require.split(",") if c])
    if ns.verb == "export":
        return export(ns.checkpoint, ns.to, ns.tokenizer, ns.overwrite, ns.merge_lora)
    if ns.verb not in ("run", "train"):
        _parser().print_help(sys.stderr)
        return 2
    from rlkube.runtime.infra.sigterm import stop_while_starting

    stop_while_starting()  # PID 1 in a pod ignores SIGTERM without a handler (infra/sigterm.py)
    if ns.log_format is not None:  # the env carries it to the workers spawn_workers starts
        os.environ[LOG_FORMAT_ENV] = ns.log_format
    if not ns.config:
        print(f"config error: no config path (argument or {ENV_CONFIG})", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(ns.config, ns.set)
    except ConfigError as e:
        return config_failed(e)
    # The weights are read into the page cache while torch and transformers import (readahead.py).
    from rlkube.runtime.infra.readahead import start_readahead

    start_readahead(model_paths(config), config.checkpoint.dir)
    from rlkube.runtime.infra.launch import launch_mode, pod_rank_env, spawn_workers
    from rlkube.runtime.infra.progress import serve_health_early
    from rlkube.runtime.infra.startup import allocator_env, compile_cache_env

    os.environ.update(compile_cache_env(config.checkpoint.dir, dict(os.environ), config.checkpoint.compile_cache_dir))
    # An install without its bytecode compiles torch and transformers from source at every start
    # unless the bytecode is kept beside torch.compile's cache (bytecode.py).
    from rlkube.runtime.infra.bytecode import share_bytecode_cache, use_bytecode_cache

    share_bytecode_cache(use_bytecode_cache(os.environ.get("TORCHINDUCTOR_CACHE_DIR"), dict(os.environ)), os.environ)
    os.environ.update(allocator_env(dict(os.environ)))
    mode = launch_mode(dict(os.environ))
    if mode == "spawn":
        return spawn_workers(_config_file(ns.config, config, ns.set))
    if mode == "pod":
        os.environ.update(pod_rank_env(dict(os.environ)))
    # /healthz answers from here on, before torch is even imported (progress.py).
    serve_health_early(config.progress_port)
    return run_in_process(config)
