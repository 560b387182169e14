"""The harness's image builder: which files make an image's input hash."""

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
