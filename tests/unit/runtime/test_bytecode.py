"""The libraries' bytecode kept beside torch.compile's cache when the install has none it can keep
(infra/bytecode.py): detected before the imports, written once under the cache, read by the next
start, and nothing changed where the install keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlkube.runtime.infra import bytecode
from rlkube.runtime.infra.bytecode import (
    ENV_BYTECODE_CACHE,
    ENV_DONT_WRITE,
    ENV_PYCACHE_PREFIX,
    share_bytecode_cache,
    use_bytecode_cache,
)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `fakelib` without bytecode, importable from tmp_path/site."""
    site = tmp_path / "site"
    (site / "fakelib").mkdir(parents=True)
    (site / "fakelib" / "__init__.py").write_text("from fakelib.part import VALUE\n")
    (site / "fakelib" / "part.py").write_text("VALUE = 42\n")
    (site / "fakelib" / "worker.py").write_text("ROLE = 'worker'\n")  # imported by a spawned process only
    monkeypatch.syspath_prepend(str(site))
    return site


@pytest.fixture(autouse=True)
def restore_sys(monkeypatch):
    """use_bytecode_cache sets sys.pycache_prefix and sys.dont_write_bytecode: undone after each test."""
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)


def unwritable(folder: Path) -> bool:
    """A site-packages the image's user cannot write (as under a non-root pod), except the cache."""
    return "cache" in folder.parts


def test_a_package_without_bytecode_it_can_write_gets_the_cache(package, tmp_path):
    prefix = use_bytecode_cache(str(tmp_path / "cache"), {}, packages=["fakelib"], writable=unwritable)
    assert prefix == str(tmp_path / "cache" / "pycache")
    assert sys.pycache_prefix == prefix and Path(prefix).is_dir()
    # the processes it starts read and write the same cache
    environ = {ENV_DONT_WRITE: "1", "OTHER": "kept"}
    share_bytecode_cache(prefix, environ)
    assert environ == {ENV_PYCACHE_PREFIX: prefix, "OTHER": "kept"}
    share_bytecode_cache(None, environ := {ENV_DONT_WRITE: "1"})
    assert environ == {ENV_DONT_WRITE: "1"}


def test_bytecode_writing_off_gets_the_cache_and_turns_writing_on_under_it(package, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1
    prefix = use_bytecode_cache(str(tmp_path / "cache"), {}, packages=["fakelib"])
    assert prefix == str(tmp_path / "cache" / "pycache")
    assert sys.dont_write_bytecode is False


@pytest.mark.parametrize("case", ["bytecode beside the source", "writable site-packages", "off", "user prefix",
                                  "no cache folder", "not installed"])
def test_left_alone(case, package, tmp_path, monkeypatch):
    env, writable, packages = {}, unwritable, ["fakelib"]
    if case == "bytecode beside the source":
        pyc = bytecode.beside_source(package / "fakelib" / "__init__.py")
        pyc.parent.mkdir()
        pyc.write_bytes(b"")
    elif case == "writable site-packages":
        writable = lambda folder: True  # noqa: E731
        monkeypatch.setattr(sys, "dont_write_bytecode", False)
    elif case == "off":
        env = {ENV_BYTECODE_CACHE: "0"}
    elif case == "user prefix":
        env = {ENV_PYCACHE_PREFIX: str(tmp_path / "theirs")}
    elif case == "not installed":
        packages = ["no_such_package_here"]
    cache_root = None if case == "no cache folder" else str(tmp_path / "cache")
    assert use_bytecode_cache(cache_root, env, packages=packages, writable=writable) is None
    assert sys.pycache_prefix is None
    assert not (tmp_path / "cache").exists()


def test_the_first_start_writes_the_cache_and_the_next_reads_it(package, tmp_path):
    """Two interpreters with PYTHONDONTWRITEBYTECODE=1, as a container image sets it: the first
    compiles fakelib and writes its bytecode under the cache only, and so does a worker it starts;
    the second reads it (the files are not written again) and nothing is ever written beside the
    sources."""
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import os, subprocess, sys
        from rlkube.runtime.infra.bytecode import share_bytecode_cache, use_bytecode_cache
        prefix = use_bytecode_cache({str(cache)!r}, {{}}, packages=["fakelib"],
                                    writable=lambda folder: "cache" in folder.parts)
        import fakelib
        assert fakelib.VALUE == 42
        share_bytecode_cache(prefix, os.environ)  # as the CLI does before it spawns workers
        subprocess.run([sys.executable, "-c", "import fakelib.worker"], env=os.environ, check=True)
        print(prefix)
    """)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(package), *sys.path]))
    env.pop(ENV_PYCACHE_PREFIX, None)

    def start() -> str:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert start() == str(cache / "pycache")
    written = sorted(p for p in cache.rglob("*.pyc") if "fakelib" in p.parts)
    # the worker, started with PYTHONDONTWRITEBYTECODE dropped, wrote what it compiled there too
    assert {p.name.split(".")[0] for p in written} == {"__init__", "part", "worker"}
    mtimes = [p.stat().st_mtime_ns for p in written]
    start()
    assert [p.stat().st_mtime_ns for p in written] == mtimes
    assert not list(package.rglob("__pycache__"))
