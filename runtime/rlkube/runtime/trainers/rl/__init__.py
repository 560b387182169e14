"""PPO and GRPO: the RL trainer (trainer.py) and its role workers (rollout, scoring, actor, critic)."""

from rlkube.runtime.trainers.rl.trainer import RLTrainer, train

__all__ = ["RLTrainer", "train"]
