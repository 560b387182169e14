"""`runPolicy`: restarts, deadlines, suspension and clean-up of a job, and the rules on its exit
codes (Python in the validator, CEL in `FAIL_ON_EXIT_CODES_CEL`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from rlkube.runtime.contract.pod import (
    EXIT_CONFIG,
    EXIT_MEANINGS,
    EXIT_NON_FINITE,
    EXIT_TERMINATED,
    PERMANENT_EXIT_CODES,
)
from rlkube.runtime.contract.rule import cel_entry
from rlkube.runtime.contract.spec import Spec, repeated

# The CEL twin of `RunPolicySpec._unique_codes`' refusal of the SIGTERM code (uniqueness is the
# list's type, a set).
FAIL_ON_EXIT_CODES_CEL = [
    cel_entry(f"!self.exists(c, c == {EXIT_TERMINATED})",
              f"must not contain {EXIT_TERMINATED}: that code means {EXIT_MEANINGS[EXIT_TERMINATED]}")
]


class RunPolicySpec(Spec):
    """What happens when pods fail, how long a job may run, and when it is cleaned up."""

    backoff_limit: int = Field(
        default=3, ge=0, le=1000,
        description="Gang restarts (from the latest checkpoint) allowed after retriable failures "
        "before the job fails.",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=31_536_000,
        description="Wall-clock seconds since the job started after which it is stopped and fails "
        "with reason DeadlineExceeded. Unset: no limit.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=31_536_000,
        description="Seconds after the job succeeded or failed when it is deleted (its pods with "
        "it). Unset: kept until deleted by hand.",
    )
    suspend: bool = Field(
        default=False,
        description="True: no pods run (existing ones are stopped after a checkpoint); False "
        "resumes. Queue controllers such as Kueue admit a job by setting it to false.",
    )
    fail_on_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: list(PERMANENT_EXIT_CODES), max_length=32,
        description="Trainer exit codes that fail the job at once instead of restarting it "
        f"({EXIT_CONFIG}: invalid config, {EXIT_NON_FINITE}: non-finite loss).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("fail_on_exit_codes")
    @classmethod
    def _unique_codes(cls, codes: list[int]) -> list[int]:
        if duplicates := repeated(codes):
            raise ValueError(f"must not repeat a code, got {', '.join(map(str, duplicates))} more than once")
        if EXIT_TERMINATED in codes:
            raise ValueError(
                f"must not contain {EXIT_TERMINATED}: that code means {EXIT_MEANINGS[EXIT_TERMINATED]}"
            )
        return codes
