"""A Docker engine for the kind path, started and stopped by the project: `python3
tests/cluster/docker_engine.py up|down|status`.

Where no engine runs, `up` installs Debian's docker.io if dockerd is missing
(kindpath/install-docker.sh) and starts dockerd with its own socket, exec root and data root, so
it shares nothing with a system engine or with the harness's containerds:

- `iptables: false`, `ip-forward: false`, `ip-masq: false`, no default bridge: the engine adds no
  iptables rules and never touches the host's FORWARD policy (dockerd's defaults turn IP forwarding
  on and set the policy to DROP, which broke the harness cluster's cross-node traffic). kind's
  nodes talk over one Docker bridge (layer 2, no forwarding); the API server's published port
  goes through Docker's userland proxy on 127.0.0.1.
- runc-caps (tests/cluster/go/runc-caps) is the default runtime: it drops the capabilities this
  machine's bounding set lacks before runc runs, so `--privileged` kind nodes start.

The host's firewall (iptables/ip6tables rules, the FORWARD policy, ip_forward) is recorded before
the engine starts; `down` removes every container and network of the engine, stops it, unmounts
what it left, puts back a FORWARD policy or ip_forward that changed, and returns what still
differs from the record (an empty list when the host is as found). An engine that was already
running is used as it is and never stopped.

State: /tmp/rlkube-docker (RLKUBE_DOCKER_DIR); images: ~/.cache/rlkube/docker
(RLKUBE_DOCKER_ROOT; it survives `down`, so a warm rerun loads nothing twice).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))


def state_dir() -> Path:
    return Path(os.environ.get("RLKUBE_DOCKER_DIR", "/tmp/rlkube-docker"))


def data_root() -> Path:
    return Path(os.environ.get("RLKUBE_DOCKER_ROOT", CACHE / "docker"))


def socket_path() -> Path:
    return state_dir() / "docker.sock"


def docker_cli() -> str:
    for p in ("/usr/bin/docker", shutil.which("docker")):
        if p and os.access(p, os.X_OK):
            return p
    raise RuntimeError("no docker CLI: run tests/cluster/kindpath/install-docker.sh")


def _info_ok(env: dict[str, str]) -> bool:
    try:
        cli = docker_cli()
    except RuntimeError:
        return False
    r = subprocess.run([cli, "info", "--format", "{{.ID}}"], env=env, capture_output=True, timeout=20)
    return r.returncode == 0


def ours_running() -> bool:
    pid = _pid()
    return pid is not None and _alive(pid)


def env() -> dict[str, str]:
    """The environment under which `docker` and `kind` reach the engine the kind path uses."""
    e = dict(os.environ)
    if ours_running() or "DOCKER_HOST" not in e and not _info_ok(e):
        e["DOCKER_HOST"] = f"unix://{socket_path()}"
    return e


def _pid() -> int | None:
    try:
        return int((state_dir() / "engine.pid").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie or a recycled pid is not our dockerd
        return "dockerd" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def firewall() -> dict[str, object]:
    """The host state the engine must leave as found."""
    snap: dict[str, object] = {"ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        rules = subprocess.run([tool, "-w", "-S"], capture_output=True, text=True).stdout.splitlines()
        snap[tool] = sorted(rules)
        nat = subprocess.run(
            [tool, "-w", "-t", "nat", "-S"], capture_output=True, text=True
        ).stdout.splitlines()
        snap[tool + "-nat"] = sorted(nat)
    return snap


def forward_policy(snap: dict[str, object], tool: str = "iptables") -> str | None:
    for line in snap.get(tool, []):  # type: ignore[union-attr]
        if line.startswith("-P FORWARD "):
            return line.split()[2]
    return None


def runc_caps() -> Path:
    subprocess.run([str(HERE / "kind-bins.sh"), "runc-caps"], check=True, capture_output=True)
    built = sorted((CACHE / "bin").glob("runc-caps-*/runc-caps"), key=lambda p: p.stat().st_mtime)
    if not built:
        raise RuntimeError("kind-bins.sh runc-caps built nothing")
    return built[-1]


def daemon_config() -> dict[str, object]:
    st = state_dir()
    return {
        "hosts": [f"unix://{socket_path()}"],
        "data-root": str(data_root()),
        "exec-root": str(st / "exec"),
        "pidfile": str(st / "dockerd.pid"),
        "iptables": False,
        "ip6tables": False,
        "ip-forward": False,
        "ip-masq": False,
        "bridge": "none",
        "userland-proxy": True,
        "storage-driver": "overlay2",
        "runtimes": {"rlkube-runc": {"path": str(runc_caps())}},
        "default-runtime": "rlkube-runc",
        "log-driver": "json-file",
        "features": {"buildkit": False},
    }


def up(timeout: float = 60.0) -> dict[str, str]:
    """Start the project's engine unless an engine already answers; returns env()."""
    if ours_running() or _info_ok(dict(os.environ)):
        return env()
    if shutil.which("dockerd") is None:
        subprocess.run([str(HERE / "kindpath" / "install-docker.sh")], check=True)
    st = state_dir()
    st.mkdir(parents=True, exist_ok=True)
    data_root().mkdir(parents=True, exist_ok=True)
    if not (st / "firewall.json").exists():  # the record of a half-stopped engine stays the record
        (st / "firewall.json").write_text(json.dumps(firewall()))
    (st / "daemon.json").write_text(json.dumps(daemon_config(), indent=1))
    log = open(st / "dockerd.log", "ab")
    proc = subprocess.Popen(["dockerd", "--config-file", str(st / "daemon.json")], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    (st / "engine.pid").write_text(f"{proc.pid}\n")  # dockerd writes its own dockerd.pid later
    e = dict(os.environ, DOCKER_HOST=f"unix://{socket_path()}")
    deadline = time.monotonic() + timeout
    while not _info_ok(e):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (st / "dockerd.log").read_text(errors="replace")[-2000:]
            down()
            raise RuntimeError(f"dockerd did not come up (see {st / 'dockerd.log'}):\n{tail}")
        time.sleep(0.5)
    return e


def _docker(e: dict[str, str], *args: str) -> list[str]:
    r = subprocess.run([docker_cli(), *args], env=e, capture_output=True, text=True, timeout=120)
    return r.stdout.split()


def _unmount_under(*roots: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted(mounts, key=len, reverse=True):
        if any(m == str(r) or m.startswith(str(r) + "/") for r in roots):
            subprocess.run(["umount", "-l", m], capture_output=True)


def down(timeout: float = 60.0) -> list[str]:
    """Stop the project's engine and everything it ran; returns what differs from the host as
    found (empty: as found). Does nothing to an engine the project did not start."""
    st = state_dir()
    pid = _pid()
    if pid is not None and _alive(pid):
        e = dict(os.environ, DOCKER_HOST=f"unix://{socket_path()}")
        containers = _docker(e, "ps", "-aq")
        if containers:
            _docker(e, "rm", "-f", "-v", *containers)
        for net in _docker(e, "network", "ls", "--filter", "type=custom", "-q"):
            _docker(e, "network", "rm", net)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    _unmount_under(st / "exec", data_root())
    diff: list[str] = []
    record = st / "firewall.json"
    if record.exists():
        diff = restore(json.loads(record.read_text()))
    shutil.rmtree(st, ignore_errors=True)
    return diff


def restore(before: dict[str, object]) -> list[str]:
    """Put back the FORWARD policies and ip_forward of `before`; returns what still differs."""
    now = firewall()
    for tool in ("iptables", "ip6tables"):
        want, have = forward_policy(before, tool), forward_policy(now, tool)
        if want and have and want != have:
            subprocess.run([tool, "-w", "-P", "FORWARD", want], check=True)
    if now["ip_forward"] != before["ip_forward"]:
        Path("/proc/sys/net/ipv4/ip_forward").write_text(str(before["ip_forward"]))
    return compare(before, firewall())


def compare(before: dict[str, object], after: dict[str, object]) -> list[str]:
    diff = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        if isinstance(b, list) and isinstance(a, list):
            diff += [f"{key}: added {r}" for r in a if r not in b] + [
                f"{key}: removed {r}" for r in b if r not in a
            ]
        elif b != a:
            diff.append(f"{key}: {b!r} -> {a!r}")
    return diff


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "up":
        e = up()
        print(f"export DOCKER_HOST={e.get('DOCKER_HOST', '')}")
    elif cmd == "down":
        diff = down()
        print("host firewall as found" if not diff else "\n".join(["differs from the record:", *diff]))
        return 1 if diff else 0
    elif cmd == "status":
        print("project engine running" if ours_running() else "project engine stopped")
    else:
        print("usage: docker_engine.py up|down|status", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
