"""What `python -m rlkube.runtime run` prints: the progress view and the summary on a terminal (a
pseudo-terminal here), JSON lines only without one, the view again with `--log-format text`;
and no warning a user cannot act on, on a CPU run."""

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

from rlkube.runtime.trainers.progress_view import BAR_WIDTH
from tests.screen import screen

from .conftest import ROOT, runtime_env, tiny_config, write_config
from .rl_common import rl_config

STEPS, EVERY = 6, 3
# Warnings a CPU run must not print (a user can do nothing about either).
UNACTIONABLE = ("UserWarning", "IGNORED SETTING")


def cli(config_path, *args):
    return [sys.executable, "-m", "rlkube.runtime", "run", str(config_path), *args]


def run_in_pty(argv, timeout=120) -> tuple[int, str]:
    """`argv` with stdout and stderr on one pseudo-terminal of 160 x 40; exit code, what it showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(argv, cwd=ROOT, env=runtime_env(), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process and its children closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def step_view_lines(lines):
    return [i for i, line in enumerate(lines) if line.startswith("step ") and "/" in line.split()[1]]


def test_terminal_shows_the_progress_view_and_the_summary(tmp_path):
    cfg = tiny_config(tmp_path, training={"steps": STEPS}, checkpoint={"everySteps": EVERY})
    code, shown = run_in_pty(cli(write_config(tmp_path, cfg)))
    lines = screen(shown)
    assert code == 0, shown[-3000:]
    assert not [line for line in lines if line.startswith("{")]  # no JSON line on a terminal
    assert not [w for w in UNACTIONABLE if w in shown], shown
    ckpt = tmp_path / "ckpt"
    assert any(line.startswith(f"dpo: {STEPS} steps on 1 process; started in ") for line in lines), lines
    assert f"checkpoint after step {EVERY}: {ckpt}/step-{EVERY:09d}" in lines
    # redrawn in place: the view's last lines once, at the bottom above the summary, not torn by logs
    views = step_view_lines(lines)
    assert len(views) == 1, lines
    view, elapsed = lines[views[0]], lines[views[0] + 1]
    assert view.startswith(f"step {STEPS}/{STEPS} [{'#' * BAR_WIDTH}] 100%  loss ") and " accuracy " in view
    assert " tok/s  ETA 0:0" in view
    assert elapsed.startswith("  step ") and " elapsed " in elapsed
    summary = lines[views[0] + 2:]
    assert summary[0].startswith(f"done: steps 1-{STEPS}, ") and "tokens/s per process" in summary[0]
    assert summary[1:4] == ["on cpu: GPU busy time and GPU memory are not measured",
                            f"checkpoint: {ckpt}/step-{STEPS:09d}", f"model: {ckpt}/export"]
    assert summary[4:] == ["  from transformers import AutoModelForCausalLM, AutoTokenizer",
                           f"  model, tokenizer = AutoModelForCausalLM.from_pretrained('{ckpt}/export'), "
                           f"AutoTokenizer.from_pretrained('{ckpt}/export')"]


def test_without_a_terminal_json_lines_only_ending_with_the_summary(tmp_path):
    cfg = tiny_config(tmp_path, training={"steps": STEPS}, checkpoint={"everySteps": EVERY})
    proc = subprocess.run(cli(write_config(tmp_path, cfg)), cwd=ROOT, env=runtime_env(), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in proc.stdout.splitlines()]  # every line is one JSON object
    assert not [w for w in UNACTIONABLE if w in proc.stderr], proc.stderr
    steps = [r for r in recs if r["event"] == "step"]
    summary = recs[-1]
    assert recs[0]["event"] == "start" and summary["event"] == "summary"
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert (summary["steps"], summary["firstStep"], summary["lastStep"]) == (STEPS, 1, STEPS)
    assert summary["tokens"] == sum(r["tokens"] for r in steps)
    assert summary["tokensPerSecondPerGpu"] > 0 and summary["wallSeconds"] >= summary["trainingSeconds"] > 0
    assert summary["gpuBusyMean"] is None and summary["peakMemoryFraction"] is None  # a CPU: not measured
    assert summary["checkpoint"] == str(tmp_path / "ckpt" / f"step-{STEPS:09d}")
    # the two lines load the exported model
    scope: dict = {}
    exec("\n".join(summary["load"]), scope)
    assert scope["model"].config.num_hidden_layers == 2 and scope["tokenizer"] is not None


def test_log_format_text_shows_the_view_without_a_terminal_with_an_rl_steps_phases(tmp_path):
    cfg = rl_config(tmp_path, "grpo", training={"steps": 2})
    proc = subprocess.run(cli(write_config(tmp_path, cfg), "--log-format", "text"), cwd=ROOT, env=runtime_env(),
                          capture_output=True, timeout=240)  # bytes: text=True would turn each "\r" into a newline
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = screen(proc.stdout.decode())
    assert not [line for line in lines if line.startswith("{")], lines
    views = step_view_lines(lines)
    assert len(views) == 1, lines
    view, phases = lines[views[0]], lines[views[0] + 1]
    assert view.startswith("step 2/2 [") and " reward " in view and " loss " in view
    for phase in ("generate", "score", "train"):
        assert f" {phase} " in phases and phases.split(f" {phase} ")[1].split()[0].endswith("s"), phases
    assert lines[views[0] + 2].startswith("done: steps 1-2, ")
