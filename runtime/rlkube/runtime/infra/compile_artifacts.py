"""torch.compile's work carried with the checkpoints: PyTorch's portable cache artifacts
("mega-cache", `torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) saved inside every
checkpoint and loaded by the next attempt before it compiles anything.

Why, next to the cache directories (infra/startup.compile_cache_env): those directories hold the
same graphs, but only where they are kept. A restart whose cache directory is new (an emptyDir, a
node whose hostPath cache is empty, a compileCacheDir volume that was cleaned) would compile
everything again; the artifacts travel with the checkpoint it resumes from, on the volume every
attempt mounts anyway. `load_cache_artifacts` writes them into this process's cache directories,
so the first compile finds its graphs there (inductor's FX graph cache hit; the first step's
`compileCache` says how many).

What they hold: inductor's compiled graphs (on CUDA with their Triton kernels bundled) and
AOTAutograd's forward/backward graphs. On a CPU, inductor's C++ kernels are not in them: a hit
there loads the graph's code and builds its C++ again (seconds of gcc per graph), unless the
cache directory still holds the built library.

Layout: `<step dir>/compile-artifacts/rank-NNNNN.bin`, one per rank that compiled, written into
the checkpoint's temp directory before its commit, so a committed checkpoint holds its artifacts
or none (checkpoint.py's commit protocol). A restart loads its own rank's file, else rank 0's (a
new world size, a rank that never compiled). An unreadable file is skipped with a warning: the
graphs are compiled again, nothing is lost.

Cost: `save_cache_artifacts` runs on the training thread at every save (it serialises every
graph compiled or loaded so far), so it is part of the save's stall; each save's record
(`checkpointSave`) says how long it took, as `compileArtifactsSeconds`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rlkube.runtime.infra.log import log

ARTIFACTS_DIR = "compile-artifacts"


def artifact_name(rank: int) -> str:
    """The file of rank `rank`'s artifacts, relative to a checkpoint's directory."""
    return f"{ARTIFACTS_DIR}/rank-{rank:05d}.bin"


def saved_artifacts(rank: int) -> dict[str, bytes]:
    """{file name in the checkpoint: bytes} of what torch.compile compiled or loaded in this
    process so far; {} when it compiled nothing. Runs on the training thread, at a save."""
    if "torch._inductor" not in sys.modules:  # nothing was compiled (nor loaded) in this process
        return {}
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return {}
    data, _ = saved
    return {artifact_name(rank): data} if data else {}


def checkpoint_attachments(rank: int) -> tuple[dict[str, bytes], dict]:
    """What a checkpoint of rank `rank` carries of torch.compile (`saved_artifacts`), and what its
    save record says of it: compileArtifactsSeconds, the seconds collecting them held the training
    thread (part of the save's stall; 0.0 when nothing was compiled). Measured at every save, so a
    benchmark can weigh the restart it saves against what it costs each checkpoint."""
    t0 = time.perf_counter()
    files = saved_artifacts(rank)
    return files, {"compileArtifactsSeconds": round(time.perf_counter() - t0, 4)}


def artifacts_for(checkpoint: Path, rank: int) -> Path | None:
    """The artifact file a restart of rank `rank` loads from `checkpoint`: its own, else rank 0's."""
    for name in (artifact_name(rank), artifact_name(0)):
        path = checkpoint / name
        if path.is_file():
            return path
    return None


def load_artifacts(checkpoint: Path | None, rank: int) -> dict | None:
    """Load the artifacts `checkpoint` holds for `rank` into this process's compile caches, before
    anything compiles; what was loaded (path, bytes, entries per cache), or None."""
    if checkpoint is None:
        return None
    path = artifacts_for(checkpoint, rank)
    if path is None:
        return None
    import torch

    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as e:  # a file of another torch version, or a cut one: compile as if cold
        log.warning("compile cache: cannot load %s (%s: %s); compiling from scratch", path, type(e).__name__, e)
        return None
    entries = {kind: len(keys) for kind, keys in getattr(info, "artifacts", {}).items()} if info else {}
    log.info("compile cache: loaded %s (%d bytes, %s)", path, path.stat().st_size, entries)
    return {"path": str(path), "bytes": path.stat().st_size, "entries": entries}


def write_attachments(directory: Path, files: dict[str, bytes]) -> None:
    """Write `files` ({relative name: bytes}) under `directory`, each through a temp file."""
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
