"""Sandboxed execution of untrusted Python for code rewards. Stdlib only.

What it enforces, and how (docs/environments.md says the same):
- a child process, never the server: `python -I` (isolated: no site, no user paths, no
  PYTHON* variables), an empty environment, a fresh temporary working directory;
- not root: the child runs as the server's user (uid 1000 in the environment's pod, which also
  runs with no capabilities, no privilege escalation, seccomp RuntimeDefault and a read-only root
  filesystem); a server started as root drops the child to uid/gid 65534;
- resource limits (`resource.setrlimit`, set in the child before it runs anything): CPU seconds
  (RLIMIT_CPU; SIGXCPU, then SIGKILL at the hard limit), address space (RLIMIT_AS), file size
  (RLIMIT_FSIZE), open files (RLIMIT_NOFILE), no core dumps;
- a wall-clock timeout: the child's whole process group is SIGKILLed when it passes it (a sleep
  or a blocked read spends no CPU time);
- no network, two layers: the child first tries to enter a network namespace of its own
  (unshare(CLONE_NEWUSER | CLONE_NEWNET): only a loopback that is down); where the kernel or the
  seccomp profile refuses that (containerd's RuntimeDefault does for a pod without
  CAP_SYS_ADMIN), that layer is absent. In every case an audit hook (PEP 578), installed before
  the untrusted code is compiled, refuses socket creation, connect, bind, getaddrinfo, new
  processes (subprocess, os.system, exec, spawn, fork) and loading native code (ctypes). An audit
  hook is a guard inside the interpreter, not a kernel boundary: code that reaches native code
  some other way could get past it, which is why the process limits, the non-root user and the
  pod's own restrictions sit around it. `SandboxResult.network_namespace` says whether the
  namespace layer was in place.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
NOBODY = 65534
OUTPUT_LIMIT = 64 * 1024  # bytes of stdout/stderr kept

# Runs in the child before the untrusted code (passed on stdin's first part: see run_python).
_GUARD = r'''
import sys
_BLOCKED = ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
            "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
            "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "_posixsubprocess")
def _guard(event, args):
    if event.startswith(_BLOCKED) or (event == "import" and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_guard)
del _guard
_code = sys.stdin.read()
exec(compile(_code, "<solution>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 2
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * 1024 * 1024
    file_bytes: int = 1024 * 1024
    open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # None: killed at the wall-clock timeout
    stdout: str
    stderr: str
    timed_out: bool
    network_namespace: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _enter_network_namespace() -> bool:
    """unshare a user and a network namespace (no interface but a downed loopback); False where refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        return False


def _child_setup(limits: SandboxLimits, netns_flag: str) -> None:
    """In the child, between fork and exec: its own process group, the limits, a non-root user, no network."""
    os.setsid()
    cpu = limits.cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    if _enter_network_namespace():
        with open(netns_flag, "w") as out:
            out.write("1")


def interpreter() -> str:
    """The child's Python: SANDBOX_PYTHON, else the system's /usr/bin/python3 (one every user may
    run: a root server's child runs as 65534), else this one."""
    chosen = os.environ.get("SANDBOX_PYTHON")
    if chosen:
        return chosen
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` in the sandbox; its stdout, stderr, exit code, and whether it hit the wall clock."""
    with tempfile.TemporaryDirectory(prefix="sandbox-") as work:
        os.chmod(work, 0o777)  # the child may run as another user (a root server drops to 65534)
        flag = os.path.join(work, ".netns")
        proc = subprocess.Popen(
            [interpreter(), "-I", "-c", _GUARD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=work, env={"PATH": "/usr/bin:/bin", "HOME": work},
            preexec_fn=lambda: _child_setup(limits, flag), close_fds=True,
        )
        timed_out = False
        try:
            out, err = proc.communicate(code.encode(), timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
        namespace = os.path.exists(flag)
    return SandboxResult(None if timed_out else proc.returncode, out[:OUTPUT_LIMIT].decode(errors="replace"),
                         err[:OUTPUT_LIMIT].decode(errors="replace"), timed_out, namespace)
