"""The data order: which samples make global step s, as a pure function of (seed, s).

Every epoch is a permutation of all samples drawn from Random(seed, epoch); with length
bucketing on (and packing off) the permutation is regrouped by length (bucketing.py). Step s
takes batch s mod (steps per epoch) of epoch s div (steps per epoch). The last partial batch of
an epoch is dropped so every step has exactly `global_batch` samples.

Because the order depends on nothing but the seed and the step, resuming at step s replays the
same samples in the same order with no sampler state to save, and a different world size sees
the same global batches (only their split across ranks changes).
"""

from __future__ import annotations

import random

from rlkube.runtime.data.bucketing import bucketed_batches
from rlkube.runtime.infra.errors import DataError


class StepSampler:
    def __init__(
        self, num_samples: int, global_batch: int, seed: int, lengths: list[int] | None = None
    ) -> None:
        if num_samples < global_batch:
            raise DataError(
                f"batching.globalBatch: {global_batch} is more than the {num_samples} samples in the data"
            )
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self.lengths = lengths  # set: bucket by length
        self.steps_per_epoch = num_samples // global_batch
        self._epoch: int | None = None
        self._batches: list[list[int]] = []

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        if epoch != self._epoch:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            order = list(range(self.num_samples))
            rng.shuffle(order)
            if self.lengths is not None:
                self._batches = bucketed_batches(order, self.lengths, self.global_batch, rng)
            else:
                g = self.global_batch
                self._batches = [order[s : s + g] for s in range(0, self.steps_per_epoch * g, g)]
            self._epoch = epoch
        return self._batches

    def batch(self, step: int) -> list[int]:
        """Sample indices of global step `step` (0-based)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return list(self._epoch_batches(epoch)[k])
