"""`--set FIELD=VALUE` on `python -m rlkube.runtime run`: change a config field from the command line.

One config file serves many runs that differ in a path or two (the model directory, the data
file, where the export goes) or in what a CPU can do (dtype, steps). FIELD is the dotted path of
the field as the YAML file spells it (`model.path`, `data.source`, `training.steps`); VALUE is
read as a YAML scalar or flow collection (`5`, `1.0e-3`, `true`, `[a, b]`, `{gpus: 1}`), numbers in
scientific notation included, as kubectl reads them. YAML 1.1's other booleans (on, off, yes, no)
stay words: `--set model.compile=off` means the setting 'off', and a boolean field still reads
'off' as false. The result is validated like the file itself, so a wrong field or value is named
the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from rlkube.runtime.infra.errors import ConfigError

_SCIENTIFIC = re.compile(r"^[-+]?([0-9][0-9_]*)?\.?[0-9]+[eE][-+]?[0-9]+$")
_WORDS = {"on", "off", "yes", "no", "y", "n"}  # YAML 1.1 reads these as booleans
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=VALUE' -> (['a', 'b'], value); ConfigError naming the argument when it is not one."""
    field, sep, raw = text.partition("=")
    field = field.strip()
    if not sep or not _FIELD.match(field):
        raise ConfigError(f"--set {text!r}: expected FIELD=VALUE with FIELD a dotted path such as model.path")
    if raw.strip().lower() in _WORDS:
        return field.split("."), raw.strip()
    if _SCIENTIFIC.match(raw.strip()):
        return field.split("."), float(raw)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {field}: value {raw!r} is not YAML ({e})") from None
    return field.split("."), value


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`config` (the file's mapping, not changed) with each FIELD=VALUE of `overrides` set, in order."""
    out = yaml.safe_load(yaml.safe_dump(config))  # a deep copy of plain data
    for text in overrides:
        path, value = parse_override(text)
        here = out
        for depth, key in enumerate(path[:-1]):
            child = here.setdefault(key, {})
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigError(f"--set {'.'.join(path)}: {where} is {child!r} in the config, not a mapping")
            here = child
        here[path[-1]] = value
    return out
