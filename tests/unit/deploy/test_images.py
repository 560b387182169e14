"""Lint-level checks of the Dockerfiles in images/ (the GPU runtime image is never built here).

What the cluster and the chart rely on: a BASE_IMAGE build argument before the first FROM (the
harness substitutes its local base), a numeric non-root USER (runAsNonRoot is checked by the
kubelet against the image's numeric user), the entry point the chart or the operator runs, and
offline installs from the bind-mounted wheel folder that images/build_context.py fills.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "images"


def _instructions(name: str) -> list[tuple[str, str]]:
    text = (IMAGES / name / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", ["operator", "runtime", "runtime-cpu", "environment"])
def test_base_image_is_a_build_argument_with_a_public_default(name):
    ins = _instructions(name)
    first_from = next(i for i, (word, _) in enumerate(ins) if word == "FROM")
    args = [rest for word, rest in ins[:first_from] if word == "ARG"]
    assert any(re.fullmatch(r"BASE_IMAGE=\S+", a) for a in args), f"images/{name}: no ARG BASE_IMAGE=<default>"
    assert ins[first_from][1].startswith("${BASE_IMAGE}")


@pytest.mark.parametrize("name", ["operator", "runtime", "runtime-cpu", "environment"])
def test_runs_as_numeric_non_root_user(name):
    users = [rest for word, rest in _instructions(name) if word == "USER"]
    assert users, f"images/{name}: no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"images/{name}: USER {users[-1]} is not a numeric non-root uid"


@pytest.mark.parametrize("name", ["operator", "runtime-cpu"])
def test_cpu_images_install_offline_from_their_wheel_folder_dependencies_first(name):
    ins = _instructions(name)
    runs = [(i, rest) for i, (word, rest) in enumerate(ins) if word == "RUN"]
    assert len(runs) == 2, "one layer of dependencies, one of rlkube"
    for _, run in runs:
        assert f"--mount=type=bind,source=build/image-wheels/{name},target=/wheels" in run
        assert "--no-index" in run
    (deps_at, deps), (own_at, own) = runs
    assert "-r /opt/rlkube-dependencies.txt" in deps and ".whl" not in deps and "rlkube[" not in deps
    assert "--no-deps /wheels/rlkube-*.whl" in own
    # Each layer's cache key holds what it installs: the pins file's content (COPY), the sources'
    # hash (a build ARG; builders key RUN on the ARGs it sees).
    copy_at = ins.index(("COPY", f"build/image-wheels/{name}/dependencies.txt /opt/rlkube-dependencies.txt"))
    args = {rest.split("=")[0]: i for i, (word, rest) in enumerate(ins) if word == "ARG"}
    assert copy_at < deps_at < args["INPUT_HASH"] < own_at


def test_build_context_knows_each_cpu_image_and_its_extra():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_context", IMAGES / "build_context.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.EXTRAS == {"operator": "operator", "runtime-cpu": "runtime,tracking"}
    for name in module.EXTRAS:
        assert module.wheels_dir(name) == REPO / "build" / "image-wheels" / name


def test_gpu_runtime_image_installs_flash_attn_and_the_gpu_extra():
    runs = " ".join(rest for word, rest in _instructions("runtime") if word == "RUN")
    assert "flash-attn" in runs
    assert "[runtime,gpu,tracking]" in runs
    base = next(rest for word, rest in _instructions("runtime") if word == "ARG" and rest.startswith("BASE_IMAGE="))
    assert "cuda" in base


def test_entry_points_match_what_the_chart_and_the_operator_run():
    entry = {name: next(rest for w, rest in _instructions(name) if w == "ENTRYPOINT") for name in
             ("operator", "runtime-cpu", "runtime")}
    assert entry["operator"] == '["rlkube", "operator"]'
    assert entry["runtime-cpu"] == entry["runtime"] == '["python", "-m", "rlkube.runtime"]'


def test_the_reference_environment_is_stdlib_only_and_copies_what_it_runs():
    """images/environment installs nothing: the base's python3 runs the five files it copies (the
    calculator tool is the runtime's own module), and the server imports nothing outside the
    standard library and those files (tools.py's import of the runtime's package is its fallback
    in the repository, where the calculator is not beside it)."""
    ins = _instructions("environment")
    assert not [rest for word, rest in ins if word == "RUN"]
    copied = " ".join(rest for word, rest in ins if word == "COPY")
    paths = [IMAGES / "environment" / name for name in ("server.py", "sandbox.py", "math_check.py", "tools.py")]
    paths.append(IMAGES.parent / "runtime" / "rlkube" / "runtime" / "tools" / "calculator.py")
    assert all(str(path.relative_to(IMAGES.parent)) in copied for path in paths)
    local = {path.stem for path in paths}
    for path in paths:
        imported = set(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(), re.M))
        if path.name == "tools.py":
            imported.discard("rlkube")
        assert imported - local - {"__future__"} <= set(__import__("sys").stdlib_module_names), path.name
