"""Prepares the wheels an rlkube image installs, so the image build itself is offline and pinned.

    python images/build_context.py operator         # prints the input hash
    python images/build_context.py runtime-cpu

The build context of images/operator and images/runtime-cpu is the repository root; their
Dockerfiles bind-mount `build/image-wheels/<image>/` (git-ignored), which this script fills.

What goes in:
- rlkube's own wheel, built from this checkout;
- its dependencies for the image's extras (`operator`, or `runtime` and `tracking`), at exactly the versions
  installed in the Python running this script (the project's tested .venv), so an image never
  runs a version the tests did not. They come from the wheel cache ($RLKUBE_CACHE/wheels,
  default ~/.cache/rlkube/wheels; RLKUBE_WHEELS to override); what is missing there is
  downloaded into it once, from the package index pip is configured with.

It also writes `dependencies.txt` (name==version of every third-party wheel) next to the wheels.
The Dockerfiles COPY that file before installing the dependencies in a layer of their own, so
the layer cache keys that layer on the exact pins (torch alone is GBs: a change of rlkube's
sources must not rebuild it), then install rlkube's wheel in a second, small layer.

It prints the input hash (also written to build/image-wheels/<image>.hash): the dependency pins,
the Dockerfile and rlkube's sources, i.e. the image's inputs but the base image, which the
builder (tests/cluster/images.py) adds. Pass it as `--build-arg INPUT_HASH=...`: it keys the
rlkube layer and is recorded as a label.

Wheels are hard-linked into the context when the cache is on the same filesystem (the torch
wheels are ~2.6 GB), else copied.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "images"
# image -> the rlkube extras it installs
EXTRAS = {"operator": "operator", "runtime-cpu": "runtime,tracking"}
# rlkube's build backend, needed to build its wheel offline (pyproject.toml [build-system]).
BUILD_REQUIREMENTS = ("setuptools>=69", "wheel")
SOURCES = ("pyproject.toml", "README.md", "operator", "runtime")


def wheel_cache() -> Path:
    cache = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))
    return Path(os.environ.get("RLKUBE_WHEELS", cache / "wheels"))


def _pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *(["-q"] if quiet else []), "--disable-pip-version-check", *args]
    return subprocess.run(cmd, check=True, text=True, capture_output=True)


def _fill_cache(requirements: list[str], constraints: Path, cache: Path) -> None:
    """Make sure every wheel `requirements` resolve to is in the cache: offline if it can be."""
    common = ["download", "--only-binary=:all:", "-d", str(cache), "--find-links", str(cache),
              "-c", str(constraints), *requirements]
    try:
        _pip(*common, "--no-index")
    except subprocess.CalledProcessError:
        print(f"build_context: fetching missing wheels into {cache}", file=sys.stderr)
        _pip(*common)


def _constraints(path: Path) -> Path:
    """The versions installed in this Python (rlkube itself excluded), as a pip constraints file."""
    frozen = _pip("freeze", "--exclude-editable").stdout.splitlines()
    pins = [line for line in frozen if "==" in line and not line.lower().startswith("rlkube==")]
    path.write_text("\n".join(pins) + "\n")
    return path


def _build_rlkube_wheel(cache: Path, out: Path, constraints: Path) -> Path:
    _fill_cache(list(BUILD_REQUIREMENTS), constraints.with_name("none.txt"), cache)
    _pip("wheel", "--no-deps", "--no-index", "--find-links", str(cache), "-w", str(out), str(REPO))
    (wheel,) = out.glob("rlkube-*.whl")
    return wheel


def _resolved_files(requirement: str, find_links: list[Path], constraints: Path) -> list[tuple[str, Path]]:
    """(name==version, wheel file) of what pip would install for `requirement`, from the given folders only."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        links = [arg for folder in find_links for arg in ("--find-links", str(folder))]
        _pip("install", "--dry-run", "--ignore-installed", "--no-index", *links, "-c", str(constraints),
             "--report", str(report), requirement)
        installs = json.loads(report.read_text())["install"]
    files = []
    for item in installs:
        url = item["download_info"]["url"]
        if not url.startswith("file://"):
            raise RuntimeError(f"build_context: {item['metadata']['name']} resolved to {url}, not a local wheel")
        meta = item["metadata"]
        files.append((f"{meta['name'].lower()}=={meta['version']}", Path(url.removeprefix("file://"))))
    return files


def _replace(dst: Path, write) -> None:
    """Write `dst` through a temporary file and rename it into place, so a build reading the
    folder at the same moment (another session's) never sees it missing or half-written."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, dst)


def _link(src: Path, dst: Path) -> None:
    def write(tmp: Path) -> None:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)

    _replace(dst, write)


def _sync(folder: Path, files: list[Path]) -> None:
    """Make `folder` hold exactly `files` (and dependencies.txt), touching only what changes."""
    wanted = {path.name: path for path in files}
    for name, src in wanted.items():
        dst = folder / name
        # rlkube's wheel is rebuilt every time; third-party wheels of a given name never change.
        if name.startswith("rlkube-") or not dst.exists():
            _link(src, dst)
    for path in folder.iterdir():
        if path.name not in wanted and path.name != "dependencies.txt" and not path.name.startswith("."):
            path.unlink(missing_ok=True)


def _source_snapshot() -> bytes:
    """rlkube's sources as the input hash covers them: every file's path and content."""
    parts = []
    for name in SOURCES:
        root = REPO / name
        paths = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
        for path in paths:
            parts.append(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return b"".join(parts)


def _own_wheel(cache: Path, out: Path, constraints: Path) -> tuple[Path, bytes]:
    """rlkube's wheel and the sources it was built from.

    The checkout may be edited while the wheel builds (several people work in one tree): a wheel
    of the old sources labelled with the hash of the new ones would be cached under that hash
    and served to every later build of the same sources. So the sources are read before and
    after the build, and the wheel is kept only when they did not change meanwhile."""
    for _ in range(3):
        before = _source_snapshot()
        wheel = _build_rlkube_wheel(cache, out, constraints)
        if _source_snapshot() == before:
            return wheel, before
        wheel.unlink()
    raise SystemExit("build_context: rlkube's sources changed during each of 3 wheel builds; run it again "
                     "once the checkout is not being edited")


def wheels_dir(image: str) -> Path:
    """Where the wheels of `image` go: the folder its Dockerfile bind-mounts."""
    return REPO / "build" / "image-wheels" / image


def prepare(image: str) -> str:
    """Fill `build/image-wheels/<image>` (wheels and dependencies.txt); returns the input hash."""
    if image not in EXTRAS:
        raise SystemExit(f"build_context: image must be one of {', '.join(EXTRAS)}, got {image!r}")
    cache = wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    wheels = wheels_dir(image)
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        constraints = _constraints(tmp_path / "constraints.txt")
        (tmp_path / "none.txt").write_text("")
        own, sources = _own_wheel(cache, tmp_path / "own", constraints)
        requirement = f"rlkube[{EXTRAS[image]}] @ {own.as_uri()}"
        _fill_cache([requirement], constraints, cache)
        # pip download also saved the direct-URL rlkube wheel; the cache keeps third-party wheels only.
        for stale in cache.glob("rlkube-*.whl"):
            stale.unlink()
        resolved = _resolved_files(requirement, [cache], constraints)
        _sync(wheels, [path for _, path in resolved])

    deps = sorted(pin for pin, _ in resolved if not pin.startswith("rlkube=="))
    _replace(wheels / "dependencies.txt", lambda tmp: tmp.write_text("".join(f"{pin}\n" for pin in deps)))

    h = hashlib.sha256((wheels / "dependencies.txt").read_bytes())
    h.update((IMAGES / image / "Dockerfile").read_bytes())
    h.update(sources)  # what the wheel was built from, not the checkout as it is now
    digest = h.hexdigest()[:16]
    _replace(wheels.with_suffix(".hash"), lambda tmp: tmp.write_text(digest + "\n"))
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fill build/image-wheels/<image> with the image's wheels.")
    parser.add_argument("image", choices=sorted(EXTRAS))
    args = parser.parse_args(argv)
    print(prepare(args.image))
    return 0


if __name__ == "__main__":
    sys.exit(main())
