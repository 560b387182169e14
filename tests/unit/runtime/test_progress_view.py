"""The progress view's lines, the live redraw and its guard on stderr, the output format's choice,
and the run's summary (infra/terminal.py, trainers/progress_view.py, trainers/summary.py)."""

import io
import json
import sys

import pytest

from rlkube.runtime.infra.terminal import LOG_FORMAT_ENV, LiveLines, fit, log_format
from rlkube.runtime.trainers.progress_view import ProgressView, duration, event_line, step_lines
from rlkube.runtime.trainers.record import StepRecord, StepReport
from rlkube.runtime.trainers.summary import RunTally, summary_lines
from tests.screen import screen

REPORT = StepReport(reward_mean="rewardMean", gauges={})


def record(step=3, loss=0.25, tokens=1000, seconds=0.5, busy=None, **fields):
    return StepRecord(step=step, loss=loss, tokens=tokens, seconds=seconds, tokens_per_second=tokens / seconds,
                      mfu=None, report=REPORT, fields=fields, gpu_utilization=busy)


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("env, tty, want", [
    ({}, True, "text"), ({}, False, "json"), ({LOG_FORMAT_ENV: "auto"}, True, "text"),
    ({LOG_FORMAT_ENV: "json"}, True, "json"), ({LOG_FORMAT_ENV: "text"}, False, "text"),
])
def test_log_format_is_text_on_a_terminal_unless_told(env, tty, want):
    assert log_format(env, Tty() if tty else io.StringIO()) == want


def test_dpo_step_on_a_cpu_leaves_out_gpu_busy_and_memory():
    first, second = step_lines(record(accuracy=0.875, peakMemoryFraction=None), total=10, eta=3.5, elapsed=61)
    assert first == "step 3/10 [######..............]  30%  loss 0.2500  accuracy 0.88  2,000 tok/s  ETA 0:04"
    assert second == "  step 0.50s  elapsed 1:01"


def test_rl_step_on_a_gpu_shows_its_phases_reward_busy_and_memory():
    rec = record(step=10, loss=None, busy=0.931, rewardMean=0.4123, generationSeconds=1.2, scoringSeconds=0.05,
                 trainingSeconds=0.8, peakMemoryFraction=0.714)
    first, second = step_lines(rec, total=10, eta=0.0, elapsed=3700)
    assert first == "step 10/10 [####################] 100%  reward 0.412  2,000 tok/s  ETA 0:00"
    assert second == "  generate 1.20s  score 0.05s  train 0.80s  GPU busy 0.93  memory 0.71  step 0.50s  elapsed 1:01:40"


def test_events_in_words_and_machine_records_left_out():
    assert event_line({"event": "checkpoint", "step": 4, "path": "/c/step-4", "writeSeconds": 0.1}) == \
        "checkpoint after step 4: /c/step-4"
    assert event_line({"event": "export", "step": 8, "path": "/c/export"}) == "model exported after step 8: /c/export"
    assert event_line({"event": "checkpointSave", "step": 4}) is None
    assert event_line({"event": "checkpointPrepare", "time": 1.0, "error": "OSError: x"}) == \
        "checkpointPrepare: error OSError: x"
    assert duration(59.6) == "1:00" and duration(3600) == "1:00:00"


def test_live_lines_redraw_in_place_with_notes_above():
    out = Tty()
    live = LiveLines(out, guard_stderr=False)
    live.show(["a1", "a2"])
    live.note("saved")
    live.show(["b1", "b2"])
    live.show(["c1", "c2"])
    live.close()
    assert screen(out.getvalue()) == ["saved", "c1", "c2"]


def test_stderr_written_while_the_view_is_live_does_not_tear_it(monkeypatch):
    out, err = Tty(), Tty()
    monkeypatch.setattr(sys, "stderr", err)
    live = LiveLines(out, guard_stderr=True)
    live.show(["step 1/2", "  elapsed 0:01"])
    sys.stderr.write("WARNING something\n")
    sys.stderr.write("\rbar 50%")  # a progress bar's update: the view stays off until its line ends
    sys.stderr.write("\rbar 100%\n")
    live.show(["step 2/2", "  elapsed 0:02"])
    live.close()
    assert sys.stderr is err  # given back
    # one terminal: what stdout and stderr wrote, in the order written (LiveLines flushes each write)
    assert screen(out.getvalue()) == ["step 2/2", "  elapsed 0:02"]
    assert screen(err.getvalue()) == ["WARNING something", "bar 100%"]


def test_stderr_and_stdout_on_one_terminal_read_as_one_screen(monkeypatch):
    term = Tty()
    monkeypatch.setattr(sys, "stderr", term)
    live = LiveLines(term, guard_stderr=True)
    live.show(["step 1/2", "  elapsed 0:01"])
    sys.stderr.write("2026 rank0 INFO exported\n")
    live.show(["step 2/2", "  elapsed 0:02"])
    live.close()
    assert screen(term.getvalue()) == ["2026 rank0 INFO exported", "step 2/2", "  elapsed 0:02"]


def test_a_line_stderr_left_open_is_not_drawn_over(monkeypatch):
    term = Tty()
    monkeypatch.setattr(sys, "stderr", term)
    live = LiveLines(term, guard_stderr=True)
    live.show(["step 1/2"])
    sys.stderr.write("\rbar 50%")
    live.show(["step 2/2"])  # a step ends before the bar does
    sys.stderr.write("\rbar 60%")
    live.note("checkpoint")  # and a checkpoint
    live.close()
    assert screen(term.getvalue()) == ["bar 50%", "bar 60%", "checkpoint", "step 2/2"]


def test_long_lines_are_cut_to_the_terminal():
    assert fit("x" * 50, 20) == "x" * 18 + "~" and fit("short", 20) == "short"


def test_view_says_the_start_then_steps_with_an_eta_from_this_runs_steps():
    now = [100.0]
    out = Tty()
    view = ProgressView(total=4, algorithm="grpo", live=LiveLines(out, guard_stderr=False), clock=lambda: now[0])
    view.started({"event": "start", "totalSteps": 4, "startStep": 0, "worldSize": 2,
                  "startupSeconds": {"total": 12.34}})
    for step in (1, 2):
        now[0] += 10.0
        view.step(record(step=step, rewardMean=0.5, seconds=9.0))
    view.event({"event": "checkpoint", "step": 2, "path": "/ck/step-2"})
    view.close()
    lines = screen(out.getvalue())
    assert lines[0] == "grpo: 4 steps on 2 processes; started in 12.3s"
    assert lines[1] == "checkpoint after step 2: /ck/step-2"
    assert lines[2].startswith("step 2/4 ") and lines[2].endswith("ETA 0:20")  # 10 s a step since step 1
    assert lines[3] == "  step 9.00s  elapsed 0:20"


def test_summary_adds_up_the_run_and_names_checkpoint_and_model():
    now = [50.0]
    tally = RunTally(gpus=2, memory_total=80 * 1024**3, clock=lambda: now[0])
    tally.started({"startupSeconds": {"total": 7.5}})
    for step, busy, peak in ((5, 0.9, 0.5), (6, 0.8, 0.75)):
        now[0] += 2.0
        tally.add(record(step=step, tokens=4000, busy=busy, peakMemoryFraction=peak))
    tally.exported({"outputs": {"model": {"path": "/out/export", "step": 6}}})
    s = tally.summary("/ck/step-000000006")
    assert json.loads(json.dumps(s)) == s  # one JSON line
    assert (s["event"], s["steps"], s["firstStep"], s["lastStep"], s["tokens"]) == ("summary", 2, 5, 6, 8000)
    assert s["trainingSeconds"] == 4.0 and s["tokensPerSecondPerGpu"] == 1000.0
    assert s["gpuBusyMean"] == pytest.approx(0.85) and s["peakMemoryFraction"] == 0.75 and s["peakMemoryGiB"] == 60.0
    assert s["load"] == ["from transformers import AutoModelForCausalLM, AutoTokenizer",
                         "model, tokenizer = AutoModelForCausalLM.from_pretrained('/out/export'), "
                         "AutoTokenizer.from_pretrained('/out/export')"]
    lines = summary_lines(s, "cuda")
    assert lines[0].startswith("done: steps 5-6, 8,000 tokens in ") and lines[0].endswith(
        "(start-up 7.5s), 1,000 tokens/s per GPU")
    assert lines[1:] == ["GPU busy 0.85 on average, peak memory 0.75 of the card (60.0 GiB)",
                         "checkpoint: /ck/step-000000006", "model: /out/export", *(f"  {x}" for x in s["load"])]


def test_summary_on_a_cpu_says_once_what_is_not_measured():
    tally = RunTally(gpus=1, memory_total=None)
    tally.add(record(step=1))
    s = tally.summary(None)
    assert s["gpuBusyMean"] is None and s["peakMemoryGiB"] is None and s["load"] is None
    assert summary_lines(s, "cpu")[1:] == ["on cpu: GPU busy time and GPU memory are not measured"]
