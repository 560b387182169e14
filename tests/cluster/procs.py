"""Background processes of the cluster: started with a pidfile and a log, stopped for sure.

Every process runs in its own session (so it survives the shell that started it and can be
killed as a group) with stdout and stderr in `<state>/logs/<name>.log` and its pid in
`<state>/pids/<name>.pid`. `stop_all` kills by pidfile first, then sweeps /proc for anything
whose command line or root directory is under the state directory: shims, containers and pause
processes of a run that was killed before it could clean up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .api import ProcessExited


def start(state: Path, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> int:
    """Start `argv` detached; returns its pid. Refuses if a live process already holds the name."""
    pids, logs = state / "pids", state / "logs"
    pids.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    pid = read_pid(state, name)
    if pid and alive(pid):
        raise RuntimeError(f"{name} is already running (pid {pid}); run `make cluster-down` first")
    log = open(logs / f"{name}.log", "ab")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        log.close()
    (pids / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def read_pid(state: Path, name: str) -> int | None:
    try:
        return int((state / "pids" / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def running(state: Path, name: str) -> bool:
    pid = read_pid(state, name)
    return bool(pid and alive(pid))


def check_alive(state: Path, *names: str) -> None:
    """Raise ProcessExited, with its last log lines, for the first named process that has died."""
    for name in names:
        if not running(state, name):
            raise ProcessExited(f"{name} exited; last log lines:\n{log_tail(state, name)}")


def log_tail(state: Path, name: str, lines: int = 25) -> str:
    try:
        text = (state / "logs" / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def owned(state: Path, pid: int) -> bool:
    """Whether `pid` is still the process we started: every harness command line names the state dir."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return str(state.resolve()) in cmd


def stop(state: Path, name: str, *, grace: float = 10.0) -> None:
    """SIGTERM the named process's group, SIGKILL after `grace` seconds."""
    pid = read_pid(state, name)
    if pid and alive(pid) and owned(state, pid):
        _terminate([pid], grace, group=True)
    (state / "pids" / f"{name}.pid").unlink(missing_ok=True)


def stray_pids(state: Path) -> list[int]:
    """Processes that belong to the cluster in `state` by command line, cwd or root directory."""
    prefix = str(state.resolve()) + "/"
    me = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            root = os.readlink(entry / "root")
        except OSError:
            continue
        if root.startswith(prefix) or (prefix in cmd and not _is_observer(cmd)):
            found.append(int(entry.name))
    return found


def _is_observer(cmd: str) -> bool:
    # A shell or pager that merely mentions the directory (tail -f of a log, an editor) is not ours.
    first = os.path.basename(cmd.split(" ", 1)[0])
    return first in {"tail", "less", "cat", "grep", "vim", "vi", "nano", "bash", "sh", "python", "python3"}


def stop_all(state: Path, *, grace: float = 3.0) -> list[int]:
    """Stop every pidfile process, then every stray; returns the pids that were signalled."""
    pids = []
    for pidfile in sorted((state / "pids").glob("*.pid")) if (state / "pids").exists() else []:
        try:
            pids.append(int(pidfile.read_text().strip()))
        except ValueError:
            pass
    pids = [p for p in pids if alive(p) and owned(state, p)]
    _terminate(pids, grace, group=True)
    strays = [p for p in stray_pids(state) if alive(p)]
    _terminate(strays, 3.0, group=False)
    for pidfile in (state / "pids").glob("*.pid") if (state / "pids").exists() else []:
        pidfile.unlink(missing_ok=True)
    return pids + strays


def _terminate(pids: list[int], grace: float, *, group: bool) -> None:
    def send(sig: int) -> None:
        for pid in pids:
            try:
                if group:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    if any(alive(p) for p in pids):
        send(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
