"""The harness's image builder: which files make an image's input hash, and the free disk a build needs."""

import collections
import tempfile

import pytest

from tests.cluster import images
from tests.cluster.images import copy_sources, name_of


def test_copy_sources_skips_stage_copies_and_flags():
    dockerfile = (
        "FROM x\n"
        "COPY --chown=1000 images/smoke/a.py /usr/local/bin/\n"
        "COPY --from=builder /out /out\n"
        'COPY ["runtime", "pyproject.toml", "/src/"]\n'
        "ADD a \\\n  b /dst\n"
    )
    assert copy_sources(dockerfile) == ["images/smoke/a.py", "runtime", "pyproject.toml", "a", "b"]


def test_name_of_accepts_ref_or_name():
    assert name_of("localhost/rlkube/runtime-cpu:dev") == "runtime-cpu"
    assert name_of("smoke") == "smoke"


def test_a_build_is_refused_below_its_free_disk_naming_the_folder_and_what_to_free(monkeypatch, tmp_path):
    usage = collections.namedtuple("usage", "total used free")
    free = {str(tmp_path / "cache"): 40 * 2**30, tempfile.gettempdir(): 3 * 2**30}
    monkeypatch.setattr(images, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(images.shutil, "disk_usage", lambda where: usage(0, 0, free[str(where)]))
    monkeypatch.setattr(images, "storage_args", lambda: ["--root", "/r"])
    images.require_free_disk(2)  # enough everywhere: no error
    with pytest.raises(RuntimeError) as refused:
        images.require_free_disk(16)
    message = str(refused.value)
    assert f"building needs 16 GiB free in {tempfile.gettempdir()};" in message
    assert f"{tempfile.gettempdir()}: 3.0 GiB free" in message and "40.0 GiB free" in message
    assert "buildah --root /r rmi --prune" in message
