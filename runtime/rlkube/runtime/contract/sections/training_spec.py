"""`training`: the optimizer, each algorithm's knobs (DPO, PPO/GRPO, KTO) and the experiment
trackers the run reports to (`reportTo`, with its own rule). What an algorithm cannot honour is a
rule across sections (`contract.algorithm_settings`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.spec import MAX_NAME_LEN, Spec, repeated

# The experiment trackers a run can report to, by the names TRL's `report_to` gives them
# (trainers/trackers.py writes each); "none" alone is the same as no tracker.
TrackerName = Literal["tensorboard", "mlflow", "wandb", "none"]
TRACKER_NAMES: tuple[str, ...] = TrackerName.__args__  # type: ignore[attr-defined]

REPORT_TO_RULES = (
    Rule("reportTo: 'none' turns the trackers off and cannot be listed with one",
         "!has(self.reportTo) || self.reportTo.size() <= 1 || !('none' in self.reportTo)",
         lambda t: when(len(t.report_to) > 1 and "none" in t.report_to, f", got {t.report_to}"),
         ".reportTo"),
)


class TrainingSpec(Spec):
    """Optimizer and algorithm settings, and the experiment trackers the run reports to."""

    RULES = REPORT_TO_RULES

    steps: int = Field(default=100, ge=1, le=100_000_000, description="Optimizer steps to run.")
    lr: float = Field(default=1e-5, gt=0.0, le=1.0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, le=100_000_000, description="Linear warm-up steps.")
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1e6, description="Gradient clipping norm.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for initialisation and sampling.")
    # DPO
    beta: float = Field(default=0.1, gt=0.0, le=100.0, description="DPO: strength of the implicit KL.")
    loss_type: Literal["sigmoid", "ipo"] = Field(default="sigmoid", description="DPO: loss form.")
    # PPO / GRPO
    clip: float = Field(default=0.2, gt=0.0, le=10.0, description="PPO/GRPO: policy ratio clip epsilon.")
    clip_high: float | None = Field(
        default=None, gt=0.0, le=10.0,
        description="GRPO clip-higher: upper clip epsilon (defaults to clip).",
    )
    value_clip: float = Field(default=0.2, gt=0.0, le=1e6, description="PPO: value loss clip range.")
    kl: float = Field(
        default=0.0, ge=0.0, le=100.0,
        description="PPO/GRPO: KL coefficient to the reference; > 0 needs roles.reference.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        default="k3",
        description="PPO/GRPO: per-token KL estimator, with r = pi_ref / pi on tokens sampled from pi: "
        "k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (algorithms/ppo.py, docs/algorithms.md). "
        "k1 only in the reward (ppo with klInReward): as a loss its expected gradient is 0.",
    )
    kl_in_reward: bool = Field(
        default=False, description="PPO: subtract the KL from the reward (True) or add it as a loss (False)."
    )
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0, description="PPO/GRPO: entropy bonus.")
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="PPO: GAE discount.")
    gae_lambda: float = Field(default=0.95, ge=0.0, le=1.0, alias="lambda", description="PPO: GAE lambda.")
    group_size: int = Field(
        default=4, ge=1, le=1024,
        description="GRPO: completions sampled per prompt; at least 2, since advantages are rewards "
        "relative to the group's mean.",
    )
    scale_rewards: bool = Field(
        default=True,
        description="GRPO: divide each completion's advantage by its group's reward std (DeepSeekMath); "
        "false only subtracts the group mean (Dr. GRPO).",
    )
    loss_aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        default="token-mean",
        description="PPO/GRPO: how the actor's per-token loss becomes one number: the mean over every "
        "response token of the mini-batch, or the mean over its sequences of each sequence's token sum "
        "or token mean (verl's loss_agg_mode).",
    )
    fused_logprobs: bool = Field(
        default=True,
        description="Take per-token log-probs (and the PPO/GRPO entropy) through the lm head chunk by chunk, "
        "never holding the [tokens, vocab] logits (a chunk's logits are recomputed in the backward pass); "
        "false materialises them all (more memory, one matmul less). Same values to fp32 rounding.",
    )
    ppo_epochs: int = Field(default=1, ge=1, le=100, description="PPO/GRPO: passes over each rollout.")
    mini_batches: int = Field(default=1, ge=1, le=4096, description="PPO/GRPO: optimizer steps per epoch of a rollout.")
    trainable_modules: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LEN)]] | None = Field(
        default=None, min_length=1, max_length=256,
        description="Partial freezing: train only the actor's parameters whose name in the Hugging Face "
        "model contains one of these strings (for example ['layers.1.', 'lm_head']); the others get no "
        "gradient, no optimizer state and no gradient reduction. Unset: every parameter trains.",
    )
    eval_every_steps: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Evaluate every N steps on data.eval or data.evalFraction (DPO/KTO: reward accuracy and "
        "margin; PPO/GRPO: mean reward of greedy completions). Unset: only after the last step.",
    )
    # KTO
    kto_desirable_weight: float = Field(
        default=1.0, gt=0.0, le=1000.0,
        description="KTO: weight of the loss of desirable completions (lambda_D of the KTO paper).",
    )
    kto_undesirable_weight: float = Field(
        default=1.0, gt=0.0, le=1000.0,
        description="KTO: weight of the loss of undesirable completions (lambda_U); with unbalanced data "
        "the KTO paper keeps lambda_D * desirable / (lambda_U * undesirable) in [1, 4/3].",
    )
    # Experiment trackers
    report_to: list[TrackerName] = Field(
        default_factory=list, max_length=len(TRACKER_NAMES),
        description="Experiment trackers rank 0 reports to, as TRL's report_to names them: tensorboard "
        "(event files in <outputDir>/tensorboard), mlflow (MLFLOW_TRACKING_URI, else the SQLite store "
        "<outputDir>/mlflow/mlflow.db), wandb (online with WANDB_API_KEY, else offline runs in "
        "<outputDir>/wandb). Each gets every number of every step at its step, the config once and the "
        "run's summary at the end; the packages come with pip install 'rlkube[tracking]'. Empty or "
        "['none']: no tracker.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("report_to")
    @classmethod
    def _each_tracker_once(cls, names: list[str]) -> list[str]:
        if twice := repeated(names):
            raise ValueError(f"must not repeat a tracker ({', '.join(twice)})")
        return names

    def trackers(self) -> list[str]:
        """The trackers to report to, in the order given ([] for none)."""
        return [name for name in self.report_to if name != "none"]
