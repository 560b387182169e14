"""Rules on the paths the pod opens or mounts, each a Python check and its CEL twin.

- Paths the trainer opens in the pod (model.path, model.tokenizer unless 'byte', data.source
  unless format is 'synthetic', data.eval, and the same in every role's model) are absolute: a
  relative one would resolve against the image's working directory, which no volume is mounted
  at. The runtime reads no URIs (no scheme is supported), so none is let through.
- Mount paths, hostPaths, checkpoint.dir and export.dir are written in normal form, lie outside
  the read-only config mount, and do not take a path or a volume name the pod uses itself (the
  API server would refuse the pod with a 422 long after `kubectl apply` said yes;
  tests/integration/test_render_fuzz.py found these by a server-side dry run of rendered pods).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from rlkube.operator.api.validation.cel import rule
from rlkube.runtime.contract.model_types import spec_models
from rlkube.runtime.contract.pod import CONFIG_DIR

SHM_DIR = "/dev/shm"
# Paths the rendered pod mounts itself (run.yaml's ConfigMap, the shared-memory emptyDir); the
# checkpoint volume's path, checkpoint.dir, is the third reserved one.
RESERVED_MOUNT_PATHS = (CONFIG_DIR, SHM_DIR)
# Names of the volumes render.py gives every pod (run.yaml's ConfigMap, shared memory, the
# checkpoint store): a user volume of the same name would make the pod's volumes clash (422).
RESERVED_VOLUME_NAMES = ("config", "dshm", "checkpoints", "rlkube-compile-cache")

# -- paths the trainer opens ----------------------------------------------------------------------


def source_path_problems(spec: Any) -> list[str]:
    paths: dict[str, str | None] = {}
    for where, model in spec_models(spec).items():
        paths[f"{where}.path"] = model.path
        paths[f"{where}.tokenizer"] = None if model.tokenizer == "byte" else model.tokenizer
    paths["data.source"] = None if spec.data.format == "synthetic" else spec.data.source
    paths["data.eval"] = spec.data.eval
    return [
        f"{where}: must be an absolute path in the pod (a volume's mountPath and below), got {path!r}: a "
        "relative path resolves against the image's working directory"
        for where, path in paths.items()
        if path is not None and not path.startswith("/")
    ]


def _absolute(field: str) -> str:
    return f"!has(self.{field}) || self.{field}.startsWith('/')"


MODEL_PATH_CEL = [
    rule(_absolute("path"), "path: must be an absolute path in the pod", ".path"),
    rule("!has(self.tokenizer) || self.tokenizer == 'byte' || self.tokenizer.startsWith('/')",
         "tokenizer: must be 'byte' or an absolute path in the pod", ".tokenizer"),
]
DATA_PATH_CEL = [
    rule("(has(self.format) ? self.format : 'jsonl') == 'synthetic' || self.source.startsWith('/')",
         "source: must be an absolute path in the pod (or format 'synthetic')", ".source"),
    rule(_absolute("eval"), "eval: must be an absolute path in the pod", ".eval"),
]

# -- normal form ----------------------------------------------------------------------------------

# A path as the API server and the kubelet compare it: no empty, '.' or '..' segment and no
# trailing '/'. Mount paths are compared as written ('/dev/shm/' is not '/dev/shm' to the API
# server, yet both are the same directory in the container), so they must be written this way,
# and then comparing them as strings is comparing them normalised. No backslashes: CEL reads it.
_DOT_SEGMENT = "(^|/)[.][.]?(/|$)"
_DOT_SEGMENT_PY = _DOT_SEGMENT.replace("$", r"\Z")
NOT_NORMAL = "must be written in normal form: no '//', '.' or '..' segment and no trailing '/'"
IN_CONFIG_DIR = f"must not be inside {CONFIG_DIR}, where the pod mounts run.yaml read-only"


def path_form_problem(path: str) -> str | None:
    """Why the absolute `path` is not written in normal form, or None."""
    # '$' as CEL's regex engine reads it, the end of the text (Python's also matches before a final newline).
    if "//" not in path and (path == "/" or not path.endswith("/")) and not re.search(_DOT_SEGMENT_PY, path):
        return None
    normal = "/" + posixpath.normpath(path).lstrip("/")
    return f"must be written in normal form ({normal!r}): no '//', '.' or '..' segment and no trailing '/', got {path!r}"


def path_form_cel(value: str) -> str:
    """CEL: the string `value` is written in normal form (see path_form_problem)."""
    return (f"!{value}.contains('//') && ({value} == '/' || !{value}.endsWith('/')) && "
            f"!{value}.matches('{_DOT_SEGMENT}')")


def under_config_dir(path: str) -> bool:
    """`path` lies inside the read-only ConfigMap mount (a mount there could not be created)."""
    return path.startswith(CONFIG_DIR + "/")


def path_problems(checkpoint_dir: str, export_dir: str | None, compile_cache_dir: str | None = None) -> list[str]:
    """checkpoint.dir, export.dir and checkpoint.compileCacheDir in normal form and outside the
    config mount (the volumes' own paths are VolumeSpec's to check)."""
    problems = []
    for where, path in (("checkpoint.dir", checkpoint_dir), ("export.dir", export_dir),
                        ("checkpoint.compileCacheDir", compile_cache_dir)):
        if path is None or not path.startswith("/"):
            continue  # unset, or refused as relative by mount_path_problems
        if (problem := path_form_problem(path)) is not None:
            problems.append(f"{where}: {problem}")
        elif under_config_dir(path):
            problems.append(f"{where}: {IN_CONFIG_DIR}")
    return problems


def dir_cel(field: str, prop: str = "dir") -> list[dict]:
    """CEL on CheckpointSpec / ExportSpec: the directory `prop` (`field` in messages), when
    absolute, in normal form and outside the config mount (the twins of `path_problems`)."""
    value = f"self.{prop}"
    applies = f"!has({value}) || !{value}.startsWith('/') || "
    return [
        rule(applies + f"({path_form_cel(value)})", f"{field}: {NOT_NORMAL}", f".{prop}"),
        rule(applies + f"!{value}.startsWith('{CONFIG_DIR}/')", f"{field}: {IN_CONFIG_DIR}", f".{prop}"),
    ]


# -- what the pod mounts itself -------------------------------------------------------------------

CHECKPOINT_DIR_CEL = "(has(self.checkpoint) && has(self.checkpoint.dir) ? self.checkpoint.dir : '/checkpoints')"


def mount_path_problems(checkpoint_dir: str, export_dir: str | None, mount_paths: list[str],
                        compile_cache_dir: str | None = None) -> list[str]:
    """Paths the pod could not mount or use: a relative checkpoint, export or compile cache dir, a
    checkpoint dir or an extra volume on a path the pod already mounts."""
    problems = []
    if not checkpoint_dir.startswith("/"):
        problems.append(f"checkpoint.dir: must be an absolute path, got {checkpoint_dir!r}")
    elif checkpoint_dir in RESERVED_MOUNT_PATHS:
        problems.append(f"checkpoint.dir: {checkpoint_dir} is reserved (the pod mounts "
                        f"{' and '.join(RESERVED_MOUNT_PATHS)} itself)")
    for where, path in (("export.dir", export_dir), ("checkpoint.compileCacheDir", compile_cache_dir)):
        if path is not None and not path.startswith("/"):
            problems.append(f"{where}: must be an absolute path, got {path!r}")
    reserved = (*RESERVED_MOUNT_PATHS, checkpoint_dir)
    for index, path in enumerate(mount_paths):
        if path in reserved:
            problems.append(f"volumes[{index}].mountPath: {path} is reserved (the pod mounts run.yaml at "
                            f"{CONFIG_DIR}, shared memory at {SHM_DIR} and checkpoints at checkpoint.dir)")
    return problems


def mount_path_cel() -> list[dict]:
    """CEL on the spec: the twins of `mount_path_problems`."""
    ckpt = CHECKPOINT_DIR_CEL

    def outside(value: str, paths: tuple[str, ...]) -> str:
        return " && ".join(f"{value} != {path}" for path in paths)

    reserved = tuple(f"'{path}'" for path in RESERVED_MOUNT_PATHS)
    return [
        rule(f"{ckpt}.startsWith('/')", "checkpoint.dir: must be an absolute path", ".checkpoint"),
        rule(outside(ckpt, reserved),
             f"checkpoint.dir: {' and '.join(RESERVED_MOUNT_PATHS)} are reserved (the pod mounts them itself)",
             ".checkpoint"),
        rule("!has(self.export) || !has(self.export.dir) || self.export.dir.startsWith('/')",
             "export.dir: must be an absolute path", ".export"),
        rule("!has(self.checkpoint) || !has(self.checkpoint.compileCacheDir) || "
             "self.checkpoint.compileCacheDir.startsWith('/')",
             "checkpoint.compileCacheDir: must be an absolute path (a directory on a volume the jobs mount)",
             ".checkpoint"),
        rule(f"!has(self.volumes) || self.volumes.all(v, {outside('v.mountPath', (*reserved, ckpt))})",
             f"volumes: a mountPath must not be {', '.join(RESERVED_MOUNT_PATHS)} or checkpoint.dir "
             "(the pod mounts run.yaml, shared memory and checkpoints there)", ".volumes"),
    ]
