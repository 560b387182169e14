"""`export`: the trained actor as a Hugging Face model directory, written at the end of a run and
every `everySteps`. Its path's rules in the pod are the operator's
(`rlkube.operator.api.validation.paths`).
"""

from __future__ import annotations

from pydantic import Field

from rlkube.runtime.contract.spec import Spec, optional_path


class ExportSpec(Spec):
    """The trained actor as a Hugging Face model directory (config, safetensors, tokenizer)."""

    enabled: bool = Field(default=True, description="Export at the end of training (and every everySteps).")
    dir: str | None = optional_path(
        "Directory of the export in the pod, replaced atomically by each export. Unset: "
        "<checkpoint.dir>/export, on the checkpoint volume.",
    )
    every_steps: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Also export every N steps. Unset: only after the last step.",
    )
    merge_lora: bool = Field(
        default=False,
        description="LoRA runs: also write the model with the adapters folded into its weights (a plain "
        "Hugging Face model) in dir; the adapter itself (PEFT's format) is always written, in dir/adapter.",
    )
