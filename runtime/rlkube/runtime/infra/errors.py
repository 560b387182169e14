"""The runtime's outcomes that are not crashes, and the exit codes the operator acts on.

The codes and their meanings are the contract's (`rlkube.runtime.contract.pod.EXIT_MEANINGS`,
docs/architecture.md "The contract"): 0 finished; 3 invalid config (permanent); 4 non-finite
loss (permanent); 143 stopped by SIGTERM after writing a checkpoint; anything else a crash
(retriable). They are re-exported here next to the exceptions that lead to them.
"""

from __future__ import annotations

from rlkube.runtime.contract.pod import (  # noqa: F401 (re-exported)
    EXIT_CONFIG,
    EXIT_NON_FINITE,
    EXIT_OK,
    EXIT_TERMINATED,
)


class ConfigError(ValueError):
    """A user mistake in the config or its data; the message starts with the field path."""

    def field_path(self) -> str:
        """The field path (or file) the message starts with: the text before its first ': '."""
        head, sep, _ = str(self).partition(": ")
        return head if sep and " " not in head else ""


class DataError(ConfigError):
    """The data a config names is missing or malformed (a missing file, a record without a
    field): a user mistake like a bad config, so it exits EXIT_CONFIG and is not retried."""


class NonFiniteLoss(RuntimeError):
    """The loss (or gradient norm) of a step was NaN or infinite; raised before the optimizer step."""

    def __init__(self, step: int, what: str, value: float) -> None:
        super().__init__(f"step {step}: {what} is {value} (not finite); stopping before the optimizer step")
        self.step = step


class Terminated(Exception):
    """SIGTERM arrived; a checkpoint of the last completed step was written."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped by SIGTERM after step {step} (checkpoint written)")
        self.step = step
