"""rlkube operator: RLTrainingJob API types, placement, rendering, reconcile, status."""
