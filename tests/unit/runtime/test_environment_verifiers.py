"""The reference environment's verifiers (images/environment): the sandbox refuses the network
and stops a runaway program at its limits; the math checker's cases."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "images" / "environment"))
from math_check import equivalent, extract_answer, last_boxed, math_reward  # noqa: E402
from sandbox import SandboxLimits, run_python  # noqa: E402

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=3.0)


def test_the_sandbox_runs_code_and_reports_its_exit():
    assert run_python("print(sum(range(10)))", FAST).stdout == "45\n"
    failed = run_python("assert 1 == 2", FAST)
    assert not failed.ok and failed.exit_code == 1 and "AssertionError" in failed.stderr


@pytest.mark.parametrize("code", [
    "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(('127.0.0.1', 9))",
    "import socket\nsocket.getaddrinfo('example.com', 80)",
    "import _socket\n_socket.socket()",
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9', timeout=1)",
    "import subprocess\nsubprocess.run(['true'])",
    "import os\nos.system('true')",
    "import ctypes",
])
def test_the_sandbox_refuses_network_processes_and_native_code(code):
    result = run_python(code, FAST)
    assert not result.ok
    assert "sandbox:" in result.stderr and "not allowed" in result.stderr, result.stderr[-500:]


def test_a_runaway_loop_is_stopped_at_its_cpu_limit():
    result = run_python("while True:\n    pass", SandboxLimits(cpu_seconds=1, wall_seconds=10.0))
    assert not result.ok and not result.timed_out and result.exit_code < 0  # SIGXCPU / SIGKILL


def test_a_sleeping_program_is_stopped_at_the_wall_clock():
    result = run_python("import time\ntime.sleep(30)", SandboxLimits(cpu_seconds=5, wall_seconds=1.0))
    assert result.timed_out and not result.ok and result.exit_code is None


def test_memory_is_bounded():
    result = run_python("x = bytearray(1024 * 1024 * 1024)", SandboxLimits(memory_bytes=256 * 1024 * 1024))
    assert not result.ok and "MemoryError" in result.stderr


@pytest.mark.parametrize("completion, answer", [
    ("so \\boxed{42}", "42"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\dfrac{3}{4}}", "3/4"),
    ("The answer is 1,000.", "1000"),
    ("#### 7", "7"),
    ("we get $\\boxed{\\text{blue}}$", "Blue"),
    ("\\boxed{50\\%}", "0.5"),
    ("x = \\boxed{\\left( 2 \\right)}", "2"),
    ("first 3, then 4", "4"),
    ("\\boxed{x^{2}+1}", "x^{2} + 1"),
])
def test_the_checker_accepts_equivalent_answers(completion, answer):
    assert math_reward(completion, answer) == 1.0


@pytest.mark.parametrize("completion, answer", [
    ("\\boxed{41}", "42"),
    ("\\boxed{0.33}", "1/3"),
    ("no number here", "3"),
    ("\\boxed{red}", "blue"),
    ("\\boxed{3", "3"),  # unbalanced: no boxed answer, and no other number but that 3? it is the last number
])
def test_the_checker_refuses_other_answers(completion, answer):
    expected = 1.0 if completion == "\\boxed{3" else 0.0  # falls back to the last number, 3
    assert math_reward(completion, answer) == expected


def test_boxed_extraction_keeps_nested_braces():
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert extract_answer("nothing") is None
    assert equivalent("1/2", "\\frac{1}{2}") and not equivalent("1/2", "1/3")
