"""RL and preference-optimisation math: losses and advantage estimators, pure functions of tensors."""
