"""Models and what runs them: loading, log-probs, generation (decoder), the hybrid engine, value head."""
