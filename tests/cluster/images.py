"""Container images without Docker: buildah builds `images/<name>/Dockerfile`, containerd loads it.

Every image is built FROM the local Debian base (`images/base/build.sh`, debootstrap) by passing
`--build-arg BASE_IMAGE=localhost/rlkube/base:bookworm`, with `--isolation chroot` (no daemon)
and buildah's overlay storage driver where the kernel mounts overlayfs, else vfs (see
storage_driver). The build context is the
repository root, so a Dockerfile can COPY the project's source. The result is saved as a
docker-archive under ~/.cache/rlkube/images/<name>-<hash>.tar, where the hash covers the
Dockerfile, every file its COPY/ADD lines name, the build args and the base image's own hash:
same inputs, no rebuild. Loading imports that archive into each node's containerd (namespace
k8s.io) as `localhost/rlkube/<name>:dev`; pods use `imagePullPolicy: Never`.

`pause` is special: the sandbox image is a tiny Go program (images/pause/pause.go) compiled
here and put in an image FROM scratch, so no registry is needed for pod sandboxes either.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
CACHE = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))
BASE_IMAGE = "localhost/rlkube/base:bookworm"
SKIP_DIRS = {"__pycache__", ".venv", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"}


@dataclass(frozen=True)
class ImageArchive:
    ref: str  # localhost/rlkube/<name>:dev
    path: Path  # docker-archive tarball
    input_hash: str


def _overlay_works() -> bool:
    """Whether this kernel mounts overlayfs on the cache's filesystem (as root)."""
    probe = Path(tempfile.mkdtemp(prefix=".overlay-probe-", dir=CACHE))
    try:
        for d in ("lower", "upper", "work", "merged"):
            (probe / d).mkdir()
        opts = f"lowerdir={probe / 'lower'},upperdir={probe / 'upper'},workdir={probe / 'work'}"
        ok = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(probe / "merged")],
                            capture_output=True).returncode == 0  # fmt: skip
        if ok:
            subprocess.run(["umount", str(probe / "merged")], capture_output=True)
        return ok
    finally:
        shutil.rmtree(probe, ignore_errors=True)


@functools.cache
def storage_driver() -> str:
    """overlay where the kernel allows it, else vfs (RLKUBE_BUILDAH_DRIVER overrides).

    vfs needs no kernel support but stores every layer as a full copy: with `--layers` the
    runtime-cpu image took 22 GB of it, and a small image took 25 s instead of 1 s.
    """
    forced = os.environ.get("RLKUBE_BUILDAH_DRIVER")
    if forced:
        return forced
    CACHE.mkdir(parents=True, exist_ok=True)
    return "overlay" if _overlay_works() else "vfs"


def storage_env() -> dict[str, str]:
    """Where buildah keeps images, one storage root per driver (buildah cannot mix them)."""
    driver = storage_driver()
    default_root = CACHE / "buildah" / ("storage" if driver == "vfs" else driver)
    return {
        "BUILDAH_ROOT": os.environ.get("BUILDAH_ROOT", str(default_root)),
        "BUILDAH_RUNROOT": os.environ.get("BUILDAH_RUNROOT", f"/run/rlkube-buildah-{driver}"),
        "BUILDAH_DRIVER": driver,
    }


def storage_args() -> list[str]:
    env = storage_env()
    return ["--root", env["BUILDAH_ROOT"], "--runroot", env["BUILDAH_RUNROOT"], "--storage-driver", env["BUILDAH_DRIVER"]]


def ref_for(name: str) -> str:
    return f"localhost/rlkube/{name}:dev"


def name_of(ref_or_name: str) -> str:
    """`localhost/rlkube/runtime-cpu:dev` or `runtime-cpu` -> `runtime-cpu`."""
    m = re.fullmatch(r"(?:localhost/rlkube/)?([a-z0-9][a-z0-9._-]*)(?::dev)?", ref_or_name)
    if not m:
        raise ValueError(f"image {ref_or_name!r}: expected localhost/rlkube/<name>:dev or <name>")
    return m.group(1)


def _hash_tree(h: hashlib._Hash, path: Path) -> None:
    if path.is_file():
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
        return
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for f in sorted(files):
            if f.endswith((".pyc", ".tar")):
                continue
            p = Path(root, f)
            h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")


def copy_sources(dockerfile: str) -> list[str]:
    """Source paths of the COPY/ADD lines of a Dockerfile (not `--from=` stage copies)."""
    sources: list[str] = []
    joined = re.sub(r"\\\n", " ", dockerfile)
    for line in joined.splitlines():
        words = line.strip().split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]) or len(args) < 2:
            continue
        if args[0].startswith("["):  # JSON form
            args = re.findall(r'"([^"]+)"', line)
        sources.extend(args[:-1])
    return sources


def base_hash() -> str:
    out = subprocess.run(
        ["buildah", *storage_args(), "inspect", "--type", "image", "--format",
         '{{index .ImageAnnotations "rlkube.io/input-hash"}}', BASE_IMAGE],
        capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip() if out.returncode == 0 else ""


def ensure_base() -> str:
    """Build (or find cached) the debootstrap base image; returns its input hash."""
    subprocess.run([str(IMAGES / "base" / "build.sh")], check=True,
                   env={**os.environ, "RLKUBE_CACHE": str(CACHE), **storage_env()})  # fmt: skip
    return base_hash()


def input_hash(name: str, build_args: dict[str, str], base: str) -> str:
    folder = IMAGES / name
    dockerfile = (folder / "Dockerfile").read_text()
    h = hashlib.sha256()
    h.update(dockerfile.encode())
    h.update(repr(sorted(build_args.items())).encode() + base.encode())
    for src in copy_sources(dockerfile):
        for p in sorted(REPO.glob(src)) if any(c in src for c in "*?[") else [REPO / src]:
            if p.exists():
                _hash_tree(h, p)
    _hash_tree(h, folder)
    return h.hexdigest()[:16]


def wheel_images() -> set[str]:
    """Images whose Dockerfile installs wheels that images/build_context.py puts in the context."""
    text = (IMAGES / "build_context.py").read_text() if (IMAGES / "build_context.py").exists() else ""
    m = re.search(r"^EXTRAS\s*=\s*\{([^}]*)\}", text, re.M)
    return set(re.findall(r'"([a-z0-9-]+)"\s*:', m.group(1))) if m else set()


def prepare_wheels(name: str) -> str:
    """Run images/build_context.py for `name` with the project's venv; returns its input hash.

    It pins the image to the versions installed in the venv the tests ran with, so it must run
    with that Python, not with whichever one runs the harness.
    """
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.exists() else sys.executable
    proc = subprocess.run([python, str(IMAGES / "build_context.py"), name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"images/build_context.py {name} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _build_pause(context: Path) -> None:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(context / "pause"), "pause.go"],
                   cwd=IMAGES / "pause", check=True, env=env)  # fmt: skip


# Free disk a build needs, in GiB: the image in buildah's storage, its archive in the temporary
# folder, and the node imports after it. runtime-cpu carries torch's CUDA libraries (~5 GB).
BUILD_FREE_GIB = {"runtime-cpu": 16, "operator": 3}


def free_bytes() -> dict[str, int]:
    """Free bytes where a build writes: the cache and the temporary folder."""
    CACHE.mkdir(parents=True, exist_ok=True)
    return {where: shutil.disk_usage(where).free for where in sorted({str(CACHE), tempfile.gettempdir()})}


def disk_report() -> str:
    return "free disk:\n" + "\n".join(f"  {where}: {free / 2**30:.1f} GiB free" for where, free in free_bytes().items())


def require_free_disk(gib: float) -> None:
    """Refuse to start a build that would run the disk full half-way (and leave nodes tainted)."""
    short = [where for where, free in free_bytes().items() if free < gib * 2**30]
    if short:
        raise RuntimeError(
            f"building needs {gib} GiB free in {', '.join(short)}; {disk_report()}\n"
            f"  free some (old clones or scratch folders under {tempfile.gettempdir()}, "
            f"`buildah {' '.join(storage_args())} rmi --prune`) and run again"
        )


def build(name: str, build_args: dict[str, str] | None = None) -> ImageArchive:
    """Build `images/<name>` (unless its archive for the same inputs is cached).

    One build of an image at a time on the machine: the wheel context of images/build_context.py
    and the buildah tag are shared, so a second builder waits for the first (then usually finds
    the archive cached).
    """
    (CACHE / "images").mkdir(parents=True, exist_ok=True)
    with open(CACHE / "images" / f".{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(name, build_args)


def _build_locked(name: str, build_args: dict[str, str] | None) -> ImageArchive:
    folder = IMAGES / name
    if not (folder / "Dockerfile").exists():
        raise FileNotFoundError(f"images/{name}/Dockerfile does not exist")
    args = dict(build_args or {})
    base = ""
    if name != "pause":
        base = ensure_base()
        args.setdefault("BASE_IMAGE", BASE_IMAGE)
    if name in wheel_images():
        args["INPUT_HASH"] = prepare_wheels(name)
    digest = input_hash(name, args, base)
    archive = CACHE / "images" / f"{name}-{digest}.tar"
    ref = ref_for(name)
    if archive.exists():
        return ImageArchive(ref, archive, digest)
    archive.parent.mkdir(parents=True, exist_ok=True)
    require_free_disk(BUILD_FREE_GIB.get(name, 2))
    with tempfile.TemporaryDirectory(prefix=f"rlkube-image-{name}-") as tmp:
        context = REPO
        if name == "pause":
            context = Path(tmp)
            _build_pause(context)
        # Step caching (--layers) only where layers are cheap: with vfs every cached step is a
        # full copy of the filesystem (the runtime-cpu image is 4.7 GB).
        layers = ["--layers"] if storage_driver() != "vfs" else []
        cmd = ["buildah", *storage_args(), "bud", "--isolation", "chroot", *layers,
               "-f", str(folder / "Dockerfile"), "-t", ref]  # fmt: skip
        for k, v in sorted(args.items()):
            cmd += ["--build-arg", f"{k}={v}"]
        proc = subprocess.run([*cmd, str(context)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"buildah bud images/{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        tmp_archive = Path(tmp) / "image.tar"
        proc = subprocess.run(["buildah", *storage_args(), "push", "--quiet", ref, f"docker-archive:{tmp_archive}:{ref}"],
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"buildah push {ref} to {tmp_archive} failed:\n{proc.stderr[-3000:]}\n{disk_report()}")
        if storage_driver() == "vfs":
            # The archive holds the image now; its vfs copy in buildah's storage is only disk.
            subprocess.run(["buildah", *storage_args(), "rmi", ref], capture_output=True)
        else:
            # The tag moved to the new image; the one it left is untagged and only disk (5 GB for
            # runtime-cpu). Layers the new image shares, the cached dependency step, stay.
            subprocess.run(["buildah", *storage_args(), "rmi", "--prune"], capture_output=True)
        for old in archive.parent.glob(f"{name}-*.tar"):
            if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}\.tar", old.name):
                old.unlink()  # one cached archive per image: the newest inputs
        shutil.move(str(tmp_archive), archive)
    return ImageArchive(ref, archive, digest)


def load(layout, nodes, image: ImageArchive) -> None:
    """Import the archive into every node's containerd, skipping nodes that already have it."""
    if (layout.state / "backend").exists() and (layout.state / "backend").read_text().strip() == "kind":
        from .kind import load_image  # a kind cluster's nodes are containers: `kind load`

        return load_image(layout, image)
    from .nodes import ctr  # local: nodes imports this module

    for node in nodes:
        # Next to the node's persistent containerd root: both survive cluster-down together.
        marker = layout.node_cache(node) / "images" / f"{name_of(image.ref)}.hash"
        if marker.exists() and marker.read_text() == image.input_hash:
            if image.ref in ctr(layout, node, "images", "ls", "-q", check=False).stdout.split():
                continue
        proc = ctr(layout, node, "images", "import", "--no-unpack=false", str(image.path), check=False)
        if proc.returncode != 0:
            # The node's root is kept between clusters, and an earlier image of this name can
            # leave it holding a snapshot chain it cannot extend ("parent snapshot ... does not
            # exist", seen once the runtime image's inputs changed). Drop the image, let
            # containerd collect what only it held, and import the archive whole once more.
            ctr(layout, node, "images", "rm", "--sync", image.ref, check=False)
            proc = ctr(layout, node, "images", "import", "--no-unpack=false", str(image.path), check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"loading {image.ref} into {node.name} failed: {proc.stderr.strip()}")
        _drop_layer_blobs(layout, node, image.ref)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(image.input_hash)


def _drop_layer_blobs(layout, node, ref: str) -> None:
    """Delete the image's layer tarballs from the node's content store once they are unpacked.

    Containers start from the unpacked snapshots; the blobs would only double the disk an image
    takes per node (the runtime-cpu image is 4.7 GB). This is what containerd's
    `discard_unpacked_layers` does for pulled images; imports have no such switch.
    """
    from .nodes import ctr

    listing = ctr(layout, node, "images", "ls", check=False).stdout.splitlines()
    digest = next((line.split()[2] for line in listing[1:] if line.split() and line.split()[0] == ref), None)
    if digest is None:
        return
    manifest = json.loads(ctr(layout, node, "content", "get", digest).stdout)
    for layer in manifest.get("layers", []):
        ctr(layout, node, "content", "rm", layer["digest"], check=False)
