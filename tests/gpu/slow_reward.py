"""A reward function that costs host time, as a verifier does (a math checker, a test run): the
rule-based `target_pattern` plus `BENCH_REWARD_MS` milliseconds of Python per completion (a busy
wait, so the GIL is held as real Python work holds it). bench_utilization.py --reward-ms names it
as the run's `roles.reward.function`."""

import os
import time

from rlkube.runtime.rewards import target_pattern

_SECONDS = float(os.environ.get("BENCH_REWARD_MS", "0")) / 1000.0


def verifier_like(prompt: str, completion: str) -> float:
    end = time.perf_counter() + _SECONDS
    while time.perf_counter() < end:
        pass
    return target_pattern(prompt, completion)
