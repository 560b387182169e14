"""`data`: where a run's training and evaluation data come from and how they become tokens, with
its own rule (one eval source).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, Spec, optional_path

EVAL_SOURCE = (
    Rule("eval: set eval or evalFraction, not both", "!has(self.eval) || !has(self.evalFraction)",
         lambda data: when(data.eval is not None and data.eval_fraction is not None), ".eval"),
)


class DataFields(Spec):
    """Which column of the data files holds each field rlkube reads; unset: the field's own name."""

    prompt: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_LEN, description="Prompt column.")
    chosen: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN, description="Preferred response column (DPO)."
    )
    rejected: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN, description="Dispreferred response column (DPO)."
    )
    completion: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN, description="Completion column (unpaired data)."
    )
    label: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN,
        description="Boolean column saying whether the completion is desirable (unpaired data).",
    )
    answer: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LEN,
        description="Reference answer column for rule-based rewards (PPO, GRPO).",
    )

    def column(self, name: str) -> str:
        """The column that holds field `name`."""
        return getattr(self, name) or name


class DataSpec(Spec):
    """Where training data comes from and how it is batched into tokens.

    packing, lengthBucketing, prefetch and lengthMix apply to DPO only: PPO and GRPO generate
    from left-padded prompts taken inside the step."""

    RULES = EVAL_SOURCE

    source: str = Field(
        min_length=1, max_length=MAX_PATH_LEN,
        description="Path of a JSONL or Parquet file (or a directory of them), or of a directory "
        "written by Hugging Face datasets' save_to_disk (format 'arrow'). For format 'synthetic', a "
        "free label; the data is generated from `seed`.",
    )
    format: Literal["jsonl", "parquet", "arrow", "synthetic"] = Field(
        default="jsonl",
        description="File format. Preference data has fields prompt, chosen, rejected (strings, or "
        "lists of {role, content} messages rendered with the tokenizer's chat template; without a "
        "prompt, the messages chosen and rejected share make it); prompt data (PPO, GRPO) has prompt "
        "and optionally answer.",
    )
    fields: DataFields = Field(
        default_factory=lambda: DataFields(),
        description="Column names in the files for the fields rlkube reads, when they differ from "
        "the field names (for example {prompt: question, chosen: good, rejected: bad}).",
    )
    skip_invalid: bool = Field(
        default=False,
        description="Skip malformed records (missing field, wrong type, empty text, too long for "
        "maxSeqLen), logging each and counting them, instead of failing on the first one.",
    )
    max_seq_len: int = Field(
        default=1024, ge=8, le=1_048_576, description="Longest sequence (prompt + response) in tokens; "
        "longer samples are truncated from the left of the prompt."
    )
    packing: bool = Field(
        default=True,
        description="DPO only: pack several samples into one row with per-sample position ids and "
        "a block mask, so no compute is spent on padding. PPO/GRPO never pack (they generate from "
        "left-padded prompts); the setting has no effect on them.",
    )
    length_bucketing: bool = Field(
        default=True,
        description="DPO only, when packing is off: group samples of similar length into a "
        "micro-batch to cut padding. PPO/GRPO do not bucket; the setting has no effect on them.",
    )
    prefetch: int = Field(
        default=2, ge=0, le=64,
        description="DPO only: micro-batches prepared ahead on a background thread (the next step's "
        "first ones while this step's last one runs; 0: none, each when it is needed). PPO/GRPO take "
        "their prompts inside the step and accept only 2 (the default) or 0.",
    )
    num_samples: int = Field(
        default=512, ge=1, le=100_000_000,
        description="Synthetic data only: number of samples (pairs for DPO, prompts for PPO/GRPO).",
    )
    length_mix: Literal["fixed", "longTailed"] = Field(
        default="fixed",
        description="Synthetic preference pairs (DPO) only: 'fixed' lengths, or a log-normal mix "
        "(median ~300 tokens, tail past 2,000) capped at maxSeqLen. PPO/GRPO's synthetic prompts "
        "have lengths of their own and accept only 'fixed'.",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for data order and synthesis.")
    eval: str | None = optional_path(
        "Evaluation data: a JSONL or Parquet file, a directory of them, or a save_to_disk "
        "directory, with the training data's fields (the format is read from the path; data.format where "
        "it cannot be). Not combinable with evalFraction.",
    )
    eval_fraction: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="Hold out this fraction of the training data for evaluation (at least one sample), "
        "chosen by data.seed, so the same samples are held out on every rank and after a restart.",
    )

