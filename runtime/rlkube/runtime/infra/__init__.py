"""What every run needs around the math: distributed groups, launch, checkpoints, progress, metrics, logs."""
