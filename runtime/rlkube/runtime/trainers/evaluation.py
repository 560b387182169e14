"""When a run evaluates, and how an evaluation shows in the step log, /progress and /metrics.

A run with an eval set (data.eval or data.evalFraction, data/eval_split.py) evaluates after every
`training.evalEverySteps` steps and after the last step. Each trainer says what an evaluation
measures (`Trainer.evaluate`): DPO and KTO the implicit-reward accuracy and margin of the eval
samples under the current policy (the training loss's own scoring, no gradient); PPO and GRPO the
mean reward of greedy completions of the eval prompts. Every rank takes part (the forwards and the
generation are collectives) and every rank ends with the same numbers.

The step record that ran one carries it as `"eval": {"step": n, ...}`; /progress keeps the latest
one's headline numbers (contract/progress.py: evalStep, evalLoss, evalAccuracy, evalMargin,
evalRewardMean; the operator copies step, accuracy and reward mean into status.progress), and
/metrics has a gauge for each (rlkube_eval_*).
"""

from __future__ import annotations

from collections.abc import Callable

from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.gpu_busy import BusySampler
from rlkube.runtime.infra.log import warn_once

# What an evaluation's record may hold -> its /progress field.
PROGRESS_OF_EVAL = {
    "step": report.EVAL_STEP,
    "loss": report.EVAL_LOSS,
    "accuracy": report.EVAL_ACCURACY,
    "margin": report.EVAL_MARGIN,
    "rewardMean": report.EVAL_REWARD_MEAN,
}


def has_eval_set(config: RuntimeConfig) -> bool:
    return config.data.eval is not None or config.data.eval_fraction is not None


def eval_due(config: RuntimeConfig, done: int) -> bool:
    """Whether the run evaluates after `done` steps."""
    every = config.training.eval_every_steps
    if not has_eval_set(config):
        if every is not None:
            warn_once("eval", "training.evalEverySteps is set but there is no eval set (data.eval or "
                      "data.evalFraction): not evaluating")
        return False
    return done == config.training.steps or bool(every and done % every == 0)


class Evaluation:
    """Runs the trainer's evaluation after the steps it is due, in the GPU busy phase "eval" (it
    counts in that step's busy window and phase seconds)."""

    def __init__(self, config: RuntimeConfig, evaluate: Callable[[], dict], busy: BusySampler) -> None:
        """`evaluate()`: the trainer's numbers on its eval set, on every rank."""
        self.config, self.evaluate, self.busy = config, evaluate, busy

    def after(self, done: int) -> dict | None:
        """The evaluation after `done` steps when one is due (collective), else None."""
        if not eval_due(self.config, done):
            return None
        with self.busy.phase("eval"):
            return {"step": done, **self.evaluate()}


def eval_progress(evaluation: dict) -> dict:
    """The /progress fields of one evaluation record (those it has)."""
    return {field: evaluation[key] for key, field in PROGRESS_OF_EVAL.items() if evaluation.get(key) is not None}


def preference_summary(sums: dict[str, float]) -> dict:
    """DPO's evaluation from its sums over the eval pairs (pairs, loss, margin, correct, chosen)."""
    pairs = max(sums["pairs"], 1.0)
    return {"samples": int(sums["pairs"]), "loss": sums["loss"] / pairs, "accuracy": sums["correct"] / pairs,
            "margin": sums["margin"] / pairs, "rewardMean": sums["chosen"] / pairs}
