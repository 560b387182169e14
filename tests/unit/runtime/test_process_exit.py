"""infra/process_exit: a process that leaves through exit_now loses nothing it wrote."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from rlkube.runtime.infra.process_exit import fast_exit_enabled

CHILD = textwrap.dedent("""
    import logging, sys, threading, time
    from rlkube.runtime.infra.process_exit import exit_now
    logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
    threading.Thread(target=time.sleep, args=(60,)).start()  # not a daemon: a normal exit would wait
    sys.stdout.write("no newline, never flushed by hand" * 200)
    sys.stderr.write("to stderr")
    logging.getLogger("x").info("the last log line")
    exit_now(7)
""")


def test_exit_now_flushes_stdout_stderr_and_logging_and_does_not_wait_for_threads(tmp_path):
    log = tmp_path / "run.log"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 7
    assert proc.stdout == "no newline, never flushed by hand" * 200  # block-buffered into a pipe
    assert proc.stderr == "to stderr"
    assert log.read_text().strip().endswith("the last log line")


def test_fast_exit_is_on_unless_turned_off():
    assert fast_exit_enabled({})
    assert fast_exit_enabled({"RLKUBE_FAST_EXIT": "1"})
    assert not fast_exit_enabled({"RLKUBE_FAST_EXIT": "0"})
