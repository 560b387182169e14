"""The libraries' bytecode, cached where a restarted trainer finds it.

Python compiles each module's source to bytecode the first time it imports it, and keeps the
result in a `__pycache__` folder beside the source, where later starts read it. An image whose
packages were installed without their bytecode (uv's default, or `pip install --no-compile`)
and that cannot keep it (a read-only or root-owned site-packages for the image's non-root user,
or PYTHONDONTWRITEBYTECODE=1, common in container images) compiles every module from source at
every start. On an H100 host with such an install, a GRPO restart compiled 2,583 modules (torch's
compiler stack, transformers, sympy): 6.5-8.5 s of its start, under a profiler.

`use_bytecode_cache` detects that case before torch and transformers are imported, and points
Python's bytecode cache (`sys.pycache_prefix`; PYTHONPYCACHEPREFIX for the processes it starts,
which write there too: `share_bytecode_cache`) at a folder beside torch.compile's cache: next to the
checkpoints, or on the cluster's cache volume. The first start writes the bytecode there, and every
later start of the job (a restart, a replaced pod) reads it. Nothing is written beside the sources.
Left alone: an install that has its bytecode or can write it, a PYTHONPYCACHEPREFIX the user set,
and RLKUBE_BYTECODE_CACHE=0.
Pure standard library: it runs before torch is imported.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ENV_BYTECODE_CACHE = "RLKUBE_BYTECODE_CACHE"  # 0: leave Python's bytecode caching as it is
ENV_PYCACHE_PREFIX = "PYTHONPYCACHEPREFIX"
ENV_DONT_WRITE = "PYTHONDONTWRITEBYTECODE"
# The packages whose import dominates the start; one of them without its bytecode turns the cache on.
PACKAGES = ("torch", "transformers")
PYCACHE_SUBDIR = "pycache"


def package_init(name: str) -> Path | None:
    """The source of top-level package `name`'s __init__ (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def beside_source(source: Path) -> Path:
    """Where Python keeps `source`'s bytecode when no cache prefix is set."""
    return source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def keeps_own_bytecode(source: Path, writable: Callable[[Path], bool]) -> bool:
    """Whether imports of `source`'s package find their bytecode beside the sources: it is there,
    or Python may write it there (bytecode writing on, and the package folder writable)."""
    if beside_source(source).is_file():
        return True
    return not sys.dont_write_bytecode and writable(source.parent)


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK)


def use_bytecode_cache(cache_root: str | None, env: dict[str, str], packages: Iterable[str] = PACKAGES,
                       writable: Callable[[Path], bool] = _writable) -> str | None:
    """Cache the bytecode under `cache_root`/pycache when a package of `packages` has no bytecode
    it can keep (module docstring). Sets sys.pycache_prefix for this process and returns the
    folder; the caller puts it in the environment of the processes it starts (PYTHONPYCACHEPREFIX).
    None, and nothing changed, where the cache is off, the user set a prefix (or a process that
    started this one shared its cache: share_bytecode_cache), every package keeps its own
    bytecode, or the folder cannot be made."""
    if not cache_root or env.get(ENV_BYTECODE_CACHE, "1") == "0":
        return None
    if sys.pycache_prefix or env.get(ENV_PYCACHE_PREFIX):
        return None
    sources = [s for s in (package_init(p) for p in packages) if s is not None]
    if all(keeps_own_bytecode(s, writable) for s in sources):
        return None
    prefix = os.path.join(cache_root, PYCACHE_SUBDIR)
    try:
        os.makedirs(prefix, exist_ok=True)
    except OSError:
        return None
    if not writable(Path(prefix)):
        return None
    sys.pycache_prefix = prefix
    # Written only under the prefix, never beside the sources, so a PYTHONDONTWRITEBYTECODE meant
    # to keep an image clean still holds.
    sys.dont_write_bytecode = False
    return prefix


def share_bytecode_cache(prefix: str | None, environ: dict[str, str]) -> None:
    """Give the processes this one starts (the workers of a multi-GPU pod, torch.compile's compile
    workers) the same cache: PYTHONPYCACHEPREFIX set, and PYTHONDONTWRITEBYTECODE dropped so that
    they write what they compile there too (a pod's launcher that spawns its workers imports no
    torch itself). Nothing changes without a prefix."""
    if prefix:
        environ[ENV_PYCACHE_PREFIX] = prefix
        environ.pop(ENV_DONT_WRITE, None)
