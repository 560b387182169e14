"""The kind path's Docker engine leaves the host as it found it (issue 19).

Starts the project's engine (tests/cluster/docker_engine.py), checks that the host's FORWARD
policy and ip_forward did not change while it runs, runs a `--privileged` container (what a kind
node is; it needs the runc-caps wrapper on this machine) on a network of its own, then stops the
engine and checks that no dockerd, container, network bridge, mount or iptables rule is left and
that the firewall is as recorded. Needs root and the cluster lock (`make kind-teardown-test`).
About 10 s with the pause image cached.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cluster import docker_engine, images

NET = "rlkube-teardown-test"


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [m.split()[1] for m in lines if m.split()[1].startswith(str(root))]


def test_engine_up_down_leaves_host_as_found():
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd, iptables)")
    if docker_engine.ours_running():
        pytest.fail(f"the project's engine already runs ({docker_engine.state_dir()}): stop it first")
    if "DOCKER_HOST" in os.environ or docker_engine._info_ok(dict(os.environ)):
        pytest.skip("another Docker engine runs here; the project would use it, not start its own")
    pause = images.build("pause")
    before, links = docker_engine.firewall(), _links()
    env = docker_engine.up()
    try:
        assert docker_engine.forward_policy(docker_engine.firewall()) == docker_engine.forward_policy(before)
        assert docker_engine.firewall()["ip_forward"] == before["ip_forward"]
        docker = [docker_engine.docker_cli()]
        run = lambda *a: subprocess.run([*docker, *a], env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
        assert run("load", "-i", str(pause.path)).returncode == 0
        assert run("network", "create", "--driver", "bridge", NET).returncode == 0
        started = run("run", "-d", "--privileged", "--network", NET, "--name", "teardown-probe", pause.ref)
        assert started.returncode == 0, started.stderr
        state = run("inspect", "-f", "{{.State.Running}} {{.HostConfig.Privileged}}", "teardown-probe")
        assert state.stdout.split() == ["true", "true"], state.stderr
        assert _links() - links, "the test network should have made a bridge"
    finally:
        diff = docker_engine.down()
    assert diff == [], f"host firewall differs after down: {diff}"
    assert not docker_engine.ours_running()
    assert _links() - links == set(), f"interfaces left behind: {_links() - links}"
    assert _mounts_under(docker_engine.state_dir()) == []
    assert _mounts_under(docker_engine.data_root() / "overlay2") == []
    left = subprocess.run(["pgrep", "-f", f"containerd.*{docker_engine.state_dir()}"], capture_output=True)
    assert left.returncode == 1, f"processes of the engine left: {left.stdout!r}"
