"""Bring the test cluster up or down: `python -m tests.cluster.cluster up|down|status [--mode M]`.

Modes: `control-plane` (etcd, apiserver, controller-manager, scheduler on 127.0.0.1; seconds)
and `full` (that plus two kubelet nodes with their own containerd, the pod bridge, cluster DNS,
node labels and fake `nvidia.com/gpu` capacity). State, logs and the admin kubeconfig live in
/tmp/rlkube-cluster (RLKUBE_CLUSTER_DIR). See docs/cluster.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.cluster"

from tests.cluster import cgroups, controlplane, kind, network, procs  # noqa: E402
from tests.cluster.layout import Layout, default_nodes, kind_state  # noqa: E402

MODES = ("control-plane", "full")


@contextlib.contextmanager
def locked(layout: Layout):
    """Serialize up/down between processes (several test sessions may share one cluster)."""
    lock_path = layout.state.parent / (layout.state.name + ".lock")
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def mode_file(layout: Layout) -> Path:
    return layout.state / "mode"


def backend(layout: Layout) -> str:
    """"kind" for a kind cluster, else "native" (the harness's own processes)."""
    try:
        return (layout.state / "backend").read_text().strip()
    except OSError:
        return "native"


def current_mode(layout: Layout) -> str | None:
    try:
        return mode_file(layout).read_text().strip()
    except OSError:
        return None


def check_ports_free(layout: Layout, mode: str) -> None:
    """Fail fast, naming the port, when another process (another cluster?) holds one of ours."""
    ports = [layout.etcd_client_port, layout.etcd_peer_port, layout.apiserver_port,
             layout.controller_manager_port, layout.scheduler_port]  # fmt: skip
    if mode == "full":
        ports += [p for n in default_nodes() for p in (n.stream_port,)]
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as err:
                raise RuntimeError(f"port 127.0.0.1:{port} is in use ({err.strerror}); another cluster?") from None


def all_alive(layout: Layout) -> bool:
    """Every process the cluster started is still running (a crashed kubelet means: restart)."""
    pidfiles = list((layout.state / "pids").glob("*.pid")) if (layout.state / "pids").exists() else []
    return all(procs.running(layout.state, p.stem) for p in pidfiles)


def up(layout: Layout, mode: str, timeout: float = 240.0) -> dict[str, float]:
    """Start the cluster in `mode`; returns the seconds each stage took."""
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {MODES}, got {mode!r}")
    have = current_mode(layout)
    healthy = have is not None and all_alive(layout) and controlplane.admin_client(layout, timeout=3).healthy()
    if healthy and (have == mode or (have == "full" and mode == "control-plane")):
        return {}
    if healthy and have == "control-plane" and mode == "full":
        # Add the nodes to the running control plane: whoever uses it keeps their cluster.
        from tests.cluster import nodes

        t0 = time.monotonic()
        nodes.start(layout, default_nodes(), timeout=timeout)
        mode_file(layout).write_text(mode + "\n")
        return {"nodes_s": round(time.monotonic() - t0, 1), "total_s": round(time.monotonic() - t0, 1)}
    if have is not None or layout.state.exists():
        down(layout)  # a half-started, killed or other-mode cluster: start clean
    timings: dict[str, float] = {}
    layout.state.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if kind.selected():
        try:
            return kind.up(layout, timeout)
        except BaseException:
            if os.environ.get("RLKUBE_KEEP_CLUSTER") != "1":
                kind.down(layout)
            raise
    try:
        check_ports_free(layout, mode)
        controlplane.start(layout, timeout=timeout)
        timings["control_plane_s"] = round(time.monotonic() - t0, 1)
        if mode == "full":
            from tests.cluster import nodes

            t1 = time.monotonic()
            nodes.start(layout, default_nodes(), timeout=timeout)
            timings["nodes_s"] = round(time.monotonic() - t1, 1)
    except BaseException:
        # Leave nothing half-started behind (RLKUBE_KEEP_CLUSTER=1 keeps it, to poke at).
        if os.environ.get("RLKUBE_KEEP_CLUSTER") == "1":
            print(f"cluster-up failed; kept as is, logs in {layout.state / 'logs'}", file=sys.stderr)
        else:
            down(layout)
            print(f"cluster-up failed; stopped what had started, logs in {logs_kept(layout)}", file=sys.stderr)
        raise
    mode_file(layout).write_text(mode + "\n")
    timings["total_s"] = round(time.monotonic() - t0, 1)
    return timings


def logs_kept(layout: Layout) -> Path:
    """Where `down` leaves a copy of the logs: /tmp/rlkube-cluster-logs for the default state dir."""
    return layout.state.parent / f"{layout.state.name}-logs"


def down(layout: Layout, *, keep_logs: bool = True) -> dict[str, object]:
    """Stop everything the cluster started, unmount, remove its network and state. Idempotent."""
    t0 = time.monotonic()
    if backend(layout) == "kind":
        kind.down(layout)
        return {"stopped": 0, "unmounted": 0, "left_running": [], "seconds": round(time.monotonic() - t0, 1)}
    if (layout.state / "nodes").exists():
        from tests.cluster import nodes

        nodes.stop_containers(layout)
    node_names = sorted(p.name for p in (layout.state / "nodes").glob("*")) if (layout.state / "nodes").exists() else []
    signalled = procs.stop_all(layout.state)
    # Containers outlive a killed containerd and its shims; their cgroups still name the node.
    containers = cgroups.kill_and_remove(layout, node_names)
    mounts = network.unmount_under(layout.state)
    network.bridge_down(layout)
    left = procs.stray_pids(layout.state) if layout.state.exists() else []
    if keep_logs and (layout.state / "logs").exists():
        shutil.rmtree(logs_kept(layout), ignore_errors=True)
        shutil.copytree(layout.state / "logs", logs_kept(layout))
    shutil.rmtree(layout.state, ignore_errors=True)
    return {
        "stopped": len(signalled),
        "containers_killed": containers,
        "unmounted": len(mounts),
        "left_running": left,
        "seconds": round(time.monotonic() - t0, 1),
    }


def status(layout: Layout) -> dict[str, object]:
    info: dict[str, object] = {"state": str(layout.state), "mode": current_mode(layout)}
    info["processes"] = {
        p.stem: procs.running(layout.state, p.stem) for p in sorted((layout.state / "pids").glob("*.pid"))
    } if (layout.state / "pids").exists() else {}
    info["apiserver_ready"] = layout.kubeconfig.exists() and controlplane.admin_client(layout, 3).healthy()
    info["kubeconfig"] = str(layout.kubeconfig)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--mode", choices=MODES, default="full")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per readiness wait")
    args = parser.parse_args(argv)
    layout = Layout()
    if args.command == "up":
        with locked(layout):
            timings = up(layout, args.mode, args.timeout)
        print(json.dumps({"mode": args.mode, "kubeconfig": str(layout.kubeconfig), **timings}))
    elif args.command == "down":
        with locked(layout):
            result = down(layout)
        if kind_state().exists() and layout.state != kind_state():  # a kind cluster left by RLKUBE_CLUSTER=kind
            kind_layout = Layout(state=kind_state())
            with locked(kind_layout):
                down(kind_layout)
        print(json.dumps(result))
        if result["left_running"]:
            print(f"cluster-down: processes still running: {result['left_running']}", file=sys.stderr)
            return 1
    else:
        print(json.dumps(status(layout), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
