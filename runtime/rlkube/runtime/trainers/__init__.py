"""The trainers: the step loop, the DPO and RL trainers, and the adaptive batcher that sizes their steps."""
