"""rlkube runtime: the in-pod trainer (DPO, PPO, GRPO) with a hybrid engine and adaptive batching."""
